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

Weights that bfloat16 holds exactly (every float32 weight of a model restored from a
bfloat16 checkpoint, such as T5X writes with SaveCheckpointConfig.dtype='bfloat16') can be
packed as bfloat16 (`pack(w, bf16=True)`): the kernel widens them back to the same float32
values, so the products are bitwise those of the float32 panels, and a call reads half the
bytes. A one-row call is then still bound by those bytes, a (gamma + 1)-row verify call by
the multiply-adds: where the CPU has AVX-512 (F and BW), calls of 2+ rows on bfloat16 panels
use 16-wide tiles (SPECDEC_CPU_KERNELS_AVX512=0 keeps the AVX2 ones; the same bits).

The same library holds the row kernels (`row_kernel`): `row_argmax`, per logits row
jnp.argmax's index and whether the row holds a NaN or an infinity, in one pass
(sampling.argmax_checked: XLA:CPU runs both reductions several times slower); `row_softmax`,
the same pass and the temperature softmax with a vectorised exp (sampling.standardize); and
`row_sample`, an inverse-CDF draw per row (sampling.sample). At a sampled decode's one to
gamma + 1 rows per call they cost about half XLA's chains of small reductions. And
`cached_attention`: a decode call's attention over the cache, one query at a time, in one
call instead of XLA:CPU's ~6 small instructions per query (layers.Attention.attend_cached).

Used by network.Dense / Embed.attend when the decode variables carry the COLLECTION
(network.decode_kernels, api.generate): float32 models on the CPU backend. Built on first
use with the system C++ compiler (g++ or $CXX) into a per-user cache directory
($SPECDEC_KERNEL_CACHE, else $XDG_CACHE_HOME/specdec_t5x, else ~/.cache/specdec_t5x),
written atomically under a file lock. Whether a decode uses them is its configuration's
kernel mode (DecodeConfig.cpu_kernels, `MODES`: 'packed', 'packed_f32' keeps float32 panels
for every weight, for comparisons, 'xla' uses none; $SPECDEC_CPU_KERNELS only sets the
default). When they can't be used -- not x86-64 with AVX2 and FMA, no compiler, another
backend -- `enabled()` is False, the reason is logged once, and decoding uses XLA's dot.
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
import shutil
import subprocess
import tempfile
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm.cpu_info import cpu_flags

COLLECTION = 'cpu_packed'  # the Flax variable collection holding packed weights
PANEL = 16  # columns per panel (cpu_kernels.cc kPanel)
_TARGET = 'specdec_panel_matmul'
_TARGET_BF16 = 'specdec_panel_matmul_bf16'
_TARGET_ARGMAX = 'specdec_row_argmax'
_TARGET_SOFTMAX = 'specdec_row_softmax'
_TARGET_SAMPLE = 'specdec_row_sample'
_TARGET_ATTENTION = 'specdec_cached_attention'
TARGET_ATTENTION_BF16 = 'specdec_cached_attention_bf16'  # cpu_bf16.cached_attention
TARGET_DP = 'specdec_panel_matmul_dp'  # vdpbf16ps over pair panels (cpu_bf16.py)
_SOURCE = importlib.resources.files('specdec_t5x.algorithm').joinpath('cpu_kernels.cc')
_FLAGS = ('-O3', '-mavx2', '-mfma', '-std=c++17', '-shared', '-fPIC')


def _cache_dir() -> str:
  if os.environ.get('SPECDEC_KERNEL_CACHE'):
    return os.environ['SPECDEC_KERNEL_CACHE']
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'specdec_t5x')


def _cpu_has_avx2_fma() -> bool:
  return {'avx2', 'fma'} <= cpu_flags()


def _cpu_runs_kernels() -> bool:
  return platform.machine().lower() in ('x86_64', 'amd64') and _cpu_has_avx2_fma()


@contextlib.contextmanager
def _locked(path: str):
  with open(path, 'a', encoding='utf-8') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def _library_path() -> str:
  """Where build() puts the library of this source, jaxlib, compiler and flags."""
  cxx = os.environ.get('CXX', 'g++')
  key = hashlib.sha256(_SOURCE.read_bytes() + jax.__version__.encode()
                       + ' '.join((cxx,) + _FLAGS).encode())
  return os.path.join(_cache_dir(), f'cpu_kernels-{key.hexdigest()[:16]}.so')


def build() -> str:
  """Compiles cpu_kernels.cc (once per source, jaxlib and flags) -> the shared library path."""
  cxx = os.environ.get('CXX', 'g++')
  path = _library_path()
  out_dir = os.path.dirname(path)
  os.makedirs(out_dir, exist_ok=True)
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
  if not _cpu_runs_kernels():
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
  jax.ffi.register_ffi_target(_TARGET_BF16, jax.ffi.pycapsule(lib.SpecdecPanelMatmulBf16),
                              platform='cpu')
  for target, symbol in ((_TARGET_ARGMAX, lib.SpecdecRowArgmax),
                         (_TARGET_SOFTMAX, lib.SpecdecRowSoftmax),
                         (_TARGET_SAMPLE, lib.SpecdecRowSample),
                         (_TARGET_ATTENTION, lib.SpecdecCachedAttention),
                         (TARGET_ATTENTION_BF16, lib.SpecdecCachedAttentionBf16),
                         (TARGET_DP, lib.SpecdecPanelMatmulDp)):
    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(symbol), platform='cpu')
  return True, path


_ACCELERATOR_FORMS = [False]  # set by accelerator_forms() while tracing


@contextlib.contextmanager
def _holding(cell: list, value):
  """Sets cell[0] to `value` inside the block (a trace-time setting), then restores it."""
  before = cell[0]
  cell[0] = value
  try:
    yield
  finally:
    cell[0] = before


def accelerator_forms():
  """Traces the decode path as on an accelerator even on the CPU backend: cached attention
  as one product over all queries (layers.Attention.attend_cached) and the argmax without
  the row kernel, for programs compiled on a CPU to predict an accelerator's
  (research/predict/compiled_costs.py). The form is chosen while tracing, so only functions traced
  inside the block take it: a jitted function traced before keeps its cached program."""
  return _holding(_ACCELERATOR_FORMS, True)


def cpu_forms() -> bool:
  """Whether a function traced now takes the CPU backend's forms: on the CPU backend,
  outside accelerator_forms()."""
  return jax.default_backend() == 'cpu' and not _ACCELERATOR_FORMS[0]


def row_kernel() -> bool:
  """Whether a function traced now reduces logits rows with `row_argmax`: the CPU forms,
  with the kernels enabled in the mode of the decode being traced (`decode_mode`)."""
  return cpu_forms() and enabled(_TRACED_MODE[0])


# What the kernels may do on the CPU backend (DecodeConfig.cpu_kernels):
#   'packed': the packed matmul and row kernels; bfloat16 panels for weights bfloat16 holds
#     exactly (the same products, half the bytes);
#   'packed_f32': the same with float32 panels for every weight (for comparisons);
#   'xla': none of them: XLA's ops;
#   'packed_bf16': 'packed', and for bfloat16 networks their bfloat16 layers with vdpbf16ps
#     (bfloat16 x bfloat16 -> float32, cpu_bf16.py) where the CPU has AVX-512 BF16.
MODES = ('packed', 'packed_f32', 'xla', 'packed_bf16')
ENV = 'SPECDEC_CPU_KERNELS'  # the default mode: 1 (or unset) packed, f32, 0 xla, bf16
_ENV_MODES = {'1': 'packed', 'f32': 'packed_f32', '0': 'xla', 'bf16': 'packed_bf16'}


def default_mode() -> str:
  """The mode a DecodeConfig gets when it names none: `default_mode_as`'s inside that
  block, else $SPECDEC_CPU_KERNELS's, read once per process (a decode's mode is its
  configuration's; this only fills it in)."""
  return _DEFAULT[0] or _env_mode()


@functools.lru_cache(maxsize=None)
def _env_mode() -> str:
  value = os.environ.get(ENV, '1')
  if value not in _ENV_MODES:
    raise ValueError(f'{ENV} must be one of {sorted(_ENV_MODES)} (1: packed, f32: '
                     f'packed_f32, 0: xla, bf16: packed_bf16), got {value!r}.')
  return _ENV_MODES[value]


def check_mode(mode: str) -> str:
  """`mode` if it is one of MODES, else a ValueError naming them."""
  if mode not in MODES:
    raise ValueError(f'cpu_kernels must be one of {MODES}, got {mode!r}.')
  return mode


_TRACED_MODE = [None]  # set by decode_mode() while a decode program is traced
_DEFAULT = [None]  # set by default_mode_as()


def default_mode_as(mode: str):
  """Makes `mode` the default inside the block, for measurements of code that takes no
  DecodeConfig (call costs, loop ladders: their programs are traced in the default mode,
  and their variables differ per mode, so each mode gets its own program)."""
  return _holding(_DEFAULT, check_mode(mode))


def decode_mode(mode: Optional[str]):
  """Traces the decode path in kernel mode `mode` (api.decode_program): what `row_kernel`
  answers while a program is traced inside the block (None: default_mode())."""
  return _holding(_TRACED_MODE, None if mode is None else check_mode(mode))


def traced_mode() -> str:
  """The kernel mode of the decode being traced (decode_mode), else default_mode()."""
  return _TRACED_MODE[0] or default_mode()


def trace_state() -> tuple:
  """The switches a function traced now reads here (the traced kernel mode, the default
  mode, the accelerator forms): part of the key of any memo of traced programs."""
  return (_TRACED_MODE[0], default_mode(), _ACCELERATOR_FORMS[0])


def enabled(mode: Optional[str] = None) -> bool:
  """True when decoding on the CPU backend in kernel mode `mode` (None: default_mode()) can
  use the packed kernel and the row kernels: any mode but 'xla', where they build."""
  if jax.default_backend() != 'cpu':
    return False
  if check_mode(mode or default_mode()) == 'xla':
    return False
  ok, why = _status()
  if not ok:
    _log_once(why)
  return ok


def needs_build(mode: Optional[str] = None) -> bool:
  """Whether `enabled(mode)` would now compile cpu_kernels.cc (seconds; once per source,
  jaxlib and compiler): on the CPU backend, in a mode that uses the kernels, on a CPU that
  runs them, with the compiler present and no library built for them in the cache yet.
  Builds nothing: a command-line runner asks, to say so before the pause."""
  if jax.default_backend() != 'cpu' or check_mode(mode or default_mode()) == 'xla':
    return False
  if not _cpu_runs_kernels() or shutil.which(os.environ.get('CXX', 'g++')) is None:
    return False
  return not os.path.exists(_library_path())


def bf16_panels(mode: Optional[str] = None) -> bool:
  """Whether weights that bfloat16 holds exactly are packed as bfloat16 panels (the same
  products, half the bytes): in modes 'packed' and 'packed_bf16' (None: default_mode())."""
  return check_mode(mode or default_mode()) in ('packed', 'packed_bf16')


@functools.lru_cache(maxsize=None)
def _log_once(why: str) -> None:
  logging.warning('specdec_t5x: the packed CPU matmul is off (%s); decoding uses XLA dot.', why)


def holds_in_bf16(w: jax.Array) -> jax.Array:
  """Scalar bool: every entry of float32 `w` is a bfloat16 value (packing it as bfloat16
  loses nothing)."""
  return jnp.all(w.astype(jnp.bfloat16).astype(w.dtype) == w)


def pack(w: jax.Array, bf16: bool = False) -> jax.Array:
  """Kernel [K, N] -> panels [ceil(N / 16), K, 16], zero-padded beyond N: float32, or with
  `bf16` bfloat16 with each panel row's halves interleaved (p[j, k, 2 i + h] =
  w[k, 16 j + 8 h + i], as cpu_kernels.cc reads them). Only for weights that
  `holds_in_bf16`: others would be rounded."""
  k, n = w.shape
  panels = -(-n // PANEL)
  w = jnp.pad(w.astype(jnp.float32), ((0, 0), (0, panels * PANEL - n)))
  if not bf16:
    return w.reshape(k, panels, PANEL).transpose(1, 0, 2)
  half = PANEL // 2
  return (w.reshape(k, panels, 2, half).transpose(1, 0, 3, 2).reshape(panels, k, PANEL)
          .astype(jnp.bfloat16))


def matmul(x: jax.Array, packed: jax.Array, features: int) -> jax.Array:
  """x [..., K] @ the packed [K, features] kernel (float32 or bfloat16 panels) ->
  [..., features] float32."""
  if x.shape[-1] != packed.shape[1] or not 0 <= packed.shape[0] * PANEL - features < PANEL:
    raise ValueError(f'x {x.shape} and packed panels {packed.shape} do not make a '
                     f'[..., {features}] product.')
  if packed.dtype not in (jnp.float32, jnp.bfloat16):
    raise ValueError(f'Packed panels must be float32 or bfloat16, got {packed.dtype}.')
  ok, why = _status()
  if not ok:
    raise RuntimeError(f'The packed CPU matmul is unavailable ({why}); decode without '
                       f'the {COLLECTION!r} variables.')
  target = _TARGET_BF16 if packed.dtype == jnp.bfloat16 else _TARGET
  out = jax.ShapeDtypeStruct(x.shape[:-1] + (features,), jnp.float32)
  return jax.ffi.ffi_call(target, out, vmap_method='sequential')(x.astype(jnp.float32), packed)


def _require_row_kernels() -> None:
  ok, why = _status()
  if not ok:
    raise RuntimeError(f'The CPU row kernels are unavailable ({why}).')


def row_argmax(x: jax.Array) -> Tuple[jax.Array, jax.Array]:
  """x [..., V] float32 -> (index [...] int32, nonfinite [...] bool), one pass per row: the
  index is jnp.argmax's (the first maximum; the first NaN when the row holds one), the flag
  says the row holds a NaN or an infinity."""
  _require_row_kernels()
  out = (jax.ShapeDtypeStruct(x.shape[:-1], jnp.int32), jax.ShapeDtypeStruct(x.shape[:-1], jnp.bool_))
  return jax.ffi.ffi_call(_TARGET_ARGMAX, out, vmap_method='sequential')(x.astype(jnp.float32))


def row_softmax(x: jax.Array, inv_temperature) -> Tuple[jax.Array, jax.Array]:
  """x [..., V] float32, inv_temperature: 1 / temperature > 0, a float32 scalar (a run-time
  value of the program: SamplingConfig.values) -> (probabilities [..., V] float32,
  nonfinite [...] bool): `row_argmax`'s pass (its flag, and the maximum at its index), then
  the softmax of (x - max) * inv_temperature (entries at the maximum exactly 0 before the
  exp), in two more vectorised passes per row (cpu_kernels.cc RowSoftmax)."""
  _require_row_kernels()
  out = (jax.ShapeDtypeStruct(x.shape, jnp.float32),
         jax.ShapeDtypeStruct(x.shape[:-1], jnp.bool_))
  return jax.ffi.ffi_call(_TARGET_SOFTMAX, out, vmap_method='sequential')(
      x.astype(jnp.float32), jnp.asarray(inv_temperature, jnp.float32).reshape(()))


def row_sample(probs: jax.Array, u: jax.Array) -> jax.Array:
  """probs [b, V] (>= 0, any total), u [b] in (0, 1] -> [b] int32: per row the first index
  whose cumulative mass reaches u * total, never one of probability 0 (cpu_kernels.cc
  RowSample: block sums in one vectorised pass, then a running sum inside one block)."""
  _require_row_kernels()
  out = jax.ShapeDtypeStruct(probs.shape[:1], jnp.int32)
  return jax.ffi.ffi_call(_TARGET_SAMPLE, out, vmap_method='sequential')(
      probs.astype(jnp.float32), u.astype(jnp.float32))


def cached_attention(q: jax.Array, k_t: jax.Array, v: jax.Array, bias: jax.Array) -> jax.Array:
  """The softmax attention of a cached decode call, one query at a time (cpu_kernels.cc
  CachedAttention): q [B, Q, H, D], k_t [B, H, D, S], v [B, H, S, D], bias [1 or B, 1 or H,
  1 or Q, S] (masks folded in) -> context [B, Q, H, D] float32. Each query's context is
  computed alone, so it is bitwise the same in a call of one query or of many; it agrees
  with XLA's einsum / softmax / einsum to float32 rounding. A score row holding a NaN or an
  infinity gives a NaN context."""
  _require_row_kernels()
  bias = jnp.asarray(bias, jnp.float32)
  if bias.ndim != 4:
    raise ValueError(f'cached_attention: bias must be 4-d [B, H, Q, S], got {bias.shape}.')
  out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
  return jax.ffi.ffi_call(_TARGET_ATTENTION, out, vmap_method='sequential')(
      q.astype(jnp.float32), k_t.astype(jnp.float32), v.astype(jnp.float32), bias)
