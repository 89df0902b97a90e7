"""Derivatives of a fit's result in the model without differentiating the solver loops (Challis & Barber 2013,
App. F.2): the envelope rule for the optimal bound and the implicit-function rule for the optimum.

Both hold to every order: the envelope rule (`envelope_bound`; for a solver's own form of the value,
`solver_value`) is evaluated at the implicit q, and the implicit rule returns the optimum itself, so
jax.hessian or grad of grad of `log_z` and of q add the dq*/dtheta terms. A first derivative costs no solve for
dq*/dtheta.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jax.flatten_util import ravel_pytree

try:
    from jax._src.interpreters import partial_eval as _partial_eval
    _UNKNOWN_TANGENTS: tuple = (_partial_eval.JaxprTracer,)
except (ImportError, AttributeError):     # pragma: no cover - a JAX without it: JAX's own error stands
    _UNKNOWN_TANGENTS = ()

from ._bound import bound
from ._optim import conjugate_gradient
from .factors import AbstractRefinableFactor
from .operators import AbstractOperator


def filtered_jvp(fn, args, t_args):
    """jax.jvp of fn(*args) in the inexact arrays of `args`, from tangents as `eqx.filter_custom_jvp` passes them
    (None for a symbolic zero, at a leaf or for a whole argument).

    Args:
        fn: the function.
        args: tuple of its arguments (pytrees).
        t_args: their tangents, as `eqx.filter_custom_jvp` passes them.

    Returns:
        (fn(*args), its tangent).
    """
    dynamic, static = eqx.partition(args, eqx.is_inexact_array)
    t_args = tuple(jax.tree.map(lambda _: None, d) if t is None else eqx.filter(t, eqx.is_inexact_array)
                   for d, t in zip(dynamic, t_args))
    t_dynamic = jax.tree.map(lambda x, t: x if x is None else (jnp.zeros_like(x) if t is None else t), dynamic,
                             t_args, is_leaf=lambda x: x is None)
    return jax.jvp(lambda d: fn(*eqx.combine(d, static)), (dynamic,), (t_dynamic,))


def envelope_bound(model, q):
    """B(model, q) at an optimum q = q*(model) of the solver leaves: the value at the gradient-stopped q, and the
    derivative dB/dtheta at fixed q (the envelope theorem: dB/dq = 0 there), which needs no solve for dq*/dtheta
    (`envelope_bound_at` with the bound evaluated here).

    q enters the derivative rule as given, with the implicit derivative `fit` attaches to it: a second
    differentiation adds d^2B/dtheta dq . dq*/dtheta, so second derivatives of the optimal bound are exact too.

    Args:
        model: the `Model`.
        q: the optimum `Gaussian`.

    Returns:
        Scalar: the bound.
    """
    return envelope_bound_at(model, q, bound(stop_gradients(model), lax.stop_gradient(q)))


@eqx.filter_custom_jvp
def envelope_bound_at(model, q, value):
    """`envelope_bound(model, q)` where the solver computed the bound at q itself (`value`): the same derivatives,
    without evaluating the bound once more (no copy of the site quadrature in the fit's program for the value).

    Args:
        model: the `Model`.
        q: the optimum `Gaussian`.
        value: B(model, q) as the solver computed it (scalar; up to round-off, also in a whitened basis, where
            the bound is the same).

    Returns:
        Scalar: the bound.
    """
    return value


@envelope_bound_at.def_jvp
def _envelope_bound_at_jvp(primals, tangents):
    model, q, value = primals
    out = envelope_bound_at(model, q, value)     # itself, so that higher orders see it too
    return out, filtered_jvp(lambda model: bound(model, q), (model,), tangents[:1])[1]


@jax.custom_jvp
def flag_nonfinite(value):
    """`value`, with a NaN derivative wherever `value` is not finite: a fit that ends at a NaN or infinite bound has
    no derivative, and the envelope rule's derivative at its q (a finite number) must not pass for one, also
    under `jit`, where no warning is raised.

    Args:
        value: a float array (the bound of a fit).

    Returns:
        `value`.
    """
    return value


@flag_nonfinite.defjvp
def _flag_nonfinite_jvp(primals, tangents):
    (value,), (tangent,) = primals, tangents
    return flag_nonfinite(value), tangent * jnp.where(jnp.isfinite(value), 1.0, jnp.nan)   # linear in the tangent


@eqx.filter_custom_jvp
def _solver_value(value, model, q, *, recompute):
    """`value`, which the solver computed at its optimum q = q*(model), with the derivative of
    recompute(model, q): the solver's value where nothing differentiates it, the total derivative through the
    implicit q where something does."""
    return value


@_solver_value.def_jvp
def _solver_value_jvp(primals, tangents, *, recompute):
    value, model, q = primals
    out = _solver_value(value, model, q, recompute=recompute)     # itself, so that higher orders see it too
    return out, filtered_jvp(recompute, (model, q), tangents[1:])[1]


def envelope_value(value, model, fixed, recompute):
    """`value`, which a fixed-point iteration computed at its converged parameters `fixed` = theta*(model), with the
    derivative of recompute(model, fixed) in the model at fixed `fixed` (the envelope rule: the value is stationary
    in them there). First derivatives only: a second one would miss d fixed / d model. The baselines' iterations
    (EP's sites, the local bound's tangent points) use it.

    Args:
        value: the iteration's value (scalar).
        model: the `Model` (with its derivatives).
        fixed: the converged parameters (a pytree; held fixed).
        recompute: (model, fixed) -> the value.

    Returns:
        Scalar: `value`, with the envelope derivative.
    """
    return _solver_value(value, model, lax.stop_gradient(fixed), recompute=recompute)


def solver_value(value, model, q, recompute):
    """`value`, which a solver computed at its optimum q = q*(model), with the derivative of recompute(model, q) in
    the model and in q (so through q's implicit derivative to every order): the envelope rule for a value the
    solver has in another form than `bound` (the site-precision solver's factorisation).

    Args:
        value: the solver's quantities at q (a pytree).
        model: the `Model` (with its derivatives).
        q: the optimum (with its implicit derivative).
        recompute: (model, q) -> the same quantities.

    Returns:
        `value`, with those derivatives.
    """
    return _solver_value(value, model, q, recompute=recompute)


def stop_gradients(tree):
    """`tree` with every inexact array behind `lax.stop_gradient`: the solvers iterate on such copies, and the
    derivatives of their results come from the envelope and implicit-function rules, never from the loops."""
    return jax.tree.map(lambda x: lax.stop_gradient(x) if eqx.is_inexact_array(x) else x, tree)


def frozen(model):
    """The gradient-free copy of `model` the solvers iterate on (`stop_gradients`), with H o H stored
    (`AbstractOperator.with_squares`): for a dense H, one more N x D array while the fit runs."""
    is_op = lambda x: isinstance(x, AbstractOperator)
    return jax.tree.map(lambda x: x.with_squares() if is_op(x) else x, stop_gradients(model), is_leaf=is_op)


def solver_mask(q):
    """The leaves of q the solvers optimise (a pytree of bools): every inexact array, less those a refinable
    factor holds fixed."""
    spec = jax.tree.map(eqx.is_inexact_array, q)
    if isinstance(q.factor, AbstractRefinableFactor):
        spec = eqx.tree_at(lambda s: s.factor, spec, q.factor.solver_mask())
    return spec


def implicit(model, q):
    """q, an optimum over its solver leaves, with their implicit-function derivative in the model (the leaves a
    refinable factor holds fixed are held fixed in the derivative too).

    Args:
        model: the `Model` (with its derivatives).
        q: the optimum `Gaussian`.

    Returns:
        q with the implicit derivative attached.
    """
    params, static = eqx.partition(q, solver_mask(q))
    flat, unravel = ravel_pytree(params)
    objective = lambda model, f, static: bound(model, eqx.combine(unravel(f), static))
    flat = implicit_maximiser(objective, model, flat, static)
    return eqx.combine(unravel(flat), stop_gradients(static))


def implicit_maximiser(objective, model, x, fixed=None):
    """x, a maximiser of objective(model, x, fixed) over the flat array x, with its implicit-function derivative
    in the model's inexact arrays (`fixed`, any pytree, is held fixed). The Hessian of the objective in x must be
    negative definite at x.

    Every array other than the model's inexact leaves enters `_implicit_optimum` as an argument, `held`, not
    through the closure `stationarity`: a traced array in a custom_jvp's non-differentiable closure leaks out of
    its trace.

    Args:
        objective: (model, x, fixed) -> scalar.
        model: the `Model` (with its derivatives).
        x: (P,) the maximiser, as a solver found it (its own derivatives are dropped).
        fixed: a pytree the objective needs and the derivative holds fixed.

    Returns:
        (P,) x with the implicit derivative attached.
    """
    dynamic, rest = eqx.partition(model, eqx.is_inexact_array)
    held, skeleton = eqx.partition((rest, stop_gradients(fixed)), eqx.is_array)

    def stationarity(dyn, held, f):
        rest, fixed = eqx.combine(held, skeleton)
        return jax.grad(lambda f: objective(eqx.combine(dyn, rest), f, fixed))(f)

    return _implicit_optimum(stationarity, dynamic, held, lax.stop_gradient(x))


def forward_mode_only(tree, message):
    """`tree`, unchanged, whose derivatives may be taken in forward mode (jax.jvp, jax.jacfwd) but not in reverse
    mode: under jax.grad, jax.vjp or jax.linearize it raises ValueError(message) instead of JAX's error about
    `lax.while_loop` inside the caller's solver loop.

    Args:
        tree: any pytree (a `Model`).
        message: the error's text (it should name jax.jacfwd).

    Returns:
        `tree`.
    """
    return _forward_mode_only(tree, message)


@eqx.filter_custom_jvp
def _forward_mode_only(tree, message):
    return tree


@_forward_mode_only.def_jvp
def _forward_mode_only_jvp(primals, tangents):
    tree, message = primals
    # Reverse mode linearises: the tangents are then partial-evaluation tracers (unknown values), never in forward
    # mode (concrete values, or jit/vmap tracers). A JAX without this class falls back to JAX's own error.
    if any(isinstance(t, _UNKNOWN_TANGENTS) for t in jax.tree_util.tree_leaves(tangents[0])):
        raise ValueError(message)
    return tree, tangents[0]


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
    solve = lambda matvec, b: conjugate_gradient(matvec, b, max_iters=10 * b.shape[0], rtol=1e-10)
    dx = lax.custom_linear_solve(neg_hessian, rhs, solve, symmetric=True)
    return x, dx
