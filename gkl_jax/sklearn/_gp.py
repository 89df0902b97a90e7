"""Gaussian-process estimators on `gkl_jax.gp`: binary classification, (robust) regression, and the multinomial
GP classifier of `gkl_jax.multiclass` (Chai 2012) behind one import.

- `GPClassifier`: f ~ GP(0, k), p(y_n | f_n) logistic or probit; the G-KL posterior over the latent values and the
  kernel hyperparameters by ML-II on the bound (`gkl_jax.gp.fit_hyperparameters`, envelope gradients; Challis &
  Barber 2013, Section 6.1.3). predict_proba is the predictive integral E[sigmoid(f_*)] under the latent
  predictive N(mu_*, s_*^2) (`gkl_jax.gp.predict`). More than two classes: one-vs-rest, as scikit-learn's
  GaussianProcessClassifier; `MulticlassGPClassifier` is the joint multinomial model.
- `GPRegressor`: Gaussian (exact inference, the exact evidence), Student-t or Laplace (G-KL, robust) likelihood;
  the kernel and the noise by ML-II (Gaussian: the closed-form evidence and gradient in one compiled program,
  `_ml2.GPEvidence`; ML-II starts at the median input distance, `median_distance`; Student-t: from the robust
  scale of the Gaussian fit, in Fisher-scaled coordinates, `_gp_start`); the targets are standardised inside
  `fit` (as scikit-learn's normalize_y=True) and every output is in the original units.

Each distinct training-set size compiles its own fit (seconds on a small CPU); the compiled fit is reused for
every later fit of that size (cross-validation folds of equal size, refits).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin

from .. import potentials as P
from .._fit import fit as gk_fit
from ..gp import exact as gp_exact
from ..gp import model as gp_model
from ..gp import predict as gp_predict
from ..gp._predict import with_targets
from ..kernels import AbstractKernel, SquaredExponential, median_distance
from ..multiclass import GPClassifier as _MulticlassGP
from . import _ml2 as ml2
from ._common import (
    HostState,
    binary_targets,
    check_choice,
    check_positive_float,
    check_steps,
    encode_labels,
    fit_hyperparameters_or_once,
    float64,
    per_problem,
    quiet_convergence,
    validate_fit,
    validate_predict,
    warn_not_converged,
)
from ._gp_start import ScaledBuild, fisher_factor, robust_scale, scaled_start
from ._outputs import ProbabilisticClassifierMixin, StandardisedRegressorMixin

_LIKELIHOODS = ("logistic", "probit")
_REGRESSION_LIKELIHOODS = ("gaussian", "student-t", "laplace")


class _GPBuild(eqx.Module):
    """params {"kernel", "log_noise"} -> the full GP model (a module, so ML-II reuses its compiled loop)."""

    X: jnp.ndarray
    y: jnp.ndarray
    dof: jnp.ndarray
    likelihood: str = eqx.field(static=True)
    jitter: float = eqx.field(static=True)

    def __call__(self, params):
        """The GP model at `params` (a kernel, a log noise variance or scale)."""
        noise = jnp.exp(params["log_noise"])
        lik = {"logistic": lambda: P.Logistic(self.y), "probit": lambda: P.Probit(self.y),
               "gaussian": lambda: P.Gaussian(self.y, noise), "laplace": lambda: P.Laplace(self.y, noise),
               "student-t": lambda: P.StudentT(self.y, self.dof, noise)}[self.likelihood]()
        return gp_model(params["kernel"], self.X, lik, jitter=self.jitter)


def _kernel(kernel, X=None):
    """The kernel to start from: `kernel`, or for None SquaredExponential(1, lengthscale), the lengthscale 1 or,
    given inputs X, their median pairwise distance (`median_distance`)."""
    if kernel is None:
        return SquaredExponential(1.0, 1.0 if X is None else median_distance(X))
    if not isinstance(kernel, AbstractKernel):
        raise ValueError(f"kernel must be a gkl_jax.kernels kernel or None, got {type(kernel).__name__}")
    return kernel


def _fit_gp(est, X, y, likelihood, noise, learn_noise, dof=1.0, kernel=None, R=None):
    """One GP fit of `est`'s settings on inputs X (n, d) and targets y (n,), ML-II from `kernel` (default
    `est.kernel`); given `R` (`_gp_start.fisher_factor`), ML-II of the kernel and the noise in u = R theta.

    Returns:
        (Result, GP prior at the fitted parameters, params, converged).
    """
    build = _GPBuild(jnp.asarray(X), jnp.asarray(y), jnp.asarray(float(dof)), likelihood,
                     check_positive_float(est.jitter, "jitter"))
    params = {"kernel": _kernel(est.kernel) if kernel is None else kernel,
              "log_noise": np.asarray(np.log(noise))}
    learn = bool(est.learn_hyperparameters)
    method = gp_exact if likelihood == "gaussian" else gk_fit
    if likelihood == "gaussian" and learn:
        # the closed-form evidence and gradient in one compiled program (`_ml2`); the posterior once, at the end
        params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64) if eqx.is_inexact_array(a) else a, params)
        dyn, static = eqx.partition(params, {"kernel": True, "log_noise": bool(learn_noise)})
        objective = ml2.GPEvidence(build.X, build.y, static, build.jitter)
        params, converged, _ = ml2.run(objective, ml2.settings(check_steps(est.max_steps), GP_MAX_STEP), dyn, {},
                                       _Combine(static))
        result = gp_exact(build(params))
        return result, build(params).prior, params, bool(converged) and bool(result.converged)
    if R is not None and learn and learn_noise:   # Student-t: ML-II in u = R theta (`_gp_start`)
        # the inner fits: ML-II's default there, the site-precision solver from the last optimum (`_gp_start`)
        scaled = ScaledBuild(build, jnp.asarray(np.linalg.inv(R)), params["kernel"])
        result, u, converged = fit_hyperparameters_or_once(scaled, scaled_start(params["kernel"], float(
            params["log_noise"]), R), {"u": True}, method, check_steps(est.max_steps))
        params = scaled.params(u["u"])
    else:
        result, params, converged = fit_hyperparameters_or_once(
            build, params, {"kernel": learn, "log_noise": learn and bool(learn_noise)}, method,
            check_steps(est.max_steps))
    return result, build(params).prior, params, converged


GP_MAX_STEP = 1.0
"""The largest first move of a log-parameter in the Gaussian regressor's ML-II line searches (e^1 per step; the
default 3 of `fit_hyperparameters` jumped from lengthscale 1 into the white-noise optimum on diabetes)."""


class _Combine(eqx.Module):
    """(learned leaves, inner result) -> all the parameters, inside the compiled ML-II."""

    static: dict

    def __call__(self, dyn, result):
        return eqx.combine(dyn, self.static)


class GPClassifier(ProbabilisticClassifierMixin, ClassifierMixin, HostState, BaseEstimator):
    """Binary GP classifier by G-KL inference (one-vs-rest for more classes).

    Args:
        kernel: a `gkl_jax.kernels` kernel (default SquaredExponential(1, 1)); the starting point of ML-II.
        likelihood: "logistic" (default) or "probit".
        learn_hyperparameters: ML-II on the bound over the kernel parameters (default True).
        jitter: added to the Gram matrix's diagonal.
        max_steps: outer ML-II steps.

    Attributes (after `fit`): classes_, kernel_ (learned; a list one-vs-rest), log_evidence_ (the bound on
    log p(y | X); an array one-vs-rest), converged_.
    """

    def __init__(self, kernel=None, *, likelihood="logistic", learn_hyperparameters=True, jitter=1e-6,
                 max_steps=100):
        self.kernel = kernel
        self.likelihood = likelihood
        self.learn_hyperparameters = learn_hyperparameters
        self.jitter = jitter
        self.max_steps = max_steps

    @float64
    def fit(self, X, y):
        """Fit the posterior and (by default) the kernel.

        Args:
            X: (n, d) array-like of finite inputs.
            y: (n,) labels of any type, at least two classes.

        Returns:
            self.
        """
        check_choice(self.likelihood, "likelihood", _LIKELIHOODS)
        X, y = validate_fit(self, X, y, classifier=True)
        self.classes_, codes = encode_labels(y)
        fits = [_fit_gp(self, X, t, self.likelihood, 1.0, False) for t in binary_targets(codes, len(self.classes_))]
        self._fits = [(result, prior) for result, prior, _, _ in fits]
        kernels = [params["kernel"] for _, _, params, _ in fits]
        self.kernel_ = kernels[0] if len(kernels) == 1 else kernels
        self.log_evidence_ = per_problem([float(result.log_z) for result, _, _, _ in fits])
        self.converged_ = all(converged for _, _, _, converged in fits)
        if not self.converged_:
            warn_not_converged(self)
        return self

    @float64
    def _positive_probabilities(self, X):
        X = validate_predict(self, X, "_fits")
        return np.stack([np.asarray(gp_predict(r, prior, X, family=self.likelihood).probability)
                         for r, prior in self._fits], axis=1)


class GPRegressor(StandardisedRegressorMixin, RegressorMixin, HostState, BaseEstimator):
    """GP regression with a Gaussian (exact), Student-t or Laplace (G-KL) likelihood.

    Args:
        kernel: a `gkl_jax.kernels` kernel, the starting point of ML-II (default SquaredExponential(1, l) with
            l the median distance between the training inputs, `median_distance`).
        likelihood: "gaussian", "student-t" or "laplace".
        noise: the likelihood's variance (gaussian) or scale, in units of the standardised targets (start value);
            None (default): 1 for the Gaussian likelihood (all of the targets' variance; on diabetes with outliers
            ML-II from 0.1 stopped on one split of ten at log p = -449.90 where scikit-learn's optimum is -449.87,
            from 1 it found -449.87); for the Student-t likelihood with ML-II 1.4826 times the median absolute
            deviation of the Gaussian fit's leave-one-out residuals; 0.1 otherwise.
        dof: Student-t degrees of freedom (fixed).
        learn_hyperparameters: ML-II over the kernel and the noise (default True).
        jitter, max_steps: as `GPClassifier`.

    Attributes (after `fit`): kernel_, noise_ (standardised units), log_evidence_ (log p(y | X) for the Gaussian
    likelihood, else the bound; original units), converged_.
    """

    _fitted_attribute = "_fit"

    def __init__(self, kernel=None, *, likelihood="gaussian", noise=None, dof=4.0, learn_hyperparameters=True,
                 jitter=1e-6, max_steps=100):
        self.kernel = kernel
        self.likelihood = likelihood
        self.noise = noise
        self.dof = dof
        self.learn_hyperparameters = learn_hyperparameters
        self.jitter = jitter
        self.max_steps = max_steps

    @float64
    def fit(self, X, y):
        """Fit the posterior and (by default) the kernel and the noise; the targets are standardised,
        z = (y - mean(y)) / sd(y).

        Args:
            X: (n, d) array-like of finite inputs.
            y: (n,) finite targets.

        Returns:
            self.
        """
        check_choice(self.likelihood, "likelihood", _REGRESSION_LIKELIHOODS)
        noise = ((1.0 if self.likelihood == "gaussian" else 0.1) if self.noise is None
                 else check_positive_float(self.noise, "noise"))
        dof = check_positive_float(self.dof, "dof")
        X, y = validate_fit(self, X, y, classifier=False)
        z = self._standardise(y, np.mean)
        kernel, R = _kernel(self.kernel, X), None
        if self.likelihood == "student-t" and self.learn_hyperparameters:   # from the data, scaled (`_gp_start`)
            jitter = check_positive_float(self.jitter, "jitter")
            if self.noise is None:
                gaussian = _fit_gp(self, X, z, "gaussian", 1.0, True, kernel=kernel)[2]
                noise = robust_scale(gaussian, X, z, jitter)
            R = fisher_factor(kernel, X, noise ** 2, jitter, dof)
        result, prior, params, converged = _fit_gp(self, X, z, self.likelihood, noise, True, dof, kernel, R)
        self._fit = (result, prior)
        self.kernel_ = params["kernel"]
        self.noise_ = float(jnp.exp(params["log_noise"]))
        self.log_evidence_ = float(result.log_z) - len(y) * np.log(self._y_scale)
        self.converged_ = converged
        if not converged:
            warn_not_converged(self)
        return self

    def _predictive(self, X, family, z):
        result, prior = self._fit
        if z is None:
            return gp_predict(result, prior, X, family=family)
        return gp_predict(result, prior, X, with_targets(family, jnp.asarray(z), X.shape[0]))


class MulticlassGPClassifier(ClassifierMixin, HostState, BaseEstimator):
    """The multinomial-logit GP classifier of `gkl_jax.multiclass.GPClassifier` (Chai 2012) as a scikit-learn
    estimator: one joint posterior over the C latent functions (not one-vs-rest).

    Args:
        kernel: a `gkl_jax.kernels` kernel, or None (default) for `gkl_jax.multiclass.GPClassifier`'s default,
            SquaredExponential(1, median distance between the training inputs).
        learn_hyperparameters: maximise the bound over the kernel parameters (default True).
        jitter, max_steps, tol: passed on.
        num_inducing: None (the full bound, cost (n C)^3) or the number of random inducing latents of the sparse
            bound (cost n C s^2 per sweep; for n C in the thousands), drawn with `random_state`.
        random_state: the integer seed of that draw.

    Attributes (after `fit`): classes_, kernel_, log_evidence_ (the bound on log p(y | X)), converged_, estimator_
    (the underlying `gkl_jax.multiclass.GPClassifier`).
    """

    def __init__(self, kernel=None, *, learn_hyperparameters=True, jitter=1e-6, max_steps=50, tol=1e-8,
                 num_inducing=None, random_state=0):
        self.kernel = kernel
        self.learn_hyperparameters = learn_hyperparameters
        self.jitter = jitter
        self.max_steps = max_steps
        self.tol = tol
        self.num_inducing = num_inducing
        self.random_state = random_state

    @float64
    def fit(self, X, y):
        """Fit the joint posterior and (by default) the kernel.

        Args:
            X: (n, d) array-like of finite inputs.
            y: (n,) labels of any type, at least two classes.

        Returns:
            self.
        """
        X, y = validate_fit(self, X, y, classifier=True)
        classes, codes = encode_labels(y)
        with quiet_convergence():
            est = _MulticlassGP(self.kernel, learn_hyperparameters=bool(self.learn_hyperparameters),
                                classes=np.arange(len(classes)), jitter=float(self.jitter),
                                max_steps=check_steps(self.max_steps), tol=float(self.tol),
                                num_inducing=None if self.num_inducing is None else check_steps(self.num_inducing,
                                                                                               "num_inducing"),
                                random_state=self.random_state).fit(X, codes)
        self.estimator_, self.classes_ = est, classes
        self.kernel_, self.log_evidence_, self.converged_ = est.kernel_, float(est.log_z_), bool(est.converged_)
        if not self.converged_:
            warn_not_converged(self)
        return self

    @float64
    def predict_proba(self, X):
        """Class probabilities, the re-normalised predictive of Chai (2012, eq. 25).

        Args:
            X: (n, n_features_in_) array-like.

        Returns:
            (n, C) float64, columns in `classes_` order.
        """
        X = validate_predict(self, X, "estimator_")
        return np.asarray(self.estimator_.predict_proba(X), dtype=np.float64)

    def predict_log_proba(self, X):
        """The log of `predict_proba(X)`.

        Args:
            X: (n, d) array-like of inputs.

        Returns:
            (n, C) float numpy array.
        """
        return np.log(self.predict_proba(X))

    def predict(self, X):
        """The most probable class of each row of X.

        Args:
            X: (n, d) array-like of inputs.

        Returns:
            (n,) numpy array of labels from `classes_`.
        """
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]

