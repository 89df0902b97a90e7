"""The robust default's second start (the inflated-noise posterior, `gkl_jax.solvers.TwoStarts`) also under the
estimators' padding: `GPRegressor(likelihood="student-t")` at fixed hyperparameters fits masked Student-t sites, and
reaches the optimum that `gk.fit`'s default finds on the same unpadded model (hard robust-GP cases: lengthscale 3-10,
20-30% outliers, noise scale 0.01-0.05, where one start ends up to 40 nats short)."""

import warnings

import numpy as np
import pytest

import gkl_jax as gk
from gkl_jax.sklearn import GPRegressor
from gkl_jax.solvers._two_starts import inflated_noise_start, two_starts_apply

JITTER = 1e-8


def hard_case(seed):
    """A hard robust-GP data set (`benchmarks/robust_tiers.py`'s tier): the scale s, lengthscale and outlier fraction
    drawn from one generator, then 60 sorted inputs on [-4, 4], sin x plus noise of scale s and 20-30% of the
    targets moved by +-4 from a second one of the same seed; returns (X, y, s, lengthscale)."""
    rng = np.random.default_rng(seed)
    s, lengthscale, outliers = 10 ** rng.uniform(-2, np.log10(0.05)), rng.uniform(3, 10), rng.uniform(0.2, 0.3)
    rng = np.random.default_rng(seed)
    X = np.sort(rng.uniform(-4, 4, 60))
    y = np.sin(X) + s * rng.standard_normal(60)
    k = int(round(outliers * 60))
    idx = rng.choice(60, k, replace=False)
    y[idx] += rng.choice([-4.0, 4.0], k)
    return X[:, None], y, s, lengthscale


@pytest.mark.slow
def test_regressor_at_fixed_hyperparameters_matches_the_unpadded_default_fit():
    worse_by_one_start = 0
    for seed in (121,):     # one start alone ends 38 nats short here (two more such seeds: 104, 116)
        X, y, s, lengthscale = hard_case(seed)
        shift, sd = np.mean(y), np.std(y)
        kernel = gk.kernels.SquaredExponential(1.0 / sd ** 2, lengthscale)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = GPRegressor(kernel, likelihood="student-t", noise=s / sd, dof=3.0, learn_hyperparameters=False,
                              jitter=JITTER / sd ** 2).fit(X, y)
        # the same model unpadded, on the estimator's standardised targets (log p(y) = log p(z) - n log sd)
        model = gk.gp.model(kernel, X, gk.potentials.StudentT((y - shift) / sd, 3.0, s / sd), jitter=JITTER / sd ** 2)
        assert two_starts_apply(model)
        best = float(gk.fit(model).log_z) - len(y) * np.log(sd)
        assert est.log_evidence_ == pytest.approx(best, abs=1e-6)
        S = gk.solvers
        one = gk.fit(model, solver=S.Chain((S.LBFGS(tol=1e-2), S.Newton())), whiten=True)
        worse_by_one_start += float(one.log_z) - len(y) * np.log(sd) < best - 1.0
    assert worse_by_one_start >= 1      # the cases are hard: one start alone ends short


def test_inflated_start_ignores_masked_sites():
    """The second start of a masked model equals that of the model without the masked sites: zero precision, no
    pull on the posterior, the inflated variance from the real targets only."""
    from gkl_jax.potentials._masked import masked
    rng = np.random.default_rng(7)
    X = rng.uniform(-3, 3, (12, 1))
    y = np.sin(X[:, 0]) + 0.05 * rng.standard_normal(12)
    kernel = gk.kernels.SquaredExponential(1.0, 2.0)
    mask = np.arange(12) < 9
    y_pad = np.where(mask, y, 123.0)       # the padded targets' values must not matter
    padded = gk.gp.model(kernel, X, masked(gk.potentials.StudentT(y_pad, 3.0, 0.05), mask), jitter=1e-6)
    assert two_starts_apply(padded)
    q = inflated_noise_start(padded)
    real = gk.gp.model(kernel, X[:9], gk.potentials.StudentT(y[:9], 3.0, 0.05), jitter=1e-6)
    q_real = inflated_noise_start(real)
    np.testing.assert_allclose(np.asarray(q.mean)[:9], np.asarray(q_real.mean), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(np.asarray(q.covariance())[:9, :9], np.asarray(q_real.covariance()), rtol=1e-7,
                               atol=1e-9)
