"""The sparse (inducing-variable) approximation (Chai 2012, Section 4, App. C.2.1, C.3.1, E.1, E.2.2).

Inducing variables z (s of them; each a single latent f^c(x), Remark 14) with prior N(0, K_zz), cross-covariance
K_zf (s, nC) and latent blocks K_ff,i; q(f, z) = p(f | z) q(z), q(z) = N(m, V). The bound (eq. 32)

    log Z~_h = -KL(q(z) || p(z)) + sum_i h(y_i; q_i, b_i, S_i),  m_f = K_f^T K^{-1} m,
    V_f = K_ff - K_f^T K^{-1} K_f + K_f^T K^{-1} V K^{-1} K_f                                         (eq. 31)

is computed in whitened form u = L^{-1} z (K_zz = L L^T), Ltil = K_zf^T L^{-T} (nC, s): m = L Ltil^T (y - b) (the
tied mean m = K_f (y - b), Section 4.2), q(u) = N(Ltil^T (y - b), B^{-1}), B = I + Ltil^T W Ltil (the fixed point of
eq. 33 in site form, E.2.2), so every step costs O(nC^3 + nC s^2 + s^3):

  - b: Newton (C.2.1) with X^{-1} by Woodbury (E.1): X^{-1} = S M - (S - SMS) Ltil (I + Ltil^T (S - SMS) Ltil)^{-1}
    Ltil^T S M, M = (S + Gbar - Gtilde)^{-1} (block diagonal);
  - S_i: eq. 61 with (m_f, V_f);
  - W: as in the full case (`_full`): Newton on W = S^fx(V_f) - V_f^{-1} with dV_f = -P dW P, P = Ltil B^{-1}
    Ltil^T (low rank), or the fixed point of eq. 33.
With z = f (K_zz = K_zf = K, K_ff = K) the bound and its optimum equal the full ones (Theorem 15).

A boolean `mask` (s,) switches inducing variables off (their K_zz rows become the identity and their K_zf rows
zero, so they contribute nothing): one compiled solver serves a growing inducing set (Section 6.1).
"""

import warnings
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax import lax

from .._linalg import diagonal, full_precision, invert_lower, tdot
from .._program import program
from .._progress import reraise_callback_error, resolve_progress
from .._status import RESULTS
from .._validate import check_max_steps, check_tol, is_concrete
from .._xla_options import LAPACK_BOUND
from ._ascent import ascend
from ._blocks import blockdiag_left, per_datum, placeholder_sites, sym
from ._full import V_UPDATES, check_one_hot
from ._outcome import FitOutcome, set_fields
from ._qcg import q_conjugate_gradient
from ._site import monotone_step, profile_sensitivity, s_fixed_point_profile, site_statistics
from ._sparse_prior import inducing_prior as inducing_prior
from ._sparse_prior import masked_prior as masked_prior
from ._sparse_prior import sparse_log_z as sparse_log_z
from ._sparse_prior import whitened_cross as whitened_cross
from ._sweep import s_sweeps, site_terms
from ._threads import single_threaded

TRACE_COUNT = {"fit_sparse": 0}
V_CG_RTOL = 1e-3
"""Relative tolerance of the sparse V step's conjugate gradients (the full solver's `_qcg.NEWTON_RTOL` is 1e-2): at
large kernel variances the sparse ascent needs the closer Newton direction (n = 5000, C = 10, ML-II to variance
~1240: 785 s at 1e-2, 553 s at 1e-3, the same bound; design-decisions page)."""


class SparsePosterior(FitOutcome):
    """The maximiser of log Z~_h (Chai 2012, eq. 32): the result of `fit_sparse`.

    q(u) = N(Ltil^T (y - b), (I + Ltil^T W Ltil)^{-1}) in the whitened coordinates u = L^{-1} z of the inducing
    variables z (K_zz = L L^T, Ltil = K_zf^T L^{-T}), with the site parameters (b, S, W) of the full case.

    Attributes:
        Y: (n, C) float one-hot labels.
        b: (n, C) float site parameters.
        S: (n, C, C) float site precisions.
        W: (n, C, C) float site precisions of the latent covariance.
        Vf_blocks: (n, C, C) float diagonal blocks of the latent covariance V_f (eq. 31).
        log_z: float scalar array, the bound log Z~_h (a lower bound on log p(y)).
        status: int32 scalar array, why the sweeps stopped: a `gkl_jax.RESULTS` code (`message` says it in words;
            `converged` is `status == RESULTS.successful`).
        num_steps: int scalar array, sweeps taken.
        history: (max_steps + 1,) float array, the bound after each sweep (NaN after the last).
        stationarity: float scalar array, max_i |b_i - gbar_i| (0 at the optimum).
        kernel: the `gk.kernels` kernel of the prior, or None when the fit was given the covariances.
        X: (n, d) float training inputs, or None (as `kernel`).
        inducing: (s,) int indices i C + c of the inducing latents f^c(x_i), or None (as `kernel`).
        mask: (s,) bool, the active inducing variables, or None (all).
        noise: float variance added to each inducing variable (static).
        jitter: float added to the latent prior's diagonal (static).

    Construct it with the attributes by name, and `status`, or (where it is None) `converged`, as `Posterior`.
    """

    Y: jax.Array
    b: jax.Array
    S: jax.Array
    W: jax.Array
    Vf_blocks: jax.Array
    log_z: jax.Array
    status: jax.Array
    num_steps: jax.Array
    history: jax.Array
    stationarity: jax.Array
    kernel: Any = None
    X: Any = None
    inducing: Any = None
    mask: Any = None
    noise: float = eqx.field(static=True, default=1e-6)
    jitter: float = eqx.field(static=True, default=1e-6)

    def __init__(self, *, status=None, converged=None, **fields):
        set_fields(self, status, converged, fields)

    def _repr_items(self):
        s = None if self.inducing is None else len(self.inducing)
        return super()._repr_items() + [("num_inducing", s), ("kernel", self.kernel)]

    def inducing_moments(self, Kzz=None, Kzf=None, mask=None):
        """(m, V) of q(z) (eq. 31's m and V), dense.

        Args:
            Kzz: (s, s) float inducing prior covariance; None (with Kzf None) for the one of the fit.
            Kzf: (s, nC) float cross-covariance; None for the one of the fit.
            mask: (s,) bool active inducing variables; None for the fit's (all when the fit had none).

        Returns:
            ((s,) float mean, (s, s) float covariance).
        """
        if Kzz is None or Kzf is None:
            if self.kernel is None:
                raise ValueError("this posterior was fitted on given covariances: pass Kzz and Kzf")
            Kzz, Kzf, _ = inducing_prior(self.kernel, self.X, self.Y.shape[1], self.inducing, noise=self.noise,
                                         jitter=self.jitter)
            mask = self.mask if mask is None else mask
        if mask is not None:
            Kzz, Kzf = masked_prior(Kzz, Kzf, jnp.asarray(mask, bool))
        L = jnp.linalg.cholesky(Kzz)
        Lt = jsl.solve_triangular(L, Kzf, lower=True).T
        alpha = (self.Y - self.b).reshape(-1)
        mu = tdot(Lt, alpha)
        Sigma = jnp.linalg.inv(sym(jnp.eye(L.shape[0], dtype=L.dtype) + tdot(Lt, blockdiag_left(self.W, Lt))))
        return L @ mu, L @ Sigma @ L.T


class _SState(eqx.Module):
    b: jax.Array
    S: jax.Array
    W: jax.Array
    Vb: jax.Array
    Z: jax.Array  # R^{-1} Ltil^T, (s, nC): V_f = K_ff - Ltil Ltil^T + Z^T Z
    logdet: jax.Array  # log|Sigma_u|
    trace: jax.Array  # tr Sigma_u
    value: jax.Array


def _moments(Lt, W, Kff):
    """(V_f blocks, log|Sigma_u|, tr Sigma_u, Z) for the site precisions W."""
    s = Lt.shape[1]
    n, C, _ = W.shape
    B = jnp.eye(s, dtype=Lt.dtype) + tdot(Lt, blockdiag_left(W, Lt))
    R = jnp.linalg.cholesky(sym(B))
    Z = jsl.solve_triangular(R, Lt.T, lower=True)
    Ltr, Zr = Lt.reshape(n, C, s), Z.T.reshape(n, C, s)
    Vb = sym(Kff - jnp.einsum("ias,ibs->iab", Ltr, Ltr) + jnp.einsum("ias,ibs->iab", Zr, Zr))
    return Vb, -2.0 * jnp.sum(jnp.log(diagonal(R))), jnp.sum(jnp.square(invert_lower(R))), Z


def _value(Lt, Y, b, S, Vb, logdet, trace, km):
    n, C = Y.shape
    mu = tdot(Lt, (Y - b).reshape(-1))
    mf = Lt @ mu
    return (0.5 * (logdet - trace - mu @ mu + Lt.shape[1]) + mf @ Y.reshape(-1)
            + site_terms(mf.reshape(n, C), Vb, b, S, km))


def _inv(X):
    """The inverses of the blocks X (n, C, C) (`per_datum`: no batched LAPACK call large enough to split)."""
    return per_datum(jnp.linalg.inv)(X)


def _mf(Lt, Y, b):
    n, C = Y.shape
    return (Lt @ tdot(Lt, (Y - b).reshape(-1))).reshape(n, C)


def _gbar(Lt, Y, b, S, Vb, km):
    S_eff = jnp.where(km, _inv(Vb), S)
    return per_datum(site_statistics)(_mf(Lt, Y, b), b, S_eff)


def _b_step(Lt, Y, st, km):
    """Newton in b with m = K_f (y - b) (App. C.2.1), the inverse by Woodbury (App. E.1)."""
    n, C = Y.shape
    gbar, _ = _gbar(Lt, Y, st.b, st.S, st.Vb, km)
    D = jax.vmap(lambda g: jnp.diag(g) - jnp.outer(g, g))(gbar)
    Sb = jnp.where(km, _inv(st.Vb), st.S)  # the blocks whose inverse is added to K_f^T K^{-1} K_f
    M = _inv(sym(Sb + D))
    SM = jnp.einsum("iab,ibc->iac", Sb, M)
    E = sym(Sb - jnp.einsum("iab,ibc->iac", SM, Sb))  # S - S M S
    r = (st.b - gbar).reshape(-1)
    u = blockdiag_left(SM, r[:, None])[:, 0]
    ELt = blockdiag_left(E, Lt)
    inner = jnp.eye(Lt.shape[1], dtype=Lt.dtype) + tdot(Lt, ELt)
    w = jsl.cho_solve((jnp.linalg.cholesky(sym(inner)), True), tdot(Lt, u))  # inner >= I: E = S - S M S >= 0
    d = -(u - ELt @ w).reshape(n, C)
    d = jnp.where(jnp.isfinite(d), d, 0.0)
    f = lambda t: (_value(Lt, Y, st.b + t * d, st.S, st.Vb, st.logdet, st.trace, km), ())
    eta, (val, _) = monotone_step(f, st.value, (st.value, ()))
    return eqx.tree_at(lambda s: (s.b, s.value), st, (st.b + eta * d, val))


def _s_step(Lt, Y, st, km, sweeps):
    return s_sweeps(_mf(Lt, Y, st.b), st, km, sweeps)


def _trial_sites(evaluate, m, st, Vb, profiled):
    """The bound at a V step's trial covariance and its S_i: for the Newton step with profiled S_i the current S_i
    after one monotone S sweep (eq. 61) at the trial covariance; otherwise the current S_i.

    The trials used to take the fixed-point S^fx(V_i) at the A_i from before the step, which the Newton direction
    assumes. Far from the optimum those stale A_i lowered the bound at every step size (digits, 1000 x 10, 200
    inducing latents at ML-II's final kernel: by 0.02-40 nats), and half of the sweeps ended in a rejected V step
    after `STEP_HALVINGS` trials of an O(n C s^2) covariance each. The swept S_i start from the current ones, so the
    step t -> 0 keeps the bound and a step is found in a trial or two; where both were tried, the swept S_i gave
    the higher bound. Digits' ML-II with 200 inducing latents took half the time in the same number of sweeps
    (design-decisions page). The full solver keeps S^fx (`_sweep.v_step`): its trials are accepted, and the extra
    sweep only added compilation on iris and wine.

    Args:
        evaluate: S (n, C, C) -> the bound at the trial covariance with these S_i.
        m: (n, C) the latent means (the V step leaves b and so m unchanged).
        st: the solver state before the step (its b and S_i).
        Vb: (n, C, C) the trial's covariance blocks.
        profiled: traced bool: whether the step profiles S_i (else S is kept).

    Returns:
        (bound, S_i) at the trial.
    """
    kept = evaluate(st.S)
    swept = s_sweeps(m, eqx.tree_at(lambda s: (s.Vb, s.value), st, (Vb, kept)), False, 1)
    return jnp.where(profiled, swept.value, kept), jnp.where(profiled, swept.S, st.S)


def _v_step(Lt, Kff, Y, st, km, newton, cg_iters):
    """W towards the stationarity of eq. 33 (Newton with profiled S_i, or the fixed point), safeguarded."""
    _, A = _gbar(Lt, Y, st.b, st.S, st.Vb, km)
    Vinv = _inv(st.Vb)
    S_fx, G, phi = per_datum(s_fixed_point_profile)(st.Vb, A)
    profiled = newton & ~km
    target = jnp.where(km, A, sym(jnp.where(profiled, S_fx, st.S) - Vinv))
    R = target - st.W
    n, C, _ = R.shape
    H = st.Z.T.reshape(n, C, -1)  # P = H H^T

    def Q(X):       # P X P blockwise, P = H H^T, in the order of least work: (n C^2 s + n C s^2) twice
        core = jnp.einsum("ias,iat->st", H, jnp.einsum("iab,ibt->iat", X, H))
        return jnp.einsum("iat,ibt->iab", jnp.einsum("ias,st->iat", H, core), H)

    D = lambda X: jax.vmap(profile_sensitivity)(G, phi, X)
    delta = lax.cond(profiled, lambda _: sym(q_conjugate_gradient(Q, D, R, cg_iters, rtol=V_CG_RTOL)),
                     lambda _: R, None)

    m = _mf(Lt, Y, st.b)

    def evaluate(t):
        W = st.W + t * delta
        Vb, ld, tr, Z = _moments(Lt, W, Kff)
        val, S = _trial_sites(lambda S: _value(Lt, Y, st.b, S, Vb, ld, tr, km), m, st, Vb, profiled)
        return val, (W, Vb, ld, tr, Z, S)

    init = (st.value, (st.W, st.Vb, st.logdet, st.trace, st.Z, st.S))
    _, (val, (W, Vb, ld, tr, Z, S)) = monotone_step(evaluate, st.value, init)
    return _SState(b=st.b, S=S, W=W, Vb=Vb, Z=Z, logdet=ld, trace=tr, value=val)


def _initial(Lt, Kff, Y, km, warm, cold, scale=1.0):
    """App. E.3 for the sparse case: W_i = gamma (I/C - 11^T/C^2), m = V K^{-1} K_f W a (here through b)."""
    n, C = Y.shape
    eye = jnp.eye(C, dtype=Lt.dtype)
    W1 = scale * (eye / C - jnp.ones((C, C), Lt.dtype) / C**2)
    W = jnp.where(cold, jnp.broadcast_to(W1, (n, C, C)), warm[2])
    Vb, ld, tr, Z = _moments(Lt, W, Kff)
    a = scale * (Y + (Y - 1.0) / (C - 1))
    Wa = jnp.einsum("ab,ib->ia", W1, a).reshape(-1)
    # m = V K^{-1} K_f W a  <=>  mu_u = Sigma_u Ltil^T W a; b = y - alpha with Ltil^T alpha = mu_u (minimum norm)
    B = sym(jnp.eye(Lt.shape[1], dtype=Lt.dtype) + tdot(Lt, blockdiag_left(W, Lt)))  # positive definite, as in _moments
    mu = jsl.cho_solve((jnp.linalg.cholesky(B), True), tdot(Lt, Wa))
    alpha = Wa - blockdiag_left(W, (Lt @ mu)[:, None])[:, 0]  # Woodbury: (I + W K~)^{-1} W a, K~ = Ltil Ltil^T
    b = jnp.where(cold, Y - alpha.reshape(n, C), warm[0])
    S = jnp.where(cold, sym(_inv(Vb) + W1), warm[1])
    return _SState(b=b, S=S, W=W, Vb=Vb, Z=Z, logdet=ld, trace=tr, value=_value(Lt, Y, b, S, Vb, ld, tr, km))


def sparse_sweeps(Lt, Kff, Y, st0, km, newton, tol, max_steps, s_sweeps, cg_iters=50, progress=None):
    """The sparse block-coordinate ascent from `st0` (b, S, V once per sweep; `km`, `newton` traced flags), on the
    package's one loop (`_ascent.ascend`).

    Returns:
        (state, `gkl_jax.solvers.Solution`, stationarity max_i |b_i - gbar_i|).
    """
    def sweep(st, prev):
        st = _b_step(Lt, Y, st, km)
        st = _s_step(Lt, Y, st, km, s_sweeps)
        return _v_step(Lt, Kff, Y, st, km, newton, cg_iters)

    st, solution = ascend(st0, tol, max_steps, sweep, progress=progress)
    gbar, A = _gbar(Lt, Y, st.b, st.S, st.Vb, km)
    st = eqx.tree_at(lambda s: s.S, st, jnp.where(km, sym(_inv(st.Vb) + A), st.S))
    return st, solution, jnp.max(jnp.abs(st.b - gbar))


def sparse_core(Lt, Kff, Y, st0, km, newton, tol, max_steps, s_sweeps, cg_iters=50):
    """`sparse_sweeps` as the tuple (state, num_steps, converged, history, stationarity) (the sparse ML-II's
    inner fits, `_sparse_hyper`)."""
    st, solution, stat = sparse_sweeps(Lt, Kff, Y, st0, km, newton, tol, max_steps, s_sweeps, cg_iters)
    return st, solution.num_steps, solution.converged, solution.history, stat


@program(cpu_options=LAPACK_BOUND)
def _sparse_jit(Kzz, Kzf, Kff, Y, mask, warm, cold, km, newton, tol, max_steps, s_sweeps, progress=None):
    TRACE_COUNT["fit_sparse"] += 1
    Kzz, Kzf = masked_prior(Kzz, Kzf, mask)
    Lt = whitened_cross(Kzz, Kzf)
    st0 = _initial(Lt, Kff, Y, km, warm, cold)
    return sparse_sweeps(Lt, Kff, Y, st0, km, newton, tol, max_steps, s_sweeps, progress=progress)


@full_precision
@single_threaded
def fit_sparse(Kzz, Kzf, Kff_blocks, Y, *, mask=None, site="theorem6", v_update="newton", tol=1e-10,
               max_steps=200, init=None, s_sweeps=3, progress=False) -> SparsePosterior:
    """Maximise log Z~_h (eq. 32) for inducing prior K_zz (s, s), cross-covariance K_zf (s, nC) (datum-major
    columns), latent blocks K_ff,i (n, C, C) and one-hot labels Y (n, C). `mask` (s,) selects the active
    inducing variables (default all); `init` (a SparsePosterior for the same data) warm-starts from (b, S, W);
    `progress` as `gkl_jax.multiclass.fit_sparse`'s."""
    callback = resolve_progress(progress, "gkl_jax.multiclass.fit_sparse")
    if site not in ("theorem6", "knowles_minka"):
        raise ValueError(f"site must be 'theorem6' or 'knowles_minka', got {site!r}")
    if v_update not in V_UPDATES:
        raise ValueError(f"v_update must be one of {V_UPDATES}, got {v_update!r}")
    Kzz, Kzf, Kff, Y = (jnp.asarray(a) for a in (Kzz, Kzf, Kff_blocks, Y))
    Y = Y.astype(Kzz.dtype)
    n, C = Y.shape if Y.ndim == 2 else (0, 0)
    s = Kzz.shape[0] if Kzz.ndim == 2 else 0
    if Y.ndim != 2 or C < 2:
        raise ValueError(f"Y must be (n, C) one-hot with C >= 2, got shape {Y.shape}")
    check_one_hot(Y)
    check_tol(tol)
    check_max_steps(max_steps)
    if Kzz.shape != (s, s) or s < 1:
        raise ValueError(f"Kzz must be a square (s, s) matrix, got shape {Kzz.shape}")
    if Kzf.shape != (s, n * C):
        raise ValueError(f"Kzf must have shape (s, nC) = ({s}, {n * C}), got {Kzf.shape}")
    if Kff.shape != (n, C, C):
        raise ValueError(f"Kff_blocks must have shape (n, C, C) = ({n}, {C}, {C}), got {Kff.shape}")
    for name, a in (("Kzz", Kzz), ("Kzf", Kzf), ("Kff_blocks", Kff)):
        if is_concrete(a) and not bool(jnp.all(jnp.isfinite(a))):
            raise ValueError(f"{name} contains NaN or inf")
    mask = jnp.ones(s, bool) if mask is None else jnp.asarray(mask, bool)
    if mask.shape != (s,):
        raise ValueError(f"mask must have shape ({s},), got {mask.shape}")
    if init is None:
        warm = placeholder_sites(n, C, Kzz.dtype)
    else:
        warm = (init.b, init.S, init.W)
    try:
        st, sol, stat = _sparse_jit(Kzz, Kzf, Kff, Y, mask, warm, jnp.asarray(init is None),
                                    jnp.asarray(site == "knowles_minka"), jnp.asarray(v_update == "newton"),
                                    jnp.asarray(tol, Kzz.dtype), int(max_steps), jnp.asarray(int(s_sweeps)), callback)
    except jax.errors.JaxRuntimeError as e:     # a progress callable that raised: its own exception
        reraise_callback_error(callback, e)
        raise
    if is_concrete(sol.status) and int(sol.status) != RESULTS.successful:
        why = "" if bool(jnp.isfinite(st.value)) else (
            f" (the bound is {float(st.value)}: are Kzz and Kff positive definite?)")
        warnings.warn(f"gkl_jax.multiclass.fit_sparse stopped after {int(sol.num_steps)} sweeps without the bound "
                      f"settling ({RESULTS.name(sol.status)}){why}", stacklevel=2)
    return SparsePosterior(Y=Y, b=st.b, S=st.S, W=st.W, Vf_blocks=st.Vb, log_z=st.value, status=sol.status,
                           num_steps=sol.num_steps, history=sol.history, stationarity=stat)
