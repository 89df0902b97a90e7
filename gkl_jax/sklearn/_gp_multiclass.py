"""`MulticlassGPClassifier`: the multinomial-logit GP classifier of `gkl_jax.multiclass.GPClassifier` (Chai 2012)
as a scikit-learn estimator, dense or sparse (`num_inducing`)."""

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin

from ..multiclass import GPClassifier as _MulticlassGP
from ._common import (
    FitLog,
    HostState,
    check_steps,
    encode_labels,
    float64,
    quiet_convergence,
    validate_fit,
    validate_predict,
    warn_not_converged,
)


def _num_inducing(value):
    """num_inducing as `gkl_jax.multiclass.GPClassifier` takes it: None, "all" or a positive int."""
    if value is None or (isinstance(value, str) and value == "all"):
        return value
    return check_steps(value, "num_inducing")


class MulticlassGPClassifier(ClassifierMixin, HostState, BaseEstimator):
    """The multinomial-logit GP classifier of `gkl_jax.multiclass.GPClassifier` (Chai 2012) as a scikit-learn
    estimator: one joint posterior over the C latent functions (not one-vs-rest).

    Args:
        kernel: a `gkl_jax.kernels` kernel, or None (default) for `gkl_jax.multiclass.GPClassifier`'s default,
            SquaredExponential(1, median distance between the training inputs).
        learn_hyperparameters: maximise the bound over the kernel parameters (default True).
        jitter, max_steps, tol: passed on.
        num_inducing: None (default): the full bound (cost (n C)^3) up to 2000 latents n C, the sparse bound with
            200 inducing latents above; an int s: the sparse bound on s inducing latents (cost n C s^2 per sweep);
            "all": the full bound at every size (`gkl_jax.multiclass.GPClassifier`).
        inducing: "random" (default; s latents f^c(x_i) at random) or "kmeans++" (rows x_i by k-means++ seeding,
            all C latents at each).
        random_state: the integer seed of that draw.
        verbose: 0/False (default) silent; 1/True (or more): progress lines on stderr, the estimator's own and
            one per outer ML-II step (the bound and the largest gradient entry).

    No `batch_size`: the minibatch fits are for binary classification and regression (`GPClassifier`,
    `GPRegressor`); the multinomial model has no minibatch route.

    Attributes (after `fit`): classes_, kernel_, log_evidence_ (the bound on log p(y | X)), converged_, estimator_
    (the underlying `gkl_jax.multiclass.GPClassifier`).
    """

    def __init__(self, kernel=None, *, learn_hyperparameters=True, jitter=1e-6, max_steps=50, tol=1e-8,
                 num_inducing=None, inducing="random", random_state=0, verbose=0):
        self.kernel = kernel
        self.learn_hyperparameters = learn_hyperparameters
        self.jitter = jitter
        self.max_steps = max_steps
        self.tol = tol
        self.num_inducing = num_inducing
        self.inducing = inducing
        self.random_state = random_state
        self.verbose = verbose

    @float64
    def fit(self, X, y):
        """Fit the joint posterior and (by default) the kernel.

        Args:
            X: (n, d) array-like of finite inputs.
            y: (n,) labels of any type, at least two classes.

        Returns:
            self.
        """
        log = FitLog(self)
        X, y = validate_fit(self, X, y, classifier=True)
        classes, codes = encode_labels(y)
        log(f"{len(classes)} classes, n = {X.shape[0]} rows, num_inducing={self.num_inducing!r}")
        with quiet_convergence():
            est = _MulticlassGP(self.kernel, learn_hyperparameters=bool(self.learn_hyperparameters),
                                classes=np.arange(len(classes)), jitter=float(self.jitter),
                                max_steps=check_steps(self.max_steps), tol=float(self.tol),
                                num_inducing=_num_inducing(self.num_inducing), inducing=self.inducing,
                                random_state=self.random_state).fit(X, codes, progress=log.progress)
        self.estimator_, self.classes_ = est, classes
        self.kernel_, self.log_evidence_, self.converged_ = est.kernel_, float(est.log_z_), bool(est.converged_)
        log.done(f"log_evidence_ {self.log_evidence_:.6f}, converged_ {self.converged_}")
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

