"""Matrix-free operators against independently built dense matrices (numpy oracles in this file)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tol

import gkl_jax as gk
from gkl_jax.operators import FiniteDifference2D, Stack, Wavelet2D, image_filters

# ---- numpy oracles, written independently of the library code ----


def fd_oracle(height, width, direction, boundary):
    """Dense D_h / D_v with rows e_plus - e_minus, row-major pixels, built by loops."""
    idx = lambda i, j: i * width + j
    rows = []
    if direction in ("horizontal", "both"):
        for i in range(height):
            for j in range(width if boundary == "periodic" else width - 1):
                r = np.zeros(height * width)
                r[idx(i, (j + 1) % width)] += 1
                r[idx(i, j)] -= 1
                rows.append(r)
    if direction in ("vertical", "both"):
        for i in range(height if boundary == "periodic" else height - 1):
            for j in range(width):
                r = np.zeros(height * width)
                r[idx((i + 1) % height, j)] += 1
                r[idx(i, j)] -= 1
                rows.append(r)
    return np.array(rows)


def qmf_step(n, h):
    """Single-level periodic analysis matrices (lowpass, highpass), (n/2, n) each."""
    g = [(-1) ** k * h[len(h) - 1 - k] for k in range(len(h))]
    lo, hi = np.zeros((n // 2, n)), np.zeros((n // 2, n))
    for k in range(n // 2):
        for j in range(len(h)):
            lo[k, (2 * k + j) % n] += h[j]
            hi[k, (2 * k + j) % n] += g[j]
    return lo, hi


def wavelet_oracle(height, width, levels, h):
    """Dense 2-D Mallat transform: apply the recursion Y = [[Lo X Lo^T, Lo X Hi^T], [Hi X Lo^T, Hi X Hi^T]] to each
    unit image."""

    def transform(X, levels):
        if levels == 0:
            return X
        loh, hih = qmf_step(X.shape[0], h)
        low, hiw = qmf_step(X.shape[1], h)
        ll = transform(loh @ X @ low.T, levels - 1)
        return np.block([[ll, loh @ X @ hiw.T], [hih @ X @ low.T, hih @ X @ hiw.T]])

    D = height * width
    return np.stack([transform(np.eye(D)[i].reshape(height, width), levels).ravel() for i in range(D)], axis=1)


S3 = math.sqrt(3.0)
DB4 = [(1 + S3) / math.sqrt(32), (3 + S3) / math.sqrt(32), (3 - S3) / math.sqrt(32), (1 - S3) / math.sqrt(32)]
HAAR = [1 / math.sqrt(2), 1 / math.sqrt(2)]


@jax.jit
def _products(op, x, y, X, Y, g):
    return dict(matrix=op.as_matrix(), mv=op.mv(x), rmv=op.rmv(y), mm=op.mm(X), rmm=op.rmm(Y), sq_mv=op.sq_mv(x),
                sq_rmv=op.sq_rmv(y), gram=op.weighted_gram(g))


def check_against_dense(op, A, rng, atol=1e-12):
    """Every product of `op` (one jitted call, op as a pytree argument) equals the dense oracle A's."""
    A = np.asarray(A)
    N, D = A.shape
    assert op.shape == (N, D)
    x, y = rng.normal(size=D), rng.normal(size=N)
    X, Y = rng.normal(size=(D, 3)), rng.normal(size=(N, 3))
    g = rng.uniform(size=N)
    out = _products(op, *map(jnp.asarray, (x, y, X, Y, g)))
    expected = dict(matrix=A, mv=A @ x, rmv=A.T @ y, mm=A @ X, rmm=A.T @ Y, sq_mv=(A ** 2) @ x,
                    sq_rmv=(A ** 2).T @ y, gram=A.T @ (g[:, None] * A))
    for name, value in expected.items():
        np.testing.assert_allclose(out[name], value, atol=atol, err_msg=name)
    return np.asarray(out["matrix"])


@pytest.mark.parametrize("direction", ["horizontal", "vertical", "both"])
@pytest.mark.parametrize("boundary", ["valid", "periodic"])
def test_finite_differences_equal_dense(rng, direction, boundary):
    op = FiniteDifference2D(5, 7, direction, boundary)
    check_against_dense(op, fd_oracle(5, 7, direction, boundary), rng)


def test_finite_difference_row_count_and_norms():
    n = 8
    op = FiniteDifference2D(n, n)
    assert op.shape == (2 * (n * n - n), n * n)  # 2 (D - sqrt D), papers/003 Ch. 5
    np.testing.assert_allclose(op.sq_mv(jnp.ones(n * n)), 2.0)  # ||d_n||^2 = 2
    np.testing.assert_allclose(op.mv(jnp.full(n * n, 3.0)), 0.0)  # constants are in the null space


@pytest.mark.parametrize("shape,levels,name,h", [((8, 16), 3, "db4", DB4), ((16, 8), 2, "haar", HAAR),
                                                 ((4, 4), 2, "db4", DB4)])
def test_wavelets_equal_dense_and_orthonormal(rng, shape, levels, name, h):
    op = Wavelet2D(*shape, levels=levels, wavelet=name)
    A = wavelet_oracle(*shape, levels, h)
    W = check_against_dense(op, A, rng)
    D = shape[0] * shape[1]
    np.testing.assert_allclose(W @ W.T, np.eye(D), atol=1e-12)
    np.testing.assert_allclose(W.T @ W, np.eye(D), atol=1e-12)


def test_haar_2x2_closed_form():
    W = np.asarray(Wavelet2D(2, 2, levels=1, wavelet="haar").as_matrix())
    expected = 0.5 * np.array([[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]])
    np.testing.assert_allclose(W, expected, atol=1e-15)


def test_db4_constant_image_has_only_coarse_coefficients():
    op = Wavelet2D(16, 16, levels=2)
    y = np.array(jax.jit(lambda o, x: o.mv(x))(op, jnp.full(256, 0.5))).reshape(16, 16)
    np.testing.assert_allclose(y[:4, :4], 0.5 * 4, atol=1e-12)  # each level scales the mean by 2 in 2-D
    y[:4, :4] = 0
    np.testing.assert_allclose(y, 0.0, atol=1e-12)  # Daubechies-4 has vanishing moments


def test_default_levels():
    assert Wavelet2D(64, 64).levels == 4
    assert Wavelet2D(32, 32).levels == 3
    assert Wavelet2D(6, 6).levels == 1


def test_stack_and_image_filters(rng):
    fd, wav = FiniteDifference2D(4, 8), Wavelet2D(4, 8, levels=2)
    dense = rng.normal(size=(3, 32))
    op = Stack([fd, wav, dense])
    A = np.concatenate([fd_oracle(4, 8, "both", "valid"), wavelet_oracle(4, 8, 2, DB4), dense])
    check_against_dense(op, A, rng)
    stored = op.with_squares()   # the dense block keeps H o H; the matrix-free blocks are unchanged
    assert stored.operators[2].squared is not None and stored.operators[:2] == op.operators[:2]
    check_against_dense(stored, A, rng)
    B = image_filters(8, 8)
    assert B.shape == (3 * 64 - 2 * 8, 64)  # M ~ 3 D (papers/000 Section 6.3.4)


def test_operator_sites_give_the_dense_bound(rng):
    """A Sites with a matrix-free H gives the same bound as its dense matrix (Full: mm; Diagonal: sq_mv)."""
    B = image_filters(4, 4, levels=1)
    Bd = np.asarray(B.as_matrix())
    pot = gk.potentials.Laplace(0.0, 0.3)
    model_op = gk.Model(gk.priors.Isotropic(16, 1.0), gk.Sites(B, pot))
    model_dense = gk.Model(gk.priors.Isotropic(16, 1.0), gk.Sites(Bd, pot))
    m = jnp.asarray(rng.normal(size=16))
    q_full = gk.Gaussian(m, gk.factors.Full(jnp.asarray(np.triu(rng.normal(size=(16, 16))) + 3 * np.eye(16))))
    q_diag = gk.Gaussian(m, gk.factors.Diagonal(jnp.asarray(rng.uniform(0.5, 1.5, size=16))))
    values = jax.jit(lambda qs: [(gk.bound(model_op, q), gk.bound(model_dense, q)) for q in qs])((q_full, q_diag))
    for via_operator, via_dense in values:
        np.testing.assert_allclose(via_operator, via_dense, rtol=tol(jnp.float64))


@pytest.mark.usefixtures("ieee_float32")
def test_float32_keeps_dtype(rng):
    x = jnp.asarray(rng.normal(size=64), dtype=jnp.float32)
    products = jax.jit(lambda o, x: (o.mv(x), o.sq_mv(x), o.rmv(o.mv(x))))
    for op, orthonormal in ((FiniteDifference2D(8, 8), False), (Wavelet2D(8, 8), True)):
        mv, sq, back = products(op, x)
        assert mv.dtype == sq.dtype == back.dtype == jnp.float32
        A = fd_oracle(8, 8, "both", "valid") if not orthonormal else wavelet_oracle(8, 8, 1, DB4)
        np.testing.assert_allclose(mv, A @ np.asarray(x, float), atol=1e-4)
        if orthonormal:
            np.testing.assert_allclose(back, x, atol=1e-4)


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="levels"):
        Wavelet2D(12, 16, levels=3)          # 12 is not divisible by 8
    with pytest.raises(ValueError, match="height"):
        Wavelet2D(12, 16, levels=3)
    with pytest.raises(ValueError, match="levels"):
        Wavelet2D(8, 8, levels=0)
    with pytest.raises(ValueError, match="wavelet"):
        Wavelet2D(8, 8, wavelet="db8")
    with pytest.raises(ValueError, match="height"):
        FiniteDifference2D(0, 4)
    with pytest.raises(ValueError, match="width"):
        FiniteDifference2D(4, 1, "horizontal")
    with pytest.raises(ValueError, match="direction"):
        FiniteDifference2D(4, 4, "diagonal")
    with pytest.raises(ValueError, match="boundary"):
        FiniteDifference2D(4, 4, boundary="reflect")
    with pytest.raises(ValueError, match="columns"):
        Stack([FiniteDifference2D(4, 4), Wavelet2D(8, 8)])
    with pytest.raises(ValueError, match="operators"):
        Stack([])


def test_products_with_a_wrong_length_raise_naming_the_argument(rng):
    """Every product checks its argument's leading length: a too-long vector is refused, not truncated (a Stack or
    sparse gather would otherwise drop or clamp the extra entries)."""
    from jax.experimental import sparse as jsparse

    H = rng.normal(size=(6, 4))
    dense = gk.operators.Dense(H)
    ops = [dense, gk.operators.Sparse(jsparse.BCOO.fromdense(H)), gk.operators.Identity(4), FiniteDifference2D(2, 2),
           Wavelet2D(2, 2, levels=1), Stack([dense, gk.operators.Identity(4)])]
    for op in ops:
        n, d = op.shape
        for name, arg, length in [("mv", "x", d), ("rmv", "y", n), ("sq_mv", "v", d), ("sq_rmv", "y", n),
                                  ("weighted_gram", "g", n), ("mm", "X", d), ("rmm", "Y", n)]:
            shape = (length + 1, 2) if name in ("mm", "rmm") else (length + 1,)
            with pytest.raises(ValueError, match=f"{arg}.* length {length}"):
                getattr(op, name)(jnp.ones(shape))
