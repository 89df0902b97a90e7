"""Bayesian linear regression as a scikit-learn estimator: the G-KL posterior over the weights with a Gaussian,
Student-t or Laplace likelihood (Challis & Barber 2013); the shared fit is `_linear._BayesianLinear`."""

import jax.numpy as jnp
import numpy as np
from sklearn.base import RegressorMixin

from .. import potentials as P
from .._predict import predict as gk_predict
from ._common import check_choice, check_positive_float, float64, validate_fit, validate_predict, warn_not_converged
from ._linear import LIKELIHOODS, _BayesianLinear


class BayesianRegression(RegressorMixin, _BayesianLinear):
    """Bayesian linear regression with a Gaussian, Student-t or Laplace likelihood by G-KL inference.

    The targets are standardised inside `fit`, z = (y - median(y)) / sd(y); `prior_variance` and `noise` are in
    those units (with the default scale, prior_variance = 1 says a coefficient moves y by about one sd per unit
    feature), and every output (coef_, predictions, log_evidence_) is in the original units.

    Args:
        likelihood: "gaussian" (noise = variance), "student-t" (noise = scale, `dof` degrees of freedom) or
            "laplace" (noise = scale).
        prior_variance: prior variance of the coefficients (start value when learned).
        noise: the likelihood's variance or scale in standardised units (start value when learned).
        dof: Student-t degrees of freedom (fixed).
        factor, fit_intercept, intercept_variance, max_steps: as `BayesianLogisticRegression` (with the Gaussian
            likelihood the posterior is Gaussian and computed exactly, whatever `factor`).
        learn_prior_variance, learn_noise: ML-II on the bound over each (default both, as BayesianRidge).

    Attributes (after `fit`): coef_ (d,), coef_std_ (d,), intercept_, intercept_std_, covariance_ (d + 1, d + 1),
    log_evidence_ (the bound on log p(y | X)), prior_variance_, noise_ (learned values, standardised units),
    converged_.
    """

    def __init__(self, likelihood="gaussian", *, prior_variance=1.0, noise=0.1, dof=4.0, factor="full",
                 fit_intercept=True, intercept_variance=100.0, learn_prior_variance=True, learn_noise=True,
                 max_steps=100):
        self.likelihood = likelihood
        self.prior_variance = prior_variance
        self.noise = noise
        self.dof = dof
        self.factor = factor
        self.fit_intercept = fit_intercept
        self.intercept_variance = intercept_variance
        self.learn_prior_variance = learn_prior_variance
        self.learn_noise = learn_noise
        self.max_steps = max_steps

    @float64
    def fit(self, X, y):
        """Fit the posterior (and by default the prior variance and noise, by ML-II) to the targets.

        Args:
            X: (n, d) array-like of inputs, n >= 2.
            y: (n,) array-like of finite targets.

        Returns:
            self, with coef_, coef_std_, intercept_, covariance_, prior_variance_, noise_, log_evidence_ and
            converged_ set (a warning is issued when the fit did not converge).

        Raises:
            ValueError: an unknown likelihood, non-positive noise or dof, NaN/inf data, lengths that differ or fewer
                than 2 samples.
        """
        check_choice(self.likelihood, "likelihood", LIKELIHOODS)
        noise = check_positive_float(self.noise, "noise")
        dof = check_positive_float(self.dof, "dof")
        X, y = validate_fit(self, X, y, classifier=False)
        self._y_shift = float(np.median(y)) if self.fit_intercept else 0.0
        sd = float(np.std(y))
        self._y_scale = sd if sd > 0 else 1.0
        z = (y - self._y_shift) / self._y_scale
        result, v, s, log_z, converged = self._fit_one(self._design(X), z, self.likelihood, noise,
                                                       self.learn_noise, dof)
        self._results = [result]
        mean, cov = self._moments(result, X)
        self._set_coefficients([(mean * self._y_scale, cov * self._y_scale**2)])
        self.coef_, self.coef_std_ = self.coef_[0], self.coef_std_[0]
        self.intercept_ = float(self.intercept_[0]) + self._y_shift
        self.intercept_std_ = float(self.intercept_std_[0])
        self.covariance_ = self.covariance_[0]
        self.prior_variance_, self.noise_ = v, s
        self.log_evidence_ = log_z - len(y) * np.log(self._y_scale)
        self.converged_ = converged
        if not converged:
            warn_not_converged(type(self).__name__, "the fit")
        return self

    def _family(self):
        dof = float(self.dof)
        return {"gaussian": lambda: P.Gaussian(jnp.zeros(1), self.noise_),
                "laplace": lambda: P.Laplace(jnp.zeros(1), self.noise_),
                "student-t": lambda: P.StudentT(jnp.zeros(1), dof, self.noise_)}[self.likelihood]()

    @float64
    def predict(self, X, return_std=False):
        """The predictive mean of y and, with `return_std`, its standard deviation including the noise (inf for a
        Student-t likelihood with dof <= 2).

        Args:
            X: (n, d) array-like of inputs (d as in `fit`).
            return_std: also return the predictive standard deviation (default False).

        Returns:
            (n,) float64 numpy array of means, or (mean, std) with return_std.

        Raises:
            sklearn.exceptions.NotFittedError: before `fit`.
            ValueError: X with NaN/inf or the wrong number of features (scikit-learn's checks).
        """
        X = validate_predict(self, X, "_results")
        pred = self._latent(self._results[0], X, self._family())
        mean = np.asarray(pred.y_mean) * self._y_scale + self._y_shift
        if not return_std:
            return mean
        return mean, np.sqrt(np.asarray(pred.y_variance)) * self._y_scale

    @float64
    def log_predictive_density(self, X, y):
        """log p(y_* | x_*) per test point, in the original units of y.

        Args:
            X: (n, d) array-like of inputs (d as in `fit`).
            y: (n,) array-like of finite test targets.

        Returns:
            (n,) float64 numpy array.

        Raises:
            sklearn.exceptions.NotFittedError: before `fit`.
            ValueError: y of another length or not finite, or a bad X.
        """
        X = validate_predict(self, X, "_results")
        y = np.asarray(y, dtype=np.float64).ravel()
        if y.shape[0] != X.shape[0] or not np.all(np.isfinite(y)):
            raise ValueError(f"y must hold {X.shape[0]} finite targets, got shape {np.shape(y)}")
        H = self._design(X)
        Hp = np.zeros((H.shape[0], self._results[0].q.dim))
        Hp[:, :H.shape[1]] = H
        z = (y - self._y_shift) / self._y_scale
        pred = gk_predict(self._results[0], jnp.asarray(Hp), self._family(), y=jnp.asarray(z))
        return np.asarray(pred.log_density) - np.log(self._y_scale)
