"""Sharded vs single-device G-KL on 4 virtual CPU devices; run as a subprocess by tests/test_scale.py.

The device count must be fixed before JAX initialises, hence a separate process. Prints one JSON line with
the quantities the test asserts on.
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()

import jax  # noqa: E402
import jax.flatten_util  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import gkl_jax as gk  # noqa: E402
from gkl_jax.distributed import compiled_text, fit_batched, shard_sites, site_mesh  # noqa: E402
from gkl_jax.stochastic import bound_chunked  # noqa: E402


def main():
    dim, num = 6, 202  # 202 = 4 * 50 + 2: a sharded group and a replicated remainder of 2 rows
    data = gk.datasets.synthetic_logistic(dim, num, seed=3)
    model = gk.Model(gk.priors.Isotropic(dim, 1.0), gk.Sites(data["X_train"], gk.potentials.Logistic(data["y_train"])))
    mesh = site_mesh()
    sharded = shard_sites(model, mesh)
    out = {"devices": len(jax.devices()), "groups": [list(s.H.shape) for s in sharded.sites],
           "specs": [str(s.H.matrix.sharding.spec) for s in sharded.sites]}

    factor = gk.factors.Diagonal()
    ref = gk.fit(model, factor, tol=1e-9)
    res = gk.fit(sharded, factor, tol=1e-9)
    out["log_z"] = [float(ref.log_z), float(res.log_z)]
    out["mean_diff"] = float(jnp.max(jnp.abs(ref.q.mean - res.q.mean)))
    out["d_diff"] = float(jnp.max(jnp.abs(ref.q.factor.d - res.q.factor.d)))
    out["converged"] = [bool(ref.converged), bool(res.converged)]
    out["result_spec"] = str(res.q.mean.sharding.spec)

    value_grad = lambda m, q: jax.value_and_grad(gk.bound, argnums=1)(m, q)
    hlo = compiled_text(value_grad, sharded, res.q)
    out["all_reduce_ops"] = hlo.count("all-reduce(") + hlo.count("all-reduce-start(")
    flat, unravel = jax.flatten_util.ravel_pytree(res.q)

    def hvp(m, v):
        grad = lambda f: jax.flatten_util.ravel_pytree(jax.grad(gk.bound, argnums=1)(m, unravel(f)))[0]
        return jax.jvp(grad, (flat,), (v,))[1]

    hlo_hvp = compiled_text(hvp, sharded, jnp.ones_like(flat))
    out["all_reduce_ops_hvp"] = hlo_hvp.count("all-reduce(") + hlo_hvp.count("all-reduce-start(")
    out["hvp_diff"] = float(jnp.max(jnp.abs(jax.jit(hvp)(sharded, jnp.ones_like(flat))
                                            - jax.jit(hvp)(model, jnp.ones_like(flat)))))
    hlo_single = compiled_text(value_grad, model, ref.q)
    out["all_reduce_ops_single"] = hlo_single.count("all-reduce(") + hlo_single.count("all-reduce-start(")
    out["bound_sharded"] = float(gk.bound(sharded, ref.q))
    out["bound_chunked_sharded"] = float(jax.jit(bound_chunked, static_argnums=2)(sharded, ref.q, 16))
    out["bound_single"] = float(gk.bound(model, ref.q))

    # A batch of independent models split over the devices (embarrassingly parallel vmap).
    models = [model] + [gk.Model(model.prior, gk.Sites(d["X_train"], gk.potentials.Logistic(d["y_train"])))
                        for d in (gk.datasets.synthetic_logistic(dim, num, seed=s) for s in (4, 5, 6))]
    loop = [float(gk.fit(m, factor, tol=1e-9).log_z) for m in models]
    batched = fit_batched(models, factor, mesh=site_mesh(axis="batch"), tol=1e-9)
    out["batched_log_z_diff"] = float(np.max(np.abs(np.asarray(batched.log_z) - np.array(loop))))
    out["batched_spec"] = str(batched.log_z.sharding.spec)

    local = shard_sites(gk.Model(model.prior, gk.Sites(data["X_train"][:200], gk.potentials.Logistic(
        data["y_train"][:200]))), mesh, process_local=True)
    out["process_local_spec"] = str(local.sites[0].H.matrix.sharding.spec)
    out["process_local_equal"] = bool(np.array_equal(np.asarray(local.sites[0].H.matrix), data["X_train"][:200]))
    try:
        shard_sites(model, mesh, axis="batch")
        out["bad_axis_error"] = ""
    except ValueError as err:
        out["bad_axis_error"] = str(err)
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
