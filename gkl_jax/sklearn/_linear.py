"""Bayesian linear models as scikit-learn estimators: G-KL posteriors over the weights (Challis & Barber 2013).

- `BayesianLogisticRegression`: p(w) = N(0, prior_variance I), p(y_n | w) = sigmoid(y_n x_n^T w); predict_proba is
  the predictive integral E_q[sigmoid(x^T w)] (Gauss-Hermite over the 1-D latent x^T w ~ N(mu, s^2); MacKay 1992),
  not the plug-in sigmoid(mu). More than two classes: one-vs-rest (one binary posterior per class, the
  probabilities normalised over the classes).
- `BayesianRegression` (in `_regression`): the same prior with a Gaussian, Student-t or Laplace likelihood (robust
  regression); predict(X, return_std=True) gives the predictive mean and sd including the noise.

The intercept is a weight on a constant column with prior N(0, intercept_variance) (not shrunk like the others
with the default 100). `learn_prior_variance` (and `learn_noise`) maximise the bound log Z >= B over the
log-variances (ML-II; `gkl_jax.gp.fit_hyperparameters`, envelope gradients). `log_evidence_` is the optimised
bound, a lower bound on log p(y | X) (for the regression models: of the original, unstandardised targets).
"""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin

from .. import factors as F
from .. import potentials as P
from .._fit import fit as gk_fit
from .._model import Model, Sites
from .._predict import predict as gk_predict
from ..gp import exact as gp_exact
from ..gp._hyper import fit_hyperparameters
from ..priors import Diagonal
from ._common import (
    check_choice,
    check_positive_float,
    check_steps,
    encode_labels,
    float64,
    pad_design,
    quiet_convergence,
    validate_fit,
    validate_predict,
    warn_not_converged,
)

LIKELIHOODS = ("gaussian", "student-t", "laplace")


class _Build(eqx.Module):
    """params -> Model for the padded design (a module, so that ML-II reuses its compiled objective across fits
    of one padded shape)."""

    H: jnp.ndarray
    y: jnp.ndarray
    rows: jnp.ndarray           # True on real rows
    cols: jnp.ndarray           # True on real columns
    intercept: jnp.ndarray      # True on the intercept column
    intercept_variance: jnp.ndarray
    dof: jnp.ndarray
    likelihood: str = eqx.field(static=True)

    def __call__(self, params):
        v = jnp.exp(params["log_prior_variance"])
        variance = jnp.where(self.cols, jnp.where(self.intercept, self.intercept_variance, v), 1.0)
        noise = jnp.where(self.rows, jnp.exp(params["log_noise"]), 1.0)   # padded rows: a constant potential
        return Model(Diagonal(variance), Sites(self.H, self.potential(self.y, noise)))

    def potential(self, y, noise):
        if self.likelihood == "logistic":
            return P.Logistic(y)
        if self.likelihood == "gaussian":
            return P.Gaussian(y, noise)
        if self.likelihood == "laplace":
            return P.Laplace(y, noise)
        return P.StudentT(y, self.dof, noise)


def _factor(factor):
    if isinstance(factor, str):
        return {"full": F.Full(), "diagonal": F.Diagonal()}[check_choice(factor, "factor", ("full", "diagonal"))]
    if isinstance(factor, F.AbstractFactor):
        return factor
    raise ValueError(f"factor must be 'full', 'diagonal' or a gkl_jax.factors factor, got {factor!r}")


class _BayesianLinear(BaseEstimator):
    """The shared fit of one binary or regression problem on a padded design."""

    def _design(self, X):
        return np.hstack([X, np.ones((X.shape[0], 1))]) if self.fit_intercept else X

    def _fit_one(self, H, y, likelihood, noise, learn_noise, dof=1.0):
        """One G-KL fit; returns (Result, prior variance, noise, log evidence, converged)."""
        factor = _factor(self.factor)
        max_steps = check_steps(self.max_steps)
        v0 = check_positive_float(self.prior_variance, "prior_variance")
        iv = check_positive_float(self.intercept_variance, "intercept_variance")
        Hp, rows, cols = pad_design(H)
        n, d = H.shape
        fill = 1.0 if likelihood == "logistic" else 0.0
        yp = np.full(Hp.shape[0], fill)
        yp[:n] = y
        intercept = np.zeros(Hp.shape[1], bool)
        if self.fit_intercept:
            intercept[d - 1] = True
        build = _Build(jnp.asarray(Hp), jnp.asarray(yp), jnp.asarray(rows), jnp.asarray(cols), jnp.asarray(intercept),
                       jnp.asarray(iv), jnp.asarray(float(dof)), likelihood)
        params = {"log_prior_variance": jnp.log(jnp.asarray(v0)), "log_noise": jnp.log(jnp.asarray(noise))}
        exact = likelihood == "gaussian"      # the posterior is Gaussian: exact inference, the exact evidence
        learn = {"log_prior_variance": bool(self.learn_prior_variance), "log_noise": bool(learn_noise)}
        with quiet_convergence():
            if any(learn.values()):
                kwargs = {"method": gp_exact} if exact else (
                    {} if isinstance(factor, F.Full) else {"method_kwargs": {"factor": factor}})
                hyper = fit_hyperparameters(build, params, filter_spec=learn, max_steps=max_steps, **kwargs)
                result, params = hyper.result, hyper.params
                converged = bool(hyper.converged) and bool(result.converged)
            else:
                result = gp_exact(build(params)) if exact else gk_fit(build(params), factor)
                converged = bool(result.converged)
        # the padded rows add the constant sum log phi(0) of their potential
        pad = build.potential(jnp.full(Hp.shape[0] - n, fill), 1.0).log_phi(jnp.zeros(Hp.shape[0] - n))
        log_z = float(result.log_z) - float(jnp.sum(pad))
        return (result, float(jnp.exp(params["log_prior_variance"])), float(jnp.exp(params["log_noise"])), log_z,
                converged)

    def _moments(self, result, X):
        """(mean, covariance) of the real weights (the coefficients, then the intercept)."""
        D = X.shape[1] + int(self.fit_intercept)
        return np.asarray(result.q.mean)[:D], np.asarray(result.q.covariance())[:D, :D]

    def _latent(self, result, X, family=None):
        H = self._design(X)
        Hp = np.zeros((H.shape[0], result.q.dim))
        Hp[:, :H.shape[1]] = H
        return gk_predict(result, jnp.asarray(Hp), family)

    def _set_coefficients(self, moments):
        means = np.stack([m for m, _ in moments])
        sds = np.stack([np.sqrt(np.diag(S)) for _, S in moments])
        d = self.n_features_in_
        self.coef_, self.coef_std_ = means[:, :d], sds[:, :d]
        self.intercept_ = means[:, d] if self.fit_intercept else np.zeros(len(moments))
        self.intercept_std_ = sds[:, d] if self.fit_intercept else np.zeros(len(moments))
        self.covariance_ = np.stack([S for _, S in moments])


class BayesianLogisticRegression(ClassifierMixin, _BayesianLinear):
    """Bayesian logistic regression by Gaussian KL (G-KL) inference.

    Args:
        prior_variance: variance of the N(0, prior_variance I) prior on the coefficients (the starting value when
            `learn_prior_variance`).
        factor: the covariance structure of q: "full" (default), "diagonal" or a `gkl_jax.factors` factor.
        fit_intercept: add a constant feature whose weight has prior N(0, intercept_variance).
        intercept_variance: prior variance of the intercept.
        learn_prior_variance: maximise the bound over prior_variance (ML-II).
        max_steps: outer ML-II steps.

    Attributes (after `fit`):
        classes_: the labels (any type); the second is the positive class of a binary problem.
        coef_, coef_std_: (1, d) posterior mean and sd of the coefficients ((K, d) one-vs-rest for K > 2 classes).
        intercept_, intercept_std_: (1,) or (K,).
        covariance_: (1 or K, d + 1, d + 1) posterior covariance of (coef, intercept).
        log_evidence_: the optimised bound, a lower bound on log p(y | X) (an array (K,) per one-vs-rest problem).
        prior_variance_: the (learned) prior variance (an array (K,) for one-vs-rest).
        converged_: whether every fit met its tolerance.

    More than two classes are fitted one-vs-rest: K independent binary posteriors, whose predictive
    probabilities p_k = p(y = k vs rest) are normalised to sum to 1 (not a multinomial model; for that use
    `MulticlassGPClassifier` with a linear kernel).
    """

    def __init__(self, prior_variance=1.0, *, factor="full", fit_intercept=True, intercept_variance=100.0,
                 learn_prior_variance=False, max_steps=100):
        self.prior_variance = prior_variance
        self.factor = factor
        self.fit_intercept = fit_intercept
        self.intercept_variance = intercept_variance
        self.learn_prior_variance = learn_prior_variance
        self.max_steps = max_steps

    @float64
    def fit(self, X, y):
        """Fit the posterior over the weights (one-vs-rest for more than two classes).

        Args:
            X: (n, d) array-like of inputs, n >= 2.
            y: (n,) array-like of labels of any type, at least two classes.

        Returns:
            self, with coef_, intercept_, classes_, prior_variance_, log_evidence_ and converged_ set (a warning is
            issued when a fit did not converge).

        Raises:
            ValueError: NaN/inf or complex data, lengths that differ, fewer than 2 samples or 2 classes.
        """
        X, y = validate_fit(self, X, y, classifier=True)
        self.classes_, codes = encode_labels(y)
        H = self._design(X)
        targets = [codes == 1] if len(self.classes_) == 2 else [codes == k for k in range(len(self.classes_))]
        fits = [self._fit_one(H, np.where(t, 1.0, -1.0), "logistic", 1.0, False) for t in targets]
        self._results = [f[0] for f in fits]
        self._set_coefficients([self._moments(r, X) for r in self._results])
        one = len(fits) == 1
        self.prior_variance_ = fits[0][1] if one else np.array([f[1] for f in fits])
        self.log_evidence_ = fits[0][3] if one else np.array([f[3] for f in fits])
        self.converged_ = all(f[4] for f in fits)
        if not self.converged_:
            warn_not_converged(type(self).__name__, "the fit")
        return self

    @float64
    def _positive_probabilities(self, X):
        X = validate_predict(self, X, "_results")
        return np.stack([np.asarray(self._latent(r, X, "logistic").probability) for r in self._results], axis=1)

    def predict_proba(self, X):
        """Class probabilities by the predictive integral E_q[sigmoid(x^T w)] (one-vs-rest: normalised over the
        classes).

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
        """The moderated log-odds log p / (1 - p) of the predictive probability. Its sign (argmax) agrees with
        `predict`.

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

    @float64
    def latent(self, X):
        """The posterior mean and standard deviation of the latent x^T w (+ intercept) under q.

        Args:
            X: (n, d) array-like of inputs (d as in `fit`).

        Returns:
            (mean, sd): float64 numpy arrays, each (n,) for two classes or (n, K) one-vs-rest.

        Raises:
            sklearn.exceptions.NotFittedError: before `fit`.
            ValueError: X with NaN/inf or the wrong number of features (scikit-learn's checks).
        """
        X = validate_predict(self, X, "_results")
        preds = [self._latent(r, X) for r in self._results]
        mean = np.stack([np.asarray(p.mean) for p in preds], axis=1)
        sd = np.sqrt(np.stack([np.asarray(p.variance) for p in preds], axis=1))
        return (mean[:, 0], sd[:, 0]) if mean.shape[1] == 1 else (mean, sd)

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
