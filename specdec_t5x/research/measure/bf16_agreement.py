"""What holds exactly in bfloat16: our T5 vs stock T5X, and greedy speculative vs greedy AR.

  python scripts/compare_decodes.py --experiment=bf16_agreement             # ~minutes
  python scripts/compare_decodes.py --experiment=bf16_agreement --diagnose  # ~1 min
  python scripts/compare_decodes.py --experiment=bf16_agreement --time      # + AR timings

Takes the demo family (checkpoints/demo: target demo_target/checkpoint_2239, draft
demo_draft_m/checkpoint_5682; sizes from their config.json, as configs/demo_draft_m.gin) and the
committed EN-DE test sample (data/demo/ende_test.tsv, inputs padded to 128, at most 64
decoded tokens: configs/demo.gin's TASK_FEATURE_LENGTHS). Real T5X must be installed.
Params are cast to the network dtype, as t5x.infer restores them (CHECKPOINT_DTYPE).
Measures, per dtype (bfloat16, float32) and for bfloat16 also in kernel mode 'packed_bf16':

1. teacher-forced logits of our network vs T5X's network (t5x/examples/t5/network.py) on
   the test references: max |difference| and argmax agreement;
2. greedy autoregressive decoding, ours (`api.generate`) vs stock T5X
   (`t5x.models.EncoderDecoderModel` + `t5x.decoding.temperature_sample`, temperature 0):
   rows identical (EOS-terminated token lists);
3. greedy speculative decoding (each --gammas) vs our greedy autoregressive decoding:
   rows identical, and target calls.

With --diagnose it instead finds where a (gamma + 1)-token call (speculative verification)
first differs in bits from gamma + 1 one-token calls (autoregressive decoding) on the same
cache and tokens, module by module in call order, and writes
results/bf16_agreement_diagnosis.{json,md}.

With --time it also times our autoregressive decode in each dtype (batch 1, the median of
--repeats interleaved runs, harness.interleaved): run it on an idle machine only.
Writes results/bf16_agreement.json and results/bf16_agreement.md.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import api, batching, network
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.integration import model_dir
from specdec_t5x.research.measure import (batched, evaluation, forcing, measurement,
                                          t5x_reference)
from specdec_t5x.research.results import harness

TARGET = 'demo_target/checkpoint_2239'
DRAFT = 'demo_draft_m/checkpoint_5682'
INPUT_LEN, MAX_LEN = 128, 64  # configs/demo.gin's TASK_FEATURE_LENGTHS
DTYPES = ('bfloat16', 'float32')
# The columns: (name, dtype, DecodeConfig.cpu_kernels mode of our decodes). 'packed' runs a
# bfloat16 network's bfloat16 layers and attention on XLA's ops; 'packed_bf16' on this
# project's bfloat16 kernels (rows independent, not XLA's summation order).
COLUMNS = (('bfloat16', 'bfloat16', 'packed'),
           ('bfloat16_packed_bf16', 'bfloat16', 'packed_bf16'),
           ('float32', 'float32', 'packed'))


def load(path: str, dtype: str, float32_attention_logits: bool = False):
  """(our Transformer, params cast to dtype) of checkpoints/demo/<model>/checkpoint_<step>
  (model_dir.load: its config.json and its one checkpoint)."""
  config, params = model_dir.load(os.path.join(evaluation.DEMO_DIR, os.path.dirname(path)),
                                  dtype)
  config = dataclasses.replace(config, float32_attention_logits=float32_attention_logits)
  params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype), params)
  return network.Transformer(config), params


def t5x_module(ours: network.Transformer):
  """T5X's Transformer with our module's config (same fields, same params tree)."""
  from t5x.examples.t5 import network as t5x_network  # pylint: disable=g-import-not-at-top
  return t5x_network.Transformer(t5x_reference.t5x_config(ours.config))


def cut(tokens: np.ndarray, eos_id: int = 1) -> List[int]:
  """Tokens up to and including the first EOS (all of them without one)."""
  t = [int(x) for x in tokens]
  return t[:t.index(eos_id) + 1] if eos_id in t else t


def teacher_forced(target, t5x_net, enc: np.ndarray, targets: np.ndarray, batch: int) -> Dict:
  """Our vs T5X's network logits on the references: max |diff|, argmax agreement."""
  module, params = target
  theirs = jax.jit(lambda p, e, d, t: t5x_net.apply({'params': p}, e, d, t,
                                                   enable_dropout=False))
  max_diff, agree, total, equal = 0.0, 0, 0, True
  for e, t in zip(batched.split(enc, batch, trim=False), batched.split(targets, batch,
                                                                         trim=False)):
    e, t, n = e.rows, t.rows, e.n
    a = np.asarray(forcing.jitted_logits(module, params, e, t, t))[:n]
    b = np.asarray(theirs(params, e, forcing.shift_right(t), t))[:n]
    valid = t[:n] > 0
    max_diff = max(max_diff, float(np.abs(a - b)[valid].max()))
    agree += int((a.argmax(-1) == b.argmax(-1))[valid].sum())
    total += int(valid.sum())
    equal &= bool(np.array_equal(a[valid], b[valid]))
  return {'bitwise_equal': equal, 'max_abs_diff': max_diff, 'argmax_agreement': agree / total,
          'tokens': total}


def t5x_greedy(target, enc: np.ndarray, batch: int) -> List[List[int]]:
  """Stock T5X greedy (t5x_reference: EncoderDecoderModel + temperature_sample at 0)."""
  predict = t5x_reference.greedy_decoder(target[0].config, MAX_LEN)
  out = []
  for b in batched.split(enc, batch, trim=False):
    out += [cut(r) for r in np.asarray(predict(target[1], jnp.asarray(b.rows)))[:b.n]]
  return out


def our_greedy(target, enc: np.ndarray, batch: int, draft=None, gamma: int = 1,
               mode: str = 'packed'):
  """Our greedy decode in kernel `mode` (speculative with a draft): (rows, target calls)."""
  out, calls = [], 0
  for b, o in batched.decode(target, batched.split(enc, batch, trim=False), MAX_LEN,
                             draft=draft, config=DecodeConfig(gamma=gamma, cpu_kernels=mode)):
    out += [cut(r) for r in np.asarray(o.tokens)[:b.n]]
    calls += int(np.asarray(o.stats['target_calls'])[:b.n].sum())
  return out, calls


def same(a: Sequence[List[int]], b: Sequence[List[int]]) -> Dict[str, Any]:
  diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
  return {'identical_rows': len(a) - len(diff), 'rows': len(a), 'differing_rows': diff}


def first_divergence(a: List[int], b: List[int]) -> int:
  return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def time_ar(enc: np.ndarray, repeats: int) -> Dict[str, float]:
  """Median seconds of our batch-1 greedy AR decode of one input, per column (interleaved)."""
  fns, targets = {}, {dtype: load(TARGET, dtype) for dtype in DTYPES}
  for name, dtype, mode in COLUMNS:
    fns[name] = (lambda t, m: lambda: api.generate(t, enc[:1], max_decode_length=MAX_LEN,
                                                   cpu_kernels=m))(targets[dtype], mode)
  return harness.interleaved(fns, repeats).median


def diagnose(dtype: str, enc: np.ndarray, refs: np.ndarray, k: int) -> Dict[str, Any]:
  """Bitwise differences, per module output in call order, between one k-token extend call
  and k one-token calls on the same cache and reference tokens (positions 0..k-1)."""
  from flax import traverse_util  # pylint: disable=g-import-not-at-top
  module, params = load(TARGET, dtype)
  dec = forcing.shift_right(refs)
  encoded = module.apply({'params': params}, enc, method='encode')
  cache = module.apply({'params': params}, encoded, enc, MAX_LEN + 8, method='init_cache')
  def step(c, start, num):  # -> (logits, cache, {module path: captured outputs})
    (logits, c), state = module.apply(
        {'params': params}, c, jnp.asarray(dec[:, start:start + num]),
        jnp.full((len(enc),), start, jnp.int32), method='extend',
        capture_intermediates=lambda *_: True, mutable=['intermediates'])
    return logits, c, traverse_util.flatten_dict(state['intermediates'])
  many, _, many_inter = step(cache, 0, k)
  singles, inters, c = [], [], cache
  for i in range(k):  # each one-token call sees the cache its predecessors wrote
    logits, c, inter = step(c, i, 1)
    singles.append(logits)
    inters.append(inter)
  rows = []
  for path, (value, *_) in many_inter.items():
    parts = [inter.get(path, (None,))[0] for inter in inters]
    if (not hasattr(value, 'ndim') or value.ndim < 3 or value.shape[1] != k
        or any(getattr(x, 'shape', (0, 0))[1:2] != (1,) for x in parts)):
      continue  # only [batch, tokens, ...] outputs line up token by token
    joined = np.concatenate([np.asarray(x, np.float32) for x in parts], 1)
    differing = int((joined != np.asarray(value, np.float32)).sum())
    rows.append({'module': '/'.join(path), 'differing': differing, 'size': int(value.size)})
  first = next((r for r in rows if r['differing']), None)
  logits_equal = bool(np.array_equal(np.concatenate(singles, 1), many))
  return {'dtype': dtype, 'tokens_per_call': k, 'rows': len(enc), 'logits_equal': logits_equal,
          'first_differing_module': first, 'modules': rows}


def rows(num: int) -> Tuple[np.ndarray, np.ndarray]:
  """(encoder inputs, references) of the first `num` EN-DE test rows, padded as
  configs/demo.gin's TASK_FEATURE_LENGTHS."""
  examples = evaluation.load_examples('ende', num, max_input_len=INPUT_LEN)
  return (batching.pad_batch([e.inputs for e in examples], INPUT_LEN, INPUT_LEN),
          batching.pad_batch([e.targets[:MAX_LEN] for e in examples], MAX_LEN, MAX_LEN))


def measure(args, script: str) -> Dict[str, Any]:
  enc, refs = rows(args.num_examples)
  gammas = [int(g) for g in args.gammas.split(',')]
  result: Dict[str, Any] = {}
  per_dtype: Dict[str, tuple] = {}  # what depends on the dtype only, not the kernel mode
  for name, dtype, mode in COLUMNS:
    if dtype not in per_dtype:
      target = load(TARGET, dtype, args.float32_attention_logits)
      per_dtype[dtype] = (target, load(DRAFT, dtype, args.float32_attention_logits),
                          teacher_forced(target, t5x_module(target[0]), enc, refs,
                                         args.batch_size),
                          t5x_greedy(target, enc, args.batch_size))
    target, draft, forced, t5x = per_dtype[dtype]
    cell: Dict[str, Any] = {'teacher_forced_vs_t5x': forced}
    ar, ar_calls = our_greedy(target, enc, args.batch_size, mode=mode)
    cell['ar_vs_t5x'] = same(ar, t5x)
    cell['ar_target_calls'] = ar_calls
    cell['speculative_vs_ar'] = {}
    for g in gammas:
      spec, calls = our_greedy(target, enc, args.batch_size, draft=draft, gamma=g, mode=mode)
      s = same(spec, ar)
      s['first_divergence'] = [first_divergence(spec[i], ar[i]) for i in s['differing_rows']]
      s['target_calls'] = calls
      cell['speculative_vs_ar'][str(g)] = s
      print(f'{name} gamma {g}: {s["identical_rows"]}/{s["rows"]}', file=sys.stderr)
    cell['ar_rows'] = ar
    result[name] = cell
  result['ar_bf16_vs_ar_f32'] = same(result['bfloat16']['ar_rows'], result['float32']['ar_rows'])
  if args.time:
    result['ar_seconds_per_input'] = time_ar(enc, args.repeats)
  return result


def render(report: harness.Report) -> List[str]:
  r, args = report.data, report['args']
  lines = report.header(
      'bfloat16 vs float32: what holds exactly (demo family, EN-DE test sample)',
      f"{args['num_examples']} inputs (padded to {INPUT_LEN}), greedy, at most {MAX_LEN} "
      f"tokens, batch {args['batch_size']}; target {TARGET}, draft {DRAFT}; params cast to "
      f"the dtype; float32_attention_logits={args['float32_attention_logits']}. Columns: dtype "
      "(_ the kernel mode of our decodes, DecodeConfig.cpu_kernels, when not 'packed': "
      "'packed' leaves a bfloat16 network's layers and attention to XLA's ops, 'packed_bf16' "
      "runs them on this project's bfloat16 kernels, whose rows are independent). The T5X "
      "network's logits are teacher-forced, without kernels, in every column.")
  names = [c[0] for c in COLUMNS if c[0] in r]
  tf = {d: r[d]['teacher_forced_vs_t5x'] for d in names}
  fmt = lambda s: f"{s['identical_rows']}/{s['rows']}"
  cells = [['teacher-forced logits == T5X network (bitwise)'] + [
      f"{tf[d]['bitwise_equal']} (max diff {tf[d]['max_abs_diff']:.3g}, "
      f"argmax {100 * tf[d]['argmax_agreement']:.2f}% of {tf[d]['tokens']})" for d in names]]
  cells.append(['greedy AR rows == stock T5X temperature_sample'] +
               [fmt(r[d]['ar_vs_t5x']) for d in names])
  cells += [[f'greedy speculative (gamma {g}) rows == our greedy AR'] +
            [fmt(r[d]['speculative_vs_ar'][g]) for d in names]
            for g in r['bfloat16']['speculative_vs_ar']]
  lines += harness.table([''] + names, cells)
  lines += ['', f"bfloat16 greedy AR rows == float32 greedy AR rows: "
                f"{fmt(r['ar_bf16_vs_ar_f32'])}."]
  for d in names:
    for g, s in r[d]['speculative_vs_ar'].items():
      if s['differing_rows']:
        lines.append(f"- {d}, gamma {g}: rows {s['differing_rows']} differ from AR first at "
                     f"output position {s['first_divergence']}.")
  if 'ar_seconds_per_input' in r:
    lines += ['', 'Seconds per input, our greedy AR at batch 1 (median of interleaved repeats): ' +
              ', '.join(f'{d} {t:.4f}' for d, t in r['ar_seconds_per_input'].items()) + '.']
  return lines


def run_diagnosis(report: harness.Report) -> str:
  args = report['args']
  enc, refs = rows(args['batch_size'])
  k = max(harness.ints(args['gammas'])) + 1
  cells = report['cells'] = [diagnose(d, enc, refs, k) for d in DTYPES]
  lines = report.header(
      'Where a verify-shaped call first differs from one-token calls (demo target)',
      f"{args['batch_size']} rows (the first inputs and their references), one {k}-token "
      f'extend call vs {k} one-token calls on the same cache; per module output in call '
      'order, elements whose bits differ.')
  for c in cells:
    f = c['first_differing_module']
    lines.append(f"- {c['dtype']}: logits equal: {c['logits_equal']}; first differing module "
                 'output: ' + (f"`{f['module']}` ({f['differing']} of {f['size']} elements)"
                              if f else 'none') + '.')
  for c in cells:
    lines += ['', f"{c['dtype']}:", '']
    lines += harness.table(['module', 'differing', 'size'],
                           [[r['module'], r['differing'], r['size']] for r in c['modules']])
  return report.write(lines, suffix='_diagnosis')


MEASUREMENT = measurement.Measurement(
    'bf16_agreement', __doc__, measure, render, repeats=20, flags=dict(
        num_examples=100, batch_size=dict(type=int, default=50), gammas='3,5,7',
        float32_attention_logits=dict(action='store_true', help="T5Config's flag, for both "
                                      "networks (T5X's configs leave it off)"),
        time=dict(action='store_true', help='also time (idle machine only)'),
        diagnose=dict(action='store_true', help='only locate the first bitwise difference of a '
                      'verify-shaped call')))


def main(argv: Sequence[str], script: str, recorded: Optional[Sequence[str]] = None) -> None:
  """MEASUREMENT.main, or with --diagnose run_diagnosis (results/bf16_agreement_diagnosis)."""
  args = MEASUREMENT.parser(script).parse_args(argv)
  if not args.diagnose:
    MEASUREMENT.main(argv, script, recorded)
    return
  print(run_diagnosis(harness.Report(script, args, argv if recorded is None else recorded)))
