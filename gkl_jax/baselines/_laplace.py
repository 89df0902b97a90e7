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

Internal API: `laplace_program` (the compiled fit, without `laplace`'s checks) is shared with `gkl_jax.sklearn` (its
G-KL starts) and is not part of the public interface.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax import lax

from .. import potentials as P
from .._adjoint import implicit_maximiser, stop_gradients
from .._linalg import diagonal, full_precision
from .._model import Model
from .._program import program
from .._result import Result
from .._status import RESULTS
from .._validate import check_max_steps, check_tol
from ..solvers._iterate import Step, iterate
from ..solvers._newton import armijo_search
from . import _common as C

TRACE_COUNT = {"laplace": 0}


@full_precision
def laplace(model: Model, *, tol: float | None = None, max_steps: int = 100) -> Result:
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
    result = laplace_program(model, jnp.asarray(tol, dtype), max_steps)  # an array: no recompile per tol
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
def laplace_program(model, tol, max_steps):
    """One loop (`gkl_jax.solvers.iterate` over `_Newton`) on the gradient-free model: iteration k > 0 takes the
    damped Newton step from w_{k-1} to w_k, and each evaluates log p, its gradient and curvature at w_k
    (history[k]), to the stopping test (`laplace`), max_steps steps or a failed line search. The mode found then
    gets its implicit-function derivative (dw* = A^{-1} d_theta grad log p) and log Z_LA and A are evaluated at it
    outside the loop, so that jax.grad of either works to every order."""
    TRACE_COUNT["laplace"] += 1
    frozen = stop_gradients(model)
    groups = C.operators(frozen)
    dtype = C.dtype_of(model)
    dim = model.dim
    f = lambda w: C.log_joint(frozen, w)
    w0 = jnp.zeros(dim, dtype) if model.prior is None else model.prior.mean.astype(dtype)

    solution, _ = iterate(_Newton(frozen, groups, f), None, tol, max_steps,
                              init=_Newton.start(lax.stop_gradient(w0)))
    w, hist = solution.x, solution.history
    # The loop's last evaluation was at w (it stops without moving), so these equal its last values.
    w = implicit_maximiser(lambda m, w, _: C.log_joint(m, w), model, w)
    fw = C.log_joint(model, w)
    _, A, _ = _curvature(model, C.operators(model), w)
    L = jnp.linalg.cholesky(A)
    pd = jnp.all(jnp.isfinite(L))
    log_z = fw + 0.5 * dim * jnp.log(2 * jnp.pi) - jnp.sum(jnp.log(diagonal(L)))
    q = C.gaussian_of_precision(w, A)
    # the loop's status (successful, max_steps_reached, stalled: a failed line search; nonfinite), unless A is not
    # positive definite at the point found (not a maximum) or log Z_LA is not finite
    code = jnp.where(pd, solution.status, RESULTS.breakdown)
    code = jnp.where(jnp.isfinite(log_z), code, RESULTS.nonfinite).astype(jnp.int32)
    return Result(q=q, log_z=log_z, status=code, num_steps=solution.num_steps, history=lax.stop_gradient(hist),
                  method="laplace", is_bound=False)


class _State(eqx.Module):
    """The Newton iteration's carry: the current point, log p there and the step from it."""

    w: jax.Array
    fw: jax.Array
    g: jax.Array
    p: jax.Array        # the (clipped-curvature) Newton direction at w
    done: jax.Array     # the stopping test at w
    failed: jax.Array   # the last line search found no ascent
    fresh: jax.Array    # w not yet evaluated (the first iteration evaluates the start)


class _Newton(eqx.Module):
    """Damped Newton (IRLS) on log p as a `gkl_jax.solvers.iterate` loop: an iteration moves along the Newton
    direction by an Armijo search (`armijo_search`) and evaluates log p, its gradient and the clipped curvature at
    the new point (the first evaluates the start), so history[k] = log p(w_k) and num_steps counts the moves."""

    model: object
    groups: list
    f: object = eqx.field(static=True)
    monotone = True
    start_in_loop = True

    @staticmethod
    def start(w0):
        zero = jnp.zeros((), w0.dtype)
        false = jnp.asarray(False)
        return _State(w0, zero, jnp.zeros_like(w0), jnp.zeros_like(w0), false, false, jnp.asarray(True)), zero

    def step(self, problem, s, tol):
        t, _, ok = armijo_search(self.f, s.w, s.fw, s.g, s.p, skip=s.fresh)
        ok = ok | s.fresh
        w = jnp.where(ok & ~s.fresh, s.w + t * s.p, s.w)
        fw = self.f(w)
        g, _, A_clip = _curvature(self.model, self.groups, w)
        L = jnp.linalg.cholesky(A_clip)
        good = jnp.all(jnp.isfinite(L))
        # Without a prior the clipped curvature may be singular; fall back to gradient ascent there.
        dim = w.shape[0]
        p = jnp.where(good, jsl.cho_solve((jnp.where(good, L, jnp.eye(dim, dtype=w.dtype)), True), g), g)
        done = (jnp.max(jnp.abs(g)) <= tol) | (good & (g @ p <= tol * tol))
        new = _State(w, fw, g, p, done, ~ok, jnp.asarray(False))
        return new, Step(fw, ok, ok & ~s.fresh, jnp.max(jnp.abs(g)))

    def terminate(self, problem, s, tol):
        return s.done & ~s.fresh, s.failed

    def point(self, s):
        return s.w

    def postprocess(self, problem, s, point):
        return point, None
