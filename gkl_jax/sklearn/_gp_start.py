"""ML-II of the Student-t GP regressor from the data, in coordinates scaled by the Fisher information.

The Student-t likelihood makes the G-KL bound non-concave and each inner fit an O(n^3) iteration, so the outer
loop's step count and the inner fits' cost are what a fit costs. The inner fits run the site-precision solver on
signed site precisions (`gkl_jax.solvers.SitePrecision`, Opper & Archambeau 2009), each from the last optimum's
(m, W) (`gkl_jax.gp.fit_hyperparameters`' default for such models): on diabetes with outliers the whole ML-II is
14x faster than with `gkl_jax.fit`'s robust default in every inner fit, at the same optimum (design-decisions
page). Two things cut the
step count, as for the linear estimators (`_ml2.data_start`, `_ml2.scales`):

- the start: the robust scale 1.4826 MAD of the leave-one-out residuals of the Gaussian likelihood's ML-II fit
  (closed-form evidence; `robust_scale`);
- the coordinates: u = R theta over theta = (the kernel's log-parameters, log scale) with R^T R the Fisher
  information, 1/2 tr(K_y^{-1} dK/dtheta_i K_y^{-1} dK/dtheta_j) for the kernel (Rasmussen & Williams 2006,
  Section 5.4.1) at noise variance scale^2, and 2 n nu / (nu + 3) for the Student-t log scale (`_ml2.scales`), so
  that L-BFGS sees a Hessian near the identity. On diabetes with outliers the evidence's Hessian in theta had
  eigenvalues 0.34, 30 and 295 (the variance-lengthscale ridge and the stiff noise); with both, L-BFGS took 7-10
  outer steps instead of 15-17, to the same optima (design-decisions page).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .._program import program
from ._ml2 import scales

FALLBACK_SCALE = 0.1
"""The starting scale where the Gaussian fit's leave-one-out residuals cannot be formed (the default before)."""


def robust_scale(params, X, z, jitter):
    """The Student-t regressor's starting scale from the Gaussian regressor's fit: 1.4826 MAD of its leave-one-out
    residuals r_i = [K_y^{-1} z]_i / [K_y^{-1}]_ii (Rasmussen & Williams 2006, eq. 5.12). Not the in-sample
    residuals: where the Gaussian evidence prefers to interpolate the outliers (a short lengthscale, noise -> 0)
    they vanish. Not the Gaussian fit's kernel either: its ML-II can end at the white-noise optimum (lengthscale
    -> infinity), from which the Student-t ML-II stayed there, 2 nats below the robust optimum (design-decisions
    page); the kernel starts where the estimator's other ML-II runs start.

    Args:
        params: the Gaussian likelihood's learned parameters {"kernel", "log_noise"} (`_gp._fit_gp`).
        X: (n, d) inputs; z: (n,) standardised targets; jitter: added to the Gram matrix's diagonal.

    Returns:
        float, at least 1e-3 (`FALLBACK_SCALE` where K_y is numerically singular or the residuals not finite).
    """
    Ky = np.asarray(params["kernel"].gram(X)) + (float(np.exp(params["log_noise"])) + jitter) * np.eye(len(z))
    try:
        L = np.linalg.cholesky(Ky)
    except np.linalg.LinAlgError:     # a Gaussian fit too ill-conditioned to invert: the estimator's old start
        return FALLBACK_SCALE
    K_inv = np.linalg.solve(L.T, np.linalg.solve(L, np.eye(len(z))))
    r = (K_inv @ z) / np.diag(K_inv)
    scale = 1.4826 * float(np.median(np.abs(r - np.median(r))))
    return max(scale, 1e-3) if np.isfinite(scale) else FALLBACK_SCALE


@program
def _kernel_information(kernel, X, mask, noise_variance, jitter):
    """1/2 tr(K_y^{-1} dK/dtheta_i K_y^{-1} dK/dtheta_j) over the kernel's inexact leaves theta (one program); the
    rows where `mask` is False are padding (`_gp_model`): an identity block of K_y, zero in dK."""
    dyn, static = eqx.partition(kernel, eqx.is_inexact_array)
    flat, unravel = ravel_pytree(dyn)
    real = mask[:, None] & mask[None, :]
    gram = lambda f: jnp.where(real, eqx.combine(unravel(f), static).gram(X), 0.0)
    Ky = gram(flat) + jnp.diag(jnp.where(mask, noise_variance + jitter, 1.0).astype(flat.dtype))
    A = jnp.linalg.solve(Ky, jnp.moveaxis(jax.jacfwd(gram)(flat), -1, 0))       # (P, n, n): K_y^{-1} dK_i
    return 0.5 * jnp.einsum("iab,jba->ij", A, A)


def fisher_factor(kernel, X, noise_variance, jitter, dof, mask=None):
    """R with R^T R the Fisher information of theta = (the kernel's inexact leaves, log scale) (module doc).

    Args:
        kernel: a `gkl_jax.kernels` kernel; X: (n, d) float64 inputs.
        mask: None, or (n,) bool, False on padded rows (`_gp_model`; compiled once per bucket).
        noise_variance: the Gaussian noise variance at which the kernel's block is taken.
        jitter: added to the Gram matrix's diagonal.
        dof: the Student-t degrees of freedom.

    Returns:
        (P + 1, P + 1) upper-triangular numpy array (P the kernel's parameters).
    """
    mask = np.ones(X.shape[0], bool) if mask is None else np.asarray(mask, bool)
    block = np.asarray(_kernel_information(kernel, jnp.asarray(X), jnp.asarray(mask), np.asarray(noise_variance),
                                           np.asarray(jitter)))
    P = block.shape[0]
    info = np.zeros((P + 1, P + 1))
    info[:P, :P] = block + 1e-6 * np.trace(block) * np.eye(P)      # a flat direction stays invertible
    info[P, P] = scales(int(mask.sum()), 0, "student-t", dof)[1] ** 2
    return np.linalg.cholesky(info).T


class ScaledBuild(eqx.Module):
    """{"u": (P + 1,)} -> the model of `build` at theta = R^{-1} u (module doc), for `fit_hyperparameters`."""

    build: eqx.Module
    R_inv: jax.Array
    kernel: eqx.Module

    def params(self, u):
        """The estimator's parameters {"kernel", "log_noise"} at u."""
        dyn, static = eqx.partition(self.kernel, eqx.is_inexact_array)
        _, unravel = ravel_pytree(dyn)
        theta = self.R_inv @ u
        return {"kernel": eqx.combine(unravel(theta[:-1]), static), "log_noise": theta[-1]}

    def __call__(self, p):
        return self.build(self.params(p["u"]))


def scaled_start(kernel, log_noise, R):
    """u = R theta at the starting kernel and log scale.

    Args:
        kernel: the starting kernel; log_noise: the starting log scale; R: `fisher_factor`'s matrix.

    Returns:
        {"u": (P + 1,) float64 array}.
    """
    flat, _ = ravel_pytree(eqx.filter(kernel, eqx.is_inexact_array))
    return {"u": jnp.asarray(R @ np.append(np.asarray(flat), log_noise))}

