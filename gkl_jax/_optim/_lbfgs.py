"""The L-BFGS two-loop recursion (Nocedal & Wright 2006, Alg. 7.4), one implementation for the host loops that run
in Python around compiled inner solves (a list of pairs, NumPy) and for the compiled L-BFGS solver (a ring buffer
of `memory` pairs, `LBFGSMemory`)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def _first_pass(q, s, y, on, where):
    """One step of the first loop (newest pair first): alpha = rho s^T q, q <- q - alpha y (nothing where not on)."""
    a = where(on, (s @ q) / where(on, s @ y, 1.0), 0.0)
    return q - a * y, a


def _second_pass(r, s, y, on, a, where):
    """One step of the second loop (oldest pair first): r <- r + s (alpha - rho y^T r) (nothing where not on)."""
    return r + where(on, s * (a - (y @ r) / where(on, s @ y, 1.0)), 0.0)


def _initial_scale(s, y, on, where, fallback=None):
    """gamma = s^T y / y^T y of the newest pair; `fallback` where it is not on."""
    return where(on, (s @ y) / where(on, y @ y, 1.0), fallback)


def _keep(on, a, b):
    return a


def lbfgs_direction(g, pairs):
    """The quasi-Newton step H g from the curvature pairs of a minimisation, newest last (on the host).

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
        q, a = _first_pass(q, s, y, True, _keep)
        alphas.append(a)
    r = _initial_scale(*pairs[-1], True, _keep) * q
    for (s, y), a in zip(pairs, reversed(alphas)):
        r = _second_pass(r, s, y, True, a, _keep)
    return r


class LBFGSMemory(eqx.Module):
    """The last `m` curvature pairs of a compiled L-BFGS, in a ring buffer, and their two-loop recursion
    (`direction`, the steps of `lbfgs_direction` as two `lax.scan`s).

    Attributes:
        s: (m, P) steps; y: (m, P) gradient changes (of the minimised function); count: int32, pairs stored since
            the last reset (slot count % m is written next).
    """

    s: jax.Array
    y: jax.Array
    count: jax.Array

    @classmethod
    def empty(cls, x, m: int):
        """No pairs, for points shaped like x (P,), room for m."""
        return cls(jnp.zeros((m,) + x.shape, x.dtype), jnp.zeros((m,) + x.shape, x.dtype), jnp.zeros((), jnp.int32))

    def push(self, s, y, keep):
        """The memory with (s, y) stored where `keep` (a traced bool), unchanged otherwise (a row update: no copy
        of the buffers)."""
        slot = self.count % self.s.shape[0]
        row = lambda buf, new: buf.at[slot].set(jnp.where(keep, new, buf[slot]))
        return LBFGSMemory(row(self.s, s), row(self.y, y), self.count + keep.astype(jnp.int32))

    def reset(self, clear):
        """The memory emptied where `clear` (a traced bool)."""
        return LBFGSMemory(self.s, self.y, jnp.where(clear, 0, self.count))

    def direction(self, g):
        """H g (`lbfgs_direction`) from the stored pairs.

        Args:
            g: (P,) the gradient (of the maximised function, with the pairs of its negative).

        Returns:
            (P,) H g; g / max(||g||, 1) without pairs.
        """
        m = self.s.shape[0]
        newest = (self.count - 1 - jnp.arange(m)) % m             # slots, newest first
        on = jnp.arange(m) < jnp.minimum(self.count, m)

        def first(q, i):
            q, a = _first_pass(q, self.s[newest[i]], self.y[newest[i]], on[i], jnp.where)
            return q, a

        q, alphas = lax.scan(first, g, jnp.arange(m))
        no_pairs = 1.0 / jnp.maximum(jnp.linalg.norm(q), 1.0)     # q = g then: as lbfgs_direction without pairs
        r = _initial_scale(self.s[newest[0]], self.y[newest[0]], on[0], jnp.where, no_pairs) * q

        def second(r, i):
            return _second_pass(r, self.s[newest[i]], self.y[newest[i]], on[i], alphas[i], jnp.where), None

        r, _ = lax.scan(second, r, jnp.arange(m - 1, -1, -1))
        return r


class _ScaleByLBFGSState(eqx.Module):
    memory: LBFGSMemory
    params: jax.Array       # the flat parameters and updates of the previous call
    updates: jax.Array
    started: jax.Array


def scale_by_lbfgs(memory_size: int = 10):
    """The L-BFGS preconditioner as an optax gradient transformation (the interface of `optax.scale_by_lbfgs`):
    updates -> H updates, with the pair (change of params, change of updates) between consecutive calls stored
    in an `LBFGSMemory` where it has positive curvature; the first call returns updates / max(||updates||, 1).
    For loops (the ML-II outer loop) that drive their own line search.

    Args:
        memory_size: the number of stored pairs.

    Returns:
        `optax.GradientTransformation`; `update` needs `params`.
    """
    import optax
    from jax.flatten_util import ravel_pytree

    def init(params):
        flat = ravel_pytree(params)[0]
        return _ScaleByLBFGSState(LBFGSMemory.empty(flat, memory_size), jnp.zeros_like(flat), jnp.zeros_like(flat),
                                  jnp.zeros((), bool))

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("scale_by_lbfgs: update needs params")
        u, unravel = ravel_pytree(updates)
        p = ravel_pytree(params)[0]
        s, y = p - state.params, u - state.updates
        memory = state.memory.push(s, y, state.started & (s @ y > 0))
        return unravel(memory.direction(u)), _ScaleByLBFGSState(memory, p, u, jnp.ones((), bool))

    return optax.GradientTransformation(init, update)
