"""The marginal-likelihood bound log Z_h over the joint Gaussian on all nC latent values, and its maximisation.

Bound (Chai 2012, Proposition 8, eq. 21), with q(f) = N(m, V) over the datum-major nC-vector f, prior N(0, K):

    log Z_h = -KL(q || p) + sum_i h(y_i; q_i, b_i, S_i)  <=  log p(y).

Concavity: log Z_h is concave in m, in V, and in each (b_i, S_i) (Lemma 25), but NOT jointly concave in
(V, S_i) as Proposition 8 states: -1/2 tr(S_i V_i) is bilinear. For one datum with K = 100 I_2, m = 0,
b = (1/2, 1/2), the midpoint of (V, S) = (I, 3I) and (3I, I) has log Z_h = -5.364 below the chord's -4.837
(tests/test_multiclass.py); for one latent the (s, v) Hessian is indefinite once s v > sqrt(2), and the profiled
site bound max_S h is even convex in v. The solver is therefore a monotone block-coordinate ascent that never
assumes joint concavity; each block (b with m, each S_i, V) is concave.

Parametrisation (Sections 3.3-3.4, App. E): the mean is tied to b, m = K (y - b) (eq. 27), so alpha = K^{-1} m
= y - b; the covariance is held in the site form V = (K^{-1} + W)^{-1} of eq. 28 with W = blockdiag(W_i), computed
without K^{-1} as V = L B^{-1} L^T, B = I + L^T W L, K = L L^T (log|K^{-1} V| = -log|B|, tr(K^{-1} V) = tr B^{-1};
the T of eq. 75 is W - W V W).

One sweep of block-coordinate ascent, every step safeguarded so the bound never decreases (`_linesearch`):
  1. b with m (eq. 65): b <- b - eta (I + (Gbar - Gtilde)(K + S^{-1}))^{-1} (b - gbar);
  2. every S_i by the closed form of eq. 61 (vmap over data);
  3. V through W:
     - v_update="fixed_point": the paper's modified-gradient fixed point W^fx_i = S_i - V_i^{-1} (eq. 28) with the
       convex combination taken on W (V stays (K^{-1} + W)^{-1}, positive definite because both ends are); along
       W + eta (W^fx - W) the bound has slope 1/2 tr(Delta V Delta V) >= 0 at eta = 0 (Delta = W^fx - W), the
       analogue of App. C.3;
     - v_update="newton" (default): Newton's method on the stationarity W = S^fx(V(W)) - V_i(W)^{-1} with the S_i
       profiled through eq. 61 (sensitivity `profile_sensitivity`), solved by conjugate gradients in the inner
       product of the block sandwich Q (`_cg`; one O((nC)^2 C) product per iteration, typically 3-5 iterations to
       1e-6 on glass, where plain CG on the symmetric system needed ~200), followed by S_i = S^fx at the new V.
       The paper's fixed point converges linearly and slowly when many data are correlated (the update of W_j
       moves every correlated V_i); the Newton step typically converges in a handful of sweeps
       (benchmarks/README.md §5).

Variants for comparison (Section 2.3.1, Section 9.1): site="knowles_minka" fixes S_i = V_i^{-1} (the relaxed bound,
Knowles and Minka 2011 when V is diagonal; W_i = A_i); covariance="class_factorised" restricts W (hence q) to be
diagonal, i.e. q factorises over the classes when K^c is diagonal (the mean-field family of Girolami and Rogers
2006, with the logit likelihood and the same site bound).
"""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax import lax

from .._linalg import full_precision, invert_lower, tdot
from .._validate import check_max_steps, check_tol, is_concrete
from ..priors._priors import dense_cholesky
from ._blocks import blockdiag_dense, blockdiag_left, blocks, sandwich_blocks, sym
from ._linesearch import safeguarded_step, segment_search
from ._site import (knowles_minka_bound, profile_sensitivity, s_fixed_point_profile, s_step, site_bound_free,
                    site_statistics)

SITES = ("theorem6", "knowles_minka")
COVARIANCES = ("full", "class_factorised")
V_UPDATES = ("newton", "fixed_point")
TRACE_COUNT = {"fit_full": 0}


def site_terms(m, Vb, b, S, km):
    """sum_i of the label-free site bounds (h_i - m_i^T y_i) for data-major arrays (n, C), (n, C, C); `km` (a
    boolean, possibly traced) selects the Knowles-Minka bound S_i = V_i^{-1} instead of Theorem 6."""
    thm6 = jnp.sum(jax.vmap(site_bound_free)(m, Vb, b, S))
    kmb = jnp.sum(jax.vmap(lambda mm, V, bb: knowles_minka_bound(jnp.zeros_like(mm), mm, V, bb))(m, Vb, b))
    return jnp.where(km, kmb, thm6)


def log_z_h(K, Y, m, V, b, S):
    """log Z_h of eq. 21 at arbitrary (m, V, {b_i}, {S_i}); dense O((nC)^3), the reference formula.

    K, V: (nC, nC) datum-major; Y: (n, C) one-hot; m: (nC,); b: (n, C); S: (n, C, C)."""
    n, C = Y.shape
    N = n * C
    LK = jnp.linalg.cholesky(K)
    LV = jnp.linalg.cholesky(V)
    A = jsl.solve_triangular(LK, LV, lower=True)
    a = jsl.solve_triangular(LK, m, lower=True)
    logdet = 2 * (jnp.sum(jnp.log(jnp.diag(LV))) - jnp.sum(jnp.log(jnp.diag(LK))))
    neg_kl = 0.5 * (logdet - jnp.sum(A * A) - a @ a + N)
    sites = jax.vmap(lambda y, mm, VV, bb, SS: site_bound_free(mm, VV, bb, SS) + mm @ y)
    return neg_kl + jnp.sum(sites(Y, m.reshape(n, C), blocks(V, C), b, S))


class FullPosterior(eqx.Module):
    """The maximiser of log Z_h (eq. 21) over q = N(m, V), {b_i}, {S_i}.

    - `Y` (n, C) one-hot labels; `b` (n, C); `S` (n, C, C); `alpha` = K^{-1} m = y - b (tied mean, eq. 27);
    - `W` (n, C, C) with V = (K^{-1} + W)^{-1} (eq. 28); `V_blocks` (n, C, C) the diagonal blocks V_i;
    - `log_z` the bound; `history` its value after each sweep (non-decreasing; NaN after the last);
    - `stationarity` max_i |b_i - gbar_i| (0 at the optimum, Lemma 26); `converged`, `num_steps`.
    For the Knowles-Minka fit S_i is stored as V_i^{-1} + A_i (so that S_i - V_i^{-1} = W_i).
    """

    Y: jax.Array
    b: jax.Array
    S: jax.Array
    W: jax.Array
    V_blocks: jax.Array
    log_z: jax.Array
    converged: jax.Array
    num_steps: jax.Array
    history: jax.Array
    stationarity: jax.Array
    site: str = eqx.field(static=True, default="theorem6")
    covariance_family: str = eqx.field(static=True, default="full")

    @property
    def alpha(self):
        """alpha = K^{-1} m = y - b, datum-major (nC,)."""
        return (self.Y - self.b).reshape(-1)

    def mean(self, K):
        """m = K alpha (eq. 27)."""
        return K @ self.alpha

    def covariance(self, K):
        """V = (K^{-1} + W)^{-1}, dense."""
        G = _covariance(K, jnp.linalg.cholesky(K), self.W)[3]
        return G @ G.T

    def t_matrix(self, K):
        """T = K^{-1} - K^{-1} V K^{-1} = W - W V W (eq. 75; V_* = K_** - K_*^T T K_*)."""
        V = self.covariance(K)
        return sym(blockdiag_dense(self.W) - blockdiag_left(self.W, blockdiag_left(self.W, V).T))


def prior_factor(K, Lx=None):
    """The Cholesky factor L of K = L L^T: dense, or L^x (x) I_C when K = K^x (x) I_C with K^x = L^x L^x^T."""
    if Lx is None:
        return jnp.linalg.cholesky(K)
    return jnp.kron(Lx, jnp.eye(K.shape[0] // Lx.shape[0], dtype=K.dtype))


def _lwl(LK, W, Lx=None):
    """L^T blockdiag(W) L: O((nC)^3) dense; for L = L^x (x) I_C (`Lx` given), whose entry ((i,a),(j,b)) is
    sum_k L^x_ki L^x_kj W_k[a,b], one (n, n) x (n, C^2 n) product, O(n^3 C^2)."""
    if Lx is None:
        return tdot(LK, blockdiag_left(W, LK))
    n, C, _ = W.shape
    T = (W[:, :, :, None] * Lx[:, None, None, :]).reshape(n, C * C * n)  # (k, (a, b, j))
    return tdot(Lx, T).reshape(n, C, C, n).transpose(0, 1, 3, 2).reshape(n * C, n * C)


def _covariance(K, LK, W, Lx=None):
    """V(W) = (K^{-1} + W)^{-1} = L B^{-1} L^T = G G^T with G = L R^{-T}, B = R R^T: (V blocks, log|K^{-1} V|,
    tr(K^{-1} V), G).

    tr(K^{-1} V) = tr(B^{-1}) = nC - sum_i tr(W_i V_i), since B^{-1} (B - I) = B^{-1} L^T W L. `Lx`: see `_lwl`.
    G is solved from the right (G R^T = L) so that V = G G^T and the blocks contract G's rows: on XLA's CPU backend
    a product whose left operand is transposed (Z^T Z) runs at half the speed of G G^T. With L = L^x (x) I_C, G is
    (L^x (x) I_C) R^{-T}, one (n, n) x (n, C nC) product after `invert_lower` (glass: 11 ms against
    20 ms for the triangular solve, one core)."""
    n, C, _ = W.shape
    N = n * C
    B = jnp.eye(N, dtype=K.dtype) + _lwl(LK, W, Lx)
    R = jnp.linalg.cholesky(sym(B))
    logdet_kv = -2.0 * jnp.sum(jnp.log(jnp.diag(R)))
    if Lx is None:
        G = lax.linalg.triangular_solve(R, LK, left_side=False, lower=True, transpose_a=True)
    else:
        G = (Lx @ invert_lower(R).T.reshape(n, C * N)).reshape(N, N)
    Gr = G.reshape(n, C, N)
    Vb = sym(jnp.einsum("iak,ibk->iab", Gr, Gr))
    trace_kv = N - jnp.sum(W * Vb)
    return Vb, logdet_kv, trace_kv, G


class _State(eqx.Module):
    b: jax.Array
    S: jax.Array
    W: jax.Array
    Vb: jax.Array
    V: jax.Array
    logdet_kv: jax.Array
    trace_kv: jax.Array
    value: jax.Array


def _value(K, Y, b, S, Vb, logdet_kv, trace_kv, km):
    n, C = Y.shape
    alpha = (Y - b).reshape(-1)
    m = K @ alpha
    return (0.5 * (logdet_kv - trace_kv + n * C - alpha @ m) + m @ Y.reshape(-1)
            + site_terms(m.reshape(n, C), Vb, b, S, km))


def _means(K, Y, b):
    n, C = Y.shape
    return (K @ (Y - b).reshape(-1)).reshape(n, C)


def _gbar(K, Y, b, S, Vb, km):
    S_eff = jnp.where(km, jnp.linalg.inv(Vb), S)
    return jax.vmap(site_statistics)(_means(K, Y, b), b, S_eff)


def _b_step(K, Y, st, km):
    """The joint (m, b) Newton step of eq. 65 with a safeguarded step length."""
    n, C = Y.shape
    N = n * C
    gbar, _ = _gbar(K, Y, st.b, st.S, st.Vb, km)
    D = jax.vmap(lambda g: jnp.diag(g) - jnp.outer(g, g))(gbar)
    Sinv = jnp.where(km, st.Vb, jnp.linalg.inv(st.S))
    X = jnp.eye(N, dtype=K.dtype) + blockdiag_left(D, K) + blockdiag_dense(jnp.einsum("iab,ibc->iac", D, Sinv))
    d = -jnp.linalg.solve(X, (st.b - gbar).reshape(-1)).reshape(n, C)
    d = jnp.where(jnp.isfinite(d), d, 0.0)
    f = lambda t: _value(K, Y, st.b + t * d, st.S, st.Vb, st.logdet_kv, st.trace_kv, km)
    eta, val = safeguarded_step(f, st.value)
    return eqx.tree_at(lambda s: (s.b, s.value), st, (st.b + eta * d, val))


def _s_step(K, Y, st, km, sweeps):
    return s_sweeps(_means(K, Y, st.b), st, km, sweeps)


def s_sweeps(m, st, km, sweeps):
    """`sweeps` safeguarded S_i updates (eq. 61) in parallel over the data at the latent means m (n, C); none for
    the Knowles-Minka bound. `st` holds (b, S, Vb, value), as the full and the sparse solvers' states do."""
    vals = jax.vmap(site_bound_free)(m, st.Vb, st.b, st.S)

    def one(_, carry):
        S, v = carry
        return jax.vmap(s_step)(m, st.Vb, st.b, S, v)

    S, vals_new = lax.fori_loop(0, jnp.where(km, 0, sweeps), one, (st.S, vals))
    value = jnp.where(km, st.value, st.value + jnp.sum(vals_new) - jnp.sum(vals))
    return eqx.tree_at(lambda s: (s.S, s.value), st, (S, value))


def _cg(Q, D, R, max_iters, rtol=1e-6):
    """Solve (I + D Q) x = R by conjugate gradients in the Q inner product <x, y>_Q = <x, Q y> (Frobenius).

    Q (the block sandwich, positive definite) and D (the profile sensitivity) are symmetric, so I + D Q is
    self-adjoint in that inner product; this is preconditioned CG on (Q + Q D Q) x = Q R with preconditioner Q^{-1},
    applied without inverting Q. Its rate depends on the spectrum of I + Q^{1/2} D Q^{1/2}, not on cond(Q), and it
    costs one product with Q per iteration (Q p is carried along). Stops at non-positive curvature."""
    ip = lambda a, b: jnp.sum(a * b)
    QR = Q(R)
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
    x, *_ = lax.while_loop(cond, body, init)
    return jnp.where(jnp.any(x != 0), x, R)


def _v_direction(K, Y, st, km, mf, newton, cg_iters):
    """The direction delta of the V step in W (see the module docstring), its slope and what `_v_step` re-uses.

    The slope of log Z_h along W + t delta at t = 0 is 1/2 <R, Q(delta)> with R = S - V_i^{-1} - W for the Theorem 6
    site and the full covariance: the gradient in V is -1/2 blockdiag(R), and dV = -V dW V (the Newton step's
    profiled S_i leave it unchanged to first order, being optimal). Returns (delta, slope, A, profiled)."""
    n, C = Y.shape
    mask = jnp.where(mf, jnp.eye(C, dtype=K.dtype), jnp.ones((C, C), K.dtype))
    _, A = _gbar(K, Y, st.b, st.S, st.Vb, km)
    Vinv = jnp.linalg.inv(st.Vb)
    S_fx, G, phi = jax.vmap(s_fixed_point_profile)(st.Vb, A)
    profiled = newton & ~km  # Newton with S_i = S^fx(V_i) profiled; otherwise S_i (or A_i) is held fixed
    target = jnp.where(km, A, sym(jnp.where(profiled, S_fx, st.S) - Vinv))
    R = mask * (target - st.W)
    Q = lambda X: mask * sandwich_blocks(st.V, X)
    D = lambda X: mask * jax.vmap(profile_sensitivity)(G, phi, X)
    delta = lax.cond(profiled, lambda _: mask * sym(_cg(Q, D, R, cg_iters)), lambda _: R, None)
    return delta, 0.5 * jnp.sum(R * Q(delta)), A, profiled


def _v_step(K, LK, Y, st, km, mf, newton, cg_iters, Lx=None, skip_below=-jnp.inf):
    """V through its site precisions W (see the module docstring); returns the new state.

    When the slope of the step (`_v_direction`) is at most `skip_below` (Theorem 6 site, full covariance), the step
    is not taken and V, the O((nC)^3) part of a sweep, is not re-formed. Newton's quadratic model predicts a gain of
    half the slope (measured on glass and iris: 0.45-0.47 of it), so `fit_core` passes what is left of the sweep's
    tolerance and ends a fit without a last sweep that only confirms."""
    delta, slope, A, profiled = _v_direction(K, Y, st, km, mf, newton, cg_iters)

    def evaluate(t):
        W = st.W + t * delta
        Vb, ld, tr, G = _covariance(K, LK, W, Lx)
        S = jnp.where(profiled, jax.vmap(s_fixed_point_profile)(Vb, A)[0], st.S)
        return _value(K, Y, st.b, S, Vb, ld, tr, km), (Vb, ld, tr, S, G)

    def state_at(t, aux):
        W = st.W + t * delta
        Vb, ld, tr, S, G = aux
        return _State(b=st.b, S=S, W=W, Vb=Vb, V=G @ G.T, logdet_kv=ld,
                      trace_kv=tr, value=_value(K, Y, st.b, S, Vb, ld, tr, km))

    def step(_):
        val1, aux1 = evaluate(jnp.ones((), K.dtype))

        def search(_):
            eta, _ = segment_search(lambda t: evaluate(t)[0], st.value)
            return lax.cond(eta > 0, lambda _: state_at(eta, evaluate(eta)[1]), lambda _: st, None)

        take = jnp.isfinite(val1) & (val1 >= st.value)
        return lax.cond(take, lambda _: state_at(jnp.ones((), K.dtype), aux1), search, None)

    return lax.cond(~km & ~mf & (slope <= skip_below), lambda _: st, step, None)


def initial_state(K, Y, km=False, mf=False, scale=1.0, warm=None, cold=True, Lx=None):
    """App. E.3: W_i = gamma (I/C - 11^T/C^2) (diagonal part only when `mf`), V = (K^{-1} + W)^{-1}, m = V W a with
    a_i = gamma (y_i + (y_i - 1)/(C - 1)), i.e. b = y - K^{-1} m = y - (W - W V W) K W a; S_i = V_i^{-1} + W_i.

    With `warm` = (b, S, W) from an earlier fit (another K: "the previous model" of App. E.3) and `cold` False (a
    possibly traced flag), b, S and W are kept and V is rebuilt for this K. `Lx`: K = K^x (x) I_C with
    K^x = L^x L^x^T (`prior_factor`), which makes V cheaper to form."""
    n, C = Y.shape
    LK = prior_factor(K, Lx)
    eye = jnp.eye(C, dtype=K.dtype)
    W1 = scale * (eye / C - jnp.ones((C, C), K.dtype) / C**2)
    W1 = jnp.where(mf, W1 * eye, W1)
    if warm is None:
        warm = (jnp.zeros((n, C), K.dtype), jnp.broadcast_to(eye, (n, C, C)), jnp.zeros((n, C, C), K.dtype))
    W = jnp.where(cold, jnp.broadcast_to(W1, (n, C, C)), warm[2])
    Vb, ld, tr, G = _covariance(K, LK, W, Lx)
    V = G @ G.T
    a = scale * (Y + (Y - 1.0) / (C - 1))
    Wa = jnp.einsum("ab,ib->ia", W1, a).reshape(-1)
    u = blockdiag_left(W, (K @ Wa)[:, None])[:, 0]
    alpha = Wa - u + blockdiag_left(W, (V @ u)[:, None])[:, 0]
    b = jnp.where(cold, Y - alpha.reshape(n, C), warm[0])
    S = jnp.where(cold, sym(jnp.linalg.inv(Vb) + W1), warm[1])
    value = _value(K, Y, b, S, Vb, ld, tr, km)
    return _State(b=b, S=S, W=W, Vb=Vb, V=V, logdet_kv=ld, trace_kv=tr, value=value)


def warm_start(post):
    """(b, S, W) of a fitted posterior, to start a fit under another prior covariance (`initial_state`)."""
    return post.b, post.S, post.W


def fit_core(K, Y, st0, km, mf, newton, tol, max_steps, s_sweeps, cg_iters=50, Lx=None):
    """The block-coordinate ascent from state `st0` (traceable; shared by `fit_full` and hyper-parameter learning;
    `Lx` as in `initial_state`).

    Returns (state, num_steps, converged, history, stationarity)."""
    LK = prior_factor(K, Lx)
    hist0 = jnp.full((max_steps + 1,), jnp.nan, K.dtype).at[0].set(st0.value)
    settled = lambda v, prev: (v - prev <= tol * (1 + jnp.abs(v))) & jnp.isfinite(v)

    def cond(carry):
        st, prev, k, _ = carry
        return (k < max_steps) & ~settled(st.value, prev) & jnp.isfinite(st.value)

    def body(carry):
        st, _, k, hist = carry
        prev = st.value
        st = _b_step(K, Y, st, km)
        st = _s_step(K, Y, st, km, s_sweeps)
        st = _v_step(K, LK, Y, st, km, mf, newton, cg_iters, Lx,
                     skip_below=tol * (1 + jnp.abs(st.value)) - (st.value - prev))
        return st, prev, k + 1, hist.at[k + 1].set(st.value)

    st, prev, k, hist = lax.while_loop(cond, body, (st0, jnp.asarray(-jnp.inf, K.dtype), 0, hist0))
    gbar, A = _gbar(K, Y, st.b, st.S, st.Vb, km)
    st = eqx.tree_at(lambda s: s.S, st, jnp.where(km, sym(jnp.linalg.inv(st.Vb) + A), st.S))
    return st, k, settled(st.value, prev), hist, jnp.max(jnp.abs(st.b - gbar))


@eqx.filter_jit
def _fit_jit(K, Y, warm, cold, km, mf, newton, tol, max_steps, s_sweeps, init_scale):
    TRACE_COUNT["fit_full"] += 1
    st0 = initial_state(K, Y, km, mf, init_scale, warm, cold)
    return fit_core(K, Y, st0, km, mf, newton, tol, max_steps, s_sweeps)


def check_one_hot(Y, name: str = "Y"):
    """Raise ValueError unless a concrete Y has every row a standard basis vector e^c."""
    if is_concrete(Y) and not bool(jnp.all((jnp.sum(Y, axis=1) == 1) & jnp.all((Y == 0) | (Y == 1), axis=1))):
        raise ValueError(f"{name} must be one-hot: every row a standard basis vector e^c")


def check_labels_matrix(K, Y):
    """Validate a prior covariance K (nC, nC) and one-hot labels Y (n, C); returns them as arrays."""
    K = jnp.asarray(K)
    if not jnp.issubdtype(K.dtype, jnp.floating):
        K = K.astype(jnp.result_type(float))
    Y = jnp.asarray(Y, dtype=K.dtype)
    if K.ndim != 2 or K.shape[0] != K.shape[1]:
        raise ValueError(f"K must be a square (nC, nC) matrix, got shape {K.shape}")
    if Y.ndim != 2:
        raise ValueError(f"Y must be (n, C) one-hot labels, got shape {Y.shape}")
    n, C = Y.shape
    if C < 2:
        raise ValueError(f"Y must have C >= 2 classes, got C = {C}")
    if K.shape[0] != n * C:
        raise ValueError(f"K has size {K.shape[0]} but Y implies nC = {n} * {C} = {n * C}")
    check_one_hot(Y)
    if is_concrete(K) and not bool(jnp.all(jnp.isfinite(K))):
        raise ValueError("K contains NaN or inf")
    return K, Y


@full_precision
def fit_full(K, Y, *, site="theorem6", covariance="full", v_update="newton", tol=1e-10, max_steps=200,
             init=None, s_sweeps=3, init_scale=1.0) -> FullPosterior:
    """Maximise log Z_h (eq. 21) for the prior N(0, K) (datum-major (nC, nC)) and one-hot labels Y (n, C).

    `init` (a FullPosterior for the same (n, C), possibly fitted under another K) warm-starts from its (b, S, W)
    (App. E.3; used in hyper-parameter learning). Stops when a sweep raises the bound by at most
    tol * (1 + |log Z_h|), its V step counted by its slope when that is small enough to skip it (`_v_step`);
    `converged` is False (with a warning outside of tracing) when `max_steps` sweeps did not.
    """
    for name, value, allowed in (("site", site, SITES), ("covariance", covariance, COVARIANCES),
                                 ("v_update", v_update, V_UPDATES)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    check_tol(tol)
    check_max_steps(max_steps)
    K, Y = check_labels_matrix(K, Y)
    if is_concrete(K):
        dense_cholesky(K, "K")      # symmetric positive definite, else a ValueError naming K
    if init is not None and (not isinstance(init, FullPosterior) or init.Y.shape != Y.shape):
        raise ValueError("init must be a FullPosterior for the same (n, C)")
    n, C = Y.shape
    if init is None:
        warm = (jnp.zeros((n, C), K.dtype), jnp.broadcast_to(jnp.eye(C, dtype=K.dtype), (n, C, C)),
                jnp.zeros((n, C, C), K.dtype))
    else:
        warm = jax.tree.map(lambda x: jnp.asarray(x, K.dtype), warm_start(init))
    flags = (jnp.asarray(site == "knowles_minka"), jnp.asarray(covariance == "class_factorised"),
             jnp.asarray(v_update == "newton"))
    st, k, converged, hist, stat = _fit_jit(K, Y, warm, jnp.asarray(init is None), *flags, jnp.asarray(tol, K.dtype),
                                            int(max_steps), jnp.asarray(int(s_sweeps)),
                                            jnp.asarray(check_tol(init_scale, "init_scale"), K.dtype))
    if is_concrete(converged) and not bool(converged):
        valid = ("the result is a valid bound but not the optimum" if bool(jnp.isfinite(st.value)) else
                 f"the bound is {float(st.value)}: is K positive definite?")
        warnings.warn(f"gkl_jax.multiclass.fit_full stopped after {int(k)} sweeps without the bound settling to "
                      f"tol={tol:g}; {valid}", stacklevel=2)
    return FullPosterior(Y=Y, b=st.b, S=st.S, W=st.W, V_blocks=st.Vb, log_z=st.value, converged=converged,
                         num_steps=k, history=hist, stationarity=stat, site=site, covariance_family=covariance)
