"""The marginal-likelihood bound log Z_h over the joint Gaussian on all nC latent values, and its maximisation.

Bound (Chai 2012, Proposition 8, eq. 21), with q(f) = N(m, V) over the datum-major nC-vector f, prior N(0, K):

    log Z_h = -KL(q || p) + sum_i h(y_i; q_i, b_i, S_i)  <=  log p(y).

Concavity: log Z_h is concave in m, in V, and in each (b_i, S_i) (Lemma 25), but NOT jointly concave in
(V, S_i) as Proposition 8 states: -1/2 tr(S_i V_i) is bilinear. For one datum with K = 100 I_2, m = 0,
b = (1/2, 1/2), the midpoint of (V, S) = (I, 3I) and (3I, I) has log Z_h = -5.364 below the chord's -4.837
(tests/test_multiclass.py); for one latent the (s, v) Hessian is indefinite once s v > sqrt(2), and the profiled
site bound max_S h is even convex in v. The solver is therefore a monotone block-coordinate ascent that never
assumes joint concavity; each block (b with m, each S_i, V) is concave.

The maximiser (`fit_full`) is the monotone block-coordinate ascent of `_sweep` (b with m by Newton, each S_i
by eq. 61, V through its site precisions W by Newton or the paper's fixed point).

Variants for comparison (Section 2.3.1, Section 9.1): site="knowles_minka" fixes S_i = V_i^{-1} (the relaxed bound,
Knowles and Minka 2011 when V is diagonal; W_i = A_i); covariance="class_factorised" restricts W (hence q) to be
diagonal, i.e. q factorises over the classes when K^c is diagonal (the mean-field family of Girolami and Rogers
2006, with the logit likelihood and the same site bound).
"""

import warnings
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np

from .._linalg import diagonal, full_precision
from .._program import program
from .._progress import reraise_callback_error, resolve_progress
from .._status import RESULTS
from .._validate import check_max_steps, check_tol, device_array, host_view, is_concrete
from .._xla_options import LAPACK_BOUND
from ..priors._priors import dense_cholesky
from ._blocks import blockdiag_dense, blockdiag_left, blocks, per_datum, placeholder_sites, sym
from ._outcome import FitOutcome, set_fields
from ._site import site_bound_free
from ._sweep import _covariance, full_sweeps, initial_state
from ._threads import single_threaded

SITES = ("theorem6", "knowles_minka")
COVARIANCES = ("full", "class_factorised")
V_UPDATES = ("newton", "fixed_point")
TRACE_COUNT = {"fit_full": 0}


def log_z_h(K, Y, m, V, b, S):
    """log Z_h of eq. 21 at arbitrary (m, V, {b_i}, {S_i}); dense O((nC)^3), the reference formula.

    K, V: (nC, nC) datum-major; Y: (n, C) one-hot; m: (nC,); b: (n, C); S: (n, C, C)."""
    n, C = Y.shape
    N = n * C
    LK = jnp.linalg.cholesky(K)
    LV = jnp.linalg.cholesky(V)
    A = jsl.solve_triangular(LK, LV, lower=True)
    a = jsl.solve_triangular(LK, m, lower=True)
    logdet = 2 * (jnp.sum(jnp.log(diagonal(LV))) - jnp.sum(jnp.log(diagonal(LK))))
    neg_kl = 0.5 * (logdet - jnp.sum(A * A) - a @ a + N)
    sites = per_datum(lambda y, mm, VV, bb, SS: site_bound_free(mm, VV, bb, SS) + mm @ y)
    return neg_kl + jnp.sum(sites(Y, m.reshape(n, C), blocks(V, C), b, S))


class Posterior(FitOutcome):
    """The maximiser of log Z_h (Chai 2012, eq. 21) over q = N(m, V), {b_i}, {S_i}: the result of `fit`.

    The latent values are datum-major nC-vectors (entry i C + c is f^c(x_i)). The mean is tied to the sites,
    m = K alpha with alpha = y - b (eq. 27), and V = (K^{-1} + W)^{-1} with block-diagonal W (eq. 28), so the
    posterior is held by (b, S, W) and formed for a prior covariance K on request. For the Knowles-Minka fit S_i
    is stored as V_i^{-1} + A_i (so that S_i - V_i^{-1} = W_i).

    Attributes:
        Y: (n, C) float one-hot labels.
        b: (n, C) float site parameters b_i (eq. 16).
        S: (n, C, C) float site precisions S_i (eq. 19).
        W: (n, C, C) float site precisions of V (eq. 28).
        V_blocks: (n, C, C) float diagonal blocks V_i of the posterior covariance.
        log_z: float scalar array, the bound log Z_h (a lower bound on log p(y)).
        status: int32 scalar array, why the sweeps stopped: a `gkl_jax.RESULTS` code (`message` says it in words;
            `converged` is `status == RESULTS.successful`).
        num_steps: int scalar array, sweeps taken.
        history: (max_steps + 1,) float array, the bound after each sweep (non-decreasing; NaN after the last).
        stationarity: float scalar array, max_i |b_i - gbar_i| (0 at the optimum, Lemma 26 of Chai 2012).
        kernel: the `gk.kernels` kernel of the prior K = K^x (x) K^c + jitter I, or None when the fit was given
            K itself.
        X: (n, d) float training inputs, or None (as `kernel`).
        class_covariance: (C, C) float K^c, or None for the identity.
        jitter: float added to the prior's diagonal (static).
        site: "theorem6" or "knowles_minka", the site bound (static).
        covariance_family: "full" or "class_factorised" (static).

    Construct it with the attributes by name, and `status`, or (where it is None) `converged`, a bool scalar
    from which the status follows as the loop's (`gkl_jax._status.status`, with the step limit
    len(history) - 1).
    """

    Y: jax.Array
    b: jax.Array
    S: jax.Array
    W: jax.Array
    V_blocks: jax.Array
    log_z: jax.Array
    status: jax.Array
    num_steps: jax.Array
    history: jax.Array
    stationarity: jax.Array
    kernel: Any = None
    X: Any = None
    class_covariance: Any = None
    jitter: float = eqx.field(static=True, default=1e-6)
    site: str = eqx.field(static=True, default="theorem6")
    covariance_family: str = eqx.field(static=True, default="full")

    def __init__(self, *, status=None, converged=None, **fields):
        set_fields(self, status, converged, fields)

    def _repr_items(self):
        return super()._repr_items() + [("site", self.site), ("covariance_family", self.covariance_family),
                                        ("kernel", self.kernel)]

    @property
    def alpha(self):
        """alpha = K^{-1} m = y - b: (nC,) float, datum-major (computed on the host for host data: no program is
        compiled for it per shape)."""
        if is_concrete(self.b):
            return device_array((host_view(self.Y) - host_view(self.b)).reshape(-1))
        return (self.Y - self.b).reshape(-1)

    def prior_covariance(self):
        """K = K^x (x) K^c + jitter I of the fit: (nC, nC) float, datum-major.

        Returns:
            (nC, nC) float array.

        Raises:
            ValueError: the posterior was fitted on a given K (no kernel stored).
        """
        if self.kernel is None:
            raise ValueError("this posterior was fitted on a given K: pass K")
        return prior_covariance(self.kernel, self.X, self.Y.shape[1], self.class_covariance, self.jitter)

    def _K(self, K):
        return self.prior_covariance() if K is None else K

    def mean(self, K=None):
        """m = K alpha (eq. 27).

        Args:
            K: (nC, nC) float prior covariance; None for the one of the fit (`prior_covariance`).

        Returns:
            (nC,) float array, datum-major.
        """
        return self._K(K) @ self.alpha

    def covariance(self, K=None):
        """V = (K^{-1} + W)^{-1}, dense.

        Args:
            K: (nC, nC) float prior covariance; None for the one of the fit.

        Returns:
            (nC, nC) float array, datum-major.
        """
        return _dense_covariance(self._K(K), self.W)

    def t_matrix(self, K=None):
        """T = K^{-1} - K^{-1} V K^{-1} = W - W V W (eq. 75; the predictive covariance is K_** - K_*^T T K_*).

        Args:
            K: (nC, nC) float prior covariance; None for the one of the fit.

        Returns:
            (nC, nC) float array, datum-major.
        """
        return _t_matrix(self._K(K), self.W)


@eqx.filter_jit
def _dense_covariance(K, W):
    G = _covariance(K, jnp.linalg.cholesky(K), W)[3]
    return G @ G.T


@eqx.filter_jit
def _t_matrix(K, W):
    V = _dense_covariance(K, W)
    return sym(blockdiag_dense(W) - blockdiag_left(W, blockdiag_left(W, V).T))


@eqx.filter_jit
def prior_covariance(kernel, X, num_classes, class_covariance=None, jitter=1e-6):
    """K = K^x (x) K^c + jitter I, datum-major (eq. 1 of Chai 2012 with K^c = I by default).

    Args:
        kernel: a `gk.kernels` kernel (K^x = kernel.gram(X)).
        X: (n, d) float inputs.
        num_classes: C (static int).
        class_covariance: (C, C) float K^c, or None for the identity.
        jitter: float added to the diagonal.

    Returns:
        (nC, nC) float array.
    """
    Kx = kernel.gram(X)
    Kx = (Kx + Kx.T) / 2        # exactly symmetric: a product-form Gram matrix is so only up to round-off
    Kc = jnp.eye(num_classes, dtype=Kx.dtype) if class_covariance is None else jnp.asarray(class_covariance, Kx.dtype)
    N = Kx.shape[0] * num_classes
    return jnp.kron(Kx, Kc) + jitter * jnp.eye(N, dtype=Kx.dtype)


@program(cpu_options=LAPACK_BOUND)
def _fit_jit(K, Y, warm, cold, km, mf, newton, tol, max_steps, s_sweeps, init_scale, kron=False, progress=None):
    """One compiled fit per (shapes, variant): km, mf, newton, max_steps, `kron` and `progress` are static Python
    values. `kron`: K = K^x (x) I_C (+ jitter I), factorised through the (n, n) Cholesky factor of its every C-th
    row and column. Returns (state, `gkl_jax.solvers.Solution`, stationarity)."""
    TRACE_COUNT["fit_full"] += 1
    Lx = jnp.linalg.cholesky(K[::Y.shape[1], ::Y.shape[1]]) if kron else None
    st0 = initial_state(K, Y, km, mf, init_scale, warm, cold, Lx)
    return full_sweeps(K, Y, st0, km, mf, newton, tol, max_steps, s_sweeps, Lx=Lx, progress=progress)


def warm_start(post):
    """(b, S, W) of a fitted posterior, to start a fit under another prior covariance (`initial_state`)."""
    return post.b, post.S, post.W


def check_one_hot(Y, name: str = "Y"):
    """Raise ValueError unless a concrete Y has every row a standard basis vector e^c."""
    if not is_concrete(Y):
        return
    Yh = host_view(Y)   # numpy for host data: no program compiled per shape for the check
    if not bool(((Yh.sum(axis=1) == 1) & ((Yh == 0) | (Yh == 1)).all(axis=1)).all()):
        raise ValueError(f"{name} must be one-hot: every row a standard basis vector e^c")


def one_hot_labels(y, num_data, num_classes=None, dtype=None, name: str = "y"):
    """Labels as an (n, C) one-hot float array.

    Args:
        y: (n,) or (n, 1) integer class indices in 0..C-1, or (n, C) one-hot labels (C >= 2).
        num_data: n, the number of input rows the labels must match.
        num_classes: C for integer labels (default max(y) + 1); for one-hot labels it must equal y.shape[1].
        dtype: the float dtype of the result (default float64 where enabled).
        name: the argument name used in error messages.

    Returns:
        (n, C) float array.

    Raises:
        ValueError: labels of another length, negative, non-integer or >= num_classes, fewer than 2 classes, or
            rows that are not one-hot.
    """
    dtype = jnp.result_type(float) if dtype is None else dtype
    arr = np.asarray(y)
    if arr.ndim == 2 and arr.shape[1] == 1:     # an (n, 1) column of class indices (one-hot needs C >= 2)
        arr = arr[:, 0]
    if arr.ndim == 2:
        if arr.shape[0] != num_data:
            raise ValueError(f"{name} has {arr.shape[0]} rows but X has {num_data}")
        if num_classes is not None and arr.shape[1] != int(num_classes):
            raise ValueError(f"{name} has {arr.shape[1]} columns but num_classes is {num_classes}")
        Y = jnp.asarray(arr, dtype)
    elif arr.ndim == 1:
        if arr.shape[0] != num_data:
            raise ValueError(f"{name} has {arr.shape[0]} labels but X has {num_data} rows")
        if arr.dtype.kind not in "biuf" or (arr.dtype.kind == "f" and not np.all(arr == np.round(arr))):
            raise ValueError(f"{name} must hold integer class indices 0..C-1 (or be (n, C) one-hot)")
        if arr.size and arr.min() < 0:
            raise ValueError(f"{name} holds a negative class index")
        C = int(arr.max()) + 1 if num_classes is None else int(num_classes)
        if arr.size and arr.max() >= C:
            raise ValueError(f"{name} holds the class index {int(arr.max())}, not below num_classes = {C}")
        Y = device_array(np.eye(max(C, 1))[arr.astype(int)], dtype)
    else:
        raise ValueError(f"{name} must be (n,) class indices or (n, C) one-hot labels, got shape {arr.shape}")
    if Y.shape[1] < 2:
        raise ValueError(f"{name} must have C >= 2 classes, got C = {Y.shape[1]}")
    check_one_hot(Y, name)
    return Y


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
@single_threaded
def fit_full(K, Y, *, site="theorem6", covariance="full", v_update="newton", tol=1e-10, max_steps=200,
             init=None, s_sweeps=3, init_scale=1.0, kron=False, progress=False) -> Posterior:
    """Maximise log Z_h (eq. 21) for the prior N(0, K) (datum-major (nC, nC)) and one-hot labels Y (n, C).

    `init` (a Posterior for the same (n, C), possibly fitted under another K) warm-starts from its (b, S, W)
    (App. E.3; used in hyper-parameter learning). Stops when a sweep raises the bound by at most
    tol * (1 + |log Z_h|), its V step counted by its slope when that is small enough to skip it (`_v_step`);
    `converged` is False (with a warning outside of tracing) when `max_steps` sweeps did not. `kron=True`
    declares K = K^x (x) I_C + jitter I (as `prior_covariance` builds it without a class covariance), which makes
    each V step work on the n (C - 1) class contrasts (`_contrast`), O((n (C - 1))^3) instead of O((nC)^3).
    `progress` as `gkl_jax.multiclass.fit`'s (one line per sweep: the bound and its relative rise).
    """
    callback = resolve_progress(progress, "gkl_jax.multiclass.fit")
    for name, value, allowed in (("site", site, SITES), ("covariance", covariance, COVARIANCES),
                                 ("v_update", v_update, V_UPDATES)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    check_tol(tol)
    check_max_steps(max_steps)
    K, Y = check_labels_matrix(K, Y)
    if is_concrete(K):
        dense_cholesky(K, "K")      # symmetric positive definite, else a ValueError naming K
    if init is not None and (not isinstance(init, Posterior) or init.Y.shape != Y.shape):
        raise ValueError("init must be a Posterior for the same (n, C)")
    n, C = Y.shape
    if init is None:
        warm = placeholder_sites(n, C, K.dtype)
    else:
        warm = jax.tree.map(lambda x: jnp.asarray(x, K.dtype), warm_start(init))
    flags = (site == "knowles_minka", covariance == "class_factorised", v_update == "newton")
    init_scale = jnp.asarray(check_tol(init_scale, "init_scale"), K.dtype)
    try:
        st, sol, stat = _fit_jit(K, Y, warm, jnp.asarray(init is None), *flags, jnp.asarray(tol, K.dtype),
                                 int(max_steps), jnp.asarray(int(s_sweeps)), init_scale, bool(kron), callback)
    except jax.errors.JaxRuntimeError as e:     # a progress callable that raised: its own exception
        reraise_callback_error(callback, e)
        raise
    if is_concrete(sol.status) and int(sol.status) != RESULTS.successful:
        valid = ("the result is a valid bound but not the optimum" if bool(jnp.isfinite(st.value)) else
                 f"the bound is {float(st.value)}: is K positive definite?")
        warnings.warn(f"gkl_jax.multiclass.fit_full stopped after {int(sol.num_steps)} sweeps without the bound "
                      f"settling to tol={tol:g} ({RESULTS.name(sol.status)}); {valid}", stacklevel=2)
    return Posterior(Y=Y, b=st.b, S=st.S, W=st.W, V_blocks=st.Vb, log_z=st.value, status=sol.status,
                     num_steps=sol.num_steps, history=sol.history, stationarity=stat, site=site,
                     covariance_family=covariance)
