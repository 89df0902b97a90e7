"""The agreement check of `shard_sites` in a multi-process run: every process must pass a model of the same
structure, the same number of rows of the same width in each site group (with `process_local=False`, the same
data), and the same mesh, or the global arrays assembled from their rows are wrong (rows of different widths, a
misplaced row) or the first collective waits forever. Each process's facts are exchanged in two small
all-gathers (a few integers per process), and the same ValueError is raised on every process when they disagree."""

import zlib

import equinox as eqx
import jax
import numpy as np

from .._model import Model
from .._processes import gather_small, spans_processes

# Problems a process can find in its own arguments (a bit each in the gathered header).
_FOREIGN_DEVICES = 1   # the mesh names devices that jax.devices() does not list
_PARTIAL_MESH = 2      # the mesh does not hold every device of jax.devices()
_GLOBAL_INPUT = 4      # the model's site arrays already span several processes
_NOT_MULTIPLE = 8      # a group's local rows are not a multiple of this process's devices on the mesh


def _crc(text: str) -> int:
    return zlib.crc32(text.encode()) & 0x7FFFFFFF   # fits int32 (the gather runs without x64 too)


def _values_crc(tree) -> int:
    """A checksum of the structure, shapes, dtypes and values of a replicated pytree (the prior)."""
    leaves, treedef = jax.tree.flatten(tree)
    crc = zlib.crc32(str(treedef).encode())
    for leaf in leaves:
        if spans_processes(leaf):    # not readable here (flagged as _GLOBAL_INPUT)
            crc = zlib.crc32(f"{leaf.shape}{leaf.dtype}".encode(), crc)
        elif eqx.is_array(leaf):
            a = np.ascontiguousarray(np.asarray(leaf))
            crc = zlib.crc32(f"{a.shape}{a.dtype}".encode(), crc)
            crc = zlib.crc32(a.tobytes(), crc)
        else:
            crc = zlib.crc32(repr(leaf).encode(), crc)
    return crc & 0x7FFFFFFF


def _group_facts(sites, dim: int, values: bool) -> tuple[int, int, int]:
    """(rows, width of a row of H, checksum of the group's structure: potential type, per-site array shapes past
    the first axis and dtypes, and with `values` the data themselves)."""
    op = sites.operator(dim)
    leaves, treedef = jax.tree.flatten(sites)
    shapes = [(tuple(x.shape[1:]), str(x.dtype)) if eqx.is_array(x) else type(x).__name__ for x in leaves]
    crc = _crc(f"{type(op).__name__}{treedef}{shapes}")
    return int(op.shape[0]), int(op.shape[1]), _values_crc([crc, sites]) if values else crc


def check_processes(model: Model, mesh, axis: str, local_devices: int, process_local: bool = True) -> None:
    """Raise the same ValueError on every process unless all processes agree on `model`'s structure, its groups'
    row counts and widths, the prior, and `mesh` (which must span `jax.devices()`); without `process_local`
    (every process passes the whole model), on the site data too.

    Args:
        model: this process's `gkl_jax.Model` (its own rows, or all of them without `process_local`).
        mesh: the `jax.sharding.Mesh` given to `shard_sites`.
        axis: the site axis of `mesh`.
        local_devices: this process's devices on the site axis.
        process_local: whether each process passes only its own rows (default True).

    Raises:
        ValueError: any disagreement or bad argument found by any process (the message names the processes).
    """
    mesh_devices = list(mesh.devices.flat)
    problems = 0
    if any(d not in set(jax.devices()) for d in mesh_devices):
        problems |= _FOREIGN_DEVICES
    elif set(mesh_devices) != set(jax.devices()):
        problems |= _PARTIAL_MESH
    if process_local and any(spans_processes(x) for x in jax.tree.leaves(model.sites)):
        problems |= _GLOBAL_INPUT
    groups = [_group_facts(s, model.dim, not process_local) for s in model.sites]
    if process_local and (local_devices == 0 or any(rows % max(local_devices, 1) for rows, _, _ in groups)):
        problems |= _NOT_MULTIPLE
    mesh_crc = _crc(f"{axis}{[d.id for d in mesh_devices]}{mesh.axis_names}")
    header = gather_small([problems, len(groups), model.dim, mesh_crc, _values_crc(model.prior), local_devices])
    procs = range(header.shape[0])
    messages = []
    for bit, text in ((_FOREIGN_DEVICES, "the mesh holds devices that jax.devices() does not list"),
                      (_PARTIAL_MESH, "the mesh does not hold every device of jax.devices() (sharding over "
                                      "several processes needs one over all their devices: "
                                      "gkl_jax.distributed.site_mesh())"),
                      (_GLOBAL_INPUT, "the model's site arrays already span several processes (pass each "
                                      "process's own rows as host or local arrays)"),
                      (_NOT_MULTIPLE, f"a sites group's local row count is not a multiple of the process's "
                                      f"devices on axis {axis!r} ({dict(zip(procs, header[:, 5].tolist()))})")):
        bad = [p for p in procs if header[p, 0] & bit]
        if bad:
            messages.append(f"{text} (process {', '.join(map(str, bad))})")
    for col, what in ((2, "dim"), (5, "devices on the site axis")):
        if len(set(header[:, col])) > 1:
            messages.append(f"{what} differs between processes: {dict(zip(procs, header[:, col].tolist()))}")
    if len(set(header[:, 3])) > 1:
        messages.append("the mesh differs between processes (its devices or their order): build it with "
                        "gkl_jax.distributed.site_mesh() on every process")
    if len(set(header[:, 4])) > 1:
        messages.append("the prior differs between processes (it is replicated: every process must pass the same)")
    if len(set(header[:, 1])) > 1:
        messages.append(f"the number of sites groups differs between processes: "
                        f"{dict(zip(procs, header[:, 1].tolist()))}")
    else:
        facts = gather_small([v for g in groups for v in g]).reshape(header.shape[0], len(groups), 3)
        for g in range(len(groups)):
            rows, width, crc = facts[:, g, 0], facts[:, g, 1], facts[:, g, 2]
            if len(set(width)) > 1:
                messages.append(f"sites group {g}: the rows of H differ in width between processes: "
                                f"{dict(zip(procs, width.tolist()))}")
            elif len(set(crc)) > 1:
                messages.append(f"sites group {g}: the potential or per-site data differ in type, shape or dtype "
                                f"between processes" + ("" if process_local else " (or in value: with "
                                                        "process_local=False every process passes the same data)"))
            if len(set(rows)) > 1 and process_local:
                messages.append(f"sites group {g}: the processes hold different numbers of rows "
                                f"{dict(zip(procs, rows.tolist()))}; each must pass the same number (the "
                                f"global group is process_count x that, in process order), so split N sites "
                                f"into equal blocks")
    if messages:
        raise ValueError(f"shard_sites(process_local={process_local}): " + "; ".join(messages))
