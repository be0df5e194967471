"""Compiles the CPU kernels (kernels/*.cc) into one shared library and registers its FFI
targets.

Built on first use with the system C++ compiler (g++ or $CXX), in ONE command over every
source, into a per-user cache directory ($SPECDEC_KERNEL_CACHE, else
$XDG_CACHE_HOME/specdec_t5x, else ~/.cache/specdec_t5x), written atomically under a file
lock and keyed on every source, jaxlib, the compiler and the flags (a change in any of them
builds anew). `status()` says whether the kernels are usable here and, if not, why: not
x86-64 with AVX2 and FMA, no compiler, or a failed build.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import hashlib
import importlib.resources
import os
import platform
import subprocess
import tempfile
from typing import Tuple

import jax

from specdec_t5x.algorithm.cpu.info import cpu_flags

# The FFI targets, each a handler symbol of the library.
PANEL_MATMUL = 'specdec_panel_matmul'  # float32 arithmetic, float32 panels (f32.py)
PANEL_MATMUL_BF16 = 'specdec_panel_matmul_bf16'  # float32 arithmetic, bfloat16 panels
PANEL_MATMUL_DP = 'specdec_panel_matmul_dp'  # vdpbf16ps over pair panels (bf16.py)
ROW_ARGMAX = 'specdec_row_argmax'  # row_kernels.py
ROW_SOFTMAX = 'specdec_row_softmax'
ROW_SAMPLE = 'specdec_row_sample'
CACHED_ATTENTION = 'specdec_cached_attention'  # attention.py
CACHED_ATTENTION_BF16 = 'specdec_cached_attention_bf16'
_SYMBOLS = {PANEL_MATMUL: 'SpecdecPanelMatmul', PANEL_MATMUL_BF16: 'SpecdecPanelMatmulBf16',
            ROW_ARGMAX: 'SpecdecRowArgmax', ROW_SOFTMAX: 'SpecdecRowSoftmax',
            ROW_SAMPLE: 'SpecdecRowSample', CACHED_ATTENTION: 'SpecdecCachedAttention',
            CACHED_ATTENTION_BF16: 'SpecdecCachedAttentionBf16',
            PANEL_MATMUL_DP: 'SpecdecPanelMatmulDp'}

_KERNELS = importlib.resources.files('specdec_t5x.algorithm.cpu').joinpath('kernels')
SOURCES = ('matmul_f32.cc', 'matmul_dp.cc', 'row_kernels.cc', 'attention.cc')  # one library
HEADERS = ('common.h',)
_FLAGS = ('-O3', '-mavx2', '-mfma', '-std=c++17', '-shared', '-fPIC')


def _cache_dir() -> str:
  if os.environ.get('SPECDEC_KERNEL_CACHE'):
    return os.environ['SPECDEC_KERNEL_CACHE']
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'specdec_t5x')


def compiler() -> str:
  """The C++ compiler the build runs ($CXX, else g++)."""
  return os.environ.get('CXX', 'g++')


def cpu_has_avx2_fma() -> bool:
  """The CPU has the AVX2 and FMA the kernels are compiled for."""
  return {'avx2', 'fma'} <= cpu_flags()


def cpu_runs_kernels() -> bool:
  """x86-64 with AVX2 and FMA: the kernels can run here (if they build)."""
  return platform.machine().lower() in ('x86_64', 'amd64') and cpu_has_avx2_fma()


@contextlib.contextmanager
def _locked(path: str):
  with open(path, 'a', encoding='utf-8') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def library_path() -> str:
  """Where build() puts the library of these sources, jaxlib, compiler and flags."""
  key = hashlib.sha256()
  for name in SOURCES + HEADERS:
    key.update(name.encode() + b'\0' + _KERNELS.joinpath(name).read_bytes() + b'\0')
  key.update(jax.__version__.encode() + ' '.join((compiler(),) + _FLAGS).encode())
  return os.path.join(_cache_dir(), f'cpu_kernels-{key.hexdigest()[:16]}.so')


def build() -> str:
  """Compiles kernels/*.cc in one command (once per sources, jaxlib and flags) -> the
  shared library's path."""
  path = library_path()
  out_dir = os.path.dirname(path)
  os.makedirs(out_dir, exist_ok=True)
  with _locked(path + '.lock'):
    if not os.path.exists(path):
      fd, tmp = tempfile.mkstemp(suffix='.so', dir=out_dir)
      os.close(fd)
      try:
        with importlib.resources.as_file(_KERNELS) as src:
          sources = [os.path.join(src, name) for name in SOURCES]
          subprocess.run([compiler(), *_FLAGS, '-I', jax.ffi.include_dir(), *sources,
                          '-o', tmp], check=True, capture_output=True, text=True)
        os.replace(tmp, path)
      finally:
        if os.path.exists(tmp):
          os.remove(tmp)
  return path


@functools.lru_cache(maxsize=None)
def status() -> Tuple[bool, str]:
  """(usable, why not / the library's path); builds the library and registers its FFI
  targets the first time."""
  if not cpu_runs_kernels():
    return False, 'the CPU is not x86-64 with AVX2 and FMA'
  try:
    path = build()
  except FileNotFoundError as e:
    return False, f'no C++ compiler ({e.filename}; set $CXX)'
  except (OSError, subprocess.CalledProcessError) as e:
    return False, f'building {_KERNELS} failed: {getattr(e, "stderr", None) or e}'
  lib = ctypes.cdll.LoadLibrary(path)
  for target, symbol in _SYMBOLS.items():
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)),
                                platform='cpu')
  return True, path


def require(what: str, advice: str = '') -> None:
  """Raises RuntimeError ('`what` is unavailable (why)`advice`.') unless the library is
  usable (status)."""
  ok, why = status()
  if not ok:
    raise RuntimeError(f'{what} is unavailable ({why}){advice}.')
