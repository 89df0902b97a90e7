"""The GP estimators' models on padded data: one compiled fit per size bucket, dense or sparse.

Padding (the bucket rule): the n training rows are padded to `rows_bucket(n)` rows with masked sites, so every
training-set size in a bucket (cross-validation folds, grid-search points, a user's second data set) reuses one
compiled fit. A masked site contributes exactly nothing:

- Dense GP: the prior over the padded latent values is block-diagonal, K(X, X) + jitter I on the real rows and
  the identity on the padded ones (`PaddedGP`), so the padded values are independent of the real ones a priori.
  Their sites are zero (`masked`: log phi_n = 0) for the G-KL likelihoods, so the G-KL optimum leaves them at their
  prior and the bound, q on the real rows and every gradient are those of the unpadded problem. The Gaussian
  likelihood (exact inference needs Gaussian sites) gives them a site N(0 | f_n, 1) instead: independent of the
  real rows, each adds the constant log N(0 | 0, 2), subtracted (`padding_log_z`).
- Sparse GP (`sparse_model`'s inducing-point model, Titsias 2009): the padded rows' projections h_n and extra
  variances k_nn - q_nn are zero and their sites masked (Gaussian: N(0 | 0, 1), the constant log N(0 | 0, 1)).

Inducing inputs (`inducing_inputs`): rows of X by k-means++ seeding or a random subset of the rows, both seeded
(`gkl_jax._inducing`), or the user's array.
"""


import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import potentials as P
from .._buckets import bucket
from .._inducing import inducing_rows
from .._model import Model, Sites
from ..gp import sparse_projection
from ..potentials._masked import masked
from ..priors import GP, Dense

ROW_BUCKET_MIN, ROW_BUCKET_STEPS = 32, 8
"""Smallest padded training (and test) size and sizes per octave: the dense fit costs O(n^3), so eighth-octave
buckets (at most 12.5% padding, at most 1.42 times the arithmetic) rather than the linear estimators' quarters;
the five folds of a 5-fold cross-validation (sizes within 1 of 4n/5) share one bucket."""

DENSE_MAX = 2000
"""With num_inducing=None, the largest training set fitted with the dense GP (O(n^3) per fit: about a minute of
ML-II at n = 2000 on a 2-core machine); above it the sparse GP with `DEFAULT_INDUCING` inducing inputs."""

DEFAULT_INDUCING = 500
"""The number of inducing inputs where num_inducing=None switches to the sparse GP (n > DENSE_MAX)."""



def rows_bucket(n: int) -> int:
    """The padded number of rows for n training or test points (`_buckets.bucket`, `ROW_BUCKET_MIN`, eighth octaves)."""
    return bucket(n, ROW_BUCKET_MIN, ROW_BUCKET_STEPS)


def pad_rows(A, n_pad: int, fill=0.0):
    """A (n, ...) numpy array padded with `fill` rows to n_pad rows.

    Args:
        A: (n, ...) array-like; n_pad: the padded size (>= n); fill: the padded entries.

    Returns:
        (n_pad, ...) float64 numpy array.
    """
    A = np.asarray(A, np.float64)
    if n_pad < A.shape[0]:
        raise ValueError(f"the bucket of {n_pad} rows cannot hold the data's {A.shape[0]} rows")
    out = np.full((n_pad,) + A.shape[1:], fill, np.float64)
    out[:A.shape[0]] = A
    return out


@eqx.filter_jit
def _padded_gram(kernel, X, mask, jitter):
    """K(X, X) + jitter I on the real rows, the identity on the padded ones, zero between (compiled)."""
    K = kernel.gram(X) + jitter * jnp.eye(X.shape[0], dtype=X.dtype)
    both = mask[:, None] & mask[None, :]
    return jnp.where(both, K, 0.0) + jnp.diag(jnp.where(mask, 0.0, 1.0).astype(X.dtype))


class PaddedGP(GP):
    """The GP prior at padded inputs: `gkl_jax.priors.GP` at the real rows of X (mask True), independent N(0, 1)
    values at the padded rows (module doc), with no prior covariance to new inputs from those.

    Args:
        kernel: a `gkl_jax.kernels` kernel; X: (n_pad, d) float array; mask: (n_pad,) bool, True on real rows;
        jitter: added to the real block's diagonal.
    """

    mask: jax.Array

    def __init__(self, kernel, X, mask, jitter: float = 1e-6):
        X, mask = jnp.asarray(X), jnp.asarray(mask)
        covariance = _padded_gram(kernel, X, mask, jitter)
        dense = Dense(covariance)             # the validated Cholesky factor and its inverse
        self.chol, self.inv_chol = dense.chol, dense.inv_chol
        self.kernel, self.X, self.mask, self.jitter = kernel, X, mask, float(jitter)
        self.covariance = covariance
        self.mean = jnp.zeros(X.shape[0], covariance.dtype)
        self.constant_mean = jnp.zeros((), covariance.dtype)

    def cross_covariance(self, X_new):
        """K(X, X_new) on the real rows, zero on the padded ones: (n_pad, n_new) float array."""
        return jnp.where(self.mask[:, None], self.kernel.gram(self.X, X_new), 0.0)


def likelihood_potential(likelihood: str, y, noise, dof, mask):
    """The estimators' likelihood with targets y and variance/scale `noise` (padded rows: see the module doc).

    Args:
        likelihood: "logistic", "probit", "gaussian", "laplace" or "student-t".
        y: (n_pad,) targets (+-1 labels for the classifiers; padded rows 1 or 0); noise: (n_pad,) positive;
        dof: Student-t degrees of freedom; mask: (n_pad,) bool, True on real rows.

    Returns:
        A potential with n_pad sites; the Gaussian one unmasked (its padded sites are N(0 | f, 1)).
    """
    if likelihood == "gaussian":
        return P.Gaussian(y, noise)
    make = {"logistic": lambda: P.Logistic(y), "probit": lambda: P.Probit(y),
            "laplace": lambda: P.Laplace(y, noise), "student-t": lambda: P.StudentT(y, dof, noise)}[likelihood]
    return masked(make(), mask)


class GPBuild(eqx.Module):
    """params {"kernel", "log_noise"[, "Z"]} -> the padded GP model (dense, or sparse over u = f(Z) when
    `sparse`); a module, so that ML-II reuses its compiled loop for every data set of the same padded shape."""

    X: jax.Array        # (n_pad, d)
    y: jax.Array        # (n_pad,)
    mask: jax.Array     # (n_pad,) True on real rows
    dof: jax.Array
    likelihood: str = eqx.field(static=True)
    jitter: float = eqx.field(static=True)
    sparse: bool = eqx.field(static=True)

    def __call__(self, params):
        """The model at `params` (a kernel, a log noise variance or scale, the inducing inputs Z if sparse)."""
        noise = jnp.where(self.mask, jnp.exp(params["log_noise"]), 1.0)     # padded rows: a constant
        lik = likelihood_potential(self.likelihood, self.y, noise, self.dof, self.mask)
        kernel = params["kernel"]
        if not self.sparse:
            return Model(PaddedGP(kernel, self.X, self.mask, self.jitter), Sites(None, lik))
        prior = GP(kernel, params["Z"], jitter=self.jitter)
        H, extra = sparse_projection(kernel, prior, self.X)
        return Model(prior, Sites(jnp.where(self.mask[:, None], H, 0.0), lik,
                                  variance_offset=jnp.where(self.mask, extra, 0.0)))

    def padding_log_z(self):
        """The constant that the padded rows add to log Z: 0 for masked sites; for the Gaussian likelihood
        log N(0 | 0, 2) (dense) or log N(0 | 0, 1) (sparse) per padded row (module doc)."""
        if self.likelihood != "gaussian":
            return 0.0
        variance = 1.0 if self.sparse else 2.0
        return -0.5 * float(np.sum(~np.asarray(self.mask))) * np.log(2 * np.pi * variance)


def inducing_inputs(X, num_inducing, inducing, random_state):
    """The starting inducing inputs Z.

    Args:
        X: (n, d) training inputs.
        num_inducing: M, 1 <= M <= n.
        inducing: "kmeans++" (M rows of X by k-means++ seeding), "random" (M distinct rows of X), or an (M, d)
            array-like of inducing inputs (then num_inducing is not used).
        random_state: None or an int, the seed of both initialisations (`gkl_jax._inducing`).

    Returns:
        (M, d) float64 numpy array; ValueError naming `num_inducing` or `inducing` for a bad value.
    """
    d = X.shape[1]
    if isinstance(inducing, str):
        return np.asarray(X, np.float64)[inducing_rows(X, num_inducing, inducing, random_state)]
    Z = np.asarray(inducing, np.float64)
    if Z.ndim != 2 or Z.shape[1] != d or Z.shape[0] < 1:
        raise ValueError(f"inducing must be 'kmeans++', 'random' or an (M, {d}) array of inducing inputs (the width "
                         f"of X), got shape {Z.shape}")
    if not np.all(np.isfinite(Z)):
        raise ValueError("inducing contains NaN or inf")
    return Z


def route_text(est, X, Z):
    """The fit's route in words, for the estimators' verbose lines: dense, sparse with M inducing inputs, or
    minibatch.

    Args:
        est: the GP estimator (its `batch_size`).
        X: (n, d) training inputs.
        Z: (M, d) starting inducing inputs, or None for the dense GP.

    Returns:
        str.
    """
    n = X.shape[0]
    if Z is None:
        return f"dense GP on n = {n} rows"
    sparse = f"sparse GP with M = {Z.shape[0]} inducing inputs on n = {n} rows"
    return sparse if est.batch_size is None else f"{sparse}, minibatches of {est.batch_size}"


def padded_inputs(X):
    """X padded to `rows_bucket(n)` rows, with the mask of the real rows.

    Args:
        X: (n, d) float array.

    Returns:
        ((n_pad, d) array, (n_pad,) bool mask, True on the first n rows).
    """
    n_pad = rows_bucket(X.shape[0])
    return pad_rows(X, n_pad), np.arange(n_pad) < X.shape[0]
