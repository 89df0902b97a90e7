"""The covariances of the sparse approximation (Chai 2012, Section 4; Remarks 13-14: inducing variables at
training latents) and its bound log Z~_h (eq. 32) by the textbook formulas (eq. 31)."""

import jax.numpy as jnp
import jax.scipy.linalg as jsl

from .._linalg import diagonal, tdot
from .._validate import check_indices, check_int
from ._blocks import per_datum, sym
from ._site import site_bound_free


def inducing_prior(kernel, X, num_classes, sites, *, noise=1e-6, jitter=1e-6, class_covariance=None):
    """(K_zz, K_zf, K_ff blocks) for inducing variables z_a = f^{c_a}(x_{i_a}) + eps_a at the training latents
    `sites` (indices p = i C + c), with eps_a ~ N(0, noise) (Remark 13); the latent prior carries `jitter`."""
    C = check_int(num_classes, "num_classes", 2)
    X = jnp.asarray(X)
    sites = check_indices(sites, X.shape[0] * C, "sites")
    Kc = jnp.eye(C, dtype=X.dtype) if class_covariance is None else jnp.asarray(class_covariance, X.dtype)
    ii, cc = sites // C, sites % C
    Kzx = kernel.gram(X[ii], X)  # (s, n)
    Kzz = kernel.gram(X[ii]) * Kc[cc][:, cc] + noise * jnp.eye(sites.shape[0], dtype=X.dtype)
    Kzf = (Kzx[:, :, None] * Kc[cc][:, None, :]).reshape(sites.shape[0], -1)
    Kff = kernel.diag(X)[:, None, None] * Kc + jitter * jnp.eye(C, dtype=X.dtype)
    return Kzz, Kzf, Kff


def masked_prior(Kzz, Kzf, mask):
    """K_zz and K_zf with the inducing variables outside `mask` made inert (identity rows, zero cross-covariance)."""
    mm = mask[:, None] & mask[None, :]
    eye = jnp.eye(Kzz.shape[0], dtype=Kzz.dtype)
    return jnp.where(mm, Kzz, eye), jnp.where(mask[:, None], Kzf, 0.0)


def whitened_cross(Kzz, Kzf):
    """Ltil = K_zf^T L^{-T}, K_zz = L L^T: (nC, s)."""
    L = jnp.linalg.cholesky(Kzz)
    return jsl.solve_triangular(L, Kzf, lower=True).T


def sparse_log_z(Kzz, Kzf, Kff_blocks, Y, m, V, b, S, mask=None):
    """log Z~_h of eq. 32 at arbitrary q(z) = N(m, V) and (b, S), by the textbook formulas (eq. 31) with K_zz^{-1}
    through its Cholesky factor. Differentiable in the covariances: with the variational parameters held at the
    optimum its gradient is d log Z~_h*/d theta (App. C.4, envelope theorem)."""
    if mask is not None:
        Kzz, Kzf = masked_prior(Kzz, Kzf, mask)
    n, C = Y.shape
    s = Kzz.shape[0]
    L = jnp.linalg.cholesky(Kzz)
    A = jsl.solve_triangular(L, Kzf, lower=True)  # L^{-1} K_f
    LV = jnp.linalg.cholesky(V)
    B = jsl.solve_triangular(L, LV, lower=True)
    a = jsl.solve_triangular(L, m, lower=True)
    logdet = 2 * (jnp.sum(jnp.log(diagonal(LV))) - jnp.sum(jnp.log(diagonal(L))))
    neg_kl = 0.5 * (logdet - jnp.sum(B * B) - a @ a + s)
    mf = tdot(A, a)
    G = jsl.solve_triangular(L.T, A, lower=False)  # K^{-1} K_f
    Gr = G.reshape(s, n, C)
    Ar = A.reshape(s, n, C)
    VG = jnp.einsum("st,tia->sia", V, Gr)
    Vf = Kff_blocks - jnp.einsum("sia,sib->iab", Ar, Ar) + jnp.einsum("sia,sib->iab", Gr, VG)
    sites = per_datum(lambda y, mm, VV, bb, SS: site_bound_free(mm, VV, bb, SS) + mm @ y)
    return neg_kl + jnp.sum(sites(Y, mf.reshape(n, C), sym(Vf), b, S))
