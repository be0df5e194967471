"""algorithm/rows.py: a batch of one row takes plain dynamic slices, larger batches vmap;
both give each row its own window."""

import jax
import jax.numpy as jnp
import numpy as np

from specdec_t5x.algorithm import rows


def test_window_and_update_give_every_row_its_own_window_at_any_batch():
  x = jnp.arange(2 * 6 * 3, dtype=jnp.float32).reshape(2, 6, 3)
  start = jnp.asarray([1, 3], jnp.int32)
  new = -jnp.ones((2, 2, 3))
  both = rows.window(x, start, 2), rows.update(x, new, start)
  for r in range(2):
    s = int(start[r])
    np.testing.assert_array_equal(both[0][r], x[r, s:s + 2])
    want = np.asarray(x[r]).copy()
    want[s:s + 2] = -1
    np.testing.assert_array_equal(both[1][r], want)
    alone = rows.window(x[r:r + 1], start[r:r + 1], 2), rows.update(x[r:r + 1], new[r:r + 1],
                                                                     start[r:r + 1])
    np.testing.assert_array_equal(alone[0][0], both[0][r])  # batch-1 path == vmap path
    np.testing.assert_array_equal(alone[1][0], both[1][r])


def test_update_along_another_axis_casts_to_the_buffer_dtype():
  cache = jnp.zeros((2, 2, 4, 5), jnp.bfloat16)  # [b, h, d, slots]
  new = jnp.ones((2, 2, 4, 2), jnp.float32)
  start = jnp.asarray([0, 3], jnp.int32)
  out = rows.update(cache, new, start, axis=3)
  assert out.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(out[0, :, :, :2], np.float32), 1)
  np.testing.assert_array_equal(np.asarray(out[1, :, :, 3:], np.float32), 1)
  assert float(jnp.sum(out.astype(jnp.float32))) == 2 * 2 * 4 * 2
  np.testing.assert_array_equal(rows.update(cache[1:], new[1:], start[1:], axis=3)[0], out[1])


def test_update_all_writes_every_buffer_or_none():
  """update_all == update of each buffer along its axis while every row's window fits; a
  window past the end (or a negative start) leaves all buffers as they were, and says so."""
  k = jnp.arange(2 * 3 * 6, dtype=jnp.float32).reshape(2, 3, 6)  # [b, d, slots]
  v = -jnp.arange(2 * 6 * 3, dtype=jnp.float32).reshape(2, 6, 3)  # [b, slots, d]
  k_new, v_new = jnp.ones((2, 3, 2)), jnp.ones((2, 2, 3))
  for start in ([0, 4], [4], [1]):
    start = jnp.asarray(start, jnp.int32)
    b = start.shape[0]
    got, fits = jax.jit(rows.update_all, static_argnames='axes')(
        (k[:b], v[:b]), (k_new[:b], v_new[:b]), start, axes=(2, 1))
    assert bool(fits)
    np.testing.assert_array_equal(got[0], rows.update(k[:b], k_new[:b], start, axis=2))
    np.testing.assert_array_equal(got[1], rows.update(v[:b], v_new[:b], start, axis=1))
  for start in ([0, 5], [5], [-1]):  # one window past the end / before the start
    start = jnp.asarray(start, jnp.int32)
    b = start.shape[0]
    got, fits = rows.update_all((k[:b], v[:b]), (k_new[:b], v_new[:b]), start, axes=(2, 1))
    assert not bool(fits)
    np.testing.assert_array_equal(got[0], k[:b])
    np.testing.assert_array_equal(got[1], v[:b])
