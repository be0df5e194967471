"""A small T5X-style partitioner: a ('data', 'model') mesh and logical axis rules.

Each parameter of the T5 tree (network.py, identical to T5X's) gets the logical axes
T5X's `t5x/examples/t5/network.py` gives it (e.g. attention query kernels
('embed', 'joined_kv')); T5X's `standard_logical_axis_rules` map logical to mesh axes
(batch -> 'data'; vocab, mlp, heads, joined_kv -> 'model'; embed, kv -> replicated).
So query/key/value kernels are sharded (None, 'model'), attention `out` kernels
('model', None), MLP `wi` (None, 'model') and `wo` ('model', None), the token embedding
('model', None) and `logits_dense` (None, 'model'). Relative-position tables, layer-norm
scales and anything unknown (e.g. n-gram draft tables) are replicated. A dimension that
the mesh axis does not divide is replicated instead of failing.

`PjitPartitioner` is T5X's `t5x.partitioning.PjitPartitioner` (plus the placement methods
below) when T5X is importable, so the one gin binding `partitioning.PjitPartitioner` serves
`python -m t5x.infer` and `python -m specdec_t5x.infer`; without T5X it is
`StandalonePjitPartitioner`, the same placement over a mesh built here.

Arrays are placed as global arrays with `NamedSharding(mesh, spec)`; the jitted
decoding loop then runs SPMD (GSPMD propagates the shardings), so the same `generate`
call serves one device or many.

Multi-host (several processes, e.g. a TPU pod slice or several GPU hosts): every process
runs the same command and calls `initialize_distributed()` first, before any other JAX
call (multihost.py); on Cloud TPU the coordinator is discovered automatically, elsewhere
pass `coordinator_address='host0:port', num_processes=N, process_id=i`.
`python -m specdec_t5x.infer --multihost` does this. The mesh then spans `jax.devices()`
of all processes, and each process places only the rows of a batch that its own devices
hold (`host_rows`, `shard_host_rows`).
"""

from __future__ import annotations

import functools
import re
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import jax
import numpy as np
from flax import traverse_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from specdec_t5x.integration import multihost

try:  # T5X is not on PyPI: use its partitioner only when it is installed.
  from t5x import partitioning as t5x_partitioning  # type: ignore
except ImportError:
  t5x_partitioning = None

LogicalAxisRules = Sequence[Tuple[str, Optional[str]]]
AxisNames = Tuple[Optional[str], ...]


def standard_logical_axis_rules() -> LogicalAxisRules:
  """T5X's default rules (1-D activation and parameter partitioning)."""
  return (
      ('batch', 'data'),
      ('vocab', 'model'),
      ('embed', None),
      ('mlp', 'model'),
      ('heads', 'model'),
      ('kv', None),
      ('joined_kv', 'model'),
      ('relpos_buckets', None),
      ('length', None),
  )


# (regex on the '/'-joined parameter path, logical axes), first match wins.
_PARAM_AXES: Tuple[Tuple[str, AxisNames], ...] = (
    (r'(^|/)token_embedder/embedding$', ('vocab', 'embed')),
    (r'/(query|key|value)/kernel$', ('embed', 'joined_kv')),
    (r'/out/kernel$', ('joined_kv', 'embed')),
    (r'/mlp/wi(_\d+)?/kernel$', ('embed', 'mlp')),
    (r'/mlp/wo/kernel$', ('mlp', 'embed')),
    (r'(^|/)logits_dense/kernel$', ('embed', 'vocab')),
    # T5X shards the [heads, buckets] table over heads; it is tiny, so we replicate it.
    (r'/rel_embedding$', (None, 'relpos_buckets')),
    (r'/scale$', ('embed',)),
)


def logical_axes(path: str, ndim: int) -> AxisNames:
  """Logical axis names of the parameter at `path` ('a/b/kernel'); unknown -> replicated."""
  for pattern, axes in _PARAM_AXES:
    if re.search(pattern, path) and len(axes) == ndim:
      return axes
  return (None,) * ndim


def logical_to_mesh_spec(axes: AxisNames, rules: LogicalAxisRules, shape: Sequence[int] = (),
                         mesh_shape: Optional[Mapping[str, int]] = None) -> PartitionSpec:
  """Maps logical axes to a PartitionSpec; drops a mesh axis that does not divide the dim
  (or is already used by an earlier dim)."""
  table = dict(rules)
  used, spec = set(), []
  for i, name in enumerate(axes):
    mesh_axis = table.get(name) if name is not None else None
    if mesh_axis is not None and mesh_shape is not None:
      size = mesh_shape.get(mesh_axis, 1)
      if mesh_axis in used or (shape and shape[i] % size):
        mesh_axis = None
    if mesh_axis is not None:
      used.add(mesh_axis)
    spec.append(mesh_axis)
  return PartitionSpec(*spec)


def param_partition_specs(params: Any, rules: Optional[LogicalAxisRules] = None,
                          mesh_shape: Optional[Mapping[str, int]] = None) -> Any:
  """A tree like `params` (nested dicts) holding each parameter's PartitionSpec."""
  rules = standard_logical_axis_rules() if rules is None else rules
  flat = traverse_util.flatten_dict(_as_dict(params))
  specs = {}
  for key, value in flat.items():
    shape = tuple(np.shape(value))
    specs[key] = logical_to_mesh_spec(logical_axes('/'.join(key), len(shape)), rules, shape,
                                      mesh_shape)
  return traverse_util.unflatten_dict(specs)


def _as_dict(tree: Any) -> Dict:
  """FrozenDict / Mapping -> plain nested dict."""
  if isinstance(tree, Mapping):
    return {k: _as_dict(v) for k, v in tree.items()}
  return tree


def _put(value: Any, sharding: NamedSharding) -> jax.Array:
  """A global array from a host value every process holds (works multi-process too)."""
  value = np.asarray(value)
  return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def initialize_distributed(coordinator_address: Optional[str] = None,
                           num_processes: Optional[int] = None,
                           process_id: Optional[int] = None) -> None:
  """Multi-host start-up (call before any other JAX use): multihost.initialize."""
  multihost.initialize(coordinator_address, num_processes, process_id)


def grid_mesh(devices: Sequence[Any], num_partitions: int) -> Mesh:
  """Mesh ('data', 'model') of `devices` in order, `num_partitions` per model replica."""
  devices = list(devices)
  if num_partitions < 1 or len(devices) % num_partitions:
    raise ValueError(f'num_partitions={num_partitions} must divide the number of '
                     f'devices ({len(devices)}).')
  return Mesh(np.asarray(devices, dtype=object).reshape(-1, num_partitions), ('data', 'model'))


class _Placement:
  """Placing params and batches on `self.mesh` by `self.logical_axis_rules`: what
  `python -m specdec_t5x.infer` needs of a partitioner, on top of T5X's interface."""

  @property
  def data_parallel_size(self) -> int:
    return self.mesh.shape['data']

  def param_partition_specs(self, params: Any) -> Any:
    return param_partition_specs(params, self.logical_axis_rules, dict(self.mesh.shape))

  def shard_params(self, params: Any) -> Any:
    """Places every parameter on the mesh according to its PartitionSpec."""
    params = _as_dict(params)
    specs = self.param_partition_specs(params)
    return jax.tree_util.tree_map(
        lambda x, spec: _put(x, NamedSharding(self.mesh, spec)), params, specs,
        is_leaf=lambda x: not isinstance(x, Mapping))

  def batch_spec(self, batch_size: int) -> PartitionSpec:
    """Rows over 'data' when it divides the batch; otherwise replicated (no padding)."""
    rule = dict(self.logical_axis_rules).get('batch')
    if rule is None or batch_size % self.mesh.shape[rule]:
      return PartitionSpec()
    return PartitionSpec(rule)

  def shard_batch(self, array: Any) -> jax.Array:
    """Places a [batch, ...] array: rows sharded over 'data' (see `batch_spec`)."""
    array = np.asarray(array)
    return _put(array, NamedSharding(self.mesh, self.batch_spec(array.shape[0])))

  def host_rows(self, batch_size: int) -> Tuple[int, int]:
    """(start, stop): the rows of a batch that this process's devices hold (a block,
    as T5X's hosts each feed their part of a global batch; all rows where the batch is
    replicated, or where model parallelism spans the hosts)."""
    sharding = NamedSharding(self.mesh, self.batch_spec(batch_size))
    rows = sorted({(i[0].start or 0, batch_size if i[0].stop is None else i[0].stop)
                   for i in sharding.addressable_devices_indices_map((batch_size,)).values()})
    if any(a[1] != b[0] for a, b in zip(rows, rows[1:])):
      return 0, batch_size  # not one block (an unusual device order): hold them all
    return rows[0][0], rows[-1][1]

  def shard_host_rows(self, rows: Any, batch_size: int, start: int) -> jax.Array:
    """A global [batch_size, ...] array from this process's rows start..start+len(rows)
    (`host_rows`); each process passes its own."""
    rows = np.asarray(rows)
    sharding = NamedSharding(self.mesh, self.batch_spec(batch_size))
    def local(index):
      first = index[0].start or 0
      stop = batch_size if index[0].stop is None else index[0].stop
      return rows[(slice(first - start, stop - start),) + tuple(index[1:])]
    return jax.make_array_from_callback((batch_size,) + rows.shape[1:], sharding, local)


class StandalonePjitPartitioner(_Placement):
  """Mesh ('data', 'model') over `devices`; `num_partitions` devices per model replica.

  Args:
    num_partitions: size of the 'model' axis (T5X's name); must divide the device count.
    logical_axis_rules: (logical, mesh axis) pairs; default `standard_logical_axis_rules()`.
    devices: the devices to use; default `jax.devices()` (all processes).
  """

  def __init__(self, num_partitions: int = 1,
               logical_axis_rules: Optional[LogicalAxisRules] = None,
               devices: Optional[Sequence[Any]] = None):
    self._devices = devices
    self.num_partitions = int(num_partitions)
    self.logical_axis_rules = tuple(logical_axis_rules or standard_logical_axis_rules())
    self._mesh: Optional[Mesh] = None

  @property
  def mesh(self) -> Mesh:
    """Built on first use, so that constructing a partitioner touches no device."""
    if self._mesh is None:
      self._mesh = grid_mesh(
          self._devices if self._devices is not None else jax.devices(), self.num_partitions)
    return self._mesh


if t5x_partitioning is not None:

  class PjitPartitioner(_Placement, t5x_partitioning.PjitPartitioner):
    """T5X's PjitPartitioner (so `python -m t5x.infer` gets T5X's whole interface: mesh,
    `partition`, `get_mesh_axes` over the model's `params_axes`), plus the placement
    methods `python -m specdec_t5x.infer` uses. Constructor: T5X's; `num_partitions`
    defaults to 1."""

    def __init__(self, num_partitions: Optional[int] = 1, **kwargs: Any):
      super().__init__(num_partitions=num_partitions, **kwargs)
      self.num_partitions = num_partitions

    @functools.cached_property
    def mesh(self) -> Mesh:
      """T5X's mesh on accelerators. On CPU, T5X puts every device on 'model' whatever
      `num_partitions` says; here the CPU mesh is (data, num_partitions), as asked."""
      if jax.devices()[0].platform == 'cpu' and self.num_partitions:
        return grid_mesh(jax.devices(), self.num_partitions)
      return super().mesh

else:
  PjitPartitioner = StandalonePjitPartitioner
