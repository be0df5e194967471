"""Quality of each demo model on the committed test samples (greedy, target-only).

  python scripts/compare_decodes.py --experiment=demo_models [--num_examples 300]

Decodes data/demo/{ende,summarize}_test.tsv with demo_target, demo_draft_m and
demo_draft_s alone (greedy, 64 tokens) and scores BLEU (ende) / ROUGE (summarize).
Writes results/demo_models.json and results/demo_models.md, the latter with the alpha
rows of results/alpha_demo.json (compare_decodes.py --experiment=alpha_demo) beside the scores.
"""

from typing import List

from tqdm import tqdm

from specdec_t5x.algorithm import sampling
from specdec_t5x.research.measure import demo_data, evaluation, measurement
from specdec_t5x.research.results import harness

MODELS = ('demo_target', 'demo_draft_m', 'demo_draft_s')
PARAMS = {'demo_target': '15.8M', 'demo_draft_m': '2.2M', 'demo_draft_s': '0.67M'}


def measure(args, script: str) -> dict:
  """Each model's quality on the first --num_examples rows of each task."""
  scores = {}
  for task in tqdm(('ende', 'summarize'), desc='tasks'):
    enc, refs, sp = demo_data.load_task(task, args.num_examples)
    for name in MODELS:
      outs = evaluation.target_outputs(evaluation.load_model(name), enc,
                                       sampling.SamplingConfig(0.0), max_len=64, batch=32)
      scores[f'{task}/{name}'] = demo_data.quality(task, refs, demo_data.texts(sp, outs))
  return dict(num_examples=args.num_examples, scores=scores)


def render(report: harness.Report) -> List[str]:
  scores, args = report['scores'], report['args']
  lines = report.header('Demo family quality on the committed test samples',
                        f"Greedy, target-only, {args['num_examples']} examples per task.")
  lines += harness.table(
      ['model', 'params', 'EN->DE BLEU', 'summarize ROUGE-1 / 2 / Lsum'],
      [[name, PARAMS[name], f"{scores[f'ende/{name}']['bleu']:.2f}",
        ' / '.join(f"{scores[f'summarize/{name}'][k]:.2f}"
                   for k in ('rouge1', 'rouge2', 'rougeLsum'))] for name in MODELS])
  lines += ['', "Every draft's alpha against demo_target (paper Table 3 method: the mean of "
            "sum_x min(p, q) over the target's own generations; from `results/alpha_demo.json`, "
            'where the command, token counts and per-position alphas are):', '']
  cells = demo_data.alpha_cells(args['alpha_json'])
  if not cells:
    lines.append('(not measured yet: run scripts/compare_decodes.py --experiment=alpha_demo)')
  else:
    alpha = {(c['draft'], c['task'], c['temperature']): c['alpha'] for c in cells}
    lines += harness.table(
        ['draft', 'EN->DE t=0', 'EN->DE t=1', 'summarize t=0', 'summarize t=1'],
        [[d] + [harness.fmt(alpha.get((d, t, temp))) for t in ('ende', 'summarize')
                for temp in (0.0, 1.0)] for d in dict.fromkeys(c['draft'] for c in cells)])
  return lines


main = measurement.Measurement('demo_models', __doc__, measure, render, flags=dict(
    num_examples=300, alpha_json=measurement.alpha_json)).main
