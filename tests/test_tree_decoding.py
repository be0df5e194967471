"""Tree verification driven by generate (copy_branch or draft_siblings set;
algorithm/decode/static_tree.py): each step verifies the draft's chain, a copy branch
(prompt lookup) and the draft's runner-up tokens beside each chain token (siblings), the last two
fixed guesses, in one target call, and stays exact.

* Greedy: token for token the target's greedy decoding (batch 1 and 3, rows of different
  lengths, EOS mid-batch, a decoder prompt), and the copy branch's tokens really are
  accepted: more tokens per target call than the chain with the same draft, siblings
  accepted, and with a draft that is never right every accepted token is a copied one.
* Sampled: the enumerated sequence law of test_distribution (V = 4, 5 tokens) by
  chi-square for temperature 1, top-k and top-p, every outcome of a step (nothing accepted,
  some, a leaf reached) and MIN_BRANCH tokens accepted from each kind of guess the tree
  has; rows of different inputs each follow their own law; a rule that accepts a fixed
  guess with probability p(x) instead of the residual r(x) fails the same test, for the
  copy branch and for the siblings.
* Settings a tree cannot be verified with raise, naming copy_branch or draft_siblings.

Few distinct programs: each (batch, gamma, copy_branch, draft_siblings, sampling, draft,
max_len, prompt) compiles one.
"""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_inputs
import test_distribution as td
from test_decoding import _eos_mid_batch
from specdec_t5x import generate
from specdec_t5x.algorithm import api, sampling
from specdec_t5x.algorithm.trees import accept as tree_accept
from specdec_t5x.algorithm.trees import build
from specdec_t5x.algorithm.trees import structure as tree_lib
from specdec_t5x.algorithm.config import DecodeConfig
from specdec_t5x.algorithm.drafts import CopyDraft, UnigramDraft

VOCAB = 40  # conftest's target_and_draft
L = 16  # the greedy cases' max_decode_length and encoder length


def _arrays(stats):
  return {k: np.asarray(v) for k, v in stats.items()}


def _check_stats(stats, depth, tokens, eos):
  """The counters of a tree decode are a chain's, over max(gamma, c) + 1 lengths."""
  s = _arrays(stats)
  assert s['accepted_length_histogram'].shape == (depth + 1,)
  assert s['draft_length_histogram'].shape == (depth + 1,)
  steps = s['target_calls'].sum()
  assert s['accepted_length_histogram'].sum() == steps
  assert s['draft_length_histogram'].sum() == steps
  assert s['accepted_length_histogram'] @ np.arange(depth + 1) == s['accepted_tokens'].sum()
  assert s['step_outcomes'].sum() <= steps
  assert s['accepted_by_source'].sum() == s['accepted_tokens'].sum()
  # Each step emits its accepted tokens and one more; only an EOS cuts a step's tokens.
  emitted = s['accepted_tokens'] + s['target_calls']
  assert np.all(s['generated_tokens'] <= emitted) and np.all(s['target_calls'] >= 1)
  last = np.asarray(tokens)[np.arange(len(emitted)), np.asarray(tokens).shape[1] - 1]
  no_eos = ~np.any(np.asarray(tokens) == eos, axis=1) | (last == eos)
  np.testing.assert_array_equal(s['generated_tokens'][no_eos], emitted[no_eos])
  return s


def _own_output(target, batch, seed):
  """Encoder inputs [batch, L]: the target's own greedy output for random inputs, row r cut
  to L - 4r tokens. (This random target hardly copies its input; its greedy outputs repeat
  themselves, so most accepted copies come from the decoded prefix.)"""
  enc = random_inputs(batch, L, VOCAB, seed=seed)
  out = np.array(generate(target, enc, max_decode_length=L, eos_id=-1).tokens)
  for r in range(batch):
    out[r, L - 4 * r:] = 0
  return out


def _noisy(params, scale=0.6):
  """The target's params with Gaussian noise of `scale` times each array's spread: a draft
  whose first choice often differs from the target's while its second often agrees (the
  random small draft rarely ranks the target's choice second: siblings would go untested)."""
  leaves, treedef = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(5), len(leaves))
  return jax.tree_util.tree_unflatten(treedef, [
      x + scale * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype)
      for x, k in zip(leaves, keys)])


def greedy_runs(target, draft, batch, gamma, with_prompt, depth, **tree):
  """For seeds 0..2, a tree decode (`tree`: its DecodeConfig fields) of inputs the target
  decodes in full, checked against greedy autoregressive decoding token for token, its
  counters (`_check_stats` up to `depth`) and a decoder prompt (the target's own first 3
  tokens) kept; batch 3 has an EOS that ends its rows at different times, batch 1 none (L
  tokens to copy in). Yields (enc, the decode's arguments, the AR result, the tree's
  counters); once exhausted, checks that EOS ended some row before L."""
  lengths = []
  for seed in range(3):
    enc = _own_output(target, batch, seed)
    eos = _eos_mid_batch(target, enc, L) if batch > 1 else -1
    prompt = enc[:, :3] if with_prompt else None
    args = dict(max_decode_length=L, eos_id=eos, decoder_prompt=prompt)
    ar = generate(target, enc, **args)
    out = generate(target, enc, draft=draft, gamma=gamma, **args, **tree)
    msg = f'{tree} seed={seed} eos={eos}'
    np.testing.assert_array_equal(out.tokens, ar.tokens, err_msg=msg)
    np.testing.assert_array_equal(out.stats['generated_tokens'], ar.stats['generated_tokens'])
    s = _check_stats(out.stats, depth, out.tokens, eos)
    if with_prompt:
      np.testing.assert_array_equal(np.asarray(out.tokens)[:, :3], prompt)
    lengths.append(s['generated_tokens'])
    yield enc, args, ar, s
  if batch > 1:
    assert any(len(set(n.tolist())) > 1 and n.min() < L for n in lengths), lengths


GREEDY = {  # name: (batch, gamma, copy_branch, draft_siblings, draft, decoder prompt)
    'b1_g1_c2': (1, 1, 2, 0, 'model', False),
    'b3_g3_c4_eos': (3, 3, 4, 0, 'model', False),
    'b3_g1_c4_useless_draft': (3, 1, 4, 0, 'useless', False),
    'b1_g3_c4_copydraft_prompt': (1, 3, 4, 0, 'copy', True),
    'b1_g2_s2': (1, 2, 0, 2, 'model', False),
    'b3_g3_s21_eos': (3, 3, 0, (2, 1), 'noisy', False),
}


@pytest.mark.parametrize('name', list(GREEDY))
def test_greedy_tree_equals_greedy_target(target_and_draft, name):
  batch, gamma, c, siblings, kind, with_prompt = GREEDY[name]
  target, model = target_and_draft
  draft = {'model': model,
           'useless': (UnigramDraft(VOCAB), {'logits': jnp.zeros((VOCAB,), jnp.float32)}),
           'copy': (CopyDraft(VOCAB), {}),
           'noisy': (target[0], _noisy(target[1]))}[kind]
  totals = collections.Counter()
  source = np.zeros(3, np.int64)  # the tree's accepted tokens by stats.SOURCES index
  runs = greedy_runs(target, draft, batch, gamma, with_prompt, max(gamma, c), copy_branch=c,
                     draft_siblings=siblings)
  for enc, args, ar, s in runs:
    source += s['accepted_by_source']
    if kind == 'useless':  # greedy q is one-hot on token 0, which the target never emits:
      # no chain node is ever accepted, every accepted token is a copied one
      assert not np.any(np.asarray(ar.tokens)[np.arange(L) < s['generated_tokens'][:, None]] == 0)
      totals['tree', 'accepted_tokens'] += int(s['accepted_tokens'].sum())
      totals['tree', 'generated_tokens'] += int(s['generated_tokens'].sum())
      totals['tree', 'target_calls'] += int(s['target_calls'].sum())
      continue
    if with_prompt:
      continue
    chain = generate(target, enc, draft=draft, gamma=gamma, **args)
    np.testing.assert_array_equal(chain.tokens, ar.tokens)
    for key, st in (('tree', s), ('chain', chain.stats)):
      for field in ('generated_tokens', 'target_calls', 'accepted_tokens'):
        totals[key, field] += int(np.sum(st[field]))
  assert bool(source[2]) == bool(siblings), source
  if kind != 'copy':  # (a copying draft's chain is the copy branch: its nodes are shared)
    assert bool(source[1]) == bool(c), source
  if kind == 'useless':  # the chain alone would take one token per call
    assert totals['tree', 'accepted_tokens'] >= 0.2 * totals['tree', 'generated_tokens'], (
        dict(totals))
    assert source[1] == totals['tree', 'accepted_tokens'], source  # all copied
  elif not with_prompt:
    rate = {k: totals[k, 'generated_tokens'] / totals[k, 'target_calls']
            for k in ('tree', 'chain')}
    # The chain's path is in the tree: copied tokens accepted beyond it raise tokens per call.
    assert rate['tree'] > rate['chain'], (rate, dict(totals))


# Sampled: test_distribution's target and draft (V = 4). The copy branch has nothing to
# look up at a row's first step, so the input is one after which the target rarely stops
# at once (EOS first: 0.35; after test_distribution's ENC: 0.55): rows take several steps,
# whose lookups of 3s and 2s match, and the copy branch's guesses are often tested after
# the chain's node was rejected (which the broken control needs).
ENC = np.array([[3, 3, 3, 2, 3, 3, 3, 2]], np.int32)
SAMPLED = {  # name: (sampling, copy_branch, draft_siblings, seed)
    't1': (sampling.SamplingConfig(1.0), 3, 0, 21),
    'topk3': (sampling.SamplingConfig(1.0, topk=3), 2, 0, 22),
    'topp0.8': (sampling.SamplingConfig(1.0, topp=0.8), 3, 0, 23),
    't1_siblings': (sampling.SamplingConfig(1.0), 0, (2, 1), 25),
    'topk3_copy_siblings': (sampling.SamplingConfig(1.0, topk=3), 2, 1, 26),
}
GAMMA = 2


@pytest.fixture(scope='module')
def models():
  target = td.make_model(td.tiny_config(vocab=td.VOCAB), seed=10, logit_scale=1.5)
  draft = td.make_model(td.tiny_config(vocab=td.VOCAB, emb=16, layers=1), seed=11,
                        logit_scale=1.5)
  return target, draft


def _tree_pvalue(target, draft, name):
  cfg, c, siblings, seed = SAMPLED[name]
  exact = td.exact_probabilities(target, ENC, cfg)
  assert abs(sum(exact.values()) - 1) < 1e-5
  sources = ('copy_branch',) * bool(c) + ('draft_siblings',) * bool(siblings)
  counts = td.sample_counts(target, draft, ENC, cfg, seed=seed, gamma=GAMMA, copy_branch=c,
                            draft_siblings=siblings, sources=sources)
  return td.chi2_pvalue(exact, counts)


@pytest.mark.parametrize('name', list(SAMPLED))
def test_sampled_tree_matches_exact_target_distribution(models, name):
  target, draft = models
  pvalue = _tree_pvalue(target, draft, name)
  assert pvalue > 1e-3, pvalue


def test_rows_of_different_inputs_each_follow_their_own_law(models):
  """Two inputs of different lengths in one batch (t1's program), the rows of each
  adjacent: each input's rows follow its own exact law."""
  target, draft = models
  cfg, c, _, _ = SAMPLED['t1']
  enc = np.concatenate([ENC, [[3, 3, 0, 0, 0, 0, 0, 0]]]).astype(np.int32)
  half = td.ROWS // 2
  out = generate(target, np.repeat(enc, half, 0), draft=draft, gamma=GAMMA, copy_branch=c,
                 temperature=1.0, max_decode_length=td.MAX_LEN, eos_id=td.EOS,
                 rng=jax.random.PRNGKey(24))
  td.require_branches(out.stats)
  tokens = np.asarray(out.tokens)
  laws = [td.exact_probabilities(target, enc[i:i + 1], cfg) for i in range(2)]
  for i in range(2):
    assert td.chi2_pvalue(laws[i], td.counts_of(tokens[i * half:(i + 1) * half])) > 1e-3, i
  assert td.chi2_pvalue(laws[1], td.counts_of(tokens[:half])) < 1e-6  # the laws differ


def _guess_accepted_with_p(parents, tokens, sampled, valid, p, q, uniforms, max_depth=None,
                           without_replacement=False):
  """tree_accept.accept_sampled with one line broken: a fixed guess x is accepted with
  probability p(x) at the current node, not the residual r(x) left by its rejected
  siblings (for trees of guesses and i.i.d. children only)."""
  assert not without_replacement
  b, n, v = p.shape
  max_depth = n - 1 if max_depth is None else max_depth
  p, q = p.astype(jnp.float32), q.astype(jnp.float32)
  q_par = jnp.take_along_axis(q, jnp.maximum(parents, 0)[:, :, None], axis=1)
  current = jnp.zeros((b,), jnp.int32)
  r = p[:, 0]
  for i in range(1, n):
    tested = valid[:, i] & (parents[:, i] == current)
    is_x = jnp.arange(v)[None, :] == tokens[:, i][:, None]
    r_x = jnp.sum(jnp.where(is_x, r, 0.0), axis=1)
    q_x = jnp.sum(jnp.where(is_x, q_par[:, i], 0.0), axis=1)
    p_x = jnp.sum(jnp.where(is_x, _at(p, current), 0.0), axis=1)  # the target at the node
    u = uniforms[:, i]
    ok = jnp.where(sampled[:, i], (u * q_x < r_x) & (q_x > 0), u < p_x)  # the broken line
    accept, reject = tested & ok, tested & ~ok
    left = jnp.where(sampled[:, i, None], jnp.maximum(r - q_par[:, i], 0.0),
                     jnp.where(is_x, 0.0, r))
    mass = jnp.sum(left, axis=-1, keepdims=True)
    r_rejected = jnp.where(mass > 0, left / jnp.where(mass > 0, mass, 1.0), r)
    r = jnp.where(accept[:, None], p[:, i], jnp.where(reject[:, None], r_rejected, r))
    current = jnp.where(accept, i, current)
  depth = tree_lib.depths(parents)
  return (tree_accept.path_to(parents, current, max_depth), tree_accept._take(depth, current),
          r)


def _at(p, node):
  """p [b, N, V] at the per-row node [b] -> [b, V]."""
  return jnp.take_along_axis(p, node[:, None, None], axis=1)[:, 0]


@pytest.mark.parametrize('name', ['t1', 't1_siblings'])
def test_guess_accepted_with_p_instead_of_the_residual_is_detected(models, monkeypatch, name):
  """The control: the test of `name` (a copy branch; siblings), with fixed guesses
  accepted with probability p(x) after a rejected sibling instead of r(x), must fail (the
  guesses are tested after a rejected chain node often enough to show it)."""
  target, draft = models
  monkeypatch.setattr(tree_accept, 'accept_sampled', _guess_accepted_with_p)
  monkeypatch.setattr(api, '_COMPILED', collections.OrderedDict())
  assert _tree_pvalue(target, draft, name) < 1e-6


@pytest.mark.parametrize('settings', [
    dict(verifier='block'), dict(gamma_policy='confidence'), dict(gamma_policy='running_alpha'),
    dict(lenience=0.5), dict(copy_branch=-1), dict(copy_branch=1.5), dict(copy_branch='2'),
    dict(copy_branch=None), dict(copy_branch=5)], ids=lambda s: '-'.join(f'{k}={v}' for k, v in s.items()))
def test_settings_a_tree_cannot_take_raise(target_and_draft, settings):
  target, draft = target_and_draft
  settings = dict(dict(copy_branch=2), **settings)
  with pytest.raises(ValueError, match='copy_branch'):
    generate(target, random_inputs(1, 4, VOCAB), draft=draft, max_decode_length=4, **settings)


@pytest.mark.parametrize('settings', [
    dict(verifier='block'), dict(gamma_policy='confidence'), dict(lenience=0.5),
    dict(draft_siblings=-1), dict(draft_siblings=9), dict(draft_siblings=(1, 1.5)),
    dict(draft_siblings='2'), dict(draft_siblings=(1, 1, 1)), dict(draft_siblings=VOCAB),
    dict(gamma='auto')], ids=lambda s: '-'.join(f'{k}={v}' for k, v in s.items()))
def test_siblings_a_tree_cannot_take_raise(target_and_draft, settings):
  """As for copy_branch; also more depths than gamma = 2, and more siblings than the
  vocabulary has beside the draft's own token."""
  target, draft = target_and_draft
  settings = dict(dict(draft_siblings=1, gamma=2), **settings)
  with pytest.raises(ValueError, match='draft_siblings'):
    generate(target, random_inputs(1, 4, VOCAB), draft=draft, max_decode_length=4, **settings)


def test_draft_siblings_as_configuration():
  """An int means that many at every depth of the chain; trailing zeros are dropped; none
  is the chain's own configuration; describe() lists them only when set."""
  assert DecodeConfig(gamma=3, draft_siblings=2).draft_siblings == (2, 2, 2)
  assert DecodeConfig(gamma=3, draft_siblings=[1, 0, 0]).draft_siblings == (1,)
  assert DecodeConfig(draft_siblings=0) == DecodeConfig(draft_siblings=()) == DecodeConfig()
  assert not DecodeConfig().tree and DecodeConfig(gamma=2, draft_siblings=(0, 1)).tree
  assert DecodeConfig(gamma=2, draft_siblings=(0, 1), copy_branch=3).tree_nodes == 6
  assert 'draft_siblings' not in DecodeConfig().describe()
  assert DecodeConfig(gamma=2, draft_siblings=(2, 1)).describe()['draft_siblings'] == [2, 1]
  DecodeConfig(gamma=2, draft_siblings=(1, 7)).check_models(vocab_size=8, max_decode_length=4)
  with pytest.raises(ValueError, match='draft_siblings must be < the vocabulary size'):
    DecodeConfig(gamma=2, draft_siblings=(1, 8)).check_models(vocab_size=8, max_decode_length=4)


def test_runner_up_is_the_drafts_next_choices_without_its_own():
  logits = jnp.array([[0.1, 3.0, 2.0, 2.0, -1.0], [5.0, 1.0, 4.0, 0.0, 3.0]])
  np.testing.assert_array_equal(build.runner_up(logits, jnp.array([1, 2]), 2),
                                [[2, 3], [0, 4]])  # ties: the lower id first
  np.testing.assert_array_equal(build.runner_up(logits, jnp.array([4, 4]), 3),
                                [[1, 2, 3], [0, 2, 1]])  # a sampled token outside the top


def test_the_copy_branch_is_grafted_onto_the_chain():
  """Guesses equal to the chain are its nodes (void), the next hangs below the chain node
  holding them; an undrafted chain node holds nothing; a guess past the known tokens or
  the row's room is void."""
  root, chain = jnp.array([[9]] * 3), jnp.array([[5, 7, 3]] * 3)
  tree = build.chain(root, chain, jnp.array([3, 2, 3]))
  copy = jnp.array([[5, 7, 4, 2],  # 5, 7 the chain's: 4 below chain node 2, 2 below 4
                    [5, 7, 3, 1],  # chain node 3 undrafted: 3 a new node; 1 past the room
                    [6, 7, 1, 1]])  # 6 is not the chain's: new nodes, then unknown
  known = jnp.array([[True] * 4, [True] * 4, [True, True, False, False]])
  t, p, v = map(np.asarray, build.graft_copy(*tree, copy, known, jnp.array([4, 3, 4])))
  np.testing.assert_array_equal(t, np.concatenate([[[9, 5, 7, 3]] * 3, copy], axis=1))
  np.testing.assert_array_equal(p, [[-1, 0, 1, 2, 0, 1, 2, 6], [-1, 0, 1, 2, 0, 1, 2, 6],
                                    [-1, 0, 1, 2, 0, 4, 5, 6]])
  np.testing.assert_array_equal(v, [[True] * 4 + [False, False, True, True],
                                    [True] * 3 + [False] * 3 + [True, False],
                                    [True] * 6 + [False] * 2])


def test_siblings_a_copy_guess_holds_are_void():
  """A sibling under the same chain node as a valid copy guess of its token is void (the
  copy branch's own rule: `held`), and so is one below an undrafted chain node."""
  tree = build.chain(jnp.array([[9]] * 2), jnp.array([[5, 7]] * 2), jnp.array([2, 1]))
  tree = build.graft_copy(*tree, jnp.array([[6, 8]] * 2), jnp.ones((2, 2), bool),
                          jnp.array([2, 2]))  # new nodes 3 (below the root) and 4
  t, p, v = map(np.asarray, build.with_siblings(*tree, jnp.array([[6, 4, 2]] * 2), [1, 1, 2],
                                                jnp.array([2, 1])))
  np.testing.assert_array_equal(t[:, 5:], [[6, 4, 2]] * 2)
  np.testing.assert_array_equal(p[:, 5:], [[0, 0, 1]] * 2)
  np.testing.assert_array_equal(v[:, 5:], [[False, True, True], [False, True, False]])


def test_copy_branch_needs_a_draft(target_and_draft):
  """Without a draft (autoregressive) copy_branch raises before anything is traced;
  copy_branch=0 is the chain's own configuration."""
  target, _ = target_and_draft
  with pytest.raises(ValueError, match='copy_branch'):
    generate(target, random_inputs(1, 4, VOCAB), copy_branch=2, max_decode_length=4)
  assert DecodeConfig(copy_branch=0) == DecodeConfig()
  assert 'copy_branch' not in DecodeConfig(copy_branch=0).describe()
  assert DecodeConfig(copy_branch=3).describe()['copy_branch'] == 3


def test_copy_continuation_reads_what_followed_the_most_recent_match():
  """The last 1-3 committed tokens looked up (longest first, decoded matches later than
  encoder ones): the tokens after the match, known only where they exist in the same part
  (a match at the end of the encoder input does not run on into the decoded tokens)."""
  seq = np.zeros((2, 12), np.int32)
  seq[0, 2:7] = [4, 5, 9, 4, 5]  # y: the suffix (4, 5) occurs at y[0:2]
  seq[1, 2:4] = [6, 7]  # y: the suffix (6, 7) occurs at the encoder input's end only
  enc = np.array([[4, 5, 8, 8, 0], [2, 5, 3, 6, 7]], np.int32)
  tokens, known = build.copy_continuation(jnp.asarray(enc), jnp.asarray(seq),
                                          jnp.array([5, 2]), 4)
  np.testing.assert_array_equal(known, [[True, True, True, False], [False] * 4])
  np.testing.assert_array_equal(tokens[0, :3], [9, 4, 5])
  seq[1, 2:4] = [3, 6]  # now (3, 6) is found inside the encoder input: 7, then its end
  tokens, known = build.copy_continuation(jnp.asarray(enc), jnp.asarray(seq),
                                          jnp.array([5, 2]), 2)
  np.testing.assert_array_equal(known[1], [True, False])
  assert int(tokens[1, 0]) == 7
