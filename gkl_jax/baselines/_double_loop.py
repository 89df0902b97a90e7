"""`double_loop`: the scalable double-loop algorithm for the local variational bound (glm-ie; thesis Ch. 3.5,
Alg. 3.1 with bound (2); Nickisch & Seeger 2009; Challis & Barber 2013, Section 5.2.2).

The local bound of `local` (super-Gaussian site bounds t_n tangent at xi_n, A = Sigma^{-1} + H^T diag(tau) H,
tau_n = -2 g'(xi_n) = 1 / gamma_n) needs log det A and the marginal variances z_n = h_n^T A^{-1} h_n, both cubic.
The double loop upper-bounds the concave log det A by its tangent in gamma^{-1} (thesis eq. 3.9, bound (2)),
whose slopes are exactly the z_n, and alternates

    outer:  z_n ~= h_n^T Q T^{-1} Q^T h_n  from K Lanczos vectors of A (`gkl_jax._lanczos`, Alg. 3.2);
    inner:  u <- argmax_u  log N(u | mu, Sigma) + sum_n [ beta_n x_n + g_n((x_n - center_n)^2 + z_n) ]
            (a smoothed MAP problem, thesis eq. 3.12-3.13 and App. E.5: z = 0 is MAP), by Newton's method
            (IRLS) with conjugate gradients and an MVM-free line search (thesis Ch. 3.5.5);
    update: xi_n <- (x_n - center_n)^2 + z_n  (the tangent point, eq. 3.11; gamma_n = -1 / (2 g'(xi_n))).

Everything touches H and Sigma^{-1} only through products (op.mv, op.rmv, prior.precision_mv), so matrix-free
operators (finite differences, wavelets) scale to large D: one outer step costs K + N_Newton N_CG products and
O(D K^2) for the reorthogonalisation. The same Lanczos start vector is used in every outer step, so the
iteration is a deterministic fixed-point map; with K = D the estimates are exact and the fixed point is that of
`local`.

Returned evidence: the local bound's formula with the Lanczos estimates,

    log Z_DL = sum_n [c_n + nu_n x_n - tau_n x_n^2 / 2] - (u - mu)^T Sigma^{-1} (u - mu) / 2 - log det Sigma / 2
               - logdet_hat(A) / 2,

where logdet_hat(A) is a stochastic Lanczos quadrature estimate (`num_probes` Rademacher probes of K steps;
exact Ritz-value sum when K = D). The variances z are underestimated for K < D, so the fixed point differs from
the exact local optimum, and logdet_hat is random: this is an estimate of log Z, NOT a bound (`is_bound=False`;
Challis & Barber 2013, Section 5.2.2: "a lower-bound on log Z is no longer maintained"). The returned q is
N(u, W W^T + diag(r)) as a `FactorAnalysis` factor of rank K: W W^T = Q T^{-1} Q^T is the Lanczos approximation of
A^{-1} that glm-ie also designs with, its diagonal nu_hat the marginal-variance estimates (underestimates for
K < D), and r = eps^(2/3) nu_hat a relative ridge (3.7e-11 in float64) that only keeps S positive definite. So
`covariance_mv` (design), `marginal_variances` and `sample` see the K leading directions; no dense covariance is
ever formed. For K < D, q is nearly degenerate outside the Krylov space: its entropy is not meaningful there.
"""

from typing import Callable

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import _lanczos
from .._adjoint import forward_mode_only
from .._gaussian import Gaussian
from .._linalg import full_precision
from .._model import Model
from .._optim import backtrack, conjugate_gradient, sufficient_increase
from .._program import program
from .._progress import reraise_callback_error, resolve_progress
from .._result import Result
from .._status import status_from
from .._typing import Key
from .._validate import as_int, check_int, check_key, check_tol
from ..factors import FactorAnalysis
from ..solvers._iterate import ProgressInfo, Step, iterate
from . import _common as C
from ._site_bounds import super_gaussian, tangent_coefficients

TRACE_COUNT = {"double_loop": 0}


@full_precision
def double_loop(model: Model, rank: int, *, key: Key | None = None, max_outer: int = 20, max_inner: int = 50,
                max_cg: int = 200, num_probes: int = 4, tol: float = 1e-4,
                progress: bool | str | Callable[[ProgressInfo], object] = False) -> Result:
    """The glm-ie double loop with K = `rank` Lanczos vectors (Nickisch 2010, Alg. 3.1; Challis & Barber 2013,
    Section 5.2.2; module docstring); matrix-free in H and Sigma^{-1}. Stops when the tangent points xi change by
    at most `tol` (relative) or after `max_outer` outer steps; warns when it did not settle.

    Args:
        model: a `gkl_jax.Model` (sites without `variance_offset`).
        rank: K, Lanczos vectors per outer step (int in [1, D]).
        key: a `jax.random` key for the Lanczos start and the log-det probes (default `jax.random.PRNGKey(0)`).
        max_outer: outer (variance) steps (int >= 1, default 20).
        max_inner: Newton steps of each inner problem (int >= 1, default 50).
        max_cg: conjugate-gradient steps per Newton step (int >= 1, default 200).
        num_probes: Rademacher probes of the log-det estimate (int >= 1, default 4).
        tol: relative tolerance on the tangent points (positive, default 1e-4).
        progress: False (default), True (the outer step, the evidence estimate and the relative change of the
            tangent points on stderr), "auto" (True where stderr is a terminal) or a callable receiving a
            `gkl_jax.solvers.ProgressInfo` after each outer step and once at the end (as in `gkl_jax.fit`; turning
            it on compiles the program once more; a callable that raises stops the run with its exception).

    Returns:
        `gkl_jax.Result` with `is_bound=False` (an estimate of log Z, not a bound), q a rank-K `FactorAnalysis`
        Gaussian, `history[k]` the (single-probe) evidence estimate at the start of outer step k, and `status`
        (`message`): successful where the tangent points settled, max_steps_reached after `max_outer` outer
        steps, nonfinite where the iteration or the estimate lost finiteness.
        Derivatives in the model: forward mode only (jax.jacfwd, jax.jvp, through the iterations); reverse mode
        (jax.grad) raises a ValueError that says so.

    Raises:
        ValueError: rank outside [1, D], potentials without a super-Gaussian bound (probit, Poisson, Custom), a
            model that cannot be fitted, or bad counts, key, tol or progress.

    Example:
        >>> import numpy as np, gkl_jax as gk
        >>> H = np.array([[1.0, 0.5], [-0.3, 1.0], [0.2, -1.0]])
        >>> model = gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(H, gk.potentials.Logistic([1, -1, 1])))
        >>> import jax
        >>> approx = gk.double_loop(model, rank=2, key=jax.random.PRNGKey(0))
        >>> approx.is_bound, approx.q.mean.shape, round(float(approx.log_z), 2)
        (False, (2,), -2.01)
    """
    C.check_model(model, "double_loop")
    if not model.sites:
        return C.prior_only_result(model, "double_loop", is_bound=False)
    if as_int(rank) is None or not 1 <= as_int(rank) <= model.dim:
        raise ValueError(f"double_loop: rank must be an integer in [1, D={model.dim}], got {rank!r}")
    for s in model.sites:
        super_gaussian(s.potential, "double_loop")
    for name, value in (("max_outer", max_outer), ("max_inner", max_inner), ("max_cg", max_cg),
                        ("num_probes", num_probes)):
        check_int(value, f"double_loop: {name}", 1)
    tol = check_tol(tol, "double_loop: tol")
    callback = resolve_progress(progress, "gkl_jax.double_loop")
    key = jax.random.PRNGKey(0) if key is None else check_key(key)
    model = forward_mode_only(model, "double_loop: reverse-mode derivatives (jax.grad, jax.vjp, jax.linearize) of "
                              "its result are not available: the Lanczos fixed point has no implicit rule; take "
                              "forward-mode derivatives with jax.jacfwd or jax.jvp")
    try:
        result = _double_loop_jit(model, key, int(rank), int(max_outer), int(max_inner), int(max_cg),
                                  int(num_probes), jnp.asarray(tol, C.dtype_of(model)), callback)
    except jax.errors.JaxRuntimeError as e:     # a progress callable that raised: its own exception
        reraise_callback_error(callback, e)
        raise
    C.warn_if_not_converged(result.converged, "double_loop", f"the outer loop did not settle (relative change "
                            f"of the variational parameters > tol={tol:g}) within max_outer={max_outer} steps")
    return result


def _precision_mv(model, groups, taus):
    """v -> A v = Sigma^{-1} v + sum_n tau_n h_n (h_n^T v), matrix-free."""
    def mv(v):
        out = C.prior_precision_mv(model, v)
        for (op, _, _), tau in zip(groups, taus):
            out = out + op.rmv(tau * op.mv(v))
        return out
    return mv


def _site_terms(forms, xs, zs):
    """Per group (psi, psi', psi'') of psi(x) = beta x + g((x - center)^2 + z)."""
    out = []
    for f, x, z in zip(forms, xs, zs):
        r = x - f.center
        xi = r**2 + z
        g1 = f.g1(xi)
        out.append((f.beta * x + f.g(xi), f.beta + 2 * r * g1, 2 * g1 + 4 * r**2 * f.g2(xi)))
    return out


class _InnerState(eqx.Module):
    u: jax.Array
    done: jax.Array     # the Newton decrement is at round-off, or the line search failed
    skip: jax.Array     # nothing to solve (the outer loop's first iteration)


class _InnerNewton(eqx.Module):
    """The inner problem as a `gkl_jax.solvers.iterate` loop: Newton-CG (IRLS) on the smoothed MAP objective at
    fixed variances `zs`, with an MVM-free backtracking line search (thesis Ch. 3.5.5)."""

    model: object
    groups: list
    forms: list
    zs: list
    max_cg: int = eqx.field(static=True)
    monotone = True
    start_in_loop = False
    stop_on_nonfinite = False   # a non-finite objective fails the line search, which stops the loop

    def step(self, problem, s, tol):
        model, groups, forms, zs, u = self.model, self.groups, self.forms, self.zs, s.u
        mu = jnp.zeros_like(u) if model.prior is None else model.prior.mean
        xs = C.projections(groups, u)
        gp = -C.prior_precision_mv(model, u - mu)
        terms = _site_terms(forms, xs, zs)
        value = 0.5 * (u - mu) @ gp + sum(jnp.sum(t[0]) for t in terms)
        grad = gp + sum(op.rmv(t[1]) for (op, _, _), t in zip(groups, terms))
        weights = [jnp.maximum(-t[2], 0.0) for t in terms]  # a PSD curvature (exact for log-concave sites)

        def hess_mv(v):
            out = C.prior_precision_mv(model, v)
            for (op, _, _), w in zip(groups, weights):
                out = out + op.rmv(w * op.mv(v))
            return out

        d = conjugate_gradient(hess_mv, grad, max_iters=self.max_cg, rtol=1e-10)
        d = jnp.where(jnp.all(jnp.isfinite(d)), d, grad)
        slope = grad @ d
        # MVM-free line search: H d and Sigma^{-1} d once, then only elementwise work (thesis Ch. 3.5.5).
        hds = [op.mv(d) for op, _, _ in groups]
        dpd = d @ C.prior_precision_mv(model, d)
        dgp = d @ gp

        def along(t):
            sites = _site_terms(forms, [x + t * hd for x, hd in zip(xs, hds)], zs)
            prior = 0.5 * (u - mu) @ gp + t * dgp - 0.5 * t**2 * dpd
            return prior + sum(jnp.sum(s[0]) for s in sites)

        t, f_new, good = backtrack(along, lambda t, f_new: sufficient_increase(f_new, value, t, slope), value,
                                   dtype=u.dtype, max_halvings=40)
        u_new = jnp.where(good, u + t * d, u)
        tiny = 1e-13 * (1 + jnp.abs(value))
        done = ~good | (0.5 * slope <= tiny)
        return _InnerState(u_new, done, s.skip), Step(jnp.where(good, f_new, value), jnp.asarray(True),
                                                       jnp.asarray(True), slope)

    def terminate(self, problem, s, tol):
        return s.done, s.skip

    def point(self, s):
        return s.u

    def postprocess(self, problem, s, point):
        return point, None


def _inner(model, groups, forms, zs, u0, max_inner, max_cg, tol, skip=False):
    """Up to `max_inner` Newton steps of `_InnerNewton` from u0 (none where `skip`); returns u."""
    start = _InnerState(u0, jnp.asarray(False), jnp.asarray(skip))
    solution, _ = iterate(_InnerNewton(model, groups, forms, zs, max_cg), None, tol, max_inner,
                          init=(start, jnp.zeros((), u0.dtype)), postprocess=False)
    return solution.x


def _coefficients(forms, xis):
    taus, nus, cs = [], [], []
    for f, xi in zip(forms, xis):
        tau, nu, c = tangent_coefficients(f, xi)
        taus.append(jnp.broadcast_to(tau, xi.shape))
        nus.append(jnp.broadcast_to(nu, xi.shape))
        cs.append(jnp.broadcast_to(c, xi.shape))
    return taus, nus, cs


def _evidence(model, groups, forms, xis, u, logdet):
    """log Z_DL of the module docstring at tangent points xi and mean u, given an estimate of log det A."""
    taus, nus, cs = _coefficients(forms, xis)
    xs = C.projections(groups, u)
    value = sum(jnp.sum(c + nu * x - 0.5 * tau * x**2) for c, nu, tau, x in zip(cs, nus, taus, xs))
    if model.prior is None:
        value = value + 0.5 * model.dim * jnp.log(2 * jnp.pi)
    else:
        d = u - model.prior.mean
        value = value - 0.5 * d @ model.prior.precision_mv(d) - 0.5 * model.prior.logdet()
    return value - 0.5 * logdet


def _rademacher(key, dim, dtype):
    return jnp.where(jax.random.bernoulli(key, 0.5, (dim,)), 1.0, -1.0).astype(dtype)


def _lanczos_step(model, groups, taus, start, rank):
    """Lanczos on A(taus) from `start`: (z per group, diag estimate of A^{-1}, log det estimate, W); one eigh of
    T gives both the low-rank inverse W W^T = Q T^{-1} Q^T and the quadrature of log det A."""
    Q, alpha, beta = _lanczos.lanczos(_precision_mv(model, groups, taus), model.dim, rank, start)
    theta, U = jnp.linalg.eigh(_lanczos.tridiagonal(alpha, beta))
    theta = jnp.maximum(theta, jnp.finfo(theta.dtype).tiny)
    W = Q @ (U / jnp.sqrt(theta))
    zs = [jnp.sum(jnp.square(op.mm(W)), axis=1) for op, _, _ in groups]
    if rank == model.dim:  # Q is a full basis: the Ritz values are the eigenvalues of A
        logdet = jnp.sum(jnp.log(theta))
    else:  # stochastic Lanczos quadrature, one probe (_lanczos.slq_logdet)
        logdet = (start @ start) * jnp.sum(jnp.square(U[0]) * jnp.log(theta))
    return zs, jnp.sum(jnp.square(W), axis=1), logdet, W


class _State(eqx.Module):
    """The outer loop's carry: the mean u, the tangent points xi, and the Lanczos estimates at xi (the variances
    z, the diagonal nu_hat and W of the low-rank inverse, the single-probe log det)."""

    u: jax.Array
    xis: list
    zs: list
    nu_hat: jax.Array
    logdet: jax.Array
    W: jax.Array
    settled: jax.Array  # the tangent points changed by at most tol (relative)
    failed: jax.Array   # u or xi lost finiteness
    fresh: jax.Array    # before the first iteration (which evaluates the start)


class DoubleLoop(eqx.Module):
    """The glm-ie outer loop as a `gkl_jax.solvers.iterate` loop: an iteration solves the inner problem at the
    current variances (`_inner`; the first iteration, none), moves the tangent points to
    xi_n <- (x_n - center_n)^2 + z_n, and runs Lanczos at the new xi, whose evidence estimate is history[k]."""

    model: object
    groups: list
    forms: list
    start: jax.Array
    rank: int = eqx.field(static=True)
    max_inner: int = eqx.field(static=True)
    max_cg: int = eqx.field(static=True)
    monotone = True
    start_in_loop = True
    stop_on_nonfinite = False   # the evidence estimate may be non-finite while u and xi are (as before)

    def init(self, u0, xis0):
        dtype, dim = u0.dtype, u0.shape[0]
        zero, false = jnp.zeros((), dtype), jnp.asarray(False)
        state = _State(u0, xis0, [jnp.zeros_like(x) for x in xis0], jnp.zeros(dim, dtype), zero,
                       jnp.zeros((dim, self.rank), dtype), false, false, jnp.asarray(True))
        return state, zero

    def step(self, problem, s, tol):
        model, groups, forms = self.model, self.groups, self.forms
        u = _inner(model, groups, forms, s.zs, s.u, self.max_inner, self.max_cg, tol, skip=s.fresh)
        new = [(x - f.center) ** 2 + z for f, x, z in zip(forms, C.projections(groups, u), s.zs)]
        change = jnp.max(jnp.asarray([jnp.max(jnp.abs(a - b) / (jnp.abs(b) + 1e-12), initial=0.0)
                                      for a, b in zip(new, s.xis)]))
        ok = jnp.all(jnp.asarray([jnp.all(jnp.isfinite(a)) for a in new])) & jnp.all(jnp.isfinite(u))
        xis = [jnp.where(s.fresh, b, a) for a, b in zip(new, s.xis)]
        taus, _, _ = _coefficients(forms, xis)
        zs, nu_hat, logdet, W = _lanczos_step(model, groups, taus, self.start, self.rank)
        value = _evidence(model, groups, forms, xis, u, logdet)
        state = _State(u, xis, zs, nu_hat, logdet, W, ~s.fresh & (change <= tol), ~s.fresh & ~ok,
                       jnp.asarray(False))
        return state, Step(value, jnp.asarray(True), ~s.fresh, jnp.where(s.fresh, jnp.inf, change))

    def terminate(self, problem, s, tol):
        return s.settled, s.failed

    def point(self, s):
        return s.u

    def postprocess(self, problem, s, point):
        return point, None


def _run(model, key, rank, max_outer, max_inner, max_cg, tol, progress=None):
    """The outer loop; returns (u, xi per group, number of outer steps, history, the final `_State`)."""
    groups = C.operators(model)
    forms = [super_gaussian(pot, "double_loop") for _, _, pot in groups]
    dtype = C.dtype_of(model)
    u0 = jnp.zeros(model.dim, dtype) if model.prior is None else model.prior.mean.astype(dtype)
    xis0 = [jnp.broadcast_to((x - f.center) ** 2 + f.xi0, x.shape).astype(dtype)
            for f, x in zip(forms, C.projections(groups, u0))]
    loop = DoubleLoop(model, groups, forms, _rademacher(key, model.dim, dtype), rank, max_inner, max_cg)
    solution, state = iterate(loop, None, jnp.asarray(tol, dtype), max_outer, init=loop.init(u0, xis0),
                              progress=progress, postprocess=False)
    return state.u, state.xis, solution.num_steps, solution.history, state


@program
def _double_loop_jit(model, key, rank, max_outer, max_inner, max_cg, num_probes, tol, progress=None):
    TRACE_COUNT["double_loop"] += 1
    groups = C.operators(model)
    forms = [super_gaussian(pot, "double_loop") for _, _, pot in groups]
    dtype = C.dtype_of(model)
    u, xis, k, hist, state = _run(model, key, rank, max_outer, max_inner, max_cg, tol, progress)
    # Probe 0 is the loop's own start vector (its Lanczos run at the final xi is the loop's last: the returned
    # variances); with K = D the log determinant is exact and one probe suffices.
    nu_hat, logdet, W = state.nu_hat, state.logdet, state.W
    if rank < model.dim and num_probes > 1:
        taus, _, _ = _coefficients(forms, xis)
        extra = jax.random.split(jax.random.fold_in(key, 1), num_probes)[1:]
        starts = jax.vmap(lambda k: _rademacher(k, model.dim, dtype))(extra)
        logdets = jax.vmap(lambda s: _lanczos_step(model, groups, taus, s, rank)[2])(starts)
        logdet = jnp.mean(jnp.concatenate([logdet[None], logdets]))
    log_z = _evidence(model, groups, forms, xis, u, logdet)
    hist = hist.at[k].set(log_z)
    ok = jnp.isfinite(log_z) & jnp.all(jnp.isfinite(u)) & jnp.all(nu_hat > 0)
    ridge = jnp.finfo(dtype).eps ** (2 / 3) * jnp.maximum(nu_hat, jnp.finfo(dtype).tiny)
    q = Gaussian(u, FactorAnalysis(rank, W, jnp.sqrt(ridge), floor=0.0))   # exactly W W^T + ridge
    code = status_from(state.settled & ok, max_steps_reached=~(state.settled | state.failed), nonfinite=~ok)
    return Result(q=q, log_z=log_z, status=code, num_steps=k, history=hist, method="double_loop", is_bound=False)
