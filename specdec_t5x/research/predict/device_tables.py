"""Tables and figures of the accelerator report (scripts/device_report.py): its JSON parts
(costs, table2, efficiency, demo) rendered as Markdown sections and PNG figures."""

from __future__ import annotations

import re
from typing import Any, Dict, List

from specdec_t5x.research.measure import demo_data
from specdec_t5x.research.results import harness


def render(report: harness.Report) -> List[str]:
  r = report.data
  lines = report.header(
      f"Accelerator report: {report.environment['device_kind']}",
      'Seconds per part (compilation included): ' + ', '.join(
          f'{k} {v:.0f}' for k, v in r['part_seconds'].items()))
  if r.get('costs'):
    lines += render_costs(r['costs'])
  if r.get('vs_compiled'):
    lines += render_vs_compiled(r['vs_compiled'])
  if r.get('table2'):
    lines += render_table2(r['table2'])
  if r.get('efficiency'):
    lines += render_efficiency(r['efficiency'])
  if r.get('demo'):
    lines += render_demo(r['demo'])
  return lines


def render_costs(costs) -> List[str]:
  ks = sorted({k for s in costs['sizes'].values() for k in s['call_s']})
  ks_above = [k for k in ks if k > 1]
  return [f"## 1. Call costs (T5 v1.1 shapes, random {costs['dtype']} weights, batch 1, "
          f"{costs['enc_len']} input tokens, cache {costs['cache_len']})", '',
          'Prefill = encoder + cache, once per sequence; t(k) = one cached decoder call '
          'over k positions (interleaved medians, timing.call_costs).', ''] + harness.table(
      ['size', 'params', 'prefill ms', 't(1) ms'] + [f't({k})/t(1)' for k in ks_above],
      [[size, f"{s['num_params'] / 1e6:,.0f}M", f"{s['prefill_s'] * 1e3:.2f}",
        f"{s['call_s'][1] * 1e3:.3f}"] + [harness.fmt(s['call_ratio_to_k1'].get(k))
                                          for k in ks_above]
       for size, s in costs['sizes'].items()], 'lrrr' + 'r' * len(ks_above)) + [
      '', f"Pairs with the {costs['target']} target: " + ', '.join(
          f"{d}: c = {p['c']:.3f}" for d, p in costs['pairs'].items()) + '. Verification '
      't_verify(gamma + 1) / t(1): ' + ', '.join(
          f'gamma {g}: {v:.2f}' for g, v in sorted(costs['verify_ratio'].items())) + '.', '']


def vs_compiled(costs: Dict[str, Any], compiled: Dict[str, Any],
                device_kind: str) -> Dict[str, Any]:
  """Measured call costs beside the compiler's predictions for one device
  (results/compiled_table2.json, scripts/compiled_report.py): per size the step and prefill
  times (the roofline of the chip this device is, if it is one of the predicted chips),
  and the chip-free ratios, c per pair and t(gamma + 1) / t(1)."""
  flat = lambda text: re.sub(r'[^a-z0-9]', '', text.lower())
  chip = next((c['name'] for c in compiled['chips'] if flat(c['name']) in flat(device_kind)),
              None)
  times = compiled['call_seconds']['1']
  predicted = times[chip] if chip else None
  any_chip = next(iter(times.values()))  # ratios: the same on every chip's roofline, nearly
  sizes = {}
  for size, measured in costs['sizes'].items():
    if size not in any_chip:
      continue
    row = {'step_s': measured['call_s'][1], 'prefill_s': measured['prefill_s']}
    if predicted:
      row.update(step_s_predicted=predicted[size]['step_1'],
                 prefill_s_predicted=predicted[size]['prefill'])
    row['verify_ratio'] = {k: v for k, v in measured['call_ratio_to_k1'].items() if int(k) > 1}
    row['verify_ratio_predicted'] = {
        int(name.split('_')[1]): t / any_chip[size]['step_1']
        for name, t in any_chip[size].items() if name.startswith('step_') and name != 'step_1'}
    sizes[size] = row
  target = costs['target']
  pairs = {d: {'c': p['c'], 'c_predicted': any_chip[d]['step_1'] / any_chip[target]['step_1']}
           for d, p in costs['pairs'].items() if d in any_chip and target in any_chip}
  return {'chip': chip, 'sizes': sizes, 'pairs': pairs, 'lengths': compiled['lengths'],
          'measured_lengths': {'input': costs['enc_len'], 'cache': costs['cache_len']}}


def render_vs_compiled(cmp_: Dict[str, Any]) -> List[str]:
  chip = cmp_['chip']
  ms = lambda row, key: harness.fmt(row.get(key) and row[key] * 1e3, '.3f')
  ratios = lambda d: ', '.join(f'{k}: {v:.2f}' for k, v in sorted(d.items(), key=lambda i: int(i[0])))
  return ["## 1b. Measured beside the compiler's predictions (results/compiled_table2.md)", '',
          f"Predicted: XLA cost analysis and a roofline for {chip or 'no chip of this kind'}"
          f" (1 device), at {cmp_['lengths']['input']} input tokens and a "
          f"{cmp_['lengths']['cache']}-position cache; measured here at "
          f"{cmp_['measured_lengths']['input']} and {cmp_['measured_lengths']['cache']}.",
          ''] + harness.table(
      ['size', 't(1) ms', 'predicted', 'prefill ms', 'predicted',
       't(k)/t(1) measured', 't(k)/t(1) predicted'],
      [[size, ms(r, 'step_s'), ms(r, 'step_s_predicted'), ms(r, 'prefill_s'),
        ms(r, 'prefill_s_predicted'), ratios(r['verify_ratio']),
        ratios(r['verify_ratio_predicted'])] for size, r in cmp_['sizes'].items()],
      'lrrrrll') + ['', 'c measured (predicted): ' + ', '.join(
          f"{d}: {p['c']:.3f} ({p['c_predicted']:.3f})" for d, p in cmp_['pairs'].items()), '']


def render_table2(rows) -> List[str]:
  def cells(r):
    head = [r['task'], r['draft'], r['temperature'], r['gamma'], r['alpha_paper'],
            f"{r['speedup_paper']}x"]
    if 'note' in r:
      return head + [r['note'], '', '', '', '']
    verify = '' if r['verify'] == 'measured' else f" ({r['verify']})"
    return head + [f"{r['speedup_predicted']:.2f}x", f"{r['speedup_free_verify']:.2f}x",
                   f"{r['c']:.3f}", f"{r['verify_ratio']:.2f}{verify}",
                   f"{r['best_gamma']} ({r['speedup_predicted_best']:.2f}x)"]
  return ["## 2. The paper's Table 2 predicted from its alpha and these costs", '',
          'Predicted = E[tokens](alpha, gamma) t(1) / (gamma t_draft + t_verify(gamma + 1)) '
          "(theory.walltime_improvement_measured); free verify = the paper's model with "
          't_verify = t(1); best gamma = theory.best_gamma_measured for these costs. The '
          'paper measured on one TPU-v4 with fine-tuned T5X checkpoints.', ''] + harness.table(
      ['Task', 'Draft', 'Temp', 'gamma', 'alpha', 'paper', 'predicted', 'free verify', 'c',
       't_verify/t(1)', 'best gamma (predicted)'], [cells(r) for r in rows]) + ['']


def render_efficiency(eff) -> List[str]:
  cmp_ = eff['ar_vs_t5x']
  return ['## 3. Efficiency at the real shapes (random weights, greedy, batch 1)', '',
          'Speed = AR time / speculative time on the same inputs (interleaved medians); '
          'ideal = tokens/call t(1) / (gamma t_draft + t_verify) from the costs above; '
          'ideal e2e adds the prefill each sequence pays once. Goal: efficiency >= 0.95.',
          ''] + harness.table(
      ['draft', 'gamma', 'alpha', 'acceptance rate', 'tokens/call', 'speed', 'ideal',
       'efficiency', 'ideal e2e', 'eff. e2e'],
      [[f"{eff['draft_sizes'][name]} ({name})", r['gamma'], f"{r['alpha']:.2f}",
        f"{r['acceptance_rate']:.2f}",
        f"{r['tokens_per_target_call']:.2f}", f"{r['speedup_measured']:.2f}x",
        f"{r['speedup_ideal']:.2f}x", f"{r['efficiency']:.2f}",
        harness.fmt(r['speedup_ideal_end_to_end'], unit='x'),
        harness.fmt(r['efficiency_end_to_end'])]
       for name, d in eff['drafts'].items() for r in d['rows']]) + [
      '', f"Our AR: {cmp_['ar_tokens_per_s']:.1f} tokens/s. " + (
          f"Stock T5X (EncoderDecoderModel.predict_batch, temperature_sample, T5X network, "
          f"same params): {cmp_['t5x_tokens_per_s']:.1f} tokens/s; ours / T5X speed "
          f"{cmp_['ours_speed_ratio']:.2f}x (median of per-pair ratios); same tokens: "
          f"{cmp_['same_tokens']}." if 'ours_speed_ratio' in cmp_ else
          'T5X is not importable here: not compared.'), '']


def render_demo(demo) -> List[str]:
  b = demo['batch']
  return ['## 4. The demo family (float32)', '', 'Table 2 analogue at batch 1 (alpha: '
          'teacher-forced, results/alpha_demo.json; speed per generated token; `<-` the '
          'best measured gamma):', ''] + harness.table(
      ['Task', 'Draft', 'Temp', 'gamma', 'alpha', 'tokens/call', 'speed', 'theory', 'ideal',
       'efficiency', 'eff. e2e', 'c'],
      [[grp['task'], name, f"{grp['temperature']:g}",
        f"{r['gamma']}{' <-' if r['gamma'] == d['best_measured_gamma'] else ''}",
        f"{d['alpha_for_choice']:.2f}", f"{r['tokens_per_target_call']:.2f}",
        f"{r['speedup_measured']:.2f}x", f"{r['speedup_theory']:.2f}x",
        f"{r['speedup_ideal']:.2f}x", f"{r['efficiency']:.2f}",
        harness.fmt(r['efficiency_end_to_end']), f"{d['c']:.3f}"]
       for grp in demo['table2'] for name, d in grp['drafts'].items() for r in d['rows']]) + [
      '', f"Greedy throughput, demo_target + {b['draft']}, task {b['task']}:", ''] + (
      demo_data.throughput_table(b['rows']))


def plot(report: harness.Report) -> List[str]:
  plt = harness.pyplot()
  paths = []
  r = report.data
  costs, rows, demo = r.get('costs'), r.get('table2'), r.get('demo')
  if costs:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = list(costs['sizes'])
    left.bar(names, [costs['sizes'][n]['call_s'][1] * 1e3 for n in names], label='t(1)')
    left.plot(names, [costs['sizes'][n]['prefill_s'] * 1e3 for n in names], 'ko-',
              label='prefill')
    left.set_yscale('log'), left.set_ylabel('ms'), left.legend()
    for n in names:
      ratio = costs['sizes'][n]['call_ratio_to_k1']
      right.plot(sorted(ratio), [ratio[k] for k in sorted(ratio)], 'o-', label=n)
    right.set_xlabel('positions per call k'), right.set_ylabel('t(k) / t(1)'), right.legend()
    fig.suptitle(f"{report.environment['device_kind']}: call costs ({costs['dtype']})")
    paths.append(report.save_figure(fig, '_costs'))
  done = [row for row in rows or [] if 'speedup_predicted' in row]
  if done:
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.scatter([row['speedup_paper'] for row in done], [row['speedup_predicted'] for row in done])
    for row in done:
      ax.annotate(f"{row['task']} {row['draft']} t={row['temperature']}",
                  (row['speedup_paper'], row['speedup_predicted']), fontsize=7)
    top = max(max(row['speedup_paper'], row['speedup_predicted']) for row in done) * 1.1
    ax.plot([1, top], [1, top], '--', color='gray')
    ax.set_xlabel('paper (TPU-v4)'), ax.set_ylabel('predicted from these costs')
    ax.set_title('Table 2 speedups')
    paths.append(report.save_figure(fig, '_table2'))
  if demo:
    fig, ax = plt.subplots(figsize=(5, 3.5))
    demo_data.throughput_plot(ax, demo['batch']['rows'])
    paths.append(report.save_figure(fig, '_batch'))
  return paths
