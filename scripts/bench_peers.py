"""Ours vs Hugging Face on the demo weights: AR, assisted / speculative, greedy and sampling.

  flock /tmp/specdec_bench.lock python scripts/bench_peers.py --num_examples 20

The demo target and draft (checkpoints/demo) are converted to HF
`T5ForConditionalGeneration` (PyTorch CPU, torch.set_num_threads(--threads)); first the
converted target's logits are checked against ours on one input. Then, on the same
--task inputs at batch size 1, it times interleaved in one process (median of --repeats):
HF `generate` greedy and sampling (t=1, no top-k/p), HF assisted generation
(`assistant_model=`, --gamma draft tokens per call, constant schedule) greedy and
sampling, and ours (specdec_t5x.generate) AR and speculative at the same gamma.
Reports tokens/s, speedups, tokens per target call (HF: target forward calls counted by
a forward hook) and how many greedy outputs agree across systems.
Writes results/peers.json and results/peers.md.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import transformers

from specdec_t5x.algorithm import batching
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.integration.hf_convert import hf_model_from_params
from specdec_t5x.research import evaluation, harness, speed


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


class HFRunner:
  """HF generate over the inputs one at a time; counts target forward calls."""

  def __init__(self, hf, inputs, max_len, sample, assistant=None, seed=0):
    self.hf, self.inputs, self.max_len, self.sample = hf, inputs, max_len, sample
    self.assistant, self.seed, self.calls, self.tokens = assistant, seed, 0, None
    hf.register_forward_hook(self._hook)
    self._counting = False

  def _hook(self, *unused):
    if self._counting:
      self.calls += 1

  def __call__(self):
    self.calls, self.tokens, self._counting = 0, [], True
    kw = dict(max_new_tokens=self.max_len, num_beams=1, decoder_start_token_id=0,
              eos_token_id=1, pad_token_id=0, do_sample=self.sample)
    if self.sample:
      kw.update(temperature=1.0, top_k=0, top_p=1.0)
    if self.assistant is not None:
      kw['assistant_model'] = self.assistant
    with torch.no_grad():
      for i, ids in enumerate(self.inputs):
        torch.manual_seed(self.seed + i)
        # A lazily sized cache: transformers 5 sizes a config-built cache by num_layers (the
        # encoder's), which breaks our decoder-heavy target (3 encoder, 4 decoder layers).
        cache = transformers.EncoderDecoderCache(transformers.DynamicCache(),
                                                 transformers.DynamicCache())
        out = self.hf.generate(torch.from_numpy(ids[None].astype(np.int64)),
                               past_key_values=cache, **kw)[0, 1:]
        out = out.numpy().astype(np.int32)
        stop = np.flatnonzero(out == 1)
        self.tokens.append(out[:stop[0] + 1] if stop.size else out[out != 0])
    self._counting = False
    return self.tokens


def main(argv=None):
  ap = harness.parser(__doc__, harness.results_path(__file__, 'peers'), repeats=3)
  ap.add_argument('--target', default='demo_target')
  ap.add_argument('--draft', default='demo_draft_m')
  ap.add_argument('--task', default='ende')
  ap.add_argument('--num_examples', type=int, default=20)
  ap.add_argument('--max_len', type=int, default=64)
  ap.add_argument('--gamma', type=int, default=3)
  ap.add_argument('--threads', type=int, default=2)
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
  enc = batching.pad_batch(inputs)  # speed.Decoder runs each row at its length bucket
  check = {name: logits_check(m[0], m[1], hf, inputs[0], examples[0].targets)
           for name, m, hf in (('target', target, hf_t), ('draft', draft, hf_d))}
  print('relative max |logit difference| ours vs HF:', check, file=sys.stderr)
  if max(check.values()) > 1e-3:
    raise SystemExit(f'Converted HF models disagree with ours: {check}')

  greedy, sample = DecodeConfig(gamma=args.gamma), DecodeConfig(1.0, gamma=args.gamma)
  fns = {
      'hf_greedy': HFRunner(hf_t, inputs, args.max_len, False),
      'hf_assisted_greedy': HFRunner(hf_t, inputs, args.max_len, False, hf_d),
      'ours_ar_greedy': speed.Decoder(target, None, enc, args.max_len, greedy),
      'ours_spec_greedy': speed.Decoder(target, draft, enc, args.max_len, greedy),
      'hf_sample': HFRunner(hf_t, inputs, args.max_len, True),
      'hf_assisted_sample': HFRunner(hf_t, inputs, args.max_len, True, hf_d),
      'ours_ar_sample': speed.Decoder(target, None, enc, args.max_len, sample),
      'ours_spec_sample': speed.Decoder(target, draft, enc, args.max_len, sample),
  }
  # Each HF runner hooks hf_t; only the running one counts (its _counting flag).
  timings = harness.interleaved(fns, args.repeats)
  med = timings.median
  systems = {}
  for name, fn in fns.items():
    tokens = fn.tokens
    n = int(sum(len(t) for t in tokens))
    calls = fn.calls if isinstance(fn, HFRunner) else int(fn.stats['target_calls'].sum())
    systems[name] = {'tokens': n, 'seconds_median': med[name], 'tokens_per_s': n / med[name],
                     'target_calls': calls, 'tokens_per_target_call': n / calls}
  for mode in ('greedy', 'sample'):
    for name in fns:
      if name.endswith(mode):
        base = systems[f'hf_{mode}']['tokens_per_s']
        systems[name]['speed_vs_hf_' + mode] = systems[name]['tokens_per_s'] / base
        systems[name]['speed_vs_ours_ar'] = (systems[name]['tokens_per_s'] /
                                             systems[f'ours_ar_{mode}']['tokens_per_s'])
  ref = fns['ours_ar_greedy'].tokens
  agree = {name: int(sum(np.array_equal(a, b) for a, b in zip(ref, fns[name].tokens)))
           for name in fns if name.endswith('greedy')}
  report = harness.Report(__file__, args, argv, torch=torch.__version__,
                          transformers=transformers.__version__,
                          torch_threads=torch.get_num_threads())
  report.data.update(logits_relative_max_diff=check, systems=systems,
                     greedy_agreement_with_ours_ar=agree, num_examples=len(inputs),
                     raw_times_s=timings.seconds)
  text = report.write(report.header(
      'Ours vs Hugging Face on the demo weights (CPU, batch 1)',
      f"Target {args.target}, draft {args.draft}, task {args.task}, {len(inputs)} inputs, "
      f"at most {args.max_len} tokens, gamma {args.gamma} (HF assisted: constant "
      f"num_assistant_tokens={args.gamma}). Converted HF logits vs ours: relative max "
      f"difference {max(check.values()):.1e}.") +
      harness.table(['system', 'tokens', 'tokens/s', 'vs HF same mode', 'vs ours AR',
                     'tokens/target call'],
                    [[name, s['tokens'], f"{s['tokens_per_s']:.1f}",
                      f"{s.get('speed_vs_hf_greedy', s.get('speed_vs_hf_sample')):.2f}x",
                      f"{s['speed_vs_ours_ar']:.2f}x", f"{s['tokens_per_target_call']:.2f}"]
                     for name, s in systems.items()]) +
      ['', f'Greedy outputs identical to ours AR (of {len(inputs)}): ' +
       ', '.join(f'{k} {v}' for k, v in agree.items())])
  print(text)
  return report.data

if __name__ == '__main__':
  main()
