"""Ours vs Hugging Face and CTranslate2 on the demo weights, batch 1, CPU.

  flock /tmp/specdec_bench.lock python scripts/bench_peers.py --num_examples 20

The demo target and draft (checkpoints/demo) are converted to HF
`T5ForConditionalGeneration` (PyTorch CPU, torch.set_num_threads(--threads)); first the
converted target's logits are checked against ours on one input. Then, on the same
--task inputs at batch size 1, it times interleaved in one process (median of --repeats):
HF `generate` greedy and sampling (t=1, no top-k/p), HF assisted generation
(`assistant_model=`, --gamma draft tokens per call, constant schedule) greedy and
sampling, ours (specdec_t5x.generate) AR and speculative at the same gamma, and
CTranslate2 greedy (the converted HF model through CTranslate2's own converter; float32
and int8 weights, --ct2_threads intra-op threads each; it has no encoder-decoder
speculation).
Reports tokens/s, speedups, tokens per target call (HF: target forward calls counted by
a forward hook) and how many greedy outputs agree across systems.
Writes results/peers.json and results/peers.md.
"""

from __future__ import annotations

import sys
import tempfile

import ctranslate2
import numpy as np
import torch
import transformers

from specdec_t5x.algorithm import batching
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.integration.hf_convert import hf_model_from_params
from specdec_t5x.research.measure import evaluation, grid, peers
from specdec_t5x.research.results import harness


def to_hf(config, params) -> transformers.T5ForConditionalGeneration:
  """Our model as a HF model with the same weights (hf_convert.hf_model_from_params)."""
  return hf_model_from_params(params, config)


def logits_check(module, params, hf, enc: np.ndarray, dec: np.ndarray) -> float:
  """Max |ours - HF| / max |HF| of teacher-forced logits on one example."""
  dec_in = np.concatenate([[0], dec[:-1]])[None].astype(np.int32)
  ours = np.asarray(module.apply({'params': params}, enc[None], dec_in))
  with torch.no_grad():
    theirs = hf(input_ids=torch.from_numpy(enc[None].astype(np.int64)),
                decoder_input_ids=torch.from_numpy(dec_in.astype(np.int64))).logits.numpy()
  return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def main(argv=None):
  ap = harness.parser(__doc__, harness.results_path(__file__, 'peers'), repeats=3)
  ap.add_argument('--target', default='demo_target')
  ap.add_argument('--draft', default='demo_draft_m')
  ap.add_argument('--task', default='ende')
  ap.add_argument('--num_examples', type=int, default=20)
  ap.add_argument('--max_len', type=int, default=64)
  ap.add_argument('--gamma', type=int, default=3)
  ap.add_argument('--threads', type=int, default=2, help='PyTorch threads')
  ap.add_argument('--ct2_threads', default='1,2', help='CTranslate2 intra-op threads to time')
  ap.add_argument('--ct2_types', default='float32,int8', help='CTranslate2 weight types')
  args = ap.parse_args(argv)
  torch.set_num_threads(args.threads)

  target, draft = evaluation.load_model(args.target), evaluation.load_model(args.draft)
  hf_t, hf_d = to_hf(target[0].config, target[1]), to_hf(draft[0].config, draft[1])
  for assistant in (hf_d,):
    assistant.generation_config.num_assistant_tokens = args.gamma
    assistant.generation_config.num_assistant_tokens_schedule = 'constant'
    assistant.generation_config.assistant_confidence_threshold = 0.0  # always gamma drafts
  examples = evaluation.load_examples(args.task, args.num_examples)
  inputs = [e.inputs for e in examples]
  enc = batching.pad_batch(inputs)  # grid.Decoder runs each row at its length bucket
  check = {name: logits_check(m[0], m[1], hf, inputs[0], examples[0].targets)
           for name, m, hf in (('target', target, hf_t), ('draft', draft, hf_d))}
  print('relative max |logit difference| ours vs HF:', check, file=sys.stderr)
  if max(check.values()) > 1e-3:
    raise SystemExit(f'Converted HF models disagree with ours: {check}')

  greedy, sample = DecodeConfig(gamma=args.gamma), DecodeConfig(1.0, gamma=args.gamma)
  fns = {
      'hf_greedy': peers.HFRunner(hf_t, inputs, args.max_len, False),
      'hf_assisted_greedy': peers.HFRunner(hf_t, inputs, args.max_len, False, hf_d),
      'ours_ar_greedy': grid.Decoder(target, None, enc, args.max_len, greedy),
      'ours_spec_greedy': grid.Decoder(target, draft, enc, args.max_len, greedy),
      'hf_sample': peers.HFRunner(hf_t, inputs, args.max_len, True),
      'hf_assisted_sample': peers.HFRunner(hf_t, inputs, args.max_len, True, hf_d),
      'ours_ar_sample': grid.Decoder(target, None, enc, args.max_len, sample),
      'ours_spec_sample': grid.Decoder(target, draft, enc, args.max_len, sample),
  }
  with tempfile.TemporaryDirectory() as ct2_dir:  # the converted CTranslate2 models
    for kind in args.ct2_types.split(','):
      path = peers.ctranslate2_model(hf_t, evaluation.DEMO_VOCAB, ct2_dir, kind)
      for threads in harness.ints(args.ct2_threads):
        fns[f'ct2_{kind}_{threads}thread_greedy'] = peers.CT2Runner(
            path, inputs, args.max_len, threads, kind)
    # Each HF runner hooks hf_t; only the running one counts (its _counting flag).
    timings = harness.interleaved(fns, args.repeats)
  med = timings.median
  systems = {}
  for name, fn in fns.items():
    tokens = fn.tokens
    n = int(sum(len(t) for t in tokens))
    calls = (int(fn.stats['target_calls'].sum()) if isinstance(fn, grid.Decoder)
             else fn.calls)  # None: CTranslate2 does not say
    systems[name] = {'tokens': n, 'seconds_median': med[name], 'tokens_per_s': n / med[name],
                     'target_calls': calls, 'tokens_per_target_call': calls and n / calls}
  for mode in ('greedy', 'sample'):
    for name in fns:
      if name.endswith(mode):
        base = systems[f'hf_{mode}']['tokens_per_s']
        systems[name]['speed_vs_hf_' + mode] = systems[name]['tokens_per_s'] / base
        systems[name]['speed_vs_ours_ar'] = (systems[name]['tokens_per_s'] /
                                             systems[f'ours_ar_{mode}']['tokens_per_s'])
  ref = fns['ours_ar_greedy'].tokens
  agree = {name: peers.agreement(ref, fns[name].tokens) for name in fns
           if name.endswith('greedy')}
  report = harness.Report(__file__, args, argv, torch=torch.__version__,
                          transformers=transformers.__version__,
                          ctranslate2=ctranslate2.__version__,
                          torch_threads=torch.get_num_threads())
  report.data.update(logits_relative_max_diff=check, systems=systems,
                     greedy_agreement_with_ours_ar=agree, num_examples=len(inputs),
                     raw_times_s=timings.seconds)
  text = report.write(report.header(
      'Ours vs Hugging Face and CTranslate2 on the demo weights (CPU, batch 1)',
      f"Target {args.target}, draft {args.draft}, task {args.task}, {len(inputs)} inputs, "
      f"at most {args.max_len} tokens, gamma {args.gamma} (HF assisted: constant "
      f"num_assistant_tokens={args.gamma}). Converted HF logits vs ours: relative max "
      f"difference {max(check.values()):.1e}.") +
      harness.table(['system', 'tokens', 'tokens/s', 'vs HF same mode', 'vs ours AR',
                     'tokens/target call'],
                    [[name, s['tokens'], f"{s['tokens_per_s']:.1f}",
                      f"{s.get('speed_vs_hf_greedy', s.get('speed_vs_hf_sample')):.2f}x",
                      f"{s['speed_vs_ours_ar']:.2f}x", harness.fmt(s['tokens_per_target_call'])]
                     for name, s in systems.items()]) +
      ['', f'Greedy outputs identical to ours AR (of {len(inputs)}): ' +
       ', '.join(f'{k} {v}' for k, v in agree.items())])
  print(text)
  return report.data

if __name__ == '__main__':
  main()
