"""`fit`: maximise the G-KL bound over (m, C) for a given factor structure.

Solvers
- "fixed-point" (default for the `Full` factor on log-concave models; also for `Diagonal`): alternates the
  closed-form factor of eq. 10, S^{-1} = Sigma^{-1} + H^T Gamma H, Gamma_nn = -E[psi_n''] (papers/000 eq. 10 with
  the sign erratum of the notes; a backtracking step that never lets the bound decrease), with a preconditioned
  Newton-CG maximisation over m at the fixed factor, O(N D) per iteration (gkl_jax._fixed_point).
- "site-precision" (default for the `Full` factor under a GP/Dense prior when every site has h_n = e_n): the same
  alternation on the n site precisions W of S = (Sigma^{-1} + diag W)^{-1}, one Cholesky factorisation of
  I + W^{1/2} Sigma W^{1/2} per step and C formed once at the end (gkl_jax._site_precision).
- "newton" (default for the other concave factors on log-concave models): truncated Newton-CG with Hessian-vector
  products and a backtracking line search; the bound is concave in (m, C) (Section 3.2). Also the default for
  non-log-concave sites under a GP or Dense prior (robust GP regression): CG stops at negative curvature
  (Steihaug), so every step is still an ascent step, and Newton is unaffected by the conditioning of Sigma, on
  which L-BFGS in (m, C) stalls (notebook 04, Student-t ML-II: 925 L-BFGS steps in the last inner fit against
  18 Newton steps, 4.7 s against 0.86 s).
- "lbfgs" (default for non-concave factors and for non-log-concave sites under the other priors, the paper's
  choice), or any `optax.GradientTransformation`.

Every solver stops at max |dB/d(m, C)| <= tol. The returned `log_z` is differentiable in the model by the
envelope theorem (App. F.2) and the returned mean and factor by the implicit function theorem (the
Hessian solve uses conjugate gradients with Hessian-vector products). Both hold to every order: the envelope
rule (`envelope_bound`; for the site-precision solver its closed form, `_site_precision_envelope`) is evaluated
at the implicit q, and the implicit rule returns the optimum itself, so jax.hessian or grad of grad of `log_z`
and of q add the dq*/dtheta terms (tests/test_fit.py: the exact log Z of a Gaussian model, central differences
for logistic GLM and GP fits). A first derivative still costs no solve for dq*/dtheta.
"""

import functools
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.flatten_util import ravel_pytree

from . import _solvers, _start
from ._fixed_point import _to_flat, fixed_point as _fixed_point
from ._site_precision import applies as _site_precision_applies, has_dense_prior as _has_dense_prior
from ._site_precision import log_z as _site_precision_log_z_eager, optimum_parts as _site_precision_optimum_parts
from ._site_precision import initial_point as _site_precision_start, posterior as _site_precision_posterior
from ._site_precision import point as _site_precision_point
from ._site_precision import site_precision as _site_precision
from ._bound import bound
from ._gaussian import Gaussian
from ._linalg import full_precision, reduced_matmul_precision, reduced_precision_hint
from ._model import Model, Sites, check_fittable, separated
from ._result import Result
from ._validate import check_int, check_max_steps, check_tol, is_concrete
from .factors import AbstractFactor, AbstractFixedPointFactor, AbstractRefinableFactor, Diagonal, Full
from .factors._full import upper_factor
from .operators import AbstractOperator, Dense as DenseOperator
from .priors import Isotropic

SOLVERS = ("fixed-point", "site-precision", "newton", "lbfgs")
_MAX_STEPS = {"fixed-point": 500, "site-precision": 500, "newton": 200, "lbfgs": 2000, "optax": 5000}
TRACE_COUNT = {"fit": 0}


def _filtered_jvp(fn, args, t_args):
    """jax.jvp of fn(*args) in the inexact arrays of `args`, from tangents as `eqx.filter_custom_jvp` passes them
    (None for a symbolic zero, at a leaf or for a whole argument)."""
    dynamic, static = eqx.partition(args, eqx.is_inexact_array)
    t_args = tuple(jax.tree.map(lambda _: None, d) if t is None else eqx.filter(t, eqx.is_inexact_array)
                   for d, t in zip(dynamic, t_args))
    t_dynamic = jax.tree.map(lambda x, t: x if x is None else (jnp.zeros_like(x) if t is None else t), dynamic,
                             t_args, is_leaf=lambda x: x is None)
    return jax.jvp(lambda d: fn(*eqx.combine(d, static)), (dynamic,), (t_dynamic,))


@eqx.filter_custom_jvp
def envelope_bound(model, q):
    """B(model, q) at an optimum q = q*(model) of the solver leaves (App. F.2): the value at the gradient-stopped
    q, and the derivative dB/dtheta at fixed q (the envelope theorem: dB/dq = 0 there), which needs no solve for
    dq*/dtheta. q enters the derivative rule as given, with the implicit derivative `fit` attaches to it: a second
    differentiation (jax.hessian, grad of grad) of the rule adds d^2B/dtheta dq . dq*/dtheta, so second
    derivatives of the optimal bound are exact too (tests/test_fit.py)."""
    return bound(model, lax.stop_gradient(q))


@envelope_bound.def_jvp
def _envelope_bound_jvp(primals, tangents):
    model, q = primals
    return _filtered_jvp(lambda model: bound(model, q), (model,), tangents[:1])


@eqx.filter_custom_jvp
def _solver_value(value, model, q, *, recompute):
    """`value`, which the solver computed at its optimum q = q*(model), with the derivative of
    recompute(model, q): the solver's value where nothing differentiates it, the total derivative through the
    implicit q where something does (`_site_precision_envelope`)."""
    return value


@_solver_value.def_jvp
def _solver_value_jvp(primals, tangents, *, recompute):
    value, model, q = primals
    out = _solver_value(value, model, q, recompute=recompute)     # itself, so that higher orders see it too
    return out, _filtered_jvp(recompute, (model, q), tangents[1:])[1]


@eqx.filter_jit
def _site_precision_envelope(model, q, W, parts):
    """`_site_precision.log_z` at the solver's (m, W, parts), which are taken as functions of the implicit q
    (`_solver_value`): first derivatives are the closed form's, second ones are exact (the envelope rule
    differentiated through dq*/dtheta)."""
    W, parts = _solver_value((W, parts), model, q, recompute=_site_precision_optimum_parts)
    return _site_precision_log_z_eager(model, q.mean, W, parts)


# One compiled evaluation of the bound for the returned log_z (op-by-op dispatch of the quadrature would
# compile every primitive separately on first use); still differentiable in the model (envelope theorem).
_envelope_bound_jit = eqx.filter_jit(envelope_bound)


def stop_gradients(tree):
    """`tree` with every inexact array behind `lax.stop_gradient`: the solvers iterate on such copies, and the
    derivatives of their results come from the envelope and implicit-function rules, never from the loops."""
    return jax.tree.map(lambda x: lax.stop_gradient(x) if eqx.is_inexact_array(x) else x, tree)


def _frozen(model):
    """The gradient-free copy of `model` the solvers iterate on (`stop_gradients`), with H o H stored
    (`AbstractOperator.with_squares`): for a dense H, one more N x D array while the fit runs."""
    is_op = lambda x: isinstance(x, AbstractOperator)
    return jax.tree.map(lambda x: x.with_squares() if is_op(x) else x, stop_gradients(model), is_leaf=is_op)


def default_tol(dtype) -> float:
    return 1e-6 if jnp.finfo(dtype).bits >= 64 else 1e-3


@full_precision
def fit(model: Model, factor: AbstractFactor | None = None, *, solver=None, q0: Gaussian | None = None,
        tol: float | None = None, max_steps: int | None = None, whiten: bool = False,
        max_cg: int = 100) -> Result:
    """Maximise the G-KL bound of `model` over q = N(m, C^T C) with C structured as `factor` (default Full()).

    `q0` warm-starts the fit (its factor type is used when `factor` is None). A template whose
    `mean_field_start(model)` is true (Subspace where N <= D; FactorAnalysis with start="heywood" up to D = 4096)
    starts from a Diagonal fit solved first, inside the same compiled call (`gkl_jax._start`). With `whiten=True`
    the fit runs in the basis w = mu + L v, L L^T = Sigma (App. E), and the result is reported in the original
    basis with a full factor (a `q0` is taken to that basis; it needs a Full factor). Whitening is what makes
    L-BFGS converge on ill-conditioned GP priors (with non-log-concave sites `fit` runs Newton-CG there unless
    told otherwise). `tol` (default 1e-6, float32: 1e-3) may be a traced scalar inside a transformation (then it
    is not checked for positivity); every value shares one compilation. Returns a `Result`; `converged` is False
    (and a warning is issued outside of tracing) when the gradient tolerance was not reached. Matrix products run
    at "highest" precision unless `jax_default_matmul_precision` is set (`_linalg.full_precision`: GPUs default
    to TF32).
    """
    check_fittable(model, "fit")
    q0 = q0.q if isinstance(q0, Result) else q0
    if q0 is not None and not isinstance(q0, Gaussian):
        raise ValueError(f"q0 must be a gkl_jax.Gaussian or Result, got {type(q0).__name__}")
    if factor is None:
        factor = q0.factor if q0 is not None else Full()
    if not isinstance(factor, AbstractFactor):
        raise ValueError(f"factor must be a gkl_jax.factors factor, got {type(factor).__name__}")
    work_model, q0, back = whitening(model, q0, whiten, "fit")
    q_init = _initial_q(work_model, factor, q0)
    start = _start.applies(work_model, q_init, q0 is None and not factor.is_initialised)
    name = _solver_name(solver, work_model, q_init.factor)
    dtype = q_init.mean.dtype
    if reduced_matmul_precision(dtype):
        warnings.warn(f"gkl_jax.fit: {reduced_precision_hint()}; the float32 tolerance 1e-3 may be out of reach",
                      stacklevel=3)
    if tol is None:
        tol = default_tol(dtype)
    elif not isinstance(tol, jax.core.Tracer):
        tol = check_tol(tol)
    max_steps = _MAX_STEPS[name] if max_steps is None else check_max_steps(max_steps)
    max_cg = check_int(max_cg, "max_cg", 1)
    optimizer = solver if name == "optax" else None
    # tol enters the compiled solver as an array, so fits at different tolerances share one compilation.
    q, num_steps, converged, history, sp = _fit_jit(work_model, q_init, name, optimizer, jnp.asarray(tol, dtype),
                                                   max_steps, max_cg, start)
    q = back(q)
    if sp is None:
        log_z = _envelope_bound_jit(model, q)
    else:   # the same bound from the site precisions, with the closed-form covariance derivative
        log_z = _site_precision_envelope(model, q, sp[0], sp[1:])
    improper = separated(model, q.mean)
    if improper is not None:
        converged = converged & ~improper
    if is_concrete(converged) and not bool(converged):
        warnings.warn(_not_converged_message(name, num_steps, tol, log_z, whiten, model, improper), stacklevel=3)
    return Result(q=q, log_z=log_z, converged=converged, num_steps=num_steps, history=history, method="gkl")


def _not_converged_message(name, num_steps, tol, log_z, whiten, model, improper):
    if improper is not None and bool(improper):
        return ("gkl_jax.fit: the mean separates the labels (y_n h_n^T m > 0 for every site): without a prior the "
                "target is improper (log Z = inf), and the fit stopped only where the gradient became small; add a "
                "prior (e.g. gkl_jax.priors.Isotropic)")
    hint = "; try whiten=True (L-BFGS on an ill-conditioned prior)" if (
        name == "lbfgs" and not whiten and model.prior is not None) else ""
    valid = ("the result is a valid bound but not the optimum" if bool(jnp.isfinite(log_z)) else
             f"the bound there is {float(log_z)} (numerical failure: check the data's scales)")
    return (f"gkl_jax.fit: the {name} solver stopped after {int(num_steps)} steps without reaching "
            f"max|grad| <= {float(tol):g}; {valid}{hint}")


class WarmPoint(eqx.Module):
    """Where the next `fit_warm` starts: the mean m and site precisions W of an earlier optimum (for the next
    ML-II step, a model with another prior). Starting from a Gaussian q0 instead costs one more quadrature, for
    W = Gamma at q0's marginals, which at an optimum is W again. (Tried and dropped: the representer start
    m = mu' + Sigma' alpha, alpha = Sigma^{-1} (m - mu) of the old optimum, which needs no solve with the new
    Sigma'. On sonar's ML-II its first residual was larger, 0.24-0.73 against 0.33-0.56; with the solver carrying
    alpha (11-25 night) it took fewer outer evaluations but up to 3x the inner steps: 10-split median 32 ms
    against 25.)"""

    mean: jax.Array
    site_precisions: jax.Array


class WarmStart(eqx.Module):
    """What one ML-II evaluation by `fit_warm` returns: `q` = N(m, diag S), the optimum's mean and marginal
    variances (a Full factor with diagonal C); the site precisions W of S = (Sigma^{-1} + diag W)^{-1}; and
    `log_z`, `converged`, `num_steps`, `history` of the fit; `gap`, to second order how far `log_z` lies below the
    optimum (`_site_precision.gap`; ML-II reads it as the resolution of its objective). `point` is where the next
    evaluation starts; `warm_result` turns it into the `Result` that `fit` returns."""

    q: Gaussian
    site_precisions: jax.Array
    log_z: jax.Array
    converged: jax.Array
    num_steps: jax.Array
    history: jax.Array
    gap: jax.Array

    @property
    def point(self) -> WarmPoint:
        return WarmPoint(self.q.mean, self.site_precisions)


def warm_fit_applies(model) -> bool:
    """Whether `fit(model)` with its defaults runs the site-precision solver, so that `fit_warm` can stand in
    for it inside ML-II."""
    return _solver_name(None, model, Full()) == "site-precision"


def fit_warm(model: Model, *, q0: Gaussian | WarmPoint | None = None, tol=None) -> WarmStart:
    """`fit(model, q0=q0, tol=tol)` by the site-precision solver without forming the Full factor C: the inner fit
    of ML-II (`gp.fit_hyperparameters`), where each outer step needs log Z, its gradient and a warm start, and C
    is needed only once, at the end (`warm_result`). C costs 3.3 n^3 flops, a fifth of a warm ML-II evaluation at
    n = 350. `log_z` is the same bound as `fit`'s, with the same closed-form derivative in the model. `q0` may be
    a Gaussian (as for `fit`) or the `WarmPoint` of an earlier fit_warm (`WarmStart.point`)."""
    frozen = _frozen(model)
    if isinstance(q0, WarmPoint):
        start = _site_precision_point(frozen, *stop_gradients((q0.mean, q0.site_precisions)))
    else:
        start = _site_precision_start(frozen, stop_gradients(_initial_q(model, Full(), q0)))
    dtype = start[0].dtype
    tol = jnp.asarray(default_tol(dtype) if tol is None else tol, dtype)
    m, k, ok, hist, (W, *parts), gap = _site_precision_jit(frozen, start, tol, _MAX_STEPS["site-precision"])
    log_z = _site_precision_log_z_eager(model, lax.stop_gradient(m), W, parts)
    return WarmStart(Gaussian(m, Full(jnp.diag(jnp.sqrt(parts[1])))), W, log_z, ok, k, hist, gap)


# Run eagerly (ML-II with jit=False), the solver's while loop closed over the model's arrays as constants of its
# jaxpr, so every evaluation compiled it again (1.4 s for n = 20); jitted on its own, it compiles once per shape.
_site_precision_jit = eqx.filter_jit(_site_precision)


def warm_result(model: Model, warm: WarmStart) -> Result:
    """The `Result` of the fit that `warm` summarises: q = N(m, (Sigma^{-1} + diag W)^{-1}) with its Full factor."""
    q = _site_precision_posterior(model.prior, warm.q, warm.q.mean, warm.site_precisions)
    return Result(q=q, log_z=warm.log_z, converged=warm.converged, num_steps=warm.num_steps, history=warm.history,
                  method="gkl")


def _solver_name(solver, model, factor):
    if solver is None:
        if not model.log_concave:
            return "newton" if _has_dense_prior(model) and factor.concave else "lbfgs"
        if isinstance(factor, Full) and _site_precision_applies(model):
            return "site-precision"
        return factor.default_solver
    if isinstance(solver, optax.GradientTransformation):
        return "optax"
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS} or an optax.GradientTransformation, got {solver!r}")
    if solver == "fixed-point":
        if not isinstance(factor, AbstractFixedPointFactor):
            raise ValueError(f"solver='fixed-point' needs a Full or Diagonal factor, got {type(factor).__name__}")
        if not model.log_concave:
            raise ValueError("solver='fixed-point' needs log-concave potentials (Gamma_nn >= 0)")
    if solver == "site-precision":
        if not isinstance(factor, Full):
            raise ValueError(f"solver='site-precision' needs a Full factor, got {type(factor).__name__}")
        if not model.log_concave:
            raise ValueError("solver='site-precision' needs log-concave potentials (Gamma_nn >= 0)")
        if not _site_precision_applies(model):
            raise ValueError("solver='site-precision' needs a GP or Dense prior and sites with H = None (h_n = e_n)")
    return solver


def _initial_q(model, factor, q0):
    if q0 is not None:
        if not isinstance(q0, Gaussian):
            raise ValueError(f"q0 must be a gkl_jax.Gaussian, got {type(q0).__name__}")
        if q0.dim != model.dim:
            raise ValueError(f"q0 has dimension {q0.dim} but the model has {model.dim}")
        if type(q0.factor) is not type(factor):
            raise ValueError(f"q0 has a {type(q0.factor).__name__} factor but factor={type(factor).__name__}")
        dtype = model_dtype(model)    # a warm start in another precision is cast to the model's
        return check_start(jax.tree.map(lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, q0), "q0")
    if factor.is_initialised:
        if factor.dim != model.dim:
            raise ValueError(f"factor has dimension {factor.dim} but the model has {model.dim}")
        start = factor
    else:
        start = factor.initialise(model.dim, initial_variance(model))
    mean = model.prior.mean if model.prior is not None else jnp.zeros(model.dim, model_dtype(model))
    return check_start(Gaussian(mean, start), "factor")


def check_start(q, name):
    """q, refused (ValueError naming `name`) where its covariance is singular or not finite: the bound there is
    -inf or NaN and no solver can move from it."""
    logdet = q.factor.logdet()
    if is_concrete(logdet) and not bool(jnp.isfinite(logdet)):
        raise ValueError(f"{name} gives a singular or non-finite starting covariance (log det S = {float(logdet)}); "
                         "every diagonal entry of its factor must be non-zero and finite")
    return q


def model_dtype(model):
    """The floating dtype of the model's data (the prior mean's, else the sites' arrays'), so that the starting
    q of a float32 model stays float32 when x64 is enabled."""
    if model.prior is not None:
        return model.prior.mean.dtype
    leaves = [x for x in jax.tree.leaves(model.sites) if eqx.is_inexact_array(x)]
    return jnp.result_type(*leaves) if leaves else jnp.result_type(float)


def initial_variance(model):
    """Isotropic starting variance v0 = min(prior variances, 1 / max_n ||h_n||^2), so that every starting s_n is
    at most ~1: the scale on which the quadrature is accurate, and roughly where the posterior shrinks to."""
    dtype = model_dtype(model)
    ones = jnp.ones(model.dim, dtype)
    variances = model.prior.marginal_variances() if model.prior is not None else ones
    row_norms = [jnp.max(s.operator(model.dim).sq_mv(ones)) for s in model.sites]
    v0 = jnp.min(variances)
    for r in row_norms:
        v0 = jnp.minimum(v0, 1.0 / jnp.maximum(r, jnp.finfo(r.dtype).tiny))
    return v0.astype(dtype)


def whitening(model, q0, whiten, method):
    """(model, q0, back): with `whiten`, the model and the start q0 (or None) in the basis w = mu + L v (App. E)
    and `back`, which takes a solution there back to w; otherwise all three unchanged (`back` the identity)."""
    if not isinstance(whiten, (bool, np.bool_)):
        raise ValueError(f"{method}: whiten must be True or False, got {whiten!r}")
    if not whiten:
        return model, q0, lambda q: q
    if model.prior is None:
        raise ValueError(f"{method}: whiten=True needs a prior")
    work, L, mu = whitened(model)
    return work, (None if q0 is None else whitened_q(q0, L, mu)), lambda q: unwhitened_q(q, L, mu)


def whitened(model):
    """The model in the basis w = mu + L v with L L^T = Sigma (App. E): prior N(0, I), sites H L, offset H mu."""
    prior = model.prior
    L = prior.cholesky()
    mu = prior.mean
    sites = []
    for s in model.sites:
        op = s.operator(model.dim)
        sites.append(Sites(DenseOperator(op.mm(L)), s.potential, offset=s.offset + op.mv(mu),
                           variance_offset=s.variance_offset))
    return Model(Isotropic(model.dim, jnp.ones((), L.dtype)), sites), L, mu


def unwhitened_q(q, L, mu):
    """q_v in the basis w = mu + L v taken back to w: mean mu + L m_v, S = L S_v L^T = (C_v L^T)^T (C_v L^T) as a
    Full factor (C_v L^T is upper triangular unless C_v is not, FactorAnalysis and Subspace, and Full keeps only
    an upper triangle)."""
    return Gaussian(mu + L @ q.mean, Full(upper_factor(q.factor.dense() @ L.T)))


def whitened_q(q, L, mu):
    """q in the basis v = L^{-1} (w - mu): mean L^{-1} (m - mu), factor C L^{-T} (upper triangular, as C and
    L^{-T} are), so that S_v = L^{-1} S L^{-T}."""
    if not isinstance(q.factor, Full) or not q.factor.is_initialised:
        raise ValueError(f"q0 with whiten=True needs an initialised Full factor, got {q.factor!r}")
    if q.mean.shape != mu.shape:
        raise ValueError(f"q0.mean must have shape {mu.shape}, got {q.mean.shape}")
    mean = jax.scipy.linalg.solve_triangular(L, q.mean - mu, lower=True)
    C = jax.scipy.linalg.solve_triangular(L, q.factor.upper().T, lower=True).T
    return Gaussian(mean, Full(C))


@eqx.filter_jit
def _fit_jit(model, q_init, name, optimizer, tol, max_steps, max_cg, start=False):
    TRACE_COUNT["fit"] += 1
    if start:   # the template's start from the mean-field fit (`gkl_jax._start`)
        frozen = _frozen(model)
        diagonal = _initial_q(frozen, Diagonal(), None)
        diagonal_solver = _solver_name(None, frozen, diagonal.factor)
        mean_field = _solve(frozen, diagonal, diagonal_solver, None, tol, _MAX_STEPS[diagonal_solver], max_cg,
                            implicit=False)[0]
        q_init = _start.mean_field_start(frozen, stop_gradients(q_init), mean_field)
    if isinstance(q_init.factor, AbstractRefinableFactor):
        return _refine_and_solve(model, q_init, name, optimizer, tol, max_steps, max_cg) + (None,)
    return _solve(model, q_init, name, optimizer, tol, max_steps, max_cg)


def _solve(model, q_init, name, optimizer, tol, max_steps, max_cg, implicit=True):
    """The solver's optimum over the solver leaves of q_init, with the implicit-function derivative in the model
    (`implicit=False`: none, for solves inside a loop, whose carried factor leaves `_implicit` cannot close over)."""
    params0, static = eqx.partition(q_init, _solver_filter(q_init))
    static = stop_gradients(static)
    flat0, unravel = ravel_pytree(params0)
    flat0 = lax.stop_gradient(flat0)
    to_q = lambda flat: eqx.combine(unravel(flat), static)
    # The iterations run on a gradient-free copy of the model; derivatives of the optimum come from the
    # implicit function theorem below, never from differentiating through the loop.
    frozen = _frozen(model)
    objective = lambda flat: bound(frozen, to_q(flat))
    sp = None       # the site precisions of the optimum and their factorisation (site-precision solver only)
    if name == "fixed-point":
        x, k, ok, hist = _fixed_point(frozen, to_q, flat0, tol, max_steps, max_cg=max_cg)
    elif name == "site-precision":
        q0 = to_q(flat0)
        m, k, ok, hist, sp, _ = _site_precision(frozen, _site_precision_start(frozen, q0), tol, max_steps)
        x = _to_flat(_site_precision_posterior(frozen.prior, q0, m, sp[0]))
    elif name == "newton":
        x, k, ok, hist = _solvers.newton_cg(objective, flat0, tol=tol, max_steps=max_steps, max_cg=max_cg)
    elif name == "lbfgs":
        x, k, ok, hist = _solvers.lbfgs(objective, flat0, tol=tol, max_steps=max_steps)
    else:
        x, k, ok, hist = _solvers.optax_solver(objective, flat0, optimizer, tol=tol, max_steps=max_steps)

    return (_implicit(model, to_q(x)) if implicit else to_q(x)), k, ok, hist, sp


def _implicit(model, q):
    """q, an optimum over its solver leaves, with their implicit-function derivative in the model (the leaves a
    refinable factor holds fixed, the subspace basis, are held fixed in the derivative too).

    Every array other than the model's inexact leaves (the fixed factor leaves, integer data such as sparse
    indices) enters `_implicit_optimum` as an argument, `held`, not through the closure `stationarity`: a traced
    array in a custom_jvp's non-differentiable closure leaks out of its trace."""
    params, static = eqx.partition(q, _solver_filter(q))
    flat, unravel = ravel_pytree(params)
    dynamic, rest = eqx.partition(model, eqx.is_inexact_array)
    held, skeleton = eqx.partition((rest, stop_gradients(static)), eqx.is_array)

    def stationarity(dyn, held, f):
        rest, static = eqx.combine(held, skeleton)
        return jax.grad(lambda f: bound(eqx.combine(dyn, rest), eqx.combine(unravel(f), static)))(f)

    flat = _implicit_optimum(stationarity, dynamic, held, lax.stop_gradient(flat))
    return eqx.combine(unravel(flat), stop_gradients(static))


def _solver_filter(q):
    """The leaves of q the solvers optimise: every inexact array, less those a refinable factor holds fixed."""
    spec = jax.tree.map(eqx.is_inexact_array, q)
    if isinstance(q.factor, AbstractRefinableFactor):
        spec = eqx.tree_at(lambda s: s.factor, spec, q.factor.solver_mask())
    return spec


def _refine_and_solve(model, q_init, name, optimizer, tol, max_steps, max_cg):
    """For an `AbstractRefinableFactor` (the subspace basis, papers/000 App. B.4): q <- refine(q), then solve over
    the solver leaves, `num_refinements` times in a `lax.fori_loop`, keeping the q with the best bound (the basis
    update is not guaranteed to increase it). With num_refinements = 0 it is one solve with the given basis.

    The rounds before the last only choose the next basis, so they stop at the looser tolerance sqrt(tol) (for
    tol < 1); the last round solves to `tol`. `converged` is checked on the returned q itself: max |dB| <= tol
    over the solver leaves."""
    rounds = q_init.factor.num_refinements
    if rounds == 0:
        return _solve(model, q_init, name, optimizer, tol, max_steps, max_cg)[:4]
    frozen = _frozen(model)
    loose = jnp.maximum(tol, jnp.sqrt(tol))

    def round_(i, carry):
        q, k, hist, best = carry
        factor = lax.stop_gradient(q.factor.refine(frozen, lax.stop_gradient(q), best))
        q2, k2, _, hist2, _ = _solve(frozen, eqx.tree_at(lambda g: g.factor, q, factor), name, optimizer,
                                     jnp.where(i == rounds - 1, tol, loose), max_steps, max_cg, implicit=False)
        value = bound(frozen, lax.stop_gradient(q2))
        better = jnp.isfinite(value) & (value >= best)
        q = jax.tree.map(lambda a, b: jnp.where(better, a, b), q2, q)
        return q, k + k2, _splice(hist, hist2, k), jnp.where(better, value, best)

    f0 = bound(frozen, lax.stop_gradient(q_init))
    hist0 = jnp.full((max_steps + 1,), jnp.nan, dtype=f0.dtype).at[0].set(f0)
    # best: the bound at the carried q (-inf where not finite), which the next refinement compares against
    init = (q_init, jnp.zeros((), jnp.int32), hist0, jnp.where(jnp.isfinite(f0), f0, -jnp.inf))
    q, k, hist, best = lax.fori_loop(0, rounds, round_, init)
    params, static = eqx.partition(lax.stop_gradient(q), _solver_filter(q))
    grad = jax.grad(lambda p: bound(frozen, eqx.combine(p, static)))(params)
    ok = jnp.isfinite(best) & (jnp.max(jnp.abs(ravel_pytree(grad)[0])) <= tol)
    return _implicit(model, q), k, ok, hist


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _implicit_optimum(stationarity, dynamic, held, x):
    """Returns the optimum x (a root of stationarity(dynamic, held, .)) with the implicit-function derivative

        dx = -(d_x F)^{-1} d_theta F . dtheta,   F = grad_x B,

    where -d_x F (minus the Hessian of the bound) is solved by CG with Hessian-vector products. The solve is a
    symmetric `lax.custom_linear_solve`, so reverse mode transposes it without differentiating the loop."""
    return x


@_implicit_optimum.defjvp
def _implicit_optimum_jvp(stationarity, primals, tangents):
    dynamic, held, x = primals
    ddynamic, _, _ = tangents
    # the primal output is the optimum itself, not the input x (which has no derivative): differentiated once more
    # (a Hessian), the rule then sees dx*/dtheta of the outer differentiation too
    x = _implicit_optimum(stationarity, dynamic, held, x)
    rhs = jax.jvp(lambda d: stationarity(d, held, x), (dynamic,), (ddynamic,))[1]
    neg_hessian = lambda v: -jax.jvp(lambda f: stationarity(dynamic, held, f), (x,), (v,))[1]
    solve = lambda matvec, b: _solvers.conjugate_gradient(matvec, b, max_iters=10 * b.shape[0])
    dx = lax.custom_linear_solve(neg_hessian, rhs, solve, symmetric=True)
    return x, dx


def _splice(hist, hist2, k):
    """hist[: k + 1] followed by hist2[1:], truncated to len(hist)."""
    idx = jnp.arange(hist.shape[0])
    return jnp.where(idx <= k, hist, hist2[jnp.clip(idx - k, 0, hist2.shape[0] - 1)])
