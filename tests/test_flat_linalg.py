"""`_linalg.flat_linalg`: inside it the blocked triangular solve, inverse and Gram product are one LAPACK call or
product each (for the programs compiled at LLVM level 0), with the same values to round-off, and a function traced
in one mode is traced anew in the other (the mode is part of JAX's jit cache key)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gkl_jax._linalg import flat_linalg, invert_lower, lower_gram, solve_lower


def _lower(n, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((n, n))
    return jnp.asarray(np.linalg.cholesky(A @ A.T / n + np.eye(n))), jnp.asarray(rng.standard_normal((n, 3)))


@pytest.mark.parametrize("fn", ["solve", "invert", "gram"])
def test_flat_and_blocked_agree_to_round_off(fn):
    L, B = _lower(200)
    call = {"solve": lambda: solve_lower(L, B), "invert": lambda: invert_lower(L), "gram": lambda: lower_gram(L)}[fn]
    blocked = np.asarray(call())
    with flat_linalg():
        flat = np.asarray(call())
    np.testing.assert_allclose(flat, blocked, rtol=1e-10, atol=1e-12)


def test_the_mode_is_part_of_the_jit_cache_key():
    L, _ = _lower(200)
    f = jax.jit(lambda L: invert_lower(L) @ jnp.ones(200))

    def solves():      # LAPACK triangular solves in the compiled program (every call inlined)
        return f.lower(L).compile().as_text().count("trsm")

    blocked = solves()
    with flat_linalg():
        flat = solves()
        f(L)            # compiled in flat mode
    assert flat == 1 and blocked >= 4    # 200 -> 100 -> 50: four leaves of the blocked inverse
    assert solves() == blocked           # outside again: the blocked trace, not the cached flat one
