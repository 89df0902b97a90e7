"""The `gkl-jax` command line (also `python -m gkl_jax`).

    gkl-jax [--no-cache] demo [--output-dir DIR] [--seed N]
    gkl-jax [--no-cache] fit DATA.csv --target COL --likelihood logistic --factor full [--rank K] [--output result.json]
    gkl-jax --version

`demo` compares the Full and Diagonal G-KL factors on Bayesian logistic regression of the bundled ionosphere
data (see `gkl_jax._demo`). `fit` runs a Bayesian GLM with an isotropic Gaussian prior on the columns of a CSV file
plus a bias. Usage and data errors print one line, `gkl-jax: error: ...`, on stderr and exit with status 2; a
reader that closes stdout early (`gkl-jax fit ... | head -1`) ends the command quietly with status 141.

Each run is a new process, so every compiled program would be compiled again; the command keeps them in JAX's
persistent compilation cache (`cache_dir`: $GKL_JAX_CACHE_DIR, else $XDG_CACHE_HOME/gkl-jax/xla, else
~/.cache/gkl-jax/xla; GKL_JAX_CACHE_DIR="" or `--no-cache` turns it off, and a JAX_COMPILATION_CACHE_DIR set by
the user is left alone). The demo's second run takes 6.7 s instead of 18.8 s.
"""

import argparse
import csv
import json
import math
import os
import sys
import threading
import time
import warnings

import numpy as np

LIKELIHOODS = ("logistic", "probit", "gaussian", "laplace", "student-t", "poisson")
# --factor: the name of gk.factors.<Name> and the keyword --rank sets (None: the factor takes no size)
FACTORS = {"full": ("Full", None), "diagonal": ("Diagonal", None), "chevron": ("Chevron", "rows"),
           "banded": ("Banded", "bandwidth"), "subspace": ("Subspace", "rank"),
           "factor-analysis": ("FactorAnalysis", "rank")}
BINARY = ("logistic", "probit")
_MISSING = {"", "na", "nan", "n/a", "null", "none", "?"}


class CLIError(Exception):
    """A usage or data error; reported as one line on stderr with exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (raised as CLIError instead of printing the usage and exiting)."""

    def error(self, message):
        raise CLIError(f"{message} (see '{self.prog} --help')")


class Progress:
    """A status line on stderr: rewritten in place on a terminal (with a running clock), one line per step
    otherwise. `step(text)` starts a step, `done()` closes it with its duration."""

    def __init__(self, total: int, enabled: bool = True, stream=None):
        self.total, self.enabled, self.count = int(total), bool(enabled), 0
        self.stream = sys.stderr if stream is None else stream
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._text, self._start, self._stop, self._thread = "", 0.0, None, None

    def step(self, text: str) -> None:
        """Start the next step, closing an open one."""
        if self._thread is not None or self._text:
            self.done()
        self.count += 1
        self._text, self._start = f"[{self.count}/{self.total}] {text}", time.perf_counter()
        if not self.enabled:
            return
        if self.tty:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        else:
            self.stream.write(f"gkl-jax: {self._text} ...")
            self.stream.flush()

    def _tick(self):
        while not self._stop.wait(0.2):
            self._write_tty(f"{self._text} ... {time.perf_counter() - self._start:.1f} s")

    def _write_tty(self, line):
        self.stream.write("\r\033[K" + line)
        self.stream.flush()

    def done(self) -> float:
        """Close the current step; returns its duration in seconds."""
        elapsed = time.perf_counter() - self._start
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self.enabled and self._text:
            if self.tty:
                self._write_tty(f"{self._text} ... done ({elapsed:.1f} s)\n")
            else:
                self.stream.write(f" done ({elapsed:.1f} s)\n")
                self.stream.flush()
        self._text = ""
        return elapsed


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
    from . import __version__

    parser = _Parser(prog="gkl-jax", description="Gaussian Kullback-Leibler approximate inference in JAX.")
    parser.add_argument("--version", action="version", version=f"gkl-jax {__version__}")
    parser.add_argument("--no-cache", action="store_true",
                        help="do not keep compiled programs between runs (default: in $GKL_JAX_CACHE_DIR or "
                             "~/.cache/gkl-jax/xla)")
    sub = parser.add_subparsers(dest="command", metavar="{demo,fit}")

    demo = sub.add_parser("demo", help="Full vs Diagonal G-KL on Bayesian logistic regression (ionosphere)",
                          description="Bayesian logistic regression on the bundled UCI ionosphere data: "
                                      "Full and Diagonal G-KL factors against the MAP estimate.")
    demo.add_argument("--output-dir", default=".", help="where to write gkl_jax_demo.png (default: .)")
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
    fit.add_argument("--no-bias", action="store_true", help="do not add a bias (intercept) weight")
    fit.add_argument("--no-header", action="store_true", help="the first row is data, not column names")
    fit.add_argument("--delimiter", default=",", help="field delimiter (default: ',')")
    fit.add_argument("--output", default=None, metavar="FILE.json", help="write the result as JSON")
    fit.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    return parser


def main(argv=None) -> int:
    """Run the command line with `argv` (default: sys.argv[1:]); returns the exit status, never raises."""
    try:
        parser = _build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        import jax

        jax.config.update("jax_enable_x64", True)
        if not args.no_cache:
            _use_compilation_cache(jax)
        if args.command == "demo":
            from ._demo import run_demo

            run_demo(output_dir=args.output_dir, seed=args.seed, progress=not args.quiet)
            status = 0
        else:
            status = _run_fit(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        return status
    except BrokenPipeError:
        return _broken_pipe()
    except CLIError as err:
        print(f"gkl-jax: error: {err}", file=sys.stderr)
        return 2
    except SystemExit as exit_:  # --help and --version
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    except KeyboardInterrupt:
        print("gkl-jax: interrupted", file=sys.stderr)
        return 130


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


# ----------------------------------------------------------------------------------------------- fit: reading


def read_table(path: str, *, header: bool = True, delimiter: str = ","):
    """(column names, list of (line number, fields)) of a CSV file; CLIError on unreadable or ragged input."""
    if not os.path.exists(path):
        raise CLIError(f"file not found: {path}")
    if os.path.isdir(path):
        raise CLIError(f"{path} is a directory, not a CSV file")
    if len(delimiter) != 1:
        raise CLIError(f"--delimiter must be one character, got {delimiter!r}")
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f, delimiter=delimiter)
            rows = [(reader.line_num, [c.strip() for c in row]) for row in reader if any(c.strip() for c in row)]
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise CLIError(f"cannot read {path}: {err}") from None
    if not rows:
        raise CLIError(f"{path} has no rows")
    if header:
        names = [name or f"c{j}" for j, name in enumerate(rows[0][1])]
        rows = rows[1:]
    else:
        names = [f"c{j}" for j in range(len(rows[0][1]))]
    seen = set()
    for name in names:
        if name in seen:
            raise CLIError(f"{path}: duplicate column name {name!r}")
        seen.add(name)
    if not rows:
        raise CLIError(f"{path} has a header but no data rows")
    for line, fields in rows:
        if len(fields) != len(names):
            raise CLIError(f"{path} line {line}: {len(fields)} fields, expected {len(names)}")
    if len(names) < 2:
        raise CLIError(f"{path} needs at least two columns (inputs and a target), found {len(names)}")
    return names, rows


def resolve_target(names, target) -> int:
    """Index of the target column given by name or integer index (default: the last column)."""
    if target is None:
        return len(names) - 1
    if target in names:
        return names.index(target)
    try:
        index = int(target)
    except ValueError:
        index = None
    if index is not None and -len(names) <= index < len(names):
        return index % len(names)
    shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
    raise CLIError(f"unknown target column {target!r}; columns: {shown}")


def _float(text):
    """float(text) without Python's literal extras: a digit separator ('1_000') is a ValueError."""
    if "_" in text:
        raise ValueError(f"could not convert string to float: {text!r}")
    return float(text)


def _number(text, column, line):
    if text.lower() in _MISSING:
        raise CLIError(f"missing or NaN value {text!r} in column {column!r} (line {line})")
    try:
        value = _float(text)
    except ValueError:
        raise CLIError(f"non-numeric value {text!r} in column {column!r} (line {line})") from None
    if not math.isfinite(value):
        raise CLIError(f"non-finite value {text!r} in column {column!r} (line {line})")
    return value


def binary_labels(values, lines, column, positive=None):
    """Map a two-class target to {-1, +1}: 0/1 and -1/+1 map numerically; any other two distinct values are
    sorted (numerically when all are numbers) and the first maps to -1, unless `positive` names the +1 value.
    Returns (y, mapping original text -> +-1)."""
    for text, line in zip(values, lines):
        if text.lower() in _MISSING:
            raise CLIError(f"missing label {text!r} in target column {column!r} (line {line})")
    texts = sorted(set(values))
    try:
        keys = {text: _float(text) for text in texts}
        numeric = all(math.isfinite(v) for v in keys.values())
    except ValueError:
        numeric = False
    if not numeric:
        keys = {text: text for text in texts}
    classes = sorted(set(keys.values()))
    if len(classes) > 2:
        shown = ", ".join(repr(t) for t in texts[:5]) + (", ..." if len(texts) > 5 else "")
        raise CLIError(f"bad labels in target column {column!r}: a binary likelihood needs two classes "
                       f"(0/1, -1/+1 or two distinct strings), found {len(classes)}: {shown}")
    if positive is not None:
        key = positive.strip()
        if numeric:
            try:
                key = _float(key)
            except ValueError:
                pass
        if key not in classes:
            raise CLIError(f"--positive-label {positive!r} does not occur in target column {column!r}")
        sign = {c: (1.0 if c == key else -1.0) for c in classes}
    elif numeric and set(classes) <= {0.0, 1.0}:
        sign = {0.0: -1.0, 1.0: 1.0}
    elif numeric and set(classes) <= {-1.0, 1.0}:
        sign = {-1.0: -1.0, 1.0: 1.0}
    elif len(classes) == 2:
        sign = {classes[0]: -1.0, classes[1]: 1.0}
    else:
        raise CLIError(f"bad labels in target column {column!r}: only one class {texts[0]!r}; use "
                       f"--positive-label to say whether it is the +1 class")
    mapping = {text: sign[keys[text]] for text in sorted(texts, key=keys.get)}
    return np.array([mapping[t] for t in values]), mapping


def _counts(values, lines, column):
    y = np.array([_number(t, column, line) for t, line in zip(values, lines)])
    bad = np.flatnonzero((y < 0) | (y != np.round(y)))
    if bad.size:
        raise CLIError(f"counts for poisson must be non-negative integers; got {values[bad[0]]!r} in column "
                       f"{column!r} (line {lines[bad[0]]})")
    return y


def _check_magnitude(X, columns):
    """Refuse input columns whose sum of squares overflows float64 (|values| above about 1e154): the fit's
    starting covariance (and --standardize's sd) would be infinite, and its message would blame the factor."""
    with np.errstate(over="ignore"):
        squares = np.einsum("ij,ij->j", X, X)
    bad = np.flatnonzero(~np.isfinite(squares))
    if bad.size:
        j = bad[0]
        raise CLIError(f"values in column {columns[j]!r} are too large (up to {np.max(np.abs(X[:, j])):.3g}; their "
                       f"squares overflow float64): rescale the column")


def _likelihood_options(args):
    """The likelihood's parameters, refusing options that do not apply to it."""
    applies = {"noise_variance": ("gaussian",), "scale": ("laplace", "student-t"), "dof": ("student-t",),
               "positive_label": BINARY}
    for option, likelihoods in applies.items():
        if getattr(args, option) is not None and args.likelihood not in likelihoods:
            flag = "--" + option.replace("_", "-")
            raise CLIError(f"{flag} applies only to --likelihood {' / '.join(likelihoods)}, "
                           f"not {args.likelihood}")
    defaults = {"gaussian": {"noise_variance": 1.0}, "laplace": {"scale": 1.0},
                "student-t": {"dof": 4.0, "scale": 1.0}}.get(args.likelihood, {})
    return {k: (getattr(args, k) if getattr(args, k) is not None else v) for k, v in defaults.items()}


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


def _check_output(path):
    if path is None:
        return
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise CLIError(f"--output {path} is a directory")
    if not os.path.isdir(directory):
        raise CLIError(f"cannot write --output {path}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK):
        raise CLIError(f"cannot write --output {path}: directory {directory} is not writable")


def _factor(name, rank, dim):
    """The template gk.factors.<Name>(<keyword>=rank) for --factor `name`, checked against the model's dim D
    (input columns plus the bias)."""
    from . import factors

    cls, keyword = FACTORS[name]
    if keyword is None:
        if rank is not None:
            sized = " / ".join(n for n, (_, k) in FACTORS.items() if k is not None)
            raise CLIError(f"--rank applies only to --factor {sized}, not {name}")
        return getattr(factors, cls)()
    if rank is None:
        raise CLIError(f"--factor {name} needs --rank K (its {keyword}; D = {dim} weights)")
    try:
        factor = getattr(factors, cls)(**{keyword: rank})
    except ValueError as err:
        raise CLIError(f"--rank {rank}: {err}") from None
    # the bound on the size needs D, which the factor sees only when the fit initialises it (too late for a
    # message naming --rank)
    largest = dim - 1 if name == "banded" else dim
    if rank > largest:
        raise CLIError(f"--rank {rank} is too large for --factor {name}: its {keyword} must be <= {largest} for "
                       f"D = {dim} weights")
    return factor


def _describe(name, rank):
    keyword = FACTORS[name][1]
    return name if keyword is None else f"{name} ({keyword}={rank})"


# ----------------------------------------------------------------------------------------------- fit: running


def _run_fit(args) -> int:
    import gkl_jax as gk

    names, rows = read_table(args.data, header=not args.no_header, delimiter=args.delimiter)
    t = resolve_target(names, args.target)
    options = _likelihood_options(args)
    _check_output(args.output)
    lines = [line for line, _ in rows]
    inputs = [j for j in range(len(names)) if j != t]
    X = np.array([[_number(fields[j], names[j], line) for j in inputs] for line, fields in rows])
    values = [fields[t] for _, fields in rows]
    mapping = None
    if args.likelihood in BINARY:
        y, mapping = binary_labels(values, lines, names[t], args.positive_label)
    elif args.likelihood == "poisson":
        y = _counts(values, lines, names[t])
    else:
        y = np.array([_number(v, names[t], line) for v, line in zip(values, lines)])
    columns = [names[j] for j in inputs]
    _check_magnitude(X, columns)
    standardization = None
    if args.standardize:
        mean, sd = X.mean(axis=0), X.std(axis=0)
        sd = np.where(sd > 0, sd, 1.0)
        X = (X - mean) / sd
        standardization = {"mean": mean.tolist(), "sd": sd.tolist()}
    if not args.no_bias:
        X = np.hstack([X, np.ones((X.shape[0], 1))])
        columns.append("bias")
    try:
        model = gk.Model(gk.priors.Isotropic(dim=X.shape[1], variance=args.prior_variance),
                         gk.Sites(X, _potential(args.likelihood, y, options)))
    except ValueError as err:
        raise CLIError(str(err).splitlines()[0]) from None
    factor = _factor(args.factor, args.rank, X.shape[1])

    progress = Progress(total=2 if args.output else 1, enabled=not args.quiet)
    progress.step(f"fitting the {_describe(args.factor, args.rank)} G-KL factor (D = {X.shape[1]}, "
                  f"N = {X.shape[0]}; first call includes JIT compilation)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = gk.fit(model, factor=factor)
            log_z = float(result.log_z)
    except ValueError as err:
        progress.done()
        raise CLIError(f"the fit failed: {str(err).splitlines()[0]}") from None
    fit_time = progress.done()
    mean = np.asarray(result.q.mean)
    sd = np.sqrt(np.asarray(result.q.marginal_variances()))
    out = {
        "data": os.path.abspath(args.data), "target": names[t], "likelihood": args.likelihood,
        "likelihood_options": options, "factor": args.factor, "rank": args.rank,
        "prior_variance": args.prior_variance,
        "num_rows": int(X.shape[0]), "columns": columns, "mean": mean.tolist(), "sd": sd.tolist(),
        "log_z": log_z, "converged": bool(result.converged), "num_steps": int(result.num_steps),
        "label_mapping": mapping, "standardization": standardization, "fit_seconds": fit_time,
        "gkl_jax_version": gk.__version__,
    }
    if args.output:
        progress.step(f"writing {args.output}")
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                json.dump(out, f, indent=2)
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
    width = max(8, max(len(c) for c in out["columns"]))
    print()
    print(f"  {'column':<{width}}  {'mean':>12}  {'sd':>12}")
    for c, m, s in zip(out["columns"], out["mean"], out["sd"]):
        print(f"  {c:<{width}}  {m:>12.6g}  {s:>12.6g}")
    print()
    print(f"  evidence lower bound  log Z >= {out['log_z']:.6f}")
    status = "yes" if out["converged"] else "NO (the bound is valid but not optimal)"
    print(f"  converged: {status} after {out['num_steps']} steps, {out['fit_seconds']:.2f} s")
