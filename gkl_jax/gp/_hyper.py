"""ML-II hyperparameter learning on any method's evidence estimate (papers/000 Section 6.1.3 and App. F.2).

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
costs a few iterations. The outer optimiser is L-BFGS (the direction from `optax.scale_by_lbfgs`, an Armijo
backtracking line search that treats a failed inner fit as a rejected step) or any `optax.GradientTransformation`
(every update taken). One compiled function evaluates (log_z, gradient, inner result); it is module-level, so
it compiles once per (build, method, shapes) and is reused across calls, and the outer loop is a host loop over it.
When G-KL runs the site-precision solver (GP models with log-concave likelihoods) the inner fits are
`_fit.fit_warm`, which hands on the mean, marginal variances and site precisions W instead of the Full factor C,
and C is formed once, for the returned Result (`_fit.warm_result`): C cost a fifth of each warm evaluation.
`restarts` reruns the optimisation from random perturbations of the unconstrained parameters and keeps the best.
"""

import inspect
import time
from typing import Any, Callable, Optional, Union

import equinox as eqx
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax

from .._fit import _initial_q, default_tol, fit, fit_warm, model_dtype, warm_fit_applies, warm_result
from .._model import Model
from .._result import Result
from .._validate import strongly_typed
from ..factors import Full


class HyperResult(eqx.Module):
    """Outcome of `fit_hyperparameters`.

    - `params`: the learned hyperparameter pytree (same structure as the input).
    - `result`: the inner `Result` at `params` (the posterior and log_z there).
    - `log_z`: the method's evidence estimate at `params`.
    - `num_steps`: outer iterations of the best run; `converged`: its stopping rule was met.
    - `history`: log_z at the start and after each accepted outer step of the best run.
    - `restart_log_z`: the final log_z of every run (first entry: the run from the given params).
    - `num_inner_unconverged`: outer steps of the best run whose inner fit did not converge.
    - `wall_time`: seconds for all runs (compilation included).
    """

    params: Any
    result: Result
    log_z: jax.Array
    num_steps: int = eqx.field(static=True)
    converged: bool = eqx.field(static=True)
    history: np.ndarray
    restart_log_z: np.ndarray
    num_inner_unconverged: int = eqx.field(static=True)
    wall_time: float = eqx.field(static=True)


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


def fit_hyperparameters(build: Callable[[Any], Model], params, *, method: Union[str, Callable, None] = None,
                        optimizer: Union[str, optax.GradientTransformation] = "lbfgs", max_steps: int = 100,
                        gtol: float = 1e-4, ftol: float = 1e-9, restarts: int = 0, key=None,
                        restart_scale: float = 0.5, filter_spec=eqx.is_inexact_array,
                        method_kwargs: Optional[dict] = None, warm_start: bool = True,
                        jit: Optional[bool] = None, gradient: Optional[str] = None) -> HyperResult:
    """Maximise `method(build(params)).log_z` over the inexact-array leaves of `params` selected by
    `filter_spec` (see the module doc for the gradient).

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
    step, or after `max_steps` outer steps (then `converged` is False). For G-KL the inner fits stop at
    max |grad| <= gtol / 10 (in float32 not below 1e-3) unless `method_kwargs` sets `tol` (on the thesis'
    classification sets, gtol = 1e-3: the learned bound and test log-likelihood agree with inner tol 1e-6 to 5
    digits, 15-30% faster). Restarts add N(0, restart_scale^2)
    noise to every selected leaf (`key` defaults to PRNGKey(0)).
    """
    if not callable(build):
        raise ValueError(f"build must be a callable mapping params to a gkl_jax.Model, got {type(build).__name__}")
    if kwargs_contains_arrays(method_kwargs):
        raise ValueError("method_kwargs must hold static options only (no arrays); put data in `build`")
    fn = _resolve_method(method)
    kwargs = dict(method_kwargs or {})
    use_q0 = warm_start and _accepts_q0(fn)
    if int(max_steps) < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    if int(restarts) < 0:
        raise ValueError(f"restarts must be >= 0, got {restarts}")
    if optimizer == "lbfgs":
        opt = _LBFGS
        linesearch = True
    elif isinstance(optimizer, optax.GradientTransformation):
        opt = optimizer
        linesearch = False
    else:
        raise ValueError(f"optimizer must be 'lbfgs' or an optax.GradientTransformation, got {optimizer!r}")

    dyn0, static = eqx.partition(params, filter_spec)
    model0 = build(params)
    if not isinstance(model0, Model):
        raise ValueError(f"build(params) must return a gkl_jax.Model, got {type(model0).__name__}")
    # hyperparameters given as Python floats are weakly typed; a weak start compiled the objective a second time
    # (ionosphere: 4.2 s of a 13 s first call)
    dyn0 = strongly_typed(dyn0, model_dtype(model0))
    if fn is fit and "tol" not in kwargs and gtol > 0:
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
        dynamic_kwargs["tol"] = jnp.asarray(tol, model_dtype(model0))

    # G-KL by the site-precision solver: the outer steps run `fit_warm`, which does not form C; C is formed once,
    # for the returned Result.
    warm = fn is fit and not kwargs and warm_fit_applies(model0)
    if warm:
        fn = fit_warm
    is_baseline = _is_baseline(fn)
    jit = (not is_baseline) if jit is None else bool(jit)
    gradient = ("forward" if is_baseline else "reverse") if gradient is None else gradient
    if gradient not in ("reverse", "forward"):
        raise ValueError(f"gradient must be 'reverse' or 'forward', got {gradient!r}")
    vg = _value_and_grad if jit else _value_and_grad_eager
    value_and_grad = lambda dyn, q0: vg(build, fn, kwargs, use_q0, static, dyn, q0, dynamic_kwargs,
                                        gradient == "forward")
    update = lambda grad, state, dyn: _update(opt, grad, state, dyn)

    start = time.perf_counter()
    q_start = _initial_q(model0, kwargs.get("factor") or Full(), None) if use_q0 else None
    key = jax.random.PRNGKey(0) if key is None else key
    runs = []
    for r in range(int(restarts) + 1):
        dyn = dyn0
        if r > 0:
            key, sub = jax.random.split(key)
            leaves, treedef = jax.tree.flatten(dyn0)
            subs = jax.random.split(sub, max(len(leaves), 1))
            leaves = [x + restart_scale * jax.random.normal(k, jnp.shape(x), jnp.result_type(x))
                      for x, k in zip(leaves, subs)]
            dyn = jax.tree.unflatten(treedef, leaves)
        runs.append(_run(value_and_grad, update, opt, linesearch, dyn, q_start, int(max_steps), gtol, ftol))
    best = max(runs, key=lambda run: run["log_z"] if np.isfinite(run["log_z"]) else -np.inf)
    params_best = eqx.combine(best["dyn"], static)
    result = _warm_result(build, params_best, best["result"]) if warm else best["result"]
    return HyperResult(params=params_best, result=result, log_z=result.log_z,
                       num_steps=best["num_steps"], converged=best["converged"],
                       history=np.asarray(best["history"]),
                       restart_log_z=np.array([run["log_z"] for run in runs]),
                       num_inner_unconverged=best["inner_bad"], wall_time=time.perf_counter() - start)


_LBFGS = optax.scale_by_lbfgs(memory_size=10)


def _run_method(build, fn, kwargs, use_q0, static, dyn, q0):
    model = build(eqx.combine(dyn, static))
    return fn(model, q0=q0, **kwargs) if use_q0 else fn(model, **kwargs)


TRACE_COUNT = {"objective": 0}
"""Traces of the ML-II objective (calls, when it runs eagerly with jit=False); the tests read it."""


def _value_and_grad_eager(build, fn, kwargs, use_q0, static, dyn, q0, dynamic_kwargs, forward=False):
    """(-log_z, its gradient in dyn, the inner Result). Module-level so the compiled function is reused across
    calls: pass `build` as an eqx.Module holding the data (arrays are traced), and the same method object.
    `dynamic_kwargs` (arrays, not differentiated) join the static `kwargs` of the method."""
    TRACE_COUNT["objective"] += 1

    def objective(d):
        res = _run_method(build, fn, {**kwargs, **dynamic_kwargs}, use_q0, static, d, q0)
        return -res.log_z, res

    if forward:
        flat, unravel = jax.flatten_util.ravel_pytree(dyn)

        def with_aux(f):
            value, res = objective(unravel(f))
            return value, (value, res)

        jac, (value, res) = jax.jacfwd(with_aux, has_aux=True)(flat)
        return value, unravel(jac), res
    (value, res), grad = jax.value_and_grad(objective, has_aux=True)(dyn)
    return value, grad, res


_value_and_grad = eqx.filter_jit(_value_and_grad_eager)


@eqx.filter_jit
def _warm_result(build, params, warm):
    return warm_result(build(params), warm)


@eqx.filter_jit
def _update(opt, grad, state, dyn):
    return opt.update(grad, state, dyn)


def _strong(tree):
    """Drop weak types from an optimiser state, so the compiled update is not retraced after the first step."""
    return jax.tree.map(lambda x: jnp.array(x, dtype=jnp.result_type(x)) if eqx.is_array_like(x) else x, tree)


def _dot(a, b):
    return sum(jnp.vdot(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _run(value_and_grad, update, opt, linesearch, dyn, q, max_steps, gtol, ftol, c1=1e-4, max_halvings=30):
    """The outer loop. With `linesearch` (L-BFGS) the optimiser gives the direction d = -H g and a backtracking
    (Armijo) line search along it picks the step; a non-finite objective (a failed inner fit at an extreme
    hyperparameter) counts as a rejected step. Otherwise every optimiser update is taken."""
    opt_state = _strong(opt.init(dyn))
    value, grad, res = value_and_grad(dyn, q)
    value = float(value)
    if not np.isfinite(value):
        raise FloatingPointError("fit_hyperparameters: the objective is not finite at the initial parameters")
    history, inner_bad, converged, k = [-value], int(not bool(res.converged)), False, 0
    for k in range(1, max_steps + 1):
        if q is not None:
            q = res.q
        if max((float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grad)), default=0.0) <= gtol:
            converged, k = True, k - 1
            break
        updates, opt_state = update(grad, opt_state, dyn)
        if linesearch:
            direction = jax.tree.map(lambda u: -u, updates)
            slope = float(_dot(grad, direction))
            if not slope < 0:                       # not a descent direction: fall back to steepest descent
                direction = jax.tree.map(lambda g: -g, grad)
                slope = float(_dot(grad, direction))
            t, accepted = 1.0, False
            for _ in range(max_halvings):
                trial = jax.tree.map(lambda x, d: x + t * d, dyn, direction)
                v_new, g_new, r_new = value_and_grad(trial, q)
                v_new = float(v_new)
                if np.isfinite(v_new) and v_new <= value + c1 * t * slope:
                    accepted = True
                    break
                t *= 0.5
            if not accepted:
                break
        else:
            trial = optax.apply_updates(dyn, updates)
            v_new, g_new, r_new = value_and_grad(trial, q)
            v_new = float(v_new)
            if not np.isfinite(v_new):
                break
        change = abs(value - v_new)
        dyn, value, grad, res = trial, v_new, g_new, r_new
        history.append(-value)
        inner_bad += int(not bool(res.converged))
        if linesearch and change <= ftol * (1 + abs(value)):
            converged = True
            break
    return {"dyn": dyn, "result": res, "log_z": -value, "num_steps": k, "converged": converged,
            "history": history, "inner_bad": inner_bad}
