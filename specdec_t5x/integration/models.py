"""SpeculativeEncoderDecoderModel: a T5X-shaped model whose decoding is `generate`.

When `t5x` is importable the class subclasses `t5x.models.EncoderDecoderModel` (so T5X's
runners, partitioner and checkpoint restore work unchanged) and overrides
`predict_batch_with_aux` to run speculative decoding with a draft model it carries (module
+ params, loaded from the draft checkpoint). Without T5X it is `StandaloneSpeculativeModel`,
a plain class with the same constructor and `predict_batch_with_aux` signature, which
`specdec_t5x.infer` drives. With no draft it decodes autoregressively through the same
jitted machinery (the paper's baseline).

`predict_batch_with_aux` takes every option of T5X's sampling (t5x_outputs.py) and returns
T5X's 'scores' with the per-example speculative statistics as aux; batch-level statistics
come from `predict_batch_with_stats`. Scoring (`score_batch`, `mode='score'`) is T5X's own,
inherited (the target, teacher forced); the standalone model only predicts.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional, Tuple

from absl import logging
import flax
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import api, auto_gamma, network, stats
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.integration import (checkpoints, draft_state, storage, t5x_outputs,
                                     vocab_check)
from specdec_t5x.integration.random_init import init_params

try:  # T5X is not on PyPI: subclass its model only when it is installed.
  from t5x import models as t5x_models  # type: ignore
except ImportError:
  t5x_models = None

_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(network.T5Config))


def as_our_transformer(module: Any) -> Any:
  """Our network.Transformer for `module`: itself, or one built from a T5X module's config
  (same parameter tree). Modules with `encode/init_cache/extend` pass through."""
  if all(hasattr(module, m) for m in ('encode', 'init_cache', 'extend')):
    return module
  config = getattr(module, 'config', None)
  if config is None:
    raise TypeError(f'{type(module).__name__} has no T5 `config`; cannot decode with it.')
  fields = {f: getattr(config, f) for f in _CONFIG_FIELDS if hasattr(config, f)}
  return network.Transformer(network.T5Config(**fields))


def config_dict(config: Any) -> Optional[Dict[str, Any]]:
  """A JSON-friendly dict of a T5Config or FeatureDraftConfig (None stays None)."""
  if config is None:
    return None
  out = {}
  for name in ([f.name for f in dataclasses.fields(config)]
               if dataclasses.is_dataclass(config) else _CONFIG_FIELDS):
    value = getattr(config, name, None)
    out[name] = (list(value) if isinstance(value, (tuple, list))
                 else value if isinstance(value, (int, float, str, bool, type(None)))
                 else jnp.dtype(value).name)
  return out


def load_checkpoint(path: Optional[str], *, macro: str, what: str, config: Any = None,
                    dtype: Optional[str] = None) -> Any:
  """`checkpoints.load_params` (a local path or a URL, gs://...) with an error that names
  the gin macro to set."""
  if not path or not storage.exists(path):
    raise FileNotFoundError(
        f'{what} checkpoint not found: {path!r}. Set the gin macro {macro}, e.g. '
        f'--gin.{macro}="\'/path/to/checkpoint_1000000\'".')
  return checkpoints.load_params(path, dtype=dtype and jnp.dtype(dtype), config=config)


class _SpeculativeMixin:
  """Draft model, sampling settings and the decoding methods shared by both classes."""

  def _init_speculative(self, *, draft_config, draft_module, draft_checkpoint, draft_params,
                        draft_vocabulary, max_decode_length, decode_config):
    if decode_config is None:
      decode_config = DecodeConfig()
    if not isinstance(decode_config, DecodeConfig):
      raise TypeError(f'decode_config must be a DecodeConfig, got {decode_config!r}.')
    self.decode_config = decode_config  # the one set of decode settings (gamma may be 'auto')
    target = as_our_transformer(self.module)
    if draft_module is None and draft_config is not None:
      draft_module = draft_state.module_for(draft_config)
    self.target_module = target
    self.draft_module = draft_module
    self.draft_config = getattr(draft_module, 'config', draft_config)
    self.draft_checkpoint = draft_checkpoint
    self.draft_vocabulary = draft_vocabulary
    self._draft_params = draft_params
    # gamma='auto': what the first batch measured and chose (auto_gamma.py); see run_config.
    self.gamma_choice: Optional[Dict[str, Any]] = None
    self.max_decode_length = max_decode_length
    self._run_totals: Dict[str, Any] = {}
    if draft_module is not None:
      api.check_vocab_sizes(target, draft_module)  # at construction: before any loading
      api.check_feature_draft(target, draft_module)
      target_vocab = self.output_vocabulary
      if (draft_vocabulary is not None and target_vocab is not None
          and not vocab_check.same_sentencepiece(draft_vocabulary, target_vocab)):
        raise ValueError(
            'Draft and target use different SentencePiece models: target '
            f'{vocab_check.spm_identity(target_vocab)}, draft '
            f'{vocab_check.spm_identity(draft_vocabulary)} (path, extra_ids). Speculative '
            'decoding needs the same tokenizer.')

  @property
  def run_config(self) -> DecodeConfig:
    """The DecodeConfig batches are decoded with: `decode_config`, with gamma='auto'
    replaced by the gamma chosen at the first batch (`gamma_choice`)."""
    if self.decode_config.gamma == 'auto' and self.gamma_choice is not None:
      return self.decode_config.replace(gamma=self.gamma_choice['gamma'])
    return self.decode_config

  @property
  def is_speculative(self) -> bool:
    return self.draft_module is not None

  @property
  def draft_params(self) -> Any:
    if self.is_speculative and self._draft_params is None:
      raise ValueError('Draft parameters are not loaded; call restore_draft() first.')
    return self._draft_params

  @draft_params.setter
  def draft_params(self, params: Any) -> None:
    self._draft_params = params

  @property
  def eos_id(self) -> int:
    return int(getattr(self.output_vocabulary, 'eos_id', None) or 1)

  def check_task_vocabulary(self, vocab: Any) -> None:
    """Raises unless the task's vocabulary is this model's and fits the embedding."""
    own = getattr(self, 'output_vocabulary', None)
    if own is not None and not vocab_check.same_sentencepiece(own, vocab):
      raise ValueError(f'Model and task vocabularies differ: model '
                       f'{vocab_check.spm_identity(own)}, task {vocab_check.spm_identity(vocab)}'
                       '; set VOCAB_PATH / VOCAB_EXTRA_IDS, or '
                       "register the task with the model's vocabulary in a module named by "
                       'MIXTURE_OR_TASK_MODULE.')
    size = self.target_module.config.vocab_size
    if size < vocab.vocab_size:
      raise ValueError(f'Target vocab_size={size} is smaller than the task vocabulary '
                       f'({vocab.vocab_size} ids).')

  def check_checkpoints(self, target_path: Optional[str],
                        fallback_init_rng: Optional[int] = None) -> None:
    """Fails fast, before data or weights are read, if a checkpoint directory is missing
    (a None path is fine when `fallback_init_rng` asks for random weights)."""
    for path, what, macro, needed in (
        (target_path, 'Target', 'TARGET_CHECKPOINT', True),
        (self.draft_checkpoint, 'Draft', 'DRAFT_CHECKPOINT',
         self.is_speculative and self._draft_params is None)):
      random_ok = path is None and fallback_init_rng is not None
      if needed and not random_ok and not (path and storage.exists(path)):
        load_checkpoint(path, macro=macro, what=what)  # Raises FileNotFoundError.

  def restore_target(self, path: Optional[str], dtype: Optional[str] = None,
                     fallback_init_rng: Optional[int] = None) -> Any:
    """Target params from the checkpoint at `path` (random if None and a seed is given)."""
    if path is None and fallback_init_rng is not None:
      return init_params(self.target_module, jax.random.PRNGKey(fallback_init_rng))
    return load_checkpoint(path, macro='TARGET_CHECKPOINT', what='Target',
                           config=self.target_module.config, dtype=dtype)

  def restore_draft(self, dtype: Optional[str] = None,
                    fallback_init_rng: Optional[int] = None) -> None:
    """Loads the draft params from `draft_checkpoint` (random init if it is None and
    `fallback_init_rng` is given). No-op without a draft or when already loaded."""
    if not self.is_speculative or self._draft_params is not None:
      return
    if self.draft_checkpoint is None and fallback_init_rng is not None:
      self._draft_params = init_params(self.draft_module,
                                       jax.random.PRNGKey(fallback_init_rng + 1))
      return
    self._draft_params = load_checkpoint(self.draft_checkpoint, macro='DRAFT_CHECKPOINT',
                                         what='Draft', config=self.draft_config, dtype=dtype)

  def describe(self) -> Dict[str, Any]:
    """Settings for metrics.json and for checking that a resumed run is the same run."""
    settings = self.decode_config.describe()
    if not self.is_speculative:
      settings['gamma'] = None
    return {
        'speculative': self.is_speculative, **settings,
        'max_decode_length': self.max_decode_length,
        'target_config': config_dict(self.target_module.config),
        'draft_config': config_dict(self.draft_config),
        'draft_module': type(self.draft_module).__name__ if self.is_speculative else None,
        'draft_checkpoint': self.draft_checkpoint if self.is_speculative else None,
    }

  def predict_batch_with_stats(self, params: Any, batch: Mapping[str, Any],
                               rng: Optional[jax.Array] = None, draft_params: Any = None
                               ) -> Tuple[jax.Array, Dict[str, jax.Array], Dict[str, jax.Array]]:
    """-> (decodes [batch, len], per-example stats {name: [batch]}, batch-level stats:
    {name: counts} for stats.BATCH_STATS). `draft_params`: as T5X passes them."""
    out = self._generate(params, batch['encoder_input_tokens'], self._max_len(batch), rng,
                         draft_params=draft_params)
    aux = {k: out.stats[k] for k in stats.PER_EXAMPLE_STATS}
    return out.tokens, aux, {k: out.stats[k] for k in stats.BATCH_STATS}

  def _max_len(self, batch: Mapping[str, Any]) -> int:
    if self.max_decode_length is not None:
      return int(self.max_decode_length)
    if 'decoder_input_tokens' not in batch:
      raise ValueError('Set max_decode_length or pass batch["decoder_input_tokens"].')
    return int(np.shape(batch['decoder_input_tokens'])[1])

  def _generate(self, params: Any, enc: Any, max_len: int, rng: Optional[jax.Array],
                decoder_prompt: Any = None, draft_params: Any = None) -> api.GenerateOutput:
    """api.generate with the target, the draft (`draft_params`: T5X's state carries it;
    None: the model's own, loaded on first use) and `run_config`."""
    if draft_params is None and self.is_speculative:
      if self._draft_params is None and self.draft_checkpoint:
        # No draft in T5X's state (a gin file without draft_state.restore_draft, or a draft
        # that is not a T5 network): load it on first use, replicated on every device.
        self.restore_draft()
        replicated = jax.sharding.NamedSharding(
            jax.sharding.Mesh(np.asarray(jax.devices()), ('devices',)),
            jax.sharding.PartitionSpec())
        self._draft_params = jax.device_put(self._draft_params, replicated)
      draft_params = self.draft_params
    draft = (self.draft_module, draft_params) if self.is_speculative else None
    if draft is not None and self.run_config.gamma == 'auto':
      self._choose_gamma((self.target_module, params), draft, enc, max_len, rng)
    return api.generate((self.target_module, params), enc, draft=draft, max_decode_length=max_len,
                        rng=rng, eos_id=self.eos_id, config=self.run_config,
                        decoder_prompt=decoder_prompt)

  def _choose_gamma(self, target: Any, draft: Any, enc: Any, max_len: int,
                    rng: Optional[jax.Array]) -> None:
    """gamma='auto': measures call costs on `enc` (and alpha, unless `gamma_alpha` is
    set, from a warm-up decode with every other setting of the run) and fixes gamma for
    every later batch; the choice is kept in `gamma_choice`."""
    if isinstance(enc, jax.core.Tracer):
      raise ValueError("gamma='auto' times calls on the first batch, which needs concrete "
                       'inputs: run python -m specdec_t5x.infer, or set an integer gamma '
                       '(e.g. --gin.GAMMA=3) under a runner that traces the model.')
    alpha = self.decode_config.gamma_alpha
    if alpha is None:
      alpha = auto_gamma.warmup_alpha(
          target, draft, enc, max_len=max_len, eos_id=self.eos_id,
          rng=jax.random.PRNGKey(0) if rng is None else rng, config=self.decode_config)
    self.gamma_choice = dict(auto_gamma.choose_gamma(target, draft, enc, alpha=alpha,
                                                     max_len=max_len),
                             alpha_source='given' if self.decode_config.gamma_alpha is not None
                             else 'warm-up decode of the first batch')
    if jax.process_count() > 1:  # One program on every host: process 0's timings choose.
      self.gamma_choice['gamma'] = int(multihost_utils.broadcast_one_to_all(
          np.int32(self.gamma_choice['gamma'])))

  def predict_batch_with_aux(self, params: Any, batch: Mapping[str, Any],
                             rng: Optional[jax.Array] = None,
                             decoder_params: Optional[Mapping[str, Any]] = None,
                             return_all_decodes: Optional[bool] = None,
                             num_decodes: Optional[int] = None,
                             prompt_with_targets: bool = False,
                             flax_mutables: Any = None) -> Tuple[jax.Array, Dict[str, jax.Array]]:
    """T5X's signature and outputs (t5x_outputs.py): decodes [batch, len] (or [batch,
    num_decodes, len]), aux 'scores' and the per-example statistics, [batch] (or [batch,
    num_decodes]). `rng` or `decoder_params['decode_rng']` (not both) seeds the decode;
    the draft's weights come in `flax_mutables` when T5X's state carries them."""
    defaults = getattr(self, '_default_decoder_params', None)  # T5X's DecoderParams
    if num_decodes is None:
      num_decodes = getattr(defaults, 'num_decodes', 1)
    if return_all_decodes is None:
      return_all_decodes = getattr(defaults, 'return_all_decodes', False)
    rng = t5x_outputs.decode_rng(rng, decoder_params)
    max_len = self._max_len(batch)
    enc = t5x_outputs.expand(jnp.asarray(batch['encoder_input_tokens']), num_decodes)
    prompt = None
    if prompt_with_targets:
      prompt = t5x_outputs.expand(t5x_outputs.decoder_prompt(
          batch['decoder_input_tokens'], self.eos_id, max_len), num_decodes)
    out = self._generate(params, enc, max_len, rng, decoder_prompt=prompt,
                         draft_params=draft_state.params_from(flax_mutables))
    aux = {k: out.stats[k] for k in stats.PER_EXAMPLE_STATS}
    # T5X's infer keeps no run-level statistics: add each batch's to the run's on the host
    # (the rows T5X pads a last batch with excluded; every decode of an input counted).
    real = jnp.any(enc != 0, axis=1)  # [batch * num_decodes]
    jax.debug.callback(self._add_run_stats, dict(aux), real)
    aux['scores'] = t5x_outputs.log_probs(
        self.target_module, params, enc, out.tokens, out.stats['generated_tokens'],
        prompt, self.decode_config.sampling)
    return t5x_outputs.t5x_order(out.tokens, aux, num_decodes, return_all_decodes)

  def _add_run_stats(self, aux: Mapping[str, Any], real: Any) -> None:
    """Adds a batch's per-example statistics (not T5X's padding rows) to the run's totals
    and logs the run's alpha and tokens per target call so far."""
    real = np.asarray(real, bool)
    totals = self._run_totals
    for k in stats.PER_EXAMPLE_STATS:
      totals[k] = totals.get(k, 0) + stats.total(k, np.asarray(aux[k])[real])
    totals['examples'] = totals.get('examples', 0) + int(real.sum())
    run = self.run_stats()
    logging.info('specdec_t5x: %d examples: alpha %s, acceptance rate %s, %s tokens per '
                 'target call '
                 '(%d generated tokens, %d target calls, gamma %s)', totals['examples'],
                 *('n/a' if v is None else f'{v:.3f}'
                   for v in (run['alpha'], run['acceptance_rate'],
                             run['mean_tokens_per_target_call'])),
                 run['generated_tokens'], run['target_calls'],
                 self.run_config.gamma if self.is_speculative else None)

  def run_stats(self) -> Dict[str, Any]:
    """stats.summarize of every `predict_batch_with_aux` call so far (t5x.infer logs it)."""
    return dict(stats.summarize(self._run_totals),
                examples=self._run_totals.get('examples', 0))

  def predict_batch(self, params: Any, batch: Mapping[str, Any],
                    rng: Optional[jax.Array] = None, flax_mutables: Any = None,
                    **kwargs: Any) -> jax.Array:
    """T5X's: the decodes of `predict_batch_with_aux` (same arguments)."""
    return self.predict_batch_with_aux(params, batch, rng, flax_mutables=flax_mutables, **kwargs)[0]


_DRAFT_DEFAULTS = dict(draft_config=None, draft_module=None, draft_checkpoint=None,
                       draft_params=None, draft_vocabulary=None, max_decode_length=None,
                       decode_config=None)


class StandaloneSpeculativeModel(_SpeculativeMixin):
  """The model without T5X: same constructor and predict methods as the T5X subclass.

  Args:
    module: target Transformer (ours, or any module with a T5 `config`).
    input_vocabulary, output_vocabulary: the target's seqio vocabularies (None: the task's).
    optimizer_def: accepted for T5X compatibility; unused.
    draft_config: T5Config of a draft Transformer, FeatureDraftConfig of a feature head;
      or `draft_module` for another draft (drafts.BigramDraft); neither = autoregressive.
    draft_checkpoint: T5X checkpoint of the draft (loaded by `restore_draft`).
    draft_params: draft parameters, instead of a checkpoint.
    draft_vocabulary: the draft's vocabulary, checked to be the target's.
    decode_config: the DecodeConfig to decode with (None: DecodeConfig(), its defaults);
      gamma='auto' picks gamma at the first batch from call costs measured then
      (auto_gamma.py) and alpha `gamma_alpha` (None: a warm-up decode with the other
      settings), kept in `gamma_choice`; `run_config` is the config then decoded with.
    max_decode_length: decoder tokens per example; None = batch['decoder_input_tokens']
      length (T5X's convention).
  """

  def __init__(self, module: Any, input_vocabulary: Any = None, output_vocabulary: Any = None,
               optimizer_def: Any = None, **speculative: Any):
    unknown = set(speculative) - set(_DRAFT_DEFAULTS)
    if unknown:
      raise TypeError(f'Unknown arguments: {sorted(unknown)}')
    self.module = module
    self.input_vocabulary = input_vocabulary
    self.output_vocabulary = output_vocabulary
    self.optimizer_def = optimizer_def
    self._init_speculative(**{**_DRAFT_DEFAULTS, **speculative})

  def score_batch(self, *args: Any, **kwargs: Any):
    raise NotImplementedError(
        "Scoring (mode='score') is T5X's EncoderDecoderModel.score_batch, which "
        'SpeculativeEncoderDecoderModel inherits where T5X is installed; the standalone '
        'model only predicts.')


if t5x_models is not None:

  class SpeculativeEncoderDecoderModel(_SpeculativeMixin, t5x_models.EncoderDecoderModel):
    """T5X's EncoderDecoderModel with speculative `predict_batch_with_aux` (see module doc).

    Extra keyword arguments are StandaloneSpeculativeModel's; the rest go to T5X.
    """

    def __init__(self, module: Any, input_vocabulary: Any, output_vocabulary: Any,
                 optimizer_def: Any = None, **kwargs: Any):
      speculative = {k: kwargs.pop(k) for k in list(kwargs) if k in _DRAFT_DEFAULTS}
      t5x_models.EncoderDecoderModel.__init__(
          self, module=module, input_vocabulary=input_vocabulary,
          output_vocabulary=output_vocabulary, optimizer_def=optimizer_def, **kwargs)
      self._init_speculative(**{**_DRAFT_DEFAULTS, **speculative})

    def get_initial_variables(self, rng: jax.Array, input_shapes: Mapping[str, Any],
                              input_types: Optional[Mapping[str, Any]] = None) -> Any:
      """T5X's variables of the target plus, for a T5 draft, the draft's params and axes
      (collections `draft`, `draft_axes`): T5X then restores, partitions and passes the
      draft like the target (draft_state.py)."""
      variables = super().get_initial_variables(rng, input_shapes, input_types)
      if not (self.is_speculative and draft_state.carries_draft(self.draft_module)):
        return variables
      extra = draft_state.initial_variables(self.draft_module, jax.random.fold_in(rng, 1),
                                            self._draft_params)
      return flax.core.freeze({**flax.core.unfreeze(variables), **extra})

else:
  SpeculativeEncoderDecoderModel = StandaloneSpeculativeModel
