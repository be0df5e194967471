r"""Speculative decoding's efficiency against the ideal its call costs allow, and where the
loop's time goes, with the packed CPU kernel and with XLA's dot (batch 1 unless --batch;
demo family unless --random_target).

  flock /tmp/specdec_bench.lock python scripts/compare_decodes.py --experiment=loop_efficiency \
      --num_examples 12 --gammas 2,3,4 --temperatures 0,1   # results/loop_efficiency.*
  python scripts/compare_decodes.py --experiment=loop_efficiency --tiny --ladder_calls 600 \
      --out /tmp/loop                                       # tiny models
  flock /tmp/specdec_bench.lock python scripts/compare_decodes.py --experiment=loop_efficiency \
      --num_examples 16 --batch 8 --matmuls packed --out results/loop_efficiency_batch8
  python scripts/compare_decodes.py --experiment=loop_efficiency --random_target small \
      --num_examples 4 --max_len 32 --gammas 3 --temperatures 0 --matmuls packed \
      --out results/loop_efficiency_t5_1_1_small   # a T5 v1.1 size, random weights
  flock /tmp/specdec_bench.lock python scripts/compare_decodes.py --experiment=loop_efficiency \
      --drafts demo_feature_head_kd --gammas 1 --matmuls packed,packed_bf16 \
      --num_examples 12 --repeats 5 --out results/loop_efficiency_demo   # the demo's setting

Drafts (--drafts, comma-separated): demo_draft_m and the target itself (one set of
weights) by default; any model of checkpoints/demo by name (evaluation.load_model), among
them demo_feature_head_kd, the feature head configs/demo.gin decodes with (its
FeatureDraftConfig from its config.json, as the gin's). With --random_target, a T5 v1.1
target of that size and a 2+2-layer, 256-wide T5 v1.1 draft (random_small), random
weights, on random inputs (acceptance then means nothing; the efficiency does); --tiny:
small, self and head (a tiny feature head). --matmuls: packed (the CPU kernel, float32),
xla (XLA's dot), packed_bf16 (the bfloat16 kernels, the target and drafts computing in
bfloat16 on float32 params: configs/demo_bf16.gin's setting; without AVX-512 BF16 the
mode falls back, logged). For each draft, temperature and gamma, at one batch size (1:
each input alone) over the same inputs:
- measured: AR time / speculative time per generated token (timed interleaved);
- ideal end to end: grid.ideal_end_to_end from the calls each loop made and the call
  costs of grid.costs (each call's tokens the argmax of the last, as in any decode:
  timing.call_costs; a head's calls fed zero features), the paper's gamma one-token
  draft calls per step;
- efficiency = measured / ideal, with its 95% interval (the measured speedup's:
  timing.paired_speedup's bootstrap over the repeats' AR/speculative pairs, divided by the
  ideal; --repeats 1 gives a point); and the same with the draft calls as the loop makes
  them ("as made": each step's first draft call the re-feed, timed too: 2 tokens for a
  token draft, the verify window's gamma + 1 for a head);
- the ladder (loop_ladder): per iteration, the calls timed alone as identical calls, chained
  (each call's token from the last call's argmax), one synthetic iteration of both models' calls, and
  the real loop: the losses to chaining, to interleaving two models and to the loop's own
  work (a head's rungs read the target's features: loop_ladder);
- inside the loop, from XLA's profiler (loop_profile): per iteration, the target's calls,
  the draft's calls and the loop's own work (sampling, acceptance, bookkeeping), with the
  heaviest instructions of that work;
- the compiled while body's copies and transposes (hlo_loops) of the program run.
Writes {--out}.json and {--out}.md. Run on an idle machine: it times.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from tqdm import tqdm

from specdec_t5x.algorithm import api, batching, feature_draft, network, timing
from specdec_t5x.algorithm.cpu import modes, packing
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.research.measure import (evaluation, grid, hlo_loops, loop_ladder, loop_profile,
                                          measurement)
from specdec_t5x.research.results import harness

ModelAndParams = Any
# --matmuls: the kernel mode each names and the dtype the models then compute in
# ('packed_bf16': target and drafts in bfloat16, as configs/demo_bf16.gin runs the demo).
MATMULS = {'packed': ('packed', None), 'xla': ('xla', None),
           'packed_bf16': ('packed_bf16', 'bfloat16')}
DEFAULT_DRAFTS = {'demo': 'demo_draft_m,self', 'tiny': 'small,self',
                  'random': 'random_small,self'}


def _copies(target: ModelAndParams, draft: Optional[ModelAndParams], row: np.ndarray,
            max_len: int, config: DecodeConfig) -> Dict[str, Any]:
  """hlo_loops' summary of the compiled decode program for one batch of rows."""
  fn = api.compiled_program(target[0], draft and draft[0], max_len=max_len, config=config)
  args = (packing.decode_variables(*target),
          None if draft is None else packing.decode_variables(*draft),
          jnp.asarray(row), jax.random.PRNGKey(0), jnp.int32(1))
  smallest = min(m[0].config.num_heads * m[0].config.head_dim  # the smallest cache's elements
                 for m in (target, draft) if m is not None) * (max_len + 2) * row.shape[0]
  return hlo_loops.loop_traffic(fn.lower(*args).compile().as_text(), smallest).summary()


def refeeds(drafts: Dict[str, ModelAndParams], gammas: Sequence[int]) -> Dict[str, tuple]:
  """grid.costs' `extra`: each step's first draft call as the loop makes it, the 2-token
  re-feed of a token draft (t_draft_refeed_{name}) or a feature head's re-feed of the
  verify window, gamma + 1 tokens (t_draft_refeed_{name}_g{gamma}; drafting.feature_drafter)."""
  out = {}
  for name, (module, params) in drafts.items():
    if api.reads_features(module):
      out.update({f't_draft_refeed_{name}_g{g}': (module, params, g + 1) for g in gammas})
    else:
      out[f't_draft_refeed_{name}'] = (module, params, 2)
  return out


def refeed_at(cost: Dict[str, float], name: str, gamma: int) -> Dict[str, float]:
  """`cost` with t_draft_refeed_{name} the re-feed of the draft's steps at `gamma`."""
  at = cost.get(f't_draft_refeed_{name}_g{gamma}')
  return cost if at is None else dict(cost, **{f't_draft_refeed_{name}': at})


def measure(target: ModelAndParams, drafts: Dict[str, ModelAndParams], enc: np.ndarray,
            max_len: int, gammas: Sequence[int], temperatures: Sequence[float],
            repeats: int = 3, cost_calls: int = 32, cost_repeats: int = 5,
            ladder_calls: int = 16, batch: int = 1) -> Dict[str, Any]:
  """The rows of results/loop_efficiency for the current matmul (packed kernel or not).

  enc [N, L]: the inputs, decoded `batch` rows at a time (N a multiple of it) at their
  length buckets; every call cost, ladder rung and prefill is then a batch's, and the
  loop's target calls are its iterations (grid.Decoder.iterations). `ladder_calls`:
  iterations per timed run of each ladder rung (enough that a run lasts well beyond the
  machine's jitter: tiny models need thousands).
  """
  rows_in = [batching.trim_batch(enc[i:i + batch]) for i in range(0, len(enc), batch)]
  cache_len = max_len + max(gammas) + 1
  cost = grid.costs(target, drafts, enc, gammas, cost_calls, cost_repeats, max_len=max_len,
                    batch=batch, extra=refeeds(drafts, gammas))
  out: Dict[str, Any] = {'costs_s': cost, 'groups': []}
  prefill = {name: len(rows_in) * grid.prefill_per_sequence(model, rows_in, cache_len,
                                                            cost_repeats)
             for name, model in {'target': target, **drafts}.items()}
  out['prefill_s'] = prefill
  first = jnp.asarray(rows_in[0])
  out['ladder_s'] = {'ar': loop_ladder.rungs(target, None, first, 1, ladder_calls,
                                             repeats=cost_repeats, cache_len=cache_len)}
  out['ladder_s'].update({grid.key(name, g): loop_ladder.rungs(
      target, draft, first, g, ladder_calls, repeats=cost_repeats, cache_len=cache_len)
                          for name, draft in drafts.items() for g in gammas})
  for temp in temperatures:
    jax.clear_caches()  # the last group's programs: the JIT's memory mappings are bounded
    base = DecodeConfig(temperature=temp, gamma=1)
    timed = grid.time_grid(target, drafts, enc, max_len, gammas, base, repeats, batch=batch)
    ar, med = timed.ar, timed.median
    ar_tokens, ar_calls = ar.generated_tokens, float(ar.iterations)
    group = {'temperature': temp, 'ar_seconds': med['ar'], 'ar_tokens': ar_tokens,
             'ar_loop_s': loop_ladder.loop_seconds(med['ar'], prefill['target'], ar_calls),
             'ar_copies': _copies(target, None, rows_in[0], max_len, base), 'rows': []}
    group['ar_profile'] = loop_profile.profile(target, None, rows_in, max_len, base)
    for (name, g), dec in timed.decoders.items():
      spec_tokens, calls = dec.generated_tokens, float(dec.iterations)
      cost_g = refeed_at(cost, name, g)
      measured = timed.speedup(name, g)
      ideal = grid.ideal_end_to_end(len(rows_in), ar_calls, calls, g, cost, name) * (
          spec_tokens / ar_tokens)
      # The calls as the loop makes them: each step's first draft call the re-feed.
      as_made = grid.ideal_end_to_end(len(rows_in), ar_calls, calls, g, cost_g, name,
                                      refeed=True) * (spec_tokens / ar_tokens)
      ci = timed_ci(timed, name, g)  # the measured speedup's, over the repeats' pairs
      row = {
          'draft': name, 'gamma': g, 'tokens_per_target_call': dec.tokens_per_target_call,
          'speedup_measured': measured, 'speedup_measured_ci95': ci,
          'speedup_ideal_end_to_end': ideal, 'efficiency_end_to_end': measured / ideal,
          'efficiency_end_to_end_ci95': [x / ideal for x in ci],
          'speedup_ideal_as_made': as_made, 'efficiency_as_made': measured / as_made,
          'efficiency_as_made_ci95': [x / as_made for x in ci],
          'loop_s': loop_ladder.loop_seconds(med[grid.key(name, g)],
                                             prefill['target'] + prefill[name], calls),
          'copies': _copies(target, drafts[name], rows_in[0], max_len, base.replace(gamma=g))}
      row['profile'] = loop_profile.profile(target, drafts[name], rows_in, max_len,
                                            base.replace(gamma=g))
      row['alone_s'] = {'draft_calls': cost_g[f't_draft_refeed_{name}']
                                       + (g - 1) * cost[f't_draft_step_{name}'],
                        'verify': cost[f't_verify_{g + 1}']}
      group['rows'].append(row)
    out['groups'].append(group)
  return out


def timed_ci(timed: grid.Grid, name: str, gamma: int) -> List[float]:
  """The 95% interval of a decode's speedup per generated token (grid.Grid.rows:
  timing.paired_speedup's bootstrap over the repeats' AR/speculative pairs); one repeat
  gives a point."""
  return next(r['speedup_ci95'] for r in timed.rows() if (r['draft'], r['gamma']) == (name, gamma))


def in_dtype(model: ModelAndParams, dtype: str) -> ModelAndParams:
  """The model computing in `dtype` (its T5Config's or FeatureDraftConfig's dtype), its
  params unchanged (float32: configs/demo_bf16.gin restores them so)."""
  module, params = model
  return type(module)(dataclasses.replace(module.config, dtype=dtype)), params


def models_in(dtype: Optional[str], target: ModelAndParams,
              drafts: Dict[str, ModelAndParams]):
  """(target, drafts) computing in `dtype` (None: as loaded); a draft that is the target
  ('self') stays the target."""
  if dtype is None:
    return target, drafts
  new_target = in_dtype(target, dtype)
  return new_target, {name: new_target if d is target else in_dtype(d, dtype)
                      for name, d in drafts.items()}


def by_matmul(matmuls: Sequence[str], target: ModelAndParams,
              drafts: Dict[str, ModelAndParams], *args: Any, **kwargs: Any) -> Dict[str, Any]:
  """`measure` once per matmul (MATMULS: 'packed' the CPU kernel, 'xla' XLA's dot,
  'packed_bf16' the bfloat16 kernels with the models in bfloat16) as the default kernel
  mode, the JIT's programs cleared between them."""
  out = {}
  for matmul in tqdm(matmuls, desc='loop efficiency', unit='matmul'):
    if matmul not in MATMULS:
      raise ValueError(f'--matmuls takes {sorted(MATMULS)}, got {matmul!r}.')
    mode, dtype = MATMULS[matmul]
    jax.clear_caches()  # ~80 programs per matmul: freeing them keeps the JIT's mappings in bounds
    with modes.default_mode_as(mode):
      out[matmul] = measure(*models_in(dtype, target, drafts), *args, **kwargs)
  return out


def tiny_models():
  """A tiny random target (emb 32, 2 decoder layers), drafts {'small': a smaller one,
  'self': the target, 'head': a feature head reading its final and first-layer features},
  and 2 random inputs of 10 tokens (the test's models)."""
  def model(emb, layers, seed):
    cfg = network.T5Config(vocab_size=128, emb_dim=emb, num_heads=2, num_encoder_layers=1,
                           num_decoder_layers=layers, head_dim=8, mlp_dim=2 * emb,
                           mlp_activations=('gelu', 'linear'), dropout_rate=0.0)
    module = network.Transformer(cfg)
    return module, timing.random_params(module, seed, dtype=np.float32)
  target = model(32, 2, 0)
  head_cfg = feature_draft.FeatureDraftConfig(vocab_size=128, target_emb_dim=32, emb_dim=16,
                                              num_heads=2, head_dim=8, mlp_dim=32,
                                              feature_layers=(0,))
  head = (feature_draft.FeatureDraft(head_cfg),
          feature_draft.init_params(head_cfg, jax.random.PRNGKey(2), target[1]))
  enc = np.random.RandomState(0).randint(2, 128, size=(2, 10)).astype(np.int32)
  return target, {'small': model(16, 1, 1), 'self': target, 'head': head}, enc


def pick_drafts(available: Dict[str, ModelAndParams], names: str,
                load=None) -> Dict[str, ModelAndParams]:
  """--drafts (comma-separated) from `available`; a name not there comes from `load`
  (the demo's: evaluation.load_model, a T5 draft or a feature head by its config.json)."""
  out = {}
  for name in names.split(','):
    if name in available:
      out[name] = available[name]
    elif load is not None:
      out[name] = load(name)
    else:
      raise ValueError(f'--drafts: {name!r} is none of {sorted(available)}.')
  return out


def random_t5_1_1(size: str, num_examples: int):
  """A random-weight T5 v1.1 target of `size`, a small random draft of its vocabulary, and
  random inputs (24 tokens): the accounting at a real model's shapes."""
  def model(cfg, seed):  # float32 weights of bfloat16 values, as a T5X checkpoint restores
    module = network.Transformer(cfg)
    params = timing.random_params(module, seed, dtype=jnp.bfloat16)
    return module, jax.tree_util.tree_map(lambda x: x.astype(jnp.float32), params)
  target = model(network.t5_1_1_config(size), 0)
  draft = model(network.t5_1_1_config(size, emb_dim=256, num_heads=4, num_encoder_layers=2,
                                      num_decoder_layers=2, mlp_dim=1024), 1)
  vocab = target[0].config.vocab_size
  enc = np.random.RandomState(0).randint(2, vocab, size=(num_examples, 24)).astype(np.int32)
  return target, {'random_small': draft, 'self': target}, enc


def _ms(x):
  return harness.fmt(None if x is None else 1e3 * x, '.3f')


def _with_ci(value: Optional[float], ci: Optional[Sequence[float]]) -> str:
  """'0.85 (0.80-0.90)': a figure and its 95% interval (older reports: the figure)."""
  if value is None or not ci:
    return harness.fmt(value, '.2f')
  return f'{value:.2f} ({ci[0]:.2f}-{ci[1]:.2f})'


def _heavy(profile) -> str:
  return ', '.join(f'{name} {1e6 * s:.0f}' for name, s in profile['top_loop_work'][:3])


def render(report: harness.Report) -> List[str]:
  lines = report.header(
      'Loop efficiency: measured vs ideal, and where each iteration goes',
      f'Batch {report["args"].get("batch", 1)}. measured = AR time / speculative time per '
      'generated token (interleaved); '
      'ideal e2e = grid.ideal_end_to_end from the target calls each loop made and the call '
      'costs of timing.call_costs (prefill included; each call\'s tokens the argmax of the '
      'last, as in any decode; a feature head\'s calls fed zero features); efficiency = '
      'measured / ideal, in brackets its 95% interval (the measured speedup\'s, '
      'timing.paired_speedup\'s bootstrap over the repeats\' AR/speculative pairs, over the '
      'ideal: with one repeat a point); as made: the same with each '
      'step\'s first draft call the re-feed the loop makes (a token draft\'s 2 tokens: the '
      'last draft of a fully accepted block was never fed; a head\'s gamma + 1: the verify '
      'window with the target\'s features) instead of a one-token call. A feature head\'s rungs '
      'feed it the target\'s features (loop_ladder). '
      'The ladder, in '
      'ms per loop iteration (one target call): alone = gamma t_draft + t_verify, each call '
      'timed in a loop of identical calls; chained = the same calls, each token the argmax '
      'of the call before (as in any decode); interleaved = gamma chained draft calls and the '
      'verify call in one loop; loop = the real loop (its decode time less prefill, per '
      'target call). The excess of each rung over the one before: chaining, two models, and '
      'the loop\'s own work (the draft\'s re-feed, acceptance, sampling, statistics). '
      'copies: copies/transposes in the compiled while body (cache-sized ones in brackets). '
      'research/measure/loop_ladder.py.')
  lines += [f'Target: {report["target"]}; drafts: {", ".join(report["drafts"])}.', '']
  for matmul, res in report['matmuls'].items():
    dtype = MATMULS.get(matmul, (None, None))[1]
    lines += [f'## {matmul}' + (f' (target and drafts in {dtype})' if dtype else ''), '']
    ar = res['ladder_s']['ar']
    for group in res['groups']:
      lines += [f'### temperature {group["temperature"]:g}', '',
                f'AR per step: alone {_ms(ar["alone"])} ms, chained {_ms(ar["chained"])}, '
                f'loop {_ms(group["ar_loop_s"])}; while body copies '
                f'{group["ar_copies"]["copies_and_transposes"]} '
                f'({len(group["ar_copies"]["whole_buffer"])} cache-sized).', '']
      rows = []
      for r in group['rows']:
        lad = res['ladder_s'][f'{r["draft"]}_g{r["gamma"]}']
        rows.append([r['draft'], r['gamma'], f'{r["tokens_per_target_call"]:.2f}',
                     f'{r["speedup_measured"]:.2f}x', f'{r["speedup_ideal_end_to_end"]:.2f}x',
                     _with_ci(r['efficiency_end_to_end'], r.get('efficiency_end_to_end_ci95')),
                     _with_ci(r.get('efficiency_as_made'), r.get('efficiency_as_made_ci95')),
                     _ms(lad['alone']), _ms(lad['chained']),
                     _ms(lad['interleaved']), _ms(r['loop_s']),
                     _ms(lad['chained'] - lad['alone']), _ms(lad['interleaved'] - lad['chained']),
                     _ms(r['loop_s'] - lad['interleaved']),
                     f'{r["copies"]["copies_and_transposes"]} ({len(r["copies"]["whole_buffer"])})'])
      lines += harness.table(['draft', 'gamma', 'tokens/call', 'measured', 'ideal e2e',
                              'efficiency', 'as made', 'alone', 'chained', 'interleaved',
                              'loop', '+chaining', '+two models', '+loop work', 'copies'],
                             rows, 'llrrrrrrrrrrrrr') + ['']
      lines += ['Inside the loop, from XLA\'s profiler (ms per iteration; its markers slow each '
                'instruction a little): target / draft calls (alone: the verify call; the '
                'draft\'s re-feed and gamma - 1 steps), the loop\'s own work and its '
                'heaviest parts, their sum against the unprofiled loop.', '']
      prof = [['AR', 1, _ms(group['ar_profile']['per_iteration_s']['target_calls']), '',
               _ms(group['ar_profile']['per_iteration_s']['loop_work']),
               _ms(sum(group['ar_profile']['per_iteration_s'].values())),
               _ms(group['ar_loop_s']), _heavy(group['ar_profile'])]]
      for r in group['rows']:
        part = r['profile']['per_iteration_s']
        prof.append([r['draft'], r['gamma'],
                     f'{_ms(part["target_calls"])} ({_ms(r["alone_s"]["verify"])})',
                     f'{_ms(part["draft_calls"])} ({_ms(r["alone_s"]["draft_calls"])})',
                     _ms(part['loop_work']), _ms(sum(part.values())), _ms(r['loop_s']),
                     _heavy(r['profile'])])
      lines += harness.table(['draft', 'gamma', 'target calls (alone)', 'draft calls (alone)',
                              'loop work', 'sum', 'loop', 'heaviest loop work (us)'],
                             prof, 'llrrrrrl') + ['']
  return lines


def run(args, script: str) -> Dict[str, Any]:
  """The target, the drafts and the flags' inputs (--tiny, --random_target or the demo),
  then `by_matmul` over --matmuls."""
  load = None
  if args.tiny:
    (target, drafts, enc), name, setting = tiny_models(), 'tiny random', 'tiny'
  elif args.random_target:
    target, drafts, enc = random_t5_1_1(args.random_target, args.num_examples)
    name, setting = f'random-weight T5 v1.1 {args.random_target}', 'random'
  else:
    name, target, setting = 'demo_target', evaluation.load_model('demo_target'), 'demo'
    drafts, load = {'self': target}, evaluation.load_model
    enc = batching.pad_batch([e.inputs for e in evaluation.load_examples('ende',
                                                                         args.num_examples)])
  drafts = pick_drafts(drafts, args.drafts or DEFAULT_DRAFTS[setting], load)
  for draft in drafts.values():
    api.check_feature_draft(target[0], draft[0])  # a head made for another target: say so
  cfg = target[0].config
  return {'target': (f'{name} (emb {cfg.emb_dim}, {cfg.num_decoder_layers} decoder layers, '
                     f'vocab {cfg.vocab_size})'),
          'drafts': list(drafts),
          'matmuls': by_matmul(args.matmuls.split(','), target, drafts, enc, args.max_len,
                               args.gammas, args.temperatures, args.repeats,
                               cost_repeats=args.repeats, ladder_calls=args.ladder_calls,
                               batch=args.batch)}


main = measurement.Measurement('loop_efficiency', __doc__, run, render, repeats=3, flags=dict(
    num_examples=12, gammas=dict(type=harness.ints, default=[2, 3, 4]),
    temperatures=[0.0, 1.0], max_len=64,
    matmuls=dict(default='packed,xla', help='packed (the CPU kernel, float32), xla (XLA\'s '
                 'dot), packed_bf16 (the bfloat16 kernels, target and drafts in bfloat16 as '
                 'configs/demo_bf16.gin)'),
    drafts=dict(default=None, help='comma-separated; the demo: demo_draft_m, self (the '
                'target), demo_feature_head_kd (the demo\'s feature head) or any '
                'checkpoints/demo model (default demo_draft_m,self); --tiny: small, self, '
                'head (default small,self); --random_target: random_small, self'),
    ladder_calls=dict(type=int, default=16, help='iterations per timed run of each ladder '
                      'rung (tiny models: thousands, or a run is shorter than the machine\'s '
                      'jitter)'),
    tiny=dict(action='store_true', help='random tiny models (the test)'),
    random_target=dict(choices=sorted(network.T5_1_1_SIZES),
                       help='a random-weight T5 v1.1 target of this size instead of the demo'),
    batch=dict(default=1, help='rows decoded together (--num_examples a multiple of it); '
               'every call, rung and prefill is then a batch\'s'))).main
