"""`laplace`: the Laplace approximation (Challis & Barber 2013, Section 5.2.1; thesis Ch. 2.5.6 and 4.3).

The mode w* of log p(w) = log N(w | mu, Sigma) + sum_n log phi_n(h_n^T w + o_n) is found by Newton's method
(IRLS, thesis Ch. 2.3.1) with a backtracking line search; the covariance is the inverse negative Hessian at the
mode,

    A = -grad^2 log p(w*) = Sigma^{-1} + H^T W H,   W_nn = -(log phi_n)''(h_n^T w* + o_n)

(Nickisch 2010, Ch. 2.5.6, with the second derivative taken afresh), and the evidence estimate is

    log Z_LA = log N(w* | mu, Sigma) + sum_n log phi_n(h_n^T w* + o_n) + (D/2) log 2 pi - log det A / 2

(thesis eq. 4.15 with the corrected sign; for a GP prior and h_n = e_n this is Rasmussen & Williams Alg. 3.2,
the number scikit-learn's GaussianProcessClassifier reports). Not a bound (`is_bound=False`).

For non-log-concave sites (Student-t) W can be negative away from the mode; the Newton direction then uses
max(W, 0) (a positive-definite majoriser of the curvature), and at the end `converged` is False if A is not
positive definite at the point found. Potentials that are not twice differentiable (Laplace) are refused.
"""

import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax import lax

from .. import potentials as P
from .._adjoint import implicit_maximiser, stop_gradients
from .._linalg import diagonal, full_precision
from .._result import Result
from .._status import status_from
from .._validate import check_max_steps, check_tol
from .._xla import program
from ..solvers._newton import armijo_search
from . import _common as C

TRACE_COUNT = {"laplace": 0}


@full_precision
def laplace(model, *, tol: float | None = None, max_steps: int = 100) -> Result:
    """The Laplace approximation N(w*, A^{-1}) and its log Z estimate (Challis & Barber 2013, Section 5.2.1;
    Nickisch 2010, Ch. 2.5.6 and 4.3; module docstring).

    Stops when max |grad log p| <= tol, or when the Newton decrement g^T A^{-1} g <= tol^2 (the scale-free form of
    the same test: equal for A = I, and reachable where the prior precision is huge, e.g. a GP with jitter 1e-10,
    whose gradient stays at the round-off of Sigma^{-1} w), or after `max_steps` Newton steps; warns when it did
    not converge.

    Args:
        model: a `gkl_jax.Model` (sites without `variance_offset`).
        tol: the gradient tolerance (default 1e-8 in float64).
        max_steps: Newton steps (int >= 1, default 100).

    Returns:
        `gkl_jax.Result` with q = N(w*, A^{-1}) (a Full factor), `log_z` the Laplace estimate (`is_bound=False`)
        and `history` log p(w) at each step. q and `log_z` are differentiable in the model in forward and reverse
        mode, to any order (the implicit-function rule for w*: dw* = A^{-1} d_theta grad log p(w*)).

    Raises:
        ValueError: a potential that is not twice differentiable (Laplace), a model that cannot be fitted, or a
            bad tol or max_steps.

    Example:
        >>> import numpy as np, gkl_jax as gk
        >>> H = np.array([[1.0, 0.5], [-0.3, 1.0], [0.2, -1.0]])
        >>> model = gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(H, gk.potentials.Logistic([1, -1, 1])))
        >>> approx = gk.laplace(model)
        >>> approx.is_bound, bool(approx.converged), round(float(approx.log_z), 3)
        (False, True, -2.006)
    """
    C.check_model(model, "laplace")
    for s in model.sites:
        if isinstance(s.potential, P.Laplace):
            raise ValueError("laplace: the Laplace potential exp(-|y - x| / scale) is not twice differentiable at "
                             "x = y, so the Laplace approximation (which needs the Hessian at the mode) does not "
                             "apply; use gk.fit, gk.ep or gk.local")
    max_steps = check_max_steps(max_steps, "laplace: max_steps")
    dtype = C.dtype_of(model)
    tol = C.default_tol(dtype) if tol is None else check_tol(tol, "laplace: tol")
    result = _laplace_jit(model, jnp.asarray(tol, dtype), max_steps)  # an array: no recompile per tol
    C.warn_if_not_converged(result.converged, "laplace", "Newton's method did not reach max|grad| <= "
                            f"{tol:g} within max_steps={max_steps}, or the Hessian at the point found is not "
                            "negative definite")
    return result


def _curvature(model, groups, w):
    """(gradient of log p, A = -Hessian of log p, A with W clipped at 0), dense."""
    dtype = w.dtype
    A = jnp.zeros((model.dim, model.dim), dtype) if model.prior is None else model.prior.precision_dense()
    grad = -C.prior_precision_mv(model, w - (0 if model.prior is None else model.prior.mean))
    A_clip = A
    for op, off, pot in groups:
        d1, d2 = C.site_derivatives(pot, op.mv(w) + off)
        A = A + op.weighted_gram(-d2)
        A_clip = A_clip + op.weighted_gram(jnp.maximum(-d2, 0))
        grad = grad + op.rmv(d1)
    return grad, 0.5 * (A + A.T), 0.5 * (A_clip + A_clip.T)


@program
def _laplace_jit(model, tol, max_steps):
    """One `lax.while_loop` on the gradient-free model; iteration k evaluates log p, its gradient and curvature at
    w_k (history[k]) and, unless it has converged (`laplace`) or k = max_steps, takes the damped Newton step to
    w_{k+1}. The mode found then gets its implicit-function derivative (dw* = A^{-1} d_theta grad log p) and
    log Z_LA and A are evaluated at it outside the loop, so that jax.grad of either works to every order."""
    TRACE_COUNT["laplace"] += 1
    frozen = stop_gradients(model)
    groups = C.operators(frozen)
    dtype = C.dtype_of(model)
    dim = model.dim
    f = lambda w: C.log_joint(frozen, w)
    w0 = jnp.zeros(dim, dtype) if model.prior is None else model.prior.mean.astype(dtype)

    def cond(state):
        _, k, _, done, ok = state
        return ~done & ok & (k <= max_steps)

    def body(state):
        w, k, hist, _, _ = state
        fw = f(w)
        g, _, A_clip = _curvature(frozen, groups, w)
        L = jnp.linalg.cholesky(A_clip)
        good = jnp.all(jnp.isfinite(L))
        # Without a prior the clipped curvature may be singular; fall back to gradient ascent there.
        p = jnp.where(good, jsl.cho_solve((jnp.where(good, L, jnp.eye(dim, dtype=dtype)), True), g), g)
        done = (jnp.max(jnp.abs(g)) <= tol) | (good & (g @ p <= tol * tol))
        t, _, ok = armijo_search(f, w, fw, g, p)
        move = ok & ~done & (k < max_steps)
        return jnp.where(move, w + t * p, w), k + 1, hist.at[k].set(fw), done, ok | done

    state = (lax.stop_gradient(w0), jnp.asarray(0), jnp.full((max_steps + 1,), jnp.nan, dtype), jnp.asarray(False),
             jnp.asarray(True))
    w, k, hist, done, _ = lax.while_loop(cond, body, state)
    # The loop's last evaluation was at w (it stops without moving), so these equal its last values.
    w = implicit_maximiser(lambda m, w, _: C.log_joint(m, w), model, w)
    fw = C.log_joint(model, w)
    _, A, _ = _curvature(model, C.operators(model), w)
    L = jnp.linalg.cholesky(A)
    pd = jnp.all(jnp.isfinite(L))
    log_z = fw + 0.5 * dim * jnp.log(2 * jnp.pi) - jnp.sum(jnp.log(diagonal(L)))
    converged = pd & done & jnp.isfinite(log_z)
    q = C.gaussian_of_precision(w, A)
    # not done: the step limit (k - 1 = max_steps) or a failed line search; not positive definite: not a maximum
    code = status_from(converged, max_steps_reached=~done & (k - 1 >= max_steps), nonfinite=~jnp.isfinite(log_z),
                       breakdown=~pd)
    return Result(q=q, log_z=log_z, status=code, num_steps=k - 1, history=lax.stop_gradient(hist),
                  method="laplace", is_bound=False)
