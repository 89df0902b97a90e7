"""gk.multiclass.GPClassifier (Chai 2012 bound, ML-II) beside scikit-learn's GaussianProcessClassifier.

Both fit their kernel hyper-parameters by maximising their own evidence estimate: ours the variational lower bound
log Z_h* (squared-exponential kernel, variance and lengthscale), scikit-learn's the Laplace approximation with
ConstantKernel() * RBF() (one-vs-rest, one binary GP per class). Inputs are standardised on the training part of
each of `--splits` stratified random 2/3 - 1/3 splits (the same splits for both).

Per split: fit time, test accuracy, mean test log-likelihood (log of the probability given to the true class) for
our two predictive rules (`predict_proba(method="mean")`: softmax of the latent predictive mean, eq. 25, the
default; `method="integrated"`: E[softmax(f_*)] by Monte Carlo) and for scikit-learn's. Cold = the first split's
fit in this process (ours compiles its program for that training size there), warm = the median over the later
splits (same training size: no compilation). Both libraries' modules are imported before the first fit. All in
one run on one machine; the ratios are what count on a shared machine. Writes
benchmarks/out/multiclass_sklearn.json and prints a table.

Run: python benchmarks/multiclass_sklearn.py                       # iris, wine; 10 splits
     python benchmarks/multiclass_sklearn.py --only glass --splits 3
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
from sklearn.datasets import load_digits, load_iris, load_wine  # noqa: E402
from sklearn.gaussian_process import GaussianProcessClassifier  # noqa: E402
from sklearn.gaussian_process.kernels import RBF, ConstantKernel  # noqa: E402
from sklearn.model_selection import StratifiedShuffleSplit  # noqa: E402

import gkl_jax as gk  # noqa: E402
import gkl_jax.multiclass  # noqa: E402,F401  imported before any timing, as scikit-learn's estimator is


def _glass():
    d = gk.datasets.load("glass")
    return d.X, d.y


DATA = {"iris": lambda: load_iris(return_X_y=True), "wine": lambda: load_wine(return_X_y=True),
        "glass": _glass, "digits": lambda: load_digits(return_X_y=True)}


def _loglik(proba, y):
    return float(np.mean(np.log(np.clip(proba[np.arange(len(y)), y], 1e-300, None))))


def run_split(X, y, tr, te):
    mu, sd = X[tr].mean(0), X[tr].std(0)
    sd = np.where(sd > 0, sd, 1.0)
    Xtr, Xte = (X[tr] - mu) / sd, (X[te] - mu) / sd
    row = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = time.perf_counter()
        ours = gk.multiclass.GPClassifier().fit(Xtr, y[tr])
        row["ours_fit_s"] = time.perf_counter() - t
        t = time.perf_counter()
        p_mean = ours.predict_proba(Xte)
        row["ours_predict_s"] = time.perf_counter() - t
        p_int = ours.predict_proba(Xte, method="integrated")
        t = time.perf_counter()
        peer = GaussianProcessClassifier(ConstantKernel() * RBF()).fit(Xtr, y[tr])
        row["sklearn_fit_s"] = time.perf_counter() - t
        p_peer = peer.predict_proba(Xte)
    classes = list(np.unique(y[tr]))
    y_idx = np.array([classes.index(v) for v in y[te]])
    row.update(ours_acc=float(np.mean(p_mean.argmax(1) == y_idx)), ours_ll_mean=_loglik(p_mean, y_idx),
               ours_ll_integrated=_loglik(p_int, y_idx), ours_log_z=ours.log_z_, ours_converged=ours.converged_,
               ours_outer_steps=int(ours.posterior_.num_steps),
               sklearn_acc=float(np.mean(p_peer.argmax(1) == y_idx)), sklearn_ll=_loglik(p_peer, y_idx))
    return row


def summarise(rows):
    med = lambda key: float(np.median([r[key] for r in rows]))
    out = {key: med(key) for key in ("ours_acc", "ours_ll_mean", "ours_ll_integrated", "sklearn_acc", "sklearn_ll",
                                     "ours_predict_s")}
    out.update(ours_cold_s=rows[0]["ours_fit_s"], sklearn_cold_s=rows[0]["sklearn_fit_s"],
               ours_warm_s=float(np.median([r["ours_fit_s"] for r in rows[1:]])),
               sklearn_warm_s=float(np.median([r["sklearn_fit_s"] for r in rows[1:]])),
               converged=sum(bool(r["ours_converged"]) for r in rows))
    out["warm_ratio"] = out["ours_warm_s"] / out["sklearn_warm_s"]
    out["cold_ratio"] = out["ours_cold_s"] / out["sklearn_cold_s"]
    return out


def table(results):
    lines = ["| data (n, d, C) | ours cold / warm s | sklearn cold / warm s | ratio cold / warm | acc ours / sk | "
             "test LL ours mean / integrated / sk |", "|---|---|---|---|---|---|"]
    for name, res in results.items():
        s = res["summary"]
        lines.append(f"| {name} {tuple(res['shape'])} | {s['ours_cold_s']:.1f} / {s['ours_warm_s']:.1f} | "
                     f"{s['sklearn_cold_s']:.1f} / {s['sklearn_warm_s']:.1f} | {s['cold_ratio']:.1f} / "
                     f"{s['warm_ratio']:.1f} | {s['ours_acc']:.3f} / {s['sklearn_acc']:.3f} | "
                     f"{s['ours_ll_mean']:.3f} / {s['ours_ll_integrated']:.3f} / {s['sklearn_ll']:.3f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=int, default=10)
    parser.add_argument("--only", default="iris,wine", help="comma-separated data sets: " + ", ".join(DATA))
    parser.add_argument("--max-train", type=int, default=None, help="subsample the training part (digits)")
    parser.add_argument("--out", default="multiclass_sklearn.json", help="file name under benchmarks/out/")
    args = parser.parse_args()
    names = args.only.split(",")
    if args.splits < 2:
        parser.error("--splits must be >= 2 (the warm time is the median over the splits after the first)")
    if any(n not in DATA for n in names):
        parser.error(f"--only takes names from {list(DATA)}")
    start = time.perf_counter()
    os.makedirs(os.path.join(os.path.dirname(__file__), "out"), exist_ok=True)
    path = os.path.join(os.path.dirname(__file__), "out", args.out)
    results = {}
    for name in names:
        X, y = DATA[name]()
        splitter = StratifiedShuffleSplit(n_splits=args.splits, test_size=1 / 3, random_state=0)
        rows = []
        for tr, te in splitter.split(X, y):
            if args.max_train:
                tr = tr[:args.max_train]
            rows.append(run_split(X, y, tr, te))
            print(name, {k: round(v, 4) if isinstance(v, float) else v for k, v in rows[-1].items()}, flush=True)
        results[name] = {"shape": [len(tr), X.shape[1], len(np.unique(y))], "splits": rows,
                         "summary": summarise(rows)}
        with open(path, "w") as f:
            json.dump({"splits": args.splits, "machine": platform.platform(), "cpus": os.cpu_count(),
                       "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "wall_s": time.perf_counter() - start, "results": results, "table": table(results)},
                      f, indent=1)
    print(table(results))
    print(f"wrote {path} ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
