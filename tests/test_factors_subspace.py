"""The subspace factor's basis updates (eigen, Krylov, row space, gradient; the best split) against Gaussian
optima, and the chevron factor on a sparse H at scale against the dense fit."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from _helpers_factors import D, logistic_model
from jax.experimental import sparse as jsparse

import gkl_jax as gk
from gkl_jax.factors import Chevron, Subspace

# ---------------------------------------------------------------- subspace basis updates


def _gaussian_target(N, dim=12, rows=40, seed=12):
    """Gaussian sites with N informative rows (padded with zero rows to a fixed shape: one compile)."""
    rng = np.random.default_rng(seed)
    H = np.zeros((rows, dim))
    H[:N] = rng.normal(size=(N, dim))
    model = gk.Model(gk.priors.Isotropic(dim, 1.0), gk.Sites(H, gk.potentials.Gaussian(rng.normal(size=rows), 0.3)))
    return model, np.eye(dim) + H.T @ H / 0.3


@eqx.filter_jit
def _refined_basis(model, q):
    return q.factor.refine(model, q).basis


def test_subspace_eigen_update_is_the_best_end_of_the_spectrum():
    """Gaussian sites: Gamma is constant and A the exact posterior precision. With optimal (S_1, c) the KL of a
    basis of eigenvectors is (D - K)/2 log(AM/GM) of the eigenvalues outside it; the update must pick the best
    split between the two ends of the spectrum: the largest eigenvalues when N < D (the paper's App. B.4.3
    wording, "leading eigenvectors of S", would pick the smallest), a different split when N > D."""
    K, dim = 3, 12
    splits = []
    for N in (5, 40):
        model, A = _gaussian_target(N)
        w, U = np.linalg.eigh(A)
        # at dim = 12 the first Krylov block (K + 9 columns) already spans R^D: exact Ritz pairs
        q = gk.Gaussian(jnp.zeros(dim), Subspace(K).initialise(dim, 1.0))
        E = np.asarray(_refined_basis(model, q))
        gap = lambda out: np.log(np.mean(out)) - np.mean(np.log(out))
        scores = {j: gap(w[K - j:dim - j]) for j in range(K + 1)}
        j = min(scores, key=scores.get)
        chosen = np.concatenate([U[:, dim - j:], U[:, :K - j]], axis=1)
        np.testing.assert_allclose(E @ E.T, chosen @ chosen.T, atol=1e-6)
        splits.append(j)
    assert splits[0] == K and splits[1] < K


def test_best_split_minimises_the_gaussian_kl():
    """`best_split` against the KL of every split computed from the eigenvalues left outside the basis."""
    from gkl_jax.factors._subspace import best_split

    rng = np.random.default_rng(3)
    for dim, K in [(9, 3), (20, 5), (30, 1), (6, 6)]:
        for _ in range(5):
            w = np.sort(np.exp(rng.normal(scale=2.0, size=dim)))
            kl = {j: (np.log(np.mean(o)) - np.mean(np.log(o))) * (dim - K) if dim > K else 0.0
                  for j in range(K + 1) for o in [w[K - j:dim - j]]}
            j = int(best_split(jnp.asarray(w), jnp.sum(jnp.asarray(w)), dim, K))
            assert kl[j] <= min(kl.values()) + 1e-12


def test_subspace_krylov_basis_with_an_invariant_krylov_space():
    """dim = 60 with 0 or 5 informative Gaussian sites: A - I has rank 0 or 5, so the Krylov space from [E, 10
    columns] is invariant after one product (the next blocks are filled from the round-off perturbation). Q must
    still be orthonormal to round-off, A Q its image, and the refined basis the 3 leading eigenvectors (N < D)."""
    from gkl_jax.factors._kernels import precision_mm, site_curvatures

    K, dim = 3, 60
    # compiled, as the refinement runs it (op by op, each of its primitives was compiled on its own)
    krylov = eqx.filter_jit(lambda model, q, key: q.factor._krylov(
        lambda X: precision_mm(model, site_curvatures(model, q), X), q.factor.basis, key))
    for N in (0, 5):
        model, A = _gaussian_target(N, dim=dim)
        q = gk.Gaussian(jnp.zeros(dim), Subspace(K).initialise(dim, 1.0))
        Q, AQ = krylov(model, q, jax.random.PRNGKey(1))
        Q, AQ = np.asarray(Q), np.asarray(AQ)
        assert Q.shape == (dim, 3 * (K + 10))
        np.testing.assert_allclose(Q.T @ Q, np.eye(Q.shape[1]), atol=1e-13)
        np.testing.assert_allclose(AQ, A @ Q, atol=1e-8)
        if N:
            U = np.linalg.eigh(A)[1][:, -K:]
            E = np.asarray(_refined_basis(model, q))
            np.testing.assert_allclose(E @ E.T, U @ U.T, atol=1e-6)
    # a basis orthonormal only to 1e-6 (the constructor accepts 1e-5): the first block is orthonormalised by one
    # Cholesky QR pass, which must still leave Q orthonormal to round-off and spanning the given basis
    E0 = q.factor.basis + 1e-6 * jax.random.normal(jax.random.PRNGKey(3), q.factor.basis.shape)
    Q, _ = eqx.filter_jit(lambda E0, key: q.factor._krylov(lambda X: X, E0, key))(E0, jax.random.PRNGKey(1))
    Q, E0 = np.asarray(Q), np.asarray(E0)
    np.testing.assert_allclose(Q.T @ Q, np.eye(Q.shape[1]), atol=1e-13)
    np.testing.assert_allclose(Q @ (Q.T @ E0), E0, atol=1e-13)


def test_subspace_row_space_update_is_the_exact_fixed_point():
    """Isotropic prior, one dense site group, N + K <= D: the update runs in the row space of H. With
    basis_iterations (K + 10) = N its Krylov space is all of R^N, so the Ritz pairs are exact: at D = 200 the
    basis must span the K leading eigenvectors of A and (C_1, c) be the fixed point S_1 = (E^T A E)^{-1},
    c^2 = (D - K) / tr(A (I - E E^T)). At D = 36 the K smallest eigenvalues (the prior's, in the null space of H)
    make the better split, which the row space cannot give: the D-space update (exact too: 3 (K + 10) = D) must
    take over. Where N + K > D, or the prior is not isotropic, the row-space update does not apply."""
    from gkl_jax.factors._subspace import row_space_matrix

    K, N = 2, 24
    refine = eqx.filter_jit(lambda m, q: q.factor.refine(m, q))
    for dim, low in ((200, 0), (36, K)):
        model, A = _gaussian_target(N, dim=dim, rows=N)
        assert row_space_matrix(model, K, 2) is not None
        new = refine(model, gk.Gaussian(jnp.zeros(dim), Subspace(K).initialise(dim, 1.0)))
        E = np.asarray(new.basis)
        w = np.linalg.eigvalsh(A)
        np.testing.assert_allclose(E.T @ E, np.eye(K), atol=1e-13)
        # E spans an invariant subspace of A (the smallest eigenvalue, the prior's, has multiplicity D - N) with
        # the chosen eigenvalues
        np.testing.assert_allclose(A @ E, E @ (E.T @ A @ E), atol=1e-8 * w[-1])
        np.testing.assert_allclose(np.linalg.eigvalsh(E.T @ A @ E), np.concatenate([w[:low], w[dim - K + low:]]),
                                   rtol=1e-10)
        S1 = np.asarray(new.upper().T @ new.upper())
        np.testing.assert_allclose(S1, np.linalg.inv(E.T @ A @ E), rtol=1e-8, atol=1e-14 * np.abs(S1).max())
        np.testing.assert_allclose(float(new.c) ** 2, (dim - K) / np.trace(A @ (np.eye(dim) - E @ E.T)), rtol=1e-10)
    assert row_space_matrix(model, K, 3) is None                                    # 3 (K + 10) > N
    assert row_space_matrix(_gaussian_target(N, dim=N + 1, rows=N)[0], K, 2) is None  # N + K > D
    assert row_space_matrix(gk.Model(gk.priors.Diagonal(jnp.ones(dim)), model.sites), K, 2) is None


def test_subspace_gradient_update_increases_the_bound():
    model, _ = logistic_model()
    start = Subspace(3, basis_update="gradient", basis_iterations=3).initialise(D, 0.5)
    start = Subspace(3, start.basis, jnp.diag(jnp.array([1.0, 0.8, 0.6])), 0.3, basis_update="gradient",
                     basis_iterations=3)
    q = gk.Gaussian(jnp.zeros(D), start)  # (at S = v I the bound does not depend on the basis)

    @eqx.filter_jit
    def before_after(model, q):
        refined = eqx.tree_at(lambda g: g.factor, q, q.factor.refine(model, q))
        return gk.bound(model, q), gk.bound(model, refined), refined.factor.basis

    before, after, E = before_after(model, q)
    np.testing.assert_allclose(np.asarray(E).T @ np.asarray(E), np.eye(3), atol=1e-10)
    assert float(after) > float(before) + 1e-6


def test_subspace_without_refinements_solves_with_the_given_basis():
    """num_refinements = 0: one solve over (m, C_1, c) with the basis held fixed; the result is stationary in
    those leaves and at least as good as any other refinement-free start with the same basis."""
    model, _ = logistic_model()
    start = Subspace(3, num_refinements=0).initialise(D, 0.5)
    res = gk.fit(model, factor=start, tol=1e-8)
    assert bool(res.converged)
    np.testing.assert_array_equal(np.asarray(res.q.factor.basis), np.asarray(start.basis))
    grads = jax.jit(jax.grad(lambda q: gk.bound(model, q)))(res.q)
    assert max(float(jnp.max(jnp.abs(g))) for g in (grads.mean, grads.factor.C1, grads.factor.scaled_c)) <= 1e-8
    refined = gk.fit(model, factor=Subspace(3), tol=1e-8)
    assert float(refined.log_z) >= float(res.log_z) - 1e-10


# ---------------------------------------------------------------- sparse H at scale (tiny version of the benchmark)


def test_chevron_fit_on_sparse_h_matches_dense_and_stays_linear_in_memory():
    rng = np.random.default_rng(13)
    dim, num, per_row, K = 60, 90, 4, 5
    H = np.zeros((num, dim))
    for n in range(num):
        H[n, rng.choice(dim, per_row, replace=False)] = rng.normal(size=per_row)
    y = np.where(rng.uniform(size=num) < 0.5, 1.0, -1.0)
    prior = gk.priors.Isotropic(dim, 1.0)
    sparse = gk.Model(prior, gk.Sites(jsparse.BCOO.fromdense(jnp.asarray(H)), gk.potentials.Logistic(y)))
    # (Newton-CG on BCOO compiles twice as long)
    res = gk.fit(sparse, factor=Chevron(K), solver=gk.solvers.LBFGS(), tol=1e-7)
    assert bool(res.converged)
    dense = gk.Model(prior, gk.Sites(H, gk.potentials.Logistic(y)))
    value, g = jax.jit(jax.value_and_grad(lambda m: gk.bound(dense, gk.Gaussian(m, res.q.factor))))(res.q.mean)
    np.testing.assert_allclose(float(value), float(res.log_z), rtol=1e-12)
    assert float(jnp.max(jnp.abs(g))) < 1e-5
    # compiled memory of one bound + gradient at a larger size is O(N K + nnz + D K), far below D^2
    dim, num, per_row = 20000, 6000, 20
    rows = np.repeat(np.arange(num), per_row)
    cols = rng.integers(0, dim, size=num * per_row)
    Hs = jsparse.BCOO((jnp.asarray(rng.normal(size=num * per_row)), jnp.asarray(np.stack([rows, cols], 1))),
                      shape=(num, dim))
    model = gk.Model(gk.priors.Isotropic(dim, 1.0), gk.Sites(Hs, gk.potentials.Logistic(jnp.ones(num))))
    q = gk.Gaussian(jnp.zeros(dim), Chevron(20).initialise(dim, 0.1))
    stats = jax.jit(jax.value_and_grad(lambda q: gk.bound(model, q))).lower(q).compile().memory_analysis()
    if stats is not None:
        assert stats.temp_size_in_bytes < 8 * 40 * (num * 20 + num * per_row + dim * 20)
        assert stats.temp_size_in_bytes < 8 * dim * dim / 100
