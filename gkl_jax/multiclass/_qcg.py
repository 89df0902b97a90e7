"""Conjugate gradients for the Newton system of the multiclass V step, in the inner product of the block sandwich."""

import jax.numpy as jnp
from jax import lax

NEWTON_RTOL = 1e-2
"""The default relative tolerance (the full solver's): the V step's Newton direction is one block of a coordinate
ascent, which needs no more (Dembo, Eisenstat and Steihaug 1982: a forcing term below one keeps inexact Newton
convergent). Against 1e-6 it takes 2 iterations a step instead of 5 on iris at the same ascent and bound. The
sparse solver keeps 1e-3 (`_sparse.V_CG_RTOL`; design-decisions page)."""


def q_conjugate_gradient(Q, D, R, max_iters, rtol=NEWTON_RTOL, QR=None):
    """Solve (I + D Q) x = R by conjugate gradients in the Q inner product <x, y>_Q = <x, Q y> (Frobenius).

    Q (the block sandwich, positive definite) and D (the profile sensitivity) are symmetric, so I + D Q is
    self-adjoint in that inner product; this is preconditioned CG on (Q + Q D Q) x = Q R with preconditioner Q^{-1},
    applied without inverting Q (Q p is carried along). The shared `gkl_jax._optim.conjugate_gradient` takes the
    preconditioner as a function of the residual, which here would be Q^{-1}; run on (Q + Q D Q) without it, it
    costs two products with Q per iteration and its rate depends on cond(Q) (~200 iterations on glass against 3-5).
    Stops at non-positive curvature.

    Args:
        Q, D: symmetric linear maps on (n, C, C) block arrays.
        R: (n, C, C) right-hand side.
        max_iters: the most iterations.
        rtol: relative tolerance on the Q-norm of the residual (`NEWTON_RTOL`).
        QR: Q(R) when the caller has it (else it is computed).

    Returns:
        (n, C, C) array: the approximate solution (R itself when the first direction has no positive curvature).
    """
    ip = lambda a, b: jnp.sum(a * b)
    QR = Q(R) if QR is None else QR
    rz0 = ip(QR, R)

    def cond(c):
        *_, rz, k, bad = c
        return (k < max_iters) & (rz > rtol**2 * rz0) & ~bad

    def body(c):
        x, z, r, p, Qp, rz, k, _ = c
        Ap = p + D(Qp)
        QAp = Q(Ap)
        curv = ip(p, QAp)
        bad = ~(curv > 0)
        a = jnp.where(bad, 0.0, rz / jnp.where(bad, 1.0, curv))
        x, z, r = x + a * p, z - a * Ap, r - a * QAp
        rz_new = ip(r, z)
        beta = rz_new / rz
        return x, z, r, z + beta * p, r + beta * Qp, rz_new, k + 1, bad

    init = (jnp.zeros_like(R), R, QR, R, QR, rz0, 0, ~(rz0 > 0))
    # separate loop: its preconditioner is Q^{-1}, applied implicitly (Q p carried); the shared CG would need Q^{-1}
    x, *_ = lax.while_loop(cond, body, init)
    return jnp.where(jnp.any(x != 0), x, R)
