"""Tree attention in the cached decoder (algorithm/trees/structure.py): each node of one tree
call is bitwise a chain call over its root-to-node path, and after `compact` the cache is
bitwise what a chain call over the accepted path writes, with nothing of the rejected
branches left."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import make_model, random_inputs, tiny_config
from specdec_t5x.algorithm.cpu import modes, packing
from specdec_t5x.algorithm.trees import structure as tree
from specdec_t5x.algorithm.network import Transformer

# Two rows, two different trees of 8 nodes. Row 0: the root has children 1 and 2, node 3
# children 5 and 6; row 1: the root has children 1 and 4, node 1 children 2 and 3. Depth 4.
PARENTS = np.array([[-1, 0, 0, 1, 2, 3, 3, 5],
                    [-1, 0, 1, 1, 0, 4, 2, 6]], np.int32)
DEPTHS = np.array([[0, 1, 1, 2, 2, 3, 3, 4],
                   [0, 1, 2, 2, 1, 2, 3, 4]], np.int32)
POSITIONS = np.array([3, 5], np.int32)  # each row's root position
PATH = np.array([[0, 2, 4], [0, 4, 5]], np.int32)  # through the root's second child
LONGEST = int(DEPTHS.max()) + 1
# Every pair of (version, dtype, kernel mode) values occurs once among these four.
CASES = [pytest.param(v11, dtype, mode, id=f'{"v11" if v11 else "v10"}-{jnp.dtype(dtype).name}-{mode}')
         for v11, dtype, mode in ((True, jnp.float32, 'packed'), (True, jnp.bfloat16, 'xla'),
                                  (False, jnp.float32, 'xla'), (False, jnp.bfloat16, 'packed'))]
MODES = ['packed', 'xla']


def _path(row: int, node: int) -> list:
  """Row `row`'s root-to-`node` path of PARENTS."""
  path = [node]
  while PARENTS[row, path[-1]] >= 0:
    path.append(int(PARENTS[row, path[-1]]))
  return path[::-1]


@functools.lru_cache(maxsize=None)
def _params(v11: bool):
  return make_model(tiny_config(v11=v11), seed=11)[1]  # float32 whatever the network's dtype


@functools.lru_cache(maxsize=None)
def _setup(v11: bool, dtype, mode: str):
  """(jitted calls, decode variables, the cache after a prefix), made for kernel mode
  `mode`: call them only inside modes.decode_mode(mode), where they were traced."""
  module, params = Transformer(tiny_config(v11=v11, dtype=dtype)), _params(v11)
  variables = packing.decode_variables(module, params, mode)
  extend = lambda v, c, t, p, **kw: module.apply(v, c, t, p, method='extend', **kw)
  calls = {'module': module, 'chain': jax.jit(extend),
           'tree': jax.jit(lambda v, c, t, p, parents: extend(v, c, t, p, tree=parents)),
           'compact': jax.jit(tree.compact)}
  with modes.decode_mode(mode):
    enc = jnp.asarray(random_inputs(2, 9, 40, seed=12))
    encoded = jax.jit(lambda v, e: module.apply(v, e, method='encode'))(variables, enc)
    cache = jax.jit(lambda v, x, e: module.apply(v, x, e, 24, method='init_cache'))(
        variables, encoded, enc)
    prefix = jnp.asarray(np.random.RandomState(13).randint(2, 40, (2, LONGEST)), jnp.int32)
    _, cache = calls['chain'](variables, cache, prefix, jnp.zeros((2,), jnp.int32))
  return calls, variables, cache


def _tokens(seed: int, k: int):
  return jnp.asarray(np.random.RandomState(seed).randint(2, 40, (2, k)), jnp.int32)


def test_tree_shapes_and_validation():
  np.testing.assert_array_equal(tree.depths(PARENTS), DEPTHS)
  anc = np.asarray(tree.ancestors(PARENTS))
  for r in range(2):
    for i in range(PARENTS.shape[1]):
      np.testing.assert_array_equal(np.nonzero(anc[r, i])[0], sorted(_path(r, i)))
  np.testing.assert_array_equal(tree.chain(2, 4), [[-1, 0, 1, 2]] * 2)
  np.testing.assert_array_equal(tree.depths(tree.chain(3, 5)), [[0, 1, 2, 3, 4]] * 3)
  with pytest.raises(ValueError, match='row 1: the parent of node 3 must be an earlier node'):
    tree.check(np.array([[-1, 0, 1, 2], [-1, 0, 0, 3]]))
  with pytest.raises(ValueError, match='row 0: the parent of node 2 must be an earlier'):
    tree.depths(np.array([[-1, 0, -1]]))
  with pytest.raises(ValueError, match='row 0: node 0 is the root, its parent must be -1'):
    tree.ancestors(np.array([[0, 0]]))
  with pytest.raises(ValueError, match=r'parents \[batch, nodes >= 1\] of integers'):
    tree.check(np.array([-1, 0, 1]))
  with pytest.raises(ValueError, match='of integers'):
    tree.check(np.array([[-1.0, 0.0]]))
  with pytest.raises(ValueError, match='Accepted path row 1 must start at the root'):
    tree.check_path(np.array([[0, 1], [1, 2]]))
  with pytest.raises(ValueError, match=r'row 0 .*increasing node indices\), then repeat its '
                                       r'last node, got \[0, 2, 1\]'):
    tree.check_path(np.array([[0, 2, 1]]))
  with pytest.raises(ValueError, match=r'row 1 .*got \[0, 1, 1, 3\]'):
    tree.check_path(np.array([[0, 1, 3, 3], [0, 1, 1, 3]]))
  np.testing.assert_array_equal(tree.check_path([[0, 2, 2], [0, 1, 3]]), [[0, 2, 2], [0, 1, 3]])


def test_a_tree_call_takes_parents_of_its_tokens_shape():
  calls, variables, cache = _setup(True, jnp.float32, 'xla')
  with modes.decode_mode('xla'):
    with pytest.raises(ValueError, match=r'takes parents of that shape, got \(2, 4\)'):
      calls['tree'](variables, cache, _tokens(1, 8), jnp.asarray(POSITIONS), tree.chain(2, 4))


@pytest.mark.parametrize('v11,dtype,mode', CASES)
def test_each_node_of_a_tree_call_is_a_chain_call_over_its_path(v11, dtype, mode):
  """Node i's logits are bitwise those of a chain call over its root-to-node path from the
  same cache (all paths of a node index in one batched call, each row's path padded after
  its end: causal, so the padding changes nothing before it)."""
  calls, variables, cache = _setup(v11, dtype, mode)
  with modes.decode_mode(mode):
    tokens = _tokens(14, PARENTS.shape[1])
    positions = jnp.asarray(POSITIONS)
    logits, _ = calls['tree'](variables, cache, tokens, positions, jnp.asarray(PARENTS))
    for node in range(PARENTS.shape[1]):
      chain = np.array(_tokens(15 + node, LONGEST))
      for r in range(2):
        path = _path(r, node)
        chain[r, :len(path)] = np.asarray(tokens)[r, path]
      expected, _ = calls['chain'](variables, cache, jnp.asarray(chain), positions)
      for r in range(2):
        np.testing.assert_array_equal(logits[r, node], expected[r, DEPTHS[r, node]],
                                      err_msg=f'row {r}, node {node}')


@pytest.mark.parametrize('mode', MODES)
def test_a_chain_tree_is_todays_call(mode):
  calls, variables, cache = _setup(True, jnp.float32, mode)
  with modes.decode_mode(mode):
    tokens, positions = _tokens(16, 5), jnp.asarray(POSITIONS)
    as_tree = calls['tree'](variables, cache, tokens, positions, tree.chain(2, 5))
    plain = calls['chain'](variables, cache, tokens, positions)
    for a, b in zip(jax.tree_util.tree_leaves(as_tree), jax.tree_util.tree_leaves(plain)):
      np.testing.assert_array_equal(a, b)


def test_a_tree_call_returns_features():
  calls, variables, cache = _setup(True, jnp.float32, 'packed')
  with modes.decode_mode('packed'):
    tokens, positions, parents = _tokens(17, 8), jnp.asarray(POSITIONS), jnp.asarray(PARENTS)
    logits, _ = calls['tree'](variables, cache, tokens, positions, parents)
    module = calls['module']
    got, _, features = jax.jit(lambda v, c, t, p, parents: module.apply(
        v, c, t, p, True, (0,), method='extend', tree=parents))(
            variables, cache, tokens, positions, parents)
    np.testing.assert_array_equal(got, logits)
    assert features.shape == (2, 8, 2 * tiny_config().emb_dim)
    chain = np.asarray(tokens)[np.arange(2)[:, None], [_path(0, 7), _path(1, 7)]]
    _, _, expected = jax.jit(lambda v, c, t, p: module.apply(
        v, c, t, p, True, (0,), method='extend'))(variables, cache, jnp.asarray(chain), positions)
    np.testing.assert_array_equal(features[:, 7], expected[:, -1])


def _slots(cache, start: int, stop: int, row: int):
  """Every layer's self-attention keys and values of `row` at slots [start, stop)."""
  return [(np.asarray(l['k'][row, ..., start:stop]), np.asarray(l['v'][row, :, start:stop]))
          for l in cache['layers']]


@pytest.mark.parametrize('v11,dtype,mode', CASES)
def test_compaction_leaves_the_cache_of_a_chain_over_the_path(v11, dtype, mode):
  """Tree call, then compact along a path through the root's second child: the path's
  slots are bitwise a chain call's, the next call's logits are bitwise those of a decode
  that only ever fed the path, and the rejected nodes' tokens do not reach them."""
  calls, variables, cache = _setup(v11, dtype, mode)
  with modes.decode_mode(mode):
    positions, parents = jnp.asarray(POSITIONS), jnp.asarray(PARENTS)
    tokens = np.asarray(_tokens(18, PARENTS.shape[1]))
    following = _tokens(19, LONGEST)
    length = PATH.shape[1]
    # The path's tokens, padded to the chain program's length: the following call from
    # positions + length overwrites the padding's slots before anything reads them.
    path_tokens = np.array(_tokens(21, LONGEST))
    path_tokens[:, :length] = tokens[np.arange(2)[:, None], PATH]
    _, reference = calls['chain'](variables, cache, jnp.asarray(path_tokens), positions)
    expected, _ = calls['chain'](variables, reference, following, positions + length)
    rejected = np.ones_like(tokens, bool)
    rejected[np.arange(2)[:, None], PATH] = False
    for seed in (None, 20):  # the same tree, then its rejected nodes' tokens changed
      if seed is not None:
        changed = np.where(rejected, (tokens - 2 + seed) % 38 + 2, tokens)
        assert np.all(changed[rejected] != tokens[rejected])
        tokens = changed
      _, after_tree = calls['tree'](variables, cache, jnp.asarray(tokens), positions, parents)
      compacted = calls['compact'](after_tree, positions, jnp.asarray(PATH))
      assert not bool(compacted['skipped_writes'])
      for r in range(2):
        start = POSITIONS[r] + 1
        for got, want in zip(_slots(compacted, 0, start + length, r),
                             _slots(reference, 0, start + length, r)):
          np.testing.assert_array_equal(got[0], want[0])
          np.testing.assert_array_equal(got[1], want[1])
      for got, want in zip(compacted['layers'], after_tree['layers']):
        np.testing.assert_array_equal(got['cross_k'], want['cross_k'])
        np.testing.assert_array_equal(got['cross_v'], want['cross_v'])
      logits, _ = calls['chain'](variables, compacted, following, positions + length)
      np.testing.assert_array_equal(logits, expected)

