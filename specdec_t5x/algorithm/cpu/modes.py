"""The CPU kernels' modes, the trace-time switches, and the one choice of each layer's format.

What the kernels may do on the CPU backend (DecodeConfig.cpu_kernels, `MODES`):
  'packed': the packed matmul and row kernels; bfloat16 storage for weights bfloat16 holds
    exactly (the same products, half the bytes);
  'packed_f32': the same with float32 storage for every weight (for comparisons);
  'xla': none of them: XLA's ops;
  'packed_bf16': 'packed', and for bfloat16 networks their bfloat16 layers with bfloat16
    arithmetic (vdpbf16ps, bf16.py) and the bfloat16 cached attention, where the CPU has
    AVX-512 BF16 (else one log line and 'packed').
$SPECDEC_CPU_KERNELS only sets the default mode. A decode program is traced in its
configuration's mode (`decode_mode`); programs of code that takes no DecodeConfig in the
default one (`default_mode_as`); `trace_state` is what any memo of traced programs must be
keyed on (programs.program_key). `panel_format` is the one place that says which format a
layer's packed weights get (packing.plan applies it to every layer).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
from typing import Optional, Tuple

import jax
import jax.numpy as jnp

from specdec_t5x.algorithm.cpu import build, info

MODES = ('packed', 'packed_f32', 'xla', 'packed_bf16')
PAIR_MODE = 'packed_bf16'  # the mode with bfloat16 arithmetic
ENV = 'SPECDEC_CPU_KERNELS'  # the default mode: 1 (or unset) packed, f32, 0 xla, bf16
_ENV_MODES = {'1': 'packed', 'f32': 'packed_f32', '0': 'xla', 'bf16': 'packed_bf16'}

# The formats of a packed layer (matmul.PackedKernel.panel_format).
F32_PANELS = 'f32_panels'  # float32 storage, float32 arithmetic
BF16_PANELS = 'bf16_panels'  # bfloat16 storage (exact weights), float32 arithmetic
PAIR_PANELS = 'pair_panels'  # bfloat16 storage, bfloat16 arithmetic (vdpbf16ps)
FORMATS = (F32_PANELS, BF16_PANELS, PAIR_PANELS)
# A layer's role (packing.plan): the float32 logits (a Dense or the tied embedding), another
# float32 layer (a feature head's feature_out), or a layer of the network's dtype.
ROLES = ('logits', 'float32', 'dtype')

_TRACED_MODE = [None]  # set by decode_mode() while a decode program is traced
_DEFAULT = [None]  # set by default_mode_as()
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
  """Whether a function traced now reduces logits rows with the row kernels: the CPU
  forms, with the kernels enabled in the mode of the decode being traced (`decode_mode`)."""
  return cpu_forms() and enabled(_TRACED_MODE[0])


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
  ok, why = build.status()
  if not ok:
    _log_off(why)
  return ok


def needs_build(mode: Optional[str] = None) -> bool:
  """Whether `enabled(mode)` would now compile the kernels (seconds; once per source,
  jaxlib and compiler): on the CPU backend, in a mode that uses the kernels, on a CPU that
  runs them, with the compiler present and no library built for them in the cache yet.
  Builds nothing: a command-line runner asks, to say so before the pause."""
  if jax.default_backend() != 'cpu' or check_mode(mode or default_mode()) == 'xla':
    return False
  if not build.cpu_runs_kernels() or shutil.which(build.compiler()) is None:
    return False
  return not os.path.exists(build.library_path())


def bf16_storage(mode: Optional[str] = None) -> bool:
  """Whether weights that bfloat16 holds exactly are stored as bfloat16 (the same
  products, half the bytes): in modes 'packed' and 'packed_bf16' (None: default_mode())."""
  return check_mode(mode or default_mode()) in ('packed', 'packed_bf16')


@functools.lru_cache(maxsize=None)
def _log_off(why: str) -> None:
  logging.warning('specdec_t5x: the packed CPU matmul is off (%s); decoding uses XLA dot.', why)


def cpu_has_dpbf16() -> bool:
  """The CPU runs vdpbf16ps on 512-bit registers (AVX-512 F, BW and BF16)."""
  return {'avx512f', 'avx512bw', 'avx512_bf16'} <= info.cpu_flags()


@functools.lru_cache(maxsize=None)
def _log_fallback(why: str) -> None:
  logging.warning('specdec_t5x: kernel mode %r falls back to mode \'packed\' (%s): XLA '
                  'computes the bfloat16 layers.', PAIR_MODE, why)


def pair_arithmetic(mode: Optional[str], dtype) -> bool:
  """Whether a network of `dtype` decoding in kernel `mode` (None: the default) runs its
  bfloat16 layers with bfloat16 arithmetic (pair panels) and its cached attention with
  the bfloat16 kernel: mode 'packed_bf16', dtype bfloat16, the kernels enabled, a CPU with
  AVX-512 BF16 (checked each call; the fallback logged once)."""
  if (check_mode(mode or default_mode()) != PAIR_MODE
      or jnp.dtype(dtype) != jnp.bfloat16 or not enabled(PAIR_MODE)):
    return False
  if not cpu_has_dpbf16():
    _log_fallback('the CPU lacks avx512_bf16')
    return False
  return True


def pair_attention(dtype) -> bool:
  """Whether a cached attention of `dtype` traced now runs the bfloat16 attention kernel:
  `pair_arithmetic` in the kernel mode of the decode being traced, with the row kernels on
  (the CPU forms)."""
  return jnp.dtype(dtype) == jnp.bfloat16 and row_kernel() and pair_arithmetic(
      traced_mode(), dtype)


def panel_format(mode: Optional[str], dtype, role: str,
                 exact: bool) -> Tuple[Optional[str], str]:
  """(format or None, why): how a layer of `role` (ROLES) in a network of `dtype` is packed
  in kernel `mode`, where the kernels are enabled. `exact`: bfloat16 holds exactly every
  weight that float32 arithmetic would read (packing.plan checks it over those layers).
  None: no packed entry, the layer keeps XLA's dot."""
  if pair_arithmetic(mode, dtype):
    if role != 'logits':  # a head's feature_out too: its inputs are bfloat16
      return PAIR_PANELS, 'a bfloat16 network in mode packed_bf16: bfloat16 arithmetic'
    if exact:
      return PAIR_PANELS, ('float32 logits whose weights bfloat16 holds exactly: exact '
                           'products of bfloat16 inputs, summed in pair order')
    return F32_PANELS, 'float32 logits whose weights bfloat16 does not hold: float32 arithmetic'
  if role == 'dtype' and jnp.dtype(dtype) != jnp.float32:
    return None, f'a {jnp.dtype(dtype)} layer without bfloat16 arithmetic: XLA\'s dot'
  if exact and bf16_storage(mode):
    return BF16_PANELS, 'weights bfloat16 holds exactly: bfloat16 storage, the same products'
  return F32_PANELS, 'float32 arithmetic on float32 storage'
