"""One line per results file, from its JSON: results/INDEX.md's headlines.

Each function renders a results JSON's headline; an experiment file
(research/experiments/) names the one of each of its files, and research/results/reproduce.py
puts them into the index, the README's speedup box and the docs' rendered blocks, so the
docs quote what the files hold. Words as docs/glossary.md defines them: alpha is the
paper's (E[beta]), the acceptance rate is accepted over drafted tokens; a decode's tokens
per target call comes with its wall-time speedup over AR, and a prediction says so.
"""

from __future__ import annotations

import statistics
from typing import Any, Dict


def _x(v: float) -> str:
  return f'{v:.2f}x'


def _wall(r: Dict[str, Any]) -> str:
  """' (wall 0.83x)': a decode's measured wall-time speedup over AR, where its row has one."""
  return f" (wall {_x(r['speedup_vs_ar'])})" if r.get('speedup_vs_ar') is not None else ''


def demo_runs(d):
  pooled = [r['walltime_speedup_stats']['pooled'] for r in d['runs']]
  same = all(r['identical_predictions'] for r in d['runs'])
  first = d['runs'][0]
  return (f"{min(pooled):.2f}-{max(pooled):.2f}x over {len(pooled)} fresh runs, "
          f"alpha {first['alpha']:.2f}, acceptance rate {first['acceptance_rate']:.2f}, "
          f"{'identical' if same else 'DIFFERENT'} predictions, BLEU "
          f"{d['runs'][0]['bleu']['bleu']:.2f}")


def alpha(d):
  cells = {(c['task'], c['draft'], c['temperature']): c['alpha'] for c in d['cells']}
  return '; '.join(f'{task} {draft}: {cells[(task, draft, 0.0)]:.2f} (t=0), '
                   f'{cells[(task, draft, 1.0)]:.2f} (t=1)'
                   for task in ('ende', 'summarize') for draft in ('demo_draft_m', 'bigram')
                   if (task, draft, 0.0) in cells and (task, draft, 1.0) in cells)


def models(d):
  s = d['scores']
  return (f"target BLEU {s['ende/demo_target']['bleu']:.1f} / ROUGE-1 "
          f"{s['summarize/demo_target']['rouge1']:.1f}; draft_m "
          f"{s['ende/demo_draft_m']['bleu']:.1f} / {s['summarize/demo_draft_m']['rouge1']:.1f}")


def decode_costs(d):
  b = d['baselines']['t5x']
  return f"our AR {_x(b['ours_speed_ratio'])} stock T5X predict_batch (same tokens: " \
         f"{b['same_tokens_as_ours']})"


def cpu_kernels(d):
  costs = {c['mode']: c for c in d['costs']}
  xla, packed = costs['xla'], costs['packed']
  f32 = costs.get('packed f32')
  via = f"{f32['t_target_step']:.2f} (float32 panels) -> " if f32 else ''
  return (f"demo target step {xla['t_target_step']:.2f} -> {via}{packed['t_target_step']:.2f} "
          f"ms, verify(4)/step {xla['r']:.2f} -> {packed['r']:.2f}; AR "
          f"{_x(d['ar_speedup_packed_vs_xla'])} faster")


def peers(d):
  s = d['systems']
  spec, hf = s['ours_spec_greedy'], s['hf_assisted_greedy']
  out = (f"ours AR {_x(s['ours_ar_greedy']['speed_vs_hf_greedy'])} HF greedy; ours "
         f"speculative {_x(spec['speed_vs_hf_greedy'] / hf['speed_vs_hf_greedy'])} "
         f"HF assisted (greedy; {spec['tokens_per_target_call']:.2f} vs "
         f"{hf['tokens_per_target_call']:.2f} tokens per target call, wall "
         f"{_x(spec['speed_vs_ours_ar'])} and {_x(hf['speed_vs_hf_greedy'])} over each "
         f"one's AR)")
  ct2 = {k: v for k, v in s.items() if k.startswith('ct2_')}
  if ct2:
    ours = max(('ours_ar_greedy', 'ours_spec_greedy'), key=lambda k: s[k]['tokens_per_s'])
    best = max(ct2, key=lambda k: ct2[k]['tokens_per_s'])
    out += (f"; our fastest greedy ({ours}) "
            f"{_x(s[ours]['tokens_per_s'] / ct2[best]['tokens_per_s'])} CTranslate2's "
            f"fastest ({best})")
  return out


def feature_draft(d):
  rows = {(r['task'], r['temperature'], r['draft'], r['gamma']): r for r in d['acceptance']}
  name = d['args'].get('head', 'demo_feature_head')
  head, draft = rows.get(('ende', 0.0, name, 3)), rows.get(('ende', 0.0, 'demo_draft_m', 3))
  if head is None or draft is None:
    return 'see file'
  return (f"EN->DE greedy, gamma 3: head {name} alpha {head['alpha']:.2f} "
          f"({head['tokens_per_target_call']:.2f} tokens/call) vs draft_m "
          f"{draft['alpha']:.2f} ({draft['tokens_per_target_call']:.2f}); c "
          f"{d['c'][name]:.3f} vs {d['c']['demo_draft_m']:.3f}")


def confidence(d):
  parts = []
  for task, t in d['tables'].items():
    flat = t['buckets'][0]
    parts.append(f"{task}: {flat['share']:.0%} of positions with target top-1 < "
                 f"{flat['top1_to']:g}, agreement there " + ', '.join(
                     f"{k} {v:.2f}" for k, v in flat['agreement'].items()) + '; overall ' +
                 ', '.join(f"{k} {v:.2f}" for k, v in t['agreement'].items()))
  return '; '.join(parts)


def speedup(d):
  parts = []
  for g in d['groups']:
    best = {name: max(v['rows'], key=lambda r: r['speedup_measured'])
            for name, v in g['drafts'].items()}
    parts.append(f"{g['task']} t={g['temperature']:g}: " + ', '.join(
        f"{name} {_x(r['speedup_measured'])} (gamma {r['gamma']})" for name, r in best.items()))
  return '; '.join(parts)


def efficiency_e2e(d):
  return '; '.join(
      f"{g['task']} t={g['temperature']:g} {name}: end-to-end efficiency " + '/'.join(
          f"{r['efficiency_end_to_end']:.2f}" for r in v['rows'])
      + f" (gamma {'/'.join(str(r['gamma']) for r in v['rows'])}), measured "
      + '/'.join(_x(r['speedup_measured']) for r in v['rows'])
      for g in d['groups'] for name, v in g['drafts'].items())


def block(d):
  """Precise tokens per call, each block-verified decode over its token-wise twin."""
  rows = {(r['task'], r['decode']): r for r in d['results']}
  gain = lambda r: r['tpc_precise'] / rows[r['task'], r['decode'].replace('+block', '')][
      'tpc_precise'] - 1
  return ', '.join(f"{r['task']} {r['decode']}: {100 * gain(r):+.1f}%"
                   for r in d['results'] if '+block' in r['decode']) + (
                       ' tokens per call, block over token (t=1)')


def best_of(key):
  def headline(d):
    rows = [r for r in d['results'] if r.get(key) is not None and r.get(key) != 1.0]
    best = max(rows, key=lambda r: r[key])
    label = next(best[k] for k in ('decode', 'name', 'setting', 'draft') if best.get(k))
    where = f" ({best['task']})" if best.get('task') else ''
    lossy = ', LOSSY' if best.get('lossy') else ''
    return f'best {label}{where}{lossy}: {_x(best[key])} wall time over AR'
  return headline


def loop_efficiency(d):
  parts, drafts = [], set()
  for matmul, res in d['matmuls'].items():
    rows = [r for g in res['groups'] for r in g['rows'] if r['draft'] != 'self']
    drafts |= {r['draft'] for r in rows}
    eff = [r['efficiency_end_to_end'] for r in rows]
    made = [r['efficiency_as_made'] for r in rows if 'efficiency_as_made' in r]
    parts.append(f"{matmul}: efficiency {min(eff):.2f}-{max(eff):.2f} "
                 f"(median {statistics.median(eff):.2f}"
                 + (f"; with the draft calls as made {min(made):.2f}-{max(made):.2f}, median "
                    f"{statistics.median(made):.2f})" if made else ')'))
  args = d['args']
  gammas = sorted(args['gammas'])
  span = f'{gammas[0]}-{gammas[-1]}' if len(gammas) > 1 else f'{gammas[0]}'
  temps = ' and '.join(f'{t:g}' for t in args['temperatures'])
  return (f"{', '.join(sorted(drafts))}, batch {args.get('batch', 1)}, gamma {span}, t {temps}: "
          + '; '.join(parts))


def _said(alpha):
  return 'out of reach' if alpha is None else f'{alpha:.2f}'


def ceiling(d):
  need = {k: v['1.3x']['end_to_end'] for k, v in d['alpha_needed'].items()}
  head = 'demo_feature_head_kd'
  now = max((r for r in d['loops'] if r['draft'] == head), key=lambda r: r['speedup_measured'])
  return (f"PREDICTED from the measured step costs: 1.3x end to end needs i.i.d. alpha "
          f"{_said(need[f'{head} (real loop)'])} with the head's loop, "
          f"{_said(need[f'{head} (calls alone)'])} with its calls alone, "
          f"{_said(need['free draft'])} with a free draft; measured: the head "
          f"{_x(now['speedup_measured'])} at gamma {now['gamma']} (its i.i.d. alpha "
          f"{now['alpha_iid']:.2f})")


def tree(d):
  """Greedy tokens per target call: each task's best chain and best tree."""
  parts = []
  for task in dict.fromkeys(r['task'] for r in d['results']):
    rows = [r for r in d['results'] if r['task'] == task and r['decode'] != 'AR'
            and not r.get('temperature')]
    best = lambda tree: max((r for r in rows if ('+' in r['decode']) == tree),
                            key=lambda r: r['mean_tokens_per_target_call'])
    chain, tree = best(False), best(True)
    parts.append(f"{task}: chain {chain['decode']} {chain['mean_tokens_per_target_call']:.2f}"
                 f"{_wall(chain)}, tree {tree['decode']} "
                 f"{tree['mean_tokens_per_target_call']:.2f}{_wall(tree)}, "
                 f"{tree['verified_positions']} positions")
  return ('greedy tokens per target call (wall: measured speedup over AR), best of each: '
          + '; '.join(parts))


def dynamic_tree(d):
  """Greedy tokens per target call: per task, the dynamic tree that gains most over the
  chain verifying as many positions."""
  parts = []
  for task in dict.fromkeys(r['task'] for r in d['results']):
    rows = [r for r in d['results'] if r['task'] == task and r['decode'] != 'AR'
            and not r.get('temperature')]
    chains = {r['verified_positions']: r for r in rows if '+' not in r['decode']}
    pairs = [(r['mean_tokens_per_target_call'] / chains[r['verified_positions']][
        'mean_tokens_per_target_call'], r, chains[r['verified_positions']])
             for r in rows if '+' in r['decode'] and r['verified_positions'] in chains]
    ratio, tree, chain = max(pairs, key=lambda x: x[0])
    parts.append(f"{task}: {tree['decode']} {tree['mean_tokens_per_target_call']:.2f}"
                 f"{_wall(tree)} vs {chain['decode']} "
                 f"{chain['mean_tokens_per_target_call']:.2f}{_wall(chain)} "
                 f"({ratio:.2f}x the tokens, {tree['verified_positions']} positions)")
  return ('greedy tokens per target call (wall: measured speedup over AR), the best dynamic '
          'tree over the chain of as many positions: ' + '; '.join(parts))


def _tpc(r):
  """A decode's tokens per target call: the precise count where the experiment made one."""
  return r.get('tpc_precise') or r['mean_tokens_per_target_call']


def sampled_tree(d):
  """Tokens per target call at t = 1 (the precise count): per task, the drawn tree that
  gains most over the chain of as many draft calls; and the drawn trees over the top-W
  trees of their shapes."""
  parts, over_top = [], []
  for task in dict.fromkeys(r['task'] for r in d['results']):
    rows = {r['decode']: r for r in d['results'] if r['task'] == task and r['decode'] != 'AR'}
    drawn = [name for name in rows if name.endswith('s') and name.split('+')[0] in rows]
    over_top += [_tpc(rows[name]) / _tpc(rows[name[:-1]]) for name in drawn if name[:-1] in rows]
    ratio, name = max((_tpc(rows[name]) / _tpc(rows[name.split('+')[0]]), name) for name in drawn)
    chain = name.split('+')[0]
    parts.append(f"{task}: {name} {_tpc(rows[name]):.2f}{_wall(rows[name])} vs {chain} "
                 f"{_tpc(rows[chain]):.2f}{_wall(rows[chain])} ({ratio:.2f}x the tokens, "
                 f"{rows[name]['verified_positions']} positions)")
  return ('t=1 tokens per target call (wall: measured speedup over AR), levels drawn from q '
          'over the chain of as many draft calls, best: ' + '; '.join(parts) + '; tokens '
          f'over the top-W tree of the same shape: {min(over_top):.2f}-{max(over_top):.2f}x')


def head_tree(d):
  """Greedy tokens per target call (the precise count): per task, the head's best tree
  against every single-kind chain of as many verified positions."""
  parts = []
  for task in dict.fromkeys(r['task'] for r in d['results']):
    rows = [r for r in d['results'] if r['task'] == task and r['decode'] != 'AR'
            and not r.get('temperature')]
    tree = max((r for r in rows if '+' in r['decode']), key=_tpc)
    chains = sorted((r for r in rows if '+' not in r['decode']
                     and r['verified_positions'] == tree['verified_positions']), key=_tpc)
    parts.append(f"{task}: {tree['decode']} {_tpc(tree):.2f}{_wall(tree)} vs chains " +
                 ', '.join(f"{r['decode']} {_tpc(r):.2f}{_wall(r)}" for r in chains))
  return ('greedy tokens per target call (wall: measured speedup over AR), the feature '
          'head\'s best tree against the chains of as many positions: ' + '; '.join(parts))


def head_dynamic_tree(d):
  """Tokens per target call (the precise count), greedy and t = 1: per task, the head's
  dynamic tree that gains most over its chain of as many verified positions."""
  parts = []
  for (task, t) in dict.fromkeys((r['task'], r['temperature']) for r in d['results']):
    rows = [r for r in d['results'] if (r['task'], r['temperature']) == (task, t)
            and r['decode'] != 'AR']
    key = lambda r: (r['verified_positions'], r['decode'].partition('@')[2])  # the head's
    chains = {key(r): r for r in rows if '+' not in r['decode']}
    pairs = [(_tpc(r) / _tpc(chains[key(r)]), r, chains[key(r)])
             for r in rows if '+' in r['decode'] and key(r) in chains]
    if not pairs:
      continue
    ratio, tree, chain = max(pairs, key=lambda x: x[0])
    name = lambda r: r['decode'].split('@')[0]
    parts.append(f"{task} t={t:g}: {name(tree)} {_tpc(tree):.2f}{_wall(tree)} vs "
                 f"{name(chain)} {_tpc(chain):.2f}{_wall(chain)} ({ratio:.2f}x the tokens, "
                 f"{tree['verified_positions']} positions)")
  return ('tokens per target call (wall: measured speedup over AR), the feature head\'s best '
          'dynamic tree over its chain of as many positions: ' + '; '.join(parts))


def tree_bound(d):
  """Per task and draft, at 4 verified positions: the best static tree (siblings, searched,
  with a copy branch, or with copy and n-gram branches) and the dynamic bound, over the
  chain."""
  parts = []
  for c in d['cells']:
    b = next(b for b in c['by_nodes'] if b['nodes'] == 3)
    best = max(b[k]['tokens_per_call'] for k in ('chain', 'chain_with_siblings', 'best_tree',
                                                 'searched', 'chain_with_copy', 'mixed')
               if b.get(k, {}).get('tokens_per_call') is not None)
    chain = b['chain']['tokens_per_call']
    parts.append(f"{c['task']} {c['draft']} {best / chain:.2f} (dynamic, bound: "
                 f"{b['dynamic_bound']['tokens_per_call'] / chain:.2f})")
  return ('replayed, not decoded (no wall time): greedy tokens per call at 4 verified '
          'positions, the best static tree found over the chain: ' + ', '.join(parts))


def batch(d):
  return ', '.join(f"batch {r['batch']} gamma {r['gamma']}: {_x(r['speedup_vs_ar'])}"
                   for r in d['rows'] if r['gamma'] is not None)


def compiled(d):
  """The accelerator prediction and its error on the paper's own Table 2 rows."""
  rows = d['table2']
  pred = [r['predicted']['TPU v4 x1']['speedup'] for r in rows]
  err = [abs(p - r['speedup_paper']) for p, r in zip(pred, rows)]
  first = rows[0]
  return (f"PREDICTED (compiled programs, roofline), one TPU v4: {first['task']} "
          f"{first['draft']} draft t={first['temperature']} {_x(pred[0])} (paper "
          f"{_x(first['speedup_paper'])}); on the paper's {len(rows)} rows the prediction "
          f"is off by {statistics.mean(err):.2f}x on average, {max(err):.2f}x at most")


def cost_curve(d):
  """Per size, a 4-position call (or the largest timed) over a one-token step in the
  default kernel mode (float32 'packed', else the bfloat16 form timed), and where the
  paper's pair pays."""
  by_size: Dict[str, Dict[str, Any]] = {}
  for c in d['cells']:
    if c['mode'] in ('packed', 'packed_bf16') and (c['mode'] == 'packed'
                                                   or c['size'] not in by_size):
      by_size[c['size']] = c
  timed = {int(k) for c in by_size.values() for k in c['verify_over_step']}
  k = 4 if 4 in timed else max(timed)  # a run of fewer positions (--quick: k = 2)
  ratio = ', '.join(f"{size} {c['verify_over_step'][str(k)]:.2f}"
                    + ('' if c['dtype'] == 'float32' else ' (bfloat16)')
                    for size, c in by_size.items())
  pays = [c for c in d['cells'] if 'T5 v1.1 small' in c
          and c['T5 v1.1 small']['at_paper_alpha']['speedup'] >= 1.5]
  where = (f"{pays[0]['size']} ({pays[0]['dtype']}/{pays[0]['mode']})" if pays
           else 'none of the sizes measured')
  return (f"a {k}-position call costs {ratio} one-token steps (by target size); the paper's "
          f"T5-small draft at its alpha {d['paper_small_alpha']} is predicted >= 1.5x from "
          f"{where} up")


def tree_budget(d):
  """Greedy tokens per target call per task: at each number of verified positions, the
  best tree over the draft's chain of as many; and the mixed tree (a dynamic tree with a
  copy branch) that gains most over the best single-kind chain of its positions."""
  parts = []
  for task in dict.fromkeys(r['task'] for r in d['results']):
    rows = [r for r in d['results'] if r['task'] == task and r['decode'] != 'AR'
            and not r.get('temperature')]
    tpc = lambda r: r['mean_tokens_per_target_call']
    by_k = lambda want: {k: [r for r in rows if r['verified_positions'] == k and want(r)]
                         for k in sorted({r['verified_positions'] for r in rows})}
    chains = {k: v[0] for k, v in by_k(lambda r: r['decode'] == f"g{r['verified_positions'] - 1}"
                                       ).items() if v}
    best = [(max(v, key=tpc), chains[k]) for k, v in by_k(lambda r: '+' in r['decode']).items()
            if v and k in chains]
    text = ', '.join(f"{k['verified_positions']}: {t['decode']} {tpc(t):.2f}{_wall(t)} vs "
                     f"{k['decode']} {tpc(k):.2f}{_wall(k)} ({tpc(t) / tpc(k):.2f}x the tokens)"
                     for t, k in best)
    singles = by_k(lambda r: '+' not in r['decode'])
    mixed = [(tpc(r) / max(map(tpc, singles[r['verified_positions']])), r) for r in rows
             if '+w' in r['decode'] and '+c' in r['decode'] and singles[r['verified_positions']]]
    if mixed:
      ratio, r = max(mixed, key=lambda x: x[0])
      text += (f"; mixed {r['decode']} {tpc(r):.2f}{_wall(r)} over the best single-kind chain "
               f"of {r['verified_positions']} positions: {ratio:.2f}x the tokens")
    parts.append(f'{task}: {text}')
  return ('greedy tokens per target call (wall: measured speedup over AR), the best tree '
          'over the chain of as many verified positions: ' + '; '.join(parts))


def demo_parts(d):
  """Per run file: the speedup, each decode's ms per batch and the prefill both pay."""
  return 'a demo batch, ms: ' + '; '.join(
      f"{f['dtype']} {_x(f['speedup'])} (AR {f['rows']['AR']['batch_seconds'] * 1e3:.1f}, "
      f"speculative {f['rows']['speculative']['batch_seconds'] * 1e3:.1f}, prefill "
      f"{f['rows']['AR']['parts']['prefill'] * 1e3:.1f} of each)" for f in d['files'])
