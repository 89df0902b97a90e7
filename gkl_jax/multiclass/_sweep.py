"""One block-coordinate sweep of the maximisation of log Z_h (Chai 2012, eq. 21) and the loop over sweeps.

Parametrisation (Sections 3.3-3.4, App. E): the mean is tied to b, m = K (y - b) (eq. 27), so alpha = K^{-1} m
= y - b; the covariance is held in the site form V = (K^{-1} + W)^{-1} of eq. 28 with W = blockdiag(W_i), computed
without K^{-1} as V = L B^{-1} L^T = G G^T, B = I + L^T W L = R R^T, G = L R^{-T}, K = L L^T (log|K^{-1} V| =
-log|B|, tr(K^{-1} V) = tr B^{-1}; the T of eq. 75 is W - W V W). With K = K^x (x) I_C (`Lx` given) and the full
covariance, W_i = P W^g_i P^T on the class contrasts and V is formed over the n (C - 1) contrasts (`_contrast`).

One sweep, every step monotone (`_site.monotone_step`, the shared backtracking search; one call site of the
objective per step, so each appears once in the compiled program):
  1. b with m (eq. 65): b <- b - eta (I + (Gbar - Gtilde)(K + S^{-1}))^{-1} (b - gbar);
  2. every S_i by the closed form of eq. 61 (vmap over data);
  3. V through W:
     - v_update="fixed_point": the paper's modified-gradient fixed point W^fx_i = S_i - V_i^{-1} (eq. 28) with the
       convex combination taken on W (V stays (K^{-1} + W)^{-1}, positive definite because both ends are); along
       W + eta (W^fx - W) the bound has slope 1/2 tr(Delta V Delta V) >= 0 at eta = 0 (Delta = W^fx - W), the
       analogue of App. C.3;
     - v_update="newton" (default): Newton's method on the stationarity W = S^fx(V(W)) - V_i(W)^{-1} with the S_i
       profiled through eq. 61 (sensitivity `profile_sensitivity`), solved by conjugate gradients in the inner
       product of the block sandwich Q (`q_conjugate_gradient`; one O((nC)^2 C) product per iteration, typically
       3-5 iterations to 1e-6 on glass, where plain CG on the symmetric system needed ~200), followed by
       S_i = S^fx at the new V where that raises datum i's site bound (else S_i is kept: S^fx solves eq. 61 for
       the A_i of the old S_i, and on its own it made the bound fall at every step size in ~8% of iris' V steps).
       The paper's fixed point converges linearly and slowly when many data are correlated; the Newton step
       typically converges in a handful of sweeps.

The variant flags `km` (site="knowles_minka") and `mf` (covariance="class_factorised") and `newton` are Python
booleans here, so each compiled program holds one variant only (the sparse solver passes traced flags, for which
`pick` evaluates both branches).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jax import lax

from .._linalg import diagonal, tdot
from ._ascent import ascend
from ._blocks import blockdiag_dense, blockdiag_left, per_datum, sandwich_blocks, spd_inverse, sym
from ._contrast import contrast_basis, contrast_covariance_times, from_contrasts, to_contrasts
from ._qcg import q_conjugate_gradient
from ._site import (
    knowles_minka_bound,
    monotone_step,
    profile_sensitivity,
    s_fixed_point_profile,
    s_step,
    site_bound_free,
    site_statistics,
)


def pick(flag, if_true, if_false):
    """if_true() or if_false() for a Python boolean `flag`; jnp.where of both for a traced one."""
    if isinstance(flag, (bool, np.bool_)):
        return if_true() if flag else if_false()
    return jnp.where(flag, if_true(), if_false())


def site_terms(m, Vb, b, S, km):
    """sum_i of the label-free site bounds (h_i - m_i^T y_i) for data-major arrays (n, C), (n, C, C); `km` selects
    the Knowles-Minka bound S_i = V_i^{-1} instead of Theorem 6."""
    thm6 = lambda: jnp.sum(per_datum(site_bound_free)(m, Vb, b, S))
    kmb = lambda: jnp.sum(per_datum(lambda mm, V, bb: knowles_minka_bound(jnp.zeros_like(mm), mm, V, bb))(m, Vb, b))
    return pick(km, kmb, thm6)


def prior_factor(K, Lx=None, P=None):
    """The Cholesky factor L of the prior the solver works on: of K = L L^T, dense, or L^x (x) I_C when
    K = K^x (x) I_C with K^x = L^x L^x^T; with the contrast basis P (`contrasts_of`) the contrasts' L^x (x) I_{C-1}."""
    if Lx is None:
        return jnp.linalg.cholesky(K)
    width = K.shape[0] // Lx.shape[0] - (0 if P is None else 1)
    return jnp.kron(Lx, jnp.eye(width, dtype=K.dtype))


def _lwl(LK, W, Lx=None):
    """L^T blockdiag(W) L: O((nC)^3) dense; for L = L^x (x) I_C (`Lx` given), whose entry ((i,a),(j,b)) is
    sum_k L^x_ki L^x_kj W_k[a,b], one (n, n) x (n, C^2 n) product, O(n^3 C^2)."""
    if Lx is None:
        return tdot(LK, blockdiag_left(W, LK))
    n, C, _ = W.shape
    T = (W[:, :, :, None] * Lx[:, None, None, :]).reshape(n, C * C * n)  # (k, (a, b, j))
    return tdot(Lx, T).reshape(n, C, C, n).transpose(0, 1, 3, 2).reshape(n * C, n * C)


def contrasts_of(Lx, mf, C, dtype):
    """The `contrast_basis` P when the solver works on the class contrasts (`_contrast`: K = K^x (x) I_C, given by
    its factor `Lx`, and the full covariance), else None."""
    return contrast_basis(C, dtype) if (Lx is not None and not mf) else None


def _covariance(K, LK, W, Lx=None, P=None):
    """V(W) = (K^{-1} + W)^{-1} = L B^{-1} L^T = G G^T with G = L R^{-T}, B = R R^T: (V blocks, log|K^{-1} V|,
    tr(K^{-1} V), G).

    With the contrast basis P (`contrasts_of`; K = K^x (x) I_C and W_i = P W^g_i P^T, `_contrast`) the same
    computation runs on the contrasts, L = L^x (x) I_{C-1} (`LK`, `prior_factor` with P) and
    W^g, and is lifted: V_i = P V^g_i P^T + K^x_ii 1 1^T / C
    (the class sums keep their prior), log|K^{-1} V| = log|(K^x)^{-1} (x) I V^g| and tr(K^{-1} V) gains n; G is then
    the contrasts' factor, n (C - 1) square.

    tr(K^{-1} V) = tr(B^{-1}) = nC - sum_i tr(W_i V_i), since B^{-1} (B - I) = B^{-1} L^T W L. `Lx`: see `_lwl`.
    G is solved from the right (G R^T = L, one triangular solve) so that V = G G^T and the blocks contract G's
    rows."""
    if P is not None:
        n, C, _ = W.shape
        Vg, logdet_kv, trace_g, G = _covariance(K, LK, sym(to_contrasts(W, P)), Lx)
        kdiag = jnp.sum(Lx * Lx, axis=1)
        return from_contrasts(Vg, P) + kdiag[:, None, None] / C, logdet_kv, trace_g + n, G
    n, C, _ = W.shape
    N = n * C
    B = jnp.eye(N, dtype=K.dtype) + _lwl(LK, W, Lx)
    R = lax.linalg.cholesky(B, symmetrize_input=False)  # B's lower triangle
    logdet_kv = -2.0 * jnp.sum(jnp.log(diagonal(R)))
    G = lax.linalg.triangular_solve(R, LK, left_side=False, lower=True, transpose_a=True)
    Gr = G.reshape(n, C, 1, N)
    Vb = jnp.sum(Gr * jnp.swapaxes(Gr, 1, 2), axis=-1)  # symmetric: the same products in the same order
    trace_kv = N - jnp.sum(W * Vb)
    return Vb, logdet_kv, trace_kv, G


class State(eqx.Module):
    """The iterate of the sweeps: site parameters (b, S), site precisions W, the blocks of V and the factor G of
    V = G G^T (of the contrasts' covariance V^g = G G^T when the solver works on the class contrasts, `_contrast`),
    log|K^{-1} V|, tr(K^{-1} V), the bound, and what the last V step gained (inf before the first)."""

    b: jax.Array
    S: jax.Array
    W: jax.Array
    Vb: jax.Array
    G: jax.Array
    logdet_kv: jax.Array
    trace_kv: jax.Array
    value: jax.Array
    v_gain: jax.Array


def _prior_terms(K, Y, b, logdet_kv, trace_kv):
    """The terms of log Z_h (eq. 21) besides the label-free site bounds, and the tied mean m = K (y - b) (n, C)."""
    n, C = Y.shape
    alpha = (Y - b).reshape(-1)
    m = K @ alpha
    return 0.5 * (logdet_kv - trace_kv + n * C - alpha @ m) + m @ Y.reshape(-1), m.reshape(n, C)


def value(K, Y, b, S, Vb, logdet_kv, trace_kv, km):
    """log Z_h (eq. 21) from the pieces of a `State` (tied mean m = K (y - b))."""
    rest, m = _prior_terms(K, Y, b, logdet_kv, trace_kv)
    return rest + site_terms(m, Vb, b, S, km)


def value_better_sites(K, Y, b, S_new, S_old, Vb, logdet_kv, trace_kv):
    """log Z_h (eq. 21, Theorem 6 site) with each S_i the better of S_new_i and S_old_i, and those S (n, C, C).

    The site terms separate over the data, so this is the largest bound over every such choice. Both candidates are
    evaluated by one call of the site bound over the 2n stacked blocks (one copy of it in the compiled program)."""
    rest, m = _prior_terms(K, Y, b, logdet_kv, trace_kv)
    n = m.shape[0]
    twice = lambda x: jnp.concatenate([x, x])
    h = per_datum(site_bound_free)(twice(m), twice(Vb), twice(b), jnp.concatenate([S_new, S_old]))
    take_new = h[:n] >= h[n:]  # a NaN at S_new keeps S_old
    return rest + jnp.sum(jnp.where(take_new, h[:n], h[n:])), jnp.where(take_new[:, None, None], S_new, S_old)


def _means(K, Y, b):
    n, C = Y.shape
    return (K @ (Y - b).reshape(-1)).reshape(n, C)


def site_moments(K, Y, b, S, Vb, km):
    """(gbar, A) of every site (eqs. 17-18) at the tied mean; S_i = V_i^{-1} for the Knowles-Minka bound."""
    S_eff = pick(km, lambda: spd_inverse(Vb), lambda: S)
    return per_datum(site_statistics)(_means(K, Y, b), b, S_eff)


def b_direction(K, Y, st, km, Kx=None):
    """The Newton direction d of the joint (m, b) step of eq. 65: (n, C).

    The system (I + D M) d = -(b - gbar), M = K + blockdiag(S_i^{-1}), D_i = diag(gbar_i) - gbar_i gbar_i^T, is
    solved through a factor D_i = E_i E_i^T and Woodbury: (I + E E^T M)^{-1} = I - E (I + E^T M E)^{-1} E^T M, one
    Cholesky factorisation of a matrix >= I instead of a pivoted LU of the non-symmetric X (whose pivots XLA applies
    in an nC-step loop). D_i 1 = 0 (gbar_i sums to one), so E_i is (C, C - 1): E_i = P F_i with P the
    `contrast_basis` and F_i F_i^T = P^T D_i P, F_i = R_i^T from the QR factorisation of (P^T E^0_i)^T, where
    E^0_i = diag(sqrt(gbar_i)) - gbar_i sqrt(gbar_i)^T (D_i = E^0_i E^0_i^T; the QR needs no positive gbar), and the
    system is n (C - 1) square. With `Kx` (K = K^x (x) I_C), E^T K E has the blocks K^x_ij E_i^T E_j: one Gram
    matrix of the E_i, no pass over K."""
    n, C = Y.shape
    gbar, _ = site_moments(K, Y, st.b, st.S, st.Vb, km)
    sg = jnp.sqrt(gbar)
    P = contrast_basis(C, K.dtype)
    E0 = jax.vmap(lambda s, g: jnp.diag(s) - jnp.outer(g, s))(sg, gbar)
    Rq = per_datum(lambda e: jnp.linalg.qr(e, mode="r"))(jnp.einsum("ac,iab->ibc", P, E0))  # (n, C-1, C-1)
    E = jnp.einsum("ac,idc->iad", P, Rq)                                                    # P R_i^T: (n, C, C-1)
    Sinv = pick(km, lambda: st.Vb, lambda: spd_inverse(st.S))
    c = C - 1
    if Kx is None:
        EKE = jnp.einsum("ica,icjd,jdb->iajb", E, K.reshape(n, C, n, C), E).reshape(n * c, n * c)
    else:
        Ef = jnp.swapaxes(E, 1, 2).reshape(n * c, C)
        EKE = ((Ef @ Ef.T).reshape(n, c, n, c) * Kx[:, None, :, None]).reshape(n * c, n * c)
    ESE = jnp.einsum("iab,ibc,icd->iad", jnp.swapaxes(E, -1, -2), Sinv, E)
    B = jnp.eye(n * c, dtype=K.dtype) + EKE + blockdiag_dense(ESE)
    r = (st.b - gbar).reshape(-1)
    Mr = (K @ r + blockdiag_left(Sinv, r[:, None])[:, 0]).reshape(n, C)
    RB = lax.linalg.cholesky(B, symmetrize_input=False)  # B's lower triangle
    z = jsl.cho_solve((RB, True), jnp.einsum("iac,ia->ic", E, Mr).reshape(-1))
    d = -(r.reshape(n, C) - jnp.einsum("iac,ic->ia", E, z.reshape(n, c)))
    return jnp.where(jnp.isfinite(d), d, 0.0)


def b_step(K, Y, st, km, Kx=None):
    """The joint (m, b) Newton step of eq. 65 along `b_direction` (`Kx`: see there), taken monotonically
    (`monotone_step`)."""
    d = b_direction(K, Y, st, km, Kx)
    trial = lambda t: (value(K, Y, st.b + t * d, st.S, st.Vb, st.logdet_kv, st.trace_kv, km), ())
    eta, (val, _) = monotone_step(trial, st.value, (st.value, ()))
    return eqx.tree_at(lambda s: (s.b, s.value), st, (st.b + eta * d, val))


def s_sweeps(m, st, km, sweeps):
    """`sweeps` monotone S_i updates (eq. 61) in parallel over the data at the latent means m (n, C); none for
    the Knowles-Minka bound. `st` holds (b, S, Vb, value), as the full and the sparse solvers' states do."""
    vals = per_datum(site_bound_free)(m, st.Vb, st.b, st.S)

    def one(_, carry):
        S, v = carry
        return per_datum(s_step)(m, st.Vb, st.b, S, v)

    S, vals_new = lax.fori_loop(0, pick(km, lambda: 0, lambda: sweeps), one, (st.S, vals))
    new = pick(km, lambda: st.value, lambda: st.value + jnp.sum(vals_new) - jnp.sum(vals))
    return eqx.tree_at(lambda s: (s.S, s.value), st, (S, new))


def v_direction(K, Y, st, km, mf, newton, cg_iters, P=None):
    """The direction delta of the V step in W (see the module docstring), its slope and what `v_step` re-uses.

    The slope of log Z_h along W + t delta at t = 0 is 1/2 <R, Q(delta)> with R = S - V_i^{-1} - W for the Theorem 6
    site and the full covariance: the gradient in V is -1/2 blockdiag(R), and dV = -V dW V (the Newton step's
    profiled S_i leave it unchanged to first order, being optimal). With the contrast basis P (`contrasts_of`) the
    system is solved for P^T delta_i P on the contrasts' covariance (`_contrast`: Q and the profile sensitivity map
    the blocks P X_i P^T to blocks of that form). Returns (delta, slope, A, profiled)."""
    n, C = Y.shape
    # the class-factorised family keeps W_i diagonal; the contrast path (P given) has the full covariance
    mask = 1.0 if P is not None else pick(mf, lambda: jnp.eye(C, dtype=K.dtype), lambda: jnp.ones((C, C), K.dtype))
    _, A = site_moments(K, Y, st.b, st.S, st.Vb, km)
    profiled = newton and not km  # Newton with S_i = S^fx(V_i) profiled; otherwise S_i (or A_i) is held fixed
    V = st.G @ st.G.T
    Q = lambda X: mask * sandwich_blocks(V, X)
    if km:
        R = mask * (A - st.W)
    else:
        S_fx, G, phi = per_datum(s_fixed_point_profile)(st.Vb, A)
        R = mask * (sym((S_fx if profiled else st.S) - spd_inverse(st.Vb)) - st.W)
    D = lambda X: mask * jax.vmap(profile_sensitivity)(G, phi, X)
    if P is not None:  # R, Q, D and delta as blocks P^T X_i P
        R = to_contrasts(R, P)
        D = lambda X, D=D: to_contrasts(D(from_contrasts(X, P)), P)
    QR = Q(R)   # the slope 1/2 <R, Q(delta)> is 1/2 <Q(R), delta> (Q is symmetric, R and delta masked alike)
    delta = mask * sym(q_conjugate_gradient(Q, D, R, cg_iters, QR=QR)) if profiled else R
    slope = 0.5 * jnp.sum(QR * delta)
    return (delta if P is None else from_contrasts(delta, P)), slope, A, profiled


def v_step(K, LK, Y, st, km, mf, newton, cg_iters, Lx=None, skip_below=-jnp.inf, P=None):
    """V through its site precisions W (see the module docstring); returns the new state.

    When the slope of the step (`v_direction`) is at most `skip_below` (Theorem 6 site, full covariance), the step
    is not taken and V, the O((nC)^3) part of a sweep, is not re-formed. Newton's quadratic model predicts a gain of
    half the slope (measured on glass and iris: 0.45-0.47 of it), so `fit_core` passes what is left of the sweep's
    tolerance and ends a fit without a last sweep that only confirms."""
    delta, slope, A, profiled = v_direction(K, Y, st, km, mf, newton, cg_iters, P)

    def trial(t):
        W = st.W + t * delta
        Vb, ld, tr, G = _covariance(K, LK, W, Lx, P)
        if not profiled:
            return value(K, Y, st.b, st.S, Vb, ld, tr, km), (W, Vb, ld, tr, st.S, G)
        S_fx = per_datum(s_fixed_point_profile)(Vb, A)[0]
        val, S = value_better_sites(K, Y, st.b, S_fx, st.S, Vb, ld, tr)
        return val, (W, Vb, ld, tr, S, G)

    init = (st.value, (st.W, st.Vb, st.logdet_kv, st.trace_kv, st.S, st.G))
    skip = (slope <= skip_below) if (not km and not mf) else False
    _, (val, (W, Vb, ld, tr, S, G)) = monotone_step(trial, st.value, init, skip=skip)
    return State(b=st.b, S=S, W=W, Vb=Vb, G=G, logdet_kv=ld, trace_kv=tr, value=val, v_gain=val - st.value)


def initial_state(K, Y, km=False, mf=False, scale=1.0, warm=None, cold=True, Lx=None):
    """App. E.3: W_i = gamma (I/C - 11^T/C^2) (diagonal part only when `mf`), V = (K^{-1} + W)^{-1}, m = V W a with
    a_i = gamma (y_i + (y_i - 1)/(C - 1)), i.e. b = y - K^{-1} m = y - (W - W V W) K W a; S_i = V_i^{-1} + W_i.

    With `warm` = (b, S, W) from an earlier fit (another K: "the previous model" of App. E.3) and `cold` False (a
    possibly traced flag), b, S and W are kept and V is rebuilt for this K. `Lx`: K = K^x (x) I_C with
    K^x = L^x L^x^T (`prior_factor`), which makes V cheaper to form; then (with the full covariance) the solver works
    on the class contrasts (`contrasts_of`) and a warm W is projected onto them."""
    n, C = Y.shape
    P = contrasts_of(Lx, mf, C, K.dtype)
    LK = prior_factor(K, Lx, P)
    eye = jnp.eye(C, dtype=K.dtype)
    W1 = scale * (eye / C - jnp.ones((C, C), K.dtype) / C**2)
    W1 = W1 * eye if mf else W1
    if warm is None:
        warm = (jnp.zeros((n, C), K.dtype), jnp.broadcast_to(eye, (n, C, C)), jnp.zeros((n, C, C), K.dtype))
    W = jnp.where(cold, jnp.broadcast_to(W1, (n, C, C)), warm[2])
    W = W if P is None else from_contrasts(sym(to_contrasts(W, P)), P)
    Vb, ld, tr, G = _covariance(K, LK, W, Lx, P)
    a = scale * (Y + (Y - 1.0) / (C - 1))
    Wa = jnp.einsum("ab,ib->ia", W1, a).reshape(-1)
    u = blockdiag_left(W, (K @ Wa)[:, None])[:, 0]
    Vu = G @ tdot(G, u) if P is None else contrast_covariance_times(G, Lx, P, u)
    alpha = Wa - u + blockdiag_left(W, Vu[:, None])[:, 0]
    b = jnp.where(cold, Y - alpha.reshape(n, C), warm[0])
    S = jnp.where(cold, sym(spd_inverse(Vb) + W1), warm[1])
    val = value(K, Y, b, S, Vb, ld, tr, km)
    return State(b=b, S=S, W=W, Vb=Vb, G=G, logdet_kv=ld, trace_kv=tr, value=val,
                 v_gain=jnp.asarray(jnp.inf, val.dtype))


BS_ROUNDS = 4
"""The most (b, S) rounds per V step. A V step re-forms the O((nC)^3) covariance at each of its trials; a (b, S) round
costs one Cholesky factorisation. A sweep takes another round while the last one gained more than the last V step
did: with one round per V step the ascent was slow at large kernel variances, where the V steps gain little (iris,
variance e^5: 70 sweeps against 20-25), and with four always glass ML-II took 40% longer (design-decisions page)."""


def full_sweeps(K, Y, st0, km, mf, newton, tol, max_steps, s_sweeps_, cg_iters=50, Lx=None, progress=None):
    """The block-coordinate ascent from state `st0` (traceable; `Lx` as in `initial_state`; `km`, `mf`, `newton`
    Python booleans; at most `BS_ROUNDS` (b, S) rounds per V step), on the package's one loop (`_ascent.ascend`).

    Args:
        K: (nC, nC) prior covariance; Y: (n, C) one-hot labels; st0: the starting `State`.
        km, mf, newton: the variant (site="knowles_minka", covariance="class_factorised", v_update="newton").
        tol: relative tolerance on the rise of the bound per sweep; max_steps: the most sweeps (int).
        s_sweeps_: S_i updates per (b, S) round; cg_iters: the most CG iterations of a Newton V step.
        Lx: the (n, n) factor of K^x where K = K^x (x) I_C, or None.
        progress: None, or a progress callable (`gkl_jax.solvers.ProgressInfo` after each sweep; static).

    Returns:
        (state, `gkl_jax.solvers.Solution`, stationarity max_i |b_i - gbar_i|).
    """
    P = contrasts_of(Lx, mf, Y.shape[1], K.dtype)
    LK = prior_factor(K, Lx, P)
    Kx = None if Lx is None else K[::Y.shape[1], ::Y.shape[1]]

    def b_and_s(st):
        st = b_step(K, Y, st, km, Kx)
        return s_sweeps(_means(K, Y, st.b), st, km, s_sweeps_)

    def v(st, prev):
        return v_step(K, LK, Y, st, km, mf, newton, cg_iters, Lx,
                      skip_below=tol * (1 + jnp.abs(st.value)) - (st.value - prev), P=P)

    st, solution = ascend(st0, tol, max_steps, v, b_and_s, BS_ROUNDS, progress)
    gbar, A = site_moments(K, Y, st.b, st.S, st.Vb, km)
    if km:
        st = eqx.tree_at(lambda s: s.S, st, sym(spd_inverse(st.Vb) + A))
    return st, solution, jnp.max(jnp.abs(st.b - gbar))


def fit_core(K, Y, st0, km, mf, newton, tol, max_steps, s_sweeps_, cg_iters=50, Lx=None):
    """`full_sweeps` as the tuple (state, num_steps, converged, history, stationarity) (the dense ML-II's inner
    fits, `_hyper`)."""
    st, solution, stat = full_sweeps(K, Y, st0, km, mf, newton, tol, max_steps, s_sweeps_, cg_iters, Lx)
    return st, solution.num_steps, solution.converged, solution.history, stat
