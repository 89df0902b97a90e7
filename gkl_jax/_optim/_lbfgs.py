"""The L-BFGS two-loop recursion (Nocedal & Wright 2006, Alg. 7.4) on the host, for outer loops that run in
Python around one compiled inner solve (a handful of parameters, a few dozen steps)."""

import numpy as np


def lbfgs_direction(g, pairs):
    """The quasi-Newton step H g from the curvature pairs of a minimisation, newest last.

    H approximates the inverse Hessian from the pairs (s_k, y_k) (s the step, y the change of the gradient,
    s^T y > 0), scaled initially by s^T y / y^T y of the newest pair; with no pairs, g / max(||g||, 1). For a
    maximisation pass the pairs of -f (y = -(change of the gradient of f)) and g the gradient of f: H g is then an
    ascent direction.

    Args:
        g: (P,) float64 gradient (NumPy).
        pairs: sequence of (s, y) NumPy (P,) pairs with s @ y > 0, oldest first.

    Returns:
        (P,) NumPy array H g.
    """
    q = np.array(g, dtype=np.float64)
    if not pairs:
        return q / max(float(np.linalg.norm(q)), 1.0)
    alphas = []
    for s, y in reversed(pairs):
        a = (s @ q) / (s @ y)
        alphas.append(a)
        q = q - a * y
    s, y = pairs[-1]
    r = (s @ y) / (y @ y) * q
    for (s, y), a in zip(pairs, reversed(alphas)):
        r = r + s * (a - (y @ r) / (s @ y))
    return r
