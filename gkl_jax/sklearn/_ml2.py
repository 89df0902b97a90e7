"""ML-II of the estimators as one compiled program per fit: the outer L-BFGS loop of
`gkl_jax.gp.fit_hyperparameters` (its `HyperSolver` in `gkl_jax.solvers.iterate`: the same directions, line search
and stopping rules), the inner fits and the fitted outputs in a single call, with no eager model building around
it.

Why (issue 39, diabetes 331 x 10, warm fits on the shared 2-core machine): `fit_hyperparameters` builds and
validates the model eagerly before and after its compiled loop and the estimators then derived their outputs by
small eager operations; for the Gaussian linear model that host work took most of a warm fit. Here the whole fit
is one dispatch. The linear estimators' hyperparameters start from the data (`data_start`), and the outer loop
runs in coordinates scaled by their Fisher information (`scales`); G-KL inner fits start from the Laplace
approximation (`laplace_start`). (The Student-t and logistic models with the Full factor learn their
hyperparameters jointly with q instead, `_joint`, and come here only where that does not settle.)

`GPEvidence` is the objective of the Gaussian GP regressor: log N(z | 0, K + (noise + jitter) I) with the
gradient of Rasmussen & Williams (2006, eq. 5.9), d log p / dK = (alpha alpha^T - Ky^{-1}) / 2, by a custom VJP.
Differentiating `gkl_jax.gp.exact` instead went back through the prior's Cholesky factor and formed the
posterior factor at every evaluation, several times the cost.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np

from .._fit import fit as gk_fit
from .._linalg import diagonal
from .._program import program
from .._start import model_dtype
from .._status import RESULTS
from .._warm import fit_warm, ml2_solver, warm_fit_applies
from ..baselines._laplace import laplace_program
from ..gp._hyper_loop import OUTER_LBFGS, HyperSolver, Objective
from ..gp._hyper_loop import run as run_ml2

GTOL, FTOL = 1e-4, 1e-9
"""Outer stopping tolerances, `fit_hyperparameters`' defaults (the linear estimators' `tol` replaces GTOL); G-KL
inner fits stop at gtol / 10 as there."""


def settings(max_steps: int, max_step: float = 3.0, adaptive: bool = False, gtol: float = GTOL) -> HyperSolver:
    """L-BFGS settings of the outer loop.

    Args:
        max_steps: outer steps.
        max_step: the largest first move of a (log-)parameter in a line search.
        adaptive: loose inner tolerances while the outer gradient is large (as `gkl_jax.gp.fit_hyperparameters`).
        gtol: the outer gradient tolerance.

    Returns:
        The loop's settings (float64 tolerances).
    """
    return HyperSolver(OUTER_LBFGS, True, int(max_steps), np.asarray(gtol), np.asarray(FTOL), bool(adaptive),
                     np.asarray(max_step))


def scales(n, d, likelihood, dof):
    """The ML-II coordinates' scales c = sqrt(Fisher information) of the log-hyperparameters at their optimum, so
    that the outer L-BFGS sees a Hessian near the identity: d / 2 for the log prior variance of d coefficients;
    for the noise n / 2 (log variance, Gaussian), 2 n nu / (nu + 3) (log scale, Student-t), n (log scale, Laplace).

    In the raw log-hyperparameters the noise's curvature is ~100 times the prior variance's (diabetes, n = 331,
    d = 10): L-BFGS's initial scaling took the stiff one, and 6-7 outer steps crept along the flat log prior
    variance (0.001-0.003 per step) for 4e-4 nats. Scaled, Student-t ML-II took half the time and Laplace a fifth
    less, the same bounds to 1e-6 (design-decisions page).

    Args:
        n: real (unpadded) rows.
        d: coefficients with the learned prior variance (the intercept excluded).
        likelihood: "gaussian", "student-t", "laplace" or "logistic" (no noise: 1).
        dof: Student-t degrees of freedom.

    Returns:
        (2,) float numpy array: c of the prior variance and of the noise.
    """
    noise = {"gaussian": n / 2.0, "student-t": 2.0 * n * dof / (dof + 3.0), "laplace": float(n)}.get(likelihood, 1.0)
    return np.sqrt(np.array([max(d, 1) / 2.0, max(noise, 1.0)]))


def data_start(H, z, likelihood, intercept):
    """Data-scaled hyperparameters of the regression (ML-II starting values, or the values when not learned).

    Least squares on the standardised targets z: the prior variance is the mean squared coefficient (the
    intercept left out), the noise scale 1.4826 MAD of the residuals (robust to the outliers that the Student-t
    and Laplace likelihoods are for), squared for the Gaussian's variance; both at least 1e-3. From here ML-II reaches
    the same optimum as from (1, 0.1) in fewer steps (design-decisions page).

    Args:
        H: (n, D) design (the intercept column last when `intercept`).
        z: (n,) standardised targets.
        likelihood: "gaussian", "student-t" or "laplace".
        intercept: whether H's last column is the intercept.

    Returns:
        (prior variance, noise variance or scale), floats.
    """
    w = np.linalg.lstsq(H, z, rcond=None)[0]
    r = z - H @ w
    coef = w[:-1] if intercept else w
    prior_variance = max(float(np.mean(coef ** 2)) if coef.size else 1.0, 1e-3)
    scale = max(1.4826 * float(np.median(np.abs(r - np.median(r)))), 1e-3)
    return prior_variance, scale ** 2 if likelihood == "gaussian" else scale


class _LaplaceStart(Objective):
    """`Objective` whose first inner fit starts from the Laplace approximation N(w*, A^-1) at the starting
    hyperparameters (`gkl_jax.baselines.laplace`'s Newton iteration to a loose mode) instead of the prior."""

    def start(self, dyn):
        """The Laplace approximation of the model at the starting parameters, a Full-factor Gaussian."""
        model = self.build(eqx.combine(dyn, self.static))
        return laplace_start(model)


LAPLACE_TOL, LAPLACE_STEPS = 1e-4, 25
"""Newton's method of the Laplace start: a start needs no more than a loose mode."""


def laplace_start(model):
    """The Laplace approximation N(w*, A^-1) of `model` (w* to max|grad| <= LAPLACE_TOL), the start of the
    estimators' G-KL fits with the Full factor (non-log-concave sites: the Newton iteration's clipped curvature).
    Breast cancer (448 x 32 padded): Newton-CG took 8 steps from there instead of 13 from the prior. Student-t
    ML-II on diabetes with outliers (4 splits): the first inner fit 1 step instead of 9-18, and with the loose
    early inner tolerances of `settings(adaptive=True)` 27-33 inner Newton steps in all instead of 56-73.

    Args:
        model: the `gkl_jax.Model`.

    Returns:
        A `gkl_jax.Gaussian` with a Full factor.
    """
    return laplace_program(model, jnp.asarray(LAPLACE_TOL, model_dtype(model)), LAPLACE_STEPS).q


def linear_objective(build, method, kwargs, learn, params, start_at_laplace=False, gtol=GTOL):
    """The ML-II objective of `method(build(params))` over the leaves of `params` selected by `learn`.

    Args:
        build: params -> `gkl_jax.Model` (an `eqx.Module` holding the data).
        method: `gkl_jax.fit` or `gkl_jax.gp.exact`.
        kwargs: static options of the method.
        learn: dict of bools, the keys of `params`.
        params: dict of float64 scalars (starting values).
        start_at_laplace: the first inner fit (a G-KL fit with the Full factor) starts from `laplace_start`.
        gtol: the outer loop's gradient tolerance; G-KL's inner fits stop at gtol / 10.

    Returns:
        (objective, dyn: the learned leaves, static: the others, dynamic_kwargs: the inner tolerance of G-KL).
    """
    dyn, static = eqx.partition(params, learn)
    dynamic = {"tol": np.asarray(0.1 * gtol)} if method is gk_fit and "tol" not in kwargs else {}
    objective = _LaplaceStart if start_at_laplace else Objective
    return objective(build, method, dict(kwargs), method is gk_fit, static, False, True), dyn, static, dynamic


def gp_objective(build, learn, params, model, gtol=GTOL):
    """The ML-II objective of G-KL on `build(params)` as `gkl_jax.gp.fit_hyperparameters` sets it up by default:
    inner fits warm-started at the last optimum, by `fit_warm` (site precisions, the Full factor not formed) where
    `warm_fit_applies` to the model's default ML-II solver, else by `gkl_jax.fit`; inner tolerance gtol / 10.

    Args:
        build: params -> `gkl_jax.Model` (an `eqx.Module` holding the data).
        learn: dict of bools, the keys of `params`.
        params: the starting parameters (float64 leaves).
        model: `build(params)` or its abstract evaluation (`eqx.filter_eval_shape`): only its structure is read.
        gtol: the outer loop's gradient tolerance.

    Returns:
        (objective, dyn: the learned leaves, static: the others, dynamic_kwargs, warm: whether the inner fits are
        `fit_warm`'s, whose results `gkl_jax._warm.warm_result` turns into a `Result`).
    """
    dyn, static = eqx.partition(params, learn)
    warm = warm_fit_applies(model, ml2_solver(model))
    method = fit_warm if warm else gk_fit
    objective = Objective(build, method, {}, True, static, False, True)
    return objective, dyn, static, {"tol": np.asarray(0.1 * gtol)}, warm


def run_and_finish(objective, config: HyperSolver, dyn, dynamic_kwargs, finish, progress=None):
    """One ML-II run and the fitted outputs (compiled as one program by `run`).

    Args:
        objective: an `Objective`-like module: `start(dyn)`, `__call__(dyn, q, dynamic_kwargs)` ->
            (-log_z, gradient, result with `converged`), `jit = True`.
        config: `settings(...)`.
        dyn: the starting values of the learned parameters.
        dynamic_kwargs: array options of the inner method.
        finish: (dyn at the end, the inner result there) -> any pytree of outputs.
        progress: None, or a callable receiving a `gkl_jax.solvers.ProgressInfo` after each accepted outer step
            (static: a new callable compiles the program anew).

    Returns:
        (finish's outputs, converged: bool array, accepted outer steps: int array, -1 where the objective was
        not finite at the starting parameters).
    """
    solution, state = run_ml2(objective, config, dyn, dynamic_kwargs, progress)
    steps = jnp.where(solution.status == RESULTS.nonfinite, -1, solution.num_steps)
    return finish(solution.x, state.res), solution.converged, steps


run = program(run_and_finish)
"""`run_and_finish` compiled as one program."""


@jax.custom_vjp
def gaussian_log_density(K, z):
    """log N(z | 0, K).

    Args:
        K: (n, n) positive-definite float array.
        z: (n,) float array.

    Returns:
        float scalar; its VJP is the closed form (alpha alpha^T - K^{-1}) / 2 in K, -alpha in z (alpha = K^{-1} z).
    """
    return _log_density_fwd(K, z)[0]


def _log_density_fwd(K, z):
    L = jnp.linalg.cholesky(K)
    alpha = jsl.cho_solve((L, True), z)
    value = -0.5 * (z @ alpha) - jnp.sum(jnp.log(diagonal(L))) - 0.5 * z.shape[0] * jnp.log(2 * jnp.pi)
    return value, (L, alpha)


def _log_density_bwd(residual, g):
    L, alpha = residual
    K_inv = jsl.cho_solve((L, True), jnp.eye(L.shape[0], dtype=L.dtype))
    return 0.5 * g * (jnp.outer(alpha, alpha) - K_inv), -g * alpha


gaussian_log_density.defvjp(_log_density_fwd, _log_density_bwd)


class _Evidence(eqx.Module):
    log_z: jax.Array
    converged: jax.Array


class GPEvidence(eqx.Module):
    """The ML-II objective of GP regression with a Gaussian likelihood: params {"kernel", "log_noise"} ->
    -log N(z | 0, K(X, X) + (exp(log_noise) + jitter) I), the log marginal likelihood of `gkl_jax.gp.exact` on
    `gkl_jax.gp.model(kernel, X, Gaussian(z, noise), jitter=jitter)`, and its gradient (see the module doc). With
    `mask`, the rows where it is False are padding (`_gp_model`) and contribute nothing."""

    X: jax.Array
    z: jax.Array
    static: object
    jitter: float = eqx.field(static=True)
    jit: bool = eqx.field(static=True, default=True)
    mask: object = None     # (n,) bool, True on real rows; padded rows (z = 0) are independent N(0, 1) values

    def start(self, dyn):
        """No inner warm start (the evidence is closed form)."""
        return None

    def log_evidence(self, dyn):
        """log p(z | X) at the parameters `dyn` (combined with the fixed ones)."""
        p = eqx.combine(dyn, self.static)
        K = p["kernel"].gram(self.X)
        K = K + (jnp.exp(p["log_noise"]) + self.jitter) * jnp.eye(K.shape[0], dtype=K.dtype)
        if self.mask is None:
            return gaussian_log_density(K, self.z)
        real = self.mask[:, None] & self.mask[None, :]         # padded rows: the identity, log N(0 | 0, 1) each
        K = jnp.where(real, K, 0.0) + jnp.diag(jnp.where(self.mask, 0.0, 1.0).astype(K.dtype))
        padding = -0.5 * jnp.sum(~self.mask) * jnp.log(2 * jnp.pi)
        return gaussian_log_density(K, jnp.where(self.mask, self.z, 0.0)) - padding

    def __call__(self, dyn, q, dynamic_kwargs):
        """(-log p(z | X), its gradient in dyn, a result holding log_z and whether it is finite)."""
        value, grad = jax.value_and_grad(lambda d: -self.log_evidence(d))(dyn)
        return value, grad, _Evidence(-value, jnp.isfinite(value))
