"""Host reads of arrays in a multi-process run (`jax.distributed.initialize`, one JAX process per host).

An array sharded over the devices of every process (e.g. the rows of H after
`gkl_jax.distributed.shard_sites(..., process_local=True)`) cannot be read whole on any host: `np.asarray` raises
RuntimeError. Replicated arrays (the fitted q, `log_z`, `converged`) can. The library's host-side reads go through
these helpers:

- `spans_processes(x)`: is `x` such an array (neither fully addressable nor replicated)?
- `local_values(x)`: the entries this process holds (for input checks: each process checks its own rows).
- `host_copy(x)`: the whole array on every host, gathered by a collective (every process must call it).
- `gather_small(values)`: one small all-gather of a fixed-length int64 vector per process (shape agreement checks).
"""

import jax
import numpy as np


def spans_processes(x) -> bool:
    """True for a `jax.Array` whose entries are split over devices of other processes (not fully addressable, not
    replicated): reading it on the host needs a collective. False for tracers and host values."""
    return (isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
            and not (x.is_fully_addressable or x.is_fully_replicated))


def local_values(x) -> np.ndarray:
    """The entries of `x` that this process holds, as one flat numpy array; each distinct shard is read once.

    Args:
        x: a `jax.Array` (a numpy array or scalar is taken whole).

    Returns:
        1-D numpy array: all of `x` unless it spans other processes, else this process's shards (for an array
        sharded by rows: this process's rows), flattened in shard order.
    """
    if not spans_processes(x):
        return np.asarray(x).ravel()
    seen, parts = set(), []
    for shard in x.addressable_shards:
        key = tuple((s.start, s.stop) for s in shard.index if isinstance(s, slice))
        if key not in seen:
            seen.add(key)
            parts.append(np.asarray(shard.data).ravel())
    return np.concatenate(parts) if parts else np.zeros(0, x.dtype)


def host_copy(x) -> np.ndarray:
    """All of `x` as a numpy array on this host. For an array that spans other processes this is an all-gather
    (`jax.experimental.multihost_utils.process_allgather`): a collective that every process must reach.

    Args:
        x: a `jax.Array` or numpy array.

    Returns:
        numpy array of x's shape.
    """
    if not spans_processes(x):
        return np.asarray(x)
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def gather_small(values) -> np.ndarray:
    """Every process's `values` (a fixed-length sequence of ints, the same length on every process), stacked.
    With one process, no collective runs.

    Args:
        values: sequence of ints.

    Returns:
        (jax.process_count(), len(values)) int64 numpy array, row p from process p.
    """
    row = np.asarray(values, np.int64).reshape(-1)
    if jax.process_count() == 1:
        return row[None]
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(row)).reshape(jax.process_count(), row.size)
