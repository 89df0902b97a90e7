"""Data-parallel G-KL over devices: the site axis (rows of H and the per-site data) split over a device mesh.

The bound (Challis & Barber 2013, eq. 7) is a sum over sites of terms that touch only (m, C) and the site's own row, so
with H and the per-site arrays sharded by rows and q replicated, every device computes its sites' projections
m_n = h_n^T m and s_n^2 = ||C h_n||^2, their expectations and the matching pieces of the gradient locally;
the sums over sites (the bound, grad_m = H^T alpha, grad_C, and the same sums in every Hessian-vector product)
become one all-reduce each. The fits hold no hand-written collective code: `shard_sites` only places the
arrays (`jax.sharding.NamedSharding`) and XLA's SPMD partitioner inserts the all-reduces when `gkl_jax.fit`
(or `gkl_jax.bound`, `jax.grad`, the minibatch fit) compiles the program for sharded inputs (the one explicit
collective, with `process_local=True`, all-gathers a few integers per process to check that they agree). The
compiled HLO of the bound and its gradient holds `all-reduce` ops, and the sharded fit agrees with the
single-device fit to floating-point round-off, on virtual devices of one process (tests/test_scale.py) and on
several processes (tests/test_multiprocess.py).

The steps for one process with several devices and for several processes (`jax.distributed`), what is
replicated and what is sharded, and what happens when a process fails: the `gkl_jax.distributed` docstring.

Groups whose N is not a multiple of the number of devices are split into a sharded part (the largest
multiple) and a small replicated remainder (a second `Sites` group): the bound is the same sum.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from .._model import Model, Sites
from .._validate import as_list
from ..operators import AbstractOperator, Dense, Identity
from ..stochastic import SelectRows
from ._processes import check_processes

SITE_AXIS = "sites"


def site_mesh(devices=None, axis: str = SITE_AXIS) -> Mesh:
    """A 1-D mesh over `devices` (default: `jax.devices()`, i.e. every device of every process) whose only
    axis, named `axis`, carries the sites. The axis is `AxisType.Auto`: XLA propagates the shardings.

    Args:
        devices: a sequence of distinct `jax.Device`s, or None for `jax.devices()`.
        axis: the axis name (a non-empty string, default "sites").

    Returns:
        `jax.sharding.Mesh` of shape (len(devices),).

    Raises:
        ValueError: devices empty, not jax Devices or repeated, or axis not a non-empty string.
    """
    devices = jax.devices() if devices is None else _device_list(devices)
    if not devices:
        raise ValueError("devices must name at least one device")
    if not isinstance(axis, str) or not axis:
        raise ValueError(f"axis must be a non-empty string, got {axis!r}")
    return Mesh(np.array(devices), (axis,), axis_types=(AxisType.Auto,))


def _device_list(devices) -> list:
    """`devices` as a list of distinct `jax.Device`s; ValueError for anything else (a string such as "cpu" would
    otherwise become a mesh of its letters)."""
    devices = as_list(devices, "devices", "jax Devices (e.g. jax.devices('cpu'))")
    for i, device in enumerate(devices):
        if not isinstance(device, jax.Device):
            raise ValueError(f"devices must be a sequence of jax Devices, but devices[{i}] is "
                             f"{type(device).__name__} {device!r}")
    if len(set(devices)) != len(devices):
        raise ValueError(f"devices must be distinct, got {devices}")
    return devices


def _mesh_size(mesh, axis):
    if not isinstance(mesh, Mesh):
        raise ValueError(f"mesh must be a jax.sharding.Mesh (see gkl_jax.distributed.site_mesh), "
                         f"got {type(mesh).__name__}")
    if axis not in mesh.axis_names:
        raise ValueError(f"mesh has axes {tuple(mesh.axis_names)} but no site axis {axis!r}; pass axis=... or "
                         f"build the mesh with gkl_jax.distributed.site_mesh(axis={axis!r})")
    return int(mesh.shape[axis])


def _local_positions(mesh, axis) -> int:
    """How many positions along `axis` this process's devices occupy (the blocks of rows it supplies)."""
    mine = np.vectorize(lambda d: d.process_index == jax.process_index(), otypes=[bool])(mesh.devices)
    return len(set(np.argwhere(mine)[:, list(mesh.axis_names).index(axis)].tolist()))


class _Placer:
    """Puts host arrays on the mesh: rows split over `axis`, or replicated."""

    def __init__(self, mesh, axis, process_local):
        self.rows = NamedSharding(mesh, PartitionSpec(axis))
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self.process_local = process_local

    def _put(self, x, sharding):
        if self.process_local:
            return jax.make_array_from_process_local_data(sharding, np.asarray(x))
        return jax.device_put(x, sharding)

    def put_rows(self, x):
        return self._put(x, self.rows)

    def put_replicated(self, x):
        return self._put(x, self.replicated) if eqx.is_array(x) else x


def _site_rows(sites: Sites, dim: int, start: int, stop: int, place, shared) -> Sites:
    """Rows start:stop of the group, each per-site array passed through `place`, every other array leaf
    (scalars shared by all sites) through `shared`."""
    op = sites.operator(dim)
    n = op.shape[0]
    is_site = lambda x: eqx.is_array(x) and x.ndim >= 1 and x.shape[0] == n
    H: AbstractOperator
    if isinstance(op, Dense):
        H = Dense(place(op.matrix[start:stop]))
    elif isinstance(op, Identity):
        H = SelectRows(place(jnp.arange(start, stop, dtype=jnp.int32)), dim)
    elif isinstance(op, SelectRows):
        H = SelectRows(place(op.indices[start:stop]), dim)
    else:
        raise ValueError(f"shard_sites needs a dense H or H=None (identity) in every Sites group, got "
                         f"{type(op).__name__}")
    potential = jax.tree.map(lambda x: place(x[start:stop]) if is_site(x) else shared(x), sites.potential)
    offset, var_offset = (place(a[start:stop]) if a.ndim == 1 else shared(a)
                          for a in (sites.offset, sites.variance_offset))
    return Sites(H, potential, offset=offset, variance_offset=var_offset)


def shard_sites(model: Model, mesh: Mesh | None = None, *, axis: str = SITE_AXIS,
                process_local: bool = False) -> Model:
    """`model` with every group's rows of H and per-site data split over the mesh axis `axis`, and the prior
    (and scalar per-site data) replicated on every device of the mesh.

    `mesh` defaults to `site_mesh()` (all devices). A group of N sites on P devices becomes a sharded group of
    P * floor(N / P) rows and, when N mod P != 0, a replicated group of the remaining rows (same bound).
    With `process_local=True` (several processes, after `jax.distributed.initialize()`), each process passes a
    model holding only its own rows, the same number n in every process and a multiple of its devices on the
    axis; the global arrays are assembled with `jax.make_array_from_process_local_data` in process order (process
    p's rows are global rows p n, ..., (p + 1) n - 1). Two small all-gathers first check that every process
    agrees on the row counts, the rows' widths, the model's structure, the prior and the mesh (which must hold
    all of `jax.devices()`), so that a disagreement raises the same ValueError on every process instead of a
    wrong model or a hang. Without `process_local`, on a mesh over several processes, every process passes
    the whole model (the same data, compared by checksum: a ValueError on every process if not) and its devices
    keep their rows.
    H must be dense (or None, the identity); sparse and matrix-free operators raise ValueError.

    Args:
        model: a `gkl_jax.Model`.
        mesh: a `jax.sharding.Mesh` with the axis `axis` (default `site_mesh()`).
        axis: the mesh axis that carries the sites (default "sites").
        process_local: each process passes only its own rows (multi-host; default False).

    Returns:
        `gkl_jax.Model` with the same bound, its site arrays sharded over `axis`.

    Raises:
        ValueError: model not a Model, mesh without `axis`, a sparse or matrix-free H, or (process_local, on
            every process) a local row count that is not a multiple of the local devices, row counts, widths,
            structure or prior that differ between processes, a mesh that differs between processes or does not
            hold every device of `jax.devices()`, or site arrays that already span several processes; (a mesh
            over several processes, without process_local) models that differ between processes.
    """
    if not isinstance(model, Model):
        raise ValueError(f"model must be a gkl_jax.Model, got {type(model).__name__}")
    mesh = site_mesh(axis=axis) if mesh is None else mesh
    num = _mesh_size(mesh, axis)
    if process_local or any(d.process_index != jax.process_index() for d in mesh.devices.flat):
        check_processes(model, mesh, axis, _local_positions(mesh, axis), process_local)
    placer = _Placer(mesh, axis, process_local)
    prior = None if model.prior is None else jax.tree.map(placer.put_replicated, model.prior)
    groups = []
    for sites in model.sites:
        n = sites.operator(model.dim).shape[0]
        if process_local:
            groups.append(_site_rows(sites, model.dim, 0, n, placer.put_rows, placer.put_replicated))
            continue
        main = (n // num) * num
        if main:
            groups.append(_site_rows(sites, model.dim, 0, main, placer.put_rows, placer.put_replicated))
        if main < n:
            groups.append(_site_rows(sites, model.dim, main, n, placer.put_replicated, placer.put_replicated))
    return Model(prior, groups)


def replicate(tree, mesh: Mesh):
    """Every array leaf of `tree` (e.g. a warm-start `Gaussian`) replicated on every device of `mesh`.

    Args:
        tree: any pytree (array leaves are placed; other leaves are kept).
        mesh: a `jax.sharding.Mesh`.

    Returns:
        the same pytree with its arrays replicated on the mesh.
    """
    sharding = NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(lambda x: jax.device_put(x, sharding) if eqx.is_array(x) else x, tree)


def compiled_text(fn, *args) -> str:
    """The optimised HLO text XLA compiles `jax.jit(fn)(*args)` to (inspect it for `all-reduce`).

    Args:
        fn: a function that `jax.jit` can compile.
        *args: its arguments.

    Returns:
        str, the compiled module's HLO text.
    """
    return str(jax.jit(fn).lower(*args).compile().as_text())
