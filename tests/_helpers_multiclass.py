"""Shared by the multiclass tests (tests/test_multiclass*.py): one problem shape for every fit (one
compilation), a random site, the module fixtures (the reference fit and the public fits) and single-threaded
LAPACK."""

import jax.numpy as jnp
import numpy as np
import pytest

import gkl_jax as gk
from gkl_jax import multiclass as mc
from gkl_jax.multiclass import _full

N_DATA, N_CLASSES = 8, 3  # one problem shape for every fit in these files (one compilation)


@pytest.fixture(scope="module", autouse=True)
def _single_threaded_blas():
    """LAPACK calls (Cholesky, eigh) thrash when several processes share few cores; pin them to one thread."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        yield
        return
    with threadpool_limits(1):
        yield


def _problem(seed=0, variance=2.0, lengthscale=1.0, n=N_DATA, C=N_CLASSES):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    labels = np.arange(n) % C
    rng.shuffle(labels)
    kernel = gk.kernels.SquaredExponential(variance, lengthscale)
    K = _full.prior_covariance(kernel, X, C, jitter=1e-8)
    return X, labels, jnp.eye(C)[labels], K


@pytest.fixture(scope="module")
def fitted():
    X, labels, Y, K = _problem()
    post = _full.fit_full(K, Y)
    return X, labels, Y, K, post


@pytest.fixture(scope="module")
def public_fits(fitted):
    """`gk.multiclass.fit` on the fixture's kernel and inputs: through the Kronecker factor of K^x (x) I_C (integer
    labels) and through the dense path (a class covariance I_C; one-hot labels), the same prior as `fitted`."""
    X, labels, Y, K, post = fitted
    kernel = gk.kernels.SquaredExponential(2.0, 1.0)
    kron = mc.fit(kernel, X, labels, jitter=1e-8)
    dense = mc.fit(kernel, X, Y, jitter=1e-8, class_covariance=np.eye(N_CLASSES))
    return kernel, kron, dense
