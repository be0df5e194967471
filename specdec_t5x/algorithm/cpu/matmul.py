"""A packed layer's entry, tagged with its format, and the one dispatch over the formats.

The decode variables' collection COLLECTION holds, at each packed layer's path, a
`PackedKernel`: its panels and, as a static field, its format (`panel_format`, one of
modes.FORMATS). layers.Dense
and Embed.attend hand it to `apply`, which runs the format's arithmetic: float32 arithmetic
on float32 or bfloat16 storage (f32.matmul), or bfloat16 arithmetic on pair panels
(bf16.layer). Nothing is read from the panels' shapes or dtypes.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from specdec_t5x.algorithm.cpu import bf16, f32, modes

COLLECTION = 'cpu_packed'  # the Flax variable collection holding packed weights


@flax.struct.dataclass
class PackedKernel:
  """A layer's weights packed for the CPU kernels. `panels`: f32.pack's panels (formats
  'f32_panels', 'bf16_panels') or bf16.pack_pairs' (format 'pair_panels')."""
  panels: jax.Array
  panel_format: str = flax.struct.field(pytree_node=False)


def pack(w: jax.Array, panel_format: str) -> PackedKernel:
  """Kernel [K, N] -> its PackedKernel in `panel_format` (modes.FORMATS)."""
  if panel_format == modes.PAIR_PANELS:
    return PackedKernel(bf16.pack_pairs(w), panel_format)
  if panel_format not in (modes.F32_PANELS, modes.BF16_PANELS):
    raise ValueError(f'A panel format is one of {modes.FORMATS}, got {panel_format!r}.')
  return PackedKernel(f32.pack(w, bf16_storage=panel_format == modes.BF16_PANELS),
                      panel_format)


def apply(x: jax.Array, packed: PackedKernel, features: int, dtype) -> jax.Array:
  """x [..., K] @ the packed [K, features] kernel, as a layer of `dtype` computes it:
  bfloat16 arithmetic rounded to `dtype` on pair panels; float32 arithmetic on float32 or
  bfloat16 storage, which only a float32 layer gets (modes.panel_format)."""
  if not isinstance(packed, PackedKernel):
    raise TypeError(f'A packed layer is a PackedKernel (matmul.pack), got {type(packed)}.')
  if packed.panel_format == modes.PAIR_PANELS:
    return bf16.layer(x, packed.panels, features, dtype)
  if packed.panel_format not in (modes.F32_PANELS, modes.BF16_PANELS):
    raise ValueError(f'A panel format is one of {modes.FORMATS}, got {packed.panel_format!r}.')
  if jnp.dtype(dtype) != jnp.float32:
    raise ValueError(f'A {jnp.dtype(dtype)} layer on {packed.panel_format}: only float32 layers '
                     'get float32 arithmetic (modes.panel_format).')
  return f32.matmul(x, packed.panels, features)
