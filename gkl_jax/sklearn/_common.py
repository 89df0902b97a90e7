"""Shared pieces of the scikit-learn estimators: input validation, float64, label encoding, shape buckets.

Precision: every estimator computes in float64 inside a local `jax.enable_x64(True)` context, whether or not the
user enabled x64 globally; inputs are converted to float64 numpy arrays and every fitted attribute and
prediction is a numpy array (float64), so nothing leaks a 32-bit JAX array either way.

Shape buckets: JAX compiles a fit once per array shape (seconds on a small machine). The linear estimators pad
their design matrix to `bucket(n)` rows and columns with zero rows and columns (`pad_design`): a zero row h_n = 0
has the constant potential phi_n(0) (subtracted from the evidence) and no effect on q; a zero column's weight
keeps its prior exactly (its KL term is zero at the optimum), so the fit, the coefficients and the evidence are
those of the unpadded problem, while the data sets of cross-validation folds, grid searches and
`check_estimator` share a handful of compilations.
"""

import contextlib
import sys
import time
import warnings

import jax
import numpy as np
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted

from .._buckets import bucket
from .._linalg import in_float64
from .._validate import host_arrays
from ..gp._hyper import fit_hyperparameters

try:  # scikit-learn >= 1.6
    from sklearn.utils.validation import validate_data as _validate_data
except ImportError:  # pragma: no cover - scikit-learn 1.4 / 1.5
    def _validate_data(estimator, X="no_validation", y="no_validation", **kwargs):
        return estimator._validate_data(X, y, **kwargs)


float64 = in_float64
"""The decorator of every estimator method that computes: `gkl_jax._linalg.in_float64`."""


class HostState:
    """Pickles an estimator's state with numpy arrays in place of JAX arrays (`gkl_jax._validate.host_arrays`),
    so that it predicts the same after loading with x64 off."""

    def __getstate__(self):
        return host_arrays(super().__getstate__())


def validate_fit(estimator, X, y, *, classifier: bool):
    """scikit-learn's input checks of `fit`; sets `n_features_in_`.

    Args:
        estimator: the estimator being fitted.
        X: (n, d) array-like, n >= 2.
        y: (n,) array-like: labels of any type for a classifier, finite numbers otherwise.
        classifier: whether y holds class labels.

    Returns:
        (X float64 (n, d), y (n,) as given for a classifier, float64 otherwise); ValueError for NaN/inf,
        complex data, empty or 1-D X, mismatched lengths, continuous classifier targets, string or object
        regression targets that are not numbers, and X or y whose squares overflow or underflow float64
        (`check_magnitude`).
    """
    if not classifier and y is not None:
        y = numeric_targets(y)
    if y is not None:
        rows, entries = _length(X), _length(y)
        if rows is not None and entries is not None and rows != entries:
            raise ValueError(f"y has {entries} entries but X has {rows} rows (inconsistent numbers of samples)")
    X, y = _validate_data(estimator, X, y, dtype=np.float64, y_numeric=not classifier, ensure_min_samples=2)
    check_magnitude(X, "X")
    if classifier:
        check_classification_targets(y)
    else:
        if not np.all(np.isfinite(y)):
            raise ValueError("Input y contains NaN or infinity.")
        check_magnitude(np.reshape(y, (len(y), -1)), "y")
    return X, y


def _length(a):
    """The number of rows of an array-like (None where it has no length, e.g. a scalar)."""
    shape = getattr(a, "shape", None)
    if shape is not None:
        return shape[0] if len(shape) else None
    try:
        return len(a)
    except TypeError:
        return None


def numeric_targets(y):
    """y as a float64 array, or a ValueError naming y where its entries are not numbers (strings, also numeric
    ones such as "1.5", in a str or object array; objects that do not convert to float)."""
    raw = np.asarray(y)
    try:
        out = np.asarray(y, dtype=np.float64)
    except (TypeError, ValueError):
        out = None
    strings = raw.dtype.kind in "USa" or (raw.dtype.kind == "O" and any(isinstance(v, (str, bytes))
                                                                         for v in raw.ravel()))
    if out is None or strings:
        sample = np.ravel(np.asarray(y, dtype=object))[:1]
        raise ValueError(f"y must hold numbers for a regressor, got {raw.dtype} values such as "
                         f"{sample[0] if sample.size else None!r}; encode the targets as floats")
    return out


def check_magnitude(A, name):
    """Refuse (ValueError naming `name`) columns of A whose sum of squares overflows float64 (|values| above about
    1e154) or underflows it (every non-zero |value| below about 1e-154): the fits square the inputs (the
    designs' Gram products, kernels' distances, the default prior scale), so inf or 0 would give NaN results or
    an error naming another argument."""
    with np.errstate(over="ignore", under="ignore"):
        squares = np.einsum("ij,ij->j", A, A)
    peak = np.max(np.abs(A), axis=0)
    big = np.flatnonzero(~np.isfinite(squares))
    small = np.flatnonzero((peak > 0) & (squares < np.finfo(np.float64).tiny))
    for bad, what in ((big, "large (their squares overflow float64)"),
                      (small, "small (their squares underflow float64)")):
        if bad.size:
            column = f" column {bad[0]}" if A.shape[1] > 1 else ""
            raise ValueError(f"{name}{column} has values too {what}: up to {peak[bad[0]]:.3g} in magnitude; "
                             f"rescale {name}")


def validate_predict(estimator, X, fitted_attribute):
    """scikit-learn's input checks at prediction time.

    Args:
        estimator: a fitted estimator (NotFittedError otherwise).
        X: (n, n_features_in_) array-like.
        fitted_attribute: an attribute that exists only after `fit`.

    Returns:
        X as float64 (n, n_features_in_); ValueError for a wrong number of features or non-finite values.
    """
    check_is_fitted(estimator, fitted_attribute)
    X = _validate_data(estimator, X, dtype=np.float64, reset=False)
    check_magnitude(X, "X")
    return X


def encode_labels(y):
    """Integer codes of classifier labels.

    Args:
        y: (n,) labels of any sortable type.

    Returns:
        (classes (K,) sorted, codes (n,) in [0, K)); ValueError for fewer than two classes.
    """
    classes, codes = np.unique(y, return_inverse=True)
    if len(classes) < 2:
        raise ValueError(f"the classifier needs samples of at least 2 classes in y; got one class: {classes[0]!r}")
    return classes, codes


ROW_BUCKET_MIN, COLUMN_BUCKET_MIN, BUCKET_STEPS = 256, 8, 4
"""Smallest padded sizes and sizes per octave: a fit's cost grows as O(N D^2), every distinct padded shape costs a
compilation (check_estimator's data sets of 10 to 300 rows and 1 to 10 columns share a few). Quarter-octave
sizes: diabetes' 331 x 11 design (Student-t ML-II) padded to 384 x 12 instead of 512 x 16."""


def pad_design(H, rows: bool = True):
    """The design padded with zero rows and columns to bucket sizes (see the module doc).

    Args:
        H: (n, d) float array.
        rows: pad the rows as well as the columns.

    Returns:
        (H padded (n_pad, d_pad), row mask (n_pad,) True on real rows, column mask (d_pad,) True on real columns).
    """
    n, d = H.shape
    n_pad = bucket(n, ROW_BUCKET_MIN, BUCKET_STEPS) if rows else n
    d_pad = bucket(d, COLUMN_BUCKET_MIN, BUCKET_STEPS)
    out = np.zeros((n_pad, d_pad))
    out[:n, :d] = H
    return out, np.arange(n_pad) < n, np.arange(d_pad) < d


def check_choice(value, name, choices):
    """`value` if it is one of the strings `choices`.

    Args:
        value: the parameter's value.
        name: the parameter's name (for the error).
        choices: the allowed strings.

    Returns:
        `value`; ValueError naming `name` otherwise.
    """
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_positive_float(value, name):
    """`value` as a positive finite float.

    Args:
        value: the parameter's value.
        name: the parameter's name (for the error).

    Returns:
        float; ValueError naming `name` otherwise.
    """
    try:
        v = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a positive number, got {value!r}") from err
    if not (np.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return v


def check_steps(value, name="max_steps"):
    """`value` as a positive int.

    Args:
        value: the parameter's value (bools refused).
        name: the parameter's name (for the error).

    Returns:
        int; ValueError naming `name` otherwise.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def fit_hyperparameters_or_once(build, params, learn, method, max_steps, method_kwargs=None):
    """`method(build(params))`, or with any `learn` flag set ML-II over the selected parameters first.

    Args:
        build: params -> `gkl_jax.Model` (an `eqx.Module`, so that the compiled ML-II loop is reused).
        params: dict of starting hyperparameters.
        learn: dict of bools, the same keys: which to learn (ML-II on the method's log_z,
            `gkl_jax.gp.fit_hyperparameters`).
        method: `gkl_jax.fit` (G-KL) or `gkl_jax.gp.exact`.
        max_steps: outer ML-II steps.
        method_kwargs: static options of the method (e.g. a solver object).

    Returns:
        (Result, params at the end, converged): converged requires the ML-II stopping rule and the inner fit.
    """
    kwargs = dict(method_kwargs or {})
    with quiet_convergence():
        if any(jax.tree.leaves(learn)):
            hyper = fit_hyperparameters(build, params, method=method, filter_spec=learn, max_steps=max_steps,
                                        method_kwargs=kwargs or None)
            return hyper.result, hyper.params, bool(hyper.converged) and bool(hyper.result.converged)
        result = method(build(params), **kwargs)
        return result, params, bool(result.converged)


def binary_targets(codes, n_classes):
    """+-1 targets of the binary problems: one (positive: class 1) for two classes, one per class (one-vs-rest).

    Args:
        codes: (n,) integer class codes in [0, n_classes).
        n_classes: K >= 2.

    Returns:
        list of (n,) float arrays.
    """
    positives = [codes == 1] if n_classes == 2 else [codes == k for k in range(n_classes)]
    return [np.where(t, 1.0, -1.0) for t in positives]


def per_problem(values):
    """A fitted attribute per binary problem.

    Args:
        values: list of K scalars.

    Returns:
        The scalar for one problem, an array (K,) for one-vs-rest.
    """
    return values[0] if len(values) == 1 else np.asarray(values)


@contextlib.contextmanager
def quiet_convergence():
    """Context manager: silence the library's non-convergence warnings inside a fit (the estimator reports
    `converged_` and issues one scikit-learn ConvergenceWarning itself)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"gkl_jax\.")
        yield


def warn_not_converged(estimator):
    """Issue one scikit-learn ConvergenceWarning naming the estimator.

    Args:
        estimator: the estimator whose fit did not converge.
    """
    from sklearn.exceptions import ConvergenceWarning
    warnings.warn(f"{type(estimator).__name__}: the fit did not converge; the fitted attributes are the last "
                  "iterate (converged_=False)", ConvergenceWarning, stacklevel=3)


def check_verbose(verbose) -> int:
    """`verbose` as an int level: False/0 silent, True/1 or more progress lines (ValueError naming verbose for
    anything but a bool or a non-negative integer)."""
    if isinstance(verbose, (bool, np.bool_)):
        return int(verbose)
    if isinstance(verbose, (int, np.integer)) and verbose >= 0:
        return int(verbose)
    raise ValueError(f"verbose must be a bool or a non-negative integer, got {verbose!r}")


PADDED_NOTE = " (step lines: the bound of the design padded with zero rows, a constant below log_evidence_)"
"""The linear estimators' verbose route line: their step lines report the padded problem's bound (`pad_design`)."""


class FitLog:
    """An estimator's progress lines on stderr (`verbose` >= 1), prefixed with its class name; `progress` is what
    the estimator passes as `progress=` to the underlying fits that take it (`gkl_jax.fit`,
    `gkl_jax.gp.fit_sparse_minibatch`).

    Args:
        estimator: the estimator being fitted (its `verbose` is checked here: ValueError naming verbose).
    """

    def __init__(self, estimator):
        self.name, self.level = type(estimator).__name__, check_verbose(getattr(estimator, "verbose", 0))
        self.start = time.perf_counter()

    @property
    def progress(self) -> bool:
        return self.level >= 1

    def __call__(self, text: str) -> None:
        """Print `text` where verbose."""
        if self.level >= 1:
            print(f"{self.name}: {text}", file=sys.stderr, flush=True)

    def done(self, text: str = "") -> None:
        """Print the closing line: the time since the log began and `text`."""
        self(f"fit done in {time.perf_counter() - self.start:.1f} s" + (f"; {text}" if text else ""))
