"""`to_inference_data`: a fitted Gaussian posterior as ArviZ `InferenceData` (optional extra:
pip install 'gkl-jax[arviz]'), so that ArviZ's summaries and plots (`az.summary`, `az.plot_posterior`,
`az.plot_forest`) work on G-KL fits as on NumPyro's and PyMC's samples.

The draws are independent samples of q(w) = N(m, S) (Challis & Barber 2013), split into chains as ArviZ expects:
no autocorrelation, so ArviZ's effective sample size is about the number of draws and R-hat about 1 by
construction; they describe q, not a sampler's convergence.
"""

from collections.abc import Sequence
from typing import Any

import numpy as np
from jaxtyping import ArrayLike, Float

from ._arviz_gp import GP_ESTIMATORS, coordinate_names, draws_from_moments, gp_draws
from ._result import Result
from ._validate import check_int


def _arviz():
    try:
        import arviz
    except ImportError as err:  # pragma: no cover - exercised without arviz installed
        raise ImportError("gkl_jax.to_inference_data needs ArviZ, an optional dependency: "
                          "pip install 'gkl-jax[arviz]' (or pip install arviz)") from err
    return arviz


def to_inference_data(obj: Any, *, num_draws: int = 1000, num_chains: int = 4, seed: int = 0,
                      names: Sequence[Any] | None = None, X: Float[ArrayLike, "n d"] | None = None) -> Any:
    """Posterior draws from a fitted Gaussian as `arviz.InferenceData` with named coordinates.

    Args:
        obj: a `gkl_jax.Result` (variable "w" over the dimension "weight"), a fitted
            `gkl_jax.sklearn.BayesianRegression` / `BayesianLogisticRegression` (variables "coef" over "feature",
            and "intercept" where fitted; one-vs-rest classifiers add the dimension "class"), or a fitted
            `gkl_jax.sklearn.GPClassifier` / `GPRegressor` (variable "f", the latent function at the rows of X,
            over the dimension "input"; drawn jointly from the posterior process, in the targets' units for the
            regressor; one-vs-rest classifiers add "class").
        X: for a GP estimator, the (n, d) inputs at which to draw the latent function (n <= 5000: the draws are
            joint, from an n x n covariance); must be None otherwise.
        num_draws: the number of draws per chain (int >= 1).
        num_chains: the number of chains (int >= 1; ArviZ's R-hat needs 2 or more).
        seed: the random seed (int >= 0).
        names: the coordinate names: one per weight of a Result (default 0, 1, ...), one per feature of a
            linear estimator (default its `feature_names_in_`, else x0, x1, ...), one per row of X for a GP
            estimator (default 0, 1, ...).

    Returns:
        `arviz.InferenceData` with a `posterior` group (`num_chains` chains of `num_draws` draws) and the fit's
        scalars (`log_z` or `log_evidence`, `converged`, ...) as the group's attributes.

    Raises:
        ValueError: obj of another type or not fitted, num_draws, num_chains or seed out of range, names of the
            wrong length, X missing for a GP estimator (or given for another object), of the wrong width or with
            more than 5000 rows.
        ImportError: ArviZ is not installed.
    """
    num_draws = check_int(num_draws, "num_draws", 1)
    num_chains = check_int(num_chains, "num_chains", 1)
    seed = check_int(seed, "seed")
    total = num_draws * num_chains
    if _is_estimator(obj, GP_ESTIMATORS):
        posterior, dims, coords, attrs = gp_draws(obj, X, total, seed, names)
    elif X is not None:
        raise ValueError("X is for GP estimators only (the inputs at which to draw the latent function); "
                         f"got X with a {type(obj).__name__}")
    elif isinstance(obj, Result):
        posterior, dims, coords, attrs = _result_draws(obj, total, seed, names)
    else:
        posterior, dims, coords, attrs = _estimator_draws(obj, total, seed, names)
    az = _arviz()
    chains = {k: v.reshape((num_chains, num_draws) + v.shape[1:]) for k, v in posterior.items()}
    return az.from_dict(posterior=chains, dims=dims, coords=coords, posterior_attrs=attrs)


def _is_estimator(obj, kinds) -> bool:
    return type(obj).__name__ in kinds and type(obj).__module__.startswith("gkl_jax.sklearn")


def _result_draws(result, num_draws, seed, names):
    import jax

    draws = np.asarray(result.q.sample(jax.random.key(seed), num_draws))
    coords = {"weight": coordinate_names(names, range(result.q.dim), "weight")}
    attrs = {"log_z": float(result.log_z), "converged": int(bool(result.converged)), "method": result.method,
             "is_bound": int(result.is_bound), "inference_library": "gkl_jax"}
    return {"w": draws}, {"w": ["weight"]}, coords, attrs


def _estimator_draws(est, num_draws, seed, names):
    kind = type(est).__name__
    if not _is_estimator(est, ("BayesianRegression", "BayesianLogisticRegression")):
        raise ValueError("to_inference_data takes a gkl_jax.Result or a fitted gkl_jax.sklearn BayesianRegression, "
                         f"BayesianLogisticRegression, GPClassifier or GPRegressor, got {kind} (for gkl_jax.fit's "
                         "result, pass the Result; for the multiclass GP, save its predictions)")
    if not hasattr(est, "covariance_"):
        raise ValueError(f"to_inference_data: the {kind} is not fitted (call fit first)")
    d = est.n_features_in_
    default = getattr(est, "feature_names_in_", None)
    features = coordinate_names(names, default if default is not None else [f"x{j}" for j in range(d)], "feature")
    coef = np.atleast_2d(est.coef_)
    intercept = np.atleast_1d(est.intercept_)
    cov = est.covariance_.reshape((-1,) + est.covariance_.shape[-2:])
    rng = np.random.default_rng(seed)
    draws = np.stack([draws_from_moments(rng, np.append(c, b)[: cov.shape[-1]], S, num_draws)
                      for c, b, S in zip(coef, intercept, cov)], axis=1)       # (draws, problems, d (+1))
    one = draws.shape[1] == 1
    posterior = {"coef": draws[:, 0, :d] if one else draws[:, :, :d]}
    dims = {"coef": ["feature"] if one else ["class", "feature"]}
    coords = {"feature": features}
    if not one:
        coords["class"] = [str(c) for c in est.classes_]
    if est.fit_intercept:
        posterior["intercept"] = draws[:, 0, d] if one else draws[:, :, d]
        dims["intercept"] = [] if one else ["class"]
    attrs = {"converged": int(bool(est.converged_)), "inference_library": "gkl_jax", "estimator": kind}
    for name in ("log_evidence_", "prior_variance_", "noise_"):
        value = getattr(est, name, None)
        if value is not None and np.ndim(value) == 0:
            attrs[name.rstrip("_")] = float(value)
    return posterior, dims, coords, attrs
