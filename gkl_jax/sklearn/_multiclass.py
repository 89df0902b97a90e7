"""The multinomial-logit GP classifier of `gkl_jax.multiclass` (Chai 2012) as a scikit-learn estimator."""

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin

from ..multiclass import GPClassifier as _MulticlassGP
from ._common import (
    check_steps,
    encode_labels,
    float64,
    quiet_convergence,
    validate_fit,
    validate_predict,
    warn_not_converged,
)
from ._gp import _kernel


class MulticlassGPClassifier(ClassifierMixin, BaseEstimator):
    """The multinomial-logit GP classifier of `gkl_jax.multiclass.GPClassifier` (Chai 2012) as a scikit-learn
    estimator: one joint posterior over the C latent functions (not one-vs-rest).

    Args:
        kernel: a `gkl_jax.kernels` kernel (default SquaredExponential(1, 1)).
        learn_hyperparameters: maximise the bound over the kernel parameters (default True).
        jitter, max_steps, tol: passed on.

    Attributes (after `fit`): classes_, kernel_, log_evidence_ (the bound on log p(y | X)), converged_, estimator_
    (the underlying `gkl_jax.multiclass.GPClassifier`).
    """

    def __init__(self, kernel=None, *, learn_hyperparameters=True, jitter=1e-6, max_steps=50, tol=1e-8):
        self.kernel = kernel
        self.learn_hyperparameters = learn_hyperparameters
        self.jitter = jitter
        self.max_steps = max_steps
        self.tol = tol

    @float64
    def fit(self, X, y):
        """Fit the joint multinomial-logit GP posterior over the C latent functions (Chai 2012).

        Args:
            X: (n, d) array-like of inputs, n >= 2.
            y: (n,) array-like of labels of any type, at least two classes.

        Returns:
            self, with estimator_, classes_, kernel_, log_evidence_ and converged_ set (a warning is issued when the
            fit did not converge).

        Raises:
            ValueError: NaN/inf data, lengths that differ, fewer than 2 samples or 2 classes, or a bad max_steps.
        """
        X, y = validate_fit(self, X, y, classifier=True)
        classes, codes = encode_labels(y)
        with quiet_convergence():
            est = _MulticlassGP(_kernel(self.kernel), learn_hyperparameters=bool(self.learn_hyperparameters),
                                classes=np.arange(len(classes)), jitter=float(self.jitter),
                                max_steps=check_steps(self.max_steps), tol=float(self.tol)).fit(X, codes)
        self.estimator_, self.classes_ = est, classes
        self.kernel_, self.log_evidence_, self.converged_ = est.kernel_, float(est.log_z_), bool(est.converged_)
        if not self.converged_:
            warn_not_converged(type(self).__name__, "the fit")
        return self

    @float64
    def predict_proba(self, X):
        """Class probabilities (the re-normalised predictive of Chai 2012, eq. 25).

        Args:
            X: (n, d) array-like of inputs (d as in `fit`).

        Returns:
            (n, K) float64 numpy array, columns in `classes_` order, rows summing to 1.

        Raises:
            sklearn.exceptions.NotFittedError: before `fit`.
            ValueError: X with NaN/inf or the wrong number of features (scikit-learn's checks).
        """
        X = validate_predict(self, X, "estimator_")
        return np.asarray(self.estimator_.predict_proba(X), dtype=np.float64)

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

