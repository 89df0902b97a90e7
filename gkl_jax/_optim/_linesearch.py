"""The backtracking line search every solver uses (Nocedal & Wright 2006, Alg. 3.1), with the acceptance test
left to the caller (Armijo, or "does not decrease beyond round-off")."""

import jax.numpy as jnp
from jax import lax


def backtrack(trial, accept, init, *, dtype, max_halvings, skip=False):
    """The first step t in {1, 1/2, 1/4, ...} (at most `max_halvings` halvings) that `accept`s.

    The trial at t = 1 is made inside the loop, so `trial` has a single call site in the compiled program (one
    copy of the objective, however large).

    Args:
        trial: t -> aux, the quantities at step t (a pytree, e.g. the objective value and what the caller reuses
            from that evaluation).
        accept: (t, aux) -> bool scalar, whether step t is acceptable.
        init: a pytree with the structure, shapes and dtypes of `trial`'s output (the loop's initial carry; it is
            returned as aux when `skip`).
        dtype: the floating dtype of t.
        max_halvings: the most halvings after the first trial (int).
        skip: a traced bool: when True nothing is evaluated and (1, init, True) is returned.

    Returns:
        (t, aux, ok): the last step tried, `trial(t)` there, and whether it was accepted (True when skipped).
    """
    skip = jnp.asarray(skip, bool)

    def cond(state):
        t, aux, k = state
        return ~skip & ((k == 0) | (~accept(t, aux) & (k <= max_halvings)))

    def body(state):
        t, _, k = state
        t = jnp.where(k == 0, t, 0.5 * t)
        return t, trial(t), k + 1

    t, aux, _ = lax.while_loop(cond, body, (jnp.ones((), dtype), init, 0))
    return t, aux, skip | accept(t, aux)

