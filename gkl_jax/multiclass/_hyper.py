"""Model learning: maximise the optimised bound log Z_h*(theta) over kernel hyper-parameters (Chai 2012, Section 6).

Prior: K(theta) = K^x(theta) (x) K^c + jitter I (separable, eq. 1; datum-major). The kernels of the experiments map
onto `gk.kernels.SquaredExponential(variance, lengthscale)` (k = variance exp(-1/2 sum_d (x_d - x'_d)^2 / l_d^2)):

- usqexpard (eq. 44): exp(-1/2 sum_j ((x_j - x'_j)/theta_j)^2) = SquaredExponential(variance=1, lengthscale=theta)
  with an ARD lengthscale of shape (d,) and the variance held fixed (`fixed=("log_variance",)`);
- sqexpiso (eq. 45): sigma_x^2 exp(-1/2 sum_j ((x_j - x'_j)/theta)^2) = SquaredExponential(variance=sigma_x^2,
  lengthscale=theta) with a scalar lengthscale; both learned.
The conversion is the identity on (theta, sigma_x^2); only the storage is logarithmic (log_lengthscale = log theta,
log_variance = log sigma_x^2), and the optimiser works on those logarithms.

Gradient (Section 6): by the envelope theorem only the explicit dependence on K counts,
    d log Z_h* / d theta_j = 1/2 tr((alpha alpha^T - T) dK/dtheta_j),  alpha = y - b,  T = W - W V W,
obtained here by differentiating the surrogate 1/2 alpha^T K(theta) alpha - 1/2 tr(T K(theta)) with (alpha, T) held
at the optimum.

Optimiser: L-BFGS (`gkl_jax._optim.lbfgs_direction`) with an Armijo backtracking search, run on the host
(`_hyper_host.HostLBFGS`, in the host loop of `gkl_jax.solvers.iterate`, which keeps the history, the step count,
the `RESULTS` status and the progress callback as for gp's ML-II) around one compiled program (`_solve`: the inner
fit warm-started from the current optimum (App. E.3), the bound, its gradient and T), so a learning run compiles
that program once per (n, C, d, variant) and never the outer loop. The single compiled `lax.while_loop` over the
outer steps that this replaced held the inner fit twice (the cold first fit and the line-search fits) and was slow
to compile (design-decisions page).
With K^c = I, K = (K^x + jitter I) (x) I_C is factorised through the (n, n) Cholesky factor of K^x + jitter I.
"""

import time
import warnings
from typing import Optional

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._linalg import full_precision
from .._program import program
from .._progress import resolve_progress
from .._status import RESULTS, HasStatus
from .._validate import (
    check_indices,
    check_int,
    check_nonnegative,
    check_tol,
    device_array,
    host_view,
    is_concrete,
)
from .._xla_options import LAPACK_BOUND
from ..solvers import iterate
from ._blocks import blockdiag_dense, blockdiag_left, placeholder_sites, sym
from ._contrast import lift_contrasts, to_contrasts
from ._full import COVARIANCES, SITES, Posterior, one_hot_labels, prior_covariance
from ._hyper_host import ADAPTIVE_INNER_TOL as ADAPTIVE_INNER_TOL
from ._hyper_host import LOOSEST_INNER_TOL as LOOSEST_INNER_TOL
from ._hyper_host import HostLBFGS, Learning, _flatten, _unflatten
from ._sparse_hyper import sparse_posterior, sparse_solver
from ._sweep import contrasts_of, fit_core, initial_state
from ._threads import single_threaded

TRACE_COUNT = {"hyper": 0}
# One S_i update per (b, S) round in the inner fits: the Newton V step sets S_i = S^fx(V_i) anyway, and on glass three
# updates per sweep (the `fit_full` default) gave the same sweeps and bound at 15% more time.
INNER_S_SWEEPS = 1


def trainable_filter(kernel, fixed=()):
    """An Equinox filter spec: True for every inexact array of `kernel` except the attributes named in `fixed`."""
    spec = jax.tree.map(eqx.is_inexact_array, kernel)
    for name in fixed:
        if not hasattr(kernel, name):
            raise ValueError(f"fixed names {name!r}, which is not an attribute of {type(kernel).__name__}")
        spec = eqx.tree_at(lambda k: getattr(k, name), spec, False)
    return spec


def envelope_surrogate(K, alpha, T):
    """1/2 alpha^T K alpha - 1/2 tr(T K): its derivative in K is d log Z_h*/dK at the optimum (Section 6)."""
    return 0.5 * alpha @ (K @ alpha) - 0.5 * jnp.sum(T * K)


def _t_matrix(st, P=None):
    """T = W - W V W (eq. 75) from a state's W and V = G G^T: (nC, nC). With the contrast basis P (the solver's
    `contrasts_of`), G is the contrasts' factor and W_i = P W^g_i P^T: T = (I (x) P) (W^g - W^g V^g W^g) (I (x) P)^T
    (W annihilates the class sums)."""
    W = st.W if P is None else sym(to_contrasts(st.W, P))
    WG = blockdiag_left(W, st.G)
    T = sym(blockdiag_dense(W) - WG @ WG.T)
    return T if P is None else lift_contrasts(T, P)


class HyperResult(HasStatus):
    """Outcome of `fit_hyperparameters` (the fields of `gk.gp.HyperResult` that apply here).

    Attributes:
        kernel: the learned `gk.kernels` kernel (`params` is the same object, as in `gk.gp.HyperResult`).
        posterior: the `Posterior` at the learned kernel (it holds the kernel and inputs, so `predict` takes it); a
            `SparsePosterior` for ML-II of the sparse bound (`inducing`).
        log_z: float scalar array, the optimised bound log Z_h* at the learned kernel.
        status: int32 scalar array, the `gkl_jax.RESULTS` code of the outer loop (successful: it settled;
            max_steps_reached; stalled: a failed line search); `message` says it in words, `converged` is
            `status == RESULTS.successful`.
        num_steps: int32 scalar array, outer steps taken.
        history: (max_steps + 1,) float array, log Z_h* at the start and after each outer step (NaN after).
        t_matrix: (nC, nC) float T = W - W V W at the optimum (Chai 2012, eq. 75: the predictive covariance is
            K_** - K_*^T T K_*); None for a sparse fit.
        num_inner_fits: int, inner fits run (the first, cold one and one per line-search trial; static).
        wall_time: float, seconds for the whole run, compilation included (static).
    """

    kernel: eqx.Module
    posterior: Posterior
    log_z: jax.Array
    status: jax.Array
    num_steps: jax.Array
    history: jax.Array
    t_matrix: Optional[jax.Array]
    num_inner_fits: int = eqx.field(static=True, default=0)
    wall_time: float = eqx.field(static=True, default=0.0)


    @property
    def params(self):
        """The learned kernel (the name `gk.gp.HyperResult` gives the learned hyper-parameters)."""
        return self.kernel


@program(cpu_options=LAPACK_BOUND)
def _solve(params, static, X, Y, class_covariance, jitter, warm, cold, inner_tol, flags, inner_steps):
    """The inner fit at the kernel (params, static), warm-started from `warm` = (b, S, W) unless `cold`, with the
    envelope gradient of the bound in the kernel's parameters and T (eq. 75). One compiled program per (shapes,
    `flags` = (km, mf, newton) Python booleans, `inner_steps`).

    Returns (state, sweeps, converged, stationarity, gradient (a pytree like params), T)."""
    TRACE_COUNT["hyper"] += 1
    km, mf, newton = flags
    n, C = Y.shape
    K_of = lambda p: prior_covariance(eqx.combine(p, static), X, C, class_covariance, jitter)
    K = K_of(params)
    if class_covariance is None:  # K = (K^x + jitter I) (x) I_C: every C-th row and column of K is K^x + jitter I
        Lx = jnp.linalg.cholesky(K[::C, ::C])
    else:
        Lx = None
    st0 = initial_state(K, Y, km, mf, 1.0, warm, cold, Lx)
    st, k, ok, _, stat = fit_core(K, Y, st0, km, mf, newton, inner_tol, inner_steps, INNER_S_SWEEPS, Lx=Lx)
    alpha = (Y - st.b).reshape(-1)
    T = _t_matrix(st, contrasts_of(Lx, mf, C, K.dtype))
    g = jax.grad(lambda p: envelope_surrogate(K_of(p), alpha, T))(params)
    return st, k, ok, stat, g, T


@full_precision
@single_threaded
def fit_hyperparameters(kernel, X, y, *, num_classes=None, fixed=(), class_covariance=None, jitter=1e-6,
                        site="theorem6", covariance="full", max_steps=50, ftol=1e-7, inner_tol=1e-8, inner_steps=100,
                        max_step=1.0, memory=10, inducing=None, noise=1e-6, progress=False) -> HyperResult:
    """Maximise log Z_h*(theta) (Section 6) over the kernel's unconstrained parameters (all inexact arrays except
    the attribute names in `fixed`), by L-BFGS on the host with warm-started compiled inner fits.

    Stops when a step raises the bound by at most ftol * (1 + |log Z|), when the line search fails, or after
    `max_steps` steps; `converged` is False (with a warning) when `max_steps` was reached first or the line search
    failed while the first-order gain of the step was still above that tolerance.

    Args:
        kernel: a `gk.kernels` kernel (its parameters are the starting point).
        X: (n, d) float inputs (an (n,) array is read as d = 1).
        y: (n,) integer class indices 0..C-1 or (n, C) one-hot labels.
        num_classes: C for integer labels (default max(y) + 1; more keeps classes without examples).
        fixed: names of kernel attributes held fixed (e.g. ("log_variance",) for eq. 44).
        class_covariance: (C, C) K^c, or None for the identity (then K = (K^x + jitter I) (x) I_C is factorised
            through the (n, n) Cholesky factor of K^x + jitter I).
        jitter: added to the diagonal of the prior.
        site: "theorem6" or "knowles_minka", the site bound (see `gk.multiclass.fit`).
        covariance: "full" or "class_factorised".
        max_steps: the most outer steps; 0 fits the variational posterior at the given kernel only.
        ftol: the outer settling tolerance.
        inner_tol: the final inner fit's `fit_full` tolerance: 1e-8 (about 2e-6 nats on glass) gave the same
            learned bound to 1e-4 nats as 1e-10; line-search fits use a looser one that follows the outer gains
            (`_learn`).
        inner_steps: the most sweeps of an inner fit.
        max_step: the most an outer step moves any log-parameter.
        memory: the L-BFGS memory.
        inducing: (s,) int indices i C + c of inducing latents: ML-II of the sparse bound log Z~_h* (Section 4,
            the gradient of App. C.4; `_sparse_hyper`) on that set, for n C too large for the full bound (cost per
            inner fit O(n C^3 + n C s^2 + s^3)); the posterior is then a `SparsePosterior` and t_matrix None.
            Needs class_covariance None and covariance "full". None (default): the full bound.
        noise: the inducing variables' noise variance (sparse only, as `fit_sparse`).
        progress: False (default), True (each outer step's bound and max |d log Z_h* / d theta| on stderr), "auto"
            (True where stderr is a terminal), or a callable receiving a `gkl_jax.solvers.ProgressInfo` after each
            outer step and once at the end (`solver` "HostLBFGS"), as for `gkl_jax.fit`. A callable that raises
            stops the run with its exception.

    Returns:
        A `HyperResult`: the learned kernel, the posterior at it (for `gk.multiclass.predict`), log Z_h*,
        T = W - W V W for predictions (None for a sparse fit), and the bookkeeping (history of the bound per outer
        step, number of inner fits, wall time).

    Raises:
        ValueError: a kernel that is not an Equinox module, inputs that are not finite (n, d), labels that do not
            match them, an unknown `fixed` name, a bad option, count or tolerance, or a `progress` that is not
            True, False, "auto" or callable.
    """
    callback = resolve_progress(progress, "gkl_jax.multiclass.fit_hyperparameters")
    if not isinstance(kernel, eqx.Module):
        raise ValueError(f"kernel must be a gkl_jax.kernels kernel (an Equinox module), got {type(kernel).__name__}")
    X = device_array(X)
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2:
        raise ValueError(f"X must be (n, d), got shape {X.shape}")
    if is_concrete(X) and not bool(np.isfinite(host_view(X)).all()):
        raise ValueError("X contains NaN or inf")
    Y = one_hot_labels(y, X.shape[0], num_classes, X.dtype if jnp.issubdtype(X.dtype, jnp.floating) else None)
    check_int(max_steps, "max_steps", 0)
    check_nonnegative(jitter, "jitter")
    if class_covariance is not None and jnp.shape(class_covariance) != (Y.shape[1], Y.shape[1]):
        raise ValueError(f"class_covariance must be (C, C) = ({Y.shape[1]}, {Y.shape[1]}), got shape "
                         f"{jnp.shape(class_covariance)}")
    check_int(memory, "memory", 1)
    check_int(inner_steps, "inner_steps", 1)
    for name, value in (("max_step", max_step), ("ftol", ftol), ("inner_tol", inner_tol)):
        check_tol(value, name)
    if site not in SITES:
        raise ValueError(f"site must be one of {SITES}, got {site!r}")
    if covariance not in COVARIANCES:
        raise ValueError(f"covariance must be one of {COVARIANCES}, got {covariance!r}")
    if inducing is not None:
        if class_covariance is not None or covariance != "full":
            raise ValueError("inducing: the sparse bound has K^c = I and full site covariances; leave "
                             "class_covariance=None and covariance='full'")
        inducing = check_indices(inducing, Y.size, "inducing")
        if inducing.shape[0] == 0:
            raise ValueError("inducing must hold at least one latent index")
        check_nonnegative(noise, "noise")
    start = time.perf_counter()
    params, static = eqx.partition(kernel, trainable_filter(kernel, fixed))
    flags = (site == "knowles_minka", covariance == "class_factorised", True)
    dt = Y.dtype
    n, C = Y.shape
    X = X if X.dtype == dt else X.astype(dt)
    jit_args = dict(class_covariance=class_covariance, jitter=device_array(jitter, dt), flags=flags,
                    inner_steps=int(inner_steps))
    cold_warm = placeholder_sites(n, C, dt)

    def solve(p, st, cold, tol):
        warm = cold_warm if st is None else (st.b, st.S, st.W)
        st1, k, ok, stat, g, T = _solve(p, static, X, Y, warm=warm, cold=device_array(cold),
                                        inner_tol=device_array(tol, dt), **jit_args)
        return float(st1.value), _flatten(g), st1, (ok, stat, T)

    if inducing is not None:
        solve = sparse_solver(static, X, Y, inducing, noise=noise, jitter=jitter, km=flags[0], max_steps=inner_steps,
                              flatten=_flatten)

    learner = HostLBFGS(int(max_steps), float(ftol), float(max_step), int(memory), float(inner_tol), dt)
    solution, _ = iterate(learner, Learning(solve, params), np.asarray(ftol, dt), int(max_steps),
                          progress=callback, host=True)
    x, (f, st, aux, evals) = solution.x, solution.extras
    code, k = solution.status, solution.num_steps
    if int(code) != RESULTS.successful:
        warnings.warn(f"gkl_jax.multiclass.fit_hyperparameters: {int(k)} steps without the bound settling "
                      f"({RESULTS.message(code)}); the returned hyper-parameters are the best found", stacklevel=2)
    history = np.array(solution.history)
    history[int(k)] = f     # the last entry at `inner_tol` (`HostLBFGS.postprocess`)
    history, k = device_array(history), device_array(k)
    new_kernel = eqx.combine(_unflatten(params, x), static)
    f = device_array(f, dt)
    if inducing is not None:
        post = sparse_posterior(st, aux, Y, new_kernel, X, inducing, noise, jitter)
        return HyperResult(kernel=new_kernel, posterior=post, log_z=f, status=code, num_steps=k, history=history,
                           t_matrix=None, num_inner_fits=evals, wall_time=time.perf_counter() - start)
    inner_ok, stat, T = aux
    post = Posterior(Y=Y, b=st.b, S=st.S, W=st.W, V_blocks=st.Vb, log_z=f, converged=inner_ok, num_steps=k,
                     history=history, stationarity=stat, kernel=new_kernel, X=X,
                     class_covariance=None if class_covariance is None else jnp.asarray(class_covariance, dt),
                     jitter=float(jitter), site=site, covariance_family=covariance)
    return HyperResult(kernel=new_kernel, posterior=post, log_z=f, status=code, num_steps=k, history=history,
                       t_matrix=T, num_inner_fits=evals, wall_time=time.perf_counter() - start)
