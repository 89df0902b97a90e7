"""ML-II on the sparse bound: maximise log Z~_h*(theta) (Chai 2012, eq. 32 at its optimum over q(z), b, S) over the
kernel's parameters for a given inducing set, by the host L-BFGS of `fit_hyperparameters`
(`_hyper_host.HostLBFGS`: the same directions, line search, adaptive inner tolerance and stopping rules).

Each evaluation is one compiled program (`_sparse_solve`): the prior covariances at theta, the sparse fit
warm-started from the last optimum (`_sparse.sparse_core`), and the envelope gradient of App. C.4 (autodiff of
`_sparse.sparse_log_z` in theta with q(z), {b_i}, {S_i} held at the optimum). An evaluation costs what a sparse
fit costs, O(n C^3 + n C s^2 + s^3) per sweep, so ML-II scales as the sparse fit does (1000 digits, 10 classes,
200 inducing latents: `benchmarks/multiclass_digits.py`).
"""

import equinox as eqx
import jax
import jax.numpy as jnp

from .._program import program
from .._xla_options import LAPACK_BOUND
from ._blocks import placeholder_sites
from ._sparse import SparsePosterior, _initial, inducing_prior, sparse_core, sparse_log_z, whitened_cross

TRACE_COUNT = {"sparse_hyper": 0}
S_SWEEPS = 1
"""S_i updates per (b, S) round of the inner fits, as in the dense ML-II (`_hyper.INNER_S_SWEEPS`)."""


@program(cpu_options=LAPACK_BOUND)
def _sparse_solve(params, static, X, Y, inducing, noise, jitter, warm, cold, km, tol, max_steps):
    """The sparse fit at the kernel (params, static) warm-started from `warm` = (b, S, W) unless `cold`, and the
    envelope gradient of log Z~_h* in params. Returns (state, sweeps, converged, stationarity, history, gradient)."""
    TRACE_COUNT["sparse_hyper"] += 1
    n, C = Y.shape
    kernel = eqx.combine(params, static)
    Kzz, Kzf, Kff = inducing_prior(kernel, X, C, inducing, noise=noise, jitter=jitter)
    Lt = whitened_cross(Kzz, Kzf)
    st0 = _initial(Lt, Kff, Y, km, warm, cold)
    st, k, ok, hist, stat = sparse_core(Lt, Kff, Y, st0, km, jnp.asarray(True), tol, max_steps, S_SWEEPS)
    post = SparsePosterior(Y=Y, b=st.b, S=st.S, W=st.W, Vf_blocks=st.Vb, log_z=st.value, converged=ok,
                           num_steps=k, history=hist, stationarity=stat)
    m, V = jax.lax.stop_gradient(post.inducing_moments(Kzz, Kzf))
    b, S = jax.lax.stop_gradient((st.b, st.S))

    def bound(p):
        Kzz_p, Kzf_p, Kff_p = inducing_prior(eqx.combine(p, static), X, C, inducing, noise=noise, jitter=jitter)
        return sparse_log_z(Kzz_p, Kzf_p, Kff_p, Y, m, V, b, S)

    return st, k, ok, stat, hist, jax.grad(bound)(params)


def sparse_solver(static, X, Y, inducing, *, noise, jitter, km, max_steps, flatten):
    """`solve(params, state, cold, tol)` -> (value, flat gradient, state, aux) for `_hyper_host.HostLBFGS`.

    Args:
        static: the kernel's fixed part (`eqx.partition`).
        X: (n, d) inputs; Y: (n, C) one-hot labels; inducing: (s,) latent indices i C + c.
        noise, jitter: as `fit_sparse`.
        km: whether the site bound is Knowles-Minka's.
        max_steps: the most sweeps per inner fit.
        flatten: pytree -> flat numpy vector (`_hyper_host._flatten`).

    Returns:
        The solve function; aux = (converged, stationarity, history) of the inner fit.
    """
    dt = Y.dtype
    n, C = Y.shape
    cold_warm = placeholder_sites(n, C, dt)
    args = dict(noise=float(noise), jitter=float(jitter), km=jnp.asarray(km), max_steps=int(max_steps))

    def solve(p, st, cold, tol):
        warm = cold_warm if st is None else (st.b, st.S, st.W)
        st1, k, ok, stat, hist, g = _sparse_solve(p, static, X, Y, inducing, warm=warm, cold=jnp.asarray(cold),
                                                  tol=jnp.asarray(tol, dt), **args)
        return float(st1.value), flatten(g), st1, (ok, stat, hist, k)

    return solve


def sparse_posterior(st, aux, Y, kernel, X, inducing, noise, jitter):
    """The `SparsePosterior` of the final inner fit (for `gk.multiclass.predict`)."""
    ok, stat, hist, k = aux
    return SparsePosterior(Y=Y, b=st.b, S=st.S, W=st.W, Vf_blocks=st.Vb, log_z=st.value, converged=ok, num_steps=k,
                           history=hist, stationarity=stat, kernel=kernel, X=X, inducing=inducing, mask=None,
                           noise=float(noise), jitter=float(jitter))
