"""`gkl-jax fit --save MODEL` and `gkl-jax predict MODEL DATA.csv`.

`fit --save` writes the fitted `Result` with `gkl_jax.save`'s format (model type "cli-glm") and, in the header's
metadata, what prediction needs: the input columns, the target's name, the likelihood and its options, the bias,
the label mapping and the input and target standardisations. `predict` reads a CSV file with the same input
columns (in any order; the target column may be there and is ignored), applies the saved standardisation and
writes one CSV row per data row: for logistic and probit the predictive probability of the +1 label
(E_q[sigmoid(x^T w)], not the plug-in), otherwise the predictive mean and sd of the target, noise included, in the
target's units. The model file's header and the data are checked before JAX is imported; columns that do not
match the model are one error line naming the missing and extra columns (exit status 2).
"""

import csv
import json
import math
import sys

from ._cli_common import BINARY, CLIError, check_data_path, check_writable

MODEL_TYPE = "cli-glm"
MAGIC = b"gkl-jax saved model\n"     # `gkl_jax._serialise.MAGIC`, repeated so that this module does not import JAX


def add_parser(sub):
    """The `predict` subcommand on the subparsers `sub` of the command line's parser."""
    predict = sub.add_parser("predict", help="predict from a model saved by 'gkl-jax fit --save'",
                             description="Predictions of a model saved by 'gkl-jax fit --save' for the rows of a CSV "
                                         "file: the probability of the +1 label (logistic, probit) or the "
                                         "predictive mean and sd of the target, as CSV.")
    predict.add_argument("model", help="the file written by 'gkl-jax fit --save MODEL'")
    predict.add_argument("data", help="CSV file with the model's input columns (a header unless --no-header; the "
                                      "target column may be present and is ignored)")
    predict.add_argument("--no-header", action="store_true",
                         help="the first row is data; the columns are then c0, c1, ... as in 'fit --no-header'")
    predict.add_argument("--delimiter", default=",", help="field delimiter (default: ',')")
    predict.add_argument("--output", default=None, metavar="FILE.csv",
                         help="write the predictions to this file instead of stdout")
    return predict


def save_model(path, result, problem, args):
    """Write the fit `result` of `problem` (`gkl_jax._cli_input.Problem`) for `predict` (module doc)."""
    from . import _io

    bias = not args.no_bias
    metadata = {"columns": problem.columns[:-1] if bias else list(problem.columns), "target": problem.target,
                "likelihood": args.likelihood, "options": problem.options, "bias": bias,
                "label_mapping": problem.mapping, "standardization": problem.standardization,
                "target_standardization": problem.target_standardization}
    try:
        _io.write(path, result, MODEL_TYPE, metadata)
    except ValueError as err:
        raise CLIError(f"cannot write --save {path}: {str(err).rpartition(': ')[2]}") from None


def read_metadata(path):
    """The metadata of the model file `path`, from its header alone (no JAX); CLIError where it is not a model
    saved by `fit --save`."""
    check_data_path(path)
    try:
        with open(path, "rb") as f:
            magic, line = f.readline(), f.readline()
    except OSError as err:
        raise CLIError(f"cannot read {path}: {err.strerror}") from None
    try:
        header = json.loads(line.decode("utf-8")) if magic == MAGIC else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        header = None
    if not isinstance(header, dict):
        raise CLIError(f"{path} is not a gkl-jax model file (or it is corrupt)")
    if header.get("model_type") != MODEL_TYPE:
        raise CLIError(f"{path} holds a {header.get('model_type')}, not a model saved by 'gkl-jax fit --save'")
    meta = header.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("columns"), list):
        raise CLIError(f"{path} is corrupt: its header has no column list")
    return meta


def design(meta, names, rows, data, delimiter=","):
    """The design matrix of the data rows for the saved model: its input columns in order, standardised as in
    the fit, with the bias column; CLIError naming missing and extra columns."""
    import numpy as np

    from ._cli_input import delimiter_hint, number

    columns, target = meta["columns"], meta["target"]
    missing = [c for c in columns if c not in names]
    extra = [n for n in names if n not in columns and n != target]
    if missing or extra:
        parts = ([f"missing {', '.join(repr(c) for c in missing[:8])}"] if missing else []) + (
            [f"extra {', '.join(repr(c) for c in extra[:8])}"] if extra else [])
        raise CLIError(f"{data}: the columns do not match the model's inputs ({len(columns)}: "
                       f"{', '.join(repr(c) for c in columns[:8])}{', ...' if len(columns) > 8 else ''}): "
                       f"{'; '.join(parts)}" + (delimiter_hint(data, delimiter) if len(names) == 1 else ""))
    index = [names.index(c) for c in columns]
    X = np.array([[number(fields[j], names[j], line) for j in index] for line, fields in rows], dtype=float)
    scaling = meta.get("standardization")
    if scaling is not None:
        X = (X - np.asarray(scaling["mean"])) / np.asarray(scaling["sd"])
    if meta.get("bias", True):
        X = np.hstack([X, np.ones((X.shape[0], 1))])
    return X


def run_predict(args, start_jax, potential) -> int:
    """`gkl-jax predict` (module doc); `start_jax(no_cache)` and `potential(likelihood, y, options)` are the
    command line's."""
    from ._cli_input import read_table

    meta = read_metadata(args.model)
    check_writable(args.output, "--output")
    names, rows = read_table(args.data, header=not args.no_header, delimiter=args.delimiter, min_columns=1)
    X = design(meta, names, rows, args.data, args.delimiter)
    start_jax(args.no_cache)
    import numpy as np

    import gkl_jax as gk

    from . import _io

    try:
        result, _ = _io.read(args.model, MODEL_TYPE)
    except ValueError as err:
        raise CLIError(str(err).removeprefix("gkl_jax.load: ")) from None
    if result.q.dim != X.shape[1]:
        raise CLIError(f"{args.model} is corrupt: its posterior has {result.q.dim} weights for {X.shape[1]} inputs")
    likelihood, options = meta["likelihood"], meta.get("options") or {}
    pred = gk.predict(result, X, potential(likelihood, np.ones(1), options))
    if likelihood in BINARY:
        positive = [k for k, v in (meta.get("label_mapping") or {"1": 1.0}).items() if v > 0]
        header = [f"probability_{positive[0] if positive else '+1'}"]
        values = [np.asarray(pred.probability, dtype=float)]
    else:
        mean, sd = np.asarray(pred.y_mean, dtype=float), np.sqrt(np.asarray(pred.y_variance, dtype=float))
        scaling = meta.get("target_standardization")
        if scaling is not None:
            mean, sd = scaling["mean"] + scaling["sd"] * mean, scaling["sd"] * sd
        header, values = ["mean", "sd"], [mean, sd]
    _write_csv(args.output, header, np.stack(values, axis=1))
    return 0


def _write_csv(path, header, table):
    def rows(out):
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(header)
        for row in table:
            writer.writerow([repr(float(v)) if math.isfinite(v) else str(float(v)) for v in row])

    if path is None:
        rows(sys.stdout)
        return
    try:
        with open(path, "w", encoding="utf-8", newline="") as f:
            rows(f)
    except OSError as err:
        raise CLIError(f"cannot write --output {path}: {err.strerror}") from None
