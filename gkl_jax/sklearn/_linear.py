"""Bayesian linear models as scikit-learn estimators: G-KL posteriors over the weights (Challis & Barber 2013).

- `BayesianLogisticRegression`: p(w) = N(0, prior_variance I), p(y_n | w) = sigmoid(y_n x_n^T w); predict_proba is
  the predictive integral E_q[sigmoid(x^T w)] (Gauss-Hermite over the 1-D latent x^T w ~ N(mu, s^2); MacKay 1992),
  not the plug-in sigmoid(mu). More than two classes: one-vs-rest (one binary posterior per class, the
  probabilities normalised over the classes).
- `BayesianRegression`: the same prior with a Gaussian, Student-t or Laplace likelihood (robust regression);
  predict(X, return_std=True) gives the predictive mean and sd including the noise.

The intercept is a weight on a constant column with prior N(0, intercept_variance) (not shrunk like the others
with the default 100), except in the Gaussian regression, whose default intercept has a flat prior, integrated in
closed form on the centred data (the mean mean(y) - mean(x)^T w of BayesianRidge's plug-in, and its own noise / n
variance beside that of mean(x)^T w).
`learn_prior_variance` (and `learn_noise`) maximise the bound log Z >= B over the log-variances (ML-II): for the
Student-t and logistic models with the Full factor jointly with q, one Newton-CG over (hyperparameters, m, C)
(`_joint`); otherwise, or where that does not settle, by the outer loop of `gkl_jax.gp.fit_hyperparameters`
(envelope gradients, compiled with the inner fits and the outputs into one program, `_ml2`). `log_evidence_` is the
optimised bound, a lower bound on log p(y | X) (for the regression models: of the original, unstandardised targets).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin

from .. import factors as F
from .._buckets import bucket
from .._fit import fit as gk_fit
from .._predict import predict as gk_predict
from .._progress import resolve_progress
from . import _ml2 as ml2
from ._common import (
    PADDED_NOTE,
    FitLog,
    HostState,
    binary_targets,
    check_choice,
    check_positive_float,
    check_steps,
    encode_labels,
    float64,
    pad_design,
    per_problem,
    quiet_convergence,
    validate_fit,
    validate_predict,
    warn_not_converged,
)
from ._joint import JOINT, JOINT_MAX_STEPS, joint_fit
from ._linear_model import _Build, _factor, _Finish, _fit_fixed, _method
from ._outputs import ProbabilisticClassifierMixin, StandardisedRegressorMixin, noise_family

LIKELIHOODS = ("gaussian", "student-t", "laplace")

ROBUST_INTERCEPT_VARIANCE = 100.0
"""The robust regressions' intercept prior variance (standardised units) at intercept_variance=None."""


class _BayesianLinear(HostState, BaseEstimator):
    """The shared fit of one binary or regression problem on a padded design."""

    _fitted_attribute = "_results"

    def _design(self, X):
        """X with a constant column for an integrated intercept, or X less its training mean for
        `BayesianRegression`'s plug-in one (`_x_mean`)."""
        x_mean = getattr(self, "_x_mean", None)
        if x_mean is not None:
            return X - x_mean
        return np.hstack([X, np.ones((X.shape[0], 1))]) if self.fit_intercept else X

    def _intercept_column(self):
        """Whether the design carries the intercept's constant column (the intercept integrated)."""
        return bool(self.fit_intercept) and getattr(self, "_x_mean", None) is None

    def _intercept_prior_variance(self):
        return check_positive_float(self.intercept_variance, "intercept_variance")

    def _fit_each(self, H, ys, likelihood, noise, learn_noise, dof=1.0, v0=None, progress=False):
        """The fits on the design H (n, D) of each target vector (n,) in `ys` (prior variance v0, default
        `prior_variance`), all dispatched before any result is read (one-vs-rest: host work overlaps the fits);
        `progress` (bool) shows the steps of whichever loop runs: the joint Newton fit, the outer ML-II loop, or
        `gkl_jax.fit` at fixed hyperparameters.

        Returns:
            A list with, per target vector, (Result, prior variance, noise, log evidence of the unpadded problem,
            converged, (mean, covariance) of the real weights: the coefficients, then the intercept).
        """
        pending = [self._dispatch(H, y, likelihood, noise, learn_noise, dof, v0, progress) for y in ys]
        return [self._collect(*fit) for fit in pending]

    def _dispatch(self, H, y, likelihood, noise, learn_noise, dof, v0, progress=False):
        """Start one fit (`_fit_each`); returns (outputs, converged, real columns, ML-II scales)."""
        factor = _factor(self.factor)
        max_steps, tol = check_steps(self.max_steps), check_positive_float(self.tol, "tol")
        v0 = check_positive_float(self.prior_variance if v0 is None else v0, "prior_variance")
        iv = self._intercept_prior_variance() if self._intercept_column() else 1.0
        Hp, rows, cols = pad_design(H)
        n, d = H.shape
        fill = 1.0 if likelihood == "logistic" else 0.0
        yp = np.full(Hp.shape[0], fill)
        yp[:n] = y
        intercept = np.zeros(Hp.shape[1], bool)
        if self._intercept_column():
            intercept[d - 1] = True
        scales = ml2.scales(n, d - int(self._intercept_column()), likelihood, dof)
        build = _Build(Hp, yp, rows, cols, intercept, np.asarray(iv), np.asarray(float(dof)), scales, likelihood)
        params = {"prior": np.asarray(scales[0] * np.log(v0)), "noise": np.asarray(scales[1] * np.log(noise))}
        learn = {"prior": bool(self.learn_prior_variance), "noise": bool(learn_noise)}
        method, kwargs = _method(likelihood, factor)
        laplace = method is gk_fit and isinstance(factor, F.Full)
        out = None
        callback = resolve_progress(progress, "gkl_jax.sklearn ML-II") if any(learn.values()) else None
        with quiet_convergence():
            if any(learn.values()) and laplace and likelihood in JOINT:   # ML-II jointly with q
                out, converged, _ = joint_fit(build, params, (learn["prior"], learn["noise"]),
                                              kwargs["solver"].forcing, np.asarray(0.1 * tol),
                                              min(max_steps, JOINT_MAX_STEPS), _Finish(build, dict.fromkeys(params)),
                                              callback)
                if not (bool(converged) and np.isfinite(float(out[2]))):
                    out = None    # not settled (tiny or degenerate problems): the outer loop from the start
            if out is None and any(learn.values()):   # ML-II, one program (`_ml2`); the padding's constant removed
                objective, dyn, static, dynamic = ml2.linear_objective(build, method, kwargs, learn, params, laplace,
                                                                       tol)
                config = ml2.settings(max_steps, adaptive=method is gk_fit, gtol=tol)
                out, converged, _ = ml2.run(objective, config, dyn, dynamic, _Finish(build, static), callback)
            elif out is None:
                fixed = dict(kwargs, tol=np.asarray(tol), **({"progress": True} if progress else {})) \
                    if method is gk_fit else kwargs
                out, converged, _ = _fit_fixed(build, params, method, fixed, laplace)
        return out, converged, d, scales

    @staticmethod
    def _collect(out, converged, d, scales):
        """A dispatched fit's outputs on the host (`_fit_each`)."""
        result, params, log_z, cov = out
        converged = bool(converged) and bool(result.converged)
        moments = (np.asarray(result.q.mean)[:d], np.asarray(cov)[:d, :d])
        prior, noise = np.exp(np.array([params["prior"], params["noise"]], float) / scales)
        return result, float(prior), float(noise), float(log_z), converged, moments

    def _latent(self, result, X, family=None, y=None):
        """`gk.predict` of the fit `result` at the rows of X (padded to the fitted dimension)."""
        H = self._design(X)
        n = H.shape[0]
        Hp = np.zeros((bucket(n), result.q.dim))         # rows padded too: one compilation per bucket
        Hp[:n, :H.shape[1]] = H
        if y is not None:
            y = np.concatenate([y, np.zeros(Hp.shape[0] - n)])
        pred = gk_predict(result, jnp.asarray(Hp), family, y=None if y is None else jnp.asarray(y))
        return jax.tree.map(lambda a: np.asarray(a)[:n], pred)

    def _set_coefficients(self, moments):
        means = np.stack([m for m, _ in moments])
        sds = np.stack([np.sqrt(np.diag(S)) for _, S in moments])
        d = self.n_features_in_
        self.coef_, self.coef_std_ = means[:, :d], sds[:, :d]
        self.intercept_ = means[:, d] if self.fit_intercept else np.zeros(len(moments))
        self.intercept_std_ = sds[:, d] if self.fit_intercept else np.zeros(len(moments))
        self.covariance_ = np.stack([S for _, S in moments])


class BayesianLogisticRegression(ProbabilisticClassifierMixin, ClassifierMixin, _BayesianLinear):
    """Bayesian logistic regression by Gaussian KL (G-KL) inference.

    Args:
        prior_variance: variance of the N(0, prior_variance I) prior on the coefficients (the starting value when
            `learn_prior_variance`).
        factor: the covariance structure of q: "full" (default), "diagonal" or a `gkl_jax.factors` factor.
        fit_intercept: add a constant feature whose weight has prior N(0, intercept_variance).
        intercept_variance: prior variance of the intercept.
        learn_prior_variance: maximise the bound over prior_variance (ML-II).
        max_steps: outer ML-II steps.
        tol: the fit of q stops where max_i |dB/dx_i| max(|x_i|, sigma0) <= tol (`gkl_jax.fit`'s test); ML-II at
            tol on the hyperparameters' gradient, q then to tol / 10. Default 1e-4, as LogisticRegression's.
        verbose: 0/False (default) silent; 1/True (or more): progress lines on stderr (the estimator's, and the
            steps of the ML-II loop, or of `gkl_jax.fit` where the hyperparameters are fixed).

    Attributes (after `fit`):
        classes_: the labels (any type); the second is the positive class of a binary problem.
        coef_, coef_std_: (1, d) posterior mean and sd of the coefficients ((K, d) one-vs-rest for K > 2 classes).
        intercept_, intercept_std_: (1,) or (K,).
        covariance_: (1 or K, d + 1, d + 1) posterior covariance of (coef, intercept).
        log_evidence_: the optimised bound, a lower bound on log p(y | X) (an array (K,) per one-vs-rest problem).
        prior_variance_: the (learned) prior variance (an array (K,) for one-vs-rest).
        converged_: whether every fit met its tolerance.

    More than two classes are fitted one-vs-rest: K independent binary posteriors, combined by normalising their
    predictive odds (`combine_one_vs_rest`; not a multinomial model: for that use `MulticlassGPClassifier` with
    a linear kernel).
    """

    def __init__(self, prior_variance=1.0, *, factor="full", fit_intercept=True, intercept_variance=100.0,
                 learn_prior_variance=False, max_steps=100, tol=1e-4, verbose=0):
        self.prior_variance = prior_variance
        self.factor = factor
        self.fit_intercept = fit_intercept
        self.intercept_variance = intercept_variance
        self.learn_prior_variance = learn_prior_variance
        self.max_steps = max_steps
        self.tol = tol
        self.verbose = verbose

    @float64
    def fit(self, X, y):
        """Fit the posterior.

        Args:
            X: (n, d) array-like of finite features.
            y: (n,) labels of any type, at least two classes.

        Returns:
            self.
        """
        log = FitLog(self)
        X, y = validate_fit(self, X, y, classifier=True)
        self.classes_, codes = encode_labels(y)
        H = self._design(X)
        targets = binary_targets(codes, len(self.classes_))
        log(f"{len(targets)} binary problem(s), n = {H.shape[0]} rows, {H.shape[1]} weights{PADDED_NOTE}")
        fits = self._fit_each(H, targets, "logistic", 1.0, False, progress=log.progress)
        self._results = [f[0] for f in fits]
        self._set_coefficients([f[5] for f in fits])
        self.prior_variance_ = per_problem([f[1] for f in fits])
        self.log_evidence_ = per_problem([f[3] for f in fits])
        self.converged_ = all(f[4] for f in fits)
        log.done(f"log_evidence_ {np.round(self.log_evidence_, 6)}, converged_ {self.converged_}")
        if not self.converged_:
            warn_not_converged(self)
        return self

    @float64
    def _positive_probabilities(self, X):
        X = validate_predict(self, X, "_results")
        return np.stack([np.asarray(self._latent(r, X, "logistic").probability) for r in self._results], axis=1)

    @float64
    def latent(self, X):
        """The latent predictive x^T w + intercept under q.

        Args:
            X: (n, n_features_in_) array-like.

        Returns:
            (mean, sd), each (n,) for two classes or (n, K) one-vs-rest.
        """
        X = validate_predict(self, X, "_results")
        preds = [self._latent(r, X) for r in self._results]
        mean = np.stack([np.asarray(p.mean) for p in preds], axis=1)
        sd = np.sqrt(np.stack([np.asarray(p.variance) for p in preds], axis=1))
        return (mean[:, 0], sd[:, 0]) if mean.shape[1] == 1 else (mean, sd)


class BayesianRegression(StandardisedRegressorMixin, RegressorMixin, _BayesianLinear):
    """Bayesian linear regression with a Gaussian, Student-t or Laplace likelihood by G-KL inference.

    The targets are standardised inside `fit`, z = (y - median(y)) / sd(y); `prior_variance` and `noise` are in
    those units (with the default scale, prior_variance = 1 says a coefficient moves y by about one sd per unit
    feature), and every output (coef_, predictions, log_evidence_) is in the original units.

    Args:
        likelihood: "gaussian" (noise = variance), "student-t" (noise = scale, `dof` degrees of freedom) or
            "laplace" (noise = scale).
        prior_variance: prior variance of the coefficients (start value when learned); None (default): the mean
            squared least-squares coefficient (`_ml2.data_start`).
        noise: the likelihood's variance or scale in standardised units (start value when learned); None
            (default): from the median absolute deviation of the least-squares residuals.
        dof: Student-t degrees of freedom (fixed).
        factor, fit_intercept, max_steps, tol: as `BayesianLogisticRegression` (with the Gaussian likelihood the
            posterior is Gaussian and computed exactly, whatever `factor`).
        intercept_variance: None (default): with the Gaussian likelihood the intercept has a flat prior and is
            integrated in closed form, as BayesianRidge centres the data: X and y are centred by their means, w's
            posterior is that of the centred data, and b | w ~ N(mean(y) - mean(x)^T w, noise / n), so b's
            posterior mean is mean(y) - mean(x)^T E[w] and `intercept_std_` is sqrt(mean(x)^T Cov(w) mean(x) +
            noise / n) (the predictive variance includes noise / n too); with the robust likelihoods, whose
            centre is not the mean, a weight with prior N(0, 100) in standardised units, integrated. A float:
            that prior variance, the intercept integrated, for every likelihood.
        learn_prior_variance, learn_noise: ML-II on the bound over each (default both, as BayesianRidge).
        verbose: 0/False (default) silent; 1/True (or more): progress lines on stderr (the estimator's, and the
            steps of the ML-II loop, or of `gkl_jax.fit` where the hyperparameters are fixed).

    Attributes (after `fit`): coef_ (d,), coef_std_ (d,), intercept_, intercept_std_, covariance_ (d + 1, d + 1),
    log_evidence_ (the bound on log p(y | X)), prior_variance_, noise_ (learned values, standardised units),
    converged_.
    """

    def __init__(self, likelihood="gaussian", *, prior_variance=None, noise=None, dof=4.0, factor="full",
                 fit_intercept=True, intercept_variance=None, learn_prior_variance=True, learn_noise=True,
                 max_steps=100, tol=1e-4, verbose=0):
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
        self.tol = tol
        self.verbose = verbose

    @float64
    def fit(self, X, y):
        """Fit the posterior (and by default the prior variance and noise).

        Args:
            X: (n, d) array-like of finite features.
            y: (n,) finite targets.

        Returns:
            self.
        """
        log = FitLog(self)
        check_choice(self.likelihood, "likelihood", LIKELIHOODS)
        noise = None if self.noise is None else check_positive_float(self.noise, "noise")
        v0 = None if self.prior_variance is None else check_positive_float(self.prior_variance, "prior_variance")
        dof = check_positive_float(self.dof, "dof")
        if self.intercept_variance is not None:
            check_positive_float(self.intercept_variance, "intercept_variance")
        X, y = validate_fit(self, X, y, classifier=False)
        plug_in = bool(self.fit_intercept) and self.intercept_variance is None and self.likelihood == "gaussian"
        self._x_mean = X.mean(axis=0) if plug_in else None
        z = self._standardise(y, np.mean if plug_in else np.median if self.fit_intercept else (lambda _: 0.0))
        H = self._design(X)
        if noise is None or v0 is None:
            v_start, noise_start = ml2.data_start(H, z, self.likelihood, self._intercept_column())
            noise = noise_start if noise is None else noise
            v0 = v_start if v0 is None else v0
        log(f"{self.likelihood} likelihood, n = {H.shape[0]} rows, {H.shape[1]} weights{PADDED_NOTE}")
        result, v, s, log_z, converged, (mean, cov) = self._fit_each(H, [z], self.likelihood, noise,
                                                                      self.learn_noise, dof, v0, log.progress)[0]
        self._results = [result]
        self._intercept_noise = s / len(y) if plug_in else None     # Var(b | w), standardised units
        if plug_in:
            mean, cov = _plug_in_intercept(mean, cov, self._x_mean, self._intercept_noise)
        self._set_coefficients([(mean * self._y_scale, cov * self._y_scale**2)])
        self.coef_, self.coef_std_ = self.coef_[0], self.coef_std_[0]
        self.intercept_ = float(self.intercept_[0]) + self._y_shift
        self.intercept_std_ = float(self.intercept_std_[0])
        self.covariance_ = self.covariance_[0]
        self.prior_variance_, self.noise_ = v, s
        self.log_evidence_ = log_z - len(y) * np.log(self._y_scale)
        self.converged_ = converged
        log.done(f"log_evidence_ {self.log_evidence_:.6f}, converged_ {converged}")
        if not converged:
            warn_not_converged(self)
        return self

    def _predictive(self, X, family, z):
        extra = getattr(self, "_intercept_noise", None)
        if extra is None:
            return self._latent(self._results[0], X, family, z)
        # the flat-prior intercept: f = (x - mean(x))^T w + b', b' ~ N(0, noise / n) independent of w, so its
        # variance joins the latent's, and the Gaussian family's noise for y_variance and log_density
        pred = self._latent(self._results[0], X, noise_family("gaussian", self.noise_ + extra, self.dof), z)
        return eqx.tree_at(lambda p: p.variance, pred, pred.variance + extra)

    def _intercept_prior_variance(self):
        if self.intercept_variance is None:
            return ROBUST_INTERCEPT_VARIANCE
        return check_positive_float(self.intercept_variance, "intercept_variance")


def _plug_in_intercept(mean, cov, x_mean, noise_over_n):
    """The moments of (w, b) for the flat-prior intercept of centred targets: b | w ~ N(-x_mean^T w, noise / n)
    (the Gaussian likelihood integrated over b, the conjugate closed form), so Cov(w, b) = -cov x_mean and
    Var(b) = x_mean^T cov x_mean + noise / n.

    Args:
        mean: (d,) posterior mean of w; cov: (d, d) its covariance; x_mean: (d,) the training inputs' mean;
        noise_over_n: the noise variance over the number of training rows.

    Returns:
        ((d + 1,) mean, (d + 1, d + 1) covariance).
    """
    c = -cov @ x_mean
    var_b = np.array([[x_mean @ -c + noise_over_n]])
    return np.append(mean, -x_mean @ mean), np.block([[cov, c[:, None]], [c[None, :], var_b]])
