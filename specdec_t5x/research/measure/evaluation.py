"""Evaluation helpers of the result scripts: the demo family and its test data, alpha
measured the paper's way (teacher-forced E[sum_x min(p, q)] on target-generated tokens,
both distributions standardised alike), and what an infer run file configures.
Timing lives in speed.py. Shapes use bracket comments; `V` is the vocabulary.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import batching, sampling
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.integration import demo, draft_files, draft_state, model_dir
from specdec_t5x.integration.prefixes import PREFIXES
from specdec_t5x.research.measure import batched, forcing

# The demo's locations under the demo root (integration/demo.py: $SPECDEC_DEMO_ROOT, else
# the current directory when this module is imported; the scripts run from the repository).
DEMO_DIR = demo.checkpoints_dir()
DEMO_DATA = demo.sample_dir()
DEMO_VOCAB = demo.vocab_path()
NGRAMS = ('unigram', 'bigram')
ModelAndParams = Tuple[Any, Any]


# ------------------------------------------------------------------ loading


def load_model(name: str, task: str = 'ende', root: str = DEMO_DIR) -> ModelAndParams:
  """(module, float32 params) of a demo model (model_dir.load of root/name), or
  of the task's n-gram draft ('unigram'/'bigram')."""
  if name in NGRAMS:
    return draft_files.load_ngram(os.path.join(root, f'{name}_{task}.npz'))
  config, params = model_dir.load(os.path.join(root, name))
  return draft_state.module_for(config), params  # a T5 network or a feature draft head


@dataclasses.dataclass
class Example:
  inputs: np.ndarray  # [enc_len] int32, EOS-terminated
  targets: np.ndarray  # [dec_len] int32, EOS-terminated
  text: str
  reference: str


def load_examples(task: str, num: Optional[int] = None, vocab_path: str = DEMO_VOCAB,
                  data_dir: str = DEMO_DATA, max_input_len: int = 128,
                  eos_id: int = 1) -> List[Example]:
  """The first `num` rows of data/demo/{task}_test.tsv, prefixed and tokenised (+EOS)."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  sp = spm.SentencePieceProcessor(model_file=vocab_path)
  out = []
  with open(os.path.join(data_dir, f'{task}_test.tsv'), encoding='utf-8') as f:
    for line in f:
      if num is not None and len(out) >= num:
        break
      if not line.strip():
        continue
      src, tgt = line.rstrip('\n').split('\t')[:2]
      ids = sp.encode(PREFIXES[task] + src)[:max_input_len - 1] + [eos_id]
      out.append(Example(np.asarray(ids, np.int32), np.asarray(sp.encode(tgt) + [eos_id],
                                                               np.int32), src, tgt))
  return out


# ------------------------------------------------------------------ alpha


def target_outputs(target: ModelAndParams, enc: np.ndarray, cfg: sampling.SamplingConfig,
                   max_len: int, seed: int = 0, eos_id: int = 1,
                   batch: int = 16) -> List[np.ndarray]:
  """Target-only (autoregressive) decodes of enc [N, L], each cut after its EOS (`batch`
  rows at a time, the last batch filled up: batched.split)."""
  outs = []
  for b, out in batched.decode(target, batched.split(enc, batch), max_len,
                               config=DecodeConfig.from_sampling(cfg), seed=seed,
                               eos_id=eos_id):
    outs += batched.outputs(out, b.n)
  return outs


def _beta(p_logits, q_logits, cfg: sampling.SamplingConfig):
  """beta = sum_x min(p, q) of the standardised distributions, [..., V] -> [...]."""
  return jnp.sum(jnp.minimum(sampling.standardize(p_logits, cfg),
                             sampling.standardize(q_logits, cfg)), axis=-1)


_BETA = jax.jit(_beta, static_argnums=2)


def teacher_forced_logits(models: Sequence[ModelAndParams], enc: np.ndarray,
                          outputs: Sequence[np.ndarray], batch: int = 16):
  """Per `batch` output rows (the last batch filled up with copies of its first row, so that
  every batch has one shape and one compile): (its real rows, [each model's teacher-forced
  logits [batch, L, V] on them])."""
  dec_len = batching.bucket_length(max(len(o) for o in outputs))
  for b in batched.split(enc[:len(outputs)], batch):
    rows = list(outputs[b.start:b.start + b.n])
    d = batching.pad_batch(rows + [rows[0]] * (batch - b.n), dec_len, min_len=dec_len)
    yield rows, [forcing.jitted_logits(m[0], m[1], jnp.asarray(b.rows), jnp.asarray(d))
                 for m in models]


def betas(target: ModelAndParams, draft: ModelAndParams, enc: np.ndarray,
          outputs: Sequence[np.ndarray], cfg: sampling.SamplingConfig,
          batch: int = 16) -> np.ndarray:
  """Per-token beta_t = sum_x min(p_t, q_t) on teacher-forced target outputs, flattened.

  Distributions are `sampling.standardize`d with `cfg` (temperature; top-k/p if set).
  """
  found = []
  for rows, (p, q) in teacher_forced_logits((target, draft), enc, outputs, batch):
    b = np.asarray(_BETA(p, q, cfg))
    found += [b[i, :len(r)] for i, r in enumerate(rows)]
  return np.concatenate(found)


def alpha_per_position(histogram: Sequence[int]) -> List[Optional[float]]:
  """alpha_i = P(draft i accepted | drafts 1..i-1 accepted), i = 1..gamma, from the counts
  of steps that accepted 0..gamma drafts (None where no step reached position i)."""
  h = np.asarray(histogram, np.float64)
  out = []
  for i in range(1, len(h)):
    reached = h[i - 1:].sum()
    out.append(float(h[i:].sum() / reached) if reached else None)
  return out


# ------------------------------------------------------------------ gin run files


def from_gin(gin_files: Sequence[str], bindings: Sequence[str], num_examples: int,
             search_paths: Sequence[str] = ('.',)) -> Dict[str, Any]:
  """What an infer run file configures: model (module, draft, its DecodeConfig as
  'config'), params, the first `num_examples` encoder inputs [N, <= L] (at their length
  bucket), max_len and eos_id.

  Parses the files as `python -m specdec_t5x.infer` does, but calls a stand-in for
  `infer_script.infer` that returns its gin-bound arguments instead of decoding.
  """
  import gin  # pylint: disable=g-import-not-at-top
  from specdec_t5x.integration import infer as infer_lib, tasks  # pylint: disable=g-import-not-at-top

  # Parse exactly as the runner does, then read the arguments gin binds to its `infer`
  # (references resolved) without running it: registering a stand-in `infer` would make
  # the selector ambiguous for every later gin parse in the process.
  configured = infer_lib.parse_gin(
      list(gin_files), ["INFER_OUTPUT_DIR = '/tmp/speedup_table'"] + list(bindings),
      search_paths)
  try:
    kw = gin.get_bindings(configured, resolve_references=True)
  finally:
    gin.clear_config()
  model, data, restore = kw['model'], kw['dataset_cfg'], kw['restore_checkpoint_cfg']
  if kw.get('task_vocab_path'):
    tasks.register_tasks(kw['task_vocab_path'])
  seed = kw.get('fallback_init_rng')
  examples = infer_lib.load_examples(data.mixture_or_task_name, data,
                                     allow_truncation=kw.get('allow_truncation', True),  # infer's default
                                     num_examples=num_examples, shard_id=0, num_shards=1)
  lengths = dict(data.task_feature_lengths)
  # Placed on the device as the runner places them (infer.py): numpy params would be
  # copied to the device by every decode call.
  params = jax.device_put(model.restore_target(restore.path, restore.dtype, seed))
  model.restore_draft(restore.dtype, seed)
  if model.is_speculative:
    model.draft_params = jax.device_put(model.draft_params)
  return {'model': model, 'target': (model.target_module, params),
          'draft': (model.draft_module, model.draft_params) if model.is_speculative else None,
          'enc': batching.pad_batch([e['inputs'] for e in examples], lengths['inputs']),
          'max_len': int(model.max_decode_length or lengths['targets']),
          'eos_id': model.eos_id, 'task': data.mixture_or_task_name,
          'config': model.decode_config}
