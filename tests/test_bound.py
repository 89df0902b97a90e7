"""The G-KL bound (papers/000 eq. 7) against exact and numerical oracles: exact log Z for Gaussian models, log Z
by dense quadrature in 1-D and 2-D, the Jaakkola-Jordan bound, finite differences, concavity."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import central_difference, gaussian_log_evidence, jaakkola_jordan, log_z_grid, upper_params

import gkl_jax as gk
from gkl_jax.factors._full import upper_factor_of_inverse

bound_jit = jax.jit(gk.bound)


def _gaussian_problem(seed=0, D=3, N=5):
    rng = np.random.default_rng(seed)
    H = rng.normal(size=(N, D))
    y = rng.normal(size=N)
    noise = rng.uniform(0.3, 1.5, size=N)
    A = rng.normal(size=(D, D))
    Sigma = A @ A.T / D + 0.5 * np.eye(D)
    mu = rng.normal(size=D)
    model = gk.Model(gk.priors.Dense(Sigma, mu), gk.Sites(H, gk.potentials.Gaussian(y, noise)))
    return model, gaussian_log_evidence(H, y, noise, Sigma, mu)


def test_bound_is_exact_at_the_gaussian_posterior_and_below_elsewhere():
    """For Gaussian sites q = p(w | y) makes the KL gap zero: B = log N(y | H mu, H Sigma H^T + V)."""
    model, (log_z, mean, cov) = _gaussian_problem()
    C = np.linalg.cholesky(cov).T                   # upper, C^T C = cov
    exact = gk.Gaussian(jnp.asarray(mean), gk.factors.Full(jnp.asarray(C)))
    assert abs(float(bound_jit(model, exact)) - log_z) < 1e-12
    # and gk.bound is the same function eagerly
    assert abs(float(gk.bound(model, exact)) - log_z) < 1e-12
    rng = np.random.default_rng(1)
    for _ in range(3):
        other = gk.Gaussian(jnp.asarray(mean + 0.1 * rng.normal(size=3)), gk.factors.Full(jnp.asarray(C * 1.1)))
        assert float(bound_jit(model, other)) < log_z - 1e-6
    diagonal = gk.Gaussian(jnp.asarray(mean), gk.factors.Diagonal(jnp.sqrt(jnp.diag(jnp.asarray(cov)))))
    assert float(bound_jit(model, diagonal)) < log_z


def _grid_model(kind, D, seed):
    rng = np.random.default_rng(seed)
    N = 8
    X = rng.normal(size=(N, D)) * 1.5
    w = rng.normal(size=D)
    if kind == "student_t":
        y = X @ w + rng.standard_t(3, size=N)
        pot = gk.potentials.StudentT(y, 3.0, 0.8)
    else:
        y = np.where(rng.uniform(size=N) < 1 / (1 + np.exp(-X @ w)), 1.0, -1.0)
        pot = gk.potentials.Logistic(y) if kind == "logistic" else gk.potentials.Probit(y)
    return gk.Model(gk.priors.Isotropic(D, 2.0), gk.Sites(X, pot))


@pytest.mark.parametrize("kind, D", [("logistic", 1), ("logistic", 2), ("probit", 2), ("student_t", 2)])
def test_optimised_bound_is_below_log_z_by_dense_quadrature(kind, D):
    """0 <= log Z - max B <= 0.1: the bound holds for every q, and at the optimum it is tight for these
    near-Gaussian posteriors (D <= 2, N = 8). log Z by the trapezoid rule on a 2001 (1-D) or 401 x 401
    (2-D) grid over +-7 prior standard deviations."""
    model = _grid_model(kind, D, seed=D)
    res = gk.fit(model)
    assert bool(res.converged)
    box = 7 * np.sqrt(2.0)
    log_z = log_z_grid(model, [-box] * D, [box] * D, num=2001 if D == 1 else 401)
    gap = log_z - float(res.log_z)
    assert 0 <= gap < 0.1, (kind, D, gap)
    assert gap > 1e-5           # these posteriors are not Gaussian: the bound is strict


def test_gkl_dominates_jaakkola_jordan():
    """B_JJ(xi) <= B_KL(m_xi, S_xi) <= max B_KL (papers/001 via notes A4, eq. 2.3-2.4), for the converged JJ
    fixed point and along its iterations."""
    model = _grid_model("logistic", 2, seed=2)
    X = np.asarray(model.sites[0].H.matrix)
    y = np.asarray(model.sites[0].potential.y)
    best = float(gk.fit(model).log_z)
    for iters in (1, 3, 200):
        b_jj, m_xi, S_xi = jaakkola_jordan(X * y[:, None], np.ones_like(y), 2.0 * np.eye(2), num_iters=iters)
        q_xi = gk.Gaussian(jnp.asarray(m_xi), gk.factors.Full(jnp.asarray(np.linalg.cholesky(S_xi).T)))
        b_kl = float(bound_jit(model, q_xi))
        assert b_jj <= b_kl + 1e-12 and b_kl <= best + 1e-10, (iters, b_jj, b_kl, best)
    assert best - b_jj > 1e-3          # the local bound is strictly looser here


def _mixed_model(D=3, N=6, seed=0):
    """Log-concave potentials of both kinds in one model (with an offset): logistic (quadrature), Poisson, Laplace,
    Gaussian (closed forms), under a dense prior."""
    rng = np.random.default_rng(seed)
    labels = np.where(rng.uniform(size=N) < 0.5, 1.0, -1.0)
    groups = [
        gk.Sites(rng.normal(size=(N, D)), gk.potentials.Logistic(labels), offset=rng.normal(size=N)),
        gk.Sites(0.5 * rng.normal(size=(N, D)), gk.potentials.Poisson(rng.poisson(1.0, size=N).astype(float))),
        gk.Sites(rng.normal(size=(N, D)), gk.potentials.Laplace(rng.normal(size=N), 0.7)),
        gk.Sites(rng.normal(size=(N, D)), gk.potentials.Gaussian(rng.normal(size=N), 0.9)),
    ]
    A = rng.normal(size=(D, D))
    return gk.Model(gk.priors.Dense(A @ A.T / D + np.eye(D), rng.normal(size=D)), groups)


@pytest.mark.parametrize("factor", ["full", "diagonal"])
def test_bound_is_concave_in_m_and_c_for_log_concave_sites(factor):
    """The Hessian of B in (m, C) (upper-triangular entries of C only for Full; the diagonal for Diagonal) is
    negative definite at random points (papers/000 Section 3.2)."""
    model = _mixed_model()
    D = model.dim
    rng = np.random.default_rng(3)
    if factor == "full":
        iu = np.triu_indices(D)

        def unpack(theta):
            C = jnp.zeros((D, D), theta.dtype).at[iu].set(theta[D:])
            return gk.Gaussian(theta[:D], gk.factors.Full(C))

        size = D + len(iu[0])
    else:
        unpack = lambda theta: gk.Gaussian(theta[:D], gk.factors.Diagonal(theta[D:]))
        size = 2 * D
    hessian = jax.jit(jax.hessian(lambda theta: gk.bound(model, unpack(theta))))
    for _ in range(4):
        theta = rng.normal(size=size)
        diag_idx = (np.arange(D) + D) if factor == "diagonal" else D + np.array(
            [i for i, (r, c) in enumerate(zip(*np.triu_indices(D))) if r == c])
        theta[diag_idx] = np.abs(theta[diag_idx]) + 0.2          # C_ii > 0 (log det is a barrier there)
        eig = np.linalg.eigvalsh(np.asarray(hessian(jnp.asarray(theta))))
        assert eig.max() < 0, eig


def test_bound_is_not_concave_for_student_t_sites():
    """The guarantee needs log-concave sites: with Student-t sites the Hessian has a positive eigenvalue at
    some point (here: the mean between two outlying observations)."""
    H = np.array([[1.0], [1.0]])
    model = gk.Model(gk.priors.Isotropic(1, 100.0), gk.Sites(H, gk.potentials.StudentT(np.array([-4.0, 4.0]), 1.0,
                                                                                        0.3)))
    unpack = lambda th: gk.Gaussian(th[:1], gk.factors.Full(th[1:].reshape(1, 1)))
    hessian = jax.jit(jax.hessian(lambda th: gk.bound(model, unpack(th))))
    eig = np.linalg.eigvalsh(np.asarray(hessian(jnp.array([0.0, 0.3]))))
    assert eig.max() > 0


def test_gradient_in_m_and_c_matches_finite_differences():
    model = _mixed_model()
    rng = np.random.default_rng(4)
    C = np.triu(rng.normal(size=(3, 3))) * 0.3 + np.eye(3)
    q = gk.Gaussian(jnp.asarray(rng.normal(size=3)), gk.factors.Full(jnp.asarray(C)))
    pack, unpack = upper_params(q)
    f = jax.jit(lambda th: gk.bound(model, unpack(th)))
    theta = np.asarray(pack(q))
    g = np.asarray(jax.jit(jax.grad(lambda th: gk.bound(model, unpack(th))))(jnp.asarray(theta)))
    fd = central_difference(lambda t: f(jnp.asarray(t)), theta, eps=1e-6)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-7)
    # the Diagonal factor
    fd_diag = lambda th: gk.bound(model, gk.Gaussian(th[:3], gk.factors.Diagonal(th[3:])))
    theta = np.concatenate([rng.normal(size=3), rng.uniform(0.3, 1.5, size=3)])
    g = np.asarray(jax.jit(jax.grad(fd_diag))(jnp.asarray(theta)))
    fdj = jax.jit(fd_diag)
    np.testing.assert_allclose(g, central_difference(lambda t: fdj(jnp.asarray(t)), theta), rtol=1e-6, atol=1e-7)


def test_gradient_in_model_parameters_matches_finite_differences():
    """d B / d(prior variance, Student-t scale, Laplace scale, Gaussian noise variance, H) at fixed q."""
    rng = np.random.default_rng(5)
    D, N = 3, 5
    y = rng.normal(size=N)
    q = gk.Gaussian(jnp.asarray(rng.normal(size=D)),
                    gk.factors.Full(jnp.asarray(np.triu(rng.normal(size=(D, D))) * 0.2 + np.eye(D))))

    def value(theta):
        v, t_scale, l_scale, noise = theta[0], theta[1], theta[2], theta[3]
        H = theta[4:].reshape(N, D)
        model = gk.Model(gk.priors.Isotropic(D, v), [
            gk.Sites(H, gk.potentials.StudentT(y, 4.0, t_scale)),
            gk.Sites(H[:2], gk.potentials.Laplace(y[:2], l_scale)),
            gk.Sites(H[2:], gk.potentials.Gaussian(y[2:], noise)),
        ])
        return gk.bound(model, q)

    theta = np.concatenate([[1.7, 0.6, 0.8, 0.5], rng.normal(size=N * D)])
    g = np.asarray(jax.jit(jax.grad(value))(jnp.asarray(theta)))
    fj = jax.jit(value)
    fd = central_difference(lambda t: fj(jnp.asarray(t)), theta, eps=1e-6)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-7)
    assert np.all(g != 0)


def test_bound_checks_dimensions():
    model = _mixed_model()
    with pytest.raises(ValueError, match="dimension"):
        gk.bound(model, gk.Gaussian(jnp.zeros(4), gk.factors.Full()))


def test_upper_factor_of_inverse():
    """The fixed point's factor: upper triangular C with C^T C = P^{-1}."""
    rng = np.random.default_rng(6)
    A = rng.normal(size=(5, 5))
    P = A @ A.T + np.eye(5)
    C = np.asarray(upper_factor_of_inverse(jnp.asarray(P)))
    np.testing.assert_allclose(np.tril(C, -1), 0, atol=0)
    np.testing.assert_allclose(C.T @ C, np.linalg.inv(P), rtol=1e-10, atol=1e-12)
