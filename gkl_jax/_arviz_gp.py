"""Joint posterior draws of a fitted GP estimator's latent function, and the coordinate and sampling helpers of
`gkl_jax.to_inference_data` (internal API).

For a G-KL fit q(f) = N(m, S) over the latent values at the training inputs X (or q(u) over the inducing values
at Z for a sparse fit), the latent function at new inputs X* is Gaussian with (Rasmussen & Williams 2006,
eq. 3.21-3.24; Challis & Barber 2013, App. F.1)

    mean  mu* + A^T (m - mu),        covariance  K** - K*x A + A^T S A,        A = K^{-1} K_x*,

the joint form of the marginals `gkl_jax.gp.predict` reports.
"""

import numpy as np

MAX_JOINT_ROWS = 5000
"""The largest number of inputs X at which joint draws are taken (an n x n covariance and its eigendecomposition)."""

GP_ESTIMATORS = ("GPClassifier", "GPRegressor")
"""The scikit-learn-style GP estimators whose latent function `to_inference_data` draws."""


def coordinate_names(names, default, what):
    """The coordinate names: `default` (a sequence) when names is None, else names as strings.

    Args:
        names: None or a sequence of names.
        default: the default names (one per coordinate).
        what: what one coordinate is, for the error message.

    Returns:
        list of str.

    Raises:
        ValueError: names of another length than default, or repeated names.
    """
    if names is None:
        return list(default)
    names = [str(n) for n in names]
    if len(names) != len(default):
        raise ValueError(f"names must hold one name per {what} ({len(default)}), got {len(names)}")
    if len(set(names)) != len(names):
        raise ValueError("names must be distinct")
    return names


def draws_from_moments(rng, mean, cov, num_draws):
    """num_draws samples of N(mean, cov) for a symmetric positive semi-definite cov (eigendecomposition, so a
    singular cov, e.g. a plug-in intercept's or a GP's at repeated inputs, is fine).

    Args:
        rng: a `numpy.random.Generator`.
        mean: (d,) array.
        cov: (d, d) symmetric positive semi-definite array.
        num_draws: the number of draws.

    Returns:
        (num_draws, d) array.
    """
    cov = 0.5 * (cov + cov.T)
    vals, vecs = np.linalg.eigh(cov)
    root = vecs * np.sqrt(np.clip(vals, 0.0, None))
    return mean + rng.standard_normal((num_draws, mean.shape[0])) @ root.T


def latent_moments(result, prior, X):
    """The joint posterior mean and covariance of the latent function at the rows of X.

    Args:
        result: the fitted `gkl_jax.Result` over the prior's inputs.
        prior: the `gkl_jax.priors.GP` of the fit (training inputs, or inducing inputs for a sparse fit).
        X: (n, d) float64 array.

    Returns:
        ((n,) mean, (n, n) covariance) as numpy arrays.
    """
    import jax
    import jax.numpy as jnp

    with jax.enable_x64(True):
        q = result.q
        Xj = jnp.asarray(X, jnp.float64)
        K_xs = prior.cross_covariance(Xj)                       # (n_train, n)
        A = prior.solve(K_xs)                                   # K^{-1} K_x*
        if prior.constant_mean is None:
            raise ValueError("to_inference_data: the GP prior has a per-input mean; draws need a constant mean")
        mean = prior.constant_mean + A.T @ (q.mean - prior.mean)
        cov = prior.kernel.gram(Xj) - K_xs.T @ A + A.T @ q.covariance() @ A
        return np.asarray(mean, np.float64), np.asarray(cov, np.float64)


def gp_draws(est, X, num_draws, seed, names):
    """Joint draws of a fitted GP estimator's latent function at the rows of X (`to_inference_data`).

    Args:
        est: a fitted `gkl_jax.sklearn.GPClassifier` or `GPRegressor`.
        X: (n, n_features_in_) array-like, n <= `MAX_JOINT_ROWS`.
        num_draws: the total number of draws.
        seed: the random seed.
        names: None or one name per row of X.

    Returns:
        (posterior dict, dims dict, coords dict, attrs dict) for `arviz.from_dict`.

    Raises:
        ValueError: an unfitted estimator, X missing, of the wrong width or with too many rows.
    """
    kind = type(est).__name__
    fits = getattr(est, "_fits", None) or ([est._fit] if hasattr(est, "_fit") else None)
    if not fits or not hasattr(est, "n_features_in_"):
        raise ValueError(f"to_inference_data: the {kind} is not fitted (call fit first)")
    if X is None:
        raise ValueError(f"to_inference_data: X is required for a {kind}: the (n, {est.n_features_in_}) inputs at "
                         "which to draw the latent function")
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != est.n_features_in_ or X.shape[0] < 1:
        raise ValueError(f"to_inference_data: X must have shape (n, {est.n_features_in_}) with n >= 1, "
                         f"got {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError("to_inference_data: X must be finite")
    if X.shape[0] > MAX_JOINT_ROWS:
        raise ValueError(f"to_inference_data: X has {X.shape[0]} rows, more than {MAX_JOINT_ROWS} (the draws are "
                         "joint, from an n x n covariance): pass fewer rows of X")
    inputs = coordinate_names(names, range(X.shape[0]), "row of X")
    rng = np.random.default_rng(seed)
    shift, scale = getattr(est, "_y_shift", 0.0), getattr(est, "_y_scale", 1.0)
    draws = []
    for result, prior in fits:
        mean, cov = latent_moments(result, prior, X)
        draws.append(shift + scale * draws_from_moments(rng, mean, cov, num_draws))
    one = len(draws) == 1
    posterior = {"f": draws[0] if one else np.stack(draws, axis=1)}
    dims = {"f": ["input"] if one else ["class", "input"]}
    coords = {"input": inputs}
    if not one:
        coords["class"] = [str(c) for c in est.classes_]
    attrs = {"converged": int(bool(est.converged_)), "inference_library": "gkl_jax", "estimator": kind}
    evidence = getattr(est, "log_evidence_", None)
    if evidence is not None and np.ndim(evidence) == 0:
        attrs["log_evidence"] = float(evidence)
    return posterior, dims, coords, attrs
