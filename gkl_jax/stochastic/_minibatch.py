"""Data larger than one pass: stochastic maximisation of the G-KL bound over minibatches of sites, and the
full-data bound streamed in chunks.

The bound (Challis & Barber 2013, eq. 7) splits into the sites-independent part and a sum over sites,

    B(m, C) = H[q] + E_q[log N(w | mu, Sigma)] + sum_groups sum_{n=1}^{N_g} I_n(m_n, s_n),

so with a uniformly random subset b_g of b sites from each group (all subsets of the same size equally likely)

    B_hat = H[q] + E_q[log N(w | mu, Sigma)] + sum_groups (N_g / b) sum_{n in b_g} I_n

has E[B_hat] = B and E[grad B_hat] = grad B. `fit_minibatch` follows these unbiased gradients with any optax
optimiser (Adam with a cosine-decayed step by default), drawing the batches without replacement within an
epoch (a fresh permutation of each group's sites every epoch), and finishes with one streamed pass that
evaluates the exact full-data bound and gradient (`bound_chunked`).
"""

import functools
import math
import warnings
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.flatten_util import ravel_pytree

from .._adjoint import stop_gradients
from .._bound import check_model_and_q
from .._gaussian import Gaussian
from .._linalg import full_precision
from .._model import Model, check_fittable
from .._program import program
from .._progress import report_done, report_step, reraise_callback_error, resolve_progress
from .._result import Result
from .._start import initial_q as _initial_q
from .._status import RESULTS
from .._validate import as_int, check_indices, check_int, check_key, check_max_steps, check_tol, is_concrete
from .._whiten import whitening
from ..factors import AbstractFactor, Full
from ..priors._priors import AbstractDensePrior
from ._subsample import check_subsampling, num_sites, slice_sites, take_sites

TRACE_COUNT = {"fit_minibatch": 0}
_CHUNK_ELEMENTS = 2 ** 22  # default chunk: about this many entries of H (32 MiB in float64)


def _global_terms(model: Model, q: Gaussian):
    """H[q] + E_q[log N(w | mu, Sigma)]: the part of the bound that does not touch the sites."""
    value = q.entropy()
    if model.prior is not None:
        value = value + model.prior.expected_log_density(q)
    return value


def default_chunk_size(dim: int, num: int) -> int:
    """About 2^22 entries of H per chunk (at least 1024 rows), never more than the N rows there are."""
    return int(min(num, max(1024, _CHUNK_ELEMENTS // max(dim, 1))))


def _chunk_sizes(model: Model, chunk_size):
    """One chunk size per sites group from None (default), an integer, or one integer per group."""
    per_group = tuple(chunk_size) if isinstance(chunk_size, (tuple, list)) else (chunk_size,) * len(model.sites)
    if len(per_group) != len(model.sites):
        raise ValueError(f"chunk_size has {len(per_group)} entries but the model has {len(model.sites)} sites groups")
    sizes = []
    for sites, size in zip(model.sites, per_group):
        n = num_sites(sites, model.dim)
        if size is None:
            sizes.append(default_chunk_size(model.dim, n))
        else:
            if as_int(size) is None or as_int(size) < 1:
                raise ValueError(f"chunk_size must be a positive integer (or one per sites group), got {size!r}")
            sizes.append(min(as_int(size), n))
    return tuple(sizes)


@full_precision
def bound_chunked(model: Model, q: Gaussian, chunk_size=None):
    """The G-KL bound B(m, C) of `bound`, with each group's sites streamed in chunks of `chunk_size` rows.

    The sites sum runs as a `lax.scan` over contiguous chunks (the last chunk is clamped to end at row N and
    its rows already counted are masked), each chunk rematerialised in the backward pass (`jax.checkpoint`),
    so neither the value nor the gradient ever holds more than one chunk's projections: memory
    O(chunk_size * D) instead of O(N * D) for the full factor. Equal to `bound(model, q)` up to summation
    order (Challis & Barber 2013, eq. 7). Jit-able and differentiable in both arguments.

    Args:
        model: a `gkl_jax.Model` whose site groups have a dense H or H=None (where a group needs chunking).
        q: a `gkl_jax.Gaussian` over model.dim variables.
        chunk_size: rows per chunk, one int or one per sites group (default: about 2^22 entries of H, at least
            1024 rows); static under `jit`.

    Returns:
        float scalar array, the bound.

    Raises:
        ValueError: q does not match the model, a bad chunk_size, or a chunked group whose H is neither dense
            nor the identity.
    """
    q = check_model_and_q(model, q)
    sizes = _chunk_sizes(model, chunk_size)
    value = _global_terms(model, q)
    for sites, size in zip(model.sites, sizes):
        n = num_sites(sites, model.dim)
        if size >= n:
            value = value + sites.expected_log_phi(q)
            continue
        check_subsampling(sites, model.dim, "bound_chunked")

        @jax.checkpoint
        def chunk_sum(c, sites=sites, size=size, n=n):
            first = c * size
            start = jnp.minimum(first, n - size)
            part = slice_sites(sites, start, size, model.dim)
            m, s2 = part.project(q)
            terms = part.potential.expected_log_phi(m, s2)
            rows = start + jnp.arange(size)
            return jnp.sum(jnp.where(rows >= first, terms, 0.0))

        def body(total, c, chunk_sum=chunk_sum):
            return total + chunk_sum(c), None

        zero = jnp.zeros((), jnp.result_type(value))
        total, _ = lax.scan(body, zero, jnp.arange(math.ceil(n / size)))
        value = value + total
    return jnp.asarray(value)


@full_precision
def minibatch_bound(model: Model, q: Gaussian, indices):
    """The unbiased estimate B_hat of the bound from the rows `indices[g]` of each sites group g (sampled
    uniformly without replacement): global terms plus (N_g / b_g) times the batch's site terms.

    Args:
        model: a `gkl_jax.Model` whose site groups have a dense H or H=None.
        q: a `gkl_jax.Gaussian` over model.dim variables.
        indices: a list with one non-empty 1-D integer array of rows in [0, N_g) per sites group.

    Returns:
        float scalar array B_hat.

    Raises:
        ValueError: q does not match the model, indices not one array per group, empty or out of range, or an
            H that cannot be subsampled.
    """
    q = check_model_and_q(model, q)
    if not isinstance(indices, (tuple, list)) or len(indices) != len(model.sites):
        got = f"length {len(indices)}" if isinstance(indices, (tuple, list)) else type(indices).__name__
        raise ValueError(f"indices must be a list with one index array per sites group ({len(model.sites)}), "
                         f"got {got}")
    value = _global_terms(model, q)
    for g, (sites, idx) in enumerate(zip(model.sites, indices)):
        n = num_sites(sites, model.dim)
        idx = check_indices(idx, n, f"indices[{g}]")
        if idx.shape[0] == 0:
            raise ValueError(f"indices[{g}] is empty: a minibatch needs at least one site")
        value = value + (n / idx.shape[0]) * take_sites(sites, idx, model.dim).expected_log_phi(q)
    return value


def _batch_sizes(model: Model, batch_size):
    if not model.sites:
        raise ValueError("model has no Sites groups to draw minibatches from; use gkl_jax.fit")
    sizes = tuple(batch_size) if isinstance(batch_size, (tuple, list)) else (batch_size,) * len(model.sites)
    if len(sizes) != len(model.sites):
        raise ValueError(f"batch_size has {len(sizes)} entries but the model has {len(model.sites)} sites groups")
    out = []
    for g, (sites, b) in enumerate(zip(model.sites, sizes)):
        n = num_sites(sites, model.dim)
        b = check_int(b, "batch_size", 1)
        if b > n:
            raise ValueError(f"batch_size={b} for sites group {g} must be between 1 and its N={n}")
        check_subsampling(sites, model.dim, "model")
        out.append(b)
    return tuple(out)


@functools.lru_cache(maxsize=64)
def _default_optimizer(num_steps: int, learning_rate: float):
    """Adam with a cosine decay to learning_rate / 100 (cached: the same object compiles once)."""
    schedule = optax.cosine_decay_schedule(learning_rate, num_steps, alpha=1e-2)
    return optax.adam(schedule)


@full_precision
def fit_minibatch(model: Model, factor: AbstractFactor | None = None, *, batch_size, num_steps: int | None = None,
                  num_epochs: float | None = None, optimizer: optax.GradientTransformation | None = None,
                  learning_rate: float = 3e-2, key=None, q0: Gaussian | None = None, chunk_size: int | None = None,
                  tol: float | None = None, whiten: bool = False,
                  progress: bool | str | Callable[..., object] = False) -> Result:
    """Maximise the G-KL bound (Challis & Barber 2013, eq. 7) by stochastic gradients on minibatches of sites.

    Without `q0` the start is the prior mean with variances min(v0, 1 / Lambda_jj), Lambda_jj a minibatch
    estimate of the diagonal of the fixed-point precision Sigma^{-1} + H^T Gamma H (eq. 10). The optimiser sees
    the mean in its own units and the factor entries in units of s, the geometric mean of the starting marginal
    standard deviations, so that one step size suits both (the posterior standard deviations shrink like
    N^{-1/2} while the mean does not). Finishing with `gkl_jax.fit(model, q0=result.q)` polishes a minibatch
    fit to a tight tolerance when a few full passes fit the budget. Compiled once per (shapes, batch sizes,
    num_steps, optimiser).

    Args:
        model: a `gkl_jax.Model` whose site groups have a dense H or H=None.
        factor: the covariance factor (default `q0`'s, else `gkl_jax.factors.Full()`).
        batch_size: sites per step, one int for every group or one per group (1 <= b <= N_g).
        num_steps: optimiser steps (give exactly one of num_steps and num_epochs).
        num_epochs: passes over the largest group (a positive float).
        optimizer: any `optax.GradientTransformation` (it minimises -B_hat); default Adam with a cosine decay
            from `learning_rate` to `learning_rate / 100` over the run. Pass the same object again to reuse
            the compiled program (a new optax object is a new static argument).
        learning_rate: the default optimiser's initial step size (default 3e-2).
        key: PRNG key for the batches (default `jax.random.key(0)`).
        q0: a starting `gkl_jax.Gaussian` or `Result` (as in `gkl_jax.fit`).
        chunk_size: rows per chunk of the final streamed full-data pass (`bound_chunked`).
        tol: per-site gradient tolerance for `converged` (default 1e-3).
        whiten: as in `gkl_jax.fit`, run in the basis w = mu + L v, L L^T = Sigma (Challis & Barber 2013,
            App. E; the sites become the dense H L), and report q in the original basis with a Full factor.
            Under a GP prior this is what lets Adam converge.
        progress: False (default), True (on stderr: the step, the minibatch estimate of the bound and
            max|gradient estimate| / N, every ceil(num_steps / 100) steps at most once a second, then the
            full-data bound and max|grad| / N), "auto" (True where stderr is a terminal) or a callable receiving
            a `gkl_jax.solvers.ProgressInfo` (solver "minibatch") at those steps and once at the end, as in
            `gkl_jax.fit`. Turning it on compiles the fit once more. A callable that raises stops the fit with
            its exception.

    Returns:
        `gkl_jax.Result`: `log_z` is the exact full-data bound at the final q (a valid lower bound on log Z,
        differentiable in the model; q itself carries no derivative: use `gkl_jax.fit` for that); `history` is
        a (num_steps + 1,) array, `history[k]` the unbiased estimate B_hat(q_k) from the k-th batch and
        `history[num_steps]` the exact full-data bound at the end; `converged` says whether the full-data
        gradient met max |dB/d(m, C)| / N <= tol, N the total number of sites (a warning is issued when not).

    Raises:
        ValueError: a model that cannot be fitted, q0 or factor of the wrong type, both or neither of
            num_steps/num_epochs, bad batch sizes, optimizer not an optax transformation, an H that cannot
            be subsampled, or a progress that is not True, False, "auto" or callable.
    """
    check_fittable(model, "fit_minibatch")
    callback = resolve_progress(progress, "gkl_jax.stochastic.fit_minibatch")
    q0 = q0.q if isinstance(q0, Result) else q0
    if q0 is not None and not isinstance(q0, Gaussian):
        raise ValueError(f"q0 must be a gkl_jax.Gaussian or Result, got {type(q0).__name__}")
    hint = "; or whiten=True" if not whiten and isinstance(model.prior, AbstractDensePrior) else ""
    model, q0, back = whitening(model, q0, whiten, "fit_minibatch")
    if factor is None:
        factor = q0.factor if q0 is not None else Full()
    if not isinstance(factor, AbstractFactor):
        raise ValueError(f"factor must be a gkl_jax.factors factor, got {type(factor).__name__}")
    sizes = _batch_sizes(model, batch_size)
    if (num_steps is None) == (num_epochs is None):
        raise ValueError("pass exactly one of num_steps and num_epochs")
    total = sum(num_sites(s, model.dim) for s in model.sites)
    if num_epochs is not None:
        num_epochs = check_tol(num_epochs, "num_epochs")
        largest = max(range(len(sizes)), key=lambda g: num_sites(model.sites[g], model.dim))
        num_steps = max(1, int(round(num_epochs * num_sites(model.sites[largest], model.dim) / sizes[largest])))
    num_steps = check_max_steps(num_steps, "num_steps")
    if optimizer is None:
        optimizer = _default_optimizer(num_steps, check_tol(learning_rate, "learning_rate"))
    elif not isinstance(optimizer, optax.GradientTransformation):
        raise ValueError(f"optimizer must be an optax.GradientTransformation, got {type(optimizer).__name__}")
    key = jax.random.key(0) if key is None else check_key(key)
    chunks = tuple(_chunk_sizes(model, chunk_size))
    q_init = _initial_q(model, factor, q0)
    tol = 1e-3 if tol is None else check_tol(tol)
    try:
        q, log_z, grad_max, bad_steps, history = _fit_minibatch_jit(model, q_init, key, optimizer, sizes, chunks,
                                                                    num_steps, q0 is None, callback)
    except jax.errors.JaxRuntimeError as e:     # a progress callable that raised: its own exception
        reraise_callback_error(callback, e)
        raise
    converged = (grad_max / total <= tol) & jnp.isfinite(log_z) & (bad_steps == 0)
    if callback is not None:
        code = jnp.where(converged, RESULTS.successful,
                         jnp.where(jnp.isfinite(log_z), RESULTS.max_steps_reached, RESULTS.nonfinite))
        report_done(callback, "minibatch", num_steps, log_z, grad_max / total, code)
    if is_concrete(converged) and not bool(converged):
        why = (f"{int(bad_steps)} steps had a non-finite gradient estimate and were skipped; "
               if int(bad_steps) else "")
        warnings.warn(f"gkl_jax.fit_minibatch: after {num_steps} steps {why}the full-data gradient has "
                      f"max|grad|/N = {float(grad_max) / total:.3g} > tol={tol:g}; the result is a valid bound but "
                      f"not the optimum (more steps, a smaller final step, or gkl_jax.fit(model, q0=result.q){hint})",
                      stacklevel=2)
    return Result(q=back(q), log_z=log_z, converged=converged, num_steps=jnp.asarray(num_steps), history=history,
                  method="gkl-minibatch")


def _diagonal_precision(model: Model, q: Gaussian, indices):
    """Minibatch estimate of diag(Lambda), Lambda = Sigma^{-1} + sum_g H_g^T Gamma_g H_g (eq. 10) at q, with
    Gamma_n = -2 dI_n/d(s_n^2): the precision the diagonal factor's fixed point would take."""
    lam = jnp.zeros(model.dim, q.mean.dtype) if model.prior is None else model.prior.precision_diagonal()
    for sites, idx in zip(model.sites, indices):
        part = take_sites(sites, idx, model.dim)
        m, s2 = part.project(q)
        gamma = -2 * jax.grad(lambda v: jnp.sum(part.potential.expected_log_phi(m, v)))(s2)
        lam = lam + (num_sites(sites, model.dim) / idx.shape[0]) * part.operator(model.dim).sq_rmv(gamma)
    return lam


def _scaled_start(model, q, key, sizes, estimate):
    """The start (q with, if `estimate`, its variances shrunk to a minibatch estimate of the fixed-point
    variances 1 / Lambda_jj) and the scale s of the factor parameters (geometric mean posterior std)."""
    variances = q.factor.marginal_variances()
    if estimate:
        keys = jax.random.split(key, len(sizes))
        indices = [jax.random.permutation(k, num_sites(sites, model.dim))[:b]
                   for k, sites, b in zip(keys, model.sites, sizes)]
        lam = _diagonal_precision(model, q, indices)
        good = jnp.isfinite(lam) & (lam > 0)
        variances = jnp.where(good, jnp.minimum(variances, 1 / jnp.where(good, lam, 1.0)), variances)
        q = Gaussian(q.mean, q.factor.initialise(model.dim, variances))
    return q, jnp.exp(0.5 * jnp.mean(jnp.log(variances)))


@program
def _fit_minibatch_jit(model, q_init, key, optimizer, sizes, chunks, num_steps, estimate, progress=None):
    TRACE_COUNT["fit_minibatch"] += 1
    frozen, q_init = stop_gradients((model, q_init))
    key, start_key = jax.random.split(key)
    q_init, scale = _scaled_start(frozen, q_init, start_key, sizes, estimate)
    params0, static = eqx.partition(q_init, eqx.is_inexact_array)
    flat0, unravel = ravel_pytree(params0)
    # The optimiser works on phi = x / units: the mean in its own units, the factor in units of `scale`.
    units_tree = jax.tree.map(lambda a: jnp.full_like(a, scale), params0)
    units, _ = ravel_pytree(eqx.tree_at(lambda p: p.mean, units_tree, jnp.ones_like(params0.mean)))
    to_q = lambda flat: eqx.combine(unravel(flat), static)
    counts = [num_sites(s, model.dim) for s in model.sites]
    per_epoch = [n // b for n, b in zip(counts, sizes)]

    def loss(phi, indices):
        return -minibatch_bound(frozen, to_q(units * phi), indices)

    value_and_grad = jax.value_and_grad(loss)

    def step(carry, k):
        phi, opt_state, perms, key, bad = carry
        key, *subkeys = jax.random.split(key, len(counts) + 1)
        new_perms, indices = [], []
        for g, (n, b, e) in enumerate(zip(counts, sizes, per_epoch)):
            pos = k % e
            perm = lax.cond(pos == 0, lambda kk, p=perms[g]: jax.random.permutation(kk, p),
                            lambda kk, p=perms[g]: p, subkeys[g])
            new_perms.append(perm)
            indices.append(lax.dynamic_slice_in_dim(perm, pos * b, b))
        v, g = value_and_grad(phi, indices)
        ok = jnp.isfinite(v) & jnp.all(jnp.isfinite(g))
        g = jnp.where(ok, g, 0.0)
        updates, new_state = optimizer.update(g, opt_state, phi)
        phi_new = optax.apply_updates(phi, updates)
        ok = ok & jnp.all(jnp.isfinite(phi_new))
        phi = jnp.where(ok, phi_new, phi)
        opt_state = jax.tree.map(lambda a, b: jnp.where(ok, a, b), new_state, opt_state)
        if progress is not None:
            report_step(progress, "minibatch", k, num_steps, -v, jnp.max(jnp.abs(g)) / sum(counts))
        return (phi, opt_state, tuple(new_perms), key, bad + (~ok).astype(jnp.int32)), -v

    phi0 = flat0 / units
    perms0 = tuple(jnp.arange(n, dtype=jnp.int32) for n in counts)
    carry0 = (phi0, optimizer.init(phi0), perms0, key, jnp.zeros((), jnp.int32))
    (phi, _, _, _, bad), estimates = lax.scan(step, carry0, jnp.arange(num_steps))
    x = units * phi
    # x carries no derivative (frozen model, stop-gradient start), so log_z is differentiable in the model only.
    log_z, full_grad = jax.value_and_grad(lambda f: bound_chunked(model, to_q(f), chunks))(x)
    history = jnp.concatenate([estimates.astype(log_z.dtype), log_z[None]])
    return to_q(x), log_z, jnp.max(jnp.abs(full_grad)), bad, history
