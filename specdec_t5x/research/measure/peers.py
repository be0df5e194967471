"""Ours vs Hugging Face and CTranslate2 on the demo weights, batch 1, CPU.

  flock /tmp/specdec_bench.lock python scripts/compare_decodes.py --experiment=peers \
      --num_examples 20

The demo target and draft (checkpoints/demo) are converted to HF
`T5ForConditionalGeneration` (PyTorch CPU, torch.set_num_threads(--threads);
hf_convert.hf_model_from_params); first the converted target's logits are checked against
ours on one input. Then, on the same --task inputs at batch size 1, it times interleaved in
one process (median of --repeats): HF `generate` greedy and sampling (t=1, no top-k/p), HF
assisted generation (`assistant_model=`, --gamma draft tokens per call, constant schedule)
greedy and sampling, ours (specdec_t5x.generate) AR and speculative at the same gamma, and
CTranslate2 greedy (the converted HF model through CTranslate2's own converter; float32
and int8 weights, --ct2_threads intra-op threads each; it has no encoder-decoder
speculation). Reports tokens/s, speedups, tokens per target call (HF: target forward calls
counted by a forward hook) and how many greedy outputs agree across systems.
Writes results/peers.json and results/peers.md.

Each runner here decodes a list of encoder inputs one at a time (batch 1) when called, and
keeps the last call's tokens per input (ending with EOS where one was produced, as ours)
and its target forward calls (CTranslate2 does not expose them: None).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from specdec_t5x.algorithm import batching
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.integration import extras, hf_convert
from specdec_t5x.research.measure import evaluation, grid, measurement
from specdec_t5x.research.results import harness

EOS, PAD = 1, 0


def _cut(row: np.ndarray) -> np.ndarray:
  """A generated row up to and including its first EOS (padding dropped if none)."""
  stop = np.flatnonzero(row == EOS)
  return row[:stop[0] + 1] if stop.size else row[row != PAD]


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
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    self.calls, self.tokens, self._counting = 0, [], True
    kw = dict(max_new_tokens=self.max_len, num_beams=1, decoder_start_token_id=PAD,
              eos_token_id=EOS, pad_token_id=PAD, do_sample=self.sample)
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
        self.tokens.append(_cut(out.numpy().astype(np.int32)))
    self._counting = False
    return self.tokens


def ctranslate2_model(hf, vocab_path: str, out_dir: str, quantization: str) -> str:
  """Converts a Hugging Face T5 (`hf`, ours converted) with its SentencePiece vocabulary
  into a CTranslate2 model directory under out_dir with weights of `quantization`
  ('float32', 'int8', ...) by CTranslate2's own Transformers converter; returns the path.
  Raises if the converted vocabulary does not give each piece the SentencePiece id."""
  import ctranslate2  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  pieces = _pieces(vocab_path)
  path = os.path.join(out_dir, f'ct2_{quantization}')
  with tempfile.TemporaryDirectory() as hf_dir:
    hf.save_pretrained(hf_dir)
    transformers.T5Tokenizer(vocab=pieces, extra_ids=0).save_pretrained(hf_dir)
    ctranslate2.converters.TransformersConverter(hf_dir).convert(
        path, quantization=quantization, force=True)
  converted = model_vocabulary(path)
  if converted[:len(pieces)] != [p for p, _ in pieces]:
    raise ValueError(f'CTranslate2 model {path}: its vocabulary does not follow the '
                     f'SentencePiece ids of {vocab_path}')
  return path


def _pieces(vocab_path: str) -> List[Tuple[str, float]]:
  """(piece, score) by id of a SentencePiece model."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  sp = spm.SentencePieceProcessor(model_file=vocab_path)
  return [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]


def model_vocabulary(path: str) -> List[str]:
  """A CTranslate2 model's tokens by id (its shared vocabulary file)."""
  with open(os.path.join(path, 'shared_vocabulary.json'), encoding='utf-8') as f:
    return json.load(f)


class CT2Runner:
  """CTranslate2 greedy decoding (beam 1) over the inputs one at a time.

  `model_path`: a ctranslate2_model directory; `threads`: its intra-op threads. Token ids
  go in and out through the model's vocabulary (CTranslate2 takes tokens as strings)."""

  def __init__(self, model_path: str, inputs: Sequence[np.ndarray], max_len: int,
               threads: int, compute_type: str):
    import ctranslate2  # pylint: disable=g-import-not-at-top
    self.translator = ctranslate2.Translator(model_path, device='cpu', inter_threads=1,
                                             intra_threads=threads, compute_type=compute_type)
    self.pieces = model_vocabulary(model_path)
    self.ids = {p: i for i, p in enumerate(self.pieces)}
    # The encoder input without padding, EOS included as ours feeds it.
    self.sources = [[self.pieces[t] for t in row[row != PAD]] for row in inputs]
    self.max_len = max_len
    self.calls: Optional[int] = None
    self.tokens: Optional[List[np.ndarray]] = None

  def __call__(self) -> List[np.ndarray]:
    self.tokens = []
    for source in self.sources:
      hyp = self.translator.translate_batch(
          [source], beam_size=1, max_decoding_length=self.max_len)[0].hypotheses[0]
      ids = [self.ids[p] for p in hyp]
      if len(ids) < self.max_len:  # stopped at EOS, which CTranslate2 leaves out
        ids.append(EOS)
      self.tokens.append(np.asarray(ids, np.int32))
    return self.tokens


def agreement(reference: Sequence[np.ndarray], tokens: Sequence[np.ndarray]) -> int:
  """How many rows of `tokens` equal `reference`'s."""
  return int(sum(np.array_equal(a, b) for a, b in zip(reference, tokens)))


def logits_check(module, params, hf, enc: np.ndarray, dec: np.ndarray) -> float:
  """Max |ours - HF| / max |HF| of teacher-forced logits on one example."""
  import torch  # pylint: disable=g-import-not-at-top
  dec_in = np.concatenate([[0], dec[:-1]])[None].astype(np.int32)
  ours = np.asarray(module.apply({'params': params}, enc[None], dec_in))
  with torch.no_grad():
    theirs = hf(input_ids=torch.from_numpy(enc[None].astype(np.int64)),
                decoder_input_ids=torch.from_numpy(dec_in.astype(np.int64))).logits.numpy()
  return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def setup(args) -> Dict[str, Any]:
  """PyTorch's threads set to --threads; the libraries' versions, for the environment."""
  ctranslate2, torch, transformers = (extras.need(m, 'The peer benchmark') for m in (
      'ctranslate2', 'torch', 'transformers'))
  torch.set_num_threads(args.threads)
  return dict(torch=torch.__version__, transformers=transformers.__version__,
              ctranslate2=ctranslate2.__version__, torch_threads=torch.get_num_threads())


def run(args, script: str) -> Dict[str, Any]:
  """Converts, checks and times every system (see the module docstring)."""
  target, draft = evaluation.load_model(args.target), evaluation.load_model(args.draft)
  hf_t = hf_convert.hf_model_from_params(target[1], target[0].config)
  hf_d = hf_convert.hf_model_from_params(draft[1], draft[0].config)
  hf_d.generation_config.num_assistant_tokens = args.gamma
  hf_d.generation_config.num_assistant_tokens_schedule = 'constant'
  hf_d.generation_config.assistant_confidence_threshold = 0.0  # always gamma drafts
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
      'hf_greedy': HFRunner(hf_t, inputs, args.max_len, False),
      'hf_assisted_greedy': HFRunner(hf_t, inputs, args.max_len, False, hf_d),
      'ours_ar_greedy': grid.Decoder(target, None, enc, args.max_len, greedy),
      'ours_spec_greedy': grid.Decoder(target, draft, enc, args.max_len, greedy),
      'hf_sample': HFRunner(hf_t, inputs, args.max_len, True),
      'hf_assisted_sample': HFRunner(hf_t, inputs, args.max_len, True, hf_d),
      'ours_ar_sample': grid.Decoder(target, None, enc, args.max_len, sample),
      'ours_spec_sample': grid.Decoder(target, draft, enc, args.max_len, sample),
  }
  with tempfile.TemporaryDirectory() as ct2_dir:  # the converted CTranslate2 models
    for kind in args.ct2_types.split(','):
      path = ctranslate2_model(hf_t, evaluation.DEMO_VOCAB, ct2_dir, kind)
      for threads in harness.ints(args.ct2_threads):
        fns[f'ct2_{kind}_{threads}thread_greedy'] = CT2Runner(
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
  agree = {name: agreement(ref, fns[name].tokens) for name in fns if name.endswith('greedy')}
  return dict(logits_relative_max_diff=check, systems=systems,
              greedy_agreement_with_ours_ar=agree, num_examples=len(inputs),
              raw_times_s=timings.seconds)


def render(report: harness.Report) -> List[str]:
  args, check, systems = report['args'], report['logits_relative_max_diff'], report['systems']
  agree, n = report['greedy_agreement_with_ours_ar'], report['num_examples']
  return report.header(
      'Ours vs Hugging Face and CTranslate2 on the demo weights (CPU, batch 1)',
      f"Target {args['target']}, draft {args['draft']}, task {args['task']}, {n} inputs, "
      f"at most {args['max_len']} tokens, gamma {args['gamma']} (HF assisted: constant "
      f"num_assistant_tokens={args['gamma']}). Converted HF logits vs ours: relative max "
      f"difference {max(check.values()):.1e}.") + harness.table(
          ['system', 'tokens', 'tokens/s', 'vs HF same mode', 'vs ours AR',
           'tokens/target call'],
          [[name, s['tokens'], f"{s['tokens_per_s']:.1f}",
            f"{s.get('speed_vs_hf_greedy', s.get('speed_vs_hf_sample')):.2f}x",
            f"{s['speed_vs_ours_ar']:.2f}x", harness.fmt(s['tokens_per_target_call'])]
           for name, s in systems.items()]) + [
      '', f'Greedy outputs identical to ours AR (of {n}): ' +
      ', '.join(f'{k} {v}' for k, v in agree.items())]


main = measurement.Measurement('peers', __doc__, run, render, repeats=3, setup=setup, flags=dict(
    target='demo_target', draft='demo_draft_m', task='ende', num_examples=20, max_len=64,
    gamma=3, threads=dict(type=int, default=2, help='PyTorch threads'),
    ct2_threads=dict(default='1,2', help='CTranslate2 intra-op threads to time'),
    ct2_types=dict(default='float32,int8', help='CTranslate2 weight types'))).main
