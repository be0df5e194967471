"""`generate`: the public entry point (ARCHITECTURE.md, "Public paths").

Binds Flax modules and params into the callbacks that decoding.py loops over, and
compiles the whole generation (encoders, caches, loop) into one jitted call. On the CPU
backend the model's float32 weights are packed once per params tree for cpu_kernels'
matmul, or, with XLA's dot, a tied embedding transposed once (`decode_variables`).
"""

from __future__ import annotations

import collections
import functools
import logging
from typing import Any, Callable, Optional, Tuple
import weakref

from flax import traverse_util
import flax.struct
import jax
import jax.numpy as jnp

from specdec_t5x.algorithm import checks, cpu_bf16, cpu_kernels, feature_draft, layers, network
from specdec_t5x.algorithm.decode import chain, core, dynamic_tree, static_tree
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.algorithm.programs import BoundProgram, memoized_program
from specdec_t5x.algorithm.stats import DecodeStats

ModelAndParams = Tuple[Any, Any]  # (flax module with encode/init_cache/extend, params)


@flax.struct.dataclass
class GenerateOutput:
  tokens: jax.Array  # [batch, max_decode_length] int32, no BOS, zeros after first EOS
  stats: DecodeStats  # a Mapping too: stats['target_calls'] etc.


def _module_key(module) -> Any:
  """Flax modules hash by their (frozen) fields; fall back to identity otherwise."""
  try:
    hash(module)
    return module
  except TypeError:
    return (type(module), id(module))


def _vocab_size(module) -> Optional[int]:
  config = getattr(module, 'config', None)
  return getattr(config, 'vocab_size', getattr(module, 'vocab_size', None))


def check_vocab_sizes(target_module, draft_module) -> None:
  """Raises unless target and draft have the same vocabulary size (where both say it)."""
  tv, dv = _vocab_size(target_module), _vocab_size(draft_module)
  if tv is not None and dv is not None and tv != dv:
    raise ValueError(f'Draft and target vocabulary sizes differ: target vocab_size={tv}, '
                     f'draft vocab_size={dv}. Speculative decoding needs one tokenizer.')


_PACKED: 'collections.OrderedDict[Any, Tuple[list, dict]]' = collections.OrderedDict()
_PACKED_KEEP = 4  # params trees whose decode collections (decode_variables) stay cached


def decode_variables(module, params, mode: Optional[str] = None) -> dict:
  """The variables the decode path applies `module` with: {'params': params}, plus, for a
  network.Transformer on the CPU backend, one more collection made once per params tree,
  cached while it lives and freed with it: its packed decode kernels
  (network.decode_kernels) where the packed matmul is usable in kernel `mode`
  (DecodeConfig.cpu_kernels; None: the default mode; cpu_kernels.enabled), else, for
  tied logits, the token embedding transposed (network.transposed_embedding) for XLA's
  dot. The panels are bfloat16 where bfloat16 holds every weight exactly
  (network.kernels_hold_in_bf16: a model restored from a bfloat16 checkpoint) in modes
  'packed' and 'packed_bf16', else float32. In mode 'packed_bf16' a bfloat16 network's
  (or feature head's) bfloat16 layers get pair panels (cpu_bf16.serves).

  Only concrete values are cached. Called inside an outer trace (generate under jit/pjit,
  as T5X's infer calls the model), the collection is staged into that trace even for
  concrete params, and its values must not outlive it: they are made per call there (with
  float32 panels: a traced weight's values cannot be checked).

  Params spread over more than one device (`_devices_holding`) get neither: packing would
  gather every weight onto each device and each would compute the whole model, so XLA's
  dot (which GSPMD partitions) is used on the params as they are, with one log line.
  """
  variables = {'params': params}
  kind = _decode_collection(module, mode)
  if kind is None:
    return variables
  leaves = jax.tree_util.tree_leaves(params)
  spread = _devices_holding(leaves)
  if spread > 1:
    if kind == cpu_kernels.COLLECTION:
      _log_sharded(spread)
    return variables
  bf16 = kind == cpu_kernels.COLLECTION and cpu_kernels.bf16_panels(mode)
  pairs = (kind == cpu_kernels.COLLECTION  # a network's or head's bfloat16 layers: vdpbf16ps
           and cpu_bf16.serves(mode, module.config.dtype))
  key = (kind, bf16, pairs) + tuple(id(x) for x in leaves)  # depends on the params
  hit = _PACKED.get(key)
  if hit is None or any(ref() is not x for ref, x in zip(hit[0], leaves)):
    make, rest = _MAKE[kind], _without_pair_layers(params) if pairs else params
    if bf16:  # bitwise the same products, half the bytes per call
      # bfloat16 weights hold by their dtype (from shapes alone, known inside a trace too);
      # float32 ones by their values, a tracer inside a trace: float32 panels there
      dtypes = {w.dtype for w in jax.eval_shape(network.packed_weights, rest).values()}
      holds = dtypes == {jnp.dtype(jnp.bfloat16)} or _HOLDS_IN_BF16(rest)
      if not _is_traced(holds) and bool(holds):
        make = _MAKE_BF16
    if pairs and make is _MAKE_BF16:  # float32 layers (bfloat16 values): pairs too
      made = _with_pair_layers({}, params, float32_layers=True)
    else:
      made = make(rest)
      made = _with_pair_layers(made, params) if pairs else made
    if any(_is_traced(x) for x in jax.tree_util.tree_leaves((made, params))):
      return dict(variables, **{kind: made})  # inside a trace
    try:  # an entry goes when its params do: its panels are a second copy of the weights
      refs = [weakref.ref(x, functools.partial(_forget, key)) for x in leaves]
    except TypeError:  # leaves without weak references: made every call
      return dict(variables, **{kind: made})
    hit = _PACKED[key] = (refs, made)
    while len(_PACKED) > _PACKED_KEEP:
      _PACKED.popitem(last=False)
  _PACKED.move_to_end(key)
  return dict(variables, **{kind: hit[1]})


def _forget(key, _dead_ref) -> None:
  """Drops the cached collection of a params tree one of whose weights was freed."""
  _PACKED.pop(key, None)


_MAKE = {cpu_kernels.COLLECTION: jax.jit(network.decode_kernels),
         layers.TRANSPOSED: jax.jit(network.transposed_embedding)}
_MAKE_BF16 = jax.jit(functools.partial(network.decode_kernels, bf16=True))
_HOLDS_IN_BF16 = jax.jit(network.kernels_hold_in_bf16)
_PACK_PAIRS = jax.jit(cpu_bf16.pack_pairs)


def _pair_layers(params, float32_layers: bool = False) -> dict:
  """{flat path: [K, N] weight} of a bfloat16 network's bfloat16 Dense layers: all but the
  float32 `logits_dense` (mode 'packed_bf16', cpu_bf16.py); with `float32_layers` (weights
  bfloat16 holds exactly, bfloat16 inputs: the same products, in pair order) that and the
  tied embedding (transposed) too."""
  flat = traverse_util.flatten_dict(params)
  out = {path: w for path, w in flat.items() if path[-1] == 'kernel' and w.ndim == 2
         and (float32_layers or 'logits_dense' not in path)}
  embedding = flat.get(('token_embedder', 'embedding'))
  if float32_layers and embedding is not None and not any('logits_dense' in p for p in flat):
    out[('token_embedder', 'embedding')] = embedding.T
  return out


def _without_pair_layers(params) -> dict:
  flat, skip = traverse_util.flatten_dict(params), _pair_layers(params)
  return traverse_util.unflatten_dict({p: w for p, w in flat.items() if p not in skip})


def _with_pair_layers(made, params, float32_layers: bool = False) -> dict:
  """The packed collection `made` plus pair panels (_pair_layers)."""
  flat = traverse_util.flatten_dict(made) if made else {}
  flat.update({path: _PACK_PAIRS(w)
               for path, w in _pair_layers(params, float32_layers).items()})
  return traverse_util.unflatten_dict(flat)


def _decode_collection(module, mode: Optional[str]) -> Optional[str]:
  """Which decode-only collection `module` gets on this backend in kernel `mode`
  (decode_variables)."""
  if (not isinstance(module, (network.Transformer, feature_draft.FeatureDraft))
      or jax.default_backend() != 'cpu'):
    return None
  if cpu_kernels.enabled(mode):
    return cpu_kernels.COLLECTION
  tied = isinstance(module, network.Transformer) and module.config.logits_via_embedding
  return layers.TRANSPOSED if tied else None


def _devices_holding(leaves) -> int:
  """How many devices params may be spread over: for concrete leaves, the largest device
  set of a jax.Array's sharding (numpy leaves: 1). Inside a trace the shardings of a
  partitioned program cannot be seen (pjit's in_shardings leave no trace on the tracers),
  so traced params count as spread over every device of the job (`jax.device_count()`):
  on a one-device host they are packed as before; on a multi-device one XLA's dot is kept.
  """
  most = 1
  for x in leaves:
    if _is_traced(x):
      return max(most, jax.device_count())
    sharding = getattr(x, 'sharding', None)
    if sharding is not None:
      most = max(most, len(sharding.device_set))
  return most


@functools.lru_cache(maxsize=None)
def _log_sharded(devices: int) -> None:
  logging.warning('specdec_t5x: params are (or may be) spread over %d devices; the packed '
                  'CPU matmul would gather every weight onto each of them, so decoding '
                  'uses XLA dot.', devices)


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


def decode_program(target_module, draft_module, *, max_len: int, config: DecodeConfig,
                   wrap: Optional[Callable[[str, core.ExtendFn], core.ExtendFn]] = None):
  """The whole generation, not yet jitted: fn(target_vars, draft_vars, encoder_tokens, rng,
  eos_id, prompt=None, sampling=None) -> (tokens, stats). `sampling`: the run-time values
  of the sampling settings (SamplingConfig.values(), float32 [3]) for the switches that
  config.sampling fixes (greedy, top-k, top-p on or off); None: config's own values, as
  constants of the program. `wrap(name, fn)`, if given, replaces the 'target' and 'draft'
  ExtendFns the loops call (e.g. research/loop_profile.py's scopes)."""
  wrap = wrap or (lambda name, fn: fn)

  def run(target_vars, draft_vars, encoder_tokens, rng, eos_id, prompt=None, sampling=None):
    values = config.sampling.values() if sampling is None else sampling
    with cpu_kernels.decode_mode(config.cpu_kernels):  # traced in the config's kernel mode
      return _run(target_vars, draft_vars, encoder_tokens, rng, eos_id, prompt,
                  config.sampling.bind(values))

  def _run(target_vars, draft_vars, encoder_tokens, rng, eos_id, prompt, settings):
    batch = encoder_tokens.shape[0]
    # Every write fits (rows.update_all drops a call's writes for all rows when one row's
    # window does not, and the stats say so; drafting.feature_drafter keeps a finished
    # row's re-feed inside).
    drafted = config.tree_call_nodes if draft_module is not None else 0
    cache_len = core.cache_length(max_len, drafted)  # a tree's nodes beyond the root
    encoded = target_module.apply(target_vars, encoder_tokens, method='encode')
    target_cache = target_module.apply(target_vars, encoded, encoder_tokens, cache_len,
                                       method='init_cache')
    if draft_module is None:
      target_fn = wrap('target', _extend_fn(target_module, target_vars))
      return chain.autoregressive_decode(target_fn, target_cache, rng, batch=batch,
                                         max_len=max_len, config=config, eos_id=eos_id,
                                         prompt=prompt, settings=settings)
    features = reads_features(draft_module)
    extra = (True, draft_module.config.feature_layers) if features else ()
    target_fn = wrap('target', _extend_fn(target_module, target_vars, *extra))
    if features:  # the head cross-attends to the target's encoder output: no encoder
      draft_encoded = encoded
    else:
      draft_encoded = draft_module.apply(draft_vars, encoder_tokens, method='encode')
    draft_cache = draft_module.apply(draft_vars, draft_encoded, encoder_tokens, cache_len,
                                     method='init_cache')
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


def _compiled(target_module, draft_module, *, max_len: int, config: DecodeConfig
              ) -> BoundProgram:
  """The jitted decode program for these models and settings. The temperature and top-p
  mass are its run-time arguments: the program is keyed on what shapes it (program_key),
  so that every temperature and top-p shares one."""
  values = config.sampling.values()
  if draft_module is None:  # only the sampling settings matter: one program for all others
    config = DecodeConfig.from_sampling(config.sampling, gamma=1,
                                        cpu_kernels=config.cpu_kernels)
  config = config.program_key()
  key = (_module_key(target_module), draft_module and _module_key(draft_module),
         max_len, config)
  return BoundProgram(memoized_program(_COMPILED, key, lambda: jax.jit(decode_program(
      target_module, draft_module, max_len=max_len, config=config))), values)


_is_traced = checks.is_traced


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
  vocab = feature_draft.vocabulary(draft_module.config) if reads_features(draft_module) else None
  why = checks.draft_tree(config, reads_features(draft_module), draft is not None,
                          isinstance(draft_module, network.Transformer),
                          None if vocab is None else len(vocab.ids))
  if why:
    raise ValueError(why)
  rng = jax.random.PRNGKey(0) if rng is None else rng
  fn = _compiled(target_module, draft_module, max_len=int(max_decode_length), config=config)
  mode = config.cpu_kernels
  draft_vars = None if draft_module is None else decode_variables(draft_module, draft_params,
                                                                  mode)
  prompt = None if decoder_prompt is None else checks.decoder_prompt(decoder_prompt, tokens.shape[0],
                                                             int(max_decode_length))
  out_tokens, stats = fn(decode_variables(target_module, target_params, mode), draft_vars,
                         tokens, rng, jnp.int32(eos_id), prompt)
  checks.cache_writes(stats)
  checks.finite(stats)
  return GenerateOutput(out_tokens, stats)
