"""Solvers run one after another: a cheap global phase, then a fast local one."""

import equinox as eqx
import jax.numpy as jnp

from ._base import AbstractSolver, Problem, Solution


class Chain(AbstractSolver):
    """Run `stages` in order, each from where the previous one stopped. A stage with its own `tol` stops there;
    otherwise every stage but the last stops at the looser tolerance sqrt(tol) (for tol < 1) and the last at
    `tol`. Each stage takes its own `max_steps` (or its default). The default for non-log-concave sites under a
    GP or dense prior is `Chain((LBFGS(tol=1e-2), Newton()))` in the whitened basis: L-BFGS crosses the non-concave
    region cheaply, Newton-CG then converges fast (a robust regression grid, benchmarks/robust_defaults.py).

    Attributes:
        stages: a tuple of solvers (at least one).
        tol: gradient tolerance of the last stage (None: the dtype's default).
        max_steps: unused (each stage has its own); kept for the common interface.
    """

    stages: tuple = ()

    def __init__(self, stages, *, tol=None, max_steps=None):
        self.stages = tuple(stages)
        self.tol = tol
        self.max_steps = max_steps

    def __check_init__(self):
        if not self.stages or not all(isinstance(s, AbstractSolver) for s in self.stages):
            raise ValueError(f"Chain: stages must be a non-empty sequence of solvers, got {self.stages!r}")

    @property
    def default_max_steps(self):
        return sum(s.max_steps or type(s).default_max_steps for s in self.stages)

    def check(self, model, factor) -> None:
        for stage in self.stages:
            stage.check(model, factor)

    def solve(self, problem: Problem, tol, max_steps: int) -> Solution:
        loose = jnp.maximum(tol, jnp.sqrt(tol))
        x, total, history, filled = problem.x0, jnp.zeros((), jnp.int32), None, jnp.zeros((), jnp.int32)
        history = jnp.full((max_steps + 1,), jnp.nan, dtype=x.dtype)
        solution = None
        for i, stage in enumerate(self.stages):
            last = i == len(self.stages) - 1
            stage_tol = jnp.asarray(stage.tol, tol.dtype) if stage.tol is not None else (tol if last else loose)
            stage_steps = stage.max_steps or type(stage).default_max_steps
            stage_problem = eqx.tree_at(lambda p: p.q0, problem, problem.to_q(x))
            solution = stage.solve(stage_problem, stage_tol, stage_steps)
            history = _append(history, solution.history, filled, first=i == 0)
            filled = filled + solution.num_steps + (1 if i == 0 else 0)
            x, total = solution.x, total + solution.num_steps
        assert solution is not None     # stages is non-empty (__check_init__)
        # each stage runs its own loop (`iterate`): the chain itself has none
        return Solution(x, total, solution.converged, history, solution.status, solution.extras, solution.value)

    def log_z(self, model, q, solution: Solution):
        """The last stage's bound at the solution (its `log_z`)."""
        return self.stages[-1].log_z(model, q, solution)


def _append(history, part, filled, first):
    """history with `part` written from position `filled` (part[0], the stage's starting value, is skipped
    after the first stage)."""
    idx = jnp.arange(history.shape[0])
    offset = 0 if first else 1
    source = jnp.clip(idx - filled + offset, 0, part.shape[0] - 1)
    take = (idx >= filled) & (idx - filled + offset < part.shape[0])
    return jnp.where(take & ~jnp.isnan(part[source]), part[source], history)
