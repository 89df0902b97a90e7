"""Shared by the command-line tests (tests/test_cli*.py): small CSV files and an in-process runner."""

import numpy as np
import pytest

from gkl_jax import cli

N, D = 40, 3


def _write(path, header, rows):
    with open(path, "w") as f:
        if header is not None:
            f.write(",".join(header) + "\n")
        for row in rows:
            f.write(",".join(str(v) for v in row) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Small CSV files sharing one shape (N rows, D inputs) so that fits reuse the compiled solver."""
    d = tmp_path_factory.mktemp("csv")
    rng = np.random.default_rng(0)
    X = np.round(rng.normal(size=(N, D)), 4)
    f = X @ np.array([1.0, -2.0, 0.5])
    yes = rng.uniform(size=N) < 1 / (1 + np.exp(-f))
    counts = rng.poisson(np.exp(0.3 * f))
    y_reg = np.round(f + 0.3 * rng.normal(size=N), 4)
    names = ["a", "b", "c"]
    out = {
        "strings": _write(d / "strings.csv", names + ["label"],
                          [list(x) + ["yes" if t else "no"] for x, t in zip(X, yes)]),
        "zero_one_first": _write(d / "zero_one.csv", None, [[int(t)] + list(x) for x, t in zip(X, yes)]),
        "regression": _write(d / "regression.csv", names + ["y"], [list(x) + [v] for x, v in zip(X, y_reg)]),
        "counts": _write(d / "counts.csv", names + ["n"], [list(x) + [c] for x, c in zip(X, counts)]),
        "dir": str(d),
    }
    rows = [list(x) + ["yes" if t else "no"] for x, t in zip(X, yes)]
    bad = {
        "non_numeric": [r[:1] + ["abc"] + r[2:] for r in rows[:3]] + rows[3:],
        "nan": rows[:5] + [[rows[5][0], "nan"] + rows[5][2:]] + rows[6:],
        "inf": rows[:1] + [rows[1][:2] + ["-inf"] + rows[1][3:]] + rows[2:],
        "empty_field": rows[:2] + [[rows[2][0], ""] + rows[2][2:]] + rows[3:],
        "three_labels": rows[:-1] + [rows[-1][:-1] + ["maybe"]],
        "one_label": [r[:-1] + ["yes"] for r in rows],
        "ragged": rows[:4] + [rows[4][:-2]] + rows[5:],
        "underscore": rows[:1] + [["1_000"] + rows[1][1:]] + rows[2:],
        "huge": [[f"{2e200 * float(r[0]):.17g}"] + r[1:] for r in rows],
    }
    for key, body in bad.items():
        out[key] = _write(d / f"{key}.csv", names + ["label"], body)
    out["negative_counts"] = _write(d / "neg.csv", names + ["n"], [list(x) + [-c] for x, c in zip(X, counts + 1)])
    out["fractional_counts"] = _write(d / "frac.csv", names + ["n"], [list(x) + [c + 0.5] for x, c in zip(X, counts)])
    out["header_only"] = _write(d / "header_only.csv", names + ["label"], [])
    out["empty"] = _write(d / "empty.csv", None, [])
    out["X"], out["yes"], out["y_reg"], out["counts_y"] = X, yes, y_reg, counts
    return out


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ------------------------------------------------------------------------------------------------ errors


def _one_line_error(code, out, err, fragment):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gkl-jax: error: ") and fragment in lines[0], lines[0]
    assert "Traceback" not in err and out == ""
