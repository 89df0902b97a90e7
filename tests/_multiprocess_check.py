"""One process of a multi-process G-KL run on localhost; started N times by tests/test_multiprocess.py.

    python tests/_multiprocess_check.py PROCESS_ID NUM_PROCESSES PORT [all]

Each process joins JAX's multi-controller runtime (CPU collectives: gloo, JAX's default), keeps only its own block of
rows of the shared data sets (tests/_multiprocess_data.py), shards them with `shard_sites(..., process_local=True)`
and runs the fit, its gradient in the prior variance and a sparse GP fit; with `all`, also the bound and its
gradient in q, a minibatch fit and a prior-free fit (whose rank check gathers H on the host). Then it passes bad
input that every process must reject with the same ValueError. It prints one line `RESULT <json>`; the test
compares it with one-process fits.
"""

import json
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

import gkl_jax as gk  # noqa: E402
from gkl_jax._processes import host_copy, local_values, spans_processes  # noqa: E402

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _multiprocess_data import (  # noqa: E402
    DIM,
    MINIBATCH,
    gp_data,
    logistic_data,
    logistic_model,
    regression_data,
    regression_model,
    sparse_model,
    variance_log_z,
)


def block(a, pid, num):
    per = a.shape[0] // num
    return a[pid * per:(pid + 1) * per]


def main(pid: int, num: int, port: int, everything: bool) -> None:
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=num, process_id=pid,
                               initialization_timeout=60, heartbeat_timeout_seconds=20, shutdown_timeout_seconds=20)
    start = time.perf_counter()
    timings = {}

    def lap(name):
        timings[name] = round(time.perf_counter() - start - sum(timings.values()), 2)

    out = {"process_count": jax.process_count(), "devices": len(jax.devices())}
    X, y = logistic_data()
    mesh = gk.distributed.site_mesh()
    local = logistic_model(block(X, pid, num), block(y, pid, num))
    model = gk.distributed.shard_sites(local, mesh, process_local=True)
    H = model.sites[0].H.matrix
    out["spans_processes"] = spans_processes(H) and not H.is_fully_addressable
    out["local_values"] = bool(np.array_equal(local_values(H), block(X, pid, num).ravel()))   # this process's rows
    out["host_copy"] = bool(np.array_equal(host_copy(H), X))                                  # all rows, gathered
    factor = gk.factors.Diagonal()
    res = gk.fit(model, factor, tol=1e-9)
    out["replicated"] = bool(res.q.mean.is_fully_replicated and res.log_z.is_fully_replicated)
    out.update(log_z=float(res.log_z), converged=bool(res.converged), mean=np.asarray(res.q.mean).tolist(),
               d=np.asarray(res.q.factor.d).tolist(), bound=float(gk.bound(model, res.q)))
    whole = gk.distributed.shard_sites(logistic_model(X, y), mesh)     # every process passes all rows
    out["whole_bound"] = float(gk.bound(whole, res.q))
    out["d_log_z_d_variance"] = float(jax.jit(jax.grad(variance_log_z, argnums=1))(model, model.prior.variance))
    lap("fit and gradient")
    x, t, Z = gp_data()
    sparse = gk.distributed.shard_sites(sparse_model(block(x, pid, num), block(t, pid, num), Z), mesh,
                                        process_local=True)
    sres = gk.fit(sparse, gk.factors.Full(), tol=1e-9)
    out.update(sparse_log_z=float(sres.log_z), sparse_mean=np.asarray(sres.q.mean).tolist(),
               sparse_converged=bool(sres.converged))
    lap("sparse")
    if everything:
        mb = gk.stochastic.fit_minibatch(model, factor, **MINIBATCH)
        out.update(minibatch_log_z=float(mb.log_z), minibatch_mean=np.asarray(mb.q.mean).tolist())
        grad_q = jax.jit(jax.grad(gk.bound, argnums=1))(model, mb.q)    # away from the optimum: not ~0
        out["grad_mean"] = np.asarray(grad_q.mean).tolist()
        hlo = gk.distributed.compiled_text(jax.value_and_grad(gk.bound, argnums=1), model, mb.q)
        out["all_reduce_ops"] = hlo.count("all-reduce(") + hlo.count("all-reduce-start(")
        Xr, tr = regression_data()
        free = gk.fit(gk.distributed.shard_sites(regression_model(block(Xr, pid, num), block(tr, pid, num)), mesh,
                                                 process_local=True), gk.factors.Full(), tol=1e-9)
        out["prior_free_log_z"] = float(free.log_z)
        lap("bound gradient, minibatch, prior-free")
    errors = {}
    cases = {"rows": (X[:8] if pid == num - 1 else X[:16]), "width": X[:16, :DIM - (pid == num - 1)]}
    for name, rows in cases.items():
        bad = logistic_model(rows, y[:len(rows)])
        try:
            gk.distributed.shard_sites(bad, mesh, process_local=True)
            errors[name] = ""
        except ValueError as err:
            errors[name] = str(err)
    try:
        gk.distributed.shard_sites(logistic_model(X, -y if pid == num - 1 else y), mesh)
        errors["whole"] = ""
    except ValueError as err:
        errors["whole"] = str(err)
    try:
        gk.distributed.shard_sites(local, gk.distributed.site_mesh(jax.local_devices()), process_local=True)
        errors["mesh"] = ""
    except ValueError as err:
        errors["mesh"] = str(err)
    out["errors"] = errors
    lap("bad_input")
    out["seconds"] = timings
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:] == ["all"])
