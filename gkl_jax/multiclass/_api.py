"""The public entry points on a kernel and inputs: `fit`, `fit_sparse`, `predict` and `gram_bound` (Chai 2012).

Each builds the prior from a `gk.kernels` kernel and the (n, d) inputs, as `gk.gp.model` does, and calls the
solver on the covariance matrices (`_full.fit_full`, `_sparse.fit_sparse`, `_theory.gram_matrix_bound`, kept
private for tests and benchmarks that need a prior covariance of their own). Labels are (n,) integer class
indices 0..C-1 or (n, C) one-hot rows.
"""

import dataclasses

import equinox as eqx
import jax.numpy as jnp
import jax.scipy.linalg as jsl

from .._linalg import full_precision, tdot
from .._progress import resolve_progress
from .._validate import as_float_array, check_finite, check_indices, check_nonnegative
from ..kernels import AbstractKernel
from ._blocks import blockdiag_left, sym
from ._full import Posterior, fit_full, one_hot_labels, prior_covariance
from ._predict import Predictive, kronecker_predictive, predictive_moments
from ._sparse import SparsePosterior, inducing_prior, masked_prior
from ._sparse import fit_sparse as _fit_sparse_matrices
from ._theory import gram_matrix_bound
from ._threads import single_blas_thread


def _inputs(kernel, X, name="X"):
    if not isinstance(kernel, AbstractKernel):
        raise ValueError(f"kernel must be a gkl_jax.kernels kernel, got {type(kernel).__name__}")
    X = as_float_array(X, name)
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty (n, d) array, got shape {X.shape}")
    check_finite(X, name)
    return X


def _class_covariance(class_covariance, C, dtype):
    if class_covariance is None:
        return None
    Kc = jnp.asarray(class_covariance, dtype)
    if Kc.shape != (C, C):
        raise ValueError(f"class_covariance must be (C, C) = ({C}, {C}), got shape {Kc.shape}")
    return Kc


@full_precision
def fit(kernel, X, y, *, num_classes=None, class_covariance=None, jitter=1e-6, site="theorem6", covariance="full",
        v_update="newton", tol=1e-10, max_steps=200, init=None, progress=False) -> Posterior:
    """Fit the variational posterior of the multinomial-logit GP by maximising the bound log Z_h of Chai (2012),
    eq. 21 (its site bound is Theorem 6), under the prior K = K^x (x) K^c + jitter I, K^x = kernel.gram(X).

    The maximiser is a monotone block-coordinate ascent (b with the tied mean by Newton, each S_i in closed form
    by eq. 61, V through its site precisions W by Newton or the paper's fixed point); with K^c = I (the default)
    its V steps use the Kronecker structure of K and work on the n (C - 1) class contrasts (the class sums keep
    their prior at the optimum), O((n (C - 1))^3).

    Args:
        kernel: a `gk.kernels` kernel on the inputs.
        X: (n, d) float inputs (an (n,) array is read as d = 1).
        y: (n,) or (n, 1) integer class indices 0..C-1, or (n, C) one-hot labels.
        num_classes: C for integer labels (default max(y) + 1; more keeps classes without examples).
        class_covariance: (C, C) float K^c, or None for the identity.
        jitter: non-negative float added to the prior's diagonal.
        site: "theorem6" (Chai 2012) or "knowles_minka" (S_i = V_i^{-1}, the relaxed bound of Section 2.3.1).
        covariance: "full" or "class_factorised" (W diagonal: the mean-field family of Section 9.1).
        v_update: "newton" (default) or "fixed_point" (the paper's eq. 28 fixed point).
        tol: the sweeps stop when one raises the bound by at most tol (1 + |log Z_h|).
        max_steps: the most sweeps (int >= 1).
        init: a `Posterior` for the same (n, C), possibly under another kernel, to warm-start from
            (App. E.3).
        progress: False (default), True (a line per sweep on stderr: the bound and its relative rise, the
            "gradient" of `gkl_jax.solvers.ProgressInfo`), "auto" (True where stderr is a terminal), or a callable
            receiving a `ProgressInfo` after each sweep and once at the end (a new callable compiles the fit
            again; an exception it raises stops the fit and is raised).

    Returns:
        `Posterior` holding the kernel and inputs (for `predict`), with `status` (`message`) and `converged`;
        `converged` is False, with a warning, when `max_steps` sweeps did not settle.

    Raises:
        ValueError: a kernel that is not a `gk.kernels` kernel, inputs that are not finite (n, d), labels that
            do not match the inputs, a bad option (`progress` not True, False, "auto" or a callable), or a prior
            that is not positive definite.
    """
    resolve_progress(progress, "gkl_jax.multiclass.fit")
    X = _inputs(kernel, X)
    Y = one_hot_labels(y, X.shape[0], num_classes, X.dtype)
    C = Y.shape[1]
    Kc = _class_covariance(class_covariance, C, X.dtype)
    check_nonnegative(jitter, "jitter")
    K = prior_covariance(kernel, X, C, Kc, jnp.asarray(jitter, X.dtype))
    post = fit_full(K, Y, site=site, covariance=covariance, v_update=v_update, tol=tol, max_steps=max_steps,
                    init=init, kron=Kc is None, progress=progress)
    return dataclasses.replace(post, kernel=kernel, X=X, class_covariance=Kc, jitter=float(jitter))


@full_precision
def fit_sparse(kernel, X, y, inducing, *, num_classes=None, mask=None, noise=1e-6, jitter=1e-6, site="theorem6",
               v_update="newton", tol=1e-10, max_steps=200, init=None, progress=False) -> SparsePosterior:
    """Fit the sparse variational posterior of Chai (2012), Section 4: maximise log Z~_h (eq. 32) over q(z) of
    the inducing latents z_a = f^{c_a}(x_{i_a}) + eps_a (eps_a ~ N(0, noise); Remarks 13-14), K^c = I.

    Each sweep costs O(n C^3 + n C s^2 + s^3) for s inducing latents; with every latent inducing the bound and
    its optimum are the full ones (Theorem 15). `select_inducing` chooses the set.

    Args:
        kernel: a `gk.kernels` kernel on the inputs.
        X: (n, d) float inputs.
        y: (n,) integer class indices 0..C-1 or (n, C) one-hot labels.
        inducing: (s,) int indices i C + c (0 <= i < n, 0 <= c < C) of the inducing latents.
        num_classes: C for integer labels (default max(y) + 1).
        mask: (s,) bool selecting the active inducing latents (default all): one compiled program serves a
            growing set.
        noise: non-negative float variance of eps_a.
        jitter: non-negative float added to the latent prior's diagonal blocks.
        site: "theorem6" or "knowles_minka".
        v_update: "newton" or "fixed_point".
        tol: the sweeps stop when one raises the bound by at most tol (1 + |log Z~_h|).
        max_steps: the most sweeps (int >= 1).
        init: a `SparsePosterior` for the same data to warm-start from.
        progress: as `fit`'s.

    Returns:
        `SparsePosterior` holding the kernel, inputs and inducing set (for `predict`), with `status` and
        `converged`.

    Raises:
        ValueError: bad inputs or labels, indices outside 0..nC-1, a mask of another length, or a bad option
            (`progress` as `fit`'s).
    """
    resolve_progress(progress, "gkl_jax.multiclass.fit_sparse")
    X = _inputs(kernel, X)
    Y = one_hot_labels(y, X.shape[0], num_classes, X.dtype)
    check_nonnegative(noise, "noise")
    check_nonnegative(jitter, "jitter")
    inducing = check_indices(inducing, Y.size, "inducing")
    if inducing.shape[0] == 0:
        raise ValueError("inducing must hold at least one latent index")
    Kzz, Kzf, Kff = inducing_prior(kernel, X, Y.shape[1], inducing, noise=noise, jitter=jitter)
    post = _fit_sparse_matrices(Kzz, Kzf, Kff, Y, mask=mask, site=site, v_update=v_update, tol=tol,
                                max_steps=max_steps, init=init, progress=progress)
    mask = None if mask is None else jnp.asarray(mask, bool)
    return dataclasses.replace(post, kernel=kernel, X=X, inducing=inducing, mask=mask,
                               noise=float(noise), jitter=float(jitter))


def _sparse_predictive(post, X_new):
    n, C = post.Y.shape
    Kzz, Kzf, _ = inducing_prior(post.kernel, post.X, C, post.inducing, noise=post.noise, jitter=post.jitter)
    sites = jnp.asarray(post.inducing)
    mask = jnp.ones(sites.shape[0], bool) if post.mask is None else post.mask
    Kzz, Kzf = masked_prior(Kzz, Kzf, mask)
    L = jnp.linalg.cholesky(Kzz)
    Lt = jsl.solve_triangular(L, Kzf, lower=True).T  # (nC, s)
    ii, cc = sites // C, sites % C
    kzs = post.kernel.gram(post.X[ii], X_new) * mask[:, None]  # (s, n_*)
    Kzs = (kzs[:, :, None] * (cc[:, None, None] == jnp.arange(C)[None, None, :])).reshape(sites.shape[0], -1)
    a = jsl.solve_triangular(L, Kzs, lower=True)  # (s, n_* C)
    mu = tdot(Lt, (post.Y - post.b).reshape(-1))
    B = sym(jnp.eye(L.shape[0], dtype=L.dtype) + tdot(Lt, blockdiag_left(post.W, Lt)))
    R = jnp.linalg.cholesky(B)
    Z = jsl.solve_triangular(R, a, lower=True)  # R^{-1} a: a^T B^{-1} a = Z^T Z
    n_star = X_new.shape[0]
    ar, Zr = a.reshape(-1, n_star, C), Z.reshape(-1, n_star, C)
    cov = (post.kernel.diag(X_new)[:, None, None] * jnp.eye(C, dtype=L.dtype)
           - jnp.einsum("sja,sjb->jab", ar, ar) + jnp.einsum("sja,sjb->jab", Zr, Zr))
    return Predictive(mean=(a.T @ mu).reshape(n_star, C), covariance=sym(cov))


@full_precision
def predict(posterior, X_new) -> Predictive:
    """The Gaussian predictive N(m_*, V_*) of the C latent values at each test input (Chai 2012, Section
    2.3.3): m_* = K_*^T alpha and V_*j = K_**,j - K_*j^T T K_*j with T = W - W V W (eq. 75) for a `Posterior`;
    p(f_* | z) integrated over q(z) for a `SparsePosterior`.

    Args:
        posterior: a `Posterior` from `fit` or `fit_hyperparameters`, or a `SparsePosterior` from `fit_sparse`
            or `select_inducing` (fitted on a kernel and inputs, not on given covariances).
        X_new: (n_*, d) float test inputs.

    Returns:
        `Predictive` with `mean` (n_*, C) and `covariance` (n_*, C, C) float arrays; its methods give the class
        probabilities (eq. 25, or integrated over the predictive) and the eq. 24 bounds.

    Raises:
        ValueError: a posterior of another type or without a kernel, or test inputs of another width.
    """
    if not isinstance(posterior, (Posterior, SparsePosterior)):
        raise ValueError(f"posterior must be a multiclass Posterior or SparsePosterior, got "
                         f"{type(posterior).__name__}")
    if posterior.kernel is None:
        raise ValueError("posterior was fitted on given covariances: fit it with multiclass.fit or fit_sparse")
    X_new = _inputs(posterior.kernel, X_new, "X_new")
    if X_new.shape[1] != posterior.X.shape[1]:
        raise ValueError(f"X_new has {X_new.shape[1]} columns but the posterior was fitted on "
                         f"{posterior.X.shape[1]}")
    with single_blas_thread():
        return _predictive(posterior, X_new.astype(posterior.X.dtype))


@eqx.filter_jit
def _predictive(posterior, X_new):
    """One compiled program per (posterior type, shapes)."""
    if isinstance(posterior, SparsePosterior):
        return _sparse_predictive(posterior, X_new)
    T = posterior.t_matrix()
    Kc = posterior.class_covariance
    if Kc is None:
        return kronecker_predictive(posterior.kernel, posterior.X, X_new, posterior.alpha, T)
    K_cross = jnp.kron(posterior.kernel.gram(posterior.X, X_new), Kc)
    K_star = posterior.kernel.diag(X_new)[:, None, None] * Kc
    return predictive_moments(posterior.alpha, T, K_cross, K_star)


@full_precision
def gram_bound(kernel, X, num_classes, *, class_covariance=None, jitter=1e-6, variational_variance=None):
    """A lower bound on log p(y) that holds for every labelling y of the inputs (Chai 2012, Theorem 9): the bound
    log Z_h at q = N(0, sigma_v^2 I) and the optimal site parameters (Lemma 29),

        nC/2 + (nC/2) log sigma_v^2 - 1/2 log|K| - sigma_v^2/2 tr K^{-1} + n max_{b, S} h(N(0, sigma_v^2 I_C)).

    Args:
        kernel: a `gk.kernels` kernel on the inputs.
        X: (n, d) float inputs.
        num_classes: C (int >= 2).
        class_covariance: (C, C) float K^c, or None for the identity.
        jitter: non-negative float added to the prior's diagonal.
        variational_variance: positive float sigma_v^2, or None to maximise the bound over it.

    Returns:
        Float scalar array.

    Raises:
        ValueError: bad inputs, C < 2, or a non-positive variational variance.
    """
    X = _inputs(kernel, X)
    C = int(num_classes)
    if C != num_classes or C < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    Kc = _class_covariance(class_covariance, C, X.dtype)
    check_nonnegative(jitter, "jitter")
    K = prior_covariance(kernel, X, C, Kc, jnp.asarray(jitter, X.dtype))
    return gram_matrix_bound(K, C, variational_variance)
