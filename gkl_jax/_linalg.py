"""Dense linear algebra shaped for XLA's CPU backend: A^T B without the slow path for transposed left operands,
and triangular solves, inverses and Gram products blocked into matrix products.

On XLA's CPU backend (jax 0.10, measured on this project's machine, one core) a product written `A.T @ B` is
emitted with a transposed left operand and runs far below the speed of the same product written the other way
(measurements: the design-decisions page). Reverse-mode autodiff already emits the
fast form, so only hand-written transposed products need this. On accelerators the rewrite costs at most one copy.
"""

import contextlib
import functools
import warnings

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jax import lax

# Below this many columns of B, materialising A^T (a copy of A) costs more than the slow product saves
# (A of shape (5000, 1000): B with 50 columns 17 ms as is, 29 ms with the copy; with 1000 columns 272 -> 166 ms).
_COPY_MIN_COLUMNS = 128


def _flat_state():
    """A JAX configuration state that turns the blocked algorithms below (`solve_lower`, `invert_lower`,
    `lower_gram`) into one LAPACK call or product each, part of every jit cache key (so a program traced with it on
    never reuses a trace made with it off); None where this JAX version lacks the internal API."""
    try:
        from jax._src import config as jax_config
        return jax_config.bool_state(
            "gkl_jax_flat_linalg", False, "gkl-jax: unblocked triangular solves, inverses and Gram products",
            include_in_jit_key=True, include_in_trace_context=True)
    except Exception:    # pragma: no cover - another JAX's internals: keep the blocked algorithms
        return None


_FLAT = _flat_state()


def flat_active() -> bool:
    """Whether `flat_linalg` is on (at trace time)."""
    return _FLAT is not None and bool(_FLAT.value)


@contextlib.contextmanager
def flat_linalg():
    """Context: the programs traced inside it use unblocked linear algebra. For programs compiled at LLVM
    optimisation level 0 (the GP estimators' first fits up to 512 padded rows), where the blocks' extra products,
    slices and concatenations cost more than they save and enlarge the program: both the compilation and the run
    of the classifier's ML-II were shorter without them (the measurements are on the design-decisions page).

    Yields:
        None.
    """
    if _FLAT is None:
        yield
        return
    with _FLAT(True):
        yield


def in_float64(method):
    """Decorator: run `method` under `jax.enable_x64(True)`, whatever the caller's global setting (restored
    afterwards). For the estimators, whose numpy-in, numpy-out fits always compute in float64: with JAX's float32
    default their tolerances would be out of reach.

    Args:
        method: the function or method.

    Returns:
        The wrapped callable.
    """
    @functools.wraps(method)
    def wrapped(*args, **kwargs):
        with jax.enable_x64(True):
            return method(*args, **kwargs)
    return wrapped


def full_precision(fn):
    """`fn` run with matrix products in full precision (`jax.default_matmul_precision("highest")`) unless the
    user has set `jax_default_matmul_precision`. On the CPU this changes nothing; on GPU and TPU, JAX's default
    computes float32 products in TF32 or bfloat16 passes (about 1e-3 relative error).

    Measured on an H200 (jax 0.11.2, 2026-11-26) before this was applied: float32 Chevron fits of Challis & Barber
    (2013) Tables 2-4 stopped at the step limit short of the float32 tolerance 1e-3 in 13 of 18 cells (on the CPU the
    same float32 fits converge in the float64 step counts), a float32 GP covariance of 30 points failed its
    Cholesky factorisation, and operator products differed from float64 by 1.3e-3. The context is read when a
    program is traced, so it reaches every product of `fn`, inside jit and in the transposes autodiff adds.

    The warnings `fn` issues (non-convergence, numerical trouble) are re-issued from here one frame up, so that
    they name the caller's line, not this wrapper's; the caller's warning filters apply to them as usual."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        caught = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if jax.config.jax_default_matmul_precision is not None:
                    return fn(*args, **kwargs)
                with jax.default_matmul_precision("highest"):
                    return fn(*args, **kwargs)
        finally:   # outside catch_warnings: the caller's filters are back
            for w in caught:
                warnings.warn(w.message, w.category, stacklevel=2)

    return wrapper


def reduced_matmul_precision(dtype) -> bool:
    """True when float32 products run below float32 precision: on GPU/TPU under a `jax_default_matmul_precision`
    other than "highest" or "float32". float64 products, and all products on the CPU, are full precision."""
    return (jnp.finfo(dtype).bits < 64 and jax.default_backend() != "cpu"
            and jax.config.jax_default_matmul_precision not in ("highest", "float32"))  # type: ignore[attr-defined]


def reduced_precision_hint() -> str:
    precision = jax.config.jax_default_matmul_precision  # type: ignore[attr-defined]
    return (f"jax_default_matmul_precision={precision!r} makes float32 matrix "
            "products on this accelerator TF32/bfloat16 (about 1e-3 relative error); use 'highest' or float64")


def diagonal(A):
    """The main diagonal of the trailing two axes of A (..., n, k) -> (..., min(n, k)), as one gather.

    `jnp.diagonal` (and `jnp.diag` of a matrix) traces to two nested jits and a platform-dependent `cond` with
    two branches; differentiated inside the solver programs, that was about 14% of the first fit's tracing.

    Args:
        A: (..., n, k) array.

    Returns:
        (..., min(n, k)) array A[..., i, i].
    """
    i = np.arange(min(A.shape[-2:]))
    return A[..., i, i]


def tdot(A, B):
    """A^T B for a matrix A (N, D) and B of shape (N,) or (N, K)."""
    if B.ndim == 1:
        return B @ A
    if B.shape[1] < _COPY_MIN_COLUMNS:
        return (B.T @ A).T
    return lax.optimization_barrier(A.T) @ B


@functools.partial(jax.jit, static_argnames="levels")
def solve_lower(L, B, levels: int = 3):
    """L^{-1} B for a lower-triangular L (n, n) and B of shape (n,) or (n, k), by recursive 2 x 2 blocking (down
    to blocks of 64): the off-diagonal blocks become matrix products, which XLA's CPU backend runs twice as fast
    as its triangular solve (design-decisions page)."""
    n = L.shape[0]
    if levels == 0 or n < 64 or flat_active():
        return jsl.solve_triangular(L, B, lower=True)
    h = n // 2
    top = solve_lower(L[:h, :h], B[:h], levels - 1)
    bottom = solve_lower(L[h:, h:], B[h:] - L[h:, :h] @ top, levels - 1)
    return jnp.concatenate([top, bottom])


@functools.partial(jax.jit, static_argnames="base")
def invert_lower(L, base: int = 64):
    """L^{-1} for a lower-triangular L (n, n), by the blocked inverse

        [[A, 0], [B, C]]^{-1} = [[A^{-1}, 0], [-C^{-1} B A^{-1}, C^{-1}]]

    recursively down to blocks of at most `base` rows (triangular solves with the identity there): ~2/3 n^3 flops,
    spent in matrix products, which XLA's CPU backend runs faster per flop than its triangular solve (the
    measurements, and the choice of `base`, are on the design-decisions page)."""
    n = L.shape[0]
    if n <= base or flat_active():
        return jsl.solve_triangular(L, jnp.eye(n, dtype=L.dtype), lower=True)
    h = n // 2
    top = invert_lower(L[:h, :h], base)
    bottom = invert_lower(L[h:, h:], base)
    return jnp.block([[top, jnp.zeros((h, n - h), L.dtype)], [-(bottom @ (L[h:, :h] @ top)), bottom]])


@functools.partial(jax.jit, static_argnames="levels")
def lower_gram(G, levels: int = 3):
    """G^T G for a lower-triangular G (n, n), by the blocks of G = [[A, 0], [B, C]]:

        G^T G = [[A^T A + B^T B, B^T C], [C^T B, C^T C]],

    recursively on A^T A and C^T C (down to blocks of 64), which skips the products with the zero block."""
    n = G.shape[0]
    if levels == 0 or n < 64 or flat_active():
        return tdot(G, G)
    h = n // 2
    A, B, C = G[:h, :h], G[h:, :h], G[h:, h:]
    off = tdot(C, B)
    return jnp.block([[lower_gram(A, levels - 1) + tdot(B, B), off.T], [off, lower_gram(C, levels - 1)]])
