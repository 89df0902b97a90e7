"""The `gkl-jax` command line (also `python -m gkl_jax`).

    gkl-jax [--no-cache] demo [--output-dir DIR] [--seed N] [--quiet]
    gkl-jax [--no-cache] fit DATA.csv [--target COL] [--likelihood logistic] [--factor full] [--rank K]
                                [--save MODEL] ...
    gkl-jax [--no-cache] predict MODEL DATA.csv [--output FILE.csv]
    gkl-jax --version

`demo` compares the Full and Diagonal G-KL factors on Bayesian logistic regression of the bundled ionosphere
data (see `gkl_jax._demo`). `fit` runs a Bayesian GLM with an isotropic Gaussian prior on the columns of a CSV file
plus a bias; `fit --save` keeps the fit for `predict` (`gkl_jax._cli_predict`). Usage and data errors print one
line, `gkl-jax: error: ...`, on stderr and exit with status 2; a reader that closes stdout early
(`gkl-jax fit ... | head -1`) ends the command quietly with status 141. The data are read and checked
(`gkl_jax._cli_input`) before JAX is imported, and `--version`, `--help` and argument errors never import it.

Each run is a new process, so every compiled program would be compiled again; the command keeps them in JAX's
persistent compilation cache (`cache_dir`: $GKL_JAX_CACHE_DIR, else $XDG_CACHE_HOME/gkl-jax/xla, else
~/.cache/gkl-jax/xla; GKL_JAX_CACHE_DIR="" or `--no-cache` turns it off, and a JAX_COMPILATION_CACHE_DIR set by
the user is left alone), so a second run loads them instead of compiling (timings: the design-decisions page).
"""

import argparse
import json
import math
import os
import sys
import warnings

from ._cli_common import BINARY as BINARY
from ._cli_common import DEMO_DIR as DEMO_DIR
from ._cli_common import CLIError as CLIError
from ._cli_common import check_data_path as check_data_path
from ._cli_common import check_writable as check_writable
from ._cli_common import prepare_output_dir as prepare_output_dir
from ._cli_predict import add_parser as add_predict_parser
from ._cli_predict import run_predict, save_model
from ._progress import Progress as Progress

LIKELIHOODS = ("logistic", "probit", "gaussian", "laplace", "student-t", "poisson")
# --factor: the name of gk.factors.<Name> and the keyword --rank sets (None: the factor takes no size)
FACTORS = {"full": ("Full", None), "diagonal": ("Diagonal", None), "chevron": ("Chevron", "rows"),
           "banded": ("Banded", "bandwidth"), "subspace": ("Subspace", "rank"),
           "factor-analysis": ("FactorAnalysis", "rank")}

class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (raised as CLIError instead of printing the usage and exiting)."""

    def error(self, message):
        raise CLIError(f"{message} (see '{self.prog} --help')")


# ----------------------------------------------------------------------------------------------- argument types


def _positive(text):
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text!r}")
    return value


def _integer(text, minimum, kind):
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be {kind}, got {text!r}")
    return value


def _count(text):
    return _integer(text, 0, "a non-negative integer")


def _positive_count(text):
    return _integer(text, 1, "a positive integer")


def _build_parser():
    from . import __version__  # (a light import only where gkl_jax/__init__.py loads its subpackages lazily)

    parser = _Parser(prog="gkl-jax", description="Gaussian Kullback-Leibler approximate inference in JAX.")
    parser.add_argument("--version", action="version", version=f"gkl-jax {__version__}")
    parser.add_argument("--no-cache", action="store_true",
                        help="do not keep compiled programs between runs (default: in $GKL_JAX_CACHE_DIR or "
                             "~/.cache/gkl-jax/xla)")
    sub = parser.add_subparsers(dest="command", metavar="{demo,fit,predict}")

    demo = sub.add_parser("demo", help="Full vs Diagonal G-KL on Bayesian logistic regression (ionosphere)",
                          description="Bayesian logistic regression on the bundled UCI ionosphere data: "
                                      "Full and Diagonal G-KL factors against the MAP estimate.")
    demo.add_argument("--output-dir", default=DEMO_DIR,
                      help=f"where to write gkl_jax_demo.png (default: ./{DEMO_DIR}, created if missing)")
    demo.add_argument("--seed", type=_count, default=0, help="seed of the random 2/3 train split (default: 0)")
    demo.add_argument("--quiet", action="store_true", help="no progress line on stderr")

    fit = sub.add_parser("fit", help="fit a Bayesian GLM to a CSV file",
                         description="Bayesian GLM on a CSV file: prior N(0, V I) on one weight per input "
                                     "column plus a bias; prints the posterior mean and sd of each weight and "
                                     "the evidence lower bound.")
    fit.add_argument("data", help="CSV file (first row = column names unless --no-header)")
    fit.add_argument("--target", default=None,
                     help="target column: a name, or a 0-based index (negative counts from the end); default: "
                          "the last column. Without a header the columns are named c0, c1, ...")
    fit.add_argument("--likelihood", choices=LIKELIHOODS, default="logistic", help="default: logistic")
    fit.add_argument("--factor", choices=tuple(FACTORS), default="full",
                     help="G-KL covariance factor (default: full); chevron, banded, subspace and factor-analysis "
                          "need --rank")
    fit.add_argument("--rank", type=_positive_count, default=None, metavar="K",
                     help="size (>= 1) of a structured factor: dense rows of chevron, bandwidth of banded, rank of "
                          "subspace and factor-analysis")
    fit.add_argument("--prior-variance", type=_positive, default=1.0, metavar="V",
                     help="prior variance of every weight and the bias (default: 1)")
    fit.add_argument("--noise-variance", type=_positive, default=None, metavar="V",
                     help="gaussian likelihood: observation noise variance (default: 1)")
    fit.add_argument("--scale", type=_positive, default=None,
                     help="laplace / student-t likelihood: scale (default: 1)")
    fit.add_argument("--dof", type=_positive, default=None,
                     help="student-t likelihood: degrees of freedom (default: 4)")
    fit.add_argument("--positive-label", default=None, metavar="LABEL",
                     help="logistic / probit: the target value mapped to +1 (default: 1, or the larger/later "
                          "of the two values)")
    fit.add_argument("--standardize", action="store_true",
                     help="standardise every input column to mean 0, sd 1 (weights then refer to standardised "
                          "inputs)")
    fit.add_argument("--standardize-target", action="store_true",
                     help="gaussian / laplace / student-t: fit the target standardised to mean 0, sd 1 (without a "
                          "bias: divided by its root mean square); --noise-variance and --scale then refer to the "
                          "standardised target, while the weights, their sd and log Z are reported in the "
                          "original units")
    fit.add_argument("--no-bias", action="store_true", help="do not add a bias (intercept) weight")
    fit.add_argument("--no-header", action="store_true", help="the first row is data, not column names")
    fit.add_argument("--delimiter", default=",", help="field delimiter (default: ',')")
    fit.add_argument("--output", default=None, metavar="FILE.json", help="write the result as JSON")
    fit.add_argument("--save", default=None, metavar="MODEL", help="save the fit for 'gkl-jax predict MODEL ...'")
    fit.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    add_predict_parser(sub)
    return parser


def main(argv=None) -> int:
    """Run the command line with `argv` (default: sys.argv[1:]); returns the exit status, never raises."""
    try:
        parser = _build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        if args.command == "demo":
            prepare_output_dir(args.output_dir)
            _start_jax(args.no_cache)
            from ._demo import run_demo

            run_demo(output_dir=args.output_dir, seed=args.seed, progress=not args.quiet)
            status = 0
        elif args.command == "predict":
            status = run_predict(args, _start_jax, _potential)
        else:
            status = _run_fit(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        return status
    except BrokenPipeError:
        return _broken_pipe()
    except CLIError as err:
        print(f"gkl-jax: error: {one_line(str(err))}", file=sys.stderr)
        return 2
    except SystemExit as exit_:  # --help and --version
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    except KeyboardInterrupt:
        print("gkl-jax: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a defect of gkl-jax, not of the input: one line, unless asked for the traceback
        if os.environ.get("GKL_JAX_TRACEBACK"):
            raise
        print(f"gkl-jax: internal error: {type(err).__name__}: {one_line(str(err))} (please report it; "
              f"GKL_JAX_TRACEBACK=1 shows the traceback)", file=sys.stderr)
        return 1


_LINE_BREAKS = {c: repr(chr(c))[1:-1] for c in (0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x85, 0x2028, 0x2029)}


def one_line(text: str) -> str:
    """`text` with every character that str.splitlines breaks at written as an escape ('\\n'): a column name or
    path holding a newline cannot split an error message."""
    return text.translate(_LINE_BREAKS)


def _start_jax(no_cache: bool):
    """Import JAX (only once the input is known to be good), in float64, with the persistent cache unless
    `no_cache`."""
    import jax

    jax.config.update("jax_enable_x64", True)
    if not no_cache:
        _use_compilation_cache(jax)
    return jax


def _broken_pipe() -> int:
    """The reader of stdout went away (`gkl-jax fit ... | head -1`): exit quietly. Python ignores SIGPIPE, so a
    write raises BrokenPipeError instead; stdout is pointed at /dev/null so that the interpreter's final flush
    does not report the error again. The status is 141 (128 + SIGPIPE), what a shell reports for a command that
    SIGPIPE ended, so `set -o pipefail` still sees that the output was cut short."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor (captured, or closed)
        pass
    return 141


def cache_dir():
    """Where the command keeps compiled programs (module doc), or None when the cache is turned off."""
    path = os.environ.get("GKL_JAX_CACHE_DIR")
    if path is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = os.path.join(base, "gkl-jax", "xla")
    return path or None


def _use_compilation_cache(jax) -> None:
    """JAX's persistent compilation cache in `cache_dir()`, for every program however quick to compile (the
    demo's 48 programs take 0.7 MB); skipped where the user configured one or the directory is not writable."""
    path = cache_dir()
    if path is None or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return
    if not os.access(path, os.W_OK):
        return
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# ----------------------------------------------------------------------------------------------- fit


def _potential(likelihood, y, options):
    from . import potentials

    if likelihood == "logistic":
        return potentials.Logistic(y)
    if likelihood == "probit":
        return potentials.Probit(y)
    if likelihood == "gaussian":
        return potentials.Gaussian(y, variance=options["noise_variance"])
    if likelihood == "laplace":
        return potentials.Laplace(y, scale=options["scale"])
    if likelihood == "student-t":
        return potentials.StudentT(y, dof=options["dof"], scale=options["scale"])
    return potentials.Poisson(y)


def _check_rank(name, rank, dim):
    """--rank against --factor `name` and the model's dim D (input columns plus the bias), before any fit: the
    factor sees D only when the fit initialises it, too late for a message naming --rank."""
    keyword = FACTORS[name][1]
    if keyword is None:
        if rank is not None:
            sized = " / ".join(n for n, (_, k) in FACTORS.items() if k is not None)
            raise CLIError(f"--rank applies only to --factor {sized}, not {name}")
        return
    if rank is None:
        raise CLIError(f"--factor {name} needs --rank K (its {keyword}; D = {dim} weights)")
    largest = dim - 1 if name == "banded" else dim
    if rank > largest:
        raise CLIError(f"--rank {rank} is too large for --factor {name}: its {keyword} must be <= {largest} for "
                       f"D = {dim} weights")


def _factor(name, rank):
    """The template gk.factors.<Name>(<keyword>=rank) for --factor `name` (checked by `_check_rank`)."""
    from . import factors

    cls, keyword = FACTORS[name]
    try:
        return getattr(factors, cls)() if keyword is None else getattr(factors, cls)(**{keyword: rank})
    except ValueError as err:
        raise CLIError(f"--rank {rank}: {err}") from None


def _describe(name, rank):
    keyword = FACTORS[name][1]
    return name if keyword is None else f"{name} ({keyword}={rank})"


# ----------------------------------------------------------------------------------------------- fit: running


def _run_fit(args) -> int:
    check_data_path(args.data)
    from . import _cli_input

    problem = _cli_input.prepare(args)  # every check on the data, before JAX is imported
    check_writable(args.save, "--save")
    X, y, options = problem.X, problem.y, problem.options
    _check_rank(args.factor, args.rank, X.shape[1])
    for message in problem.warnings:
        print(f"gkl-jax: warning: {one_line(message)}", file=sys.stderr)
    progress = Progress(total=2 if args.output else 1, enabled=not args.quiet)
    progress.step(f"fitting the {_describe(args.factor, args.rank)} G-KL factor (D = {X.shape[1]}, "
                  f"N = {X.shape[0]}; first call includes JIT compilation)")
    jax = _start_jax(args.no_cache)
    import numpy as np

    import gkl_jax as gk

    try:
        model = gk.Model(gk.priors.Isotropic(dim=X.shape[1], variance=args.prior_variance),
                         gk.Sites(X, _potential(args.likelihood, y, options)))
        factor = _factor(args.factor, args.rank)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = jax.block_until_ready(gk.fit(model, factor=factor))
        log_z = float(result.log_z)
        mean = np.asarray(result.q.mean, dtype=float)
        sd = np.sqrt(np.asarray(result.q.marginal_variances(), dtype=float))
    except (ValueError, CLIError) as err:
        progress.done()
        raise CLIError(f"the fit failed: {str(err).splitlines()[0]}") from None
    fit_time = progress.done()
    if args.save:
        save_model(args.save, result, problem, args)
    scaling = problem.target_standardization
    if scaling is not None:  # back to the target's units: y = c + s y', so w = s w', bias = c + s b', Z = Z' / s^N
        mean, sd = scaling["sd"] * mean, scaling["sd"] * sd
        if not args.no_bias:
            mean[-1] += scaling["mean"]
        log_z -= X.shape[0] * math.log(scaling["sd"])
    if not (math.isfinite(log_z) and np.all(np.isfinite(mean)) and np.all(np.isfinite(sd))):
        what = f"log Z bound {log_z}" if not math.isfinite(log_z) else "non-finite posterior means or sds"
        raise CLIError(f"the fit failed: {what} (N = {X.shape[0]}, D = {X.shape[1]}); rescale the inputs "
                       f"(--standardize) or the target (--standardize-target)")
    out = {
        "data": os.path.abspath(args.data), "target": problem.target, "likelihood": args.likelihood,
        "likelihood_options": options, "factor": args.factor, "rank": args.rank,
        "prior_variance": args.prior_variance,
        "num_rows": int(X.shape[0]), "columns": problem.columns, "mean": mean.tolist(), "sd": sd.tolist(),
        "log_z": log_z, "converged": bool(result.converged), "num_steps": int(result.num_steps),
        "label_mapping": problem.mapping, "standardization": problem.standardization,
        "target_standardization": scaling, "fit_seconds": fit_time, "gkl_jax_version": gk.__version__,
    }
    if args.output:
        progress.step(f"writing {args.output}")
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                json.dump(out, f, indent=2, allow_nan=False)  # standard JSON: every number checked finite above
                f.write("\n")
        except OSError as err:
            progress.done()
            raise CLIError(f"cannot write --output {args.output}: {err.strerror}") from None
        progress.done()
    _print_fit(out)
    return 0


def _print_fit(out):
    print(f"gkl-jax fit: {out['data']}")
    print(f"  {out['num_rows']} rows, target {out['target']!r}, likelihood {out['likelihood']}"
          + "".join(f", {k.replace('_', ' ')} {v:g}" for k, v in out["likelihood_options"].items())
          + f", prior N(0, {out['prior_variance']:g} I), {_describe(out['factor'], out['rank'])} factor")
    if out["label_mapping"] is not None:
        print("  label mapping: " + ", ".join(f"{k!r} -> {v:+.0f}" for k, v in out["label_mapping"].items()))
    if out["standardization"] is not None:
        print("  inputs standardised to mean 0, sd 1: weights refer to standardised columns")
    scaling = out["target_standardization"]
    if scaling is not None:
        print(f"  target fitted standardised (mean {scaling['mean']:.6g}, sd {scaling['sd']:.6g}; the likelihood "
              f"options refer to it); weights, sd and log Z in the target's units")
    width = max(8, max(len(c) for c in out["columns"]))
    print()
    print(f"  {'column':<{width}}  {'mean':>12}  {'sd':>12}")
    for c, m, s in zip(out["columns"], out["mean"], out["sd"]):
        print(f"  {c:<{width}}  {m:>12.6g}  {s:>12.6g}")
    print()
    print(f"  evidence lower bound  log Z >= {out['log_z']:.6f}")
    status = "yes" if out["converged"] else "NO (the bound is valid but not optimal)"
    print(f"  converged: {status} after {out['num_steps']} steps, {out['fit_seconds']:.2f} s")
