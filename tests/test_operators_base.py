"""The base operators (Dense, Identity, Sparse) against their dense matrices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import sparse as jsparse

import gkl_jax as gk
from gkl_jax.operators import Dense, Identity, Sparse, as_operator


def _operators():
    rng = np.random.default_rng(0)
    H = rng.normal(size=(6, 4)) * (rng.uniform(size=(6, 4)) < 0.6)
    return [(Dense(H), H), (Sparse(jsparse.BCOO.fromdense(jnp.asarray(H))), H), (Identity(4), np.eye(4))]


@pytest.mark.parametrize("index", [0, 1, 2], ids=["dense", "sparse", "identity"])
def test_operator_products_match_the_dense_matrix(index):
    op, H = _operators()[index]
    rng = np.random.default_rng(1)
    N, D = H.shape
    x, y = rng.normal(size=D), rng.normal(size=N)
    X, Y = rng.normal(size=(D, 3)), rng.normal(size=(N, 2))
    g = rng.uniform(size=N)
    assert op.shape == (N, D)

    @jax.jit
    def products(op, x, y, X, Y, g):
        stored = op.with_squares()   # H o H kept for the solver loops: the same products
        return (op.as_matrix(), op.mv(x), op.rmv(y), op.mm(X), op.rmm(Y), op.sq_mv(x), op.sq_rmv(y),
                op.weighted_gram(g), stored.sq_mv(x), stored.sq_rmv(y), stored.mv(x))

    got = products(op, *(jnp.asarray(a) for a in (x, y, X, Y, g)))
    want = (H, H @ x, H.T @ y, H @ X, H.T @ Y, (H ** 2) @ x, (H ** 2).T @ y, H.T @ (g[:, None] * H),
            (H ** 2) @ x, (H ** 2).T @ y, H @ x)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)


def test_factors_project_variances_through_every_operator():
    rng = np.random.default_rng(2)
    C = np.triu(rng.normal(size=(4, 4))) + np.eye(4)
    d = rng.uniform(0.5, 1.5, 4)
    project = jax.jit(lambda op, C, d: (gk.factors.Full(C).project_variances(op),
                                        gk.factors.Diagonal(d).project_variances(op)))
    for op, H in _operators():
        full, diag = project(op, jnp.asarray(C), jnp.asarray(d))
        np.testing.assert_allclose(full, np.einsum("nd,de,ne->n", H, C.T @ C, H), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(diag, (H ** 2) @ d ** 2, rtol=1e-12, atol=1e-14)


def test_as_operator_wraps_arrays_and_passes_operators_through():
    H = np.ones((2, 3))
    assert isinstance(as_operator(H), Dense)
    assert isinstance(as_operator(jsparse.BCOO.fromdense(jnp.asarray(H))), Sparse)
    op = Identity(3)
    assert as_operator(op) is op


@pytest.mark.parametrize(
    "make, arg",
    [
        (lambda: Dense(np.ones(3)), "H"),
        (lambda: Dense(np.array([[1.0, np.nan]])), "H"),
        (lambda: Dense(np.array([["a", "b"]])), "H"),
        (lambda: Sparse(np.ones((2, 2))), "BCOO"),
        (lambda: Identity(0), "dim"),
    ],
)
def test_bad_inputs_raise_value_error(make, arg):
    with pytest.raises(ValueError, match=arg):
        make()
