"""King & Lawrence's PPA for GP classification and their KL-corrected bound (King & Lawrence 2006).

Model and steps (`_ppa_steps`): p(y_n | f_n) (probit, or any binary likelihood), f = fbar + noise with
p(f | fbar) = N(f | fbar, v I), v = 1 / beta, and the GP prior p(fbar) = N(0, K_theta); the variational posterior
q(fbar) q(f) (eq. 4-5), the standard bound L (eq. 6) and the KL-corrected bound L' (eq. 9-10), L <= L' <= log p(y).

Algorithm 1: repeat {E-step (q(fbar), then q(f_n)); M-step (up to `m_steps` L-BFGS iterations on the chosen
objective)} until the monitored bound (L for the standard scheme, L' for the corrected one) changes by less than
`tol`. The E- and M-steps are `_ppa_steps`; the loop over them is
one compiled `gkl_jax.solvers.iterate` loop (`PPA`), with the library's status and progress.
"""

import time
import warnings
from typing import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jax import lax
from jax.scipy.special import ndtr
from jaxtyping import Array, ArrayLike, Float

from .._linalg import full_precision, tdot
from .._program import program
from .._progress import reraise_callback_error, resolve_progress
from .._status import RESULTS, HasStatus
from .._typing import Inputs, ScalarLike
from .._validate import as_float_array, check_finite, check_int, check_nonnegative, check_positive, strongly_typed
from ..kernels import AbstractKernel
from ..potentials import Logistic, Probit
from ..solvers._iterate import ProgressInfo, Step, iterate, new_history
from ._ppa_steps import PPAParams as PPAParams
from ._ppa_steps import PPAStats as PPAStats
from ._ppa_steps import _gram, e_step_stats, m_step_params
from ._ppa_steps import corrected_bound as corrected_bound
from ._ppa_steps import e_step as e_step
from ._ppa_steps import m_step as m_step
from ._ppa_steps import q_f as q_f
from ._ppa_steps import q_fbar as q_fbar
from ._ppa_steps import standard_bound as standard_bound

TRACE_COUNT = {"ppa": 0}
SWEEP_TOL = 1e-8
"""The E-step's tolerance on the change of <f> between sweeps."""


class PPAResult(HasStatus):
    """Outcome of `ppa` (King & Lawrence 2006).

    Attributes:
        params: the learned `PPAParams`.
        stats: the final E-step's statistics (q(fbar) = N(mu, C), the q(f_n) moments, both bounds).
        X: (n, d) float array, the training inputs.
        history: (num_iters,) float numpy array, the monitored bound per outer iteration.
        history_standard: (num_iters,) float numpy array, the standard bound L per iteration.
        history_corrected: (num_iters,) float numpy array, the KL-corrected bound L' per iteration.
        status: int32 scalar array, a `gkl_jax.RESULTS` code: successful (the monitored bound settled to `tol`),
            max_steps_reached (`max_iters` E-steps), nonfinite (a failed factorisation); `message` in words.
        num_iters: int, outer iterations (E-steps) run.
        wall_time: float, seconds (compilation included).
        corrected_m_step: bool, whether the M-step used L'.
    """

    params: PPAParams
    stats: PPAStats
    X: jax.Array
    history: np.ndarray
    history_standard: np.ndarray
    history_corrected: np.ndarray
    status: jax.Array
    num_iters: int = eqx.field(static=True)
    wall_time: float = eqx.field(static=True)
    corrected_m_step: bool = eqx.field(static=True)



class _State(eqx.Module):
    """The carry of Algorithm 1: the parameters, the last E-step's statistics, both bounds per E-step."""

    params: PPAParams
    stats: PPAStats
    hist_standard: jax.Array
    hist_corrected: jax.Array
    count: jax.Array    # E-steps taken
    settled: jax.Array  # the monitored bound changed by less than tol
    failed: jax.Array   # the monitored bound is not finite (a failed factorisation)


class PPA(eqx.Module):
    """Algorithm 1 of King & Lawrence (2006) as a `gkl_jax.solvers.iterate` loop: an iteration is an E-step at
    the current parameters (history[k], k the E-steps before it) and, unless the monitored bound settled or is not
    finite, an M-step; the first iteration's E-step is the start's."""

    lik: object
    X: jax.Array
    jitter: jax.Array
    gtol: jax.Array
    corrected: bool = eqx.field(static=True)
    m_steps: int = eqx.field(static=True)
    e_sweeps: int = eqx.field(static=True)
    learn_noise: bool = eqx.field(static=True)
    monotone = True
    start_in_loop = True

    def init(self, params, max_iters):
        n, dtype = self.X.shape[0], self.X.dtype
        zero, false = jnp.zeros((), dtype), jnp.asarray(False)
        vec = jnp.zeros(n, dtype)
        stats = PPAStats(vec, jnp.zeros((n, n), dtype), vec, vec, vec, zero, zero, zero)
        hist = new_history(max_iters - 1, jnp.asarray(jnp.nan, dtype))
        return _State(params, stats, hist, hist, jnp.zeros((), jnp.int32), false, false), zero

    def step(self, problem, s, tol):
        stats = e_step_stats(s.params, s.stats.f_mean, self.lik, self.X, self.jitter, self.e_sweeps, SWEEP_TOL)
        value = stats.corrected if self.corrected else stats.standard
        fresh = s.count == 0
        prev = (s.hist_corrected if self.corrected else s.hist_standard)[jnp.maximum(s.count - 1, 0)]
        change = jnp.where(fresh, jnp.inf, jnp.abs(value - prev))
        settled, failed = change < tol, ~jnp.isfinite(value)
        params = lax.cond(settled | failed, lambda: s.params, lambda: m_step_params(
            s.params, stats, self.X, self.jitter, self.corrected, self.m_steps, self.gtol, self.learn_noise))
        new = _State(params, stats, s.hist_standard.at[s.count].set(stats.standard),
                     s.hist_corrected.at[s.count].set(stats.corrected), s.count + 1, settled, failed)
        return new, Step(value, jnp.asarray(True), ~fresh, change)

    def terminate(self, problem, s, tol):
        return s.settled, s.failed

    def point(self, s):
        return s.params

    def postprocess(self, problem, s, point):
        return point, None


@program
def _ppa_jit(params, lik, X, jitter, tol, gtol, corrected, max_iters, m_steps, e_sweeps, learn_noise,
             progress=None):
    TRACE_COUNT["ppa"] += 1
    loop = PPA(lik, X, jitter, gtol, corrected, m_steps, e_sweeps, learn_noise)
    solution, state = iterate(loop, None, tol, max_iters - 1, init=loop.init(params, max_iters), progress=progress,
                              postprocess=False)
    return state.params, state.stats, solution.history, state.hist_standard, state.hist_corrected, \
        solution.num_steps, solution.status


def _labels(y) -> jax.Array:
    y = as_float_array(y, "y")
    if y.ndim != 1:
        raise ValueError(f"y must be 1-D, got shape {y.shape}")
    if not bool(jnp.all((y == 1) | (y == -1))):
        raise ValueError("y must contain labels in {-1, +1}")
    return y


@full_precision
def ppa(kernel: AbstractKernel, X: Inputs, y: Float[ArrayLike, " n"], *, noise: ScalarLike = 1.0,
        corrected: bool = True, likelihood: str = "probit", max_iters: int = 1000, tol: float = 1e-4,
        m_steps: int = 10, m_gtol: float = 1e-6, e_sweeps: int = 20, learn_noise: bool = True,
        jitter: float = 1e-6, progress: bool | str | Callable[[ProgressInfo], object] = False) -> PPAResult:
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
        progress: False (default), True (the iteration, the monitored bound and its change on stderr), "auto"
            (True where stderr is a terminal) or a callable receiving a `gkl_jax.solvers.ProgressInfo` after each
            outer iteration and once at the end (as in `gkl_jax.fit`: turning it on compiles the loop once more;
            a callable that raises stops the fit with its exception).

    Returns:
        `PPAResult` with `status` (`message`, `converged`); a warning is issued when the bound did not settle.

    Raises:
        ValueError: kernel not a kernel, X not finite, labels not in {-1, +1} or of another length, noise not
            positive, an unknown likelihood, bad counts, tol, m_gtol or jitter, or a `progress` that is not True,
            False, "auto" or callable.
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
    tol, m_gtol = check_nonnegative(tol, "tol"), check_nonnegative(m_gtol, "m_gtol")
    callback = resolve_progress(progress, "gkl_jax.gp.ppa")
    lik = Probit(y) if likelihood == "probit" else Logistic(y)
    params = strongly_typed(PPAParams(kernel, jnp.log(noise).astype(X.dtype)), X.dtype)   # one compilation
    dtype = X.dtype
    start = time.perf_counter()
    try:
        params, stats, hist, hist_std, hist_cor, num_steps, code = _ppa_jit(
            params, lik, X, jnp.asarray(jitter, dtype), jnp.asarray(tol, dtype), jnp.asarray(m_gtol, dtype),
            bool(corrected), int(max_iters), int(m_steps), int(e_sweeps), bool(learn_noise), callback)
    except jax.errors.JaxRuntimeError as e:     # a progress callable that raised: its own exception
        reraise_callback_error(callback, e)
        raise
    it = int(num_steps) + 1     # E-steps: the start's and one per step
    hist, hist_std, hist_cor = (np.asarray(h)[:it] for h in (hist, hist_std, hist_cor))
    if int(code) != RESULTS.successful:
        warnings.warn(f"gkl_jax.gp.ppa: stopped after {it} iterations without the bound settling to tol={tol:g} "
                      f"(last bound {hist[-1]:g}; {RESULTS.message(code)}); the parameters are the last ones",
                      stacklevel=2)
    return PPAResult(params=params, stats=stats, X=X, history=hist, history_standard=hist_std,
                     history_corrected=hist_cor, status=code, num_iters=it, wall_time=time.perf_counter() - start,
                     corrected_m_step=bool(corrected))


def ppa_predict(result: PPAResult, X_new: Inputs, jitter: float = 1e-6
                ) -> tuple[Float[Array, " m"], Float[Array, " m"], Float[Array, " m"]]:
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
