"""Writes notebooks/05_gp_classification.ipynb (and, with --execute, runs it in the full setting).

    python notebooks/_build_05.py --execute

Edit the cells here, not in the .ipynb, so that the notebook stays reviewable as plain Python.
"""

import sys

import _nbbuild

CELLS = [
    ("md", """# GP classification: decision surfaces, calibration, and a sparse GP

Binary GP classification $p(f) = \\mathcal{GP}(0, k)$, $p(y_n \\mid f_n) = \\Phi(y_n f_n)$ (probit), with three
Gaussian approximations on the same `Model`: Laplace (`gk.laplace`), expectation propagation (`gk.ep`) and G-KL
(`gk.fit`); predictions $p(y_* = 1) = \\Phi(\\mu_* / \\sqrt{1 + \\sigma_*^2})$ through `gk.gp.predict` (App. F.1).
Then a sparse G-KL GP with $M$ inducing points on a larger data set: the sites project with
$h_n = K_{zz}^{-1} k_{zn}$ plus the extra variance $k_{nn} - q_{nn}$, so the same `gk.fit` runs it.
Set `GKL_SMALL=1` for the small setting used by the test suite."""),
    ("code", """import os
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import make_moons

import gkl_jax as gk

SMALL = os.environ.get("GKL_SMALL", "0") == "1"
N, N_BIG, M = (80, 1000, 20) if SMALL else (200, 20000, 100)
print("small setting" if SMALL else "full setting", f"| N = {N}, sparse N = {N_BIG}, M = {M}")"""),
    ("md", """## Data and one model, three approximations"""),
    ("code", """X, y = make_moons(N, noise=0.25, random_state=0)
y = 2.0 * y - 1
X_test, y_test = make_moons(2000, noise=0.25, random_state=1)
y_test = 2.0 * y_test - 1

kernel = gk.kernels.SquaredExponential(variance=4.0, lengthscale=0.6)
model = gk.gp.model(kernel, X, gk.potentials.Probit(y))
results = {}
for name, method in (("Laplace", gk.laplace), ("EP", gk.ep), ("G-KL", gk.fit)):
    t0 = time.perf_counter()
    results[name] = method(model)
    print(f"{name:8s} log Z estimate {float(results[name].log_z):8.3f}  converged {bool(results[name].converged)}"
          f"  ({time.perf_counter() - t0:.2f} s, compilation included)")
print("G-KL is a lower bound; the Jensen bound at each method's q:",
      {k: round(float(gk.bound(model, r.q)), 3) for k, r in results.items()})"""),
    ("md", """## Decision surfaces

The G-KL predictive probability as a colour map; the $p = 0.5$ contour of every method."""),
    ("code", """g = np.linspace(-1.8, 2.8, 80)
G1, G2 = np.meshgrid(g, np.linspace(-1.3, 1.8, 60))
grid = np.column_stack([G1.ravel(), G2.ravel()])
probs = {k: np.asarray(gk.gp.predict(r, model.prior, grid, gk.potentials.Probit(np.ones(len(grid)))).probability)
         for k, r in results.items()}

fig, ax = plt.subplots(figsize=(7, 4.5))
cs = ax.contourf(G1, G2, probs["G-KL"].reshape(G1.shape), levels=np.linspace(0, 1, 11), cmap="RdBu_r", alpha=0.7)
for (name, p), colour in zip(probs.items(), ("tab:green", "tab:orange", "k")):
    ax.contour(G1, G2, p.reshape(G1.shape), levels=[0.5], colors=colour, linewidths=1.5)
    ax.plot([], [], color=colour, label=f"{name} p = 0.5")
ax.scatter(*X[y > 0].T, s=10, c="tab:red")
ax.scatter(*X[y < 0].T, s=10, c="tab:blue")
fig.colorbar(cs, label="G-KL p(y = +1)")
ax.legend(loc="lower left")
plt.show()"""),
    ("md", """## Calibration on held-out data

Reliability diagram (observed frequency of $y = +1$ per bin of predicted probability), test log likelihood and
the information score (thesis Ch. 4.12.1; 1 bit is perfect, 0 is guessing)."""),
    ("code", """def information(p, yt, ytr):
    p = np.clip(p, 1e-12, 1 - 1e-12)
    base = -sum(np.mean(yt == c) * np.log2(np.mean(ytr == c)) for c in (-1.0, 1.0))
    return base + np.mean((1 + yt) * np.log2(p) + (1 - yt) * np.log2(1 - p)) / 2

bins = np.linspace(0, 1, 11)
fig, ax = plt.subplots(figsize=(5, 4.5))
ax.plot([0, 1], [0, 1], "k:", lw=1)
for name, r in results.items():
    pred = gk.gp.predict(r, model.prior, X_test, gk.potentials.Probit(y_test))
    p = np.asarray(pred.probability)
    idx = np.digitize(p, bins[1:-1])
    centres = [p[idx == b].mean() for b in range(10) if np.any(idx == b)]
    freq = [np.mean(y_test[idx == b] > 0) for b in range(10) if np.any(idx == b)]
    ax.plot(centres, freq, "o-", label=name)
    print(f"{name:8s} test log lik {float(jnp.mean(pred.log_density)):.4f}  information {information(p, y_test, y):.3f}"
          f" bits  error {np.mean(np.where(p > 0.5, 1, -1) != y_test):.3f}")
ax.set(xlabel="predicted p(y = +1)", ylabel="observed frequency", title="reliability")
ax.legend()
plt.show()"""),
    ("md", """## A sparse G-KL GP on a larger data set

$M$ inducing inputs (a random subset of the data) summarise $N$ points; the bound is the sparse variational one,
`gk.gp.sparse_model` returns an ordinary `Model` whose prior is the GP over $u = f(Z)$, and predictions use the
same `gk.gp.predict` with that prior. Z could be learned with `gk.gp.fit_hyperparameters` like any other
hyperparameter (the build function takes it as an argument)."""),
    ("code", """X_big, y_big = make_moons(N_BIG, noise=0.25, random_state=2)
y_big = 2.0 * y_big - 1
Z = X_big[np.random.default_rng(0).choice(N_BIG, M, replace=False)]
t0 = time.perf_counter()
sparse = gk.gp.sparse_model(kernel, X_big, Z, gk.potentials.Probit(y_big))
res_sparse = gk.fit(sparse)
secs = time.perf_counter() - t0
pred = gk.gp.predict(res_sparse, sparse.prior, X_test, gk.potentials.Probit(y_test))
p = np.asarray(pred.probability)
print(f"sparse G-KL: N = {N_BIG}, M = {M}: {secs:.1f} s, bound {float(res_sparse.log_z):.1f}, "
      f"converged {bool(res_sparse.converged)}; test error {np.mean(np.where(p > 0.5, 1, -1) != y_test):.3f}, "
      f"test log lik {float(jnp.mean(pred.log_density)):.4f}")

p_grid = np.asarray(gk.gp.predict(res_sparse, sparse.prior, grid).mean)
fig, ax = plt.subplots(figsize=(7, 4.5))
ax.contourf(G1, G2, p_grid.reshape(G1.shape), levels=20, cmap="RdBu_r", alpha=0.7)
ax.contour(G1, G2, p_grid.reshape(G1.shape), levels=[0.0], colors="k")
sub = np.random.default_rng(1).choice(N_BIG, min(N_BIG, 1500), replace=False)
ax.scatter(*X_big[sub].T, s=2, c=np.where(y_big[sub] > 0, "tab:red", "tab:blue"), alpha=0.4)
ax.scatter(*Z.T, marker="x", c="k", s=30, label="inducing inputs Z")
ax.set(title="sparse G-KL latent mean and the decision boundary")
ax.legend(loc="lower left")
plt.show()"""),
    ("md", """The full comparison of LA, EP, KL (G-KL), VB, FV and LR on the thesis' UCI data sets, with AIS ground truth,
and the timing against scikit-learn's `GaussianProcessClassifier` are in `benchmarks/gp_classification.py`."""),
]


def build():
    """The notebook, without outputs."""
    return _nbbuild.build(CELLS)


def main(argv=None) -> int:
    return _nbbuild.main(CELLS, "05_gp_classification.ipynb", __doc__.splitlines()[0], argv, timeout=900)


if __name__ == "__main__":
    sys.exit(main())
