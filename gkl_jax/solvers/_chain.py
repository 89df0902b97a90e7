"""Solvers run one after another: a cheap global phase, then a fast local one."""

import equinox as eqx
import jax.numpy as jnp

from ._base import AbstractSolver, Problem, Solution
from ._iterate import append_history, new_history


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
        x, total, history = problem.x0, jnp.zeros((), jnp.int32), None
        solution = None
        for i, stage in enumerate(self.stages):
            last = i == len(self.stages) - 1
            stage_tol = jnp.asarray(stage.tol, tol.dtype) if stage.tol is not None else (tol if last else loose)
            stage_steps = stage.max_steps or type(stage).default_max_steps
            stage_problem = eqx.tree_at(lambda p: p.q0, problem, problem.to_q(x))
            solution = stage.solve(stage_problem, stage_tol, stage_steps)
            if history is None:     # the first stage's start is the chain's
                history = new_history(max_steps, solution.history[0])
            history = append_history(history, solution.history, total)
            x, total = solution.x, total + solution.num_steps
        assert solution is not None and history is not None     # stages is non-empty (__check_init__)
        # each stage runs its own loop (`iterate`): the chain itself has none
        return Solution(x, total, solution.converged, history, solution.status, solution.extras, solution.value)

    def log_z(self, model, q, solution: Solution):
        """The last stage's bound at the solution (its `log_z`)."""
        return self.stages[-1].log_z(model, q, solution)

