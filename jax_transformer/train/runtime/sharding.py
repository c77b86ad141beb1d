"""Where a run's arrays live: a mesh of two axes, "data" x "fsdp" (--fsdp N), batches
split over both, and every parameter and Adam moment split along "fsdp" on one
dimension (fully sharded data parallelism, ZeRO-3: XLA gathers each weight where a
step uses it and reduce-scatters its gradient). With --fsdp 1 the mesh is
data-parallel only and every array is whole on every device.

    make_mesh(fsdp, devices)    the ("data", "fsdp") mesh (check_fsdp: N divides the devices)
    fsdp_spec(shape, n)         the rule, written once: the largest dimension n divides
    shardings(tree, mesh)       a NamedSharding for every leaf of a pytree of arrays
    place(tree, shardings)      a host's (or one device's) arrays put where they belong
    local_copy(array)           the whole value on this process's first device
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from transformer_core.errors import TrainError

AXES = ("data", "fsdp")


def make_mesh(fsdp: int = 1, devices=None) -> jax.sharding.Mesh:
    """(devices / fsdp) x fsdp devices, in automatic sharding mode: XLA propagates the
    shardings of the batch and the state through each step. Neighbouring devices
    (on a GPU host, those joined by NVLink) share the "fsdp" axis, which carries the
    weights' all-gathers."""
    devices = devices if devices is not None else jax.devices()
    check_fsdp(fsdp, len(devices))
    return jax.make_mesh((len(devices) // fsdp, fsdp), AXES, devices=devices,
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)


def check_fsdp(fsdp: int, device_count: int) -> None:
    """--fsdp must divide the device count: a TrainError naming both."""
    if fsdp < 1 or device_count % fsdp:
        raise TrainError(f"--fsdp {fsdp} must divide the number of devices, {device_count}")


def fsdp_spec(shape: tuple[int, ...], n: int) -> PartitionSpec:
    """The largest dimension of `shape` that `n` divides, split over "fsdp" (the first
    such where several tie); nothing split where none is (or n is 1). An embedding
    (vocabulary, d_model) splits along the vocabulary when n divides it."""
    if n == 1:
        return PartitionSpec()
    sizes = [size if size % n == 0 else 0 for size in shape]
    if not any(sizes):
        return PartitionSpec()
    axis = sizes.index(max(sizes))
    return PartitionSpec(*(None,) * axis, "fsdp")


def shardings(tree, mesh: jax.sharding.Mesh):
    """A NamedSharding for every array leaf of `tree` (arrays or ShapeDtypeStructs):
    its fsdp_spec on `mesh`."""
    n = mesh.shape["fsdp"]
    return jax.tree.map(lambda leaf: NamedSharding(mesh, fsdp_spec(leaf.shape, n)), tree)


def place(tree, tree_shardings):
    """`tree`, the same on every process, as global arrays of `tree_shardings`; with
    several processes by a compiled copy, since device_put reaches local devices only."""
    if jax.process_count() == 1:
        return jax.device_put(tree, tree_shardings)
    return jax.jit(lambda t: t, out_shardings=tree_shardings)(tree)


def local_copy(array: jax.Array) -> jax.Array:
    """The whole of a global array on this process's first device. A split one is
    gathered; across processes that is a collective, so every process must call it."""
    device = jax.local_devices()[0]
    if array.is_fully_replicated:
        return array.addressable_data(0)
    if array.is_fully_addressable:
        return jax.device_put(array, device)
    return jax.device_put(np.asarray(multihost_utils.process_allgather(array, tiled=True)),
                          device)
