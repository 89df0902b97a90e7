"""Synthetic generators used by the papers' experiments."""

import numpy as np

from .._validate import check_int


def synthetic_logistic(dim: int, num_train: int, num_test: int = 0, *, seed: int = 0):
    """The Bayesian logistic regression generator of Challis & Barber 2013, Section 6.2.1.

    w_tr ~ N(0, I); covariates x = A z with z ~ N(0, I) and A = I + a sparse matrix holding one standard-normal
    entry per row (at a random column), then each dimension rescaled to unit variance (over train and test
    together); labels y ~ p(y = 1 | w, x) = sigmoid(w^T x), y in {-1, +1}.

    Args:
        dim: the number of covariates D (int >= 1).
        num_train: training points (int >= 1).
        num_test: test points (int >= 0, default 0).
        seed: the numpy random seed (default 0).

    Returns:
        dict of float64 numpy arrays: X_train (num_train, dim), y_train (num_train,), X_test (num_test, dim),
        y_test (num_test,) and w_true (dim,).

    Raises:
        ValueError: a size or seed that is not an int in range.
    """
    dim, num_train = check_int(dim, "dim", 1), check_int(num_train, "num_train", 1)
    num_test, seed = check_int(num_test, "num_test"), check_int(seed, "seed")
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(dim)
    A = np.eye(dim)
    A[np.arange(dim), rng.integers(0, dim, size=dim)] += rng.standard_normal(dim)
    n = num_train + num_test
    X = rng.standard_normal((n, dim)) @ A.T
    sd = X.std(axis=0, keepdims=True)
    X /= np.where(sd > 0, sd, 1.0)      # a single data point (sd = 0) stays as drawn
    p = 1 / (1 + np.exp(-X @ w))
    y = np.where(rng.uniform(size=n) < p, 1.0, -1.0)
    return {"X_train": X[:num_train], "y_train": y[:num_train], "X_test": X[num_train:], "y_test": y[num_train:],
            "w_true": w}
