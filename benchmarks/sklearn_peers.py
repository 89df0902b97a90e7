"""gkl_jax.sklearn estimators beside their scikit-learn counterparts on scikit-learn's bundled data.

Pairs (every model behind a StandardScaler in a Pipeline, the same random splits for both):

    breast cancer (569 x 30, 75/25)    BayesianLogisticRegression      vs LogisticRegression
    wine (178 x 13, 3 classes)         BayesianLogisticRegression (OvR) vs LogisticRegression (multinomial)
                                       MulticlassGPClassifier          vs GaussianProcessClassifier (OvR),
                                       only with --multiclass-gp (its ML-II compiles for many minutes)
    two moons (200, noise 0.25)        GPClassifier                    vs GaussianProcessClassifier
    diabetes (442 x 10), 10% of the    BayesianRegression(student-t)   vs BayesianRidge, HuberRegressor
    training targets shifted by        BayesianRegression(laplace)     vs HuberRegressor
                                       BayesianRegression(gaussian)    vs BayesianRidge
    +-4 sd (test targets clean)        GPRegressor (gaussian)          vs GaussianProcessRegressor
                                       GPRegressor(laplace), (student-t), only with --robust-gp (G-KL over
                                       331 latent values with ML-II)
    diabetes (clean)                   BayesianRegression(gaussian)    vs BayesianRidge (the same splits
                                       without outliers: the same model, plug-in intercept included)

Per split: accuracy (classifiers) or RMSE, the mean test log-likelihood (log p(y_* | x_*): the predictive
probability of the true class, or the predictive density; HuberRegressor has no predictive distribution and is
given N(y | prediction, scale_^2), its own scale estimate), the expected calibration error of classifiers (10
equal-width bins of the top-class probability) and the fit time. Cold = the first split's fit (our estimators
compile there), warm = the median over the later splits (same training size: no compilation). All in one run on
one machine. Writes benchmarks/out/sklearn_peers.json and prints a table.

Run: python benchmarks/sklearn_peers.py            # 10 splits
     python benchmarks/sklearn_peers.py --quick    # 3 splits
"""

import argparse
import json
import os
import platform
import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402
from sklearn.datasets import load_breast_cancer, load_diabetes, load_wine, make_moons  # noqa: E402
from sklearn.gaussian_process import GaussianProcessClassifier, GaussianProcessRegressor  # noqa: E402
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel  # noqa: E402
from sklearn.linear_model import BayesianRidge, HuberRegressor, LogisticRegression  # noqa: E402
from sklearn.model_selection import ShuffleSplit, StratifiedShuffleSplit  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

from gkl_jax.sklearn import (  # noqa: E402
    BayesianLogisticRegression,
    BayesianRegression,
    GPClassifier,
    GPRegressor,
    MulticlassGPClassifier,
)


def ece(proba, y_idx, bins=10):
    conf = proba.max(axis=1)
    correct = proba.argmax(axis=1) == y_idx
    edges = np.linspace(0, 1, bins + 1)
    total = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (conf > lo) & (conf <= hi)
        if sel.any():
            total += sel.mean() * abs(correct[sel].mean() - conf[sel].mean())
    return total


def classification_metrics(model, X, y):
    proba = model.predict_proba(X)
    idx = np.searchsorted(model.classes_, y)
    ll = np.mean(np.log(np.clip(proba[np.arange(len(y)), idx], 1e-300, None)))
    return {"accuracy": float(np.mean(proba.argmax(axis=1) == idx)), "test_ll": float(ll), "ece": ece(proba, idx)}


def regression_metrics(model, X, y):
    est = model[-1]
    if isinstance(est, HuberRegressor):
        mean = model.predict(X)
        ll = stats.norm.logpdf(y, mean, est.scale_)
    elif isinstance(est, (BayesianRegression, GPRegressor)):
        mean = model.predict(X)
        ll = est.log_predictive_density(model[:-1].transform(X), y)
    else:   # BayesianRidge, GaussianProcessRegressor: Gaussian predictive
        mean, sd = model.predict(X, return_std=True)
        ll = stats.norm.logpdf(y, mean, sd)
    return {"rmse": float(np.sqrt(np.mean((mean - y) ** 2))), "test_ll": float(np.mean(ll))}


def tasks(multiclass_gp=False, robust_gp=False):
    Xb, yb = load_breast_cancer(return_X_y=True)
    Xw, yw = load_wine(return_X_y=True)
    Xm, ym = make_moons(200, noise=0.25, random_state=0)
    Xd, yd = load_diabetes(return_X_y=True)
    sk_gpc = lambda: GaussianProcessClassifier(1.0 * RBF(1.0), random_state=0)
    sk_gpr = lambda: GaussianProcessRegressor(ConstantKernel(1.0) * RBF(1.0) + WhiteKernel(0.1), normalize_y=True,
                                              random_state=0)
    return [
        ("breast cancer", Xb, yb, "clf", [("BayesianLogisticRegression", BayesianLogisticRegression),
                                          ("LogisticRegression", LogisticRegression)]),
        ("wine", Xw, yw, "clf", [("BayesianLogisticRegression (OvR)", BayesianLogisticRegression),
                                 ("LogisticRegression", LogisticRegression)]
         + ([("MulticlassGPClassifier", MulticlassGPClassifier), ("GaussianProcessClassifier", sk_gpc)]
            if multiclass_gp else [])),
        ("two moons", Xm, ym, "clf", [("GPClassifier", GPClassifier), ("GaussianProcessClassifier", sk_gpc)]),
        ("diabetes + outliers", Xd, yd, "reg", [("BayesianRegression(student-t)",
                                                 lambda: BayesianRegression("student-t")),
                                                ("BayesianRegression(laplace)", lambda: BayesianRegression("laplace")),
                                                ("BayesianRegression(gaussian)", BayesianRegression),
                                                ("BayesianRidge", BayesianRidge), ("HuberRegressor", HuberRegressor),
                                                ("GPRegressor", GPRegressor), ("GaussianProcessRegressor", sk_gpr)]
         + ([("GPRegressor(laplace)", lambda: GPRegressor(likelihood="laplace")),
             ("GPRegressor(student-t)", lambda: GPRegressor(likelihood="student-t"))] if robust_gp else [])),
        # the same splits without outliers: the two Gaussian models are the same (BayesianRidge's plug-in
        # intercept), so their test log-likelihoods agree to the ML-II tolerances
        ("diabetes (clean)", Xd, yd, "reg", [("BayesianRegression(gaussian)", BayesianRegression),
                                             ("BayesianRidge", BayesianRidge)]),
    ]


def run(num_splits, multiclass_gp=False, only=None, on_task=None, skip=(), robust_gp=False):
    results = []
    for name, X, y, kind, models in tasks(multiclass_gp, robust_gp):
        if only and name not in only:
            continue
        models = [(m, make) for m, make in models if m not in skip]
        splitter = (StratifiedShuffleSplit if kind == "clf" else ShuffleSplit)(num_splits, test_size=0.25,
                                                                               random_state=0)
        per_model = {m: {"metrics": [], "times": []} for m, _ in models}
        for s, (tr, te) in enumerate(splitter.split(X, y)):
            ytr = y[tr].astype(float) if kind == "reg" else y[tr]
            if "outliers" in name:   # 10% of the training targets shifted by +-4 sd; test targets clean
                rng = np.random.default_rng(s)
                bad = rng.choice(len(tr), len(tr) // 10, replace=False)
                ytr = ytr.copy()
                ytr[bad] += rng.choice([-4.0, 4.0], len(bad)) * np.std(y)
            for m, make in models:
                pipe = make_pipeline(StandardScaler(), make())
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    t0 = time.perf_counter()
                    pipe.fit(X[tr], ytr)
                    dt = time.perf_counter() - t0
                    metrics = (classification_metrics if kind == "clf" else regression_metrics)(pipe, X[te], y[te])
                per_model[m]["metrics"].append(metrics)
                per_model[m]["times"].append(dt)
            print(f"  {name}: split {s + 1}/{num_splits} done", flush=True)
        for m, rec in per_model.items():
            keys = rec["metrics"][0].keys()
            summary = {k: float(np.mean([r[k] for r in rec["metrics"]])) for k in keys}
            summary.update({k + "_se": float(np.std([r[k] for r in rec["metrics"]]) / np.sqrt(num_splits))
                            for k in keys})
            summary["fit_cold_s"] = rec["times"][0]
            summary["fit_warm_s"] = float(np.median(rec["times"][1:])) if num_splits > 1 else rec["times"][0]
            results.append({"data": name, "model": m, **summary, "per_split": rec})
        if on_task is not None:
            on_task(results)
    return results


def table(results):
    lines = [f"{'data':22s} {'model':34s} {'acc/RMSE':>9s} {'test LL':>15s} {'ECE':>6s} {'cold s':>7s} "
             f"{'warm s':>7s}"]
    for r in results:
        score = f"{r['accuracy']:.3f}" if "accuracy" in r else f"{r['rmse']:.1f}"
        ll = f"{r['test_ll']:.3f}+-{r['test_ll_se']:.3f}"
        e = f"{r['ece']:.3f}" if "ece" in r else "-"
        lines.append(f"{r['data']:22s} {r['model']:34s} {score:>9s} {ll:>15s} {e:>6s} {r['fit_cold_s']:7.3f} "
                     f"{r['fit_warm_s']:7.3f}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 splits instead of 10")
    parser.add_argument("--splits", type=int, default=None)
    parser.add_argument("--multiclass-gp", action="store_true",
                        help="add MulticlassGPClassifier vs GaussianProcessClassifier on wine (its ML-II loop "
                             "compiles for many minutes on a small CPU)")
    parser.add_argument("--robust-gp", action="store_true",
                        help="add GPRegressor(laplace) and GPRegressor(student-t) on diabetes (slow: see above)")
    parser.add_argument("--only", default=None, help="comma-separated data set names")
    parser.add_argument("--out", default="sklearn_peers.json", help="file name under benchmarks/out/")
    parser.add_argument("--skip", default="", help="comma-separated model names to leave out")
    args = parser.parse_args()
    num = args.splits or (3 if args.quick else 10)
    if num < 2:
        parser.error("--splits must be >= 2 (the warm time is the median over the splits after the first)")
    start = time.perf_counter()
    os.makedirs(os.path.join(os.path.dirname(__file__), "out"), exist_ok=True)
    path = os.path.join(os.path.dirname(__file__), "out", args.out)

    def save(results):   # after every data set, so that a long run leaves its finished part
        text = table(results)
        with open(path, "w") as f:
            json.dump({"splits": num, "machine": platform.platform(), "cpus": os.cpu_count(),
                   "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "wall_s": time.perf_counter() - start, "results": results, "table": text}, f, indent=1)
        return text

    results = run(num, args.multiclass_gp, args.only.split(",") if args.only else None, save,
                  tuple(filter(None, args.skip.split(","))), args.robust_gp)
    print(save(results))
    print(f"wrote {path} ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
