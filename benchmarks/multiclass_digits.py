"""ML-II of the sparse multinomial-logit GP classifier (Chai 2012, Section 4) on scikit-learn's digits (issue 36).

`gk.multiclass.GPClassifier(num_inducing=s)` (random inducing latents, the estimator's default kernel start and
tolerances) on 1000 training digits (64 inputs standardised on the training part, 10 classes: 10,000 latents), the
other 797 as test set. Two splits: the first 1000 digits, and the first 1000 of a seed-0 permutation. Reports the
fit time (compilation included: one fit per process shape), the bound log Z~_h*, the number of ML-II evaluations'
sweeps, test accuracy and mean test log-likelihood (log of the predicted probability of the true class).

With --synthetic N: the same estimator (s = 200) on a synthetic 2-D 10-class problem of N training points (class =
argmax of 10 smooth random functions + Gumbel noise; 2000 test points), issue 36's "n = 5000, C = 10" scale.

Run: python benchmarks/multiclass_digits.py                 # both splits, s = 100 and 200 (~3 minutes)
     python benchmarks/multiclass_digits.py --inducing 200 --splits first
     python benchmarks/multiclass_digits.py --synthetic 5000
"""

import argparse
import platform
import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import gkl_jax as gk  # noqa: E402


def digits_split(name):
    """(X_train, y_train, X_test, y_test): 1000 training digits ("first" or the first 1000 of a seed-0
    permutation, "permuted"), standardised on the training part; the other 797 as test set."""
    X, y = load_digits(return_X_y=True)
    order = np.arange(len(y)) if name == "first" else np.random.default_rng(0).permutation(len(y))
    tr, te = order[:1000], order[1000:]
    mu, sd = X[tr].mean(0), X[tr].std(0)
    sd = np.where(sd > 0, sd, 1.0)
    return (X[tr] - mu) / sd, y[tr], (X[te] - mu) / sd, y[te]


def synthetic(n, C=10, n_test=2000, seed=0):
    """(X_train, y_train, X_test, y_test) of the 2-D problem of `multiclass_tables.py --timing` with C classes."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n + n_test, 2))
    centres = rng.uniform(-3, 3, size=(12, 2))
    weights = rng.normal(size=(12, C)) * 3
    f = np.exp(-0.5 * ((X[:, None] - centres[None]) ** 2).sum(-1)) @ weights
    y = np.argmax(f + rng.gumbel(size=f.shape) * 0.3, 1)
    return X[:n], y[:n], X[n:], y[n:]


def run(label, Xtr, ytr, Xte, yte, s):
    """Fit GPClassifier(num_inducing=s) and print one table row."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        clf = gk.multiclass.GPClassifier(num_inducing=s).fit(Xtr, ytr)
        seconds = time.perf_counter() - t0
    proba = np.asarray(clf.predict_proba(Xte))
    idx = np.searchsorted(clf.classes_, yte)
    acc = float(np.mean(proba.argmax(1) == idx))
    ll = float(np.mean(np.log(np.clip(proba[np.arange(len(yte)), idx], 1e-300, None))))
    kernel = clf.kernel_
    print(f"| {label} | {s} | {seconds:.1f} | {float(clf.log_z_):.2f} | {acc:.3f} | {ll:.3f} | "
          f"{float(np.exp(kernel.log_variance)):.1f} / {float(np.mean(np.exp(kernel.log_lengthscale))):.1f} | "
          f"{bool(clf.converged_)} |",
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inducing", type=int, nargs="+", default=[100, 200])
    ap.add_argument("--splits", default="first,permuted", help="comma-separated: first, permuted")
    ap.add_argument("--synthetic", type=int, default=None, help="training points of the synthetic 10-class problem")
    args = ap.parse_args()
    print(f"# {platform.node()}, {platform.processor() or platform.machine()}, {time.strftime('%Y-%m-%d %H:%M')}")
    print("| data | inducing | fit s | log Z~ | test acc. | test LL | variance / lengthscale | converged |")
    print("|---|---|---|---|---|---|---|---|")
    if args.synthetic:
        for s in args.inducing:
            run(f"synthetic n = {args.synthetic}, C = 10", *synthetic(args.synthetic), s)
        return
    for name in args.splits.split(","):
        for s in args.inducing:
            run(f"digits ({name} 1000)", *digits_split(name), s)


if __name__ == "__main__":
    main()
