"""`gkl-jax demo`: Bayesian logistic regression on the bundled UCI ionosphere data.

Set-up: the 34 inputs standardised with the training mean and sd (the constant column pulse01_im stays 0), plus
a bias column; prior N(0, I); a random 2/3 train / 1/3 test split drawn with `seed`. Three posteriors:

- G-KL with the Full Cholesky factor and with the Diagonal factor (`gkl_jax.fit`, default solver and tol);
- the MAP estimate, by damped Newton iterations on the log joint (jitted JAX, independent of `gkl_jax.fit`).

Predictions: for G-KL, p(y | x) = E_q[sigmoid(y w^T x)] with a = w^T x ~ N(m_n, s_n^2), computed by 64-node
Gauss-Hermite quadrature in 1-D (no probit approximation); for MAP, the plug-in sigmoid(y w_map^T x).
"""

import os
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from ._cli_common import DEMO_DIR, prepare_output_dir
from ._optim import backtrack
from ._progress import Progress

PNG_NAME = "gkl_jax_demo.png"
PRIOR_VARIANCE = 1.0
_GH_POINTS = 64


def predictive_probability(m_n, s2_n, y, num_points: int = _GH_POINTS):
    """p(y_n | x_n) = E[sigmoid(y_n a)], a ~ N(m_n, s_n^2), by Gauss-Hermite quadrature (numpy arrays)."""
    if int(num_points) < 1:
        raise ValueError(f"num_points must be >= 1, got {num_points}")
    z, w = np.polynomial.hermite_e.hermegauss(int(num_points))
    w = w / w.sum()
    a = np.asarray(m_n)[:, None] + np.sqrt(np.maximum(np.asarray(s2_n), 0.0))[:, None] * z[None, :]
    return np.sum(w * (1.0 / (1.0 + np.exp(-np.asarray(y)[:, None] * a))), axis=1)


@jax.jit
def map_estimate(H, y, prior_variance):
    """argmax_w sum_n log sigmoid(y_n h_n^T w) - |w|^2 / (2 v) by Newton's method with step halving.

    The log joint is strictly concave, so the damped Newton iteration converges from w = 0. Returns
    (w_map, max |gradient|)."""
    H, y = jnp.asarray(H), jnp.asarray(y)

    def log_joint(w):
        return jnp.sum(jax.nn.log_sigmoid(y * (H @ w))) - 0.5 * jnp.sum(w * w) / prior_variance

    def gradient_and_hessian(w):
        p = jax.nn.sigmoid(y * (H @ w))
        g = H.T @ (y * (1 - p)) - w / prior_variance
        neg_hess = (H.T * (p * (1 - p))) @ H + jnp.eye(H.shape[1], dtype=H.dtype) / prior_variance
        return g, neg_hess

    def newton_step(w, _):
        g, neg_hess = gradient_and_hessian(w)
        step = jnp.linalg.solve(neg_hess, g)
        f0 = log_joint(w)

        # halvings while the log joint drops, down to rho = 2^-34 (the step is taken at the last rho either way)
        rho, _, _ = backtrack(lambda rho: log_joint(w + rho * step), lambda rho, f: ~(f < f0), f0, dtype=H.dtype,
                              max_halvings=34)
        return w + rho * step, None

    w, _ = jax.lax.scan(newton_step, jnp.zeros(H.shape[1], H.dtype), None, length=30)
    return w, jnp.max(jnp.abs(gradient_and_hessian(w)[0]))


def _split(seed):
    from . import datasets

    X, y, names = datasets.load("ionosphere")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(X.shape[0])
    num_train = int(round(2 * X.shape[0] / 3))
    train, test = perm[:num_train], perm[num_train:]
    mean, sd = X[train].mean(axis=0), X[train].std(axis=0)
    Xs = (X - mean) / np.where(sd > 0, sd, 1.0)
    H = np.hstack([Xs, np.ones((X.shape[0], 1))])
    return H[train], y[train], H[test], y[test], list(names) + ["bias"]


def run_demo(output_dir: str = DEMO_DIR, seed: int = 0, progress: bool = True) -> dict:
    """Run the demo, print its table on stdout and write the marginals plot to `output_dir`.

    Returns a dict with the table rows (method, log_z, accuracy, test_log_lik, num_steps, converged, fit_seconds,
    warm_seconds), the posterior summaries per weight and the PNG path (None when matplotlib is missing)."""
    import gkl_jax as gk

    prepare_output_dir(output_dir)
    bar = Progress(total=5, enabled=progress)
    bar.step("loading the ionosphere data (UCI) and splitting 2/3 train, 1/3 test")
    H, y, H_test, y_test, names = _split(seed)
    bar.done()
    model = gk.Model(gk.priors.Isotropic(dim=H.shape[1], variance=PRIOR_VARIANCE),
                     gk.Sites(H, gk.potentials.Logistic(y)))
    test_sites = gk.Sites(H_test, gk.potentials.Logistic(y_test))
    rows, summaries = [], {}
    for label, factor in (("G-KL Full", gk.factors.Full()), ("G-KL Diagonal", gk.factors.Diagonal())):
        bar.step(f"fitting {label} (first call includes JIT compilation)")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = gk.fit(model, factor=factor)
            jax.block_until_ready(result.log_z)
            fit_seconds = bar.done()
            start = time.perf_counter()
            jax.block_until_ready(gk.fit(model, factor=factor).log_z)
            warm_seconds = time.perf_counter() - start
        m_n, s2_n = test_sites.project(result.q)
        p = predictive_probability(m_n, s2_n, y_test)
        rows.append(dict(method=label, log_z=float(result.log_z), accuracy=float(np.mean(p > 0.5)),
                         test_log_lik=float(np.mean(np.log(p))), num_steps=int(result.num_steps),
                         converged=bool(result.converged), fit_seconds=fit_seconds, warm_seconds=warm_seconds))
        summaries[label] = (np.asarray(result.q.mean), np.sqrt(np.asarray(result.q.marginal_variances())))

    bar.step("MAP estimate by Newton's method (jitted JAX)")
    w_map, grad_max = map_estimate(H, y, PRIOR_VARIANCE)
    w_map = np.asarray(w_map)
    map_seconds = bar.done()
    start = time.perf_counter()
    jax.block_until_ready(map_estimate(H, y, PRIOR_VARIANCE))
    p_map = 1.0 / (1.0 + np.exp(-y_test * (H_test @ w_map)))
    rows.append(dict(method="MAP (Newton)", log_z=None, accuracy=float(np.mean(p_map > 0.5)),
                     test_log_lik=float(np.mean(np.log(p_map))), num_steps=30,
                     converged=bool(grad_max < 1e-8), fit_seconds=map_seconds,
                     warm_seconds=time.perf_counter() - start))

    bar.step("plotting the posterior marginals")
    png = _plot(os.path.join(output_dir, PNG_NAME), names, summaries, w_map)
    bar.done()
    _print_table(rows, H.shape, H_test.shape[0], seed)
    if png is None:
        print("\nmatplotlib is not installed: skipped the plot (pip install 'gkl-jax[plot]').")
    else:
        print(f"\nposterior marginals (mean +- 2 sd) and the MAP estimate: {png}")
    return {"rows": rows, "names": names, "summaries": summaries, "w_map": w_map, "png": png}


def _print_table(rows, train_shape, num_test, seed):
    print(f"Bayesian logistic regression on UCI ionosphere: {train_shape[0]} train / {num_test} test points "
          f"(seed {seed}), D = {train_shape[1]} (34 standardised inputs + bias), prior N(0, I)\n")
    header = (f"{'method':<15} {'log Z bound':>12} {'test acc':>9} {'test log-lik':>13} {'steps':>6} "
              f"{'converged':>10} {'fit [s]':>8} {'warm [s]':>9}")
    print(header)
    print("-" * len(header))
    for r in rows:
        bound = "-" if r["log_z"] is None else f"{r['log_z']:.4f}"
        print(f"{r['method']:<15} {bound:>12} {r['accuracy']:>9.4f} {r['test_log_lik']:>13.4f} "
              f"{r['num_steps']:>6d} {'yes' if r['converged'] else 'no':>10} {r['fit_seconds']:>8.2f} "
              f"{r['warm_seconds']:>9.3f}")
    print("\ntest log-lik: mean log p(y|x) per test point. G-KL rows: p(y|x) = E_q[sigmoid(y w^T x)] by 64-node "
          "Gauss-Hermite\nquadrature over a = w^T x ~ N(m_n, s_n^2); MAP row: plug-in sigmoid(y w_map^T x). "
          "fit [s]: first call,\nincluding JIT compilation (or, on a later run, loading the compiled program "
          "from the cache); warm [s]: a second,\ncompiled call.")


def _plot(path, names, summaries, w_map):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(13, 4.8), layout="constrained")
    ax = fig.add_subplot()
    index = np.arange(len(names))
    for offset, (label, (mean, sd)), color in zip((-0.2, 0.2), summaries.items(), ("C0", "C1")):
        ax.errorbar(index + offset, mean, yerr=2 * sd, fmt="o", ms=3.5, capsize=2, color=color,
                    label=f"{label}: mean ± 2 sd")
    ax.plot(index, w_map, "kx", ms=6, label="MAP")
    ax.axhline(0.0, color="0.7", lw=0.8)
    ax.set_xticks(index, names, rotation=90, fontsize=7)
    ax.set_ylabel("weight")
    ax.set_title("Posterior marginals of the logistic regression weights, UCI ionosphere")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return path
