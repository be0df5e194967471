"""The parts of the accelerator report (scripts/device_report.py; its docstring says what
each measures): random T5 v1.1 models, call costs on the timing grid's call-cost
measurement, the paper's Table 2 predicted from them, speculative decoding's efficiency at
the real shapes (speed.sweep) and the demo family's analogue and throughput.
"""

from __future__ import annotations

from typing import Any, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import api, batching, network, sampling, theory, timing
from specdec_t5x.research.measure import demo_data, evaluation, grid, speed, t5x_reference
from specdec_t5x.research.predict import paper
from specdec_t5x.research.results import harness

# --tiny: every size name at a CPU-sized shape (emb, heads, layers, mlp), same code path.
TINY_SIZES = {'small': (16, 2, 1, 32), 'base': (24, 2, 1, 48), 'large': (32, 2, 1, 64),
              'xl': (40, 2, 1, 80), 'xxl': (48, 2, 2, 96)}


def build_models(args) -> Dict[str, Any]:
  """size -> (config, module, params): random weights in --dtype, drawn on the device."""
  dtype = jnp.dtype(args.dtype)
  sizes = list(dict.fromkeys(args.sizes.split(',') + [args.target]))
  models = {}
  for i, size in enumerate(sizes):
    kw = dict(vocab_size=args.vocab, dtype=dtype)
    if args.tiny:
      emb, heads, layers, mlp = TINY_SIZES[size]
      kw.update(emb_dim=emb, num_heads=heads, num_encoder_layers=layers,
                num_decoder_layers=layers, mlp_dim=mlp, head_dim=8)
    cfg = network.t5_1_1_config(size, **kw)
    module = network.Transformer(cfg)
    models[size] = (cfg, module, timing.block(timing.random_params(module, i, dtype)))
  return models


def num_params(params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))


def verify_ks(args) -> List[int]:
  """Positions per call the target is timed at: --ks, --target_ks and every part-3
  gamma + 1."""
  gammas = harness.ints(args.gammas)
  return sorted(set(harness.ints(args.ks) + harness.ints(args.target_ks) + [g + 1 for g in gammas]))


# ------------------------------------------------------------------ 1. costs


def part_costs(args, models, enc) -> Dict[str, Any]:
  gammas = harness.ints(args.gammas) + [row.gamma for row in paper.TABLE_2]
  cache_len = args.max_len + max(gammas) + 1
  ks = {size: verify_ks(args) if size == args.target else harness.ints(args.ks) for size in models}
  timed = grid.call_seconds({size: (module, params, ks[size])
                             for size, (_, module, params) in models.items()},
                            enc, args.cost_calls, args.cost_repeats, cache_len)
  sizes = {}
  for size, (cfg, _, params) in models.items():
    t = timed[size]['call_s']
    sizes[size] = {'config': str(cfg), 'num_params': num_params(params),
                   'prefill_s': timed[size]['prefill_s'], 'call_s': t,
                   'call_ratio_to_k1': {k: v / t[1] for k, v in t.items()}}
  target = sizes[args.target]['call_s']
  pairs = {size: {'c': sizes[size]['call_s'][1] / target[1]}
           for size in models if size != args.target}
  return {'cache_len': cache_len, 'enc_len': args.enc_len, 'dtype': args.dtype,
          'sizes': sizes, 'target': args.target, 'pairs': pairs,
          'verify_ratio': {k - 1: target[k] / target[1] for k in target if k > 1}}


def step_costs(costs: Dict[str, Any], draft: str, name: str) -> Dict[str, float]:
  """The measured costs in grid.costs' keys, for `draft` (a size) named `name`."""
  t, d = costs['sizes'][costs['target']], costs['sizes'][draft]
  out = {'t_target_step': t['call_s'][1], 't_prefill_target': t['prefill_s'],
         f't_draft_step_{name}': d['call_s'][1], f't_prefill_draft_{name}': d['prefill_s']}
  out.update({f't_verify_{k}': v for k, v in t['call_s'].items() if k > 1})
  return out


# ------------------------------------------------------------------ 2. table 2


def part_table2(costs: Dict[str, Any]) -> List[Dict[str, Any]]:
  """The paper's rows predicted from their alpha and the measured costs (see module doc).

  t_verify(gamma + 1) is measured, or interpolated linearly between measured k (held at
  the largest measured k beyond it), as the row's `verify` says.
  """
  t = costs['sizes'][costs['target']]['call_s']
  ks = sorted(t)
  verify = lambda g: float(np.interp(g + 1, ks, [t[k] for k in ks]))
  rows = []
  for paper_row in paper.TABLE_2:
    draft, gamma, alpha = paper_row.draft, paper_row.gamma, paper_row.alpha
    row = {'task': paper_row.task, 'draft': draft, 'temperature': paper_row.temperature,
           'gamma': gamma, 'alpha_paper': alpha, 'speedup_paper': paper_row.speedup}
    if draft not in costs['sizes']:
      rows.append(dict(row, note=f'not measured (--sizes lacks {draft})'))
      continue
    t_d = costs['sizes'][draft]['call_s'][1]
    best = int(theory.best_gamma_measured(alpha, t_d, t[1], verify, max_gamma=max(ks) - 1))
    rows.append(dict(
        row, c=t_d / t[1], verify_ratio=verify(gamma) / t[1],
        verify='measured' if gamma + 1 in t else
        'interpolated' if gamma + 1 < max(ks) else f'held at k={max(ks)}',
        speedup_predicted=float(theory.walltime_improvement_measured(
            alpha, gamma, t_d, t[1], verify(gamma))),
        speedup_free_verify=float(theory.walltime_improvement(alpha, gamma, t_d / t[1])),
        best_gamma=best, speedup_predicted_best=float(theory.walltime_improvement_measured(
            alpha, best, t_d, t[1], verify(best)))))
  return rows


# ------------------------------------------------------------------ 3. efficiency


def part_efficiency(args, models, costs) -> Dict[str, Any]:
  cfg, module, params = models[args.target]
  target = (module, params)
  enc = np.random.RandomState(1).randint(
      2, args.vocab, (args.num_examples, args.enc_len)).astype(np.int32)
  cost, drafts = step_costs(costs, args.target, 'self'), {'self': target}
  if costs['pairs']:  # the smallest draft size measured
    small = min(costs['pairs'], key=lambda s: costs['sizes'][s]['num_params'])
    cost.update(step_costs(costs, small, small))
    drafts = {small: (models[small][1], models[small][2]), **drafts}
  res = speed.sweep(target, drafts, enc, args.max_len, harness.ints(args.gammas),
                         sampling.SamplingConfig(0.0), cost, args.repeats, eos_id=-1)
  res['draft_sizes'] = {name: args.target if name == 'self' else name for name in drafts}
  fns = {'ar': lambda: api.generate(target, enc[:1], max_decode_length=args.max_len,
                                    eos_id=-1).tokens}
  if t5x_reference.available():
    stock = t5x_reference.greedy_decoder(cfg, args.max_len, eos_id=-1)
    fns['t5x'] = lambda: stock(params, enc[:1])
  timings = harness.interleaved(fns, args.repeats)
  res['ar_vs_t5x'] = {
      't5x_importable': t5x_reference.available(), 'raw_times_s': timings.seconds,
      'ar_tokens_per_s': args.max_len / timings.median['ar']}
  if 't5x' in fns:
    res['ar_vs_t5x'].update(
        t5x_tokens_per_s=args.max_len / timings.median['t5x'],
        ours_speed_ratio=timings.speed_ratios('ar')['t5x'],
        same_tokens=bool(np.array_equal(np.asarray(timings.outputs['ar']),
                                        np.asarray(timings.outputs['t5x']))))
  return res


# ------------------------------------------------------------------ 4. demo


def part_demo(args) -> Dict[str, Any]:
  groups = speed.demo_speedups(
      'demo_target', args.demo_drafts.split(','), args.demo_tasks.split(','),
      [float(t) for t in args.demo_temperatures.split(',')], harness.ints(args.demo_gammas),
      args.demo_examples, args.demo_max_len, args.repeats, args.cost_calls,
      args.cost_repeats, alpha_cells=demo_data.alpha_cells(args.alpha_json))
  batches = harness.ints(args.batch_sizes)
  task = args.demo_tasks.split(',')[0]
  examples = evaluation.load_examples(task, max(batches))
  enc = batching.pad_batch([e.inputs for e in examples])  # batches run at their buckets
  draft = evaluation.load_model(args.demo_drafts.split(',')[0], task)
  batch_rows = speed.batch_throughput(
      evaluation.load_model('demo_target'), draft, enc, batches, [args.batch_gamma],
      args.demo_max_len, args.repeats)
  return {'table2': groups, 'batch': {'task': task, 'draft': args.demo_drafts.split(',')[0],
                                      'rows': batch_rows}}
