"""Quality of each demo model on the committed test samples (greedy, target-only).

  python scripts/eval_demo_models.py [--num_examples 300]

Decodes data/demo/{ende,summarize}_test.tsv with demo_target, demo_draft_m and
demo_draft_s alone (greedy, 64 tokens) and scores BLEU (ende) / ROUGE (summarize).
Writes results/demo_models.json and results/demo_models.md, the latter with the alpha
rows of results/alpha_demo.json (scripts/measure_alpha.py) beside the scores.
"""

import argparse
import json
import os

import numpy as np
import sentencepiece as spm
from tqdm import tqdm

from specdec_t5x.algorithm import batching, sampling
from specdec_t5x.integration import metrics
from specdec_t5x.research import benchmarking, evaluation

MODELS = ('demo_target', 'demo_draft_m', 'demo_draft_s')


def decode_text(sp, ids):
  return sp.decode([int(t) for t in ids if 1 < t < sp.get_piece_size()])


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--num_examples', type=int, default=300)
  ap.add_argument('--out', default='results/demo_models')
  args = ap.parse_args(argv)
  sp = spm.SentencePieceProcessor(model_file=evaluation.DEMO_VOCAB)
  scores = {}
  for task in tqdm(('ende', 'summarize'), desc='tasks'):
    examples = evaluation.load_examples(task, args.num_examples)
    enc = batching.pad_batch([e.inputs for e in examples])
    refs = [e.reference for e in examples]
    for name in MODELS:
      outs = evaluation.target_outputs(evaluation.load_model(name), enc,
                                       sampling.SamplingConfig(0.0), max_len=64, batch=32)
      preds = [decode_text(sp, o) for o in outs]
      fn = metrics.bleu if task == 'ende' else metrics.rouge
      scores[f'{task}/{name}'] = fn(refs, preds)
  alpha_path = 'results/alpha_demo.json'
  alpha = json.load(open(alpha_path)) if os.path.exists(alpha_path) else None
  result = {'command': 'python scripts/eval_demo_models.py ' + ' '.join(argv or []),
            'environment': benchmarking.environment(), 'num_examples': args.num_examples,
            'scores': scores}
  benchmarking.write_json(args.out + '.json', result)
  lines = ['# Demo family quality on the committed test samples', '',
           f"Command: `{result['command'].strip()}` (greedy, target-only, "
           f'{args.num_examples} examples per task).', '',
           '| model | params | EN->DE BLEU | summarize ROUGE-1 / 2 / Lsum |', '|---|---|---|---|']
  params = {'demo_target': '15.8M', 'demo_draft_m': '2.2M', 'demo_draft_s': '0.67M'}
  for name in MODELS:
    r = scores[f'summarize/{name}']
    lines.append(f"| {name} | {params[name]} | {scores[f'ende/{name}']['bleu']:.2f} | "
                 f"{r['rouge1']:.2f} / {r['rouge2']:.2f} / {r['rougeLsum']:.2f} |")
  lines += ['', 'Every draft\'s alpha against demo_target (paper Table 3 method: the mean of '
            'sum_x min(p, q) over the target\'s own generations; from `results/alpha_demo.json`, '
            'where the command, token counts and per-position alphas are):', '']
  if alpha is None:
    lines.append('(not measured yet: run scripts/measure_alpha.py)')
  else:
    cells = {(c['draft'], c['task'], c['temperature']): c['alpha'] for c in alpha['cells']}
    drafts = list(dict.fromkeys(c['draft'] for c in alpha['cells']))
    lines += ['| draft | EN->DE t=0 | EN->DE t=1 | summarize t=0 | summarize t=1 |',
              '|---|---|---|---|---|']
    for d in drafts:
      vals = [cells.get((d, t, temp)) for t in ('ende', 'summarize') for temp in (0.0, 1.0)]
      lines.append(f'| {d} | ' + ' | '.join('-' if v is None else f'{v:.2f}' for v in vals)
                   + ' |')
  benchmarking.write_text(args.out + '.md', '\n'.join(lines) + '\n')
  print('\n'.join(lines))


if __name__ == '__main__':
  main()
