"""Other systems decoding the same weights, for scripts/bench_peers.py: Hugging Face
transformers (PyTorch; plain and assisted generation) and CTranslate2 (the CPU engine
users pick for encoder-decoder inference; it has no encoder-decoder speculation).

Each runner decodes a list of encoder inputs one at a time (batch 1) when called, and
keeps the last call's tokens per input (ending with EOS where one was produced, as ours)
and its target forward calls (CTranslate2 does not expose them: None).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import List, Optional, Sequence, Tuple

import numpy as np

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
