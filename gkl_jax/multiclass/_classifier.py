"""`GPClassifier`: a scikit-learn-style front end to the variational multinomial-logit GP (Chai 2012).

    clf = gk.multiclass.GPClassifier(kernel=gk.kernels.SquaredExponential(1.0, 1.0)).fit(X, y)
    clf.predict_proba(X_new); clf.predict(X_new); clf.classes_; clf.log_z_

`fit` learns the kernel hyper-parameters by maximising the bound log Z_h* (Section 6; `learn_hyperparameters`)
and keeps the variational optimum; predictions use the re-normalised probabilities of eq. 25 (`predict_proba`) or
the eq. 24 lower bounds (`predict_log_proba_bounds`). The estimator is an ordinary (mutable) Python object, as
scikit-learn's `fit` protocol requires; everything numerical lives in the functional API underneath. Its fits and
predictions compute in float64 (a local `jax.enable_x64` context) whatever JAX's global setting: in float32 the
inner tolerance is out of reach (iris: converged_=False, log Z 13 nats lower).
"""

import warnings

import jax
import numpy as np

from .._buckets import bucket
from .._inducing import INITS as INDUCING_INITS
from .._inducing import inducing_rows
from .._linalg import in_float64
from .._validate import check_int, check_max_steps, check_nonnegative, check_tol, device_array, host_arrays
from ..kernels import AbstractKernel, SquaredExponential, median_distance
from ._api import predict
from ._full import COVARIANCES, SITES
from ._hyper import fit_hyperparameters
from ._predict import Predictive, kronecker_predictive
from ._threads import single_blas_thread

OUTER_FTOL = 1e-5
"""The estimator's ML-II settling tolerance (relative gain per outer step; `fit_hyperparameters` defaults to 1e-7 for
the paper's tables): the last outer steps at 1e-7 gain too little to change the predictions (the
experiment is on the design-decisions page)."""

DENSE_MAX_LATENTS = 2000
"""With num_inducing=None, the most latents n C fitted with the full bound (cost (n C)^3 per sweep: glass, 214 x 7,
stays dense); above, the sparse bound with `DEFAULT_INDUCING_LATENTS` inducing latents (500 digits, 5000 latents:
the full bound had not returned after 30 minutes)."""

DEFAULT_INDUCING_LATENTS = 200
"""The inducing latents s where num_inducing=None switches to the sparse bound (1000 digits: ML-II in about 30 s,
test accuracy 0.875-0.910; benchmarks/README.md)."""

PREDICT_BUCKET_MIN = 16
"""The smallest padded number of test points in `GPClassifier.predictive` (quarter-octave buckets above it)."""


def _as_inputs(X, name):
    try:
        X = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a numeric array of shape (n, d)") from err
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2 or 0 in X.shape:
        raise ValueError(f"{name} must be a non-empty array of shape (n, d), got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ValueError(f"{name} contains NaN or inf")
    return X


class GPClassifier:
    """Multi-class GP classifier with the multinomial-logit likelihood and the variational bound of Chai (2012,
    Theorem 6 and eq. 21).

    Args:
        kernel: a `gk.kernels` kernel on the inputs; None (default): the sqexpiso kernel of eq. 45,
            SquaredExponential(1, l), with l the median distance between the training inputs
            (`gk.kernels.median_distance`), where ML-II starts.
        fixed: names of kernel attributes kept fixed while learning (e.g. ("log_variance",) for the unit-variance
            usqexpard kernel of eq. 44).
        learn_hyperparameters: maximise log Z_h* over the kernel parameters (otherwise fit at the given kernel).
        classes: optional explicit 1-D sequence of class labels (C = len(classes)); a class without training
            examples is allowed (the paper keeps the empty class 4 of glass, C = 7); by default the labels present
            in `y`.
        site: "theorem6" or "knowles_minka", the site bound (see `gk.multiclass.fit`).
        covariance: "full" or "class_factorised".
        jitter: non-negative float added to the prior's diagonal.
        max_steps: the most outer (ML-II) steps.
        tol: the inner fit's tolerance on the bound.
        num_inducing: None (default): the full bound, whose cost grows as (n C)^3, up to `DENSE_MAX_LATENTS`
            latents (n C), above that the sparse bound with `DEFAULT_INDUCING_LATENTS` inducing latents; an int s
            for the sparse bound of Chai (2012, Section 4) on s latents f^c(x_i), at O(n C s^2) per sweep (ML-II
            through `fit_hyperparameters(inducing=...)`); s >= n C uses the full bound; "all": the full bound at
            every size.
        inducing: how the inducing latents are chosen: "random" (default; s latents f^c(x_i) uniformly) or
            "kmeans++" (rows x_i by k-means++ seeding, all C latents at each, s in all), seeded by `random_state`.
        random_state: the integer seed of that draw.

    Attributes:
        classes_: (C,) NumPy array of the class labels, in the column order of `predict_proba` (after `fit`).
        kernel_: the learned kernel.
        log_z_: float, the optimised lower bound on log p(y).
        posterior_: the `gk.multiclass.Posterior` at `kernel_`.
        converged_: bool, whether the outer and the inner fits settled.

    Raises:
        ValueError: a bad kernel, `fixed`, `classes`, option or tolerance.

    Example:
        >>> import numpy as np, gkl_jax as gk
        >>> X = np.array([[-2.0], [-1.5], [0.0], [0.2], [1.6], [2.1]])
        >>> y = np.array(["a", "a", "b", "b", "c", "c"])
        >>> clf = gk.multiclass.GPClassifier(learn_hyperparameters=False).fit(X, y)
        >>> clf.classes_.tolist(), clf.predict(np.array([[-2.0], [2.0]])).tolist()
        (['a', 'b', 'c'], ['a', 'c'])
        >>> bool(clf.converged_), clf.predict_proba(X).shape, bool(clf.log_z_ < 0)
        (True, (6, 3), True)
    """

    def __init__(self, kernel=None, *, fixed=(), learn_hyperparameters=True, classes=None, site="theorem6",
                 covariance="full", jitter=1e-6, max_steps=50, tol=1e-8, num_inducing=None, inducing="random",
                 random_state=0):
        if site not in SITES:
            raise ValueError(f"site must be one of {SITES}, got {site!r}")
        if covariance not in COVARIANCES:
            raise ValueError(f"covariance must be one of {COVARIANCES}, got {covariance!r}")
        if kernel is not None and not isinstance(kernel, AbstractKernel):
            raise ValueError(f"kernel must be a gkl_jax.kernels kernel, got {type(kernel).__name__}")
        if not isinstance(fixed, (tuple, list)) or not all(isinstance(f, str) for f in fixed):
            raise ValueError(f"fixed must be a sequence of kernel parameter names, got {fixed!r}")
        if classes is not None and (isinstance(classes, str) or np.ndim(classes) != 1):
            raise ValueError(f"classes must be a 1-D sequence of class labels, got {classes!r}")
        self.kernel = kernel
        self.fixed = tuple(fixed)
        self.learn_hyperparameters = bool(learn_hyperparameters)
        self.classes = classes
        self.site = site
        self.covariance = covariance
        self.jitter = check_nonnegative(jitter, "jitter")
        self.max_steps = check_max_steps(max_steps)
        self.tol = check_tol(tol)
        if not (num_inducing is None or (isinstance(num_inducing, str) and num_inducing == "all")):
            num_inducing = check_int(num_inducing, "num_inducing", 1)
        self.num_inducing = num_inducing
        if inducing not in INDUCING_INITS:
            raise ValueError(f"inducing must be one of {INDUCING_INITS}, got {inducing!r}")
        self.inducing = inducing
        self.random_state = check_int(random_state, "random_state", 0)

    def _encode(self, y, n):
        y = np.asarray(y)
        if y.ndim != 1:
            raise ValueError(f"y must be a 1-D array of labels, got shape {y.shape}")
        if y.shape[0] != n:
            raise ValueError(f"y has {y.shape[0]} labels but X has {n} rows")
        if y.dtype.kind == "f":
            if not np.all(np.isfinite(y)):
                raise ValueError("y contains NaN or inf")
            if not np.all(y == np.round(y)):
                raise ValueError("y must hold class labels (integers or strings), got non-integer floats")
        if y.dtype.kind not in "biufUSO":
            raise ValueError(f"y must hold integer or string class labels, got dtype {y.dtype}")
        if self.classes is None:
            try:
                classes, idx, counts = np.unique(y, return_inverse=True, return_counts=True)
            except TypeError as err:    # labels that cannot be ordered: mixed types, None
                raise ValueError(f"y must hold labels of one type (integers or strings): {err}") from err
        else:
            classes = np.asarray(self.classes)
            if len(np.unique(classes)) != len(classes):
                raise ValueError("classes must not repeat a label")
            lookup = {c.item() if hasattr(c, "item") else c: i for i, c in enumerate(classes)}
            try:
                idx = np.array([lookup[v.item() if hasattr(v, "item") else v] for v in y])
            except KeyError as err:
                raise ValueError(f"y holds the label {err.args[0]!r}, which is not in classes") from err
            counts = np.bincount(idx, minlength=len(classes))
        if len(classes) < 2:
            raise ValueError(f"y must contain at least 2 classes, got {list(classes)}")
        present = counts[counts > 0]
        if np.any(present < 2):
            bad = [classes[i] for i in range(len(classes)) if counts[i] == 1]
            raise ValueError(f"y has a class with a single example ({bad}); every class present needs >= 2")
        return classes, np.eye(len(classes))[idx]

    def __getstate__(self):
        """The state with numpy arrays in place of JAX arrays (`gkl_jax._validate.host_arrays`): a float64 JAX
        array unpickles as float32 where x64 is off."""
        return host_arrays(self.__dict__)

    @in_float64
    def fit(self, X, y, progress=False):
        """Fit the variational posterior (and, by default, the kernel hyper-parameters).

        Args:
            X: (n, d) inputs.
            y: (n,) class labels.
            progress: False (default), True (a line per outer ML-II step on stderr: the bound and the largest
                gradient entry), "auto" or a callable, as `gk.multiclass.fit_hyperparameters` takes it.

        Returns:
            self.
        """
        X = _as_inputs(X, "X")
        self.classes_, Y = self._encode(y, X.shape[0])
        inducing = self._inducing_latents(X, Y.shape[1])
        # one compiled program serves both cases: without learning, the outer loop takes no step
        kernel = SquaredExponential(1.0, median_distance(X)) if self.kernel is None else self.kernel
        res = fit_hyperparameters(kernel, X, Y, fixed=self.fixed, jitter=self.jitter, site=self.site,
                                  covariance=self.covariance, inner_tol=self.tol, ftol=OUTER_FTOL,
                                  max_steps=self.max_steps if self.learn_hyperparameters else 0, inducing=inducing,
                                  progress=progress)
        self.kernel_ = res.kernel
        post = res.posterior
        self.converged_ = bool(res.converged) and bool(post.converged)
        if not bool(post.converged):
            warnings.warn("gkl_jax.multiclass.GPClassifier: the variational fit did not settle within its sweep "
                          "limit; the bound is valid but not the optimum (converged_ is False)", stacklevel=2)
        self.posterior_ = post
        self.log_z_ = float(post.log_z)
        self.X_train_ = X
        self._alpha = None if inducing is not None else post.alpha
        self._T = res.t_matrix
        return self

    def _inducing_latents(self, X, C):
        """The sorted indices i C + c of the inducing latents f^c(x_i), or None for the full bound (`num_inducing`,
        `inducing`)."""
        n = X.shape[0]
        s = self.num_inducing
        if s is None:
            if n * C <= DENSE_MAX_LATENTS:
                return None
            s = DEFAULT_INDUCING_LATENTS
        if s == "all" or s >= n * C:
            return None
        rng = np.random.default_rng(self.random_state)
        if self.inducing == "random":
            return np.sort(rng.choice(n * C, s, replace=False))
        rows = inducing_rows(X, min(-(-s // C), n), "kmeans++", rng)
        return np.sort((rows[:, None] * C + np.arange(C)[None, :]).ravel()[:s])

    def _check_fitted(self):
        if not hasattr(self, "posterior_"):
            raise ValueError("this GPClassifier is not fitted yet; call fit(X, y) first")

    def _padded_predictive(self, X_new):
        """The predictive at X_new's rows padded to a bucket size (`_buckets.bucket`): test points do not interact, so
        the padding (copies of the last row) changes nothing in the first n_* rows, and a new test size compiles the
        predictive (and the probabilities) once per bucket instead of once per size.

        Args:
            X_new: (n_*, d) inputs (checked here).

        Returns:
            (the `Predictive` at the padded rows, n_*).
        """
        self._check_fitted()
        X_new = _as_inputs(X_new, "X_new")
        if X_new.shape[1] != self.X_train_.shape[1]:
            raise ValueError(f"X_new has {X_new.shape[1]} columns but the classifier was fitted on "
                             f"{self.X_train_.shape[1]}")
        n_new = X_new.shape[0]
        X_pad = np.concatenate([X_new, np.repeat(X_new[-1:], bucket(n_new, PREDICT_BUCKET_MIN, 4) - n_new, 0)])
        with single_blas_thread():
            if self._T is None:     # the sparse bound: its own predictive (`gk.multiclass.predict`)
                return predict(self.posterior_, X_pad), n_new
            return kronecker_predictive(self.kernel_, self.X_train_, X_pad, self._alpha, self._T), n_new

    @in_float64
    def predictive(self, X_new):
        """The Gaussian predictive N(m_*, V_*) of the latent values at X_new.

        Args:
            X_new: (n_*, d) inputs.

        Returns:
            A `Predictive` with `mean` (n_*, C) and `covariance` (n_*, C, C).
        """
        pred, n_new = self._padded_predictive(X_new)
        return Predictive(mean=device_array(np.asarray(pred.mean)[:n_new]),
                          covariance=device_array(np.asarray(pred.covariance)[:n_new]))

    @in_float64
    def predict_proba(self, X_new, method="mean", num_samples=2000, seed=0):
        """Class probabilities, shape (n_*, C), columns in `classes_` order.

        method="mean" (the default) is softmax(m_*), the re-normalised probabilities of eq. 25: deterministic,
        cheap, and the decision rule of Chai (2012). method="integrated" is the predictive probability
        E[softmax(f_*)] under the latent predictive N(m_*, V_*), by Monte Carlo with `num_samples` antithetic
        draws (fixed `seed`): better calibrated where V_* is large (far from the data), at the cost of sampling.

        Args:
            X_new: (n_*, d) inputs.
            method: "mean" or "integrated".
            num_samples: Monte Carlo draws per test point for "integrated" (even; rounded up).
            seed: the integer seed of those draws.

        Returns:
            (n_*, C) NumPy array of probabilities (rows sum to one).
        """
        if method not in ("mean", "integrated"):
            raise ValueError(f"method must be 'mean' or 'integrated', got {method!r}")
        if method == "integrated":
            num_samples = check_int(num_samples, "num_samples", 2)
        pred, n_new = self._padded_predictive(X_new)
        if method == "mean":
            return np.asarray(pred.renormalised_probabilities())[:n_new]
        with single_blas_thread():
            key = jax.random.PRNGKey(int(seed))
            return np.asarray(pred.integrated_probabilities(key, (num_samples + 1) // 2))[:n_new]

    @in_float64
    def predict_log_proba_bounds(self, X_new):
        """The eq. 24 approximate lower bounds on log p(y_* = c | y).

        Args:
            X_new: (n_*, d) inputs.

        Returns:
            (n_*, C) NumPy float array, columns in `classes_` order.
        """
        pred, n_new = self._padded_predictive(X_new)
        return np.asarray(pred.log_lower_bounds())[:n_new]

    def predict(self, X_new):
        """The most probable class label for each row of X_new (the largest eq. 25 probability).

        Args:
            X_new: (n_*, d) inputs.

        Returns:
            (n_*,) NumPy array of labels from `classes_`.
        """
        proba = self.predict_proba(X_new)
        return self.classes_[np.argmax(proba, axis=1)]
