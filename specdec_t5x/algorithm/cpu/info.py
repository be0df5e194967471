"""What this machine's CPU is, from /proc/cpuinfo (Linux; empty elsewhere), read once per
process: its feature flags, which choose the CPU kernels' paths (build.py: AVX2 and FMA;
bf16.py: AVX-512 BF16), and its model name. Results files record both
(research/harness.environment), because call costs and speedups measured on one CPU do not
carry over to another."""

from __future__ import annotations

import functools
from typing import Dict, List

# The flags that choose a kernel path or bound its speed, as results files record them.
KERNEL_FEATURES = ('avx2', 'fma', 'avx512f', 'avx512bw', 'avx512_bf16', 'amx_bf16')


def field(text: str, name: str) -> str:
  """The first `name : value` line's value in a /proc/cpuinfo text ('' where there is none)."""
  for line in text.splitlines():
    key, sep, value = line.partition(':')
    if sep and key.strip() == name:
      return value.strip()
  return ''


@functools.lru_cache(maxsize=None)
def _cpuinfo() -> str:
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      return f.read()
  except OSError:
    return ''


def cpu_flags() -> frozenset:
  """The CPU's feature flags (the first `flags` line; empty where there is none)."""
  return frozenset(field(_cpuinfo(), 'flags').split())


def cpu_model() -> str:
  """The CPU's model name ('' where /proc/cpuinfo has none)."""
  return field(_cpuinfo(), 'model name')


def describe() -> Dict[str, object]:
  """{'cpu': model name, 'cpu_features': the KERNEL_FEATURES it has, in that order}."""
  flags = cpu_flags()
  features: List[str] = [f for f in KERNEL_FEATURES if f in flags]
  return {'cpu': cpu_model() or 'unknown', 'cpu_features': features}
