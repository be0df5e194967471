"""What mode 'packed_bf16''s vdpbf16ps kernel costs against the existing ones, per decode call.

  python -c "from specdec_t5x.research import bf16_kernel_bench as b; print(b.table())"

Takes nothing (random weights of the demo target's decoder Dense shapes: configs/demo.gin,
emb 384, 6 x 64 heads, mlp 768, 4 decoder layers); prints the cost of one decoder pass's
products (per layer: self-attention q, k, v, out; cross-attention q, out; MLP wi_0, wi_1,
wo -- the cross keys / values are computed once, at init_cache) at 1, 2, 4, 8 rows, and
of the tied logits [384, 8192], for: XLA's bfloat16 dot (what a bfloat16 model runs in mode
'packed'), the packed kernel on bfloat16 panels (widened to float32, FMA), and the
vdpbf16ps kernel on pair panels. Indicative: one process's medians on a shared CPU.
"""

from __future__ import annotations

import time
from typing import Dict, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import cpu_bf16, cpu_kernels

EMB, INNER, MLP, LAYERS, VOCAB = 384, 384, 768, 4, 8192


def _layer_shapes():
  return [('q', EMB, INNER), ('k', EMB, INNER), ('v', EMB, INNER), ('o', INNER, EMB),
          ('cq', EMB, INNER), ('co', INNER, EMB), ('wi0', EMB, MLP), ('wi1', EMB, MLP),
          ('wo', MLP, EMB)]


def _weights(seed: int = 0):
  rng = np.random.default_rng(seed)
  return [{name: jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), jnp.float32)
           .astype(jnp.bfloat16).astype(jnp.float32) for name, k, n in _layer_shapes()}
          for _ in range(LAYERS)]


def _decoder_pass(product):
  """One decoder pass's products, each on the last one's output (so they run in order)."""
  def run(x, layers):
    for w in layers:
      for name in ('q', 'k', 'v', 'o', 'cq', 'co'):
        x = product(x, w[name], INNER if name != 'o' and name != 'co' else EMB)
      h = product(x, w['wi0'], MLP) * product(x, w['wi1'], MLP)
      x = product(h, w['wo'], EMB)
    return x
  return jax.jit(run)


def _forms():
  """name -> (product(x, weight, features) -> bfloat16, how a weight is stored)."""
  return {
      'xla_bf16_dot': (lambda x, w, n: jnp.dot(x.astype(jnp.bfloat16), w),
                       lambda w: w.astype(jnp.bfloat16)),
      'packed_bf16_panels': (lambda x, w, n: cpu_kernels.matmul(x, w, n).astype(jnp.bfloat16),
                             lambda w: cpu_kernels.pack(w, bf16=True)),
      'vdpbf16ps_pairs': (lambda x, w, n: cpu_bf16.matmul(x, w, n).astype(jnp.bfloat16),
                          cpu_bf16.pack_pairs),
  }


def _median_us(fn, args, calls: int) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(calls):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return float(np.median(times)) * 1e6


def costs(rows: Sequence[int] = (1, 2, 4, 8), calls: int = 200, rounds: int = 3
          ) -> Dict[str, Dict[str, Dict[int, float]]]:
  """{'decoder' | 'logits': {form: {rows: us per call}}}: the least of `rounds` medians of
  `calls` calls, the forms interleaved round by round."""
  weights = _weights()
  rng = np.random.default_rng(1)
  table = rng.standard_normal((EMB, VOCAB)).astype(np.float32) / np.sqrt(EMB)
  table = jnp.asarray(table).astype(jnp.bfloat16).astype(jnp.float32)
  out: Dict[str, Dict[str, Dict[int, float]]] = {'decoder': {}, 'logits': {}}
  runs = []
  for name, (product, store) in _forms().items():
    stored = jax.tree_util.tree_map(store, weights)
    logits = jax.jit(lambda x, w, product=product: product(x, w, VOCAB))
    runs.append((name, _decoder_pass(product), stored, logits, store(table)))
  for _ in range(rounds):
    for m in rows:
      x = jnp.asarray(rng.standard_normal((m, EMB)), jnp.bfloat16)
      for name, decoder, stored, logits, table_stored in runs:
        for part, fn, args in (('decoder', decoder, (x, stored)),
                               ('logits', logits, (x, table_stored))):
          t = _median_us(fn, args, calls)
          cell = out[part].setdefault(name, {})
          cell[m] = min(cell.get(m, np.inf), t)
  return out


def table(**kwargs) -> str:
  """costs() as a Markdown table (us per call)."""
  res = costs(**kwargs)
  lines = []
  for part, forms in res.items():
    rows = sorted(next(iter(forms.values())))
    lines += [f'\n{part} (us per call)', '| form | ' + ' | '.join(f'{m} rows' for m in rows) + ' |',
              '|---|' + '---|' * len(rows)]
    lines += [f'| {name} | ' + ' | '.join(f'{v[m]:.0f}' for m in rows) + ' |'
              for name, v in forms.items()]
  return '\n'.join(lines)
