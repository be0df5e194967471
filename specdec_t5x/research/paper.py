"""The paper's T5 results (Leviathan et al., ICML 2023, Table 2): one source for the
paper-row gin files' checks (tests/test_configs.py, tests/test_t5x_infer.py) and the
predicted-vs-paper table of scripts/device_report.py.

Every row: T5 v1.1 XXL target, batch size 1, one TPU-v4; alpha and the measured walltime
speedup as the paper reports them. `config` is the row's file under configs/.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple

TASKS = ('EnDe', 'CNNDM')  # WMT EnDe (BLEU), CNN/DailyMail (ROUGE)


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
