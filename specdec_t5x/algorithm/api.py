"""`generate`: the public entry point (ARCHITECTURE.md, "Public paths"; docs/internals.md).

Binds Flax modules and params into the callbacks that the loops of decode/ run, and
compiles the whole generation (encoders, caches, loop) into one jitted call. On the CPU
backend the model's weights are packed once per params tree for the CPU kernels, or, with
XLA's dot, a tied embedding transposed once (cpu.packing.decode_variables).
"""

from __future__ import annotations

import collections
from typing import Any, Callable, Optional, Tuple

import flax.struct
import jax
import numpy as np

from specdec_t5x.algorithm import checks, feature_draft, network
from specdec_t5x.algorithm.decode import chain, core, dynamic_tree, static_tree
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.algorithm.cpu import modes, packing
from specdec_t5x.algorithm.programs import (BoundProgram, memoized_program, program_key,
                                            run_time_constant)
from specdec_t5x.algorithm.stats import DecodeStats

ModelAndParams = Tuple[Any, Any]  # (flax module with encode/init_cache/extend, params)


@flax.struct.dataclass
class GenerateOutput:
  tokens: jax.Array  # [batch, max_decode_length] int32, no BOS, zeros after first EOS
  stats: DecodeStats  # a Mapping too: stats['target_calls'] etc.


def _vocab_size(module) -> Optional[int]:
  config = getattr(module, 'config', None)
  return getattr(config, 'vocab_size', getattr(module, 'vocab_size', None))


def check_vocab_sizes(target_module, draft_module) -> None:
  """Raises unless target and draft have the same vocabulary size (where both say it)."""
  tv, dv = _vocab_size(target_module), _vocab_size(draft_module)
  if tv is not None and dv is not None and tv != dv:
    raise ValueError(f'Draft and target vocabulary sizes differ: target vocab_size={tv}, '
                     f'draft vocab_size={dv}. Speculative decoding needs one tokenizer.')


def _extend_fn(module, variables, *extra) -> core.ExtendFn:
  """`module.extend` bound to `variables`; `extra` arguments follow the ExtendFn's own
  (return_features=True and the feature layers, for a target read by a feature draft), and
  a draft tree comes by keyword (`tree=parents`)."""
  def fn(cache, tokens, positions, *args, **tree):
    return module.apply(variables, cache, tokens, positions, *args, *extra, **tree,
                        method='extend')
  return fn


def reads_features(draft_module) -> bool:
  """The draft is a head fed the target's features (feature_draft.py), not a model."""
  return bool(getattr(draft_module, 'reads_target_features', False))


def check_feature_draft(target_module, draft_module) -> None:
  """Raises unless a feature-reading draft was made for this target's feature width."""
  target_config = getattr(target_module, 'config', None)
  if reads_features(draft_module) and target_config is not None:
    feature_draft.check_fits(draft_module.config, target_config)


def prefill(target_module, target_vars, draft_module, draft_vars, encoder_tokens, *,
            max_len: int, config: DecodeConfig):
  """What a decode computes once before its loop: (the target's decode cache, the draft's or
  None without a draft), each with the target's encoder output or the draft's own (a
  feature head cross-attends to the target's) and room for every write of the decode
  (core.cache_length: max_len and, with a draft, a step's drafted nodes). Traced inside
  `decode_program`'s program; research/measure/call_parts.py times it alone."""
  drafted = config.tree_call_nodes if draft_module is not None else 0
  cache_len = core.cache_length(max_len, drafted)
  encoded = target_module.apply(target_vars, encoder_tokens, method='encode')
  target_cache = target_module.apply(target_vars, encoded, encoder_tokens, cache_len,
                                     method='init_cache')
  if draft_module is None:
    return target_cache, None
  if not reads_features(draft_module):
    encoded = draft_module.apply(draft_vars, encoder_tokens, method='encode')
  return target_cache, draft_module.apply(draft_vars, encoded, encoder_tokens, cache_len,
                                          method='init_cache')


def decode_program(target_module, draft_module, *, max_len: int, config: DecodeConfig,
                   wrap: Optional[Callable[[str, core.ExtendFn], core.ExtendFn]] = None):
  """The whole generation, not yet jitted: fn(target_vars, draft_vars, encoder_tokens, rng,
  eos_id, prompt=None, sampling=None) -> (tokens, stats). `sampling`: the run-time values
  of the sampling settings (SamplingConfig.values(), float32 [3]) for the switches that
  config.sampling fixes (greedy, top-k, top-p on or off); None: config's own values, as
  constants of the program. `wrap(name, fn)`, if given, replaces the 'target' and 'draft'
  ExtendFns the loops call (e.g. research/measure/loop_profile.py's scopes)."""
  wrap = wrap or (lambda name, fn: fn)

  def run(target_vars, draft_vars, encoder_tokens, rng, eos_id, prompt=None, sampling=None):
    values = config.sampling.values() if sampling is None else sampling
    with modes.decode_mode(config.cpu_kernels):  # traced in the config's kernel mode
      return _run(target_vars, draft_vars, encoder_tokens, rng, eos_id, prompt,
                  config.sampling.bind(values))

  def _run(target_vars, draft_vars, encoder_tokens, rng, eos_id, prompt, settings):
    batch = encoder_tokens.shape[0]
    # Every write fits (rows.update_all drops a call's writes for all rows when one row's
    # window does not, and the stats say so; drafting.feature_drafter keeps a finished
    # row's re-feed inside).
    target_cache, draft_cache = prefill(target_module, target_vars, draft_module, draft_vars,
                                        encoder_tokens, max_len=max_len, config=config)
    if draft_module is None:
      target_fn = wrap('target', _extend_fn(target_module, target_vars))
      return chain.autoregressive_decode(target_fn, target_cache, rng, batch=batch,
                                         max_len=max_len, config=config, eos_id=eos_id,
                                         prompt=prompt, settings=settings)
    features = reads_features(draft_module)
    extra = (True, draft_module.config.feature_layers) if features else ()
    target_fn = wrap('target', _extend_fn(target_module, target_vars, *extra))
    head = dict(feature_dim=draft_module.config.feature_dim if features else None,
                draft_vocab=feature_draft.vocabulary(draft_module.config) if features else None)
    if config.draft_tree_width:
      return dynamic_tree.dynamic_tree_decode(
          target_fn, wrap('draft', _extend_fn(draft_module, draft_vars)), target_cache,
          draft_cache, rng, encoder_tokens, batch=batch, max_len=max_len, config=config,
          eos_id=eos_id, prompt=prompt, settings=settings, **head)
    if config.tree:
      return static_tree.tree_speculative_decode(
          target_fn, wrap('draft', _extend_fn(draft_module, draft_vars)), target_cache,
          draft_cache, rng, encoder_tokens, batch=batch, max_len=max_len, config=config,
          eos_id=eos_id, prompt=prompt, settings=settings, **head)
    return chain.speculative_decode(
        target_fn, wrap('draft', _extend_fn(draft_module, draft_vars)), target_cache,
        draft_cache, rng, batch=batch, max_len=max_len, config=config, eos_id=eos_id,
        prompt=prompt, settings=settings, **head)

  return run


_COMPILED: 'collections.OrderedDict[Any, Any]' = collections.OrderedDict()


def compiled_program(target_module, draft_module, *, max_len: int, config: DecodeConfig
                     ) -> BoundProgram:
  """The jitted decode program for these models and settings. The temperature and top-p
  mass are its run-time arguments: the program is keyed on what shapes it
  (DecodeConfig.program_key, in programs.program_key), so that every temperature and top-p
  shares one."""
  values = config.sampling.values()
  if draft_module is None:  # only the sampling settings matter: one program for all others
    config = DecodeConfig.from_sampling(config.sampling, gamma=1,
                                        cpu_kernels=config.cpu_kernels)
  config = config.program_key()
  key = program_key(target_module, draft_module, max_len, config)
  return BoundProgram(memoized_program(_COMPILED, key, lambda: jax.jit(decode_program(
      target_module, draft_module, max_len=max_len, config=config))), values)


def generate(target: ModelAndParams, encoder_input_tokens, *, draft: Optional[ModelAndParams] = None,
             max_decode_length: int, rng: Optional[jax.Array] = None, eos_id: int = 1,
             config: Optional[DecodeConfig] = None, decoder_prompt=None,
             **settings: Any) -> GenerateOutput:
  """Decodes with the target, speculatively when a draft is given (exact for lenience=1).

  The decode settings are DecodeConfig's fields (config.py holds their defaults and
  meaning): give them one by one as keywords (gamma=4, temperature=0.0, topk, topp,
  lenience, verifier, gamma_policy) or all at once as `config`, not both.

  Args:
    target: (module, params) of the target model (network.Transformer or compatible).
    encoder_input_tokens: [batch, enc_len] int token ids, 0 = padding.
    draft: (module, params) of the draft model; None gives autoregressive decoding.
    max_decode_length: number of decoder tokens to produce at most (>= 1), prompt included.
    rng: PRNG key; each batch row gets its own stream. Defaults to PRNGKey(0).
    eos_id: end-of-sequence id; a row stops after emitting it.
    config: a DecodeConfig (gamma an integer).
    decoder_prompt: optional [batch, P] int ids (P <= max_decode_length): each row's
      decoder prompt, its leading non-zero tokens; the row continues after them (the
      returned tokens start with the prompt, which the statistics do not count).
    **settings: DecodeConfig's fields, instead of `config`. gamma: draft tokens per
      step, 1 <= gamma <= min(max_decode_length, config.MAX_GAMMA) (larger ones are
      refused, never capped: sampled tokens depend on gamma); temperature: 0 = greedy,
      else the sampling temperature of target and draft alike; topk / topp: keep the k
      most likely tokens (at most the target's vocab_size) / the nucleus of mass topp
      (0 = off); lenience: l in (0, 1], l < 1 the paper's LOSSY relaxation; verifier:
      'token' (Algorithm 1) or 'block' (Sun et al. 2025, also exact); gamma_policy:
      'fixed', 'confidence', 'running_alpha' or a GammaPolicy (adaptive draft lengths,
      still exact).

  Returns:
    GenerateOutput with `.tokens` [batch, max_decode_length] and `.stats`, a DecodeStats
    (a Mapping): per-row target_calls, drafted_tokens, accepted_tokens, generated_tokens,
    and accepted_length_histogram [gamma + 1], draft_length_histogram [gamma + 1];
    step_outcomes [3]; nonfinite_target_logits / nonfinite_draft_logits /
    skipped_cache_writes [batch] bool, all False when returned: see Raises.

  Raises:
    ValueError: a bad setting (checked before tracing: topk > vocab_size, gamma >
      max_decode_length, ...); non-finite temperature; or, for concrete inputs, a token id
      outside [0, target vocab_size) (named with its row and column). Inputs traced under
      an outer jit cannot be checked: out-of-range ids there give undefined tokens.
    FloatingPointError: the target or draft produced NaN/inf logits for a decoding row
      (e.g. NaN params). Checked after the call, so only when outputs are concrete.
    RuntimeError: a call's cache writes did not fit (a bug; checked likewise).
  """
  if config is None:
    config = DecodeConfig(**settings)
  elif settings:
    raise ValueError(f'Give the decode settings either as `config` or one by one, not both '
                     f'(also given: {sorted(settings)}).')
  elif not isinstance(config, DecodeConfig):
    raise ValueError(f'config must be a DecodeConfig, got {config!r}.')
  if eos_id is None or isinstance(eos_id, bool) or int(eos_id) != eos_id:
    raise ValueError(f'eos_id must be an integer token id (T5: 1; -1 = never stop), '
                     f'got {eos_id!r}.')
  if int(max_decode_length) != max_decode_length or max_decode_length < 1:
    raise ValueError(f'max_decode_length must be an integer >= 1, got {max_decode_length}.')
  target_module, target_params = target
  config.check_models(vocab_size=_vocab_size(target_module),
                      max_decode_length=int(max_decode_length), speculative=draft is not None)
  tokens = checks.encoder_inputs(encoder_input_tokens, _vocab_size(target_module))
  draft_module, draft_params = draft if draft is not None else (None, None)
  if draft_module is not None:
    if config.gamma == 'auto':
      raise ValueError("gamma='auto' is chosen by the T5X model from measured call costs "
                       '(models.py, auto_gamma.py); generate needs an integer gamma.')
    check_vocab_sizes(target_module, draft_module)
    check_feature_draft(target_module, draft_module)
  # A head with a reduced draft vocabulary drafts over its len(draft_vocab) ids.
  columns = None
  if reads_features(draft_module):
    columns = len(draft_module.config.draft_vocab) or None
  why = checks.draft_tree(config, reads_features(draft_module), draft is not None,
                          isinstance(draft_module, network.Transformer), columns)
  if why:
    raise ValueError(why)
  rng = jax.random.PRNGKey(0) if rng is None else rng
  fn = compiled_program(target_module, draft_module, max_len=int(max_decode_length),
                        config=config)
  mode = config.cpu_kernels
  draft_vars = None if draft_module is None else packing.decode_variables(
      draft_module, draft_params, mode)
  prompt = None if decoder_prompt is None else checks.decoder_prompt(decoder_prompt, tokens.shape[0],
                                                             int(max_decode_length))
  out_tokens, stats = fn(packing.decode_variables(target_module, target_params, mode), draft_vars,
                         tokens, rng, run_time_constant(eos_id, np.int32), prompt)
  checks.cache_writes(stats)
  checks.finite(stats)
  return GenerateOutput(out_tokens, stats)
