"""SpeculativeEncoderDecoderModel (models.py) and the T5X re-exports (utils.py).

`python -m t5x.infer` itself, with the paper-row gin files, is tested in test_t5x_infer.py.

The standalone (no-T5X) model is always tested; the T5X subclass only where `t5x` is
importable (it is not on PyPI), otherwise that test is skipped with the reason.
"""
import dataclasses
import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from specdec_t5x import generate
from specdec_t5x.integration import checkpoints, models, utils
from specdec_t5x.algorithm import stats
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.algorithm.network import T5Config, Transformer

HAVE_T5X = importlib.util.find_spec('t5x') is not None
REPO = pathlib.Path(__file__).resolve().parents[1]
CFG = T5Config(vocab_size=48, emb_dim=16, num_heads=2, num_encoder_layers=1,
               num_decoder_layers=1, head_dim=8, mlp_dim=32, dropout_rate=0.0,
               mlp_activations=('gelu', 'linear'))
DRAFT_CFG = dataclasses.replace(CFG, emb_dim=8, num_heads=1)


@pytest.fixture(scope='module')
def weights():
  return (models.init_params(Transformer(CFG), jax.random.PRNGKey(0)),
          models.init_params(Transformer(DRAFT_CFG), jax.random.PRNGKey(1)))


def _batch(batch=2, enc_len=8, dec_len=6):
  x = np.random.RandomState(0).randint(2, 48, size=(batch, enc_len)).astype(np.int32)
  x[1, 5:] = 0
  return {'encoder_input_tokens': x,
          'decoder_input_tokens': np.zeros((batch, dec_len), np.int32)}


@pytest.mark.parametrize('speculative', [True, False])
def test_standalone_predict_batch_with_aux_is_generate(weights, speculative):
  target_params, draft_params = weights
  kw = dict(draft_config=DRAFT_CFG, draft_params=draft_params) if speculative else {}
  model = models.StandaloneSpeculativeModel(
      Transformer(CFG), decode_config=DecodeConfig(gamma=3, temperature=1.0), **kw)
  batch, rng = _batch(), jax.random.PRNGKey(7)
  decodes, aux = model.predict_batch_with_aux(target_params, batch,
                                              decoder_params={'decode_rng': rng})
  ref = generate((Transformer(CFG), target_params), batch['encoder_input_tokens'],
                 draft=(Transformer(DRAFT_CFG), draft_params) if speculative else None,
                 gamma=3, temperature=1.0, max_decode_length=6, rng=rng)
  assert decodes.shape == (2, 6)  # T5X's [batch, max_decode_length]
  np.testing.assert_array_equal(decodes, ref.tokens)
  assert set(aux) == set(stats.PER_EXAMPLE_STATS) | {'scores'}
  for key in stats.PER_EXAMPLE_STATS:
    assert aux[key].shape == (2,)  # per example, as T5X's infer expects
    np.testing.assert_array_equal(aux[key], ref.stats[key])
  _, _, batch_stats = model.predict_batch_with_stats(target_params, batch, rng=rng)
  np.testing.assert_array_equal(batch_stats['accepted_length_histogram'],
                                ref.stats['accepted_length_histogram'])
  np.testing.assert_array_equal(model.predict_batch(target_params, batch, rng=rng), decodes)
  assert model.describe()['speculative'] == speculative


def test_draft_checkpoint_restore_and_errors(tmp_path, weights):
  path = checkpoints.save_params(weights[1], str(tmp_path / 'checkpoint_5'), step=5)
  model = models.StandaloneSpeculativeModel(Transformer(CFG), draft_config=DRAFT_CFG,
                                            draft_checkpoint=path)
  with pytest.raises(ValueError, match='restore_draft'):
    _ = model.draft_params
  model.restore_draft()
  leaves = jax.tree_util.tree_leaves(model.draft_params)
  for got, want in zip(leaves, jax.tree_util.tree_leaves(weights[1])):
    np.testing.assert_array_equal(got, want)
  lazy = models.StandaloneSpeculativeModel(Transformer(CFG), draft_config=DRAFT_CFG,
                                           draft_checkpoint=path, max_decode_length=4)
  lazy.predict_batch_with_aux(weights[0], _batch())  # T5X's runners never call restore_draft
  assert lazy.is_speculative and lazy._draft_params is not None  # pylint: disable=protected-access
  missing = models.StandaloneSpeculativeModel(Transformer(CFG), draft_config=DRAFT_CFG,
                                              draft_checkpoint=str(tmp_path / 'nope'))
  with pytest.raises(FileNotFoundError, match=r"nope'.*--gin\.DRAFT_CHECKPOINT="):
    missing.restore_draft()
  with pytest.raises(ValueError, match='vocab_size=48, draft vocab_size=50'):
    models.StandaloneSpeculativeModel(Transformer(CFG),
                                      draft_config=dataclasses.replace(DRAFT_CFG, vocab_size=50))
  with pytest.raises(TypeError, match='Unknown arguments'):
    models.StandaloneSpeculativeModel(Transformer(CFG), beam_size=4)
  lossy = models.StandaloneSpeculativeModel(Transformer(CFG), draft_config=DRAFT_CFG,
                                            decode_config=DecodeConfig(lenience=0.5)).describe()
  assert lossy['lossy'] and lossy['lenience'] == 0.5 and lossy['draft_config']['emb_dim'] == 8


def test_t5x_style_module_is_decoded_with_our_network():
  @dataclasses.dataclass(frozen=True)
  class T5XConfig:  # T5X's T5Config has these fields (and maybe more).
    vocab_size: int = 48
    emb_dim: int = 16
    num_heads: int = 2
    num_encoder_layers: int = 1
    num_decoder_layers: int = 1
    head_dim: int = 8
    mlp_dim: int = 32
    mlp_activations: tuple = ('gelu', 'linear')
    dropout_rate: float = 0.0
    logits_via_embedding: bool = False
    scale_attention_logits: bool = False  # not ours: ignored

  class T5XTransformer:  # stands in for t5x.examples.t5.network.Transformer
    config = T5XConfig()

  ours = models.as_our_transformer(T5XTransformer())
  assert ours == Transformer(CFG)
  assert models.as_our_transformer(ours) is ours


def test_utils_reexports_t5x_or_field_compatible_dataclasses():
  names = [f.name for f in dataclasses.fields(utils.DatasetConfig)]
  assert names[:6] == ['mixture_or_task_name', 'task_feature_lengths', 'split', 'batch_size',
                       'shuffle', 'seed']
  assert {'use_cached', 'pack', 'module'} <= set(names)
  restore = [f.name for f in dataclasses.fields(utils.RestoreCheckpointConfig)]
  assert restore[:2] == ['path', 'mode'] and 'dtype' in restore
  if HAVE_T5X:
    import t5x.utils  # pylint: disable=g-import-not-at-top
    assert utils.DatasetConfig is t5x.utils.DatasetConfig
  else:
    assert not utils.HAVE_T5X
    assert models.SpeculativeEncoderDecoderModel is models.StandaloneSpeculativeModel
    with pytest.raises(ValueError, match='mode'):
      utils.RestoreCheckpointConfig(path='/x', mode='newest')


_FAKE_T5X = {  # Just enough of T5X's API (constructor, class names) to import against.
    't5x/__init__.py': '',
    't5x/models.py': """
        class EncoderDecoderModel:
          def __init__(self, module, input_vocabulary, output_vocabulary, optimizer_def,
                       decode_fn=None, feature_converter_cls=None, label_smoothing=0.0,
                       z_loss=0.0, loss_normalizing_factor=None,
                       default_decoder_params=None):
            self.module = module
            self._output_vocabulary = output_vocabulary
            self.t5x_kwargs = dict(z_loss=z_loss, decode_fn=decode_fn)

          @property
          def output_vocabulary(self):
            return self._output_vocabulary

          def predict_batch_with_aux(self, *args, **kwargs):
            raise AssertionError('T5X beam search must be overridden')
        """,
    't5x/utils.py': """
        import dataclasses
        @dataclasses.dataclass
        class DatasetConfig:
          mixture_or_task_name: str
        @dataclasses.dataclass
        class RestoreCheckpointConfig:
          path: str
        """,
}


@pytest.mark.slow  # a subprocess
def test_with_t5x_importable_the_model_subclasses_t5x(tmp_path):
  """Checks the T5X branch of models.py/utils.py against a stand-in `t5x` package."""
  for name, text in _FAKE_T5X.items():
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_text(textwrap.dedent(text))
  child = textwrap.dedent("""
      import t5x.models, t5x.utils
      from specdec_t5x.integration import models, utils
      from specdec_t5x.algorithm.network import T5Config, Transformer
      assert utils.HAVE_T5X and utils.DatasetConfig is t5x.utils.DatasetConfig
      cls = models.SpeculativeEncoderDecoderModel
      assert issubclass(cls, t5x.models.EncoderDecoderModel)
      assert cls is not models.StandaloneSpeculativeModel
      cfg = T5Config(vocab_size=48, emb_dim=16, num_heads=2, num_encoder_layers=1,
                     num_decoder_layers=1, head_dim=8, mlp_dim=32)
      from specdec_t5x.algorithm.config import DecodeConfig
      m = cls(Transformer(cfg), None, None, None, draft_config=cfg,
              decode_config=DecodeConfig(gamma=5), z_loss=1e-4)
      assert m.t5x_kwargs['z_loss'] == 1e-4 and m.run_config.gamma == 5 and m.is_speculative
      assert cls.predict_batch_with_aux is models._SpeculativeMixin.predict_batch_with_aux
      print('OK')
      """)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
  proc = subprocess.run([sys.executable, '-c', child], env=env, cwd=tmp_path,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and proc.stdout.strip().endswith('OK'), proc.stderr[-3000:]


_NO_T5X = pytest.mark.skipif(
    not HAVE_T5X, reason='t5x is not installed (it is not on PyPI); the T5X subclass is '
    'only defined where t5x is importable')


@_NO_T5X
def test_t5x_subclass_predicts_like_generate(weights):  # pragma: no cover - needs T5X
  """The real T5X subclass, called as T5X's infer calls it: inside jit, with rng
  positional and flax_mutables, on params from T5X's own get_initial_variables."""
  from t5x import models as t5x_models  # pylint: disable=g-import-not-at-top
  from t5x.examples.t5 import network as t5x_network  # pylint: disable=g-import-not-at-top
  t5x_cfg = t5x_network.T5Config(**{f.name: getattr(CFG, f.name)
                                   for f in dataclasses.fields(CFG)})
  model = models.SpeculativeEncoderDecoderModel(
      module=t5x_network.Transformer(t5x_cfg), input_vocabulary=None,
      output_vocabulary=None, optimizer_def=None, draft_config=DRAFT_CFG,
      draft_params=weights[1], decode_config=DecodeConfig(gamma=3, temperature=1.0))
  assert isinstance(model, t5x_models.EncoderDecoderModel)
  batch = dict(_batch(), decoder_target_tokens=np.zeros((2, 6), np.int32),
               decoder_loss_weights=np.zeros((2, 6), np.int32))
  params = model.get_initial_variables(
      jax.random.PRNGKey(0), {k: v.shape for k, v in batch.items()},
      {k: v.dtype for k, v in batch.items()})['params']
  assert (jax.tree_util.tree_map(np.shape, dict(params))
          == jax.tree_util.tree_map(np.shape, dict(weights[0])))  # same tree as ours
  rng = jax.random.PRNGKey(5)
  step = jax.jit(lambda p, b, r: model.predict_batch_with_aux(p, b, r, flax_mutables=None))
  decodes, aux = step(params, batch, rng)
  ref = generate((Transformer(CFG), params), batch['encoder_input_tokens'],
                 draft=(Transformer(DRAFT_CFG), weights[1]), gamma=3, temperature=1.0,
                 max_decode_length=6, rng=rng)
  assert decodes.shape == (2, 6)
  np.testing.assert_array_equal(decodes, ref.tokens)
  assert set(aux) == set(stats.PER_EXAMPLE_STATS) | {'scores'}
  for key in stats.PER_EXAMPLE_STATS:
    assert aux[key].shape == (2,)
    np.testing.assert_array_equal(aux[key], ref.stats[key])
  np.testing.assert_array_equal(
      model.predict_batch(params, batch, decoder_params={'decode_rng': rng}), decodes)
