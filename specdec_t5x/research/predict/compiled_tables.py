"""Markdown of the compiled-program report (scripts/compiled_report.py): the data of
compiled_costs.run rendered as tables, and the predicted Table 2 (results/compiled_table2.md)."""

from __future__ import annotations

from typing import Any, Dict, List

from specdec_t5x.research.predict import compiled_trees
from specdec_t5x.research.results import harness

GB = 1e9
GIB = 2 ** 30
LABEL = ('Predictions from the compiler, not measurements: XLA cost analysis of the '
         'programs compiled from abstract shapes, and a roofline per chip.')


def _keys(data: Dict[str, Any]) -> List[str]:
  """'TPU v4 x1', ... in the order of the data (chips within partition counts)."""
  return list(data['table2'][0]['predicted'])


def table2_lines(data: Dict[str, Any]) -> List[str]:
  """The paper's 12 rows, its measured speedup beside the predicted ones."""
  keys = _keys(data)
  return harness.table(
      ['Task', 'Draft', 'Temp', 'gamma', 'alpha', 'paper (TPU-v4)'] +
      [f'predicted {k}' for k in keys] + [f'{keys[0]}, unfused bytes'],
      [[r['task'], r['draft'], f"{r['temperature']:g}", r['gamma'], f"{r['alpha_paper']:.2f}",
        f"{r['speedup_paper']:.1f}x"] + [f"{r['predicted'][k]['speedup']:.2f}x" for k in keys] +
       [f"{r['predicted'][keys[0]]['speedup_unfused']:.2f}x"]
       for r in data['table2']], 'llrrrr' + 'r' * (len(keys) + 1))


def _programs_lines(data: Dict[str, Any]) -> List[str]:
  out = []
  models = data['models']
  for n, by_size in models.items():
    costs = data['per_device_costs'][n]
    for size, m in by_size.items():
      c, progs = costs[size], m['programs']
      steps = sorted((int(k.split('_')[1]) for k in progs if k.startswith('step_')))
      coll = progs['step_1']['collectives']
      out.append([
          size, n, f"{m['num_params'] / 1e6:,.0f}M", f"{m['param_bytes'] / GB:.2f}",
          f"{c['prefill']['flops'] / 1e12:.2f}", f"{c['prefill']['bytes'] / GB:.2f}",
          f"{c['prefill']['bytes_unfused'] / GB:.2f}",
          f"{c['step_1']['flops'] / 1e9:.2f}", f"{c['step_1']['bytes'] / GB:.3f}",
          f"{c['step_1']['bytes_unfused'] / GB:.3f}",
          ', '.join(f"{c[f'step_{k}']['bytes_unfused'] / c['step_1']['bytes_unfused']:.2f}"
                    for k in steps if k > 1) or '-',
          f"{c['step_1']['share']['flops']:.3f}",
          f"{coll['all-reduce']} / {coll['all-gather']}"])
  return harness.table(
      ['size', 'devices', 'params', 'param GB/device', 'prefill TFLOP', 'prefill GB',
       'unfused', 'step GFLOP', 'step GB', 'unfused', 'unfused bytes(k)/bytes(1), k = gamma+1',
       'step flops share', 'step all-reduce / all-gather'], out, 'lrrrrrrrrrrrr')


def _times_lines(data: Dict[str, Any]) -> List[str]:
  rows = []
  for n, chips in data['call_seconds'].items():
    for chip, sizes in chips.items():
      for size, progs in sizes.items():
        rows.append([f'{chip} x{n}', size, f"{progs['prefill'] * 1e3:.2f}",
                     f"{progs['step_1'] * 1e3:.3f}"] + [
            f"{progs[k] / progs['step_1']:.2f}" if k in progs else '-'
            for k in ('step_4', 'step_6', 'step_8')])
  return harness.table(['chip', 'size', 'prefill ms', 'step ms', 't(4)/t(1)', 't(6)/t(1)',
                        't(8)/t(1)'], rows, 'llrrrrr')


def _pairs_lines(data: Dict[str, Any]) -> List[str]:
  keys = _keys(data)
  seen, rows = set(), []
  for r in data['table2']:
    if r['draft'] in seen:
      continue
    seen.add(r['draft'])
    rows.append([r['draft']] + [f"{r['predicted'][k]['c']:.4f}" for k in keys] +
                [f"{r['predicted'][keys[0]]['c_unfused']:.4f}"])
  verify = {}
  for r in data['table2']:
    verify.setdefault(r['gamma'], r['predicted'])
  return harness.table(['draft'] + [f'c {k}' for k in keys] + [f'c {keys[0]}, unfused bytes'],
                       rows, 'l' + 'r' * (len(keys) + 1)) + [
      '', 't_verify(gamma + 1) / t_target(1) at the paper\'s gammas:', ''] + harness.table(
      ['gamma'] + keys + [f'{keys[0]}, unfused bytes'],
      [[g] + [f"{p[k]['verify_ratio']:.4f}" for k in keys] +
       [f"{p[keys[0]]['verify_ratio_unfused']:.4f}"] for g, p in sorted(verify.items())],
      'r' * (len(keys) + 2))


def _memory_lines(data: Dict[str, Any]) -> List[str]:
  cells = list(data['memory'][0]['per_device'])
  chips = [c['name'] for c in data['chips']]

  def cell(m):
    fits = ', '.join(f"{chip} {'yes' if m['fits'][chip] else 'NO'}" for chip in chips)
    return f"{m['resident_bytes'] / GIB:.1f} ({fits})"
  return harness.table(
      ['Task', 'Draft', 'gamma'] + [f"{c.replace('x', 'devices ').replace(' b', ', batch ')}"
                                    for c in cells],
      [[r['task'], r['draft'], r['gamma']] + [cell(r['per_device'][c]) for c in cells]
       for r in data['memory']], 'llr' + 'r' * len(cells))


def render(report: harness.Report) -> List[str]:
  data = report.data
  lengths = data['lengths']
  chips = '; '.join(f"{c['name']}: {c['flops'] / 1e12:g} TFLOP/s, "
                    f"{c['hbm_bytes_per_s'] / 1e12:g} TB/s, {c['hbm_bytes'] / GIB:.1f} GiB "
                    f"({c['source']})" for c in data['chips'])
  lines = report.header(
      "The paper's Table 2 predicted from the compiled programs",
      LABEL + ' T5 v1.1 in bfloat16 (params too), batch 1, '
      f"{lengths['input']} input tokens, cache {lengths['cache']} positions "
      f"({lengths['target']} output tokens + gamma + 1); XLA's dot path. Programs: prefill "
      '= encode + init_cache; step = one cached decoder call over k positions (k = 1: a '
      'target or draft step; k = gamma + 1: verification). Model parallel = params '
      "partitioned by their params_axes under T5X's standard rules over ('data' 1, "
      "'model' n) fake host devices, caches split by heads.",
      'Per device: bytes = what a program must move (its arguments read once, its outputs '
      'written once: the memory analysis of the compiled program, exact shard sizes); '
      "unfused bytes = the lowered HLO's bytes accessed (before fusion: an upper bound); "
      "flops = the lowered HLO's. Both lowered figures are scaled by the share one device "
      'does in the partitioned compile (XLA:CPU computes bfloat16 dots in float32, so its '
      "own byte counts are not an accelerator's; see research/predict/compiled_costs.py)."
      ' Roofline time = max(flops / peak, bytes / HBM bandwidth); collectives and launch '
      'latency are left out (kindest to small drafts). Chips: ' + chips)
  lines += ["## Table 2: the paper's speedup and the predicted one", '',
            'Predicted = E[tokens](alpha, gamma) t(1) / (gamma t_draft(1) + t_verify(gamma + 1))'
            " (theory.walltime_improvement_measured) from the paper's alpha and the roofline "
            'times; the last column times the calls by their unfused bytes instead.', '']
  lines += table2_lines(data)
  lines += ['', '## c = t_draft(1) / t_target(1) for each paper pair, and the verify cost', '']
  lines += _pairs_lines(data)
  lines += ['', '## Programs (per device; GB = 1e9 bytes)', '',
            'Unfused bytes count every intermediate (e.g. the float32 logits kernel converted '
            'apart); the share is the part of the flops one device does.', '']
  lines += _programs_lines(data)
  lines += ['', '## Roofline time per call (bytes: arguments and outputs once)', '']
  lines += _times_lines(data)
  lines += ['', "## Memory per device of a speculative decode (resident: both models' params "
            'and caches; GiB, and whether it fits each chip)', '',
            "Temporaries are not predicted (XLA:CPU's are float32 copies of the weights); the "
            "JSON holds each chip's headroom for them.", '']
  lines += _memory_lines(data) + ['']
  return lines + compiled_trees.lines(data.get('trees'))
