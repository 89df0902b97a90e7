"""The `gkl-jax fit` command's data: reading a CSV file and checking it, without JAX.

Everything a user can get wrong (the file, its columns, labels, counts, magnitudes, option combinations) is
refused here with a `CLIError`, before the command imports JAX, so a mistake costs a fraction of a second.
`prepare(args)` returns the design matrix and target the fit uses (`Problem`).
"""

import csv
import dataclasses
import math
from typing import Optional

import numpy as np

from ._cli_common import BINARY, CLIError, check_data_path, check_writable

_MISSING = {"", "na", "nan", "n/a", "null", "none", "?"}
CONTINUOUS = ("gaussian", "laplace", "student-t")
MAX_COUNT = 1e9
"""The largest Poisson count accepted. The bound's terms y m and log y! are then up to ~2e10 nats each and
cancel to the bound; float64 keeps that to ~1e-5 nats a site, where counts of 1e15 would lose whole nats (and
counts above 2^53 are not even exact integers)."""
INPUT_SD_HINT = 100.0
"""A logistic or probit input column whose sd is above this gets a note suggesting --standardize: under the
N(0, V I) prior a weight for a column of that scale is barely shrunk and the posterior is badly scaled."""
DELIMITERS = {",": ("commas", "','"), ";": ("semicolons", "';'"), "\t": ("tabs", "$'\\t'"), "|": ("bars", "'|'")}
"""The delimiters `read_table` tries on a header that yields one column, for its hint (their name, how to type
each in a shell)."""
SCALE_HINT = 10.0
"""A continuous target whose sd is more than this factor above or below the noise scale (or whose mean is more
than this factor of prior sds from 0) gets a warning suggesting --standardize-target."""


@dataclasses.dataclass
class Problem:
    """What the fit needs, checked: X (N, D) float64 with the bias column last when used, y (N,), the weight
    names, the target's name, the likelihood's options, the label mapping (binary), the input and target
    standardisations (or None) and warnings to print."""

    X: np.ndarray
    y: np.ndarray
    columns: list
    target: str
    options: dict
    mapping: Optional[dict] = None
    standardization: Optional[dict] = None
    target_standardization: Optional[dict] = None
    warnings: list = dataclasses.field(default_factory=list)


def prepare(args) -> Problem:
    """Read and check `args.data` for `gkl-jax fit` (see the module doc); CLIError on any problem."""
    options = likelihood_options(args)
    names, rows = read_table(args.data, header=not args.no_header, delimiter=args.delimiter)
    t = resolve_target(names, args.target)
    check_writable(args.output)
    lines = [line for line, _ in rows]
    inputs = [j for j in range(len(names)) if j != t]
    X = np.array([[number(fields[j], names[j], line) for j in inputs] for line, fields in rows], dtype=float)
    values = [fields[t] for _, fields in rows]
    mapping = None
    if args.likelihood in BINARY:
        y, mapping = binary_labels(values, lines, names[t], args.positive_label)
    elif args.likelihood == "poisson":
        y = counts(values, lines, names[t])
    else:
        y = np.array([number(v, names[t], line) for v, line in zip(values, lines)], dtype=float)
    columns = [names[j] for j in inputs]
    check_magnitude(X, columns, "values in column")
    problem = Problem(X, y, columns, names[t], options, mapping)
    if args.likelihood in BINARY and not args.standardize:
        _scale_note(problem)
    if args.likelihood in CONTINUOUS:
        check_magnitude(y[:, None], [names[t]], "target values in column")
    if args.standardize:
        mean, sd = X.mean(axis=0), X.std(axis=0)
        sd = np.where(sd > 0, sd, 1.0)
        problem.X = (X - mean) / sd
        problem.standardization = {"mean": mean.tolist(), "sd": sd.tolist()}
    _target_scale(problem, args)
    if not args.no_bias:
        problem.X = np.hstack([problem.X, np.ones((X.shape[0], 1))])
        problem.columns.append("bias")
    return problem


def _scale_note(problem):
    """A one-line note naming the input columns of a binary likelihood whose sd is above `INPUT_SD_HINT`."""
    sd = problem.X.std(axis=0)
    big = np.flatnonzero(sd > INPUT_SD_HINT)
    if big.size:
        shown = ", ".join(f"{problem.columns[j]!r} (sd {sd[j]:.3g})" for j in big[:3]) + (
            f" and {big.size - 3} more" if big.size > 3 else "")
        problem.warnings.append(f"input columns with sd above {INPUT_SD_HINT:g}: {shown}; the prior N(0, V I) hardly "
                                "constrains their weights and the fit is badly scaled: pass --standardize")


def _target_scale(problem, args):
    """--standardize-target: y -> (y - c) / s with c, s the target's mean and sd (with a bias; without one c = 0
    and s is the root mean square, as the model cannot shift). Otherwise a warning where the target's scale is
    far from what the noise and prior assume."""
    y, bias = problem.y, not args.no_bias
    center = float(np.mean(y)) if bias else 0.0
    spread = float(np.std(y)) if bias else float(np.sqrt(np.mean(np.square(y))))
    if args.standardize_target:
        if not spread > 0:
            raise CLIError(f"--standardize-target: target column {problem.target!r} is constant ({y[0]:g})")
        problem.y = (y - center) / spread
        problem.target_standardization = {"mean": center, "sd": spread}
        return
    if args.likelihood not in CONTINUOUS or y.size < 2:
        return
    noise = (math.sqrt(problem.options["noise_variance"]) if args.likelihood == "gaussian"
             else problem.options["scale"])
    flag = "--noise-variance" if args.likelihood == "gaussian" else "--scale"
    prior_sd = math.sqrt(args.prior_variance)
    if spread > SCALE_HINT * noise or 0 < spread < noise / SCALE_HINT:
        problem.warnings.append(
            f"the target's sd ({spread:.3g}) is far from the noise scale {noise:g} ({flag}): the fit is likely "
            f"poor; pass --standardize-target, or set {flag} to the scale of the residuals")
    elif bias and abs(center) > SCALE_HINT * max(prior_sd, noise):
        problem.warnings.append(
            f"the target's mean ({center:.3g}) is far from 0 for a bias with prior sd {prior_sd:g}: pass "
            f"--standardize-target, or raise --prior-variance")


# ----------------------------------------------------------------------------------------------- reading


def read_table(path: str, *, header: bool = True, delimiter: str = ",", min_columns: int = 2):
    """(column names, list of (line number, fields)) of a CSV file; CLIError on unreadable or ragged input, or
    fewer than `min_columns` columns (2 for a fit: inputs and a target)."""
    check_data_path(path)
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
    if len(names) < min_columns:
        raise CLIError(f"{path} needs at least two columns (inputs and a target), found {len(names)}"
                       + delimiter_hint(path, delimiter))
    return names, rows


def delimiter_hint(path, delimiter):
    """For a file whose first row is one column under `delimiter`: '; ... pass --delimiter X' where another of
    `DELIMITERS` splits it into several columns, else ''."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            first = next((line for line in f if line.strip()), "")
    except (OSError, UnicodeDecodeError):
        return ""
    for candidate, (name, typed) in DELIMITERS.items():
        if candidate == delimiter:
            continue
        fields = next(csv.reader([first], delimiter=candidate), [])
        if len(fields) > 1:
            return f"; its first row splits into {len(fields)} columns at {name}: pass --delimiter {typed}"
    return ""


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
    if index is not None:
        if -len(names) <= index < len(names):
            return index % len(names)
        raise CLIError(f"--target {target} is out of range: the file has {len(names)} columns (indices 0 to "
                       f"{len(names) - 1}, or -{len(names)} to -1 from the end)")
    shown = ", ".join(repr(n) for n in names[:12]) + (", ..." if len(names) > 12 else "")
    raise CLIError(f"unknown target column {target!r}; columns: {shown}")


def _float(text):
    """float(text) without Python's literal extras: a digit separator ('1_000') is a ValueError."""
    if "_" in text:
        raise ValueError(f"could not convert string to float: {text!r}")
    return float(text)


def number(text, column, line):
    """One numeric field as a finite float, else CLIError naming the column and line."""
    if text.lower() in _MISSING:
        raise CLIError(f"missing or NaN value {text!r} in column {column!r} (line {line})")
    try:
        value = _float(text)
    except ValueError:
        raise CLIError(f"non-numeric value {_short(text)!r} in column {column!r} (line {line})") from None
    if not math.isfinite(value):
        raise CLIError(f"non-finite value {_short(text)!r} in column {column!r} (line {line})")
    return value


def _short(text, limit=40):
    return text if len(text) <= limit else text[:limit] + "..."


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
        shown = ", ".join(repr(_short(t)) for t in texts[:5]) + (", ..." if len(texts) > 5 else "")
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
        raise CLIError(f"bad labels in target column {column!r}: only one class {_short(texts[0])!r}; use "
                       f"--positive-label to say whether it is the +1 class")
    mapping = {text: sign[keys[text]] for text in sorted(texts, key=keys.get)}
    return np.array([mapping[t] for t in values]), mapping


def counts(values, lines, column):
    """Poisson counts: non-negative integers up to MAX_COUNT, else CLIError naming the column and line."""
    y = np.array([number(t, column, line) for t, line in zip(values, lines)], dtype=float)
    bad = np.flatnonzero((y < 0) | (y != np.round(y)))
    if bad.size:
        raise CLIError(f"counts for poisson must be non-negative integers; got {values[bad[0]]!r} in column "
                       f"{column!r} (line {lines[bad[0]]})")
    big = np.flatnonzero(y > MAX_COUNT)
    if big.size:
        raise CLIError(f"count {values[big[0]]!r} in column {column!r} (line {lines[big[0]]}) is above "
                       f"{MAX_COUNT:.0e}, where the Poisson bound loses its precision in float64; model the log "
                       f"counts with --likelihood gaussian instead")
    return y


def check_magnitude(X, columns, what):
    """Refuse columns whose sum of squares overflows float64 (|values| above about 1e154): the fit's starting
    covariance (and --standardize's sd) would be infinite, and its message would blame the factor."""
    with np.errstate(over="ignore"):
        squares = np.einsum("ij,ij->j", X, X)
    bad = np.flatnonzero(~np.isfinite(squares))
    if bad.size:
        j = bad[0]
        raise CLIError(f"{what} {columns[j]!r} are too large (up to {np.max(np.abs(X[:, j])):.3g}; their "
                       f"squares overflow float64): rescale the column")


# ----------------------------------------------------------------------------------------------- options


def likelihood_options(args):
    """The likelihood's parameters, refusing options that do not apply to it."""
    applies = {"noise_variance": ("gaussian",), "scale": ("laplace", "student-t"), "dof": ("student-t",),
               "positive_label": BINARY, "standardize_target": CONTINUOUS}
    for option, likelihoods in applies.items():
        if getattr(args, option) not in (None, False) and args.likelihood not in likelihoods:
            flag = "--" + option.replace("_", "-")
            raise CLIError(f"{flag} applies only to --likelihood {' / '.join(likelihoods)}, "
                           f"not {args.likelihood}")
    defaults = {"gaussian": {"noise_variance": 1.0}, "laplace": {"scale": 1.0},
                "student-t": {"dof": 4.0, "scale": 1.0}}.get(args.likelihood, {})
    return {k: (getattr(args, k) if getattr(args, k) is not None else v) for k, v in defaults.items()}


