"""Scale-out: many models as one vectorised program, and the site axis split over devices, hosts and processes.

- `fit_batched`, `stack_models`: many independent models fitted as one vmapped program.
- `site_mesh`, `shard_sites`, `replicate`: the sites split over a device mesh; `gkl_jax.fit`, `gkl_jax.bound`,
  `jax.grad` of either, the minibatch fits (`gkl_jax.stochastic`) and sparse GP models (`gkl_jax.gp.sparse_model`)
  then run data-parallel, on the devices of one process or of many.

**What is sharded, what is replicated.** The rows of H and the per-site data (labels, offsets, variance offsets)
are split over the mesh axis "sites"; the prior, q = (m, C), the factor's parameters, the solver's state and every
field of the returned `Result` (`log_z`, `converged`, `q`) are replicated on every device. The bound (Challis &
Barber 2013, eq. 7) is a sum over sites, so each evaluation of the bound and its gradient computes every device's
partial sums locally and adds them in one all-reduce carrying the bound, grad_m (D numbers) and grad_C (the
factor's size); a Hessian-vector product costs one more. A fit step makes as many evaluations as its solver needs
(line-search trials, CG iterations), hence as many all-reduces: with little work per device (small N per device)
the step is bound by their latency (`benchmarks/README.md`, "Scale-out").

**One process, several devices** (GPUs of one host)::

    mesh = gk.distributed.site_mesh()                 # jax.devices(), along the axis "sites"
    model = gk.distributed.shard_sites(model, mesh)   # rows split, the rest replicated
    res = gk.fit(model, gk.factors.Diagonal())

**Several processes** (one per host or per GPU; JAX's multi-controller runtime). Every process runs the same
script:

1. `jax.distributed.initialize()` before any other JAX call. Under SLURM (`srun`), Open MPI, Kubernetes and Cloud
   TPU it takes no arguments; elsewhere pass `coordinator_address="host0:port"` (process 0's host, a free port),
   `num_processes=P` and `process_id=p`. On CPUs the cross-process collectives use gloo (JAX's default).
2. Each process builds a `Model` of its own rows only: the same number n of rows in every process (a multiple of
   its devices), the same prior and the same model structure. Process p's rows become rows p n, ..., (p + 1) n - 1
   of the global site group.
3. `model = shard_sites(local, site_mesh(), process_local=True)`: two small all-gathers check that every process
   agrees (row counts, row widths, structure, prior, mesh over all of `jax.devices()`); if not, every process
   raises the same ValueError. (Alternatively every process passes the whole model and `process_local=False`:
   the data are then compared by checksum, and each process's devices keep their rows.)
4. `res = gk.fit(model, factor)` (or `gk.bound`, `jax.grad`, `gk.stochastic.fit_minibatch`) on every process;
   each gets the same replicated `Result`, readable on its host (`float(res.log_z)`, `np.asarray(res.q.mean)`).

::

    import jax
    jax.distributed.initialize()                      # or coordinator_address=..., num_processes=..., process_id=...
    import gkl_jax as gk
    local = gk.Model(prior, gk.Sites(X_mine, gk.potentials.Logistic(y_mine)))   # this process's rows
    model = gk.distributed.shard_sites(local, gk.distributed.site_mesh(), process_local=True)
    res = gk.fit(model, gk.factors.Diagonal())

`benchmarks/multiprocess.py` is a complete launcher (N processes on one machine, or one per host under SLURM or
plain environment variables).

**Sharp bits.** An array split over several processes cannot be read whole on a host: `np.asarray` of the sharded
model's H raises RuntimeError (each process can read its own rows through `.addressable_shards`), and a function
under `jax.jit` or `jax.grad` must take the sharded model as an argument, not close over it (JAX refuses).
Input checks on sharded data (NaN, labels, positivity) look at each process's own rows. `process_local=True` takes
dense H (or None, the identity) only, and no remainder group: give every process the same number of rows.

**When a process fails.** A process that raises before a collective that the others have entered (e.g. a
ValueError while building its local model) leaves them waiting inside it. JAX's coordination service then ends
every process (they abort with a non-zero exit status): a process that exits with an error first waits at JAX's
shutdown barrier for `shutdown_timeout_seconds` (default 300 s) and one that dies abruptly (killed, out of
memory) is noticed after `heartbeat_timeout_seconds` (default 100 s); if process 0 (the coordinator) dies the
others stop at once. Pass smaller values to `jax.distributed.initialize` to fail faster (the scaling guide has
a measurement), and `initialization_timeout` (default 300 s) for a process that never starts.
"""

from ._batched import TRACE_COUNT as TRACE_COUNT
from ._batched import fit_batched as fit_batched
from ._batched import stack_models as stack_models
from ._sharding import SITE_AXIS as SITE_AXIS
from ._sharding import compiled_text as compiled_text
from ._sharding import replicate as replicate
from ._sharding import shard_sites as shard_sites
from ._sharding import site_mesh as site_mesh
