"""The paper's Table 2 predicted from the compiled programs (scripts/compiled_report.py).

No accelerator is needed and no weight is allocated: every T5 v1.1 size is traced from
abstract shapes (`jax.eval_shape`, `jax.ShapeDtypeStruct`, bfloat16 params as T5X's infer
restores them) and compiled by XLA for 1 device and for n-way model parallelism over fake
host devices (a ('data' 1, 'model' n) mesh, params partitioned by the network's
`params_axes` under T5X's standard logical axis rules, as T5X's
`PjitPartitioner(num_partitions=n)` does). XLA's dot path only (the packed CPU matmul is
never added: `decode_variables` is not called). The programs are the decode path's own:

* prefill: encode + init_cache over the input (once per sequence and model);
* step k: one cached decoder call over k positions (`extend`, cache donated): k = 1 is a
  target or draft step, k = gamma + 1 the target's verification of a speculative step;
* tree k: the same call over a draft tree of k nodes (`extend(..., tree=parents)`, the
  parents an argument: one program for every tree shape), the target's verification of a
  tree step (research/predict/compiled_trees.py).

Per program it records `lowered.cost_analysis()` (the HLO as JAX emits it, before any
backend pass: the whole program's flops and bytes), `compiled.cost_analysis()` and
`compiled.memory_analysis()` (per device, after partitioning, as XLA:CPU compiled it) and
the collectives of the compiled HLO.

Which numbers drive the roofline: XLA:CPU computes bfloat16 dots in float32, so its
compiled programs convert every bfloat16 weight to a float32 temporary first; its 'bytes
accessed' (~5x the weights of an XXL step) and temp sizes describe the CPU, not an
accelerator that reads bfloat16 weights directly. So per device:
* bytes = what the program must move at least: its arguments read once and its outputs
  (less those aliased to donated arguments, the cache) written once, from the compiled
  program's memory analysis (exact shard sizes, whatever the backend): the traffic of a
  perfectly fused program, e.g. an XLA:TPU or XLA:GPU step at batch 1 reading its weights;
* bytes_unfused = the lowered (backend-independent, before fusion) 'bytes accessed', an
  upper bound that counts every intermediate, e.g. float32 logits weights converted apart;
* flops = lowered flops; for n devices both lowered figures are scaled by the share of
  them one device does in the partitioned compile, compiled(n) / compiled(1) (both by
  XLA:CPU, so its float32 copies cancel).
A call's roofline time on a chip is max(flops / peak flops, bytes / HBM bandwidth); the
predicted speedups use `bytes`, and `*_unfused` the upper bound. Collectives (n > 1) and
per-kernel launch latency are not in it, so it is kindest to small drafts.

Memory per device is exact for what stays resident during a speculative decode: both
models' params and both caches (shard shapes: params by their axes, caches split by heads), at the
paper's lengths and batch 1 and 32. Temporaries are not predicted (XLA:CPU's are its
float32 weight copies); `headroom` is what remains of the chip's memory for them.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from flax import traverse_util
from flax.linen import partitioning as nn_partitioning
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from specdec_t5x.algorithm import network, theory
from specdec_t5x.algorithm.cpu import modes
from specdec_t5x.integration import partitioning
from specdec_t5x.research.predict import compiled_trees, paper


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  flops: float  # peak dense bfloat16 FLOP/s per chip
  hbm_bytes_per_s: float  # HBM bandwidth per chip
  hbm_bytes: float  # HBM capacity per chip
  source: str


CHIPS: Tuple[Chip, ...] = (
    Chip('TPU v4', 275e12, 1.2e12, 32 * 2 ** 30,
         'Google Cloud TPU v4 system architecture (cloud.google.com/tpu/docs/v4): per chip '
         '275 TFLOP/s peak bf16, 32 GiB HBM2 at 1,200 GB/s.'),
    Chip('H200', 989e12, 4.8e12, 141e9,
         'NVIDIA H200 Tensor Core GPU datasheet (SXM): 989 TFLOP/s dense BF16 (1,979 with '
         'sparsity), 141 GB HBM3e at 4.8 TB/s.'),
)

# The paper's lengths: configs/runs/paper_{ende,cnndm}.gin, TASK_FEATURE_LENGTHS.
INPUT_LEN, TARGET_LEN = 512, 256
SIZES = ('small', 'base', 'large', 'xxl')  # the paper's drafts and its target
BATCHES = (1, 32)  # memory is reported at these batch sizes; costs at batch 1
# --tiny: every size at a CPU-sized shape (emb, heads, layers, mlp), head_dim 8, vocab 128;
# heads x head_dim, mlp and vocab divisible by 8, so 8-way partitioning splits them all.
TINY_SIZES = {'small': (16, 2, 1, 32), 'base': (24, 2, 1, 48), 'large': (32, 4, 1, 64),
              'xxl': (48, 8, 2, 96)}
TINY_LENGTHS = (16, 8)
_COLLECTIVES = ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all',
                'collective-permute')


def configs(tiny: bool = False) -> Dict[str, network.T5Config]:
  """size -> the T5 v1.1 config in bfloat16 (tiny: TINY_SIZES shapes)."""
  out = {}
  for size in SIZES:
    kw: Dict[str, Any] = dict(dtype=jnp.bfloat16)
    if tiny:
      emb, heads, layers, mlp = TINY_SIZES[size]
      kw.update(vocab_size=128, emb_dim=emb, num_heads=heads, num_encoder_layers=layers,
                num_decoder_layers=layers, mlp_dim=mlp, head_dim=8)
    out[size] = network.t5_1_1_config(size, **kw)
  return out


def abstract_params(module: network.Transformer) -> Tuple[Any, Any]:
  """(params as bfloat16 ShapeDtypeStructs, each param's logical axes): no weights made."""
  dummy = jax.ShapeDtypeStruct((1, 4), jnp.int32)
  variables = jax.eval_shape(module.init, jax.random.PRNGKey(0), dummy, dummy)
  params = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, jnp.bfloat16),
                                  variables['params'])
  return params, nn_partitioning.get_axis_names(variables['params_axes'])


def host_mesh(num_partitions: int) -> Mesh:
  """('data' 1, 'model' n) over the first n CPU devices (XLA's host platform)."""
  devices = jax.devices('cpu')
  if len(devices) < num_partitions:
    raise RuntimeError(
        f'{num_partitions}-way partitioning needs {num_partitions} host devices, found '
        f'{len(devices)}: set XLA_FLAGS=--xla_force_host_platform_device_count='
        f'{num_partitions} before JAX starts (scripts/compiled_report.py does).')
  return partitioning.grid_mesh(devices[:num_partitions], num_partitions)


def param_shardings(params: Any, axes: Any, mesh: Mesh) -> Any:
  """Each param's NamedSharding: its logical axes through T5X's standard rules (a mesh
  axis that does not divide a dimension leaves it replicated)."""
  rules = partitioning.standard_logical_axis_rules()
  flat_axes = traverse_util.flatten_dict(axes)
  flat = traverse_util.flatten_dict(params)
  specs = {path: partitioning.logical_to_mesh_spec(
      tuple(flat_axes[path]), rules, leaf.shape, dict(mesh.shape))
           for path, leaf in flat.items()}
  return traverse_util.unflatten_dict(
      {path: NamedSharding(mesh, spec) for path, spec in specs.items()})


def cache_shardings(cache: Any, mesh: Mesh) -> Any:
  """The decode cache split by heads, as T5X's rules split attention (batch -> 'data',
  heads -> 'model'; replicated where 'model' does not divide the heads): every 4-D leaf is
  [batch, heads, ...]; the encoder mask is [batch, enc]; the scalar flag of dropped writes
  (rows.SKIPPED) is replicated."""
  rules, shape = partitioning.standard_logical_axis_rules(), dict(mesh.shape)

  def spec(x):
    if x.ndim == 0:
      return NamedSharding(mesh, PartitionSpec())
    axes = ('batch', 'heads') + (None,) * (x.ndim - 2) if x.ndim == 4 else \
        ('batch',) + (None,) * (x.ndim - 1)
    return NamedSharding(mesh, partitioning.logical_to_mesh_spec(axes, rules, x.shape, shape))
  return jax.tree_util.tree_map(spec, cache)


def per_device_bytes(shapes: Any, shardings: Any) -> int:
  """Bytes one device holds of `shapes` (ShapeDtypeStructs) placed by `shardings`."""
  return int(sum(np.prod(s.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
                 for x, s in zip(jax.tree_util.tree_leaves(shapes),
                                 jax.tree_util.tree_leaves(shardings))))


def _costs(analysis) -> Dict[str, float]:
  if isinstance(analysis, (list, tuple)):  # older JAX: one dict per device program
    analysis = analysis[0]
  analysis = analysis or {}
  return {'flops': float(analysis.get('flops', 0.0)),
          'bytes': float(analysis.get('bytes accessed', 0.0))}


def _memory(compiled) -> Dict[str, int]:
  stats = compiled.memory_analysis()
  return {name: int(getattr(stats, f'{name}_size_in_bytes', 0) or 0)
          for name in ('argument', 'output', 'alias', 'temp')}


def _collectives(hlo: str) -> Dict[str, int]:
  return {op: len(re.findall(rf'\s{op}(?:-start)?\(', hlo)) for op in _COLLECTIVES}


def _record(lowered) -> Dict[str, Any]:
  """A lowered program's costs before and after XLA compiles it, its memory, its collectives."""
  compiled = lowered.compile()
  return {'lowered': _costs(lowered.cost_analysis()), 'compiled': _costs(compiled.cost_analysis()),
          'memory': _memory(compiled), 'collectives': _collectives(compiled.as_text())}


def compile_model(cfg: network.T5Config, mesh: Mesh, ks: Sequence[int], enc_len: int,
                  cache_len: int, cache_lens: Sequence[int] = (), batches: Sequence[int] = (),
                  tree_ks: Sequence[int] = ()) -> Dict[str, Any]:
  """One model's programs on `mesh` at batch 1: prefill, a step over each k in `ks` and a
  tree call over each k in `tree_ks`.

  Returns {'programs': {'prefill' | 'step_<k>' | 'tree_<k>': record}, 'param_bytes': per device,
  'cache_bytes': {batch: {cache_len: per device}} for `batches` x `cache_lens` (the cache
  placed by `cache_shardings`)}.
  """
  module = network.Transformer(cfg)
  params, axes = abstract_params(module)
  p_sh = param_shardings(params, axes, mesh)
  replicated = NamedSharding(mesh, PartitionSpec())
  enc = jax.ShapeDtypeStruct((1, enc_len), jnp.int32)

  def prefill(p, e):
    encoded = module.apply({'params': p}, e, method='encode')
    return module.apply({'params': p}, encoded, e, cache_len, method='init_cache')

  def step(p, cache, tokens, positions, parents=None):
    return module.apply({'params': p}, cache, tokens, positions, tree=parents, method='extend')

  with modes.accelerator_forms():  # an accelerator's program, though lowered on CPU
    cache = jax.eval_shape(prefill, params, enc)
    cache_sh = cache_shardings(cache, mesh)
    programs: Dict[str, Any] = {}
    programs['prefill'] = _record(jax.jit(
        prefill, in_shardings=(p_sh, replicated), out_shardings=cache_sh).lower(params, enc))
    positions = jax.ShapeDtypeStruct((1,), jnp.int32)
    for name, k in [('step', k) for k in ks] + [('tree', k) for k in tree_ks]:
      tokens = jax.ShapeDtypeStruct((1, k), jnp.int32)
      tree = (tokens,) if name == 'tree' else ()  # the parents [1, k], as the tokens
      fn = jax.jit(step, in_shardings=(p_sh, cache_sh, replicated, replicated) + (
          replicated,) * len(tree), out_shardings=(None, cache_sh), donate_argnums=1)
      programs[f'{name}_{k}'] = _record(fn.lower(params, cache, tokens, positions, *tree))
  cache_bytes = {}
  for batch in batches:
    e = jax.ShapeDtypeStruct((batch, enc_len), jnp.int32)
    encoded = jax.ShapeDtypeStruct((batch, enc_len, cfg.emb_dim), cfg.dtype)
    cache_bytes[batch] = {}
    for length in cache_lens:
      shapes = jax.eval_shape(lambda p, x, e, n=length: module.apply(
          {'params': p}, x, e, n, method='init_cache'), params, encoded, e)
      cache_bytes[batch][length] = per_device_bytes(shapes, cache_shardings(shapes, mesh))
  return {'programs': programs, 'param_bytes': per_device_bytes(params, p_sh),
          'num_params': int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params))),
          'cache_bytes': cache_bytes}


def per_device(programs_n: Mapping[str, Any], programs_1: Mapping[str, Any]) -> Dict[str, Any]:
  """Per-device flops and bytes of each program (module doc): flops = lowered x compiled
  share; bytes = what the program must move (arguments read once, outputs not aliased to
  them written once); bytes_unfused = lowered bytes accessed x compiled share."""
  out = {}
  for name, rec in programs_n.items():
    one = programs_1[name]['compiled']
    share = {key: rec['compiled'][key] / one[key] if one[key] else 1.0
             for key in ('flops', 'bytes')}
    mem = rec['memory']
    out[name] = {'flops': rec['lowered']['flops'] * share['flops'],
                 'bytes': mem['argument'] + mem['output'] - mem['alias'],
                 'bytes_unfused': rec['lowered']['bytes'] * share['bytes'], 'share': share}
  return out


def roofline_s(flops: float, nbytes: float, chip: Chip) -> float:
  """Seconds of one call on `chip`: the slower of its compute and its HBM traffic."""
  return max(flops / chip.flops, nbytes / chip.hbm_bytes_per_s)


def predict(models: Mapping[int, Mapping[str, Any]], target: str = paper.TARGET,
            target_len: int = TARGET_LEN) -> Dict[str, Any]:
  """From compile_model results {num_partitions: {size: result}}: per-device costs, call
  times on each chip, the paper pairs' c and t_verify / t_step, Table 2's rows predicted
  from the paper's alpha, and per-row memory."""
  parts = sorted(models)
  costs = {n: {size: per_device(r['programs'], models[1][size]['programs'])
               for size, r in models[n].items()} for n in parts}
  def seconds(key):
    return {n: {chip.name: {size: {name: roofline_s(c['flops'], c[key], chip)
                                   for name, c in progs.items()}
                            for size, progs in costs[n].items()} for chip in CHIPS}
            for n in parts}
  times, unfused = seconds('bytes'), seconds('bytes_unfused')
  rows, memory = [], []
  for row in paper.TABLE_2:
    base = {'task': row.task, 'draft': row.draft, 'temperature': row.temperature,
            'gamma': row.gamma, 'alpha_paper': row.alpha, 'speedup_paper': row.speedup}
    pred = {}
    for n in parts:
      for chip in CHIPS:
        pred[f'{chip.name} x{n}'] = entry = {}
        for suffix, t in (('', times[n][chip.name]), ('_unfused', unfused[n][chip.name])):
          t_t, t_d = t[target]['step_1'], t[row.draft]['step_1']
          t_v = t[target][f'step_{row.gamma + 1}']
          entry.update({f'c{suffix}': t_d / t_t, f'verify_ratio{suffix}': t_v / t_t,
                        f'speedup{suffix}': float(theory.walltime_improvement_measured(
                            row.alpha, row.gamma, t_d, t_t, t_v))})
    rows.append(dict(base, predicted=pred))
    mem = {}
    cache_len = target_len + row.gamma + 1
    for n in parts:
      for batch in sorted(models[n][target]['cache_bytes']):
        resident = sum(models[n][size]['param_bytes'] +
                       models[n][size]['cache_bytes'][batch][cache_len]
                       for size in (target, row.draft))
        mem[f'x{n} b{batch}'] = {
            'resident_bytes': resident,
            'fits': {chip.name: resident <= chip.hbm_bytes for chip in CHIPS},
            'headroom_bytes': {chip.name: chip.hbm_bytes - resident for chip in CHIPS}}
    memory.append(dict(base, cache_len=cache_len, per_device=mem))
  return {'per_device_costs': costs, 'call_seconds': times, 'call_seconds_unfused': unfused,
          'table2': rows, 'memory': memory}


def run(tiny: bool = False, num_partitions: Sequence[int] = (1, 8),
        trees: Optional[Sequence[Mapping[str, Any]]] = None) -> Dict[str, Any]:
  """Compiles every size for each partition count (1 among them: the per-device shares
  are relative to it) and predicts; returns the report's data. `trees`
  (compiled_trees.load: tree results files): the target's calls their decodes verify and
  the draft's calls of their dynamic trees are compiled too, and their rows predicted
  (data['trees'], one entry per file)."""
  if 1 not in num_partitions:
    raise ValueError(f'num_partitions must include 1, got {num_partitions}.')
  enc_len, target_len = TINY_LENGTHS if tiny else (INPUT_LEN, TARGET_LEN)
  gammas = sorted({row.gamma for row in paper.TABLE_2})
  cache_lens = [target_len + g + 1 for g in gammas]
  sizes = compiled_trees.call_sizes([r for t in trees or () for r in t['rows']])
  chain_ks, tree_ks = sizes['target']
  draft_ks, draft_tree_ks = sizes['draft']
  target_ks = sorted({1, *chain_ks, *(g + 1 for g in gammas)})
  calls = {paper.TARGET: (target_ks, tree_ks),  # (step sizes, tree sizes) per model
           compiled_trees.DRAFT: (sorted({1, *draft_ks}), draft_tree_ks)}
  # the programs' cache: the paper's longest, or longer for a call of more tokens (--tiny's
  # 8 target tokens are fewer than a large tree's nodes)
  cache_len = max(max(cache_lens), *target_ks, *tree_ks, *draft_ks, *draft_tree_ks)
  cfgs = configs(tiny)
  models: Dict[int, Dict[str, Any]] = {}
  for n in num_partitions:
    mesh = host_mesh(n)
    models[n] = {}
    for size, cfg in cfgs.items():
      ks, trees_ks = calls.get(size, ([1], ()))
      models[n][size] = compile_model(cfg, mesh, ks, enc_len, cache_len, cache_lens,
                                      BATCHES, trees_ks)
  out = {'lengths': {'input': enc_len, 'target': target_len, 'cache': cache_len},
         'chips': [dataclasses.asdict(c) for c in CHIPS],
         'configs': {size: str(cfg) for size, cfg in cfgs.items()},
         'models': {str(n): m for n, m in models.items()}}
  out.update(predict(models, target_len=target_len))
  if trees:
    out['trees'] = [dict(t, rows=compiled_trees.predict(out['call_seconds'], t['rows']))
                    for t in trees]
  return json.loads(json.dumps(out))  # exactly what the JSON file holds (string keys)
