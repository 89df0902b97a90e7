"""Data and model builders shared by the multi-process workers (tests/_multiprocess_check.py) and the one-process
references of tests/test_multiprocess.py: both sides build exactly the same models."""

import equinox as eqx
import numpy as np

import gkl_jax as gk

DIM = 5
NUM = 240        # divides into 1, 2 and 4 equal blocks (and 3)
MINIBATCH = dict(batch_size=24, num_steps=40)


def logistic_data():
    data = gk.datasets.synthetic_logistic(DIM, NUM, seed=3)
    return np.asarray(data["X_train"]), np.asarray(data["y_train"])


def gp_data():
    """1-D regression inputs, targets and 6 inducing inputs (a sparse GP, Titsias' collapsed bound at the optimum)."""
    x = np.linspace(-3.0, 3.0, NUM)[:, None]
    t = np.sin(2.0 * x[:, 0]) + 0.1 * np.cos(7.0 * x[:, 0])
    return x, t, np.linspace(-2.5, 2.5, 6)[:, None]


def sparse_model(x, t, Z):
    return gk.gp.sparse_model(gk.kernels.SquaredExponential(), x, Z, gk.potentials.Gaussian(t, 0.1))


def regression_data():
    """A prior-free linear-Gaussian model's design and targets (fit checks H's rank on the host)."""
    rng = np.random.default_rng(7)
    X = rng.normal(size=(NUM, 3))
    return X, X @ np.array([0.5, -1.0, 2.0]) + 0.3 * rng.normal(size=NUM)


def regression_model(X, t):
    return gk.Model(None, gk.Sites(X, gk.potentials.Gaussian(t, 0.09)))


def variance_log_z(model, variance):
    """log Z's G-KL bound at the optimum as a function of the isotropic prior variance (differentiated by jax.grad:
    the sharded model is an argument, never closed over, as JAX requires of arrays spanning processes)."""
    model = eqx.tree_at(lambda m: m.prior.variance, model, variance)
    return gk.fit(model, gk.factors.Diagonal(), tol=1e-9).log_z


def logistic_model(X, y):
    return gk.Model(gk.priors.Isotropic(X.shape[1], 1.0), gk.Sites(X, gk.potentials.Logistic(y)))
