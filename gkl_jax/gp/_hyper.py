"""ML-II hyperparameter learning on any method's evidence estimate (Challis & Barber 2013, Section 6.1.3 and App. F.2).

`fit_hyperparameters(build, params, method=...)` maximises theta -> log Z_method(build(theta)), where `build`
maps a pytree of hyperparameters (kernels, likelihoods, inducing inputs, plain arrays; positive quantities are
stored unconstrained inside the modules) to a `Model`, and `method(model, q0=...)` is any inference function
returning a `Result`: `gk.fit` (G-KL), `gp.exact`, or the baselines `gk.laplace`, `gk.ep`, `gk.local`.

For G-KL the gradient is the envelope theorem (App. F.2, eq. 24): at the optimum (m*, C*) of the bound,

    dB/dtheta = d/dtheta B(theta; m, C) |_{(m, C) = (m*, C*)}
              = -1/2 tr(Sigma^{-1} dSigma) + 1/2 m^T Sigma^{-1} dSigma Sigma^{-1} m
                + 1/2 tr(C Sigma^{-1} dSigma Sigma^{-1} C^T) + (likelihood-parameter terms),

which is what differentiating `Result.log_z` gives (`fit` evaluates the bound at a stop-gradient optimum).
For the other methods the gradient is whatever their `log_z` provides (exact: closed form).
Each inner fit is warm-started at the previous optimum (q0), so after the first few outer steps an inner fit
costs a few iterations. The outer optimiser is L-BFGS (the direction from `gkl_jax._optim.scale_by_lbfgs`, an Armijo
backtracking line search that treats a failed inner fit as a rejected step) or any `optax.GradientTransformation`
(every update taken). The whole run is one compiled program: the loop of `gkl_jax.solvers.iterate` over
`_hyper_loop.HyperSolver`, whose step evaluates (log_z, gradient, inner result) at one trial point and then accepts
it or halves the step (`_advance`), so the objective has one call site and one trace; it is module-level and
compiles once per (build, method, shapes), reused across calls. The host loop it replaced spent a third of its time
between the compiled evaluations. With `jit=False` (the baselines) `iterate` runs the same steps as a host loop.
`iterate` keeps the history, the step count and the `RESULTS` status, and reports each step to `progress=`.
When G-KL runs the site-precision solver (GP models with log-concave likelihoods, or any with
`method_kwargs={"solver": gk.solvers.SitePrecision()}`) the inner fits are
`_warm.fit_warm`, which hands on the mean, marginal variances and site precisions W instead of the Full factor C,
and C is formed once, for the returned Result (`_warm.warm_result`): C cost a fifth of each warm evaluation. The
next inner fit starts from the previous (m, W) (`_warm.WarmPoint`), not from a q0, which saves the quadrature that
would recompute W.
`restarts` reruns the optimisation from random perturbations of the unconstrained parameters and keeps the best.
"""

import inspect
import time
import typing
import warnings
from typing import Any, Callable, Optional, Union

import equinox as eqx
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax

from .._fit import fit
from .._linalg import full_precision
from .._model import Model
from .._optim import default_tol
from .._progress import reraise_callback_error, resolve_progress
from .._repr import format_value
from .._result import Result
from .._start import model_dtype
from .._status import RESULTS, HasStatus
from .._typing import Key
from .._validate import check_int, check_max_steps, check_nonnegative, strongly_typed
from .._warm import fit_warm, ml2_solver, warm_fit_applies, warm_result
from ..potentials import AbstractPotential
from ..solvers import ProgressInfo
from ._hyper_loop import OUTER_LBFGS, HyperSolver, Objective, run, run_jit


class HyperResult(HasStatus):
    """Outcome of `fit_hyperparameters`.

    Attributes:
        params: the learned hyperparameter pytree (same structure as the input).
        model: `build(params)`, the `gkl_jax.Model` at the learned parameters (predict with
            `gp.predict(result, model.prior, X_new)` without building it again).
        result: the inner `gkl_jax.Result` at `params` (the posterior and log_z there).
        log_z: float scalar array, the method's evidence estimate at `params`.
        num_steps: int, accepted outer steps of the best run.
        status: int, the best run's `gkl_jax.RESULTS` code (successful, max_steps_reached, stalled); `message` says
            it in words, `converged` is `status == RESULTS.successful`.
        history: float numpy array, log_z at the start and after each accepted outer step of the best run.
        restart_log_z: (restarts + 1,) float numpy array, the final log_z of every run (first entry: the run
            from the given params).
        num_inner_unconverged: int, outer steps of the best run whose inner fit did not converge.
        wall_time: float, seconds for all runs (compilation included).
    """

    params: Any
    model: Model
    result: Result
    log_z: jax.Array
    num_steps: int = eqx.field(static=True)
    history: np.ndarray
    restart_log_z: np.ndarray
    num_inner_unconverged: int = eqx.field(static=True)
    wall_time: float = eqx.field(static=True)
    status: int = eqx.field(static=True, default=0)


    def __repr__(self):
        learned = ", ".join(f"{k}={format_value(v)}" for k, v in _named_leaves(self.params))
        return (f"HyperResult(log_z={format_value(self.log_z)}, status={RESULTS.name(self.status)}, "
                f"num_steps={self.num_steps}, params=({learned}))")


def _named_leaves(params):
    """(path, value) of every array leaf of the hyperparameters, for the repr (kernels print their own values)."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params, is_leaf=lambda x: isinstance(x, eqx.Module))[0]:
        out.append((jax.tree_util.keystr(path) or "params", leaf))
    return out


def _resolve_method(method):
    from ._exact import exact

    if method is None or method == "gkl":
        return fit
    if method == "exact":
        return exact
    if isinstance(method, str):
        from .. import baselines

        fn = getattr(baselines, method, None)
        if fn is None:
            raise ValueError(f"method must be a callable or one of 'gkl', 'exact' or a gkl_jax.baselines name, "
                             f"got {method!r}")
        return fn
    if not callable(method):
        raise ValueError(f"method must be callable, got {type(method).__name__}")
    return method


def _is_baseline(fn) -> bool:
    """Whether `fn` is one of the gkl_jax.baselines inference functions (Laplace, EP, local, double loop)."""
    from .. import baselines

    return any(fn is getattr(baselines, name, None) for name in ("laplace", "ep", "local", "double_loop"))


def kwargs_contains_arrays(kwargs) -> bool:
    return any(eqx.is_array(x) for x in jax.tree.leaves(kwargs or {}))


def _accepts_q0(fn) -> bool:
    try:
        return "q0" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


@full_precision
def fit_hyperparameters(build: Callable[[Any], Model], params: Any, *, method: Union[str, Callable, None] = None,
                        optimizer: Union[str, optax.GradientTransformation] = "lbfgs", max_steps: int = 100,
                        gtol: float = 1e-4, ftol: float = 1e-9, restarts: int = 0, key: Key | None = None,
                        restart_scale: float = 0.5, filter_spec: Any = None,
                        method_kwargs: Optional[dict] = None, warm_start: bool = True,
                        jit: Optional[bool] = None, gradient: Optional[str] = None,
                        max_step: Optional[float] = 3.0,
                        progress: bool | str | Callable[[ProgressInfo], object] = False) -> HyperResult:
    """Maximise `method(build(params)).log_z` over the inexact-array leaves of `params` selected by
    `filter_spec` (see the module doc for the gradient); by default (None) every inexact array except the data
    of a likelihood in `params` (its targets `y`). A likelihood's positive parameters (variance, scale, dof) are
    stored as they are, not as logarithms: an outer step that makes one non-positive counts as a failed
    evaluation (the line search halves it).

    `build` may be any callable; make it an `eqx.Module` holding the data (X, y, fixed likelihood settings) to
    reuse the compiled objective across calls on data of the same shapes (cross-validation partitions, grids).
    With `jit=False` the model is built outside any jit (the method compiles itself); use it for methods that
    check concrete model values (the baselines refuse a traced `variance_offset`). `gradient="forward"`
    differentiates log_z in forward mode (one pass per hyperparameter), for methods whose log_z is not
    reverse-differentiable (an iterative solver without an implicit-function rule). By default (`None`) both
    follow the method: `jit=True, gradient="reverse"` for G-KL (`gk.fit`), `gp.exact` and user callables;
    `jit=False, gradient="forward"` for the baselines `gk.laplace`, `gk.ep`, `gk.local` (their inner loops
    have no implicit-function rule), so the thesis comparison is the same call with another `method`.

    Stops when max |d log_z / d theta| <= gtol, when log_z changes by less than ftol (1 + |log_z|) in one
    step (or less than the inner fits' own accuracy, for G-KL GP models: `_advance`), or after `max_steps` outer
    steps or a failed line search (then `converged` is False, with a warning).
    For G-KL the inner fits stop at max |grad| <= gtol / 10 (in float32 not below 1e-3) unless `method_kwargs`
    sets `tol`; with the site-precision solver (GP models with log-concave likelihoods by default; any GP model
    given `method_kwargs={"solver": gk.solvers.SitePrecision()}`) the tolerance is looser while the outer
    gradient is large (`_inner_tol`). Restarts add N(0, restart_scale^2) noise to every selected leaf (`key`
    defaults to PRNGKey(0)).

    With L-BFGS, the first trial of each line search moves no parameter by more than `max_step` (None: no
    limit); the step is shortened along the L-BFGS direction. Kernel parameters are stored as logarithms, so the
    default 3 is a factor e^3 ~ 20 per step. Put parameters on comparable scales (or pass None) when some of
    them, e.g. inducing inputs in raw units, need larger steps. (ML-II: Challis & Barber 2013, Section 6.1.3 and
    App. F.2.)

    Args:
        build: a callable mapping `params` to a `gkl_jax.Model` (ideally an `eqx.Module` holding the data).
        params: the initial hyperparameter pytree (kernels, likelihoods, arrays).
        method: "gkl" / None (`gk.fit`), "exact" (`gp.exact`), a `gkl_jax.baselines` name ("laplace", "ep",
            "local", ...) or a callable `method(model, **method_kwargs) -> Result`.
        optimizer: "lbfgs" (default, with a line search) or an `optax.GradientTransformation`.
        max_steps: outer steps per run (int >= 1, default 100).
        gtol: gradient tolerance of the outer loop (>= 0, default 1e-4).
        ftol: relative log_z change that stops the outer loop (>= 0, default 1e-9).
        restarts: extra runs from perturbed params (int >= 0, default 0); the best run is returned.
        key: a `jax.random` key for the restarts (default PRNGKey(0)).
        restart_scale: standard deviation of the restarts' perturbation (>= 0, default 0.5).
        filter_spec: an equinox filter pytree selecting the leaves to learn (default: every inexact array but a
            likelihood's targets).
        method_kwargs: static keyword options for `method` (no arrays).
        warm_start: start each inner fit from the previous q where the method takes `q0` (default True).
        jit: build the model inside the compiled objective (default by method, see above).
        gradient: "reverse" or "forward" (default by method, see above).
        max_step: the largest first move of a parameter in an L-BFGS line search (positive, or None; default 3).
        progress: False (default), True (each accepted outer step's log_z and max |d log_z / d theta| on stderr),
            "auto" (True where stderr is a terminal), or a callable receiving a `gkl_jax.solvers.ProgressInfo`
            after each accepted outer step and once at the end of each run (`bound` is log_z, `solver`
            "HyperSolver"), as for `gkl_jax.fit`. A callable that raises stops the run with its exception.
            Each callable is part of the compiled program's key: the first call with a new one compiles again.

    Returns:
        `HyperResult`.

    Raises:
        ValueError: build not callable or not returning a Model, arrays in method_kwargs, an unknown method or
            optimizer, a bad count, tolerance or max_step, or a `progress` that is not True, False, "auto" or
            callable.
        FloatingPointError: log_z is not finite at the initial parameters.

    Example:
        >>> import numpy as np, gkl_jax as gk
        >>> X = np.linspace(-2.0, 2.0, 8)[:, None]
        >>> y = np.where(np.sin(2.0 * X[:, 0]) > 0, 1, -1)
        >>> build = lambda kernel: gk.gp.model(kernel, X, gk.potentials.Logistic(y))
        >>> start = gk.kernels.SquaredExponential(1.0, 1.0)
        >>> learned = gk.gp.fit_hyperparameters(build, start, gtol=1e-3)
        >>> bool(learned.converged), bool(learned.log_z > gk.fit(build(start)).log_z)
        (True, True)
        >>> pred = gk.gp.predict(learned.result, learned.model.prior, np.array([[-1.0], [1.0]]), family="logistic")
        >>> print(np.round(pred.probability, 2))
        [0.21 0.79]
    """
    if not callable(build):
        raise ValueError(f"build must be a callable mapping params to a gkl_jax.Model, got {type(build).__name__}")
    if kwargs_contains_arrays(method_kwargs):
        raise ValueError("method_kwargs must hold static options only (no arrays); put data in `build`")
    fn = _resolve_method(method)
    callback = resolve_progress(progress, "gkl_jax.gp.fit_hyperparameters")
    kwargs = dict(method_kwargs or {})
    use_q0 = warm_start and _accepts_q0(fn)
    check_max_steps(max_steps)
    check_int(restarts, "restarts")
    for name, value in (("gtol", gtol), ("ftol", ftol), ("restart_scale", restart_scale)):
        check_nonnegative(value, name)
    if max_step is not None and not float(max_step) > 0:
        raise ValueError(f"max_step must be positive or None, got {max_step}")
    if optimizer == "lbfgs":
        opt = OUTER_LBFGS
        linesearch = True
    elif isinstance(optimizer, optax.GradientTransformation):
        opt = optimizer
        linesearch = False
    else:
        raise ValueError(f"optimizer must be 'lbfgs' or an optax.GradientTransformation, got {optimizer!r}")

    dyn0, static = eqx.partition(params, default_filter_spec(params) if filter_spec is None else filter_spec)
    model0 = build(params)
    if not isinstance(model0, Model):
        raise ValueError(f"build(params) must return a gkl_jax.Model, got {type(model0).__name__}")
    # hyperparameters given as Python floats are weakly typed; a weak start compiled the objective a second time
    # (ionosphere: 4.2 s of a 13 s first call)
    dyn0 = strongly_typed(dyn0, model_dtype(model0))
    default_inner_tol = fn is fit and "tol" not in kwargs and gtol > 0
    if default_inner_tol:
        # The inner fit's gradient residual enters the envelope gradient at first order: gtol / 10 keeps that
        # error an order below the outer stopping rule, and saves the fixed point's linearly converging tail.
        # In float32 not below the default tolerance, the round-off floor of the solvers there.
        dtype = model_dtype(model0)
        floor = default_tol(dtype) if jnp.finfo(dtype).bits < 64 else 0.0
        kwargs["tol"] = max(0.1 * float(gtol), floor)
    dynamic_kwargs = {}
    if fn is fit and "tol" in kwargs:
        # an argument of the compiled objective, not part of its key: every gtol shares one compilation
        tol = float(kwargs.pop("tol"))
        if not tol > 0:
            raise ValueError(f"method_kwargs['tol'] must be positive, got {tol}")
        dynamic_kwargs["tol"] = np.asarray(tol, model_dtype(model0))

    # G-KL by the site-precision solver (by default for GP models, `_warm.ml2_solver`, or given as
    # `method_kwargs={"solver": solvers.SitePrecision()}`): the outer steps run `fit_warm`, which does not form C;
    # C is formed once, for the returned Result.
    warm = (fn is fit and set(kwargs) <= {"solver"}
            and warm_fit_applies(model0, kwargs.get("solver", ml2_solver(model0))))
    if warm:
        fn, kwargs = fit_warm, {}
    # an inner tolerance that follows the outer gradient (`_inner_tol`) where it was measured: the warm
    # site-precision fits (GP classification; Table 1's Laplace-likelihood column reproduced with it)
    adaptive = warm and default_inner_tol
    is_baseline = _is_baseline(fn)
    jit = (not is_baseline) if jit is None else bool(jit)
    gradient = ("forward" if is_baseline else "reverse") if gradient is None else gradient
    if gradient not in ("reverse", "forward"):
        raise ValueError(f"gradient must be 'reverse' or 'forward', got {gradient!r}")

    start = time.perf_counter()
    dtype = model_dtype(model0)
    objective = Objective(build, fn, kwargs, use_q0, static, gradient == "forward", jit)
    solver = HyperSolver(opt, linesearch, int(max_steps), np.asarray(gtol, dtype), np.asarray(ftol, dtype),
                         bool(adaptive), np.asarray(np.inf if max_step is None else max_step, dtype))
    one_run = run_jit if jit else run
    if key is None and restarts:
        key = jax.random.PRNGKey(0)   # 0.25 ms; made only where a restart needs it
    runs = []
    for r in range(int(restarts) + 1):
        dyn = dyn0
        if r > 0:
            key, sub = jax.random.split(typing.cast(Key, key))     # set above where restarts > 0
            leaves, treedef = jax.tree.flatten(dyn0)
            subs = jax.random.split(sub, max(len(leaves), 1))
            leaves = [x + restart_scale * jax.random.normal(k, jnp.shape(x), jnp.result_type(x))
                      for x, k in zip(leaves, subs)]
            dyn = jax.tree.unflatten(treedef, leaves)
        try:
            solution, state = one_run(objective, solver, dyn, dynamic_kwargs, callback)
        except jax.errors.JaxRuntimeError as e:     # a progress callable that raised: its own exception
            reraise_callback_error(callback, e)
            raise
        if int(solution.status) == RESULTS.nonfinite:
            raise FloatingPointError("fit_hyperparameters: the objective is not finite at the initial parameters")
        runs.append((solution, state))
    log_zs = np.array([float(solution.value) for solution, _ in runs])
    best, best_state = runs[int(np.argmax(np.where(np.isfinite(log_zs), log_zs, -np.inf)))]
    params_best = eqx.combine(best.x, static)
    if warm:
        model, result = _warm_result(build, params_best, best_state.res)
    else:
        model, result = build(params_best), best_state.res
    k, code = int(best.num_steps), int(best.status)
    if code != RESULTS.successful:
        warnings.warn(f"gkl_jax.gp.fit_hyperparameters: stopped after {k} steps without meeting gtol or ftol "
                      f"({RESULTS.message(code)}); the returned parameters are the best found", stacklevel=2)
    return HyperResult(params=params_best, model=model, result=result, log_z=result.log_z, num_steps=k,
                       status=code, history=np.asarray(best.history)[: k + 1],
                       restart_log_z=log_zs, num_inner_unconverged=int(best_state.inner_bad),
                       wall_time=time.perf_counter() - start)


def default_filter_spec(params):
    """`eqx.is_inexact_array` on every leaf, except the targets `y` of the likelihoods in `params` (data)."""
    def spec(node):
        if isinstance(node, AbstractPotential) and getattr(node, "y", None) is not None:
            return eqx.tree_at(lambda p: p.y, jax.tree.map(eqx.is_inexact_array, node), False)
        return jax.tree.map(eqx.is_inexact_array, node)

    return jax.tree.map(spec, params, is_leaf=lambda x: isinstance(x, AbstractPotential))


@eqx.filter_jit
def _warm_result(build, params, warm):
    """(build(params), the `Result` that `warm` summarises) in one compiled call."""
    model = build(params)
    return model, warm_result(model, warm)
