"""King & Lawrence's PPA for GP classification and their KL-corrected bound (King & Lawrence 2006).

Model: p(y_n | f_n) (probit, or any binary likelihood), f = fbar + noise, p(f | fbar) = N(f | fbar, v I) with
v = 1 / beta, and the GP prior p(fbar) = N(0, K_theta). The variational posterior is q(fbar) q(f) with
q(f) = prod_n q(f_n) (free form):

    q(f_n) = p(y_n | f_n) N(f_n | mut_n, v) / Z_n,  mut_n = <fbar_n>,                       (eq. 4)
    <f_n> = mut_n + v g_n,  Var(f_n) = v + 2 v^2 G_n - v^2 g_n^2,  g_n = dlog Z_n/dmut_n,  G_n = dlog Z_n/dv,
    q(fbar) = N(mu, C),  C = K - K (K + v I)^{-1} K = v I - v^2 (K + v I)^{-1},  mu = K (K + v I)^{-1} <f>.  (eq. 5)

Z_n = E_{N(f | mut_n, v)}[p(y_n | f)] is Phi(y_n mut_n / sqrt(1 + v)) for the probit (quadrature otherwise), and g, G
come from `jax.grad` of log Z_n, so the E-step is likelihood-generic.

Two M-steps on theta (kernel) and v, from the same E-step statistics:

- standard (eq. 6), with q(fbar) held fixed:
      L(theta, v) = <log N(fbar | 0, K_theta)>_{q(fbar)} + sum_n <log N(f_n | fbar_n, v)>_{q(fbar) q(f_n)} + const
- KL-corrected (eq. 9-10), q(fbar) optimised out analytically:
      L'(theta, v) = log N(<f> | 0, K_theta + v I) - 1/(2 v) sum_n Var(f_n) + const,
  with L' = L + KL(q(fbar) || p(fbar | <f>)) >= L, equality right after the q(fbar) update, and L' <= log p(y | X).

Both constants are sum_n [<log p(y_n | f_n)> + H[q(f_n)]] = sum_n [log Z_n - <log N(f_n | mut_n, v_q)>_{q(f_n)}]
at the v_q the q(f_n) were built with. Algorithm 1: repeat {E-step (q(fbar), then q(f_n)); M-step (up to
`m_steps` L-BFGS iterations on the chosen objective)} until the monitored bound (L for the standard scheme, L'
for the corrected one) changes by less than `tol`. Each E-step and M-step is one compiled function.
"""

import time
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree
from jax.scipy.special import ndtr

from .._linalg import diagonal, full_precision, tdot
from .._validate import as_float_array, check_finite, check_int, check_nonnegative, check_positive, strongly_typed
from ..kernels import AbstractKernel
from ..potentials import Logistic, Probit
from ..solvers._quasi_newton import lbfgs
from ._predict import log_predictive_density

LOG_2PI = jnp.log(2 * jnp.pi)


class PPAParams(eqx.Module):
    """The hyperparameters learned by PPA (King & Lawrence 2006).

    Args:
        kernel: the `gkl_jax.kernels` kernel.
        log_noise: float scalar array, log v (v = 1 / beta, the augmentation noise); `noise` is v.
    """

    kernel: AbstractKernel
    log_noise: jax.Array

    @property
    def noise(self):
        return jnp.exp(self.log_noise)


class PPAStats(eqx.Module):
    """E-step output: q(fbar) = N(mu, C), the q(f_n) moments, the mean they were built from, and the bounds."""

    mu: jax.Array
    C: jax.Array
    f_mean: jax.Array
    f_var: jax.Array
    mut: jax.Array
    const: jax.Array             # sum_n [<log p(y_n | f_n)> + H[q(f_n)]]
    standard: jax.Array          # L after the E-step
    corrected: jax.Array         # L' after the E-step


class PPAResult(eqx.Module):
    """Outcome of `ppa` (King & Lawrence 2006).

    Attributes:
        params: the learned `PPAParams`.
        stats: the final E-step's statistics (q(fbar) = N(mu, C), the q(f_n) moments, both bounds).
        X: (n, d) float array, the training inputs.
        history: (num_iters,) float numpy array, the monitored bound per outer iteration.
        history_standard: (num_iters,) float numpy array, the standard bound L per iteration.
        history_corrected: (num_iters,) float numpy array, the KL-corrected bound L' per iteration.
        num_iters: int, outer iterations run.
        converged: bool, whether the monitored bound settled to `tol`.
        wall_time: float, seconds (compilation included).
        corrected_m_step: bool, whether the M-step used L'.
    """

    params: PPAParams
    stats: PPAStats
    X: jax.Array
    history: np.ndarray
    history_standard: np.ndarray
    history_corrected: np.ndarray
    num_iters: int = eqx.field(static=True)
    converged: bool = eqx.field(static=True)
    wall_time: float = eqx.field(static=True)
    corrected_m_step: bool = eqx.field(static=True)


def _gram(kernel, X, jitter):
    return kernel.gram(X) + jitter * jnp.eye(X.shape[0], dtype=X.dtype)


def _log_z(lik, mut, v):
    return log_predictive_density(lik, mut, jnp.broadcast_to(v, mut.shape))


def standard_bound(params, stats, X, jitter):
    """The standard bound L(theta, v) of King & Lawrence (2006), eq. 6, at the fixed q(fbar) = N(mu, C) and q(f)
    of `stats`.

    Args:
        params: `PPAParams` (kernel and log v).
        stats: an E-step's `PPAStats`.
        X: (n, d) float array of inputs.
        jitter: the float added to the Gram matrix's diagonal.

    Returns:
        float scalar array.
    """
    K = _gram(params.kernel, X, jitter)
    N = X.shape[0]
    v = params.noise
    L = jnp.linalg.cholesky(K)
    Ki_C = jsl.cho_solve((L, True), stats.C)
    Ki_mu = jsl.cho_solve((L, True), stats.mu)
    prior = -0.5 * (N * LOG_2PI + 2 * jnp.sum(jnp.log(diagonal(L))) + jnp.trace(Ki_C) + stats.mu @ Ki_mu)
    f2 = stats.f_var + jnp.square(stats.f_mean)
    link = jnp.sum(-0.5 * jnp.log(2 * jnp.pi * v)
                   - 0.5 / v * (f2 - 2 * stats.f_mean * stats.mu + jnp.square(stats.mu) + diagonal(stats.C)))
    _, logdet_C = jnp.linalg.slogdet(stats.C)
    entropy = 0.5 * (N * (1 + LOG_2PI) + logdet_C)
    return prior + link + entropy + stats.const


def corrected_bound(params, stats, X, jitter):
    """The KL-corrected bound L'(theta, v) of King & Lawrence (2006), eq. 9-10:
    log N(<f> | 0, K + v I) - sum_n Var(f_n) / (2 v) + const.

    Args:
        params: `PPAParams` (kernel and log v).
        stats: an E-step's `PPAStats`.
        X: (n, d) float array of inputs.
        jitter: the float added to the Gram matrix's diagonal.

    Returns:
        float scalar array.
    """
    v = params.noise
    Kv = _gram(params.kernel, X, jitter) + v * jnp.eye(X.shape[0], dtype=X.dtype)
    L = jnp.linalg.cholesky(Kv)
    a = jsl.solve_triangular(L, stats.f_mean, lower=True)
    log_n = -0.5 * (X.shape[0] * LOG_2PI + 2 * jnp.sum(jnp.log(diagonal(L))) + a @ a)
    return log_n - 0.5 / v * jnp.sum(stats.f_var) + stats.const


def q_fbar(params, f_mean, X, jitter):
    """q(fbar) = N(mu, C) of eq. 5: GP regression on the pseudo-targets <f> with noise v."""
    v = params.noise
    N = X.shape[0]
    K = _gram(params.kernel, X, jitter)
    L = jnp.linalg.cholesky(K + v * jnp.eye(N, dtype=X.dtype))
    Kv_inv = jsl.cho_solve((L, True), jnp.eye(N, dtype=X.dtype))
    mu = K @ (Kv_inv @ f_mean)
    C = v * jnp.eye(N, dtype=X.dtype) - v * v * Kv_inv
    return mu, 0.5 * (C + C.T)


def q_f(lik, mut, v):
    """The q(f_n) of eq. 4 built at mean mut and variance v: (<f_n>, Var(f_n), sum_n [<log p> + H[q(f_n)]])."""
    log_z = lambda m, s: jnp.sum(_log_z(lik, m, s))
    g, G = jax.grad(log_z, argnums=(0, 1))(mut, jnp.full_like(mut, v))
    f_mean = mut + v * g
    f_var = v + 2 * v * v * G - v * v * jnp.square(g)
    # <log N(f_n | mut_n, v)>_{q(f_n)} = -1/2 log(2 pi v) - (Var + (<f> - mut)^2) / (2 v)
    expected = -0.5 * jnp.log(2 * jnp.pi * v) - 0.5 * (f_var + jnp.square(f_mean - mut)) / v
    const = jnp.sum(_log_z(lik, mut, v) - expected)
    return f_mean, f_var, const


@eqx.filter_jit
def e_step(params, f_mean, lik, X, jitter, max_sweeps: int = 1, sweep_tol: float = 1e-8):
    """Algorithm 1's E-step, "iterate over the q-distributions": sweeps of {q(fbar) from the current <f>, then
    every q(f_n) at mut = <fbar>} until max |change of <f>| <= sweep_tol or `max_sweeps`; then both bounds (at
    the last q(fbar) and the q(f_n) built from it)."""
    v = params.noise

    def sweep(f):
        mu, C = q_fbar(params, f, X, jitter)
        return mu, C, q_f(lik, mu, v)

    def cond(carry):
        _, change, k = carry
        return (k < max_sweeps - 1) & (change > sweep_tol)

    def body(carry):
        f, _, k = carry
        f_new = sweep(f)[2][0]
        return f_new, jnp.max(jnp.abs(f_new - f)), k + 1

    f_mean, _, _ = lax.while_loop(cond, body, (f_mean, jnp.array(jnp.inf, f_mean.dtype), 0))
    mu, C, (f_mean, f_var, const) = sweep(f_mean)
    stats = PPAStats(mu, C, f_mean, f_var, mu, const, jnp.zeros(()), jnp.zeros(()))
    standard = standard_bound(params, stats, X, jitter)
    corrected = corrected_bound(params, stats, X, jitter)
    return eqx.tree_at(lambda s: (s.standard, s.corrected), stats, (standard, corrected))


@eqx.filter_jit
def m_step(params, stats, X, jitter, corrected: bool, m_steps: int, gtol: float, learn_noise: bool = True):
    """Up to `m_steps` L-BFGS steps (`gkl_jax.solvers._quasi_newton.lbfgs`, the library's L-BFGS loop) on the
    chosen objective in theta (and log v when `learn_noise`), to its stopping test at `gtol`."""
    objective = corrected_bound if corrected else standard_bound
    spec = jax.tree.map(eqx.is_inexact_array, params)
    if not learn_noise:
        spec = eqx.tree_at(lambda p: p.log_noise, spec, False)
    dyn, static = eqx.partition(params, spec)
    flat, unravel = ravel_pytree(dyn)
    f = lambda x: objective(eqx.combine(unravel(x), static), stats, X, jitter)
    x = lbfgs(f, flat, tol=jnp.asarray(gtol, flat.dtype), max_steps=m_steps)[0]
    return eqx.combine(unravel(x), static)


def _labels(y):
    y = as_float_array(y, "y")
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D, got shape {y.shape}")
    if not bool(jnp.all((y == 1) | (y == -1))):
        raise ValueError("y must contain labels in {-1, +1}")
    return y


@full_precision
def ppa(kernel: AbstractKernel, X, y, *, noise=1.0, corrected: bool = True, likelihood: str = "probit",
        max_iters: int = 1000, tol: float = 1e-4, m_steps: int = 10, m_gtol: float = 1e-6,
        e_sweeps: int = 20, learn_noise: bool = True, jitter: float = 1e-6) -> PPAResult:
    """Fit PPA GP classification with hyperparameter learning (Algorithm 1) and the standard or the
    KL-corrected M-step; `noise` is the initial v = 1 / beta. Each E-step makes up to `e_sweeps` sweeps of q
    updates (both schemes alike). With `learn_noise=False` v stays fixed: the exact marginal likelihood depends
    on (K, v) only through K / (1 + v), so learning both lets them drift together slowly (the bound's
    slack shrinks as v grows). Stops when the monitored bound (L' if `corrected`, else L) changes by less than
    `tol` between outer iterations (`converged`), or after `max_iters`.

    Caveat found in testing: L' is tight at the trivial point K -> 0 (there L' = -N log 2 = log p(y | K = 0)),
    and on small or weakly informative data the corrected M-step can jump there from a poor initial q; start
    from a kernel amplitude that is not small relative to v. (King & Lawrence 2006, Algorithm 1.)

    Args:
        kernel: the initial `gkl_jax.kernels` kernel.
        X: (n, d) finite float array of inputs (an (n,) array is read as d = 1).
        y: (n,) labels in {-1, +1}.
        noise: the initial v > 0 (default 1).
        corrected: use the KL-corrected M-step (default True).
        likelihood: "probit" (default) or "logistic".
        max_iters: outer iterations (int >= 1, default 1000).
        tol: change of the monitored bound that stops the iterations (default 1e-4).
        m_steps: optimiser steps per M-step (int >= 1, default 10).
        m_gtol: the M-step's gradient tolerance (default 1e-6).
        e_sweeps: q-update sweeps per E-step (int >= 1, default 20).
        learn_noise: learn v too (default True).
        jitter: a non-negative float added to the Gram matrix's diagonal (default 1e-6).

    Returns:
        `PPAResult`; a warning is issued when the bound did not settle.

    Raises:
        ValueError: kernel not a kernel, X not finite, labels not in {-1, +1} or of another length, noise not
            positive, an unknown likelihood, or bad counts or jitter.
    """
    if not isinstance(kernel, AbstractKernel):
        raise ValueError(f"kernel must be a gkl_jax.kernels kernel, got {type(kernel).__name__}")
    X = as_float_array(X, "X")
    if X.ndim == 1:
        X = X[:, None]
    check_finite(X, "X")
    y = _labels(y)
    if y.shape[0] != X.shape[0]:
        raise ValueError(f"X has {X.shape[0]} rows but y has {y.shape[0]} labels")
    noise = as_float_array(noise, "noise")
    check_positive(noise, "noise")
    if likelihood not in ("probit", "logistic"):
        raise ValueError(f"likelihood must be 'probit' or 'logistic', got {likelihood!r}")
    max_iters, m_steps = check_int(max_iters, "max_iters", 1), check_int(m_steps, "m_steps", 1)
    e_sweeps = check_int(e_sweeps, "e_sweeps", 1)
    jitter = check_nonnegative(jitter, "jitter")
    lik = Probit(y) if likelihood == "probit" else Logistic(y)
    params = strongly_typed(PPAParams(kernel, jnp.log(noise).astype(X.dtype)), X.dtype)   # one compilation
    f_mean = jnp.zeros(X.shape[0], X.dtype)
    start = time.perf_counter()
    hist, hist_std, hist_cor = [], [], []
    converged, it = False, 0
    stats = None
    for it in range(1, int(max_iters) + 1):
        stats = e_step(params, f_mean, lik, X, jitter, int(e_sweeps))
        f_mean = stats.f_mean
        std, cor = float(stats.standard), float(stats.corrected)
        value = cor if corrected else std
        hist_std.append(std)
        hist_cor.append(cor)
        if not np.isfinite(value):     # a failed factorisation (duplicate inputs without jitter, ...)
            hist.append(value)
            break
        if hist and abs(value - hist[-1]) < tol:
            hist.append(value)
            converged = True
            break
        hist.append(value)
        params = m_step(params, stats, X, jitter, bool(corrected), m_steps, float(m_gtol), bool(learn_noise))
    if not converged:
        warnings.warn(f"gkl_jax.gp.ppa: stopped after {it} iterations without the bound settling to tol={tol:g} "
                      f"(last bound {hist[-1]:g}); the parameters are the last ones", stacklevel=2)
    assert stats is not None  # max_iters >= 1: the loop ran at least once
    return PPAResult(params=params, stats=stats, X=X, history=np.array(hist), history_standard=np.array(hist_std),
                     history_corrected=np.array(hist_cor), num_iters=it, converged=converged,
                     wall_time=time.perf_counter() - start, corrected_m_step=bool(corrected))


def ppa_predict(result: PPAResult, X_new, jitter: float = 1e-6):
    """PPA predictive at X_new: latent N(k_*^T (K + v I)^{-1} <f>, k_** - k_*^T (K + v I)^{-1} k_*) for fbar_* and
    p(y_* = +1) = Phi(mean / sqrt(1 + v + var)) (probit) (King & Lawrence 2006).

    Args:
        result: a `PPAResult` from `ppa`.
        X_new: (n_new, d) finite float array (an (n_new,) array is read as d = 1).
        jitter: a non-negative float added to the Gram matrix's diagonal (default 1e-6).

    Returns:
        (mean, variance, probability): three (n_new,) float arrays.

    Raises:
        ValueError: result not a PPAResult, X_new not finite or with another d, or a negative jitter.
    """
    if not isinstance(result, PPAResult):
        raise ValueError(f"result must be a PPAResult (from gkl_jax.gp.ppa), got {type(result).__name__}")
    jitter = check_nonnegative(jitter, "jitter")
    X_new = as_float_array(X_new, "X_new")
    if X_new.ndim == 1:
        X_new = X_new[:, None]
    check_finite(X_new, "X_new")
    params, X = result.params, result.X
    if X_new.shape[1] != X.shape[1]:
        raise ValueError(f"X_new must have {X.shape[1]} columns, got shape {X_new.shape}")
    v = params.noise
    Kv = _gram(params.kernel, X, jitter) + v * jnp.eye(X.shape[0], dtype=X.dtype)
    L = jnp.linalg.cholesky(Kv)
    Ks = params.kernel.gram(X, X_new)
    mean = tdot(Ks, jsl.cho_solve((L, True), result.stats.f_mean))
    A = jsl.solve_triangular(L, Ks, lower=True)
    var = jnp.maximum(params.kernel.diag(X_new) - jnp.sum(A * A, axis=0), 0.0)
    return mean, var, ndtr(mean / jnp.sqrt(1 + v + var))
