"""The block-coordinate ascent of log Z_h (Chai 2012, eq. 21; the sparse log Z~_h of eq. 32) on the package's one
loop, `gkl_jax.solvers.iterate`: the sweeps as an `AbstractIterativeSolver`.

A sweep is up to `max_rounds` (b, S) rounds (b with the tied mean by Newton, eq. 65; the S_i by eq. 61) and then one
V step (through the site precisions W, eq. 28). Each round and each V step is one iteration of the loop (a
`lax.cond` picks which), so the compiled program holds one copy of each block update and no loop of its own; only
the V step concludes a sweep (`Step.advance`) and writes the history. The dense solver takes another round while
the last one gained more than the last V step did (`_sweep.BS_ROUNDS`); without a `rounds` update (the sparse
solver) every iteration is a whole sweep.

Stopping test: a sweep raised the bound by at most tol (1 + |log Z_h|) (the ascent is monotone, so a smaller rise
means the blocks are stationary to that tolerance); the driver adds the step limit and a non-finite bound.
"""

from typing import Any, Callable, Optional

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax

from ..solvers import AbstractIterativeSolver, Step, iterate


class AscentProblem(eqx.Module):
    """The block updates of one ascent, as the solver's methods read them (closures over the prior and labels).

    Attributes:
        st0: the starting state (an Equinox module with a scalar `value`; with `rounds`, also `v_gain`).
        sweep: (state, value before the sweep) -> state: the V step (with `rounds`), or a whole sweep (without).
        rounds: state -> state, one (b, S) round, or None (every iteration is a `sweep`).
        max_rounds: the most (b, S) rounds per sweep (static).
        progress: None, or the callable receiving a `gkl_jax.solvers.ProgressInfo` after each sweep (static).
    """

    st0: Any
    sweep: Callable = eqx.field(static=True)
    rounds: Optional[Callable] = eqx.field(static=True, default=None)
    max_rounds: int = eqx.field(static=True, default=0)
    progress: Optional[Callable] = eqx.field(static=True, default=None)


class AscentState(eqx.Module):
    """The loop's state: the solver's iterate `st` (with a scalar `value`), the bound before the current sweep,
    the (b, S) rounds taken in it and what the last one gained."""

    st: Any
    prev: jax.Array
    rounds: jax.Array
    gain: jax.Array


def _settled(value, prev, tol):
    return (value - prev <= tol * (1 + jnp.abs(value))) & jnp.isfinite(value)


class BlockAscent(AbstractIterativeSolver):
    """Monotone block-coordinate ascent over the sweeps of an `AscentProblem` (module doc), run by `iterate` from
    the problem's `st0` (the App. E.3 state or a warm start, evaluated before the loop)."""

    start_in_loop = False

    def init(self, problem, tol, max_steps):
        st0 = problem.st0
        dtype = st0.value.dtype
        inf = jnp.asarray(jnp.inf, dtype)
        return AscentState(st0, -inf, jnp.zeros((), jnp.int32), inf), st0.value

    def _in_rounds(self, problem, state):
        if problem.rounds is None:
            return jnp.asarray(False)
        more = state.rounds < problem.max_rounds
        if problem.max_rounds > 1:
            more = more & ((state.rounds == 0) | (state.gain > state.st.v_gain))
        return more

    def step(self, problem, state, tol):
        inf = jnp.asarray(jnp.inf, state.st.value.dtype)
        zero = jnp.zeros((), jnp.int32)

        def round_(s):
            new = problem.rounds(s.st)
            prev = jnp.where(s.rounds == 0, s.st.value, s.prev)   # a new sweep starts with its first round
            return AscentState(new, prev, s.rounds + 1, new.value - s.st.value)

        def sweep(s):
            prev = s.st.value if problem.rounds is None else s.prev
            return AscentState(problem.sweep(s.st, prev), prev, zero, inf)

        in_rounds = self._in_rounds(problem, state)
        new = sweep(state) if problem.rounds is None else lax.cond(in_rounds, round_, sweep, state)
        value = new.st.value
        statistic = (value - new.prev) / (1 + jnp.abs(value))
        return new, Step(value, ~in_rounds, ~in_rounds, statistic)

    def terminate(self, problem, state, tol):
        return (state.rounds == 0) & _settled(state.st.value, state.prev, tol), jnp.asarray(False)

    def point(self, state):
        return state.st


def ascend(st0, tol, max_steps, sweep, rounds=None, max_rounds=0, progress=None):
    """Sweep from the state `st0` until a sweep raises the bound by at most tol (1 + |value|), the bound stops being
    finite, or after `max_steps` sweeps: the outer loop of the full and the sparse block-coordinate ascents, in
    `gkl_jax.solvers.iterate`.

    Args:
        st0: the starting state (`AscentProblem`).
        tol: relative tolerance on the rise of the bound per sweep (scalar array).
        max_steps: the most sweeps (int).
        sweep, rounds, max_rounds, progress: as `AscentProblem`.

    Returns:
        (state, `gkl_jax.solvers.Solution`): the final state and the loop's solution (num_steps the sweeps,
        history[k] the bound after sweep k, NaN past the last; status a `RESULTS` code; x the final state).
    """
    problem = AscentProblem(st0, sweep, rounds, max_rounds, progress)
    solution, state = iterate(BlockAscent(), problem, tol, max_steps, progress=progress, postprocess=False)
    return state.st, solution
