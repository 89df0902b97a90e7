"""The E- and M-steps of King & Lawrence's PPA and their two bounds (King & Lawrence 2006); the loop is `_ppa`.

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
for the corrected one) changes by less than `tol` (`gkl_jax.gp.ppa`, one compiled `iterate` loop).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax.flatten_util import ravel_pytree
from jaxtyping import Array, Float

from .._linalg import diagonal
from .._typing import Scalar, ScalarLike
from ..kernels import AbstractKernel
from ..solvers._iterate import Step, iterate
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


def _gram(kernel, X, jitter):
    return kernel.gram(X) + jitter * jnp.eye(X.shape[0], dtype=X.dtype)


def _log_z(lik, mut, v):
    return log_predictive_density(lik, mut, jnp.broadcast_to(v, mut.shape))


def standard_bound(params: PPAParams, stats: PPAStats, X: Float[Array, "n d"], jitter: ScalarLike) -> Scalar:
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


def corrected_bound(params: PPAParams, stats: PPAStats, X: Float[Array, "n d"], jitter: ScalarLike) -> Scalar:
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


class _SweepState(eqx.Module):
    f_mean: jax.Array
    change: jax.Array   # max |change of <f>| in the last sweep


class _Sweeps(eqx.Module):
    """The E-step's sweeps as a `gkl_jax.solvers.iterate` loop: one iteration updates q(fbar) from <f> and then
    every q(f_n) at mut = <fbar> (a fixed-point map on <f>); history[k] is the max |change of <f>| of sweep k."""

    params: PPAParams
    lik: object
    X: jax.Array
    jitter: object
    monotone = True
    start_in_loop = False
    stop_on_nonfinite = False   # a NaN change stops the loop through `terminate`

    def step(self, problem, s, tol):
        f_new = sweep(self.params, s.f_mean, self.lik, self.X, self.jitter)[2][0]
        change = jnp.max(jnp.abs(f_new - s.f_mean))
        return _SweepState(f_new, change), Step(change, jnp.asarray(True), jnp.asarray(True), change)

    def terminate(self, problem, s, tol):
        return s.change <= tol, jnp.isnan(s.change)

    def point(self, s):
        return s.f_mean

    def postprocess(self, problem, s, point):
        return point, None


def sweep(params, f_mean, lik, X, jitter):
    """One sweep of q updates: q(fbar) = N(mu, C) from <f> (eq. 5), then the q(f_n) at mut = mu (eq. 4).

    Args:
        params: `PPAParams`.
        f_mean: (n,) the current <f>.
        lik: the likelihood (a `gkl_jax.potentials` binary potential).
        X: (n, d) inputs.
        jitter: the float added to the Gram matrix's diagonal.

    Returns:
        (mu, C, (<f>, Var(f), const)) as `q_fbar` and `q_f`.
    """
    mu, C = q_fbar(params, f_mean, X, jitter)
    return mu, C, q_f(lik, mu, params.noise)


def e_step_stats(params, f_mean, lik, X, jitter, max_sweeps: int = 1, sweep_tol=1e-8):
    """Algorithm 1's E-step, "iterate over the q-distributions": sweeps (`sweep`) until max |change of <f>| <=
    sweep_tol or `max_sweeps`; then both bounds (at the last q(fbar) and the q(f_n) built from it). Traceable
    (`e_step` is its compiled form).

    Args:
        params: `PPAParams`.
        f_mean: (n,) the starting <f>.
        lik: the likelihood.
        X: (n, d) inputs.
        jitter: the float added to the Gram matrix's diagonal.
        max_sweeps: the most sweeps (int >= 1).
        sweep_tol: the change of <f> that ends the sweeps.

    Returns:
        `PPAStats`.
    """
    start = _SweepState(f_mean, jnp.asarray(jnp.inf, f_mean.dtype))
    solution, _ = iterate(_Sweeps(params, lik, X, jitter), None, jnp.asarray(sweep_tol, f_mean.dtype),
                          max_sweeps - 1, init=(start, start.change), postprocess=False)
    mu, C, (f_mean, f_var, const) = sweep(params, solution.x, lik, X, jitter)
    stats = PPAStats(mu, C, f_mean, f_var, mu, const, jnp.zeros(()), jnp.zeros(()))
    standard = standard_bound(params, stats, X, jitter)
    corrected = corrected_bound(params, stats, X, jitter)
    return eqx.tree_at(lambda s: (s.standard, s.corrected), stats, (standard, corrected))


@eqx.filter_jit
def e_step(params, f_mean, lik, X, jitter, max_sweeps: int = 1, sweep_tol: float = 1e-8):
    """`e_step_stats` compiled (one program per shape and static setting).

    Args:
        params, f_mean, lik, X, jitter, max_sweeps, sweep_tol: as `e_step_stats`.

    Returns:
        `PPAStats`.
    """
    return e_step_stats(params, f_mean, lik, X, jitter, max_sweeps, sweep_tol)


def m_step_params(params, stats, X, jitter, corrected: bool, m_steps: int, gtol, learn_noise: bool = True):
    """Up to `m_steps` L-BFGS steps (`gkl_jax.solvers._quasi_newton.lbfgs`, the library's L-BFGS loop) on the
    chosen objective (L' if `corrected`, else L) in theta (and log v when `learn_noise`), to its stopping test at
    `gtol`. Traceable (`m_step` is its compiled form).

    Args:
        params: `PPAParams`, the start.
        stats: the E-step's `PPAStats` (held fixed).
        X: (n, d) inputs.
        jitter: the float added to the Gram matrix's diagonal.
        corrected: bool, the objective.
        m_steps: the most L-BFGS steps (int >= 1).
        gtol: the gradient tolerance (scalar).
        learn_noise: bool, whether log v moves too.

    Returns:
        `PPAParams`.
    """
    objective = corrected_bound if corrected else standard_bound
    spec = jax.tree.map(eqx.is_inexact_array, params)
    if not learn_noise:
        spec = eqx.tree_at(lambda p: p.log_noise, spec, False)
    dyn, static = eqx.partition(params, spec)
    flat, unravel = ravel_pytree(dyn)
    f = lambda x: objective(eqx.combine(unravel(x), static), stats, X, jitter)
    x = lbfgs(f, flat, tol=jnp.asarray(gtol, flat.dtype), max_steps=m_steps)[0]
    return eqx.combine(unravel(x), static)


@eqx.filter_jit
def m_step(params, stats, X, jitter, corrected: bool, m_steps: int, gtol: float, learn_noise: bool = True):
    """`m_step_params` compiled (one program per shape and static setting).

    Args:
        params, stats, X, jitter, corrected, m_steps, gtol, learn_noise: as `m_step_params`.

    Returns:
        `PPAParams`.
    """
    return m_step_params(params, stats, X, jitter, corrected, m_steps, gtol, learn_noise)
