"""The GP estimators' minibatch route (`batch_size=`): the sparse GP fitted by stochastic gradients of the G-KL
bound on minibatches of B training rows (`gkl_jax.gp.fit_sparse_minibatch`; Hensman et al. 2015 with the bound of
Challis & Barber 2013, eq. 7), the kernel (and the regressors' noise, and where asked the inducing inputs) learned
jointly with q, the final bound the full-data bound streamed in chunks.

The training rows are not padded to a bucket (a masked row would bias the N / B scaled estimate): a minibatch fit
compiles once per (training-set size, B, number of steps), and its memory is O(N d + M^2 + (B + chunk) M).
"""

import jax
import numpy as np

from .. import potentials as P
from ..gp import fit_sparse_minibatch
from ._common import check_positive_float, quiet_convergence

MINIBATCH_STEPS = 1000
"""The optimiser steps of a minibatch fit with num_epochs=None (the recipe of `benchmarks/gp_scale.py`, where
N = 10^4 to 10^6 with B = 512 and M = 200 converged)."""

NOISE_FIELD = {"gaussian": "variance", "laplace": "scale", "student-t": "scale"}
"""The likelihood's parameter that the regressors' `noise` sets (and ML-II learns)."""


def check_batch_size(batch_size, n: int):
    """`batch_size` as None or an int in [1, n].

    Args:
        batch_size: the estimator's parameter; n: the number of training rows.

    Returns:
        None or int; ValueError naming batch_size otherwise.
    """
    if batch_size is None:
        return None
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or not 1 <= batch_size <= n:
        raise ValueError(f"batch_size must be None or an integer in [1, n] = [1, {n}] (the number of training "
                         f"rows), got {batch_size!r}")
    return int(batch_size)


def check_num_epochs(num_epochs):
    """`num_epochs` as None or a positive finite float (ValueError naming num_epochs otherwise)."""
    if num_epochs is None:
        return None
    try:
        value = float(num_epochs)
    except (TypeError, ValueError) as err:
        raise ValueError(f"num_epochs must be None or a positive number, got {num_epochs!r}") from err
    if isinstance(num_epochs, bool) or not (np.isfinite(value) and value > 0):
        raise ValueError(f"num_epochs must be None or a positive finite number, got {num_epochs!r}")
    return value


def _likelihood(likelihood: str, y, noise, dof):
    """The potential of the estimator's likelihood with targets y (+-1 for the classifiers) and noise."""
    return {"logistic": lambda: P.Logistic(y), "probit": lambda: P.Probit(y),
            "gaussian": lambda: P.Gaussian(y, noise), "laplace": lambda: P.Laplace(y, noise),
            "student-t": lambda: P.StudentT(y, dof, noise)}[likelihood]()


def fit_minibatch(est, X, y, likelihood: str, kernel, Z, *, noise=1.0, dof=4.0, learn_noise=False, progress=False):
    """One minibatch sparse GP fit of `est`'s settings (`batch_size`, `num_epochs`, `learn_hyperparameters`,
    `learn_inducing`, `jitter`, `random_state`).

    Args:
        est: the estimator; X: (n, d) float array; y: (n,) targets (+-1 labels for the classifiers).
        likelihood: the estimator's likelihood name; kernel: the starting kernel; Z: (M, d) starting inducing inputs.
        noise: the starting variance (Gaussian) or scale; dof: Student-t degrees of freedom (fixed).
        learn_noise: learn the noise jointly (with `learn_hyperparameters`).
        progress: passed to `fit_sparse_minibatch`.

    Returns:
        (Result over u = f(Z), the GP prior over the fitted Z, params {"kernel", "Z", "log_noise"}, converged,
        log Z: the full-data bound at the end).
    """
    n = X.shape[0]
    batch = check_batch_size(est.batch_size, n)
    epochs = check_num_epochs(est.num_epochs)
    learn = bool(est.learn_hyperparameters)
    lik = _likelihood(likelihood, np.asarray(y, np.float64), float(noise), float(dof))
    learn_lik = (NOISE_FIELD[likelihood],) if learn and learn_noise and likelihood in NOISE_FIELD else False
    seed = np.random.default_rng(est.random_state).integers(2 ** 31 - 1)
    steps = {"num_steps": MINIBATCH_STEPS} if epochs is None else {"num_epochs": epochs}
    with quiet_convergence():
        fit = fit_sparse_minibatch(kernel, np.asarray(X, np.float64), lik, batch_size=batch, Z=np.asarray(Z),
                                   learn_kernel=learn, learn_inducing=bool(est.learn_inducing),
                                   learn_likelihood=learn_lik, jitter=check_positive_float(est.jitter, "jitter"),
                                   key=jax.random.key(int(seed)), progress=progress, **steps)
    noise_fitted = getattr(fit.likelihood, NOISE_FIELD[likelihood]) if likelihood in NOISE_FIELD else noise
    params = {"kernel": fit.kernel, "Z": fit.Z, "log_noise": np.log(np.asarray(noise_fitted, np.float64))}
    return fit.result, fit.prior, params, bool(fit.result.converged), float(fit.result.log_z)
