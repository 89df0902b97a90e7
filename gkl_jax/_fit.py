"""`fit`: maximise the G-KL bound over (m, C) for a given factor structure (Challis & Barber 2013, eq. 7).

One compiled program per fit: the start, the solver, the change of basis back from whitening, the returned
bound and the impropriety check all run inside `_fit_jit`, so a fit of a new shape compiles once (and no small
op-by-op programs). The solvers are `gkl_jax.solvers` modules; `solvers.default_solver` picks one from what the
model and the factor declare. The returned `log_z` is differentiable in the model by the envelope theorem and the
returned q by the implicit function theorem (`gkl_jax._adjoint`), to every order.
"""

import dataclasses
import warnings
from typing import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.flatten_util import ravel_pytree

from . import _start
from ._adjoint import envelope_bound, flag_nonfinite, frozen, implicit, solver_mask, stop_gradients
from ._bound import bound
from ._gaussian import Gaussian
from ._linalg import full_precision, reduced_matmul_precision, reduced_precision_hint
from ._model import Model, check_fittable, separated
from ._optim import default_tol, stationary
from ._program import program
from ._progress import reraise_callback_error, resolve_progress
from ._result import Result
from ._start import initial_q, model_dtype, start_error
from ._status import RESULTS, status
from ._traps import warn_float32
from ._typing import ScalarLike
from ._validate import check_max_steps, check_tol, debug_check, is_concrete
from ._whiten import check_whiten, whitened_structure, whitening
from .factors import AbstractFactor, AbstractRefinableFactor, Diagonal, Full
from .priors._priors import AbstractDensePrior
from .solvers import AbstractSolver, Optax, Problem, ProgressInfo, default_solver, default_whiten
from .solvers._iterate import append_history, new_history

TRACE_COUNT = {"fit": 0}


def resolve_solver(solver, model, factor, whiten=False, auto=False):
    """The solver object `fit` runs: `solver` checked against the model and factor, or `default_solver`.

    Args:
        solver: None, an `AbstractSolver`, or an `optax.GradientTransformation` (wrapped in `Optax`).
        model: the `Model`.
        factor: the factor (template or initialised).
        whiten: whether the fit runs in the whitened basis (the solver is chosen for that model).
        auto: whether `whiten` was chosen by `default_whiten` (the default solver is then the original model's).

    Returns:
        An `AbstractSolver`.
    """
    work = whitened_structure(model) if whiten else model
    if solver is None:
        return default_solver(model if auto else work, factor)
    if isinstance(solver, optax.GradientTransformation):
        solver = Optax(solver)
    if not isinstance(solver, AbstractSolver):
        hint = ""
        if isinstance(solver, str):
            names = {"fixed-point": "FixedPoint", "site-precision": "SitePrecision", "newton": "Newton",
                     "lbfgs": "LBFGS"}
            hint = f" (e.g. gkl_jax.solvers.{names.get(solver, 'LBFGS')}())"
        raise ValueError("solver must be a gkl_jax.solvers solver or an optax.GradientTransformation, got "
                         f"{solver!r}{hint}")
    solver.check(work, factor)
    return solver


@full_precision
def fit(model: Model, factor: AbstractFactor | None = None, *,
        solver: AbstractSolver | optax.GradientTransformation | None = None, q0: Gaussian | Result | None = None,
        tol: ScalarLike | None = None, max_steps: int | None = None, whiten: bool | None = None,
        progress: bool | str | Callable[[ProgressInfo], object] = False) -> Result:
    """Maximise the G-KL bound of `model` over q = N(m, C^T C) with C structured as `factor`.

    A template whose `mean_field_start(model)` is true (Subspace where N <= D; FactorAnalysis with
    start="heywood" up to D = 4096) starts from a Diagonal fit solved first, inside the same compiled call. With
    `whiten=True` the fit runs in the basis w = mu + L v, L L^T = Sigma (Challis & Barber 2013, App. E), and the
    result is reported in the original basis with a Full factor. Matrix products run at "highest" precision
    unless `jax_default_matmul_precision` is set (GPUs default to TF32).

    Args:
        model: the `Model`.
        factor: a factor template (`gkl_jax.factors.Full()`, ...) or initialised factor; default `q0`'s factor
            type, else `Full()`.
        solver: a `gkl_jax.solvers` solver (e.g. `solvers.LBFGS(memory=20)`) or an `optax.GradientTransformation`;
            None for `solvers.default_solver(model, factor)`.
        q0: a `Gaussian` or `Result` to start from (with `whiten`, an initialised Full factor).
        tol: tolerance of the scale-aware stopping test, overriding the solver's; default 1e-6 for float64 and
            1e-3 for float32. The fit stops where max_i |dB/dx_i| max(|x_i|, sigma0) <= max(tol, 8 eps |B|) over
            the solver's variables x (m and the factor's entries), sigma0 = sqrt(v0) the starting standard
            deviation (`_start.initial_variance`; 1 when whitened): the gradient measured on the variables' own
            scale, so that the test does not change when the inputs are rescaled, and capped below by the
            resolution of B itself, so that float32 fits with many sites can meet it. May be a traced scalar
            inside a transformation (then `converged` is False unless it is positive and finite, and
            `checkify.checkify` reports the failed check); every value shares one compilation.
        max_steps: step limit, overriding the solver's (default: the solver's `default_max_steps`).
        whiten: fit in the whitened basis; None (default) whitens where `solvers.default_whiten` says so (the
            default solver on non-log-concave sites under a GP or dense prior with the Full factor).
        progress: False (default), True (the step, the bound and the stopping statistic on stderr), "auto" (True
            where stderr is a terminal) or a callable receiving a `gkl_jax.solvers.ProgressInfo` after each solver
            step and once at the end; it works under `jax.jit` (`jax.debug.callback`). The compiled program depends
            on it: turning it on (or passing another callable) compiles the fit once more; off compiles no
            callback. A callable that raises stops the fit with its exception.

    Returns:
        A `Result`: q, the bound `log_z` (differentiable in the model to every order), `status` (a `RESULTS`
        code; `message` says it in words), `converged` (status successful; False, with a warning outside of
        tracing, where the tolerance was not met or the target is improper), `num_steps`, `history`.

    Raises:
        ValueError: an invalid argument (naming it), e.g. a `progress` that is not True, False, "auto" or callable.

    Example:
        >>> import numpy as np, gkl_jax as gk
        >>> H = np.array([[1.0, 0.5], [-0.3, 1.0], [0.2, -1.0]])
        >>> model = gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(H, gk.potentials.Logistic([1, -1, 1])))
        >>> result = gk.fit(model)
        >>> bool(result.converged), result.q.mean.shape
        (True, (2,))
    """
    check_fittable(model, "fit")
    callback = resolve_progress(progress, "gkl_jax.fit")
    q0 = q0.q if isinstance(q0, Result) else q0
    if q0 is not None and not isinstance(q0, Gaussian):
        raise ValueError(f"q0 must be a gkl_jax.Gaussian or Result, got {type(q0).__name__}")
    if factor is None:
        factor = q0.factor if q0 is not None else Full()
    if not isinstance(factor, AbstractFactor):
        raise ValueError(f"factor must be a gkl_jax.factors factor, got {type(factor).__name__}")
    auto = whiten is None
    whiten = default_whiten(model, factor, solver) if auto else check_whiten(whiten, model, "fit")
    solver = resolve_solver(solver, model, factor, whiten, auto)
    dtype = model_dtype(model)
    warn_float32(dtype)
    if reduced_matmul_precision(dtype):
        warnings.warn(f"gkl_jax.fit: {reduced_precision_hint()}; the float32 tolerance 1e-3 may be out of reach",
                      stacklevel=3)
    _warn_if_ill_conditioned(model, dtype)
    tol = solver.tol if tol is None else tol
    if tol is None:
        tol = default_tol(dtype)
    elif not isinstance(tol, jax.core.Tracer):
        tol = check_tol(tol)
    else:
        debug_check((tol > 0) & jnp.isfinite(tol), "tol must be positive and finite")
    max_steps = solver.max_steps if max_steps is None else check_max_steps(max_steps)
    max_steps = solver.default_max_steps if max_steps is None else max_steps
    # tol enters the compiled program as an array, so fits at different tolerances share one compilation
    settings = dataclasses.replace(solver, tol=None, max_steps=None)
    try:
        q, log_z, code, num_steps, history, improper, start_logdet = _fit_jit(
            model, factor, q0, settings, jnp.asarray(tol, dtype), max_steps, whiten, callback)
    except jax.errors.JaxRuntimeError as e:     # a progress callable that raised: its own exception
        reraise_callback_error(callback, e)
        raise
    if isinstance(tol, jax.core.Tracer):     # unchecked: a tolerance that is not positive never converges
        code = jnp.where((tol > 0) & jnp.isfinite(tol), code, RESULTS.invalid_argument).astype(code.dtype)
    if is_concrete(start_logdet):
        start_error(start_logdet, "factor" if q0 is None else "q0")
    if is_concrete(code) and int(code) != RESULTS.successful:
        warnings.warn(_not_converged_message(solver, num_steps, tol, log_z, whiten, model, improper, code),
                      stacklevel=3)
    return Result(q=q, log_z=log_z, status=code, num_steps=num_steps, history=history, method="gkl")


def _not_converged_message(solver, num_steps, tol, log_z, whiten, model, improper, code):
    name = type(solver).__name__
    if improper is not None and is_concrete(improper) and bool(improper):
        return ("gkl_jax.fit: the mean separates the labels (it diverges along a direction d with y_n h_n^T d >= 0 "
                "for every binary site, > 0 for some, and any Gaussian sites flat along d): without a prior the "
                "target is improper (log Z = inf), and the fit stopped only where the gradient became small; add a "
                "prior (e.g. gkl_jax.priors.Isotropic)")
    hint = "; try whiten=True (L-BFGS on an ill-conditioned prior)" if (
        name == "LBFGS" and not whiten and model.prior is not None) else ""
    if not is_concrete(log_z):
        valid = "the result is not the optimum"
    elif bool(jnp.isfinite(log_z)):
        valid = "the result is a valid bound but not the optimum"
    else:
        valid = f"the bound there is {float(log_z)} (numerical failure: check the data's scales)"
    steps = int(num_steps) if is_concrete(num_steps) else "?"
    tol = f"{float(tol):g}" if is_concrete(tol) else "tol"
    return (f"gkl_jax.fit: the {name} solver stopped after {steps} steps without meeting its stopping test "
            f"(tol {tol}; {RESULTS.message(code)}); {valid}{hint}")


ILL_CONDITIONED = 1e-2
"""kappa eps above which a narrow float's fit warns (`_warn_if_ill_conditioned`)."""


def _warn_if_ill_conditioned(model, dtype):
    """Warn where the dtype cannot resolve the prior: a float32 GP or dense prior whose covariance has condition
    number kappa with kappa eps > `ILL_CONDITIONED` (kappa estimated from the stored factors as
    ||L||_F^2 ||L^{-1}||_F^2 / n, within a factor n of the 2-norm condition number). The prior's quadratic form
    and the solvers' gradients carry errors of order kappa eps there, so the fit stops at the resolution of its
    dtype, short of the float64 optimum (a GP prior with kappa = 1.4e6: 4e-3 nats) while `converged` is True."""
    prior = model.prior
    if jnp.finfo(dtype).bits >= 64 or not isinstance(prior, AbstractDensePrior):
        return
    if not (is_concrete(prior.chol) and is_concrete(prior.inv_chol)):
        return
    L, L_inv = np.asarray(prior.chol, np.float64), np.asarray(prior.inv_chol, np.float64)
    kappa = float(np.sum(L**2) * np.sum(L_inv**2) / L.shape[0])
    eps = float(jnp.finfo(dtype).eps)
    if not kappa * eps <= ILL_CONDITIONED:
        warnings.warn(f"gkl_jax.fit: the prior covariance has condition number about {kappa:.1e}, too large for "
                      f"{jnp.dtype(dtype).name} (kappa eps = {kappa * eps:.2g}): the bound and the mean are "
                      "resolved only to that relative accuracy and the fit may stop short of the optimum; use "
                      "float64 (jax.config.update('jax_enable_x64', True)) or a larger jitter", stacklevel=4)


@program
def _fit_jit(model, factor, q0, solver, tol, max_steps, whiten, progress=None):
    """The whole fit as one program: start, (mean-field start,) solve, basis change, bound, impropriety."""
    TRACE_COUNT["fit"] += 1
    work, q0, back = whitening(model, q0, whiten, "fit")
    q_init = initial_q(work, factor, q0)
    start_logdet = q_init.factor.logdet()
    scale = jnp.sqrt(_start.initial_variance(work))     # sigma0 of the stopping test
    if _start.applies(work, q_init, q0 is None and not factor.is_initialised):
        q_init = _mean_field_start(work, q_init, solver, tol, scale)
    if isinstance(q_init.factor, AbstractRefinableFactor) and q_init.factor.num_refinements > 0:
        q, k, ok, hist = _refine_and_solve(work, q_init, solver, tol, max_steps, scale, progress)
        code, solution = status(ok, jnp.nanmax(hist), k, max_steps), None
    else:
        solution = _solve(work, q_init, solver, tol, max_steps, scale, progress)
        q, k, hist, code = implicit(work, solution.q), solution.num_steps, solution.history, solution.status
    q = back(q)
    # the solver's own bound at q with its derivatives (`AbstractSolver.log_z`: no second quadrature)
    log_z = envelope_bound(model, q) if solution is None else solver.log_z(model, q, solution)
    log_z = flag_nonfinite(log_z)   # no finite derivative of a non-finite bound
    improper = separated(model, q.mean)
    if improper is not None:
        code = jnp.where(improper, RESULTS.improper_target, code).astype(code.dtype)
    return q, log_z, code, k, hist, improper, start_logdet


class _Solved(eqx.Module):
    q: Gaussian
    num_steps: jax.Array
    history: jax.Array
    status: jax.Array
    extras: object = None
    value: object = None


def _solve(model, q_init, solver, tol, max_steps, scale, progress=None):
    """The solver's optimum over the solver leaves of q_init (without derivatives: `implicit` attaches them)."""
    problem = Problem(frozen(model), stop_gradients(q_init), solver_mask(q_init), scale, progress)
    solution = solver.solve(problem, tol, max_steps)
    return _Solved(problem.to_q(solution.x), solution.num_steps, solution.history, solution.status,
                   solution.extras, solution.value)


def _mean_field_start(model, q_init, solver, tol, scale):
    """The template's start from the mean-field fit (`gkl_jax._start`)."""
    work = frozen(model)
    diagonal = initial_q(work, Diagonal(), None)
    diagonal_solver = default_solver(work, diagonal.factor)
    mean_field = _solve(work, diagonal, diagonal_solver, tol, diagonal_solver.default_max_steps, scale).q
    return _start.mean_field_start(work, stop_gradients(q_init), mean_field)


def _refine_and_solve(model, q_init, solver, tol, max_steps, scale, progress=None):
    """For an `AbstractRefinableFactor` (the subspace basis, Challis & Barber 2013, App. B.4): q <- refine(q),
    then solve over the solver leaves, `num_refinements` times in a `lax.fori_loop`, keeping the q with the best
    bound (the basis update is not guaranteed to increase it).

    The rounds before the last only choose the next basis, so they stop at the looser tolerance sqrt(tol) (for
    tol < 1); the last round solves to `tol`. `converged` is the stopping test on the returned q itself, over
    the solver leaves."""
    rounds = q_init.factor.num_refinements
    work = frozen(model)
    loose = jnp.maximum(tol, jnp.sqrt(tol))

    def round_(i, carry):
        q, k, hist, best = carry
        factor = lax.stop_gradient(q.factor.refine(work, lax.stop_gradient(q), best))
        solved = _solve(work, eqx.tree_at(lambda g: g.factor, q, factor), solver,
                        jnp.where(i == rounds - 1, tol, loose), max_steps, scale, progress)
        value = bound(work, lax.stop_gradient(solved.q))
        better = jnp.isfinite(value) & (value >= best)
        q = jax.tree.map(lambda a, b: jnp.where(better, a, b), solved.q, q)
        return q, k + solved.num_steps, append_history(hist, solved.history, k), jnp.where(better, value, best)

    f0 = bound(work, lax.stop_gradient(q_init))
    hist0 = new_history(max_steps, f0)
    # best: the bound at the carried q (-inf where not finite), which the next refinement compares against
    init = (q_init, jnp.zeros((), jnp.int32), hist0, jnp.where(jnp.isfinite(f0), f0, -jnp.inf))
    q, k, hist, best = lax.fori_loop(0, rounds, round_, init)
    params, static = eqx.partition(lax.stop_gradient(q), solver_mask(q))
    grad = jax.grad(lambda p: bound(work, eqx.combine(p, static)))(params)
    ok = jnp.isfinite(best) & stationary(ravel_pytree(grad)[0], ravel_pytree(params)[0], best, tol, scale)
    return implicit(model, q), k, ok, hist

