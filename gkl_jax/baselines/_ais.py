"""`ais`: annealed importance sampling from a Gaussian approximation to the posterior (thesis Ch. 4.10; Neal
2001), the ground truth for log Z in the benchmarks and tests.

With a Gaussian start q(w) = N(m, C^T C) (default: the G-KL fit) the sampler works in the whitened coordinates
w = m + C^T z, where q is N(z | 0, I) and the target is p_1(z) = N(w | mu, Sigma) prod_n phi_n(h_n^T w + o_n)
|det C| (same normaliser Z). It anneals along the geometric path

    log f_t(z) = (1 - b_t) log N(z | 0, I) + b_t log p_1(z),    0 = b_0 < b_1 < ... < b_T = 1

(thesis eq. 4.22 with the approximate posterior as the starting point, the "effective likelihood" path of
eq. 4.11), accumulating per chain log w = sum_t (b_t - b_{t-1}) [log p_1(z_{t-1}) - log N(z_{t-1} | 0, I)] and
moving z_{t-1} -> z_t by one Hamiltonian Monte Carlo transition that leaves f_t invariant (`num_leapfrog`
leapfrog steps of size `step_size`, default 0.5 D^{-1/4}). Since Z_0 = 1,

    log Z_hat = log (1/R) sum_r w_r       (the mean of the weights, not of their logs; Neal 2001),

an unbiased estimate of Z (so log Z_hat is slightly biased low); its standard error is the delta-method value
std(w) / (sqrt(R) mean(w)). Chains are `jax.vmap`ped, temperatures are a `lax.scan`, all in one jit.
"""

import warnings

import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy.special import logsumexp

from .._fit import fit
from .._gaussian import Gaussian
from .._linalg import full_precision
from .._model import Model
from .._program import program
from .._result import Result
from .._start import check_start
from .._status import HasStatus, status_from
from .._typing import Key
from .._validate import check_int, check_key, check_tol, is_concrete
from ..factors import Full
from . import _common as C

TRACE_COUNT = {"ais": 0}


class AISResult(HasStatus):
    """The outcome of `ais` (Neal 2001; Nickisch 2010, Ch. 4.10).

    Attributes:
        log_z: float scalar array, log of the mean importance weight.
        stderr: float scalar array, its delta-method standard error.
        log_weights: (R,) float array of per-chain log importance weights, R = num_chains.
        acceptance: float scalar array, the mean HMC acceptance rate.
        ess: float scalar array, the effective sample size of the weights.
        status: int32 scalar array, a `gkl_jax.RESULTS` code: successful (every temperature ran and log Z is
            finite; a low acceptance rate only warns) or nonfinite; `message` says it in words.
    """

    log_z: jax.Array
    stderr: jax.Array
    log_weights: jax.Array
    acceptance: jax.Array
    ess: jax.Array
    status: jax.Array



@full_precision
def ais(model: Model, key: Key, *, q: Gaussian | Result | None = None, num_chains: int = 256,
        num_temperatures: int = 200, num_leapfrog: int = 10, step_size: float | None = None,
        inflation: float = 1.2) -> AISResult:
    """Annealed importance sampling estimate of log Z with a standard error (Neal 2001; Nickisch 2010, Ch. 4.10;
    module docstring). The estimate is reliable when the acceptance rate is moderate (0.5-0.95) and `ess` is a
    sizeable fraction of `num_chains`; a warning is issued when log Z is not finite or the acceptance is below 0.1.

    Args:
        model: a `gkl_jax.Model` (sites without `variance_offset`).
        key: a `jax.random` key.
        q: the Gaussian start, a `gkl_jax.Gaussian` or a `Result` (default `gk.fit(model).q`), whose factor is
            scaled by `inflation` so that the start covers the posterior's tails (KL fits are under-dispersed,
            which would make the importance weights heavy-tailed).
        num_chains: R, independent chains (int >= 2, default 256).
        num_temperatures: T, annealing steps (int >= 1, default 200).
        num_leapfrog: leapfrog steps per HMC transition (int >= 1, default 10).
        step_size: the leapfrog step size (positive; default 0.5 D^{-1/4}).
        inflation: the start's scale factor (>= 1, default 1.2).

    Returns:
        `AISResult` (with `status`, `message` and `converged` as every result).

    Raises:
        ValueError: a model that cannot be fitted or has variance offsets, a bad key, counts, q, step_size or
            inflation < 1.

    Example:
        >>> import numpy as np, gkl_jax as gk
        >>> H = np.array([[1.0, 0.5], [-0.3, 1.0], [0.2, -1.0]])
        >>> model = gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(H, gk.potentials.Logistic([1, -1, 1])))
        >>> import jax
        >>> estimate = gk.ais(model, jax.random.PRNGKey(0), num_chains=64, num_temperatures=50)
        >>> round(float(estimate.log_z), 2), bool(estimate.stderr < 0.05)
        (-1.98, True)
    """
    C.check_model(model, "ais")
    key = check_key(key)
    for name, value in (("num_chains", num_chains), ("num_temperatures", num_temperatures),
                        ("num_leapfrog", num_leapfrog)):
        check_int(value, f"ais: {name}", 2 if name == "num_chains" else 1)
    if isinstance(q, Result):
        q = q.q
    if q is None:
        q = fit(model).q
    if not isinstance(q, Gaussian):
        raise ValueError(f"ais: q must be a gkl_jax.Gaussian or Result, got {type(q).__name__}")
    if q.dim != model.dim:
        raise ValueError(f"ais: q has dimension {q.dim} but the model has {model.dim}")
    inflation = check_tol(inflation, "ais: inflation")
    if inflation < 1:
        raise ValueError(f"ais: inflation must be >= 1, got {inflation}")
    check_start(q, "ais: q")
    if inflation != 1:
        q = Gaussian(q.mean, Full(inflation * q.factor.dense()))
    step_size = 0.5 * model.dim ** -0.25 if step_size is None else check_tol(step_size, "ais: step_size")
    result = _ais_jit(model, q, key, int(num_chains), int(num_temperatures), int(num_leapfrog), step_size)
    if is_concrete(result.log_z):
        acceptance = float(result.acceptance)
        if not (bool(jnp.isfinite(result.log_z)) and 0.1 <= acceptance):
            warnings.warn(f"gkl_jax.ais: the estimate is unreliable (log Z {float(result.log_z):g}, HMC acceptance "
                          f"rate {acceptance:.2f}); try a smaller step_size or more temperatures", stacklevel=2)
    return result


def schedule(num_temperatures, dtype, steepness=4.0):
    """Sigmoidal inverse temperatures b_0 = 0 < ... < b_T = 1 (denser near both ends)."""
    s = jax.nn.sigmoid(steepness * jnp.linspace(-1.0, 1.0, num_temperatures + 1, dtype=dtype))
    return (s - s[0]) / (s[-1] - s[0])


@program
def _ais_jit(model, q, key, num_chains, num_temperatures, num_leapfrog, step_size):
    TRACE_COUNT["ais"] += 1
    dtype = q.mean.dtype
    dim = model.dim
    half_logdet = 0.5 * q.factor.logdet()
    log_base = lambda z: -0.5 * z @ z - 0.5 * dim * jnp.log(2 * jnp.pi)
    log_target = lambda z: C.log_joint(model, q.mean + q.factor.rmatvec(z)) + half_logdet
    betas = schedule(num_temperatures, dtype)

    def log_f(z, b):
        return (1 - b) * log_base(z) + b * log_target(z)

    grad_log_f = jax.grad(log_f)

    def hmc(z, b, key):
        k1, k2 = jax.random.split(key)
        p0 = jax.random.normal(k1, (dim,), dtype)

        def leap(_, zp):
            z, p = zp
            p = p + 0.5 * step_size * grad_log_f(z, b)
            z = z + step_size * p
            p = p + 0.5 * step_size * grad_log_f(z, b)
            return z, p

        z1, p1 = lax.fori_loop(0, num_leapfrog, leap, (z, p0))
        log_accept = log_f(z1, b) - 0.5 * p1 @ p1 - log_f(z, b) + 0.5 * p0 @ p0
        accept = jnp.log(jax.random.uniform(k2, (), dtype)) < jnp.where(jnp.isfinite(log_accept), log_accept,
                                                                        -jnp.inf)
        return jnp.where(accept, z1, z), accept.astype(dtype)

    def chain(key):
        k0, k1 = jax.random.split(key)
        z0 = jax.random.normal(k0, (dim,), dtype)

        def step(carry, inputs):
            z, log_w = carry
            b_prev, b, k = inputs
            log_w = log_w + (b - b_prev) * (log_target(z) - log_base(z))
            z, acc = hmc(z, b, k)
            return (z, log_w), acc

        keys = jax.random.split(k1, num_temperatures)
        (_, log_w), acc = lax.scan(step, (z0, jnp.zeros((), dtype)), (betas[:-1], betas[1:], keys))
        return log_w, jnp.mean(acc)

    log_w, acc = jax.vmap(chain)(jax.random.split(key, num_chains))
    log_w = jnp.where(jnp.isnan(log_w), -jnp.inf, log_w)
    log_z = logsumexp(log_w) - jnp.log(num_chains)
    w = jnp.exp(log_w - jnp.max(log_w))
    stderr = jnp.std(w, ddof=1) / (jnp.sqrt(num_chains) * jnp.mean(w))
    ess = jnp.sum(w) ** 2 / jnp.sum(w**2)
    finite = jnp.isfinite(log_z)
    return AISResult(log_z=log_z, stderr=stderr, log_weights=log_w, acceptance=jnp.mean(acc), ess=ess,
                     status=status_from(finite, nonfinite=~finite))
