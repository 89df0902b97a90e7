"""Gaussian-process estimators on `gkl_jax.gp`: binary classification, (robust) regression, and the multinomial
GP classifier of `gkl_jax.multiclass` (Chai 2012) behind one import.

- `GPClassifier`: f ~ GP(0, k), p(y_n | f_n) logistic or probit; the G-KL posterior over the latent values and the
  kernel hyperparameters by ML-II on the bound (`gkl_jax.gp.fit_hyperparameters`, envelope gradients; Challis &
  Barber 2013, Section 6.1.3). predict_proba is the predictive integral E[sigmoid(f_*)] under the latent
  predictive N(mu_*, s_*^2) (`gkl_jax.gp.predict`). More than two classes: one-vs-rest, as scikit-learn's
  GaussianProcessClassifier; `MulticlassGPClassifier` is the joint multinomial model.
- `MulticlassGPClassifier` (in `_multiclass`): the joint multinomial-logit model of `gkl_jax.multiclass`.
- `GPRegressor`: Gaussian (exact inference, the exact evidence), Student-t or Laplace (G-KL, robust) likelihood;
  the kernel and the noise by ML-II; the targets are standardised inside `fit` (as scikit-learn's
  normalize_y=True) and every output is in the original units.

Each distinct training-set size compiles its own fit (seconds on a small CPU); the compiled fit is reused for
every later fit of that size (cross-validation folds of equal size, refits).
"""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin

from .. import potentials as P
from .._fit import fit as gk_fit
from ..gp import exact as gp_exact
from ..gp import fit_hyperparameters
from ..gp import model as gp_model
from ..gp import predict as gp_predict
from ..kernels import AbstractKernel, SquaredExponential
from ._common import (
    check_choice,
    check_positive_float,
    check_steps,
    encode_labels,
    float64,
    quiet_convergence,
    validate_fit,
    validate_predict,
    warn_not_converged,
)

_LIKELIHOODS = {"logistic": P.Logistic, "probit": P.Probit}


class _GPBuild(eqx.Module):
    """params {"kernel", "log_noise"} -> the full GP model (a module, so ML-II reuses its compiled objective)."""

    X: jnp.ndarray
    y: jnp.ndarray
    dof: jnp.ndarray
    likelihood: str = eqx.field(static=True)
    jitter: float = eqx.field(static=True)

    def __call__(self, params):
        noise = jnp.exp(params["log_noise"])
        lik = {"logistic": lambda: P.Logistic(self.y), "probit": lambda: P.Probit(self.y),
               "gaussian": lambda: P.Gaussian(self.y, noise), "laplace": lambda: P.Laplace(self.y, noise),
               "student-t": lambda: P.StudentT(self.y, self.dof, noise)}[self.likelihood]()
        return gp_model(params["kernel"], self.X, lik, jitter=self.jitter)


def _kernel(kernel):
    if kernel is None:
        return SquaredExponential(1.0, 1.0)
    if not isinstance(kernel, AbstractKernel):
        raise ValueError(f"kernel must be a gkl_jax.kernels kernel or None, got {type(kernel).__name__}")
    return kernel


def _fit_gp(est, X, y, likelihood, noise, learn_noise, dof=1.0):
    """One GP fit: (Result, model, params, converged)."""
    build = _GPBuild(jnp.asarray(X), jnp.asarray(y), jnp.asarray(float(dof)), likelihood,
                     check_positive_float(est.jitter, "jitter"))
    params = {"kernel": _kernel(est.kernel), "log_noise": jnp.log(jnp.asarray(noise))}
    method = gp_exact if likelihood == "gaussian" else gk_fit
    with quiet_convergence():
        if est.learn_hyperparameters:
            spec = {"kernel": True, "log_noise": bool(learn_noise)}
            hyper = fit_hyperparameters(build, params, method=method, filter_spec=spec,
                                        max_steps=check_steps(est.max_steps))
            return hyper.result, hyper.model, hyper.params, bool(hyper.converged) and bool(hyper.result.converged)
        model = build(params)
        result = method(model)
        return result, model, params, bool(result.converged)


class GPClassifier(ClassifierMixin, BaseEstimator):
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
        """Fit the GP posterior (and by default the kernel hyperparameters, by ML-II) to the labels
        (one-vs-rest for more than two classes).

        Args:
            X: (n, d) array-like of inputs, n >= 2.
            y: (n,) array-like of labels of any type, at least two classes.

        Returns:
            self, with classes_, kernel_, log_evidence_ and converged_ set (a warning is issued when a fit did not
            converge).

        Raises:
            ValueError: an unknown likelihood, NaN/inf data, lengths that differ, fewer than 2 samples or 2 classes.
        """
        check_choice(self.likelihood, "likelihood", tuple(_LIKELIHOODS))
        X, y = validate_fit(self, X, y, classifier=True)
        self.classes_, codes = encode_labels(y)
        targets = [codes == 1] if len(self.classes_) == 2 else [codes == k for k in range(len(self.classes_))]
        fits = [_fit_gp(self, X, np.where(t, 1.0, -1.0), self.likelihood, 1.0, False) for t in targets]
        self._fits = [(r, m.prior) for r, m, _, _ in fits]
        kernels = [p["kernel"] for _, _, p, _ in fits]
        log_z = [float(r.log_z) for r, _, _, _ in fits]
        one = len(fits) == 1
        self.kernel_ = kernels[0] if one else kernels
        self.log_evidence_ = log_z[0] if one else np.array(log_z)
        self.converged_ = all(c for _, _, _, c in fits)
        if not self.converged_:
            warn_not_converged(type(self).__name__, "the fit")
        return self

    @float64
    def _positive_probabilities(self, X):
        X = validate_predict(self, X, "_fits")
        return np.stack([np.asarray(gp_predict(r, prior, X, family=self.likelihood).probability)
                         for r, prior in self._fits], axis=1)

    def predict_proba(self, X):
        """Class probabilities by the predictive integral (one-vs-rest: normalised over the classes).

        Args:
            X: (n, d) array-like of inputs (d as in `fit`).

        Returns:
            (n, K) float64 numpy array, columns in `classes_` order, rows summing to 1.

        Raises:
            sklearn.exceptions.NotFittedError: before `fit`.
            ValueError: X with NaN/inf or the wrong number of features (scikit-learn's checks).
        """
        p = self._positive_probabilities(X)
        if p.shape[1] == 1:
            return np.hstack([1 - p, p])
        return p / np.sum(p, axis=1, keepdims=True)

    def predict_log_proba(self, X):
        """The logarithm of `predict_proba`.

        Args:
            X: (n, d) array-like of inputs (d as in `fit`).

        Returns:
            (n, K) float64 numpy array.

        Raises:
            sklearn.exceptions.NotFittedError: before `fit`.
            ValueError: X with NaN/inf or the wrong number of features (scikit-learn's checks).
        """
        return np.log(self.predict_proba(X))

    def decision_function(self, X):
        """The moderated log-odds of the predictive probability. Its sign (argmax) agrees with `predict`.

        Args:
            X: (n, d) array-like of inputs (d as in `fit`).

        Returns:
            float64 numpy array: (n,) for two classes (positive: `classes_[1]`), (n, K) one-vs-rest.

        Raises:
            sklearn.exceptions.NotFittedError: before `fit`.
            ValueError: X with NaN/inf or the wrong number of features (scikit-learn's checks).
        """
        p = np.clip(self._positive_probabilities(X), 1e-300, 1 - 1e-16)
        logit = np.log(p) - np.log1p(-p)
        return logit[:, 0] if logit.shape[1] == 1 else logit

    def predict(self, X):
        """The most probable class for each row of X (the argmax of `predict_proba`).

        Args:
            X: (n, d) array-like of inputs (d as in `fit`).

        Returns:
            (n,) numpy array of labels from `classes_`.

        Raises:
            sklearn.exceptions.NotFittedError: before `fit`.
            ValueError: X with NaN/inf or the wrong number of features (scikit-learn's checks).
        """
        proba = self.predict_proba(X)
        return self.classes_[np.argmax(proba, axis=1)]


class GPRegressor(RegressorMixin, BaseEstimator):
    """GP regression with a Gaussian (exact), Student-t or Laplace (G-KL) likelihood.

    Args:
        kernel: a `gkl_jax.kernels` kernel (default SquaredExponential(1, 1)); the starting point of ML-II.
        likelihood: "gaussian", "student-t" or "laplace".
        noise: the likelihood's variance (gaussian) or scale, in units of the standardised targets (start value).
        dof: Student-t degrees of freedom (fixed).
        learn_hyperparameters: ML-II over the kernel and the noise (default True).
        jitter, max_steps: as `GPClassifier`.

    Attributes (after `fit`): kernel_, noise_ (standardised units), log_evidence_ (log p(y | X) for the Gaussian
    likelihood, else the bound; original units), converged_.
    """

    def __init__(self, kernel=None, *, likelihood="gaussian", noise=0.1, dof=4.0, learn_hyperparameters=True,
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
        """Fit the GP posterior (and by default the kernel and noise, by ML-II) to the targets.

        Args:
            X: (n, d) array-like of inputs, n >= 2.
            y: (n,) array-like of finite targets.

        Returns:
            self, with kernel_, noise_, log_evidence_ and converged_ set (a warning is issued when the fit did not
            converge).

        Raises:
            ValueError: an unknown likelihood, non-positive noise or dof, NaN/inf data, lengths that differ or fewer
                than 2 samples.
        """
        check_choice(self.likelihood, "likelihood", ("gaussian", "student-t", "laplace"))
        noise = check_positive_float(self.noise, "noise")
        dof = check_positive_float(self.dof, "dof")
        X, y = validate_fit(self, X, y, classifier=False)
        self._y_shift = float(np.mean(y))
        sd = float(np.std(y))
        self._y_scale = sd if sd > 0 else 1.0
        z = (y - self._y_shift) / self._y_scale
        result, model, params, converged = _fit_gp(self, X, z, self.likelihood, noise, True, dof)
        self._fit = (result, model.prior)
        self.kernel_ = params["kernel"]
        self.noise_ = float(jnp.exp(params["log_noise"]))
        self.log_evidence_ = float(result.log_z) - len(y) * np.log(self._y_scale)
        self.converged_ = converged
        if not converged:
            warn_not_converged(type(self).__name__, "the fit")
        return self

    def _family(self):
        return {"gaussian": lambda: P.Gaussian(jnp.zeros(1), self.noise_),
                "laplace": lambda: P.Laplace(jnp.zeros(1), self.noise_),
                "student-t": lambda: P.StudentT(jnp.zeros(1), float(self.dof), self.noise_)}[self.likelihood]()

    @float64
    def predict(self, X, return_std=False):
        """The predictive mean of y and, with `return_std`, its standard deviation including the noise.

        Args:
            X: (n, d) array-like of inputs (d as in `fit`).
            return_std: also return the predictive standard deviation (default False).

        Returns:
            (n,) float64 numpy array of means, or (mean, std) with return_std.

        Raises:
            sklearn.exceptions.NotFittedError: before `fit`.
            ValueError: X with NaN/inf or the wrong number of features (scikit-learn's checks).
        """
        X = validate_predict(self, X, "_fit")
        result, prior = self._fit
        pred = gp_predict(result, prior, X, family=self._family())
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
        X = validate_predict(self, X, "_fit")
        y = np.asarray(y, dtype=np.float64).ravel()
        if y.shape[0] != X.shape[0] or not np.all(np.isfinite(y)):
            raise ValueError(f"y must hold {X.shape[0]} finite targets, got shape {np.shape(y)}")
        result, prior = self._fit
        family = eqx.tree_at(lambda p: p.y, self._family(), jnp.asarray((y - self._y_shift) / self._y_scale))
        return np.asarray(gp_predict(result, prior, X, family).log_density) - np.log(self._y_scale)
