"""Preconditioned conjugate gradients in `lax` control flow (Nocedal & Wright 2006, Alg. 5.3), with the
negative-curvature stop of truncated Newton methods (Steihaug 1983)."""

import jax.numpy as jnp
from jax import lax


def conjugate_gradient(matvec, b, *, max_iters, rtol, precond=None):
    """Approximately solve A x = b by preconditioned conjugate gradients.

    Stops when ||r|| <= rtol ||b||, after `max_iters` iterations, or at the first direction d with
    d^T A d <= 0 (A not positive definite there: Steihaug's rule, so that a truncated Newton step stays an
    ascent direction). At such a stop the last iterate is returned, or, at the first iteration, the
    preconditioned right-hand side precond(b). Plain `lax.while_loop` (no `custom_linear_solve`), so it can sit
    inside custom derivative rules and be transposed by `lax.custom_linear_solve`.

    Args:
        matvec: v -> A v for (P,) vectors, A symmetric (expected positive definite).
        b: (P,) right-hand side.
        max_iters: the most CG iterations (static int or traced scalar).
        rtol: relative residual tolerance (scalar).
        precond: v -> M v, an approximation of A^{-1} (symmetric positive definite); None for the identity.

    Returns:
        (P,) array: the approximate solution x (zeros when b = 0).
    """
    precond = (lambda v: v) if precond is None else precond
    bnorm = jnp.linalg.norm(b)
    z0 = precond(b)

    def cond(state):
        *_, i, done = state
        return (i < max_iters) & ~done

    def body(state):
        x, r, z, d, rz, i, _ = state
        Ad = matvec(d)
        curv = d @ Ad
        bad = ~(curv > 0)
        alpha = rz / jnp.where(bad, 1.0, curv)
        x_new = jnp.where(bad, jnp.where(i == 0, z0, x), x + alpha * d)
        r_new = r - alpha * Ad
        z_new = precond(r_new)
        rz_new = r_new @ z_new
        small = jnp.linalg.norm(r_new) <= rtol * bnorm
        d_new = z_new + (rz_new / jnp.where(rz == 0, 1.0, rz)) * d
        keep = lambda a, c: jnp.where(bad, a, c)
        return x_new, keep(r, r_new), keep(z, z_new), keep(d, d_new), keep(rz, rz_new), i + 1, bad | small

    init = (jnp.zeros_like(b), b, z0, z0, b @ z0, 0, bnorm == 0)
    # separate loop: the one CG of the package, a building block nested in solver steps
    return lax.while_loop(cond, body, init)[0]
