"""GP classification: the comparison of Nickisch's thesis Ch. 4 (papers/003) and a peer timing.

Part 1 (thesis Table 4.10 / Fig. 4.9-4.11 protocol, reduced): data sets ionosphere (200/151), sonar (108/100),
breast cancer (300/383), pima (350/418) with the thesis' train/test sizes (one random split, inputs standardised
by the training statistics); probit and logistic likelihoods; stationary kernels sigma_f^2 k(|x - x'| / l) (SE
by default; `--kernels se,matern32,matern52` adds the thesis' Matern covariances) on a G x G grid of
(ln l, ln sigma_f). One trial = (data set, likelihood, kernel), as in Table 4.10. Methods on the same `Model`:

    LA = gk.laplace, EP = gk.ep, KL = gk.fit (G-KL), VB = gk.local, FV = gk.fit(factor=Diagonal()) (mean-field
    Gaussian), LR = label regression (exact GP regression on y in {-1, +1}, noise sigma_n in [0.5, 2] chosen by
    its marginal likelihood, evidence = the Jensen bound at its posterior, as in the thesis).

Per grid point and method: the method's log Z, the Jensen (G-KL) bound at its Q, the test errors, and the
information score I = B + 1/(2 n) sum [(1 + y) log2 p + (1 - y) log2 (1 - p)] (bits; B = the baseline entropy).
Ground truth log Z by AIS (gk.ais) at `--ais` grid points. Summary per trial (data set x likelihood x kernel): each
method's max information over the grid, counted "below the mean / median of the methods" as in Table 4.10.

Part 2 (`--peer`, `--peer-splits K`): scikit-learn's GaussianProcessClassifier (Laplace, its own L-BFGS
hyperparameter search) vs our G-KL with ML-II (`gp.fit_hyperparameters`, logistic likelihood, SE kernel, then
`gp.predict`): wall time of the fit and of fit + prediction, best of 3 runs each (ours after a first run that
compiles; its time is in parentheses), and mean test log likelihood on the same splits; with `--peer-splits K`,
both again on K random splits (mean +- s.e., wins, median times).

Part 2b (`--swap-splits K`): on K random splits, the test log likelihood of LA, EP and G-KL at scikit-learn's
learned hyperparameters and at ours, and each method's log Z at both: separates what the inference contributes
(the methods at the same hyperparameters) from what ML-II's choice of hyperparameters does.

Part 3 (`--sparse N,M`): a sparse G-KL GP classifier (probit) on N synthetic 2-D points with M inducing points.

Run: python benchmarks/gp_classification.py --quick
     python benchmarks/gp_classification.py --kernels se,matern32,matern52 --grid 6 --ais 4   # ~1 h on one core
     python benchmarks/gp_classification.py --no-grid --peer --sparse 50000,500
     python benchmarks/gp_classification.py --no-grid --swap-splits 10          # ~3 min on one core
"""

import argparse
import json
import os
import platform
import time

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import gkl_jax as gk  # noqa: E402

SIZES = {"ionosphere": 200, "sonar": 108, "breast-cancer-wisconsin": 300, "pima": 350}
TEST = {"ionosphere": 151, "sonar": 100, "breast-cancer-wisconsin": 383, "pima": 418}
METHODS = ("LA", "EP", "KL", "VB", "FV", "LR")
KERNELS = {"se": gk.kernels.SquaredExponential, "matern32": gk.kernels.Matern32, "matern52": gk.kernels.Matern52}


def split(name, seed=0):
    X, y, _ = gk.datasets.load(name)
    rng = np.random.default_rng(seed)
    idx = rng.permutation(len(y))
    tr, te = idx[: SIZES[name]], idx[SIZES[name]: SIZES[name] + TEST[name]]
    m, s = X[tr].mean(0), X[tr].std(0)
    s[s == 0] = 1.0
    return (X[tr] - m) / s, y[tr], (X[te] - m) / s, y[te]


def information(p, y_test, y_train):
    """Information score in bits (thesis Ch. 4.12.1)."""
    p = np.clip(np.asarray(p), 1e-12, 1 - 1e-12)
    base = -sum(np.mean(y_test == c) * np.log2(np.mean(y_train == c)) for c in (-1.0, 1.0))
    return base + np.mean((1 + y_test) * np.log2(p) + (1 - y_test) * np.log2(1 - p)) / 2


def run_method(name, model, kernel, X, y):
    if name == "LA":
        return gk.laplace(model)
    if name == "EP":
        return gk.ep(model)
    if name == "KL":
        return gk.fit(model)
    if name == "VB":
        return gk.local(model)
    if name == "FV":
        return gk.fit(model, factor=gk.factors.Diagonal())
    return gk.gp.label_regression(model)


def grid_comparison(args):
    rows = []
    ln_ell = np.linspace(args.ell_range[0], args.ell_range[1], args.grid)
    ln_sf = np.linspace(args.sf_range[0], args.sf_range[1], args.grid)
    trials = [(ds, lik, kern) for ds in args.datasets for lik in args.likelihoods for kern in args.kernels]
    n_grid = args.grid * args.grid
    ais_points = set(np.unique(np.round(np.linspace(n_grid - 1, 0, args.ais)).astype(int)).tolist()
                     if args.ais > 0 else [])
    for ti, (ds, likname, kname) in enumerate(trials):
        t_trial = time.perf_counter()
        Xtr, ytr, Xte, yte = split(ds)
        Lik = gk.potentials.Probit if likname == "probit" else gk.potentials.Logistic
        for gi, (le, ls) in enumerate((a, b) for a in ln_ell for b in ln_sf):
            kernel = KERNELS[kname](np.exp(2 * ls), np.exp(le))
            model = gk.gp.model(kernel, Xtr, Lik(ytr))
            truth = np.nan
            if gi in ais_points:
                a = gk.ais(model, jax.random.PRNGKey(gi), num_chains=args.ais_chains,
                           num_temperatures=args.ais_temps)
                truth = float(a.log_z)
            for mname in args.methods:
                t0 = time.perf_counter()
                try:
                    res = run_method(mname, model, kernel, Xtr, ytr)
                except Exception as err:
                    print(f"  {ds}/{likname}/{kname} ({le:.1f},{ls:.1f}) {mname} failed: {type(err).__name__}: "
                          f"{err}")
                    continue
                secs = time.perf_counter() - t0
                pred = gk.gp.predict(res, model.prior, Xte, Lik(yte))
                p = np.asarray(pred.probability)
                log_z = float(res.log_z) if mname != "LR" else float(gk.bound(model, res.q))
                rows.append(dict(ds=ds, lik=likname, kernel=kname, ell=le, sf=ls, method=mname, log_z=log_z,
                                 jensen=float(gk.bound(model, res.q)), ais=truth,
                                 errors=int(np.sum(np.where(p > 0.5, 1.0, -1.0) != yte)),
                                 info=information(p, yte, ytr), converged=bool(res.converged), secs=secs))
        print(f"  trial {ti + 1}/{len(trials)} {ds}/{likname}/{kname}: {time.perf_counter() - t_trial:.0f} s",
              flush=True)
    return rows


def summarise(rows, methods):
    print(f"\n{'method':6s} {'|logZ-AIS| mean':>16s} {'(n)':>4s} {'max info':>9s} {'min err':>8s} {'conv':>9s}"
          f" {'time/fit s':>10s}")
    for m in methods:
        rs = [r for r in rows if r["method"] == m]
        if not rs:
            continue
        err = [abs(r["log_z"] - r["ais"]) for r in rs if np.isfinite(r["ais"])]
        print(f"{m:6s} {np.mean(err) if err else float('nan'):16.2f} {len(err):4d} "
              f"{max(r['info'] for r in rs):9.3f} {min(r['errors'] for r in rs):8d} "
              f"{sum(r['converged'] for r in rs):4d}/{len(rs):<4d} {np.median([r['secs'] for r in rs]):10.3f}")
    if "KL" in methods and "VB" in methods:
        pairs = [(r, v) for r in rows if r["method"] == "KL" for v in rows if v["method"] == "VB"
                 and (v["ds"], v["lik"], v["kernel"], v["ell"], v["sf"]) == (r["ds"], r["lik"], r["kernel"], r["ell"],
                                                                           r["sf"])]
        print(f"\nKL log Z >= VB log Z at {sum(r['log_z'] >= v['log_z'] for r, v in pairs)}/{len(pairs)} grid points")
    trials = sorted({(r["ds"], r["lik"], r["kernel"]) for r in rows})
    below_mean = {m: 0 for m in methods}
    below_median = {m: 0 for m in methods}
    for t in trials:
        best = {m: max((r["info"] for r in rows if (r["ds"], r["lik"], r["kernel"]) == t and r["method"] == m),
                       default=np.nan)
                for m in methods}
        vals = np.array([v for v in best.values() if np.isfinite(v)])
        for m, v in best.items():
            below_mean[m] += int(v < vals.mean())
            below_median[m] += int(v < np.median(vals))
    print(f"\nTable 4.10 style, {len(trials)} trials: # trials with max information below the mean / median of methods")
    print("  " + " ".join(f"{m:>5s}" for m in methods))
    print("  " + " ".join(f"{below_mean[m]:5d}" for m in methods) + "   (below mean; thesis 96 trials: LA 31 EP 0 "
          "KL 0 VB 6 FV 34 LR 92)")
    print("  " + " ".join(f"{below_median[m]:5d}" for m in methods) + "   (below median; thesis: LA 54 EP 0 KL 0 "
          "VB 15 FV 48 LR 96)")
    print("\nper grid point (ds, lik, ln l, ln sf): log Z per method [AIS]")
    for t in sorted({(r["ds"], r["lik"], r["kernel"], r["ell"], r["sf"]) for r in rows}):
        rs = {r["method"]: r for r in rows if (r["ds"], r["lik"], r["kernel"], r["ell"], r["sf"]) == t}
        ais = next(iter(rs.values()))["ais"]
        cells = " ".join(f"{m}={rs[m]['log_z']:.1f}/I{rs[m]['info']:.2f}" for m in methods if m in rs)
        print(f"  {t[0][:10]:10s} {t[1]:8s} {t[2]:8s} {t[3]:5.1f} {t[4]:5.1f}  {cells}  AIS={ais:.1f}")


class Build(eqx.Module):
    """kernel -> the logistic GP model on (X, y); the data are leaves, so the compiled ML-II step is reused."""

    X: jax.Array
    y: jax.Array

    def __call__(self, kernel):
        return gk.gp.model(kernel, self.X, gk.potentials.Logistic(self.y))


REPEATS = 3
"""Timed runs per method in `peer`; the best is reported (ours: after the first run, which compiles)."""


def sklearn_classifier(Xtr, ytr):
    """scikit-learn's GaussianProcessClassifier (Laplace, its own ML-II) fitted from sigma_f^2 = 1, l = sqrt(d)."""
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    return GaussianProcessClassifier(ConstantKernel(1.0) * RBF(np.sqrt(Xtr.shape[1])), random_state=0).fit(Xtr, ytr)


def sklearn_probability(sk, Xte):
    """scikit-learn's p(y = +1 | x) at Xte, clipped to [1e-12, 1 - 1e-12]."""
    return np.clip(sk.predict_proba(Xte)[:, list(sk.classes_).index(1.0)], 1e-12, 1 - 1e-12)


def mean_log_lik(p, y):
    """Mean test log likelihood of labels y in {-1, +1} under p(y = +1)."""
    return np.mean(np.where(y > 0, np.log(p), np.log(1 - p)))


def se(v):
    """Standard error of the mean of v (NaN for fewer than two values)."""
    return np.std(v, ddof=1) / np.sqrt(len(v)) if len(v) > 1 else float("nan")


def run_sklearn(Xtr, ytr, Xte, yte):
    """`sklearn_classifier`: (fit seconds, fit + predict seconds, test log lik, error)."""
    t0 = time.perf_counter()
    sk = sklearn_classifier(Xtr, ytr)
    t1 = time.perf_counter()
    p = sklearn_probability(sk, Xte)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t0, mean_log_lik(p, yte), np.mean(np.where(p > 0.5, 1.0, -1.0) != yte)


def run_ours(Xtr, ytr, Xte, yte):
    """G-KL ML-II (logistic, SE, gtol 1e-3) and prediction: (fit seconds, fit + predict seconds, test log lik,
    error, HyperResult)."""
    t0 = time.perf_counter()
    hr = gk.gp.fit_hyperparameters(Build(jnp.asarray(Xtr), jnp.asarray(ytr)),
                                   gk.kernels.SquaredExponential(1.0, np.sqrt(Xtr.shape[1])), max_steps=50, gtol=1e-3)
    jax.block_until_ready(hr.result)
    t1 = time.perf_counter()
    pred = gk.gp.predict(hr.result, hr.model.prior, Xte, gk.potentials.Logistic(yte))
    p = np.asarray(pred.probability)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t0, float(jnp.mean(pred.log_density)), np.mean(np.where(p > 0.5, 1.0, -1.0) != yte), hr


def peer(args):
    print("\n## peer: sklearn GaussianProcessClassifier (Laplace, own ML-II) vs G-KL ML-II (logistic, SE)")
    print(f"{'data':12s} {'sk fit s':>9s} {'+predict':>9s} {'sk test ll':>10s} {'sk err':>7s} {'ours fit s':>10s} "
          f"{'+predict':>9s} {'(first)':>7s} {'ours test ll':>12s} {'ours err':>8s} {'ours conv':>9s} {'steps':>5s}"
          f"   (times: best of {REPEATS}; ours after a first call that compiles, its fit + predict time in brackets)")
    for ds in args.datasets:
        data = split(ds)
        sk = [run_sklearn(*data) for _ in range(REPEATS)]
        ours = [run_ours(*data) for _ in range(1 + REPEATS)]  # the first run compiles, the others reuse it
        _, _, sk_ll, sk_err = sk[-1]
        first, (_, _, ll, err, hr) = ours[0][1], ours[-1]
        best = lambda runs, i: min(r[i] for r in runs)
        print(f"{ds[:12]:12s} {best(sk, 0):9.4f} {best(sk, 1):9.4f} {sk_ll:10.4f} {sk_err:7.3f} "
              f"{best(ours[1:], 0):10.4f} {best(ours[1:], 1):9.4f} ({first:5.1f}) {ll:12.4f} {err:8.3f} "
              f"{str(hr.converged):>9s} {hr.num_steps:5d}")


def peer_splits(args):
    """The peer comparison on splits 0..peer_splits-1: mean test log likelihood (+- s.e.) and error of both, the
    number of splits where ours has the higher test log likelihood, and the median times per split (fit, fit +
    predict; ours compiled on split 0 by `peer`)."""
    k = args.peer_splits
    print(f"\n## peer over {k} random splits (train/test sizes as above; times: median per split, fit / fit + "
          "predict)")
    print(f"{'data':12s} {'sk time s':>13s} {'sk test ll':>16s} {'sk err':>6s} {'ours time s':>13s} "
          f"{'ours test ll':>16s} {'ours err':>8s} {'ours ll better':>14s} {'ours conv':>9s}")
    for ds in args.datasets:
        rows = []
        for seed in range(k):
            data = split(ds, seed)
            fit_s, total_s, ll, err, hr = run_ours(*data)
            rows.append((*run_sklearn(*data), fit_s, total_s, ll, err, hr.converged))
        r = np.array(rows, dtype=float)
        med = lambda i: np.median(r[:, i])
        print(f"{ds[:12]:12s} {med(0):6.4f}/{med(1):6.4f} {r[:, 2].mean():8.4f} +- {se(r[:, 2]):.4f} "
              f"{r[:, 3].mean():6.3f} {med(4):6.4f}/{med(5):6.4f} {r[:, 6].mean():8.4f} +- {se(r[:, 6]):.4f} "
              f"{r[:, 7].mean():8.3f} {int(np.sum(r[:, 6] > r[:, 2])):>10d}/{k:<3d} {int(r[:, 8].sum()):>6d}/{k}")


def swap_hyperparameters(args):
    """Part 2b: LA / EP / G-KL predictions at scikit-learn's hyperparameters and at ours (G-KL ML-II), per split;
    means +- s.e. of the test log likelihood, splits where G-KL beats LA at the same hyperparameters, and the
    change of each method's log Z from scikit-learn's hyperparameters to ours."""
    k = args.swap_splits
    methods = {"LA": gk.laplace, "EP": gk.ep, "KL": gk.fit}
    print(f"\n## the same methods at both learned hyperparameters ({k} random splits; test log lik mean +- s.e.)")
    print(f"{'data':12s} {'sklearn':>16s} " + " ".join(f"{m + '@' + h:>16s}" for h in ("sk", "ours") for m in methods)
          + f" {'KL>LA @sk':>9s} {'KL>LA @ours':>11s}  log Z(ours) - log Z(sk): " + " ".join(methods))
    for ds in args.datasets:
        ll, dz = {"sklearn": []}, {m: [] for m in methods}
        for seed in range(k):
            Xtr, ytr, Xte, yte = split(ds, seed)
            sk = sklearn_classifier(Xtr, ytr)
            ll["sklearn"].append(mean_log_lik(sklearn_probability(sk, Xte), yte))
            kernels = {"sk": gk.kernels.SquaredExponential(sk.kernel_.k1.constant_value, sk.kernel_.k2.length_scale),
                       "ours": run_ours(Xtr, ytr, Xte, yte)[4].params}
            log_z = {}
            for h, kernel in kernels.items():
                model = gk.gp.model(kernel, Xtr, gk.potentials.Logistic(ytr))
                for m, fn in methods.items():
                    res = fn(model)
                    pred = gk.gp.predict(res, model.prior, Xte, gk.potentials.Logistic(yte))
                    ll.setdefault(f"{m}@{h}", []).append(float(jnp.mean(pred.log_density)))
                    log_z[m, h] = float(res.log_z)
            for m in methods:
                dz[m].append(log_z[m, "ours"] - log_z[m, "sk"])
        wins = lambda h: int(np.sum(np.array(ll[f"KL@{h}"]) > np.array(ll[f"LA@{h}"])))
        print(f"{ds[:12]:12s} " + " ".join(f"{np.mean(v):8.4f} +- {se(v):.4f}" for v in ll.values())
              + f" {wins('sk'):>6d}/{k:<2d} {wins('ours'):>8d}/{k:<2d}  "
              + " ".join(f"{np.mean(v):+.4f} [{np.min(v):+.4f}, {np.max(v):+.4f}]" for v in dz.values()))


def sparse(n, m):
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, size=(n + 2000, 2))
    f = np.sin(X[:, 0]) * np.cos(X[:, 1]) * 2
    y = np.where(rng.uniform(size=len(f)) < 1 / (1 + np.exp(-3 * f)), 1.0, -1.0)
    Z = X[rng.choice(n, m, replace=False)]
    kernel = gk.kernels.SquaredExponential(4.0, 1.0)
    t0 = time.perf_counter()
    model = gk.gp.sparse_model(kernel, X[:n], Z, gk.potentials.Probit(y[:n]))
    res = gk.fit(model)
    jax.block_until_ready(res.log_z)
    secs = time.perf_counter() - t0
    pred = gk.gp.predict(res, model.prior, X[n:], gk.potentials.Probit(y[n:]))
    err = np.mean(np.where(np.asarray(pred.probability) > 0.5, 1.0, -1.0) != y[n:])
    print(f"\n## sparse G-KL GP classification: N = {n}, M = {m}: {secs:.1f} s (build + fit, compile included), "
          f"bound {float(res.log_z):.1f}, converged {bool(res.converged)}, steps {int(res.num_steps)}, "
          f"test error {err:.3f}, test log lik {float(jnp.mean(pred.log_density)):.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--datasets", default="ionosphere,sonar,breast-cancer-wisconsin,pima")
    ap.add_argument("--likelihoods", default="probit,logistic")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--kernels", default="se", help="subset of " + ",".join(KERNELS))
    ap.add_argument("--json", default=None, help="also write the per-grid-point rows to this file")
    ap.add_argument("--grid", type=int, default=4, help="G: the grid is G x G over (ln l, ln sigma_f)")
    ap.add_argument("--ell-range", type=float, nargs=2, default=(0.0, 4.0))
    ap.add_argument("--sf-range", type=float, nargs=2, default=(-1.0, 4.0))
    ap.add_argument("--ais", type=int, default=2, help="number of grid points per trial with an AIS reference")
    ap.add_argument("--ais-chains", type=int, default=64)
    ap.add_argument("--ais-temps", type=int, default=200)
    ap.add_argument("--peer", action="store_true", help="also time scikit-learn's GaussianProcessClassifier")
    ap.add_argument("--peer-splits", type=int, default=0,
                    help="with --peer: also compare on this many random splits (test log likelihood, error, time)")
    ap.add_argument("--swap-splits", type=int, default=0,
                    help="LA / EP / G-KL test log likelihood at scikit-learn's and at our hyperparameters on this "
                         "many splits")
    ap.add_argument("--no-grid", action="store_true", help="skip part 1")
    ap.add_argument("--sparse", default=None, help="N,M for the sparse GP demonstration (e.g. 50000,500)")
    args = ap.parse_args()
    args.datasets = args.datasets.split(",")
    args.likelihoods = args.likelihoods.split(",")
    args.methods = args.methods.split(",")
    args.kernels = args.kernels.split(",")
    unknown = [k for k in args.kernels if k not in KERNELS]
    if unknown:
        ap.error(f"--kernels: unknown {unknown}; choose from {sorted(KERNELS)}")
    if args.quick:
        args.datasets, args.likelihoods, args.grid, args.ais = ["sonar"], ["probit"], 2, 1
        args.ais_chains, args.ais_temps = 16, 50
        args.methods = ["LA", "EP", "KL", "FV", "LR"]
    start = time.time()
    print(f"# gp_classification  {time.strftime('%Y-%m-%d %H:%M')}  {platform.machine()}  "
          f"load {os.getloadavg()[0]:.1f}  args {vars(args)}")
    if not args.no_grid:
        rows = grid_comparison(args)
        summarise(rows, args.methods)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f)
    if args.peer:
        peer(args)
        if args.peer_splits > 0:
            peer_splits(args)
    if args.swap_splits > 0:
        swap_hyperparameters(args)
    if args.sparse:
        n, m = (int(v) for v in args.sparse.split(","))
        sparse(n, m)
    print(f"\nwall time {time.time() - start:.1f} s, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
