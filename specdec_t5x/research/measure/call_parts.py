"""Where a runner batch's time goes: the demo's timed region itemized, for the
autoregressive baseline and the speculative decode of each run file.

  python scripts/compare_decodes.py --experiment=demo_parts \
      [--gin_files=configs/demo.gin,configs/demo_bf16.gin] [--num_examples=100] [--repeats=3]

Each run file is read as `python -m specdec_t5x.infer` reads it (evaluation.from_gin): its
model, checkpoints, inputs (batch 1, each row at its length bucket, as the runner pads it)
and decode settings; its baseline is the target alone with the same settings (as the
runner's compare_baseline makes it). Per decode, four nested regions are timed over every
row, interleaved (harness.interleaved), each a subset of the one before:
  runner: what infer_run.BatchRunner times per batch (the T5X model's
    predict_batch_with_stats and the allgather of its outputs);
  generate: api.generate with the model's arguments (its checks, keys, weight lookup and
    the compiled program);
  program: the compiled decode program alone, on arguments prepared once;
  prefill: the program's encoders and cache set-up alone (one jitted call per row).
Every region waits for each row's outputs before the next row starts, as the runner does,
so no region hides a call's dispatch behind the one before.
The decoder calls inside the program are priced from the call costs measured alone
(grid.costs: a one-token step, a (gamma + 1)-position verify call, a draft step) times the
calls the decode made; the loop's own work is what the program takes beyond its prefill
and those calls. `explained` is (prefill + calls + the regions outside the program) over
the runner's time: how much of a batch the itemized parts account for.
"""

from __future__ import annotations

from typing import Any, Dict, List

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import api, batching
from specdec_t5x.algorithm.cpu import modes, packing
from specdec_t5x.integration import infer_run
from specdec_t5x.research.measure import evaluation, grid, measurement
from specdec_t5x.research.results import harness

PARTS = ('prefill', 'target_calls', 'draft_calls', 'loop_work', 'outside_program',
         'model_wrapper')


def _prefill_fn(target, draft, max_len: int, config) -> Any:
  """A jitted fn(row) -> the decode's caches (api.prefill, as the decode program computes
  them)."""
  (t_module, t_params), mode = target, config.cpu_kernels
  t_vars = packing.decode_variables(t_module, t_params, mode)
  d_module, d_vars = (None, None) if draft is None else (
      draft[0], packing.decode_variables(draft[0], draft[1], mode))

  def run(t_vars, d_vars, tokens):
    with modes.decode_mode(mode):
      return api.prefill(t_module, t_vars, d_module, d_vars, tokens, max_len=max_len,
                         config=config)
  jitted = jax.jit(run)
  return lambda tokens: jitted(t_vars, d_vars, tokens)


def _decodes(run: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
  """The run file's two decodes: (T5X model, target, draft or None, DecodeConfig)."""
  model = run['model']
  base = infer_run.target_alone(model)  # as infer's compare_baseline makes it
  return {'AR': dict(model=base, draft=None, config=base.run_config),
          'speculative': dict(model=model, draft=run['draft'], config=model.run_config)}


def _region_fns(run: Dict[str, Any], decode: Dict[str, Any], rows: List[np.ndarray],
                name: str) -> Dict[str, Any]:
  """The four nested regions of one decode, each a fn over every row."""
  model, draft, config = decode['model'], decode['draft'], decode['config']
  (module, params), max_len, eos = run['target'], run['max_len'], run['eos_id']
  keys = [jax.random.fold_in(jax.random.PRNGKey(0), i) for i in range(len(rows))]
  program = api.compiled_program(module, None if draft is None else draft[0],
                                 max_len=max_len, config=config)
  t_vars = packing.decode_variables(module, params, config.cpu_kernels)
  d_vars = None if draft is None else packing.decode_variables(*draft, config.cpu_kernels)
  on_device = [jnp.asarray(r) for r in rows]
  prefill = _prefill_fn(run['target'], draft, max_len, config)
  eos_id = jnp.int32(eos)

  def runner():
    out = []
    for r, key in zip(rows, keys):
      batch = {'encoder_input_tokens': r,
               'decoder_input_tokens': np.zeros((1, max_len), np.int32)}
      out.append(multihost_utils.process_allgather(
          model.predict_batch_with_stats(params, batch, rng=key), tiled=True))
    return out

  def generate():
    return [api.generate(run['target'], r, draft=draft, max_decode_length=max_len, rng=key,
                         eos_id=eos, config=config) for r, key in zip(rows, keys)]

  def compiled():  # each row waited for, as generate and the runner wait for theirs
    return [jax.block_until_ready(program(t_vars, d_vars, r, key, eos_id, None))
            for r, key in zip(on_device, keys)]

  def caches():
    return [jax.block_until_ready(prefill(r)) for r in on_device]
  return {f'{name}/runner': runner, f'{name}/generate': generate,
          f'{name}/program': compiled, f'{name}/prefill': caches}


def _calls(outputs: List[Any]) -> Dict[str, int]:
  """Target calls, drafted tokens and generated tokens summed over the program's rows."""
  total = {'target_calls': 0, 'drafted_tokens': 0, 'generated_tokens': 0}
  for _, stats in outputs:
    for k in total:
      total[k] += int(np.sum(stats[k]))
  return total


def itemize(seconds: Dict[str, float], counts: Dict[str, int], costs: Dict[str, float],
            step_cost: str, num_rows: int) -> Dict[str, Any]:
  """Per batch: the parts (PARTS) from the regions' median seconds, the calls' counts and
  the call costs, and `explained` (the parts measured alone over the runner's time)."""
  per = {k: v / num_rows for k, v in seconds.items()}
  parts = {'prefill': per['prefill'],
           'target_calls': counts['target_calls'] * costs[step_cost] / num_rows,
           'draft_calls': counts['drafted_tokens'] * costs.get('t_draft_step_draft', 0.0)
                          / num_rows,
           'outside_program': per['generate'] - per['program'],
           'model_wrapper': per['runner'] - per['generate']}
  alone = sum(parts.values())
  parts['loop_work'] = per['program'] - parts['prefill'] - parts['target_calls'] - parts[
      'draft_calls']
  return dict(batch_seconds=per['runner'], parts={k: parts[k] for k in PARTS},
              program_seconds=per['program'], generate_seconds=per['generate'],
              explained=alone / per['runner'], tokens_per_batch=counts['generated_tokens']
              / num_rows, **counts)


def measure_file(gin_file: str, args) -> Dict[str, Any]:
  """The itemized rows (AR, speculative) of one run file."""
  run = evaluation.from_gin([gin_file], [], args.num_examples)
  rows = [batching.pad_batch([r[r != 0]], run['enc'].shape[1]) for r in run['enc']]
  decodes = _decodes(run)
  fns = {}
  for name, decode in decodes.items():
    fns.update(_region_fns(run, decode, rows, name))
  timings = harness.interleaved(fns, args.repeats)
  config = decodes['speculative']['config']
  gamma = int(config.gamma)
  with modes.default_mode_as(config.cpu_kernels):  # the call costs in the run's kernel mode
    costs = grid.costs(run['target'], {'draft': run['draft']}, rows[0], [gamma],
                       max_len=run['max_len'], repeats=max(args.repeats, 5))
  out = {'gin_file': gin_file, 'dtype': str(run['target'][0].config.dtype),
         'cpu_kernels': config.cpu_kernels, 'gamma': gamma, 'call_costs': costs, 'rows': {}}
  for name in decodes:
    seconds = {region: timings.median[f'{name}/{region}']
               for region in ('runner', 'generate', 'program', 'prefill')}
    counts = _calls(timings.outputs[f'{name}/program'])
    step = 't_target_step' if name == 'AR' else f't_verify_{gamma + 1}'
    out['rows'][name] = itemize(seconds, counts, costs, step, len(rows))
  ar, spec = out['rows']['AR'], out['rows']['speculative']
  out['speedup'] = ar['batch_seconds'] / spec['batch_seconds'] * (
      spec['tokens_per_batch'] / ar['tokens_per_batch'])
  return out


def measure(args, script: str) -> Dict[str, Any]:
  del script
  return {'files': [measure_file(f, args) for f in args.gin_files.split(',')],
          'num_examples': args.num_examples}


def render(report: harness.Report) -> List[str]:
  lines = report.header(
      "Where a runner batch's time goes (batch 1)",
      f"{report['num_examples']} inputs of each run file, every region timed over all of "
      f"them, median of {report['args']['repeats']} interleaved repeats; ms per batch. "
      'calls: counts times the call costs measured alone; loop work: the program beyond '
      'its prefill and calls; outside program: generate less the program (checks, keys, '
      "weight lookup); model wrapper: the runner's region less generate; explained: the "
      "parts measured alone over the runner's time. research/measure/call_parts.py.")
  for f in report['files']:
    lines += ['', f"## {f['gin_file']} ({f['dtype']}, {f['cpu_kernels']}, gamma {f['gamma']}): "
              f"speedup {f['speedup']:.2f}x", '']
    lines += harness.table(
        ['decode', 'batch ms', 'tokens', *PARTS, 'explained'],
        [[name, f"{r['batch_seconds'] * 1e3:.2f}", f"{r['tokens_per_batch']:.1f}",
          *(f"{r['parts'][p] * 1e3:.2f}" for p in PARTS), f"{r['explained']:.2f}"]
         for name, r in f['rows'].items()], 'lrr' + 'r' * len(PARTS) + 'r')
  return lines


main = measurement.Measurement(
    'demo_parts', __doc__, measure, render, repeats=3,
    flags=dict(num_examples=100,
               gin_files=dict(default='configs/demo.gin,configs/demo_bf16.gin',
                              help='comma-separated run files, each itemized'))).main
