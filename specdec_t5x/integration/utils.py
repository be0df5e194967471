"""T5X's run configuration dataclasses, or field-compatible stand-ins without T5X.

`DatasetConfig` and `RestoreCheckpointConfig` are `t5x.utils`'s classes when `t5x` is
importable, and the project's own dataclasses with the same field names otherwise. A gin
file that does `from specdec_t5x.integration import utils` and binds `utils.DatasetConfig.split = ...`
therefore works under T5X's runner and under `python -m specdec_t5x.infer` alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

try:  # T5X is not on PyPI; use its classes only when it is installed.
  from t5x.utils import DatasetConfig, RestoreCheckpointConfig  # type: ignore  # noqa: F401
  HAVE_T5X = True
except ImportError:  # pragma: no cover - depends on the environment
  HAVE_T5X = False

  @dataclasses.dataclass
  class DatasetConfig:  # type: ignore[no-redef]
    """Which seqio task to read and how (field names and meanings of t5x.utils')."""
    mixture_or_task_name: str
    task_feature_lengths: Mapping[str, int]
    split: str
    batch_size: int
    shuffle: bool
    seed: Optional[int]
    use_cached: bool = False
    pack: bool = False
    use_custom_packing_ops: bool = False
    module: Optional[str] = None  # imported before the task is looked up
    use_memory_cache: bool = True

  @dataclasses.dataclass
  class RestoreCheckpointConfig:  # type: ignore[no-redef]
    """Which checkpoint to restore (field names and checks of t5x.utils')."""
    path: Union[str, Sequence[str], None]
    mode: str = 'latest'  # 'specific': `path` is checkpoint_<step>; 'latest': its parent
    assignment_map: Optional[Sequence[Tuple[str, Optional[str]]]] = None
    strict: bool = True
    fallback_to_scratch: bool = False
    dtype: Optional[str] = None  # 'float32', 'bfloat16' or None (as stored)
    restore_dataset: bool = False
    checkpointer_cls: Any = None
    state_transformation_fns: Sequence[Any] = ()

    def __post_init__(self):
      if self.mode not in ('specific', 'latest', 'all'):
        raise ValueError("RestoreCheckpointConfig.mode must be 'specific', 'latest' or "
                         f"'all', got {self.mode!r}.")
      if self.dtype not in (None, 'float32', 'bfloat16'):
        raise ValueError("RestoreCheckpointConfig.dtype must be None, 'float32' or "
                         f"'bfloat16', got {self.dtype!r}.")

__all__ = ['DatasetConfig', 'RestoreCheckpointConfig', 'HAVE_T5X']
