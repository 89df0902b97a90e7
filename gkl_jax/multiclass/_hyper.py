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
at the optimum. The optimiser is L-BFGS with an Armijo backtracking search, in `lax` control flow; every trial
point re-optimises the variational parameters warm-started from the current ones (App. E.3).
"""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jax.flatten_util import ravel_pytree

from .._linalg import full_precision
from .._validate import check_int, check_max_steps, check_nonnegative, check_tol, is_concrete
from ._blocks import blockdiag_dense, blockdiag_left, sym
from ._full import COVARIANCES, SITES, FullPosterior, _gbar, check_labels_matrix, fit_core, initial_state

TRACE_COUNT = {"hyper": 0}
# One S_i update per sweep in the inner fits: the Newton V step sets S_i = S^fx(V_i) anyway, and on glass three
# updates per sweep (the `fit_full` default) gave the same sweeps and bound at 15% more time.
INNER_S_SWEEPS = 1


@eqx.filter_jit
def prior_covariance(kernel, X, num_classes, class_covariance=None, jitter=1e-6):
    """K = K^x (x) K^c + jitter I, datum-major (nC, nC) (eq. 1 with K^c = I by default)."""
    Kx = kernel.gram(X)
    Kc = jnp.eye(num_classes, dtype=Kx.dtype) if class_covariance is None else jnp.asarray(class_covariance, Kx.dtype)
    N = Kx.shape[0] * num_classes
    return jnp.kron(Kx, Kc) + jitter * jnp.eye(N, dtype=Kx.dtype)


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


def _t_matrix(st):
    return sym(blockdiag_dense(st.W) - blockdiag_left(st.W, blockdiag_left(st.W, st.V).T))


def _two_loop(g, S, Yv, rho, count, m):
    """L-BFGS direction H g (ascent) from the last `count` pairs (s, y) stored cyclically in S, Yv."""
    idx = lambda i: (count - 1 - i) % m

    def first(i, carry):
        q, a = carry
        j = idx(i)
        valid = i < jnp.minimum(count, m)
        ai = jnp.where(valid, rho[j] * (S[j] @ q), 0.0)
        return q - ai * Yv[j], a.at[i].set(ai)

    q, a = lax.fori_loop(0, m, first, (g, jnp.zeros(m, g.dtype)))
    j0 = idx(0)
    gamma = jnp.where(count > 0, (S[j0] @ Yv[j0]) / (Yv[j0] @ Yv[j0]), 1.0 / jnp.maximum(jnp.linalg.norm(g), 1.0))
    r = gamma * q

    def second(i2, r):
        i = m - 1 - i2
        j = idx(i)
        valid = i < jnp.minimum(count, m)
        bi = rho[j] * (Yv[j] @ r)
        return jnp.where(valid, r + S[j] * (a[i] - bi), r)

    return lax.fori_loop(0, m, second, r)


class HyperResult(eqx.Module):
    """Learned kernel, the variational optimum at it, and the outer solver's bookkeeping."""

    kernel: eqx.Module
    posterior: FullPosterior
    log_z: jax.Array
    converged: jax.Array
    num_steps: jax.Array
    history: jax.Array


def _hyper_core(params, static, X, Y, class_covariance, jitter, flags, inner_tol, inner_steps, max_steps, ftol,
                max_step, memory):
    km, mf, newton = flags
    n, C = Y.shape
    flat0, unravel = ravel_pytree(params)
    kern = lambda flat: eqx.combine(unravel(flat), static)
    K_of = lambda flat: prior_covariance(kern(flat), X, C, class_covariance, jitter)

    def factor(flat):
        """(K, L^x): with K^c = I, K = (K^x + jitter I) (x) I_C, whose Cholesky factor L^x (x) I_C makes V cheaper
        (`_full._lwl`); K^x + jitter I is every C-th row and column of K. Otherwise (K, None)."""
        K = K_of(flat)
        return K, None if class_covariance is not None else jnp.linalg.cholesky(K[::C, ::C])

    def solve(flat, st):
        K, Lx = factor(flat)
        st0 = initial_state(K, Y, km, mf, 1.0, (st.b, st.S, st.W), jnp.asarray(False), Lx)
        st1, k, ok, _, _ = fit_core(K, Y, st0, km, mf, newton, inner_tol, inner_steps, INNER_S_SWEEPS, Lx=Lx)
        alpha = (Y - st1.b).reshape(-1)
        T = _t_matrix(st1)
        g = jax.grad(lambda f: envelope_surrogate(K_of(f), alpha, T))(flat)
        return st1, st1.value, g, ok

    K0, Lx0 = factor(flat0)
    cold = initial_state(K0, Y, km, mf, 1.0, None, jnp.asarray(True), Lx0)
    st0, k0, _, _, _ = fit_core(K0, Y, cold, km, mf, newton, inner_tol, inner_steps, INNER_S_SWEEPS, Lx=Lx0)
    alpha0 = (Y - st0.b).reshape(-1)
    g0 = jax.grad(lambda f: envelope_surrogate(K_of(f), alpha0, _t_matrix(st0)))(flat0)
    P = flat0.shape[0]
    hist0 = jnp.full((max_steps + 1,), jnp.nan, flat0.dtype).at[0].set(st0.value)
    mem0 = (jnp.zeros((memory, P), flat0.dtype), jnp.zeros((memory, P), flat0.dtype), jnp.zeros(memory, flat0.dtype))

    def cond(c):
        x, st, f, g, k, mem, count, hist, status = c
        return (k < max_steps) & (status == 0)

    def body(c):
        x, st, f, g, k, (Sm, Ym, rho), count, hist, _ = c
        d = _two_loop(g, Sm, Ym, rho, count, memory)
        d = jnp.where(d @ g > 0, d, g)  # keep an ascent direction
        d = d * jnp.minimum(1.0, max_step / jnp.maximum(jnp.max(jnp.abs(d)), 1e-30))
        slope = g @ d

        def ls_cond(ls):
            t, j, st_t, f_t, g_t, ok = ls
            good = jnp.isfinite(f_t) & (f_t >= f + 1e-4 * t * slope)
            return ~good & (j < 10)

        def ls_body(ls):
            t, j, *_ = ls
            t = jnp.where(j == 0, 1.0, 0.5 * t)
            st_t, f_t, g_t, ok = solve(x + t * d, st)
            return t, j + 1, st_t, f_t, g_t, ok

        init = (jnp.ones((), x.dtype), 0, st, jnp.asarray(-jnp.inf, x.dtype), g, jnp.asarray(False))
        t, _, st_t, f_t, g_t, _ = lax.while_loop(ls_cond, ls_body, init)
        accepted = jnp.isfinite(f_t) & (f_t >= f + 1e-4 * t * slope)
        s_vec, y_vec = t * d, -(g_t - g)  # pairs for minimising -f
        curv = s_vec @ y_vec
        use = accepted & (curv > 1e-12)
        j = count % memory
        Sm = jnp.where(use, Sm.at[j].set(s_vec), Sm)
        Ym = jnp.where(use, Ym.at[j].set(y_vec), Ym)
        rho = jnp.where(use, rho.at[j].set(1.0 / jnp.where(curv > 0, curv, 1.0)), rho)
        count = count + use.astype(count.dtype)
        x_new = jnp.where(accepted, x + t * d, x)
        st_new = jax.tree.map(lambda a, b: jnp.where(accepted, a, b), st_t, st)
        f_new = jnp.where(accepted, f_t, f)
        g_new = jnp.where(accepted, g_t, g)
        # settled: an accepted step that raised the bound by <= ftol (1 + |f|), or a failed line search where the
        # first-order gain of the full step is itself below that (round-off at the optimum); a failed line search
        # with a larger predicted gain is a stall (status 2), reported as not converged
        small = ftol * (1 + jnp.abs(f_new))
        settled = jnp.where(accepted, f_new - f <= small, slope <= small)
        status = jnp.where(settled, 1, jnp.where(accepted, 0, 2))
        return x_new, st_new, f_new, g_new, k + 1, (Sm, Ym, rho), count, hist.at[k + 1].set(f_new), status

    init = (flat0, st0, st0.value, g0, 0, mem0, 0, hist0, jnp.asarray(0))
    x, st, f, g, k, _, _, hist, status = lax.while_loop(cond, body, init)
    gbar, _ = _gbar(K_of(x), Y, st.b, st.S, st.Vb, km)
    return unravel(x), st, f, k, status == 1, hist, jnp.max(jnp.abs(st.b - gbar))


@eqx.filter_jit
def _hyper_jit(params, static, X, Y, class_covariance, jitter, flags, inner_tol, inner_steps, max_steps, ftol,
               max_step, memory):
    TRACE_COUNT["hyper"] += 1
    return _hyper_core(params, static, X, Y, class_covariance, jitter, flags, inner_tol, inner_steps, max_steps, ftol,
                       max_step, memory)


@full_precision
def fit_hyperparameters(kernel, X, Y, *, fixed=(), class_covariance=None, jitter=1e-6, site="theorem6",
                        covariance="full", max_steps=50, ftol=1e-7, inner_tol=1e-8, inner_steps=100,
                        max_step=1.0, memory=10) -> HyperResult:
    """Maximise log Z_h*(theta) (Section 6) over the kernel's unconstrained parameters (all inexact arrays except
    the attribute names in `fixed`), by L-BFGS with warm-started inner fits.

    X: (n, d) inputs; Y: (n, C) one-hot labels. Each outer step moves every log-parameter by at most `max_step`.
    `inner_tol` is the inner fits' `fit_full` tolerance: 1e-8 (about 2e-6 nats on glass, a tenth of the outer
    settling threshold ftol (1 + |log Z|)) gave the same learned bound to 1e-4 nats as 1e-10 in 30% less time.
    Stops when a step raises the bound by at most ftol * (1 + |log Z|), when the line search fails, or after
    `max_steps` steps. Returns a `HyperResult`; `converged` is False (with a warning) when `max_steps` was reached
    first or the line search failed while the first-order gain of the step was still above that tolerance.
    """
    if not isinstance(kernel, eqx.Module):
        raise ValueError(f"kernel must be a gkl_jax.kernels kernel (an Equinox module), got {type(kernel).__name__}")
    X = jnp.asarray(X)
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2:
        raise ValueError(f"X must be (n, d), got shape {X.shape}")
    if is_concrete(X) and not bool(jnp.all(jnp.isfinite(X))):
        raise ValueError("X contains NaN or inf")
    Y = jnp.asarray(Y, X.dtype if jnp.issubdtype(X.dtype, jnp.floating) else jnp.float64)
    if Y.ndim != 2 or Y.shape[0] != X.shape[0]:
        raise ValueError(f"Y must be (n, C) one-hot with n = {X.shape[0]}, got shape {Y.shape}")
    check_labels_matrix(jnp.eye(Y.size, dtype=Y.dtype), Y)
    check_max_steps(max_steps)
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
    params, static = eqx.partition(kernel, trainable_filter(kernel, fixed))
    flags = (jnp.asarray(site == "knowles_minka"), jnp.asarray(covariance == "class_factorised"), jnp.asarray(True))
    dt = Y.dtype
    p, st, f, k, done, hist, stat = _hyper_jit(params, static, X, Y, class_covariance, jnp.asarray(jitter, dt), flags,
                                         jnp.asarray(inner_tol, dt), int(inner_steps), int(max_steps),
                                         jnp.asarray(ftol, dt), jnp.asarray(max_step, dt), int(memory))
    if is_concrete(done) and not bool(done):
        warnings.warn(f"gkl_jax.multiclass.fit_hyperparameters: {int(k)} steps without the bound settling (step "
                      "limit or a failed line search); the returned hyper-parameters are the best found",
                      stacklevel=2)
    new_kernel = eqx.combine(p, static)
    post = FullPosterior(Y=Y, b=st.b, S=st.S, W=st.W, V_blocks=st.Vb, log_z=f, converged=done, num_steps=k,
                         history=hist, stationarity=stat, site=site, covariance_family=covariance)
    return HyperResult(kernel=new_kernel, posterior=post, log_z=f, converged=done, num_steps=k, history=hist)
