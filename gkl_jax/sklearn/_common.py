"""Shared pieces of the scikit-learn estimators: input validation, float64, label encoding, shape buckets.

Precision: every estimator computes in float64 inside a local `jax.enable_x64(True)` context, whether or not the
user enabled x64 globally; inputs are converted to float64 numpy arrays and every fitted attribute and
prediction is a numpy array (float64), so nothing leaks a 32-bit JAX array either way.

Shape buckets: JAX compiles a fit once per array shape (5-30 s on a small machine). The linear estimators pad
their design matrix to `bucket(n)` rows and columns with zero rows and columns (`pad_design`): a zero row h_n = 0
has the constant potential phi_n(0) (subtracted from the evidence) and no effect on q; a zero column's weight
keeps its prior exactly (its KL term is zero at the optimum), so the fit, the coefficients and the evidence are
those of the unpadded problem, while the data sets of cross-validation folds, grid searches and
`check_estimator` share a handful of compilations.
"""

import contextlib
import functools

import jax
import numpy as np
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

try:  # scikit-learn >= 1.6
    from sklearn.utils.validation import validate_data as _validate_data
except ImportError:  # pragma: no cover - scikit-learn 1.4 / 1.5
    def _validate_data(estimator, X="no_validation", y="no_validation", **kwargs):
        return estimator._validate_data(X, y, **kwargs)


def float64(method):
    """Decorator: run an estimator method under `jax.enable_x64(True)` (the estimators always compute in
    float64; the caller's global setting is restored afterwards)."""
    @functools.wraps(method)
    def wrapped(*args, **kwargs):
        with jax.enable_x64(True):
            return method(*args, **kwargs)
    return wrapped


def validate_fit(estimator, X, y, *, classifier: bool):
    """(X, y) as float64 arrays (y: labels as given for a classifier), scikit-learn's checks and errors
    (ValueError for NaN/inf, complex data, empty or 1-D X, mismatched lengths), `n_features_in_` set."""
    X, y = _validate_data(estimator, X, y, dtype=np.float64, y_numeric=not classifier, ensure_min_samples=2)
    if classifier:
        check_classification_targets(y)
    elif not np.all(np.isfinite(y)):
        raise ValueError("Input y contains NaN or infinity.")
    return X, y


def validate_predict(estimator, X, fitted_attribute):
    """X (n, n_features_in_) as float64 after `check_is_fitted` (NotFittedError before fit)."""
    check_is_fitted(estimator, fitted_attribute)
    return _validate_data(estimator, X, dtype=np.float64, reset=False)


def encode_labels(y):
    """(classes_, integer codes) of classifier labels of any type; ValueError for fewer than two classes."""
    classes, codes = np.unique(y, return_inverse=True)
    if len(classes) < 2:
        raise ValueError(f"the classifier needs samples of at least 2 classes in y; got one class: {classes[0]!r}")
    return classes, codes


def bucket(n: int, minimum: int = 16) -> int:
    """The padded size for n: the next power of two >= max(n, minimum)."""
    return int(max(minimum, 1 << max(int(n) - 1, 0).bit_length()))


ROW_BUCKET_MIN, COLUMN_BUCKET_MIN = 256, 16
"""Smallest padded sizes: a fit's cost is O(N D^2), negligible at these sizes, while every distinct padded shape
costs a compilation (check_estimator's data sets of 10 to 300 rows and 1 to 10 columns share two)."""


def pad_design(H, rows: bool = True):
    """(H padded with zero rows and columns to bucket sizes, row mask (n_pad,), column mask (d_pad,))."""
    n, d = H.shape
    n_pad = bucket(n, ROW_BUCKET_MIN) if rows else n
    d_pad = bucket(d, COLUMN_BUCKET_MIN)
    out = np.zeros((n_pad, d_pad))
    out[:n, :d] = H
    return out, np.arange(n_pad) < n, np.arange(d_pad) < d


def check_choice(value, name, choices):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_positive_float(value, name):
    try:
        v = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a positive number, got {value!r}") from err
    if not (np.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return v


def check_steps(value, name="max_steps"):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


@contextlib.contextmanager
def quiet_convergence():
    """Silence the library's non-convergence warnings inside a fit (the estimator reports `converged_` and issues
    one scikit-learn ConvergenceWarning itself)."""
    import warnings
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"gkl_jax\.")
        yield


def warn_not_converged(name, what):
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    warnings.warn(f"{name}: {what} did not converge; the fitted attributes are the last iterate (converged_=False)",
                  ConvergenceWarning, stacklevel=3)
