"""A packed-weight float32 matmul for the cached decode path on x86-64 CPUs.

At decode time a matmul has M = batch x (1 .. gamma + 1) rows. XLA:CPU's GEMM re-packs the
weights on every such call and its throughput at M = 4 is far from the memory bound, so a
(gamma + 1)-position verify call cost about 1.9x a one-token step on the demo target
(results/cpu_kernels.md). `cpu_kernels.cc` instead reads weights packed ONCE into 16-column
panels, in order, and reuses each weight for all rows from registers: a one-token step and
a verify call both run near the cost of reading the weights.

Exactness: every output element is one chain of fused multiply-adds over the contraction
dimension, in order, from zero, whatever the number of rows or the tile that computes it;
a row's result is bitwise independent of the other rows in the call (tests/test_cpu_kernels).
It differs from XLA's dot by float32 rounding only (~1e-6 relative).

Used by network.Dense / Embed.attend when the decode variables carry the COLLECTION
(network.decode_kernels, api.generate): float32 models on the CPU backend. Built on first
use with the system C++ compiler (g++ or $CXX) into a per-user cache directory
($SPECDEC_KERNEL_CACHE, else $XDG_CACHE_HOME/specdec_t5x, else ~/.cache/specdec_t5x),
written atomically under a file lock. When it can't be used -- SPECDEC_CPU_KERNELS=0, not
x86-64 with AVX2 and FMA, no compiler, another backend -- `enabled()` is False, the reason
is logged once, and decoding uses XLA's dot as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import hashlib
import importlib.resources
import logging
import os
import platform
import subprocess
import tempfile
from typing import Tuple

import jax
import jax.numpy as jnp

COLLECTION = 'cpu_packed'  # the Flax variable collection holding packed weights
PANEL = 16  # columns per panel (cpu_kernels.cc kPanel)
_TARGET = 'specdec_panel_matmul'
_SOURCE = importlib.resources.files('specdec_t5x.algorithm').joinpath('cpu_kernels.cc')
_FLAGS = ('-O3', '-mavx2', '-mfma', '-std=c++17', '-shared', '-fPIC')


def _cache_dir() -> str:
  if os.environ.get('SPECDEC_KERNEL_CACHE'):
    return os.environ['SPECDEC_KERNEL_CACHE']
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'specdec_t5x')


def _cpu_has_avx2_fma() -> bool:
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      flags = next((line.split(':', 1)[1].split() for line in f if line.startswith('flags')), [])
  except OSError:
    return False
  return 'avx2' in flags and 'fma' in flags


@contextlib.contextmanager
def _locked(path: str):
  with open(path, 'a', encoding='utf-8') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def build() -> str:
  """Compiles cpu_kernels.cc (once per source, jaxlib and flags) -> the shared library path."""
  source = _SOURCE.read_bytes()
  cxx = os.environ.get('CXX', 'g++')
  key = hashlib.sha256(source + jax.__version__.encode() + ' '.join((cxx,) + _FLAGS).encode())
  out_dir = _cache_dir()
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, f'cpu_kernels-{key.hexdigest()[:16]}.so')
  with _locked(path + '.lock'):
    if not os.path.exists(path):
      fd, tmp = tempfile.mkstemp(suffix='.so', dir=out_dir)
      os.close(fd)
      try:
        with importlib.resources.as_file(_SOURCE) as src:
          subprocess.run([cxx, *_FLAGS, '-I', jax.ffi.include_dir(), str(src), '-o', tmp],
                         check=True, capture_output=True, text=True)
        os.replace(tmp, path)
      finally:
        if os.path.exists(tmp):
          os.remove(tmp)
  return path


@functools.lru_cache(maxsize=None)
def _status() -> Tuple[bool, str]:
  """(usable, why not / the library path); builds and registers the kernel the first time."""
  if platform.machine().lower() not in ('x86_64', 'amd64') or not _cpu_has_avx2_fma():
    return False, 'the CPU is not x86-64 with AVX2 and FMA'
  try:
    path = build()
  except FileNotFoundError as e:
    return False, f'no C++ compiler ({e.filename}; set $CXX)'
  except (OSError, subprocess.CalledProcessError) as e:
    return False, f'building {_SOURCE} failed: {getattr(e, "stderr", None) or e}'
  lib = ctypes.cdll.LoadLibrary(path)
  jax.ffi.register_ffi_target(_TARGET, jax.ffi.pycapsule(lib.SpecdecPanelMatmul),
                              platform='cpu')
  return True, path


def enabled() -> bool:
  """True when decoding on the CPU backend can use the packed kernel."""
  if jax.default_backend() != 'cpu':
    return False
  if os.environ.get('SPECDEC_CPU_KERNELS', '1') == '0':  # read per call: benchmarks toggle it
    _log_once('SPECDEC_CPU_KERNELS=0')
    return False
  ok, why = _status()
  if not ok:
    _log_once(why)
  return ok


@functools.lru_cache(maxsize=None)
def _log_once(why: str) -> None:
  logging.warning('specdec_t5x: the packed CPU matmul is off (%s); decoding uses XLA dot.', why)


def pack(w: jax.Array) -> jax.Array:
  """Kernel [K, N] -> panels [ceil(N / 16), K, 16], zero-padded beyond N."""
  k, n = w.shape
  panels = -(-n // PANEL)
  w = jnp.pad(w.astype(jnp.float32), ((0, 0), (0, panels * PANEL - n)))
  return w.reshape(k, panels, PANEL).transpose(1, 0, 2)


def matmul(x: jax.Array, packed: jax.Array, features: int) -> jax.Array:
  """x [..., K] @ the packed [K, features] kernel -> [..., features] float32."""
  if x.shape[-1] != packed.shape[1] or not 0 <= packed.shape[0] * PANEL - features < PANEL:
    raise ValueError(f'x {x.shape} and packed panels {packed.shape} do not make a '
                     f'[..., {features}] product.')
  ok, why = _status()
  if not ok:
    raise RuntimeError(f'The packed CPU matmul is unavailable ({why}); decode without '
                       f'the {COLLECTION!r} variables.')
  out = jax.ShapeDtypeStruct(x.shape[:-1] + (features,), jnp.float32)
  return jax.ffi.ffi_call(_TARGET, out, vmap_method='sequential')(x.astype(jnp.float32), packed)
