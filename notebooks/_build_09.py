"""Writes notebooks/09_sklearn_estimators.ipynb (and, with --execute, runs it in the full setting to store outputs).

    python notebooks/_build_09.py --execute

Edit the cells here, not in the .ipynb, so that the notebook stays reviewable as plain Python.
"""

import sys

import _nbbuild

CELLS = [
    ("md", """# scikit-learn estimators: G-KL inside a Pipeline and GridSearchCV

`gkl_jax.sklearn` wraps G-KL inference in ordinary scikit-learn estimators (`fit`/`predict`/`predict_proba`,
`get_params`/`set_params`, `clone`), so they drop into pipelines, grid searches and cross-validation:

* `BayesianLogisticRegression`: a Gaussian posterior $q(w) = \\mathcal{N}(m, S)$ over the weights; `predict_proba` is
  the **predictive integral** $\\mathbb{E}_q[\\sigma(x^\\top w)]$ (one-dimensional quadrature over
  $x^\\top w \\sim \\mathcal{N}(x^\\top m, x^\\top S x)$), not the plug-in $\\sigma(x^\\top m)$; `coef_std_` is the
  posterior sd, `log_evidence_` the G-KL lower bound on $\\log p(y \\mid X)$;
* `BayesianRegression` (Gaussian, Student-t, Laplace likelihoods), `GPClassifier`, `GPRegressor`,
  `MulticlassGPClassifier`.

Here: a `Pipeline` with `StandardScaler`, a `GridSearchCV` over the prior variance (against ML-II on the bound),
and a calibration plot against scikit-learn's `LogisticRegression` on the breast-cancer data. The estimators
compute in float64 whatever the global JAX setting. `GKL_SMALL=1` selects the small setting the test suite runs."""),
    ("code", """import os
import time

import matplotlib.pyplot as plt
import numpy as np
from sklearn.calibration import calibration_curve
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, log_loss
from sklearn.model_selection import GridSearchCV, train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from gkl_jax.sklearn import BayesianLogisticRegression

SMALL = os.environ.get("GKL_SMALL", "0") == "1"
X, y = load_breast_cancer(return_X_y=True)
if SMALL:
    X, y = X[:240, :10], y[:240]
X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.4, random_state=0, stratify=y)
print(X_train.shape, X_test.shape)
start = time.perf_counter()"""),
    ("md", """## A pipeline

The first fit compiles the G-KL solver for this data size (seconds); later fits of similar size reuse it (the
design matrix is padded to power-of-two sizes with rows and columns that leave the posterior and the evidence
unchanged)."""),
    ("code", """model = make_pipeline(StandardScaler(), BayesianLogisticRegression(prior_variance=1.0))
t = time.perf_counter()
model.fit(X_train, y_train)
print(f"first fit {time.perf_counter() - t:.1f} s (compiles)")
t = time.perf_counter()
model.fit(X_train, y_train)
print(f"second fit {time.perf_counter() - t:.3f} s")
blr = model[-1]
print("test accuracy", accuracy_score(y_test, model.predict(X_test)))
print("log evidence (bound)", round(blr.log_evidence_, 3), " converged:", blr.converged_)
top = np.argsort(-np.abs(blr.coef_[0]))[:5]
for j in top:
    print(f"feature {j:2d}: {blr.coef_[0, j]: .3f} +- {blr.coef_std_[0, j]:.3f}")"""),
    ("md", """## Choosing the prior variance: cross-validation or the evidence

`GridSearchCV` treats `prior_variance` like any hyperparameter (scored here by the test log-loss of the predictive
probabilities). The Bayesian alternative needs no held-out data: `learn_prior_variance=True` maximises the bound
$\\log p(y \\mid X) \\geq \\mathcal{B}$ over it (ML-II)."""),
    ("code", """grid = [0.1, 1.0, 10.0] if SMALL else [0.03, 0.1, 0.3, 1.0, 3.0, 10.0]
search = GridSearchCV(make_pipeline(StandardScaler(), BayesianLogisticRegression()),
                      {"bayesianlogisticregression__prior_variance": grid}, cv=3, scoring="neg_log_loss")
search.fit(X_train, y_train)
for v, s in zip(grid, search.cv_results_["mean_test_score"]):
    print(f"prior variance {v:6.2f}: CV log-loss {-s:.4f}")
print("GridSearchCV picks", search.best_params_)
ml2 = make_pipeline(StandardScaler(), BayesianLogisticRegression(learn_prior_variance=True)).fit(X_train, y_train)
print(f"ML-II on the bound picks prior variance {ml2[-1].prior_variance_:.3f} "
      f"(log evidence {ml2[-1].log_evidence_:.3f})")"""),
    ("md", """## Calibration against LogisticRegression

Reliability diagram on the test set: the mean predicted probability in each bin against the fraction of positives.
The G-KL predictive integral shrinks confident predictions where the posterior is uncertain."""),
    ("code", """def ece(p, y, bins=10):
    conf = np.maximum(p, 1 - p)
    correct = (p > 0.5) == (y == 1)
    edges = np.linspace(0.5, 1, bins + 1)
    idx = np.clip(np.digitize(conf, edges) - 1, 0, bins - 1)
    return sum(np.mean(idx == b) * abs(correct[idx == b].mean() - conf[idx == b].mean())
               for b in range(bins) if np.any(idx == b))


models = {"G-KL (ML-II)": ml2, "GridSearchCV G-KL": search.best_estimator_,
          "LogisticRegression": make_pipeline(StandardScaler(), LogisticRegression()).fit(X_train, y_train)}
fig, ax = plt.subplots(figsize=(5, 5))
ax.plot([0, 1], [0, 1], "k:", label="perfect")
for name, m in models.items():
    p = m.predict_proba(X_test)[:, 1]
    frac, mean = calibration_curve(y_test, p, n_bins=5 if SMALL else 8, strategy="quantile")
    ax.plot(mean, frac, "o-", label=name)
    print(f"{name:20s} log-loss {log_loss(y_test, p):.4f}  ECE {ece(p, y_test):.4f}  "
          f"accuracy {accuracy_score(y_test, p > 0.5):.3f}")
ax.set_xlabel("mean predicted probability")
ax.set_ylabel("fraction of positives")
ax.legend()
plt.show()"""),
    ("md", """## GP estimators at the sizes users bring

`GPClassifier` and `GPRegressor` fit a dense GP up to 2000 training rows and switch to a sparse GP above that
(`num_inducing`: M inducing inputs by seeded k-means++ or a random subset, `learn_inducing=True` to learn them in
ML-II); `batch_size=` fits the sparse GP on minibatches instead of full passes, for N up to about 10^6. The dense
route pads the rows to a size bucket with sites that contribute nothing, so a second data set of a nearby size,
or every fold of `cross_val_score`, reuses the first fit's compiled program."""),
    ("code", """from sklearn.model_selection import cross_val_score

from gkl_jax.sklearn import GPClassifier


def two_d(n, seed):
    rng = np.random.default_rng(seed)
    Z = rng.uniform(-3, 3, size=(n, 2))
    return Z, (np.sin(1.5 * Z[:, 0]) + 0.5 * Z[:, 1] + 0.4 * rng.normal(size=n) > 0).astype(int)


n_dense, n_big = (200, 3000) if SMALL else (500, 20000)
Xg, yg = two_d(n_big + 20, 0)
Xt, yt = two_d(2000, 1)
for label, make, rows in [("dense (ML-II)", GPClassifier, n_dense),
                          ("dense, 3 rows fewer: the same bucket", GPClassifier, n_dense - 3),
                          ("sparse, M = 100", lambda: GPClassifier(num_inducing=100), n_big),
                          ("minibatch, M = 100, B = 256", lambda: GPClassifier(num_inducing=100, batch_size=256),
                           n_big)]:
    t = time.perf_counter()
    clf = make().fit(Xg[:rows], yg[:rows])
    print(f"{label:38s} n = {rows:5d}: {time.perf_counter() - t:5.1f} s, test accuracy {clf.score(Xt, yt):.3f}, "
          f"converged {clf.converged_}")
t = time.perf_counter()
scores = cross_val_score(GPClassifier(), Xg[:n_dense], yg[:n_dense], cv=5)
print(f"cross_val_score(cv=5), n = {n_dense}: {time.perf_counter() - t:.1f} s (one compile for the five folds), "
      f"accuracy {scores.mean():.3f}")"""),
    ("md", """## Other estimators

The same protocol holds for the robust regression and GP estimators, e.g.
`BayesianRegression("student-t").fit(X, y).predict(X_new, return_std=True)` or
`GPClassifier().fit(X, y).predict_proba(X_new)` (kernel hyperparameters by ML-II on the bound);
`benchmarks/sklearn_peers.py` compares each with its scikit-learn counterpart."""),
    ("code", """print(f"notebook ran in {time.perf_counter() - start:.0f} s")"""),
]

if __name__ == "__main__":
    sys.exit(_nbbuild.main(CELLS, "09_sklearn_estimators.ipynb", __doc__.splitlines()[0]))
