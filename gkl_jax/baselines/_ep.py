"""`ep`: Gaussian expectation propagation with site-projection potentials, and power (fractional) EP
(Challis & Barber 2013, Section 5.2.3; thesis Ch. 2.5.10, 4.4 and 5.3.2; Minka 2001, 2004).

Each site n gets a Gaussian site t_n(x) = Z_n exp(-tau_n x^2 / 2 + nu_n x) in x = h_n^T w + o_n, giving
q(w) = N(A^{-1} b, A^{-1}) (`_common`). One EP update of site n with power eta in (0, 1] (eta = 1: EP):

    cavity   tau_c = 1 / v_n - eta tau_n,   nu_c = m_n / v_n - eta nu_n          (q_n(x) = N(m_n, v_n))
    tilted   p_hat(x) ~ N(x | nu_c / tau_c, 1 / tau_c) phi_n(x)^eta  ->  (Z_hat, m_hat, v_hat)   (`_tilted`)
    site     tau_n <- (1 / v_hat - tau_c) / eta,   nu_n <- (m_hat / v_hat - nu_c) / eta

(thesis Ch. 5.3.2: the fractional tilted distribution q_{-n} t_n^{1-eta} phi_n^eta; eta = 0.9 in its
experiments). The EP estimate of log Z is the Gaussian integral of the prior times the sites (thesis eq. 2.23 /
4.16) with site normalisers chosen so that int q_{-n} t_n^eta = int q_{-n} phi_n^eta (Minka 2004):

    log Z_EP = log int N(w | mu, Sigma) prod_n exp(-tau_n x_n^2 / 2 + nu_n x_n) dw
               + sum_n (1/eta) [log Z_hat_n - (m_n^2 / v_n - tau_c mu_c^2) / 2 - log(v_n tau_c) / 2].

Schedule: parallel updates -- all sites are updated at once from the same q, and the new site parameters are
damped, theta <- theta + damping (theta_target - theta) -- rather than the classic sequential sweep. Each
iteration then costs one dense Cholesky and one O(N D^2) marginal computation (`lax.while_loop`, no Python
loop over sites), against N rank-one updates per sequential sweep; damping restores the stability that
sequential updates have for log-concave sites. Parallel updates can still settle into a period-2 oscillation
(seen on GP classification with large signal variances): when successive update directions theta_target - theta
point against each other (cosine < -1/2) for `_FLIPS` iterations in a row, the damping is halved (at most
`_MAX_DAMPING_HALVINGS` times); `converged` still requires the residual test. Safeguards: a site whose cavity
precision is <= 0 or whose tilted moments are not finite is skipped in that iteration; if the damped update
makes A indefinite, the step is halved (up to 20 times). `converged` is True only when
max |theta_target - theta| / (1 + |theta|) <= tol with no skipped site and a finite log Z_EP; otherwise a
warning is issued. Not a bound (`is_bound=False`).
"""

from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import potentials as P
from .._adjoint import envelope_value
from .._linalg import full_precision
from .._model import Model
from .._optim import backtrack
from .._program import program
from .._result import Result
from .._status import RESULTS
from .._validate import check_max_steps, check_tol
from ..solvers._iterate import Step, iterate
from . import _common as C
from ._tilted import tilted_moments

TRACE_COUNT = {"ep": 0}
_FLIPS = 3                   # consecutive reversals of the update direction before the damping is halved
_MAX_DAMPING_HALVINGS = 8


@full_precision
def ep(model: Model, power: float = 1.0, damping: float = 0.5, *, tol: float | None = None,
       max_steps: int = 500) -> Result:
    """Gaussian EP (power EP for power < 1) with damped parallel updates (Minka 2001, 2004; Nickisch 2010,
    Ch. 2.5.10 and 4.4; Challis & Barber 2013, Section 5.2.3; module docstring). Warns when it did not converge.

    Args:
        model: a `gkl_jax.Model` (sites without `variance_offset`).
        power: the EP power eta in (0, 1] (default 1, plain EP).
        damping: the initial damping in (0, 1], halved when the updates oscillate (default 0.5).
        tol: the site-parameter change that stops the iterations (default for the model's dtype).
        max_steps: iterations (int >= 1, default 500).

    Returns:
        `gkl_jax.Result` with q = N(A^{-1} b, A^{-1}), the EP evidence estimate `log_z` (`is_bound=False`;
        reverse-mode differentiable in the model) and `history` the estimate at each iteration.

    Raises:
        ValueError: power or damping outside (0, 1], a model that cannot be fitted, or a bad tol or max_steps.

    Example:
        >>> import numpy as np, gkl_jax as gk
        >>> H = np.array([[1.0, 0.5], [-0.3, 1.0], [0.2, -1.0]])
        >>> model = gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(H, gk.potentials.Logistic([1, -1, 1])))
        >>> approx = gk.ep(model)
        >>> approx.is_bound, bool(approx.converged), round(float(approx.log_z), 3)
        (False, True, -1.985)
    """
    C.check_model(model, "ep")
    if not model.sites:
        return C.prior_only_result(model, "ep", is_bound=False)
    power = C.check_fraction(power, "power", "ep")
    damping = C.check_fraction(damping, "damping", "ep")
    max_steps = check_max_steps(max_steps, "ep: max_steps")
    dtype = C.dtype_of(model)
    tol = C.default_tol(dtype) if tol is None else check_tol(tol, "ep: tol")
    # tol and damping enter as arrays: changing them does not recompile
    result = _ep_jit(model, power, jnp.asarray(damping, dtype), jnp.asarray(tol, dtype), max_steps)
    C.warn_if_not_converged(result.converged, "ep", f"EP did not converge within max_steps={max_steps} (site "
                            f"parameter change > tol={tol:g}, skipped sites with non-positive cavity precision, "
                            "or an indefinite posterior precision); try a smaller damping or power")
    return result


class _Evaluation(NamedTuple):
    sol: C.GaussianSites
    targets: list       # [(tau_target, nu_target)] per group
    valid: list         # [sites whose update is well defined] per group
    log_z: jax.Array


def _evaluate(model, groups, taus, nus, power):
    sol = C.gaussian_sites(model, groups, taus, nus)
    targets, valids = [], []
    log_z = sol.log_integral
    for (_, _, pot), tau, nu, m, v in zip(groups, taus, nus, sol.site_means, sol.site_vars):
        # h_n = 0 (a zero row of H, as design.sequential's padding): x_n = o_n is not random, the site is the
        # constant phi_n(o_n), which log Z gains in full; its Gaussian site is never updated (it does not act on q)
        fixed = v == 0
        v = jnp.where(fixed, 1.0, v)
        tau_c = 1 / v - power * tau
        nu_c = m / v - power * nu
        valid = (tau_c > 0) & jnp.isfinite(tau_c) & jnp.isfinite(nu_c)
        tau_c_safe = jnp.where(valid, tau_c, 1.0)
        v_c = 1 / tau_c_safe
        mu_c = jnp.where(valid, nu_c, 0.0) * v_c
        log_zh, m_hat, v_hat = tilted_moments(pot, mu_c, v_c, power)
        valid = valid & jnp.isfinite(log_zh) & jnp.isfinite(m_hat) & (v_hat > 0)
        v_hat_safe = jnp.where(valid, v_hat, 1.0)
        tau_t = (1 / v_hat_safe - tau_c_safe) / power
        nu_t = (m_hat / v_hat_safe - nu_c) / power
        update = valid & ~fixed
        targets.append((jnp.where(update, tau_t, tau), jnp.where(update, nu_t, nu)))
        valids.append(update | fixed)
        site_log_z = (log_zh - 0.5 * (m**2 / v - tau_c * mu_c**2) - 0.5 * jnp.log(v * tau_c_safe)) / power
        # the Gaussian integral holds exp(nu_n o_n - tau_n o_n^2 / 2) for this site: replace it by phi_n(o_n)
        site_log_z = jnp.where(fixed, pot.log_phi(m) - (nu * m - 0.5 * tau * m**2), site_log_z)
        valid = valid | fixed
        log_z = log_z + jnp.sum(jnp.where(valid, site_log_z, jnp.nan))
    return _Evaluation(sol, targets, valids, log_z)


def _direction(ev, taus, nus):
    """The relative update (theta_target - theta) / (1 + |theta|) of all sites as one vector; its max |.| is the
    convergence residual."""
    parts = []
    for (tau_t, nu_t), tau, nu in zip(ev.targets, taus, nus):
        parts += [(tau_t - tau) / (1 + jnp.abs(tau)), (nu_t - nu) / (1 + jnp.abs(nu))]
    return jnp.concatenate(parts)


def _all_valid(ev):
    return jnp.all(jnp.asarray([jnp.all(v) for v in ev.valid]))


def initial_sites(model, groups, dtype):
    """Gaussian-potential sites start (and stay) at their exact values; the others at tau = 0 (q = prior), or
    tau = 1 without a prior, so that the first q is proper."""
    taus, nus = [], []
    for op, _, pot in groups:
        n = op.shape[0]
        if isinstance(pot, P.Gaussian):
            taus.append(jnp.broadcast_to(1 / pot.variance, (n,)).astype(dtype))
            nus.append(jnp.broadcast_to(pot.y / pot.variance, (n,)).astype(dtype))
        else:
            taus.append(jnp.full((n,), 0.0 if model.prior is not None else 1.0, dtype))
            nus.append(jnp.zeros((n,), dtype))
    return taus, nus


def _precision_ok(model, groups, taus):
    """Whether A = Sigma^{-1} + sum_n tau_n h_n h_n^T is positive definite (a Cholesky only)."""
    dtype = jnp.result_type(*taus) if taus else C.dtype_of(model)
    A = jnp.zeros((model.dim, model.dim), dtype) if model.prior is None else model.prior.precision_dense()
    for (op, _, _), tau in zip(groups, taus):
        A = A + op.weighted_gram(tau)
    return jnp.all(jnp.isfinite(jnp.linalg.cholesky(0.5 * (A + A.T))))


@program
def _ep_jit(model, power, damping, tol, max_steps):
    """One loop (`gkl_jax.solvers.iterate` over `_Loop`): iteration k > 0 moves the sites from theta_{k-1} to
    theta_k, and each evaluates theta_k (marginals, cavities, tilted moments, log Z_EP -> history[k]), to the
    residual test, max_steps moves or a breakdown."""
    TRACE_COUNT["ep"] += 1
    groups = C.operators(model)
    dtype = C.dtype_of(model)
    taus0, nus0 = initial_sites(model, groups, dtype)
    evaluate = lambda taus, nus: _evaluate(model, groups, taus, nus, power)
    ev_shape = jax.eval_shape(evaluate, taus0, nus0)
    ev_dummy = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), ev_shape)

    loop = _Loop(model, groups, evaluate, damping)
    zero_dir = jnp.zeros_like(_direction(ev_dummy, taus0, nus0))
    false = jnp.asarray(False)
    start = _State(taus0, nus0, ev_dummy, zero_dir, zero_dir, jnp.asarray(damping, dtype), jnp.asarray(0), false,
                   jnp.asarray(True), false, jnp.asarray(True))
    solution, state = iterate(loop, None, tol, max_steps, init=(start, ev_dummy.log_z))
    taus, nus, ev, hist = state.taus, state.nus, state.ev, solution.history
    # not successful: a failed linear algebra or no damped update that kept A positive definite is a breakdown
    code = jnp.where((solution.status != RESULTS.successful) & (~state.ok | state.failed), RESULTS.breakdown,
                     solution.status).astype(jnp.int32)
    q = C.gaussian_of_precision(ev.sol.mean, ev.sol.precision)
    # log Z_EP is stationary in the site parameters at an EP fixed point (Minka 2001; Seeger 2005), so its first
    # derivative in the model is the partial derivative at the fixed sites: evaluated outside the loop (in this
    # program: under jax.grad without jit it is not run op by op), which makes jax.grad (reverse mode) of log_z
    # work; the loop's outputs q stay forward-differentiable only.
    log_z = envelope_value(ev.log_z, model, (taus, nus), lambda m, s: _evaluate(m, C.operators(m), *s, power).log_z)
    return Result(q=q, log_z=log_z, status=code, num_steps=solution.num_steps, history=hist, method="ep",
                  is_bound=False)


class _State(eqx.Module):
    """EP's carry: the site parameters, their evaluation, the update direction and the damping's adaptation."""

    taus: list
    nus: list
    ev: object          # `_evaluate` at (taus, nus)
    direction: jax.Array
    prev: jax.Array     # the previous direction
    damp: jax.Array
    flips: jax.Array
    done: jax.Array     # the residual test at (taus, nus)
    ok: jax.Array       # the evaluation's linear algebra succeeded
    failed: jax.Array   # no damped update kept A positive definite
    fresh: jax.Array    # (taus, nus) not yet evaluated (the first iteration evaluates the start)


class _Loop(eqx.Module):
    """EP as a `gkl_jax.solvers.iterate` loop: an iteration moves the sites by the damped update (halved while A is
    not positive definite; the damping halved after `_FLIPS` reversals of the direction) and evaluates them (the
    first evaluates the start), so history[k] = log Z_EP at theta_k and num_steps counts the moves."""

    model: object
    groups: list
    evaluate: object = eqx.field(static=True)
    damping: jax.Array
    monotone = True
    start_in_loop = True
    stop_on_nonfinite = False   # skipped sites may leave log Z_EP infinite for a while; the update goes on

    def step(self, problem, s, tol):
        prev, direction = s.prev, s.direction
        cosine = direction @ prev / jnp.maximum(jnp.linalg.norm(direction) * jnp.linalg.norm(prev), 1e-300)
        flips = jnp.where(cosine < -0.5, s.flips + 1, 0)
        halve_damping = (flips >= _FLIPS) & (s.damp > self.damping * 0.5**_MAX_DAMPING_HALVINGS)
        damp = jnp.where(halve_damping, 0.5 * s.damp, s.damp)
        flips = jnp.where(halve_damping, 0, flips)

        def candidate(t):
            new_t = [tau + t * damp * (tt - tau) for tau, (tt, _) in zip(s.taus, s.ev.targets)]
            new_n = [nu + t * damp * (nt - nu) for nu, (_, nt) in zip(s.nus, s.ev.targets)]
            return new_t, new_n

        t, _, pd = backtrack(lambda t: _precision_ok(self.model, self.groups, candidate(t)[0]), lambda t, pd: pd,
                             jnp.asarray(False), dtype=damp.dtype, max_halvings=20, skip=s.fresh)
        move = pd & ~s.fresh
        new_t, new_n = candidate(t)
        taus = [jnp.where(move, a, b) for a, b in zip(new_t, s.taus)]
        nus = [jnp.where(move, a, b) for a, b in zip(new_n, s.nus)]
        ev = self.evaluate(taus, nus)
        new_direction = _direction(ev, taus, nus)
        done = (jnp.max(jnp.abs(new_direction), initial=0.0) <= tol) & _all_valid(ev)
        evaluated = move | s.fresh
        new = _State(taus, nus, ev, new_direction, jnp.where(s.fresh, s.prev, direction), jnp.where(s.fresh, s.damp,
                     damp), jnp.where(s.fresh, s.flips, flips), done, ev.sol.ok, ~evaluated, jnp.asarray(False))
        return new, Step(ev.log_z, evaluated, move, jnp.max(jnp.abs(new_direction), initial=0.0))

    def terminate(self, problem, s, tol):
        return s.done & s.ok & ~s.fresh & jnp.isfinite(s.ev.log_z), ~s.ok | s.failed

    def point(self, s):
        return None

    def postprocess(self, problem, s, point):
        return point, None
