"""The packed CPU matmul only where it helps: params spread over several devices decode
with XLA's dot (which GSPMD partitions), with one log line; single-device params keep it.

Runs in a subprocess with 8 fake CPU devices (XLA_FLAGS must be set before JAX starts).
"""

import textwrap

import pytest
from conftest import run_child

from specdec_t5x.algorithm.cpu import build


pytestmark = pytest.mark.skipif(
    not build.cpu_has_avx2_fma(),
    reason='the packed CPU matmul needs x86-64 with AVX2 and FMA')

_CHILD = textwrap.dedent('''
    import json
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from specdec_t5x.algorithm import api, network
    from specdec_t5x.algorithm.cpu import matmul, modes, packing
    from specdec_t5x.algorithm.config import DecodeConfig
    assert jax.device_count() == 8 and modes.enabled()

    cfg = network.T5Config(vocab_size=64, emb_dim=32, num_heads=8, num_encoder_layers=1,
                           num_decoder_layers=1, head_dim=4, mlp_dim=64, dropout_rate=0.0,
                           mlp_activations=('gelu', 'linear'))
    module, x = network.Transformer(cfg), jnp.asarray(np.arange(2, 14).reshape(2, 6), jnp.int32)
    params = module.init(jax.random.PRNGKey(0), x, x)['params']
    mesh = Mesh(np.asarray(jax.devices()).reshape(1, 8), ('data', 'model'))
    def place(w):  # columns over 'model' where they divide, else replicated
      spec = P(None, 'model') if w.ndim == 2 and w.shape[1] % 8 == 0 else P()
      return jax.device_put(w, NamedSharding(mesh, spec))
    sharded = jax.tree_util.tree_map(place, params)
    one_device = jax.tree_util.tree_map(lambda w: jax.device_put(w, jax.devices()[5]), params)

    def has_packed(p):
      return matmul.COLLECTION in packing.decode_variables(module, p)

    def kernel_calls(p):  # the custom calls in the compiled generate program
      fn = api.compiled_program(module, None, max_len=5, config=DecodeConfig())
      text = fn.lower(packing.decode_variables(module, p), None, x, jax.random.PRNGKey(0),
                      jnp.int32(1)).as_text()
      return text.count('specdec_panel_matmul')

    traced = []
    jax.jit(lambda p: traced.append(has_packed(p)) or 0)(params)
    out = {
        'unsharded': has_packed(params), 'one_device': has_packed(one_device),
        'sharded': has_packed(sharded), 'sharded_again': has_packed(sharded),
        'traced': traced[0],
        'calls_unsharded': kernel_calls(params), 'calls_sharded': kernel_calls(sharded),
        'same_tokens': bool(np.array_equal(
            api.generate((module, params), x, max_decode_length=5).tokens,
            api.generate((module, sharded), x, max_decode_length=5).tokens)),
    }
    print('RESULT ' + json.dumps(out))
''')


@pytest.mark.slow  # a subprocess on several host devices
def test_sharded_params_decode_with_xla_dot_and_say_so():
  out, stderr = run_child(_CHILD, host_devices=8, with_stderr=True)
  assert out['unsharded'] and out['one_device'], out  # one device each: packed
  assert not out['sharded'] and not out['sharded_again'], out
  assert not out['traced'], out  # 8 devices, shardings unseen inside the trace: XLA's dot
  assert out['calls_unsharded'] > 0 and out['calls_sharded'] == 0, out
  assert out['same_tokens'], out
  logged = [l for l in stderr.splitlines() if 'spread over 8 devices' in l]
  assert len(logged) == 1, stderr[-3000:]  # once per process, not per call
