"""Active selection of inducing sites by the lower bounds d_2 and d_3 on the gain in log Z~_h* (Chai 2012,
Section 6.1, App. D), and the separable inducing prior built from a kernel.

A candidate site is one latent value f^c(x_i) of the training data (Remark 14: n C candidates). With the current
optimum (m, V, {b_i}, {S_i}) kept and q(z_*) extended by (m_*, v_**) with v_* = V K^{-1} k_* (Lemma 16), the gain is

    d = 1/2 + 1/2 log(nu/kappa) - nu/(2 kappa) - mu^2/(2 kappa)                                  (d_KL, chi = nu)
        + w sum_i [1/2 log omega_i + (kappa - nu)/2 k_i^T S_i k_i + mu k_i^T y_i - log sum_c gbar_i^c e^{mu k_i^c}]

with kappa = k_** - k_*^T K^{-1} k_* (prior conditional variance), k = (k_f* - K_f^T K^{-1} k_*)/kappa (blocks k_i),
omega_i = 1 - k_i^T V_fi^{-1} k_i (kappa - nu) (eq. 73 with psi = 0), mu = m_* - k_*^T K^{-1} m, nu the new
Schur complement. d_2 (eq. 42, w = 1, all data) maximises over mu (Newton, D.2.1) and nu (the "beyond Newton"
update of eq. 74 of Chai 2012, with a linear local model); d_2 >= 0, with 0 at (mu, nu) = (0, kappa)
(Lemma 16). d_3 (eq. 43) sums over a random subset of |S| data, scaled by w = n/|S|. The greedy protocol
(Section 9.3): d_3 for every candidate, d_2 for the top t, add the best delta, re-fit.

d_1 (eq. 39) also frees the cross-covariance v_* = nu_vec + V K^{-1} k_*. In whitened coordinates (nu_vec = L eta,
K_zz = L L^T, q(u) = N(., B^{-1})) that gives psi = Ltil eta, chi = nu + eta^T B eta, and (App. D.1, eqs. 71-73)

    d = 1/2 + 1/2 log(nu/kappa) - chi/(2 kappa) - mu^2/(2 kappa)
        + w sum_i [1/2 log omega_i + (kappa - chi)/2 k_i^T S_i k_i - k_i^T S_i psi_i + mu k_i^T y_i
                   - log sum_c gbar_i^c e^{mu k_i^c}],
    omega_i = (1 + k_i^T V_fi^{-1} psi_i)^2 - k_i^T V_fi^{-1} k_i (kappa - chi + psi_i^T V_fi^{-1} psi_i).

It is not concave in eta (App. D.2); d_1 starts at the d_2 optimum (eta = 0) and takes backtracking gradient
steps in (mu, log nu, eta) that raise it, so d_2 <= d_1 <= d (the gain of re-optimising, tested).
"""

import dataclasses
import functools
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._linalg import tdot
from .._optim import backtrack, backtrack_host, sufficient_increase
from .._validate import check_indices, check_int, strongly_typed
from ._blocks import blockdiag_left, per_datum
from ._full import check_one_hot, one_hot_labels
from ._hyper import trainable_filter
from ._sparse import _mf, fit_sparse, inducing_prior, masked_prior, site_statistics, whitened_cross


def _gain(mu, nu, kappa, kv, Vinv, S, lg, Y, w):
    """The objective d(mu, nu) above for one candidate; kv (D, C), Vinv/S (D, C, C), lg = log gbar (D, C)."""
    tau = jnp.einsum("ia,iab,ib->i", kv, Vinv, kv)
    kSk = jnp.einsum("ia,iab,ib->i", kv, S, kv)
    omega = 1.0 - tau * (kappa - nu)
    dkl = 0.5 + 0.5 * jnp.log(nu / kappa) - nu / (2 * kappa) - mu**2 / (2 * kappa)
    dh = (0.5 * jnp.log(omega) + 0.5 * (kappa - nu) * kSk + mu * jnp.sum(kv * Y, axis=1)
          - jax.nn.logsumexp(lg + mu * kv, axis=1))
    return dkl + w * jnp.sum(dh)


def _maximise_gain(kappa, kv, Vinv, S, lg, Y, w, iters=30):
    """max over mu (Newton, App. D.2.1) and nu (eq. 74) of the decoupled objective; returns (d, mu, nu)."""
    f = lambda mu, nu: _gain(mu, nu, kappa, kv, Vinv, S, lg, Y, w)
    g_mu = jax.grad(f, 0)
    h_mu = jax.grad(g_mu, 0)

    def mu_body(_, mu):
        new = mu - g_mu(mu, kappa) / h_mu(mu, kappa)
        return jnp.where(jnp.isfinite(new) & (f(new, kappa) >= f(mu, kappa)), new, mu)

    mu = lax.fori_loop(0, iters, mu_body, jnp.zeros_like(kappa))
    tt = jnp.einsum("ia,iab,ib->i", kv, Vinv, kv)
    kSk = w * jnp.sum(jnp.einsum("ia,iab,ib->i", kv, S, kv))
    n_eff = w * kv.shape[0]

    def nu_body(_, nu):
        tau = tt / (1.0 - tt * (kappa - nu))  # tau_i = k_i^T V_fi^{-1} k_i / omega_i (Lemma 31)
        s1, s2 = w * jnp.sum(tau), w * jnp.sum(tau**2)
        a = jnp.sqrt(n_eff / s2) - nu
        b = jnp.sqrt(n_eff * s2) + 1.0 / kappa + kSk - s1
        q = a * b - n_eff - 1.0
        new = (-q + jnp.sqrt(q**2 + 4 * a * b)) / (2 * b)  # eq. 74
        ok = jnp.isfinite(new) & (new > 0) & jnp.all(1.0 - tt * (kappa - new) > 0) & (f(mu, new) >= f(mu, nu))
        return jnp.where(ok, new, nu)

    nu = lax.fori_loop(0, iters, nu_body, kappa)
    return jnp.maximum(f(mu, nu), 0.0), mu, nu


def _gain_d1(mu, nu, eta, kappa, kv, Vinv, S, lg, Y, w, Lt_data, B):
    """The objective d(mu, nu, eta) of d_1 above for one candidate; Lt_data (D, C, s) are the data's rows of
    Ltil and B = I + Ltil^T W Ltil the whitened posterior precision of the inducing variables."""
    psi = Lt_data @ eta  # (D, C)
    chi = nu + eta @ B @ eta
    Vk = jnp.einsum("iab,ib->ia", Vinv, kv)
    tau = jnp.sum(kv * Vk, axis=1)
    omega = (1.0 + jnp.sum(Vk * psi, axis=1)) ** 2 - tau * (kappa - chi + jnp.einsum("ia,iab,ib->i", psi, Vinv,
                                                                                        psi))
    kSk = jnp.einsum("ia,iab,ib->i", kv, S, kv)
    kSpsi = jnp.einsum("ia,iab,ib->i", kv, S, psi)
    dkl = 0.5 + 0.5 * jnp.log(nu / kappa) - chi / (2 * kappa) - mu**2 / (2 * kappa)
    dh = (0.5 * jnp.log(omega) + 0.5 * (kappa - chi) * kSk - kSpsi + mu * jnp.sum(kv * Y, axis=1)
          - jax.nn.logsumexp(lg + mu * kv, axis=1))
    value = dkl + w * jnp.sum(dh)
    return jnp.where(jnp.all(omega > 0) & (nu > 0) & jnp.isfinite(value), value, -jnp.inf)


def _maximise_gain_d1(kappa, kv, Vinv, S, lg, Y, w, Lt_data, B, iters=40):
    """d_1: backtracking gradient ascent in (mu, log nu, eta) from the d_2 optimum (eta = 0); never below d_2."""
    d2, mu0, nu0 = _maximise_gain(kappa, kv, Vinv, S, lg, Y, w)
    f = lambda p: _gain_d1(p[0], jnp.exp(p[1]), p[2:], kappa, kv, Vinv, S, lg, Y, w, Lt_data, B)
    p0 = jnp.concatenate([jnp.stack([mu0, jnp.log(nu0)]), jnp.zeros(B.shape[0], kv.dtype)])

    def step(_, carry):
        p, fp = carry
        g = jax.grad(f)(p)
        g = jnp.where(jnp.isfinite(g), g, 0.0)

        t, f_new, better = backtrack(lambda t: f(p + t * g), lambda t, f_new: f_new > fp, fp, dtype=p.dtype,
                                     max_halvings=30)
        return jnp.where(better, p + t * g, p), jnp.where(better, f_new, fp)

    _, best = lax.fori_loop(0, iters, step, (p0, f(p0)))
    return jnp.maximum(best, d2)


def _posterior_site_stats(Lt, Y, post):
    mf = _mf(Lt, Y, post.b)
    gbar, _ = per_datum(site_statistics)(mf, post.b, post.S)
    return per_datum(jnp.linalg.inv)(post.Vf_blocks), jnp.log(jnp.maximum(gbar, 1e-300))


@functools.partial(jax.jit, static_argnames=("num_classes", "d1"))
def _scores(kernel, X, Y, post, sites, mask, candidates, data, w, num_classes, noise, jitter, d1=False):
    """Gains for the candidate latents `candidates` (indices i C + c) measured on the data rows `data` (K^c = I)."""
    C = num_classes
    Kzz, Kzf, Kff = inducing_prior(kernel, X, C, sites, noise=noise, jitter=jitter)
    Kzz, Kzf = masked_prior(Kzz, Kzf, mask)
    L = jnp.linalg.cholesky(Kzz)
    Lt = whitened_cross(Kzz, Kzf)
    Vinv, lg = _posterior_site_stats(Lt, Y, post)
    ci, cc = candidates // C, candidates % C
    ii, sc = sites // C, sites % C
    kstar = kernel.gram(X[ii], X[ci]) * (sc[:, None] == cc[None, :]) * mask[:, None]  # (s, P), K^c = I
    kss = kernel.diag(X[ci]) + noise
    a = jax.scipy.linalg.solve_triangular(L, kstar, lower=True)  # L^{-1} k_*
    kappa = kss - jnp.sum(a * a, axis=0)
    kfx = kernel.gram(X[data], X[ci])  # (D, P)
    kf = kfx[:, None, :] * (jnp.arange(C)[None, :, None] == cc[None, None, :])  # (D, C, P)
    Ltd = Lt.reshape(-1, C, Lt.shape[1])[data]  # (D, C, s)
    kv = (kf - jnp.einsum("dcs,sp->dcp", Ltd, a)) / kappa
    if d1:
        B = jnp.eye(Lt.shape[1], dtype=Lt.dtype) + tdot(Lt, blockdiag_left(post.W, Lt))
        gain = jax.vmap(lambda k, kp: _maximise_gain_d1(k, kp, Vinv[data], post.S[data], lg[data], Y[data], w,
                                                        Ltd, B), in_axes=(0, 2))(kappa, kv)
    else:
        gain = jax.vmap(lambda k, kp: _maximise_gain(k, kp, Vinv[data], post.S[data], lg[data], Y[data], w)[0],
                        in_axes=(0, 2))(kappa, kv)
    return jnp.where(kappa > 1e-10, gain, -jnp.inf)


def selection_scores(kernel, X, Y, post, sites, mask, candidates, *, data=None, noise=1e-6, jitter=1e-6,
                     score="d2"):
    """d_2 (data=None: all data) or d_3 (data = indices of a subset S, scaled by n/|S|) for each candidate;
    `score="d1"` also optimises the cross-covariance (eq. 39; slower, d_2 <= d_1 <= the true gain)."""
    if score not in ("d1", "d2"):
        raise ValueError(f"score must be 'd1' or 'd2', got {score!r}")
    n, C = Y.shape
    data = jnp.arange(n) if data is None else jnp.asarray(data)
    w = n / data.shape[0]
    return _scores(kernel, jnp.asarray(X), jnp.asarray(Y, jnp.asarray(X).dtype), post, jnp.asarray(sites),
                   jnp.asarray(mask, bool), jnp.asarray(candidates), data, w, C, noise, jitter, d1=score == "d1")


class Selection(eqx.Module):
    """What `select_inducing` returns.

    Attributes:
        sites: (num_inducing,) int NumPy array, the inducing latent indices i C + c in the order added.
        history: float NumPy array, log Z~_h* after each round (then after each accepted final hyper-parameter
            step): non-decreasing.
        posterior: the final `SparsePosterior` (holding the kernel, inputs and `sites`, for `predict`).
        kernel: the kernel it is fitted with (learned when hyper_steps > 0).
    """

    sites: np.ndarray
    history: np.ndarray
    posterior: Any
    kernel: Any

    def __iter__(self):
        """(sites, history, posterior, kernel), so that the result unpacks like a tuple."""
        return iter((self.sites, self.history, self.posterior, self.kernel))


def select_inducing(kernel, X, y, num_inducing, *, num_classes=None, method="active", batch=None, subset=5,
                    top=None, seed=0, initial=None, noise=1e-6, jitter=1e-6, fit_kwargs=None, score="d2",
                    hyper_steps=0, final_hyper_steps=0, fixed=()) -> Selection:
    """Grow an inducing set of `num_inducing` latent sites `batch` at a time (default C), re-fitting the sparse
    bound after each addition; method="active" scores candidates by d_3 (random subset of `subset` data) and then
    `score` (d_2, or the tighter and slower d_1) on the `top` best (default 4 batch), method="random" draws them
    uniformly (Section 9.3, Table 5). The scores are single-site gains, so a large `batch` adds redundant latents:
    on glass, 5 per round kept active selection ahead of random at every size from 75 on in 5 of 5 splits, 25 per
    round (the paper's Figure 5 setting) left it behind on most (benchmarks/README.md §5, Figure 5).

    Table 5's protocol alternates the rounds with hyper-parameter search: `hyper_steps` gradient line searches of
    log Z~_h* in the kernel's parameters (less the attributes named in `fixed`, e.g. ("log_variance",)) after
    each round's fit, and up to `final_hyper_steps` more once the set is complete (stopping at the first step
    that finds no increase). Each is `hyper_ascent`; the bound never decreases, so `history` stays monotone
    (adding sites never lowers it either, Proposition 17).

    The rounds are an outer model-selection loop in Python (each round calls the compiled fit and scorer once;
    shapes are fixed by the capacity `num_inducing`, so nothing recompiles).

    Args:
        kernel: a `gk.kernels` kernel on the inputs (K^c = I).
        X: (n, d) float inputs.
        y: (n,) integer class indices 0..C-1 or (n, C) one-hot labels.
        num_inducing: the size s of the final set (1..nC).
        num_classes: C for integer labels (default max(y) + 1).
        method: "active" or "random".
        batch: latents added per round (default C).
        subset: the number of data d_3 is measured on.
        top: candidates re-scored by `score` (default 4 batch).
        seed: the integer seed of the random choices.
        initial: (k,) int latent indices to start from (default `batch` random ones).
        noise: the inducing variables' noise variance (Remark 13).
        jitter: added to the latent prior's diagonal.
        fit_kwargs: options for the sparse fits (`tol`, `max_steps`, `site`, `v_update`).
        score: "d2" or "d1".
        hyper_steps: line searches of the kernel after each round (int >= 0).
        final_hyper_steps: the most line searches once the set is complete (int >= 0).
        fixed: kernel attributes the searches keep fixed.

    Returns:
        `Selection`: the sites, the bound's history, the final `SparsePosterior` (for `gk.multiclass.predict`)
        and the kernel.

    Raises:
        ValueError: an unknown method or score, negative step counts, a bad size, batch, subset, top or initial
            set, labels that are not one-hot, or an unknown `fixed` name.
    """
    if method not in ("active", "random"):
        raise ValueError(f"method must be 'active' or 'random', got {method!r}")
    if score not in ("d1", "d2"):
        raise ValueError(f"score must be 'd1' or 'd2', got {score!r}")
    if int(hyper_steps) < 0 or int(final_hyper_steps) < 0:
        raise ValueError(f"hyper_steps and final_hyper_steps must be >= 0, got {hyper_steps}, {final_hyper_steps}")
    spec = trainable_filter(kernel, fixed)
    X = np.asarray(X, np.float64)
    if X.ndim == 1:
        X = X[:, None]
    Y = np.asarray(one_hot_labels(y, X.shape[0], num_classes, np.float64))
    kernel = strongly_typed(kernel, jnp.asarray(X).dtype)    # as the searched kernels are: the scorer compiles once
    n, C = Y.shape
    N = n * C
    if not 1 <= int(num_inducing) <= N:
        raise ValueError(f"num_inducing must be in 1..{N}, got {num_inducing}")
    batch = C if batch is None else check_int(batch, "batch", 1)
    top = 4 * batch if top is None else check_int(top, "top", 1)
    check_int(subset, "subset", 1)
    check_one_hot(Y)
    if initial is not None:
        initial = np.asarray(check_indices(initial, N, "initial"))
        if not 1 <= len(initial) <= int(num_inducing):
            raise ValueError(f"initial must hold 1..num_inducing={num_inducing} sites, got {len(initial)}")
    rng = np.random.default_rng(seed)
    s = int(num_inducing)
    sites = np.zeros(s, np.int64)
    first = rng.choice(N, size=min(batch, s), replace=False) if initial is None else np.asarray(initial)
    k = len(first)
    sites[:k] = first
    fit_kwargs = dict(fit_kwargs or {})
    post, history = None, []

    def fit(kern, mask, init):
        Kzz, Kzf, Kff = inducing_prior(kern, X, C, sites, noise=noise, jitter=jitter)
        return fit_sparse(Kzz, Kzf, Kff, Y, mask=mask, init=init, **fit_kwargs)

    def ascend(kern, mask, post):
        return hyper_ascent(kern, X, Y, sites, mask, post, spec, lambda kk, init: fit(kk, mask, init),
                            noise=noise, jitter=jitter)

    while True:
        mask = np.arange(s) < k
        post = fit(kernel, mask, post)
        for _ in range(int(hyper_steps)):
            kernel, post, _ = ascend(kernel, mask, post)
        history.append(float(post.log_z))
        if k >= s:
            break
        add = min(batch, s - k)
        free = np.setdiff1d(np.arange(N), sites[:k])
        if method == "random":
            new = rng.choice(free, size=add, replace=False)
        else:
            d3 = np.array(selection_scores(kernel, X, Y, post, sites, mask, np.arange(N),
                                             data=rng.choice(n, size=min(subset, n), replace=False),
                                             noise=noise, jitter=jitter))
            d3[sites[:k]] = -np.inf
            shortlist = np.argsort(-d3)[:min(top, len(free))]
            fine = np.asarray(selection_scores(kernel, X, Y, post, sites, mask, shortlist, noise=noise,
                                               jitter=jitter, score=score))
            new = shortlist[np.argsort(-fine)[:add]]
        sites[k:k + add] = new
        k += add
    for _ in range(int(final_hyper_steps)):
        kernel, post, accepted = ascend(kernel, mask, post)
        if not accepted:
            break
        history.append(float(post.log_z))
    post = dataclasses.replace(post, kernel=kernel, X=jnp.asarray(X), inducing=jnp.asarray(sites),
                               mask=jnp.asarray(mask), noise=float(noise), jitter=float(jitter))
    return Selection(sites=sites, history=np.array(history), posterior=post, kernel=kernel)


def hyper_ascent(kernel, X, Y, sites, mask, post, spec, fit, *, step=0.5, max_halvings=12, noise=1e-6,
                 jitter=1e-6):
    """One gradient line search of log Z~_h* in the kernel's parameters selected by the filter `spec`, with
    `sparse_hyper_gradient` (App. C.4) at the current optimum `post`: the first trial moves the largest
    coordinate by `step` (log units), and halvings follow until the re-fitted bound (`fit(kernel, post)`, warm
    started) rises by the Armijo amount 1e-4 t |g|^2. Returns (kernel, post, accepted); unchanged when no trial
    is accepted."""
    g = eqx.filter(sparse_hyper_gradient(kernel, X, Y, sites, mask, post, noise=noise, jitter=jitter), spec)
    leaves = jax.tree.leaves(g)
    g_max = max((float(jnp.max(jnp.abs(x))) for x in leaves), default=0.0)
    if not g_max > 0:
        return kernel, post, False
    slope = sum(float(jnp.vdot(x, x)) for x in leaves)
    if int(max_halvings) < 1:
        return kernel, post, False

    def trial(t):
        moved = eqx.apply_updates(kernel, jax.tree.map(lambda x: t * x, g))
        return moved, fit(moved, post)

    base = float(post.log_z)
    _, (moved, fitted), accepted = backtrack_host(
        trial, lambda t, out: sufficient_increase(float(out[1].log_z), base, t, slope),
        max_halvings=int(max_halvings) - 1, t0=step / g_max)
    return (moved, fitted, True) if accepted else (kernel, post, False)


def sparse_hyper_gradient(kernel, X, Y, sites, mask, post, *, noise=1e-6, jitter=1e-6):
    """d log Z~_h* / d(kernel parameters) at the sparse optimum `post` (App. C.4): by the envelope theorem, the
    gradient of eq. 32 in the covariances with q(z), {b_i}, {S_i} held fixed (autodiff of `sparse_log_z`); one
    compiled program per shapes."""
    X = jnp.asarray(X)
    sites = check_indices(sites, X.shape[0] * jnp.shape(Y)[1], "sites")
    return _sparse_hyper_gradient(kernel, X, jnp.asarray(Y, X.dtype), sites, jnp.asarray(mask, bool), post,
                                  float(noise), float(jitter))


@eqx.filter_jit
def _sparse_hyper_gradient(kernel, X, Y, sites, mask, post, noise, jitter):
    from ._sparse import sparse_log_z

    n, C = Y.shape
    Kzz, Kzf, _ = inducing_prior(kernel, X, C, sites, noise=noise, jitter=jitter)
    m, V = jax.lax.stop_gradient(post.inducing_moments(Kzz, Kzf, mask))

    def bound(k):
        Kzz, Kzf, Kff = inducing_prior(k, X, C, sites, noise=noise, jitter=jitter)
        return sparse_log_z(Kzz, Kzf, Kff, Y, m, V, post.b, post.S, mask)

    return jax.grad(bound)(kernel)
