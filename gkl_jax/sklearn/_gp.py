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

Dense or sparse (`num_inducing`): the dense GP costs O(n^3) per inner fit; the sparse GP over M inducing values
u = f(Z) (Titsias 2009; `gkl_jax.gp.sparse_model`) O(n M^2). By default the dense GP up to `DENSE_MAX` training
rows and the sparse GP with `DEFAULT_INDUCING` inducing inputs above, never an O(n^3) fit of half an hour.

Minibatch (`batch_size`): the sparse GP fitted by stochastic gradients on minibatches of B rows, hyperparameters
jointly, the final bound the full-data bound streamed (`_gp_minibatch`; N up to 10^6 in bounded memory).

Compilation: the training rows (and the test rows of a prediction) are padded to a bucket size with masked sites
(`_gp_model`), so every data set of a bucket (cross-validation folds, grid-search points, refits) reuses one
compiled fit; a masked site contributes exactly nothing. The minibatch route does not pad (`_gp_minibatch`).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin

from .._fit import fit as gk_fit
from .._inducing import INITS as INDUCING_INITS
from ..gp import exact as gp_exact
from ..gp import predict as gp_predict
from ..gp._predict import with_targets
from ..kernels import AbstractKernel, SquaredExponential, median_distance
from . import _ml2 as ml2
from ._common import (
    FitLog,
    HostState,
    binary_targets,
    check_choice,
    check_positive_float,
    check_steps,
    encode_labels,
    fit_hyperparameters_or_once,
    float64,
    per_problem,
    validate_fit,
    validate_predict,
    warn_not_converged,
)
from ._gp_minibatch import check_batch_size, check_num_epochs, fit_minibatch
from ._gp_ml2 import fit_gkl_ml2
from ._gp_model import (
    DEFAULT_INDUCING,
    DENSE_MAX,
    GPBuild,
    inducing_inputs,
    pad_rows,
    padded_inputs,
    route_text,
    rows_bucket,
)
from ._gp_start import ScaledBuild, fisher_factor, robust_scale, scaled_start
from ._outputs import ProbabilisticClassifierMixin, StandardisedRegressorMixin

_LIKELIHOODS = ("logistic", "probit")
_REGRESSION_LIKELIHOODS = ("gaussian", "student-t", "laplace")


def _kernel(kernel, X=None):
    """The kernel to start from: `kernel`, or for None SquaredExponential(1, lengthscale), the lengthscale 1 or,
    given inputs X, their median pairwise distance (`median_distance`)."""
    if kernel is None:
        return SquaredExponential(1.0, 1.0 if X is None else median_distance(X))
    if not isinstance(kernel, AbstractKernel):
        raise ValueError(f"kernel must be a gkl_jax.kernels kernel or None, got {type(kernel).__name__}")
    return kernel


def _inducing(est, X):
    """The starting inducing inputs Z (M, d) of `est`'s fit on X, or None for the dense GP (module doc): with
    num_inducing=None the dense GP up to DENSE_MAX rows (unless `inducing` is an array or `batch_size` is set),
    `DEFAULT_INDUCING` inducing inputs (at most n) above; num_inducing="all" the dense GP at every size (an error
    naming batch_size with a minibatch fit, which needs the sparse GP)."""
    M, n = est.num_inducing, X.shape[0]
    given = not isinstance(est.inducing, str)
    minibatch = check_batch_size(est.batch_size, n) is not None
    if not given:
        check_choice(est.inducing, "inducing", INDUCING_INITS)
    if isinstance(M, str) and M == "all" and not given:
        if minibatch:
            raise ValueError("batch_size fits the sparse GP by minibatches; it needs num_inducing=None or an "
                             "integer, not 'all' (or batch_size=None for the dense GP)")
        return None
    if M is None and not given:
        if n <= DENSE_MAX and not minibatch:
            return None
        M = min(DEFAULT_INDUCING, n)
    if M is not None and (isinstance(M, bool) or not isinstance(M, (int, np.integer)) or not 1 <= M <= n):
        raise ValueError(f"num_inducing must be None, 'all' or an integer in [1, n] = [1, {n}] (the number of "
                         f"training rows), got {M!r}")
    Z = inducing_inputs(X, M, est.inducing, est.random_state)
    if given and M is not None and Z.shape[0] != M:
        raise ValueError(f"num_inducing={M} but inducing holds {Z.shape[0]} inducing inputs")
    return Z


def _fit_gp(est, data, y, likelihood, noise, learn_noise, dof=1.0, kernel=None, Z=None, R=None, progress=False):
    """One GP fit of `est`'s settings on the padded inputs `data` = (X (n_pad, d), mask) and targets y (n,), ML-II
    from `kernel` (default `est.kernel`) over the kernel, the noise (`learn_noise`) and, sparse (Z (M, d) the
    starting inducing inputs), Z where `est.learn_inducing`; given `R` (`_gp_start.fisher_factor`, dense only),
    ML-II of the kernel and the noise in u = R theta. `progress` goes to `gkl_jax.fit` where the hyperparameters
    are fixed, and to the ML-II loop (its outer steps).

    Returns:
        (Result, GP prior at the fitted parameters, params, converged, log Z of the unpadded problem).
    """
    Xp, mask = data
    yp = pad_rows(y, len(mask), 1.0 if likelihood in _LIKELIHOODS else 0.0)
    build = GPBuild(Xp, yp, mask, np.asarray(float(dof)), likelihood,
                    check_positive_float(est.jitter, "jitter"), Z is not None)
    params = {"kernel": _kernel(est.kernel) if kernel is None else kernel,
              "log_noise": np.asarray(np.log(noise))}
    learn = bool(est.learn_hyperparameters)
    flags = {"kernel": learn, "log_noise": learn and bool(learn_noise)}
    if Z is not None:
        params["Z"], flags["Z"] = jnp.asarray(Z), bool(est.learn_inducing)
    method = gp_exact if likelihood == "gaussian" else gk_fit
    if likelihood == "gaussian" and learn and Z is None:
        # the closed-form evidence and gradient in one compiled program (`_ml2`); the posterior once, at the end
        params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64) if eqx.is_inexact_array(a) else a, params)
        dyn, static = eqx.partition(params, flags)
        objective = ml2.GPEvidence(build.X, build.y, static, build.jitter, mask=build.mask)
        params, converged, _ = ml2.run(objective, ml2.settings(check_steps(est.max_steps), GP_MAX_STEP), dyn, {},
                                       _Combine(static))
        result = gp_exact(build(params))
        converged = bool(converged) and bool(result.converged)
        prior = build(params).prior
    elif R is not None and learn and learn_noise:   # Student-t: ML-II in u = R theta (`_gp_start`)
        # the inner fits: ML-II's default there, the site-precision solver from the last optimum (`_gp_start`)
        scaled = ScaledBuild(build, jnp.asarray(np.linalg.inv(R)), params["kernel"])
        start = scaled_start(params["kernel"], float(params["log_noise"]), R)
        result, prior, u, converged = fit_gkl_ml2(scaled, start, {"u": True}, check_steps(est.max_steps), len(mask),
                                                      progress)
        params = scaled.params(u["u"])
    elif method is gk_fit and any(jax.tree.leaves(flags)):     # G-KL ML-II in one program (`_gp_ml2`)
        result, prior, params, converged = fit_gkl_ml2(build, params, flags, check_steps(est.max_steps),
                                                         len(mask), progress)
    else:
        shown = {"progress": True} if progress and method is gk_fit and not any(flags.values()) else None
        result, params, converged = fit_hyperparameters_or_once(build, params, flags, method,
                                                                 check_steps(est.max_steps), shown)
        prior = build(params).prior
    return result, prior, params, converged, float(result.log_z) - build.padding_log_z()


def _predict_padded(result, prior, X, family, z=None):
    """`gkl_jax.gp.predict` at the rows of X padded to a bucket size (`rows_bucket`; test points do not interact,
    so one compiled prediction serves every size of a bucket), cut back to X's rows; z: targets for the
    predictive densities, or None."""
    n = X.shape[0]
    Xp = pad_rows(X, rows_bucket(n))
    if z is not None:
        family = with_targets(family, jnp.asarray(pad_rows(z, Xp.shape[0])), Xp.shape[0])
    pred = gp_predict(result, prior, Xp, family=family) if z is None else \
        gp_predict(result, prior, Xp, family)
    return jax.tree.map(lambda a: np.asarray(a)[:n] if np.ndim(a) >= 1 else a, pred)


GP_MAX_STEP = 1.0
"""The largest first move of a log-parameter in the Gaussian regressor's ML-II line searches (e^1 per step; the
default 3 of `fit_hyperparameters` jumped from lengthscale 1 into the white-noise optimum on diabetes)."""


class _Combine(eqx.Module):
    """(learned leaves, inner result) -> all the parameters, inside the compiled ML-II."""

    static: dict

    def __call__(self, dyn, result):
        return eqx.combine(dyn, self.static)


class GPClassifier(ProbabilisticClassifierMixin, ClassifierMixin, HostState, BaseEstimator):
    """Binary GP classifier by G-KL inference (one-vs-rest for more classes), dense or sparse.

    Args:
        kernel: a `gkl_jax.kernels` kernel (default SquaredExponential(1, 1)); the starting point of ML-II.
        likelihood: "logistic" (default) or "probit".
        learn_hyperparameters: ML-II on the bound over the kernel parameters (default True).
        jitter: added to the Gram matrix's diagonal.
        max_steps: outer ML-II steps.
        num_inducing: None (default): the dense GP up to 2000 training rows (cost O(n^3) per inner fit),
            above that the sparse GP with 500 inducing inputs; an int M in [1, n]: the sparse GP over u = f(Z)
            with M inducing inputs (Titsias 2009; cost O(n M^2)); "all": the dense GP at every size.
        inducing: the starting inducing inputs: "kmeans++" (default; M training rows by k-means++ seeding, spread
            over the data), "random" (M distinct training rows), or an (M, d) array.
        learn_inducing: learn the inducing inputs in ML-II with the kernel (default False; M d more parameters).
        random_state: None or an int, the seed of the inducing-input initialisation (and of the minibatches).
        batch_size: None (default): every fit sees all training rows; an int B in [1, n]: the sparse GP (M =
            num_inducing, default min(500, n) at every n) fitted by stochastic gradients on minibatches of B rows
            with the kernel learned jointly (`gkl_jax.gp.fit_sparse_minibatch`; Hensman et al. 2015), the
            final bound the full-data bound streamed in chunks: n up to 10^6 in bounded memory. Compiled once per
            (n, B, number of steps): no size buckets.
        num_epochs: with batch_size, the passes over the training rows (a positive float; round(num_epochs n / B)
            optimiser steps); None (default): 1000 steps. A fit whose full-data gradient misses the tolerance sets
            converged_=False and warns (more epochs close the gap).
        verbose: 0/False (default) silent; 1/True (or more): progress lines on stderr: the estimator's own (the
            route, the problems, the time and bound at the end) and the underlying fit's steps where it reports
            them (the ML-II loop's outer steps, `gkl_jax.fit` at fixed hyperparameters,
            `gkl_jax.gp.fit_sparse_minibatch`). Turning it on compiles those fits once more.

    Attributes (after `fit`): classes_, kernel_ (learned; a list one-vs-rest), log_evidence_ (the bound on
    log p(y | X); an array one-vs-rest; with batch_size the full-data bound at the final parameters), converged_,
    inducing_inputs_ (the (M, d) inducing inputs, a list one-vs-rest, or None for the dense GP).

    Compilation: the fit compiles once per bucket of training-set sizes (eighth octaves from 32 rows: 1000 and
    1020 rows share the 1024-row fit), the predictions once per bucket of test-set sizes.
    """

    def __init__(self, kernel=None, *, likelihood="logistic", learn_hyperparameters=True, jitter=1e-6,
                 max_steps=100, num_inducing=None, inducing="kmeans++", learn_inducing=False, random_state=0,
                 batch_size=None, num_epochs=None, verbose=0):
        self.kernel = kernel
        self.likelihood = likelihood
        self.learn_hyperparameters = learn_hyperparameters
        self.jitter = jitter
        self.max_steps = max_steps
        self.num_inducing = num_inducing
        self.inducing = inducing
        self.learn_inducing = learn_inducing
        self.random_state = random_state
        self.batch_size = batch_size
        self.num_epochs = num_epochs
        self.verbose = verbose

    @float64
    def fit(self, X, y):
        """Fit the posterior and (by default) the kernel.

        Args:
            X: (n, d) array-like of finite inputs.
            y: (n,) labels of any type, at least two classes.

        Returns:
            self.
        """
        log = FitLog(self)
        check_choice(self.likelihood, "likelihood", _LIKELIHOODS)
        check_num_epochs(self.num_epochs)
        X, y = validate_fit(self, X, y, classifier=True)
        self.classes_, codes = encode_labels(y)
        Z, targets = _inducing(self, X), binary_targets(codes, len(self.classes_))
        log(f"{len(targets)} binary problem(s), {route_text(self, X, Z)}")
        if self.batch_size is not None:
            fits = [fit_minibatch(self, X, t, self.likelihood, _kernel(self.kernel), Z, progress=log.progress)
                    for t in targets]
        else:
            data = padded_inputs(X)
            fits = [_fit_gp(self, data, t, self.likelihood, 1.0, False, Z=Z, progress=log.progress)
                    for t in targets]
        self._fits = [(result, prior) for result, prior, _, _, _ in fits]
        kernels = [params["kernel"] for _, _, params, _, _ in fits]
        self.kernel_ = kernels[0] if len(kernels) == 1 else kernels
        inducing = [np.asarray(params["Z"]) for _, _, params, _, _ in fits] if Z is not None else [None]
        self.inducing_inputs_ = inducing[0] if len(inducing) == 1 else inducing
        self.log_evidence_ = per_problem([log_z for _, _, _, _, log_z in fits])
        self.converged_ = all(converged for _, _, _, converged, _ in fits)
        log.done(f"log_evidence_ {np.round(self.log_evidence_, 6)}, converged_ {self.converged_}")
        if not self.converged_:
            warn_not_converged(self)
        return self

    @float64
    def _positive_probabilities(self, X):
        X = validate_predict(self, X, "_fits")
        return np.stack([_predict_padded(r, prior, X, self.likelihood).probability for r, prior in self._fits],
                        axis=1)


class GPRegressor(StandardisedRegressorMixin, RegressorMixin, HostState, BaseEstimator):
    """GP regression with a Gaussian (exact), Student-t or Laplace (G-KL) likelihood, dense or sparse.

    Args:
        kernel: a `gkl_jax.kernels` kernel, the starting point of ML-II (default SquaredExponential(1, l) with
            l the median distance between the training inputs, `median_distance`).
        likelihood: "gaussian", "student-t" or "laplace".
        noise: the likelihood's variance (gaussian) or scale, in units of the standardised targets (start value);
            None (default): 1 for the Gaussian likelihood (all of the targets' variance; on diabetes with outliers
            ML-II from 0.1 stopped on one split of ten at log p = -449.90 where scikit-learn's optimum is -449.87,
            from 1 it found -449.87); for the Student-t likelihood with ML-II 1.4826 times the median absolute
            deviation of the Gaussian fit's leave-one-out residuals (dense GP; 0.1 sparse); 0.1 otherwise.
        dof: Student-t degrees of freedom (fixed).
        learn_hyperparameters: ML-II over the kernel and the noise (default True).
        jitter, max_steps: as `GPClassifier`.
        num_inducing: None (default): the dense GP up to 2000 training rows (cost O(n^3) per inner fit),
            above that the sparse GP with 500 inducing inputs; an int M in [1, n]: the sparse GP over u = f(Z)
            with M inducing inputs (Titsias 2009; cost O(n M^2)); "all": the dense GP at every size.
        inducing: the starting inducing inputs: "kmeans++" (default; M training rows by k-means++ seeding, spread
            over the data), "random" (M distinct training rows), or an (M, d) array.
        learn_inducing: learn the inducing inputs in ML-II with the kernel (default False; M d more parameters).
        random_state: None or an int, the seed of the inducing-input initialisation (and of the minibatches).
        batch_size: None (default): every fit sees all training rows; an int B in [1, n]: the sparse GP (M =
            num_inducing, default min(500, n) at every n) fitted by stochastic gradients on minibatches of B rows
            with the kernel and the noise learned jointly (`gkl_jax.gp.fit_sparse_minibatch`; Hensman et al. 2015), the
            final bound the full-data bound streamed in chunks: n up to 10^6 in bounded memory. Compiled once per
            (n, B, number of steps): no size buckets.
        num_epochs: with batch_size, the passes over the training rows (a positive float; round(num_epochs n / B)
            optimiser steps); None (default): 1000 steps. A fit whose full-data gradient misses the tolerance sets
            converged_=False and warns (more epochs close the gap).
        verbose: 0/False (default) silent; 1/True (or more): progress lines on stderr: the estimator's own (the
            route, the problems, the time and bound at the end) and the underlying fit's steps where it reports
            them (the ML-II loop's outer steps, `gkl_jax.fit` at fixed hyperparameters,
            `gkl_jax.gp.fit_sparse_minibatch`). Turning it on compiles those fits once more.

    Attributes (after `fit`): kernel_, noise_ (standardised units), log_evidence_ (log p(y | X) for the Gaussian
    likelihood, Titsias' collapsed bound sparse, else the bound; with batch_size the full-data G-KL bound at the
    final parameters, below the collapsed bound where q is not optimal; original units), converged_,
    inducing_inputs_ ((M, d), or None for the dense GP).

    Compilation: as `GPClassifier`, once per bucket of training-set sizes and of test-set sizes.
    """

    _fitted_attribute = "_fit"

    def __init__(self, kernel=None, *, likelihood="gaussian", noise=None, dof=4.0, learn_hyperparameters=True,
                 jitter=1e-6, max_steps=100, num_inducing=None, inducing="kmeans++", learn_inducing=False,
                 random_state=0, batch_size=None, num_epochs=None, verbose=0):
        self.kernel = kernel
        self.likelihood = likelihood
        self.noise = noise
        self.dof = dof
        self.learn_hyperparameters = learn_hyperparameters
        self.jitter = jitter
        self.max_steps = max_steps
        self.num_inducing = num_inducing
        self.inducing = inducing
        self.learn_inducing = learn_inducing
        self.random_state = random_state
        self.batch_size = batch_size
        self.num_epochs = num_epochs
        self.verbose = verbose

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
        log = FitLog(self)
        check_choice(self.likelihood, "likelihood", _REGRESSION_LIKELIHOODS)
        check_num_epochs(self.num_epochs)
        noise = ((1.0 if self.likelihood == "gaussian" else 0.1) if self.noise is None
                 else check_positive_float(self.noise, "noise"))
        dof = check_positive_float(self.dof, "dof")
        X, y = validate_fit(self, X, y, classifier=False)
        z = self._standardise(y, np.mean)
        kernel, R = _kernel(self.kernel, X), None
        Z = _inducing(self, X)
        log(route_text(self, X, Z))
        if self.batch_size is not None:
            result, prior, params, converged, log_z = fit_minibatch(self, X, z, self.likelihood, kernel, Z,
                                                                    noise=noise, dof=dof, learn_noise=True,
                                                                    progress=log.progress)
        else:
            data = padded_inputs(X)
            if self.likelihood == "student-t" and self.learn_hyperparameters and Z is None:   # from the data
                jitter = check_positive_float(self.jitter, "jitter")
                if self.noise is None:
                    gaussian = _fit_gp(self, data, z, "gaussian", 1.0, True, kernel=kernel)[2]
                    noise = robust_scale(gaussian, X, z, jitter)
                R = fisher_factor(kernel, data[0], noise ** 2, jitter, dof, data[1])
            result, prior, params, converged, log_z = _fit_gp(self, data, z, self.likelihood, noise, True, dof,
                                                              kernel, Z, R, log.progress)
        self._fit = (result, prior)
        self.kernel_ = params["kernel"]
        self.inducing_inputs_ = None if Z is None else np.asarray(params["Z"])
        self.noise_ = float(jnp.exp(params["log_noise"]))
        self.log_evidence_ = log_z - len(y) * np.log(self._y_scale)
        self.converged_ = converged
        log.done(f"log_evidence_ {self.log_evidence_:.6f}, converged_ {converged}")
        if not converged:
            warn_not_converged(self)
        return self

    def _predictive(self, X, family, z):
        result, prior = self._fit
        return _predict_padded(result, prior, X, family, z)
