"""ML-II hyperparameter learning on any method's evidence estimate (papers/000 Section 6.1.3 and App. F.2).

`fit_hyperparameters(build, params, method=...)` maximises theta -> log Z_method(build(theta)), where `build`
maps a pytree of hyperparameters (kernels, likelihoods, inducing inputs, plain arrays; positive quantities are
stored unconstrained inside the modules) to a `Model`, and `method(model, q0=...)` is any inference function
returning a `Result`: `gk.fit` (G-KL), `gp.exact`, or the baselines `gk.laplace`, `gk.ep`, `gk.local`.

For G-KL the gradient is the envelope theorem (App. F.2, eq. 24): at the optimum (m*, C*) of the bound,

    dB/dtheta = d/dtheta B(theta; m, C) |_{(m, C) = (m*, C*)}
              = -1/2 tr(Sigma^{-1} dSigma) + 1/2 m^T Sigma^{-1} dSigma Sigma^{-1} m + 1/2 tr(C Sigma^{-1} dSigma Sigma^{-1} C^T)
                + (likelihood-parameter terms),

which is what differentiating `Result.log_z` gives (`fit` evaluates the bound at a stop-gradient optimum).
Each inner fit is warm-started at the previous optimum (q0), so after the first few outer steps an inner fit
costs a few iterations. The outer optimiser is L-BFGS with a zoom line search (`optax.lbfgs`) or any
`optax.GradientTransformation`; each outer step is one compiled function (compiled once per problem shape).
`restarts` reruns the optimisation from random perturbations of the unconstrained parameters and keeps the best.
"""

import inspect
import time
from typing import Any, Callable, Optional, Union

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from .._fit import _initial_q
from .._model import Model
from .._result import Result
from ..factors import Full


class HyperResult(eqx.Module):
    """Outcome of `fit_hyperparameters`.

    - `params`: the learned hyperparameter pytree (same structure as the input).
    - `result`: the inner `Result` at `params` (the posterior and log_z there).
    - `log_z`: the method's evidence estimate at `params`.
    - `num_steps`: outer iterations of the best run; `converged`: its stopping rule was met.
    - `history`: -objective... i.e. log_z after each outer step of the best run.
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
    from .. import _fit
    from ._exact import exact

    if method is None or method == "gkl":
        return _fit.fit
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


def _accepts_q0(fn) -> bool:
    try:
        return "q0" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def fit_hyperparameters(build: Callable[[Any], Model], params, *, method: Union[str, Callable, None] = None,
                        optimizer: Union[str, optax.GradientTransformation] = "lbfgs", max_steps: int = 100,
                        gtol: float = 1e-4, ftol: float = 1e-9, restarts: int = 0, key=None,
                        restart_scale: float = 0.5, filter_spec=eqx.is_inexact_array,
                        method_kwargs: Optional[dict] = None, warm_start: bool = True) -> HyperResult:
    """Maximise `method(build(params)).log_z` over the inexact-array leaves of `params` selected by
    `filter_spec` (see the module doc for the gradient).

    Stops when max |d log_z / d theta| <= gtol, when log_z changes by less than ftol (1 + |log_z|) in one
    step, or after `max_steps` outer steps (then `converged` is False). Restarts add N(0, restart_scale^2)
    noise to every selected leaf (`key` defaults to PRNGKey(0)).
    """
    if not callable(build):
        raise ValueError(f"build must be a callable mapping params to a gkl_jax.Model, got {type(build).__name__}")
    fn = _resolve_method(method)
    kwargs = dict(method_kwargs or {})
    use_q0 = warm_start and _accepts_q0(fn)
    if int(max_steps) < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    if int(restarts) < 0:
        raise ValueError(f"restarts must be >= 0, got {restarts}")
    if optimizer == "lbfgs":
        opt = optax.lbfgs()
        linesearch = True
    elif isinstance(optimizer, optax.GradientTransformation):
        opt = optimizer
        linesearch = isinstance(optimizer, optax.GradientTransformationExtraArgs)
    else:
        raise ValueError(f"optimizer must be 'lbfgs' or an optax.GradientTransformation, got {optimizer!r}")

    dyn0, static = eqx.partition(params, filter_spec)
    model0 = build(params)
    if not isinstance(model0, Model):
        raise ValueError(f"build(params) must return a gkl_jax.Model, got {type(model0).__name__}")

    def run_method(dyn, q0):
        model = build(eqx.combine(dyn, static))
        if use_q0:
            return fn(model, q0=q0, **kwargs)
        return fn(model, **kwargs)

    def objective(dyn, q0):
        res = run_method(dyn, q0)
        return -res.log_z, res

    value_and_grad = jax.value_and_grad(objective, has_aux=True)

    @eqx.filter_jit
    def step(dyn, opt_state, q0):
        (value, res), grad = value_and_grad(dyn, q0)
        q = res.q if use_q0 else q0
        if linesearch:
            updates, opt_state = opt.update(grad, opt_state, dyn, value=value, grad=grad,
                                            value_fn=lambda p: objective(p, q)[0])
        else:
            updates, opt_state = opt.update(grad, opt_state, dyn)
        return optax.apply_updates(dyn, updates), opt_state, value, grad, res

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
        runs.append(_run(step, opt, dyn, q_start, int(max_steps), gtol, ftol))
    best = max(runs, key=lambda run: run["log_z"] if np.isfinite(run["log_z"]) else -np.inf)
    params_best = eqx.combine(best["dyn"], static)
    return HyperResult(params=params_best, result=best["result"], log_z=best["result"].log_z,
                       num_steps=best["num_steps"], converged=best["converged"],
                       history=np.asarray(best["history"]),
                       restart_log_z=np.array([run["log_z"] for run in runs]),
                       num_inner_unconverged=best["inner_bad"], wall_time=time.perf_counter() - start)


def _run(step, opt, dyn, q, max_steps, gtol, ftol):
    opt_state = opt.init(dyn)
    history, inner_bad, converged = [], 0, False
    best_dyn, best_value, best_res, prev = dyn, np.inf, None, None
    k = 0
    for k in range(1, max_steps + 1):
        new_dyn, opt_state, value, grad, res = step(dyn, opt_state, q)
        value = float(value)
        if not np.isfinite(value):
            break
        if q is not None:
            q = res.q
        inner_bad += int(not bool(res.converged))
        history.append(-value)
        if value < best_value:
            best_dyn, best_value, best_res = dyn, value, res
        gmax = max((float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grad)), default=0.0)
        if gmax <= gtol or (prev is not None and abs(prev - value) <= ftol * (1 + abs(value))):
            converged = True
            break
        prev = value
        if not all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(new_dyn)):
            break
        dyn = new_dyn
    if best_res is None:
        raise FloatingPointError("fit_hyperparameters: the objective is not finite at the initial parameters")
    return {"dyn": best_dyn, "result": best_res, "log_z": -best_value, "num_steps": k,
            "converged": converged, "history": history, "inner_bad": inner_bad}
