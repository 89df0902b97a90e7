"""ML-II of the GP estimators' G-KL models (classification, robust regression) as one compiled program per size
bucket: the outer L-BFGS loop of `gkl_jax.gp.fit_hyperparameters` with its default settings (`_ml2.gp_objective`,
`_ml2.settings`), the fitted `Result` and the prior for predictions in a single call (`_ml2.run` with `_Finish`).

Why (issue 61): a user's first fit waits for every program it compiles. Through `fit_hyperparameters` a dense
GP classifier's first fit compiled five programs besides the loop: the model built eagerly before the loop (its
padded Gram matrix and validated Cholesky factor), the `Result` formed after it, and the prior built again for the
predictions (once more, as JAX keys its compilations on the matmul-precision context that `fit_hyperparameters`
sets). Here nothing is computed outside the one program: the model's structure, which decides the inner solver,
is read from its abstract evaluation (`eqx.filter_eval_shape`, traced, not compiled).
"""

import contextlib

import equinox as eqx
import jax
import numpy as np

from .._linalg import flat_linalg, full_precision
from .._program import program
from .._progress import resolve_progress
from .._warm import warm_result
from . import _ml2 as ml2

QUICK_COMPILE = {"xla_backend_optimization_level": 0}
QUICK_COMPILE_MAX_ROWS = 512
"""Up to this many padded training rows the program is compiled with LLVM's optimisation level 0 on the CPU
(`gkl_jax._program.program`'s options): there compilation is most of a first fit. The dense classifier's program
(synthetic 2-D problem, single-threaded, ratios in one sitting on a loaded machine): at 512 rows it compiled in
0.30 of the time (2.1 s instead of 6.9 s) and ran 1.45x as long (1.08 s instead of 0.74 s), the first fit 4.2 s
instead of 12.9 s. At 1024 rows it compiled in 0.28 of the time and ran 1.2x as long, but the five folds of
`cross_val_score` (832 rows) then cost 2.16 first fits (1.37 before): the run time, paid once per fold, is the
larger part there, so larger buckets keep the default level. The arithmetic is the same IEEE arithmetic (no
fast-math). These programs are also traced under `_linalg.flat_linalg` (unblocked triangular solves and
inverses), which shortens both their compilation and their run at level 0 (design-decisions page)."""

_run_quick = program(ml2.run_and_finish, cpu_options=QUICK_COMPILE)


class _Finish(eqx.Module):
    """(learned leaves, the last accepted inner result) -> (Result, the prior of build(params), learned leaves),
    inside the compiled ML-II."""

    build: eqx.Module
    static: dict
    warm: bool = eqx.field(static=True)

    def __call__(self, dyn, res):
        model = self.build(eqx.combine(dyn, self.static))
        return (warm_result(model, res) if self.warm else res), model.prior, dyn


@full_precision
def fit_gkl_ml2(build, params, learn, max_steps, rows, progress=False):
    """ML-II of G-KL on `build(params)` over the leaves selected by `learn`, as `gkl_jax.gp.fit_hyperparameters`
    with its default settings (the same iterations and optimum), in one compiled program.

    Args:
        build: params -> `gkl_jax.Model`, an `eqx.Module` holding the (padded) data, so that every data set of
            the same shapes reuses the compiled program.
        params: dict of starting hyperparameters (kernels, arrays).
        learn: dict of bools, the same keys, at least one True.
        max_steps: outer ML-II steps.
        rows: the padded training rows (which compiler options, `QUICK_COMPILE_MAX_ROWS`).
        progress: False, or True for a line per accepted outer step on stderr (a second compiled program the first
            time it is on).

    Returns:
        (Result, the prior of build(params) at the end, params at the end, converged: the ML-II stopping rule and
        the last inner fit both met).

    Raises:
        FloatingPointError: the bound is not finite at the starting parameters (as `fit_hyperparameters`).
    """
    params = jax.tree.map(lambda a: np.asarray(a, np.float64) if eqx.is_inexact_array(a) else a, params)
    objective, dyn, static, dynamic, warm = ml2.gp_objective(build, learn, params,
                                                             eqx.filter_eval_shape(build, params))
    quick = rows <= QUICK_COMPILE_MAX_ROWS
    callback = resolve_progress(progress, "gkl_jax.sklearn ML-II")
    with flat_linalg() if quick else contextlib.nullcontext():
        (result, prior, dyn), converged, steps = (_run_quick if quick else ml2.run)(
            objective, ml2.settings(max_steps, adaptive=warm), dyn, dynamic, _Finish(build, static, warm), callback)
    if int(steps) < 0:
        raise FloatingPointError("the G-KL bound is not finite at the starting hyperparameters")
    return result, prior, eqx.combine(dyn, static), bool(converged) and bool(result.converged)
