"""The GP estimators at the sizes users bring (issue 61): first fits with compilation, cross-validation, and the
multiclass default on 500 digits, each beside scikit-learn's GaussianProcessClassifier in the same run.

Every case runs in a fresh Python process (`--case`), so "first fit" includes all of its compilation (the
persistent compilation cache off), as a new user meets it; both libraries are imported before the clock starts.

- binary N: `gkl_jax.sklearn.GPClassifier()` (ML-II) on a 2-D synthetic problem of N points: the first fit, a
  second (warm) fit on another N' in the same size bucket, and `cross_val_score(GPClassifier(), X, y, cv=5)`
  (five fits of 4N/5 points, compiled once); scikit-learn's `GaussianProcessClassifier(1.0 * RBF(1.0))` (ML-II
  too) fit once on the same data, and with `--cv-peer` its `cross_val_score` too (the cost of five fits of 4N/5
  points for an O(N^3) method that compiles nothing: 5 (4/5)^3 = 2.56 fits' worth of arithmetic).
- digits: `gkl_jax.multiclass.GPClassifier()` with the default settings on the first 500 of scikit-learn's
  digits (standardised), tested on the other 1297; scikit-learn's `GaussianProcessClassifier()` (its default,
  fixed 1.0 * RBF(1.0)) and `GaussianProcessClassifier(1.0 * RBF(1.0))` (ML-II) on the same split.

Run: python benchmarks/gp_estimators_scale.py [--binary 500 1000 2000] [--digits] [--cv-peer]
"""

import argparse
import json
import subprocess
import sys
import time


def _binary_data(n, seed=0):
    import numpy as np
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n, 2))
    f = np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1]
    y = (f + 0.4 * rng.normal(size=n) > 0).astype(int)
    return X, y


def case_binary(n, cv_peer=False):
    import warnings

    import jax
    import numpy as np
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF
    from sklearn.model_selection import cross_val_score

    from gkl_jax.sklearn import GPClassifier
    warnings.simplefilter("ignore")
    X, y = _binary_data(n + 16)
    Xt, yt = _binary_data(2000, seed=1)
    out = {"case": "binary", "n": n, "jax": jax.__version__}
    t = time.perf_counter()
    clf = GPClassifier().fit(X[:n], y[:n])
    out["ours_first_s"] = time.perf_counter() - t
    out["ours_acc"] = float(clf.score(Xt, yt))
    t = time.perf_counter()
    GPClassifier().fit(X[3:n + 2], y[3:n + 2])                 # n - 1 rows: the same bucket
    out["ours_second_s"] = time.perf_counter() - t
    t = time.perf_counter()
    out["ours_cv_acc"] = float(np.mean(cross_val_score(GPClassifier(), X[:n], y[:n], cv=5)))
    out["ours_cv5_s"] = time.perf_counter() - t
    print("PARTIAL " + json.dumps(out), flush=True)
    t = time.perf_counter()
    sk = GaussianProcessClassifier(1.0 * RBF(1.0)).fit(X[:n], y[:n])
    out["sklearn_s"] = time.perf_counter() - t
    out["sklearn_acc"] = float(sk.score(Xt, yt))
    print("PARTIAL " + json.dumps(out), flush=True)
    if cv_peer:
        t = time.perf_counter()
        out["sklearn_cv_acc"] = float(np.mean(cross_val_score(GaussianProcessClassifier(1.0 * RBF(1.0)), X[:n], y[:n],
                                                              cv=5)))
        out["sklearn_cv5_s"] = time.perf_counter() - t
    return out


def case_digits():
    import warnings

    import jax
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF

    import gkl_jax as gk
    import gkl_jax.multiclass  # noqa: F401
    warnings.simplefilter("ignore")
    X, y = load_digits(return_X_y=True)
    mu, sd = X[:500].mean(0), X[:500].std(0)
    X = (X - mu) / np.where(sd > 0, sd, 1.0)
    Xtr, ytr, Xte, yte = X[:500], y[:500], X[500:], y[500:]
    out = {"case": "digits", "n": 500, "jax": jax.__version__}
    t = time.perf_counter()
    clf = gk.multiclass.GPClassifier().fit(Xtr, ytr)
    out["ours_s"] = time.perf_counter() - t
    out["ours_acc"] = float(np.mean(clf.predict(Xte) == yte))
    out["ours_converged"] = bool(clf.converged_)
    print("PARTIAL " + json.dumps(out), flush=True)
    for name, est in (("sklearn_default", GaussianProcessClassifier()),
                      ("sklearn_ml2", GaussianProcessClassifier(1.0 * RBF(1.0)))):
        t = time.perf_counter()
        est.fit(Xtr, ytr)
        out[name + "_s"] = time.perf_counter() - t
        out[name + "_acc"] = float(est.score(Xte, yte))
        print("PARTIAL " + json.dumps(out), flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", type=int, nargs="*", default=[500, 1000])
    ap.add_argument("--digits", action="store_true")
    ap.add_argument("--cv-peer", action="store_true", help="also time scikit-learn's cross_val_score (cv=5)")
    ap.add_argument("--case", nargs="+")
    args = ap.parse_args()
    if args.case:
        import jax
        jax.config.update("jax_enable_x64", True)
        out = case_digits() if args.case[0] == "digits" else case_binary(int(args.case[1]), args.cv_peer)
        print("RESULT " + json.dumps(out), flush=True)
        return
    cases = [["binary", str(n)] for n in args.binary] + ([["digits"]] if args.digits else [])
    for case in cases:
        flags = ["--cv-peer"] if args.cv_peer else []
        run = subprocess.run([sys.executable, __file__, *flags, "--case", *case], capture_output=True, text=True)
        lines = [ln for ln in run.stdout.splitlines() if ln.startswith(("RESULT ", "PARTIAL "))]
        if not lines:
            print(run.stderr[-2000:])
            continue
        out = json.loads(lines[-1].split(" ", 1)[1])
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}), flush=True)


if __name__ == "__main__":
    main()
