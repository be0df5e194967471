"""The paper's T5 results (Leviathan et al., ICML 2023, Table 2) as data: the source of the
paper-row gin files (`config_text` renders each; tests/test_configs.py checks that every
configs/spec_*.gin is exactly its row's text), of their checks (tests/test_configs.py,
tests/test_t5x_infer.py) and of the predicted-vs-paper tables of scripts/device_report.py
and scripts/compiled_report.py.

Every row: T5 v1.1 XXL target, batch size 1, one TPU-v4; alpha and the measured walltime
speedup as the paper reports them. `config` is the row's file under configs/; what rows
of a task share (task, lengths, target, batch size 1) is its base, BASES[task].
"""

from __future__ import annotations

import dataclasses
import os
from typing import Tuple

TASKS = ('EnDe', 'CNNDM')  # WMT EnDe (BLEU), CNN/DailyMail (ROUGE)
BASES = {'EnDe': 'configs/runs/paper_ende.gin', 'CNNDM': 'configs/runs/paper_cnndm.gin'}
TARGET = 'xxl'  # the target of every row
CHECKPOINT = 'gs://t5-data/pretrained_models/t5x/t5_1_1_{}/checkpoint_1000000'  # by size


@dataclasses.dataclass(frozen=True)
class Row:
  config: str  # configs/<config>
  task: str  # one of TASKS
  draft: str  # T5 v1.1 size of the draft (network.T5_1_1_SIZES)
  temperature: float
  gamma: int
  alpha: float
  speedup: float  # the paper's measured walltime improvement


TABLE_2: Tuple[Row, ...] = (
    Row('spec_t5_small_xxl.gin', 'EnDe', 'small', 0, 7, 0.75, 3.4),
    Row('spec_ende_base_xxl_t0.gin', 'EnDe', 'base', 0, 7, 0.80, 2.8),
    Row('spec_ende_large_xxl_t0.gin', 'EnDe', 'large', 0, 7, 0.82, 1.7),
    Row('spec_ende_small_xxl_t1.gin', 'EnDe', 'small', 1, 7, 0.62, 2.6),
    Row('spec_ende_base_xxl_t1.gin', 'EnDe', 'base', 1, 5, 0.68, 2.4),
    Row('spec_ende_large_xxl_t1.gin', 'EnDe', 'large', 1, 3, 0.71, 1.4),
    Row('spec_cnndm_small_xxl_t0.gin', 'CNNDM', 'small', 0, 5, 0.65, 3.1),
    Row('spec_cnndm_base_xxl_t0.gin', 'CNNDM', 'base', 0, 5, 0.73, 3.0),
    Row('spec_cnndm_large_xxl_t0.gin', 'CNNDM', 'large', 0, 3, 0.74, 2.2),
    Row('spec_cnndm_small_xxl_t1.gin', 'CNNDM', 'small', 1, 5, 0.53, 2.3),
    Row('spec_cnndm_base_xxl_t1.gin', 'CNNDM', 'base', 1, 3, 0.55, 2.2),
    Row('spec_cnndm_large_xxl_t1.gin', 'CNNDM', 'large', 1, 3, 0.56, 1.7),
)

_ROW_GIN = """\
# Paper Table 2, row {number}: {task}, target T5-XXL, draft T5-{draft}, temperature {t:g}, \
gamma {gamma}
# (paper: alpha {alpha:.2f}, walltime improvement {speedup:.1f}x at batch size 1 on TPU-v4).
# A run's `alpha` (metrics.json, T5X's log) estimates the same E[beta]: compare it with the
# paper's; its acceptance_rate (accepted / drafted tokens) is lower at this gamma.
#
#   python -m t5x.infer --gin_file=configs/{config} \\
#     --gin.TARGET_CHECKPOINT="'/ckpt/t5_1_1_{target}/checkpoint_1000000'" \\
#     --gin.DRAFT_CHECKPOINT="'/ckpt/t5_1_1_{draft}/checkpoint_1000000'" \\
#     --gin.INFER_OUTPUT_DIR="'/tmp/spec_{lower}_{draft}_{target}_t{t:g}'"
#
# Run from the repository root (or add --gin_search_paths=<repository root>);
# `python -m specdec_t5x.infer` takes the same flags and needs no T5X installed.
# The task, its data and metric, the checkpoint defaults and what a run writes:
# {base}. This file sets the row: the draft, GAMMA and TEMPERATURE.
# (Rendered from specdec_t5x/research/predict/paper.py, TABLE_2: edit the row there.)
from __gin__ import dynamic_registration

from specdec_t5x.algorithm import network

include 'configs/models/t5_1_1_{target}.gin'
include 'configs/models/t5_1_1_{draft}.gin'
include '{base}'

DRAFT_CONFIG = @t5_1_1/{draft}/network.T5Config()
DRAFT_CHECKPOINT = '{draft_checkpoint}'
GAMMA = {gamma}
TEMPERATURE = {t:.1f}
"""


def config_text(row: Row) -> str:
  """The gin file of `row` (configs/<row.config>): its header (the paper's row, the exact
  command) and its macros over the task's base file."""
  return _ROW_GIN.format(
      number=TABLE_2.index(row) + 1, task=row.task, lower=row.task.lower(), draft=row.draft,
      t=row.temperature, gamma=row.gamma, alpha=row.alpha, speedup=row.speedup,
      config=row.config, target=TARGET, base=BASES[row.task],
      draft_checkpoint=CHECKPOINT.format(row.draft))


def write_configs(configs_dir: str) -> None:
  """Writes every row's gin file into `configs_dir` (after editing TABLE_2)."""
  for row in TABLE_2:
    with open(os.path.join(configs_dir, row.config), 'w', encoding='utf-8') as f:
      f.write(config_text(row))
