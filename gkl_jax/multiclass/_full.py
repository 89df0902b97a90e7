"""The marginal-likelihood bound log Z_h over the joint Gaussian on all nC latent values, and its maximisation.

Bound (Chai 2012, Proposition 8, eq. 21), with q(f) = N(m, V) over the datum-major nC-vector f and prior N(0, K):

    log Z_h = -KL(q || p) + sum_i h(y_i; q_i, b_i, S_i)      (jointly concave in m, V, {b_i}, {S_i}).

Parametrisation used by the solver (better conditioned, App. E.2.1 and Section 3.3): the mean is tied to b,
m = K (y - b) (eq. 27), so alpha = K^{-1} m = y - b needs no K^{-1}; the covariance is held as V = K - K T K
(eq. 75) with T = L_W B^{-1} L_W^T, B = I + L_W^T K L_W, W = L_W L_W^T block diagonal, at every fixed point
V^fx = (K^{-1} + W)^{-1} (eq. 28). Then log|K^{-1} V^fx| = -log|B| and tr(K^{-1} V) = nC - tr(T K).

Block-coordinate ascent (Section 3, App. C), each step safeguarded so the bound never decreases:
  1. b (and with it m): the Newton step b - (I + (Gbar - Gtilde)(K + S^{-1}))^{-1} (b - gbar) (eq. 65);
  2. every S_i: the closed form of eq. 61 (vmap over data);
  3. V: the fixed point (eq. 28) in T-form, or the best convex combination of T (App. C.3, E.2.1).

Variants (the comparison bounds of Section 2.3.1 and Section 9.1):
  - site="theorem6": the bound of Theorem 6 with free (b_i, S_i) (this paper);
  - site="knowles_minka": S_i = V_i^{-1} fixed (the relaxed bound; Knowles and Minka 2011 when V is diagonal);
  - covariance="class_factorised": q factorises over the classes, V^{(c)} = (K_x^{-1} + diag_i W_i^{cc})^{-1}
    (the mean-field family of Girolami and Rogers 2006, here with the logit likelihood and the same site bound;
    it needs a prior with no inter-class covariance, K^c diagonal).
"""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax import lax

from .._validate import is_concrete
from ._linesearch import safeguarded_step, segment_search
from ._site import _logdet_pd, _sym, knowles_minka_bound, s_step, site_bound_free, site_statistics

SITES = ("theorem6", "knowles_minka")
COVARIANCES = ("full", "class_factorised")
TRACE_COUNT = {"fit_full": 0}


def blocks(A, C):
    """The n diagonal C x C blocks of an (nC, nC) matrix, shape (n, C, C)."""
    n = A.shape[0] // C
    A4 = A.reshape(n, C, n, C)
    return jnp.einsum("iaib->iab", A4)


def blockdiag_left(D, A):
    """blockdiag(D_1..D_n) @ A for D of shape (n, C, C) and A of shape (nC, M)."""
    n, C, _ = D.shape
    return jnp.einsum("iab,ibk->iak", D, A.reshape(n, C, -1)).reshape(n * C, -1)


def blockdiag_dense(D):
    """The (nC, nC) dense matrix with the blocks D (n, C, C) on its diagonal."""
    n, C, _ = D.shape
    eye = jnp.eye(n, dtype=D.dtype)
    return jnp.einsum("ij,iab->iajb", eye, D).reshape(n * C, n * C)


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
    - `T` (nC, nC) with V = K - K T K (eq. 75); `V_blocks` (n, C, C) the diagonal blocks V_i;
    - `log_z` the bound; `history` its value after each sweep (monotone; NaN after the last);
    - `stationarity` max_i |b_i - gbar_i| (0 at the optimum, Lemma 26); `converged`, `num_steps`.
    """

    Y: jax.Array
    b: jax.Array
    S: jax.Array
    T: jax.Array
    V_blocks: jax.Array
    log_z: jax.Array
    converged: jax.Array
    num_steps: jax.Array
    history: jax.Array
    stationarity: jax.Array
    logdet_kv: jax.Array
    trace_tk: jax.Array
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
        """V = K - K T K (eq. 75), dense."""
        return K - K @ self.T @ K


def _w_factor(W, mf):
    """A square root L_W (n, C, C) of the PSD part of each block W_i (W_i = L_W,i L_W,i^T); of its diagonal when
    `mf` (class-factorised covariance)."""
    lam, U = jnp.linalg.eigh(_sym(W))
    full = U * jnp.sqrt(jnp.maximum(lam, 0.0))[:, None, :]
    diag = jax.vmap(jnp.diag)(jnp.sqrt(jnp.maximum(jnp.diagonal(W, axis1=-2, axis2=-1), 0.0)))
    return jnp.where(mf, diag, full)


def v_fixed_point(K, W, mf=False):
    """V^fx = (K^{-1} + W)^{-1} = K - K T K (eq. 28, App. E.2.1) from the blocks W (n, C, C), without K^{-1}.

    Returns (T, V blocks, log|K^{-1} V|, tr(T K)). With `mf` (class-factorised q) W is replaced by its diagonal."""
    n, C, _ = W.shape
    N = n * C
    LW = _w_factor(W, mf)
    P = jnp.einsum("iba,ibk->iak", LW, K.reshape(n, C, N)).reshape(N, N)  # L_W^T K
    B = jnp.eye(N, dtype=K.dtype) + jnp.einsum("kjb,jbc->kjc", P.reshape(N, n, C), LW).reshape(N, N)
    R = jnp.linalg.cholesky(_sym(B))
    logdet_kv = -2.0 * jnp.sum(jnp.log(jnp.diag(R)))
    Z = jsl.solve_triangular(R, P, lower=True)  # R^{-1} L_W^T K
    Yt = jsl.solve_triangular(R, jnp.swapaxes(blockdiag_dense(LW), 0, 1), lower=True)  # R^{-1} L_W^T
    T = _sym(Yt.T @ Yt)
    Zr = Z.reshape(N, n, C)
    Vb = _sym(blocks(K, C) - jnp.einsum("kia,kib->iab", Zr, Zr))
    return T, Vb, logdet_kv, jnp.sum(Z * Yt)


class _State(eqx.Module):
    b: jax.Array
    S: jax.Array
    T: jax.Array
    Vb: jax.Array
    logdet_kv: jax.Array
    trace_tk: jax.Array
    value: jax.Array


def _value(K, Y, b, S, Vb, logdet_kv, trace_tk, km):
    n, C = Y.shape
    alpha = (Y - b).reshape(-1)
    m = K @ alpha
    return (0.5 * (logdet_kv + trace_tk - alpha @ m) + m @ Y.reshape(-1)
            + site_terms(m.reshape(n, C), Vb, b, S, km))


def _site_inverse(S, Vb, km):
    """The blocks that play S_i^{-1} in the b-Newton step: S_i^{-1}, or V_i for the Knowles-Minka bound."""
    return jnp.where(km, Vb, jnp.linalg.inv(S))


def _gbar(K, Y, b, S, Vb, km):
    n, C = Y.shape
    m = (K @ (Y - b).reshape(-1)).reshape(n, C)
    S_eff = jnp.where(km, jnp.linalg.inv(Vb), S)
    return jax.vmap(site_statistics)(m, b, S_eff)


def _b_step(K, Y, st, km):
    """The joint (m, b) Newton step of eq. 65 with a safeguarded step length."""
    n, C = Y.shape
    N = n * C
    gbar, _ = _gbar(K, Y, st.b, st.S, st.Vb, km)
    D = jax.vmap(lambda g: jnp.diag(g) - jnp.outer(g, g))(gbar)
    Sinv = _site_inverse(st.S, st.Vb, km)
    X = jnp.eye(N, dtype=K.dtype) + blockdiag_left(D, K) + blockdiag_dense(jnp.einsum("iab,ibc->iac", D, Sinv))
    d = -jnp.linalg.solve(X, (st.b - gbar).reshape(-1)).reshape(n, C)
    d = jnp.where(jnp.isfinite(d), d, 0.0)
    f = lambda t: _value(K, Y, st.b + t * d, st.S, st.Vb, st.logdet_kv, st.trace_tk, km)
    eta, val = safeguarded_step(f, st.value)
    return eqx.tree_at(lambda s: (s.b, s.value), st, (st.b + eta * d, val))


def _s_step(K, Y, st, km, sweeps):
    """`sweeps` safeguarded S_i updates (eq. 61), in parallel over the data (each h_i is separate in S_i); none for
    the Knowles-Minka bound (S_i = V_i^{-1})."""
    n, C = Y.shape
    m = (K @ (Y - st.b).reshape(-1)).reshape(n, C)
    vals = jax.vmap(site_bound_free)(m, st.Vb, st.b, st.S)

    def one(_, carry):
        S, vals = carry
        return jax.vmap(s_step)(m, st.Vb, st.b, S, vals)

    S, vals_new = lax.fori_loop(0, jnp.where(km, 0, sweeps), one, (st.S, vals))
    value = jnp.where(km, st.value, st.value + jnp.sum(vals_new) - jnp.sum(vals))
    return eqx.tree_at(lambda s: (s.S, s.value), st, (S, value))


def _w_blocks(K, Y, st, km):
    """W_i: S_i - V_i^{-1} (Section 3.4), or A_i for the Knowles-Minka bound (its -2 dh_i/dV_i)."""
    A = _gbar(K, Y, st.b, st.S, st.Vb, km)[1]
    return jnp.where(km, A, _sym(st.S - jnp.linalg.inv(st.Vb)))


def _v_step(K, LK, Y, st, km, mf):
    """V towards V^fx = (K^{-1} + W)^{-1}, or the best convex combination V^cc (App. C.3, E.2.1)."""
    n, C = Y.shape
    N = n * C
    T_fx, Vb_fx, ld_fx, tr_fx = v_fixed_point(K, _w_blocks(K, Y, st, km), mf)
    val_fx = _value(K, Y, st.b, st.S, Vb_fx, ld_fx, tr_fx, km)

    def search(_):
        M_old = LK.T @ st.T @ LK
        M_fx = LK.T @ T_fx @ LK
        eye = jnp.eye(N, dtype=K.dtype)

        def phi(t):
            ld = _logdet_pd(_sym(eye - (1 - t) * M_old - t * M_fx))
            return _value(K, Y, st.b, st.S, (1 - t) * st.Vb + t * Vb_fx, ld, (1 - t) * st.trace_tk + t * tr_fx, km)

        eta, val = segment_search(phi, st.value)
        ld = jnp.where(eta > 0, _logdet_pd(_sym(eye - (1 - eta) * M_old - eta * M_fx)), st.logdet_kv)
        return eta, val, ld

    take = jnp.isfinite(val_fx) & (val_fx >= st.value)
    eta, val, ld = lax.cond(take, lambda _: (jnp.ones_like(val_fx), val_fx, ld_fx), search, None)
    mix = lambda old, new: (1 - eta) * old + eta * new
    return _State(b=st.b, S=st.S, T=mix(st.T, T_fx), Vb=mix(st.Vb, Vb_fx), logdet_kv=ld,
                  trace_tk=mix(st.trace_tk, tr_fx), value=val)


def initial_state(K, Y, km=False, mf=False, scale=1.0, warm=None):
    """App. E.3: W_i = gamma (I/C - 11^T/C^2), V = (K^{-1} + W)^{-1}, m = V W a with
    a_i = gamma (y_i + (y_i - 1)/(C - 1)), so b = y - K^{-1} m = y - (I - T K) W a; S_i = V_i^{-1} + W_i.

    With `warm` = (b, S, W) from an earlier fit (another K, App. E.3 "previous model"), b and S are kept and
    V = (K^{-1} + W)^{-1} is rebuilt for this K."""
    n, C = Y.shape
    eye = jnp.eye(C, dtype=K.dtype)
    W1 = scale * (eye / C - jnp.ones((C, C), K.dtype) / C**2)
    W = jnp.broadcast_to(W1, (n, C, C)) if warm is None else warm[2]
    T, Vb, ld, tr = v_fixed_point(K, W, mf)
    if warm is None:
        a = scale * (Y + (Y - 1.0) / (C - 1))
        Wa = jnp.einsum("ab,ib->ia", W1, a).reshape(-1)
        alpha = Wa - T @ (K @ Wa)
        b = Y - alpha.reshape(n, C)
        S = _sym(jnp.linalg.inv(Vb) + W1)
    else:
        b, S = warm[0], warm[1]
    value = _value(K, Y, b, S, Vb, ld, tr, km)
    return _State(b=b, S=S, T=T, Vb=Vb, logdet_kv=ld, trace_tk=tr, value=value)


def warm_start(post):
    """(b, S, W) of a fitted posterior, to start a fit under another prior covariance (`initial_state`);
    W_i = S_i - V_i^{-1} (for the Knowles-Minka fit S_i is stored as V_i^{-1} + A_i, so W_i = A_i)."""
    W = _sym(post.S - jnp.linalg.inv(post.V_blocks))
    return post.b, post.S, W


def fit_core(K, Y, st0, km, mf, tol, max_steps, s_sweeps):
    """The block-coordinate ascent from state `st0` (traceable; shared by `fit_full` and hyper-parameter learning).

    Returns (state, num_steps, converged, history, stationarity)."""
    LK = jnp.linalg.cholesky(K)
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
        st = _v_step(K, LK, Y, st, km, mf)
        return st, prev, k + 1, hist.at[k + 1].set(st.value)

    st, prev, k, hist = lax.while_loop(cond, body, (st0, jnp.asarray(-jnp.inf, K.dtype), 0, hist0))
    gbar, A = _gbar(K, Y, st.b, st.S, st.Vb, km)
    # S_i is V_i^{-1} implicitly for the Knowles-Minka bound; store V_i^{-1} + A_i so that S_i - V_i^{-1} = W_i
    st = eqx.tree_at(lambda s: s.S, st, jnp.where(km, _sym(jnp.linalg.inv(st.Vb) + A), st.S))
    return st, k, settled(st.value, prev), hist, jnp.max(jnp.abs(st.b - gbar))


@eqx.filter_jit
def _fit_jit(K, Y, warm, km, mf, tol, max_steps, s_sweeps, init_scale):
    TRACE_COUNT["fit_full"] += 1
    st0 = initial_state(K, Y, km, mf, init_scale, warm)
    return fit_core(K, Y, st0, km, mf, tol, max_steps, s_sweeps)


def _check_inputs(K, Y):
    K = jnp.asarray(K)
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
    if is_concrete(Y) and not bool(jnp.all((jnp.sum(Y, axis=1) == 1) & jnp.all((Y == 0) | (Y == 1), axis=1))):
        raise ValueError("Y must be one-hot: every row a standard basis vector e^c")
    if is_concrete(K) and not bool(jnp.all(jnp.isfinite(K))):
        raise ValueError("K contains NaN or inf")
    return K, Y


def fit_full(K, Y, *, site="theorem6", covariance="full", tol=1e-10, max_steps=300, init=None, s_sweeps=3,
             init_scale=1.0) -> FullPosterior:
    """Maximise log Z_h (eq. 21) for prior N(0, K) (datum-major (nC, nC)) and one-hot labels Y (n, C).

    `init` (a FullPosterior of the same shapes, possibly fitted under another K) warm-starts from its
    (b, S, W) (App. E.3; used during hyper-parameter learning). Stops when a sweep raises the bound by at most tol * (1 + |log Z_h|); `converged` is False
    (with a warning outside of tracing) when `max_steps` sweeps did not get there.
    """
    if site not in SITES:
        raise ValueError(f"site must be one of {SITES}, got {site!r}")
    if covariance not in COVARIANCES:
        raise ValueError(f"covariance must be one of {COVARIANCES}, got {covariance!r}")
    if not tol > 0:
        raise ValueError(f"tol must be positive, got {tol}")
    if int(max_steps) < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    K, Y = _check_inputs(K, Y)
    if init is not None and (not isinstance(init, FullPosterior) or init.Y.shape != Y.shape):
        raise ValueError("init must be a FullPosterior for the same (n, C)")
    warm = None if init is None else warm_start(init)
    km, mf = jnp.asarray(site == "knowles_minka"), jnp.asarray(covariance == "class_factorised")
    st, k, converged, hist, stat = _fit_jit(K, Y, warm, km, mf, jnp.asarray(tol, K.dtype), int(max_steps),
                                            jnp.asarray(int(s_sweeps)), jnp.asarray(init_scale, K.dtype))
    if is_concrete(converged) and not bool(converged):
        warnings.warn(f"gkl_jax.multiclass.fit_full stopped after {int(k)} sweeps without the bound settling to "
                      f"tol={tol:g}; the result is a valid bound but not the optimum", stacklevel=2)
    return FullPosterior(Y=Y, b=st.b, S=st.S, T=st.T, V_blocks=st.Vb, log_z=st.value, converged=converged,
                         num_steps=k, history=hist, stationarity=stat, logdet_kv=st.logdet_kv,
                         trace_tk=st.trace_tk, site=site, covariance_family=covariance)
