"""Fuzzing the command line and the data loaders (issue 38): random CSV files and options, from a seeded generator.

Every case must end in one of two ways: a one-line `gkl-jax: error: ...` on stderr with exit status 2 (nothing
on stdout, no traceback), or data handed to the fit that is finite and in range. The quick run checks 150 cases
in-process and stops each valid one where the fit would import JAX (`cli._start_jax`), so no case compiles;
`GKL_JAX_FUZZ=N` runs N cases and also fits every valid one, checking exit status 0 and strict JSON (about 0.5 s
a case once the shapes are compiled; N = 2000 is a nightly-sized run). The targeted tests below fit for real.
"""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import gkl_jax as gk
from gkl_jax import _cli_input, cli

FULL_RUN = int(os.environ.get("GKL_JAX_FUZZ", "0"))
NUM_CASES = FULL_RUN or 150

_NUMBERS = ["0", "1", "-1", "2.5", "1e-3", "-7", "3", "0.0", "1e300", "-1e300", "1e302", "1e308", "1.7976931348623157e308",
            "1e-320", "1e18", "1e9", "1000000001", "4.2e1", " 5 ", "+3", ".5", "5.", "1E5"]
_TEXTS = ["abc", "nan", "NaN", "inf", "-inf", "Infinity", "", "?", "NA", "null", "1_000", "0x10", "1e", "--1", "1,5",
          "yes", "no", "é", "a\nb", "\x00", "1 2", "True", "１", "9" * 400, "'1'", '"q"']


def _cell(rng, numeric_bias, special=0.3):
    if rng.uniform() < numeric_bias:
        if rng.uniform() < special:
            return str(rng.choice(_NUMBERS))
        return f"{rng.normal() * 10.0 ** rng.integers(-3, 4):.6g}"
    return str(rng.choice(_TEXTS))


def _quote(field, delimiter):
    if any(c in field for c in (delimiter, '"', "\n", "\r")):
        return '"' + field.replace('"', '""') + '"'
    return field


_VALID_OPTIONS = {"gaussian": ("--noise-variance", ["0.5", "1e-3", "4"]), "laplace": ("--scale", ["1", "0.1"]),
                  "student-t": ("--dof", ["4", "0.5", "1e6"])}
_HOSTILE_OPTIONS = {"--target": ["x0", "-1", "99", "nope", "1e3", "-999"],
                    "--factor": list(cli.FACTORS) + ["cholesky"],
                    "--rank": ["1", "2", "0", "-1", "1.5", "99", "abc"],
                    "--prior-variance": ["1", "0.01", "1e8", "0", "-1", "nan", "inf", "x"],
                    "--noise-variance": ["0.5", "1e-3", "0", "inf"], "--scale": ["1", "0.1", "-1"],
                    "--dof": ["4", "0.5", "1e6", "0"], "--positive-label": ["1", "0", "yes", "maybe"]}


def random_case(rng, tmp_path, index):
    """argv for a random CSV file and random options: half the cases valid by construction up to the values'
    randomness (a target that suits the likelihood, options that apply to it), half hostile everywhere."""
    if rng.uniform() < 0.04:
        seeds = ["-1", "x", "2.5"] + ([] if FULL_RUN else ["0"])  # a full run does not run the whole demo
        return ["demo", "--seed", str(rng.choice(seeds)), "--output-dir", str(tmp_path / "demo" / str(index)),
                "--quiet"]
    hostile = rng.uniform() < 0.5
    shape = rng.choice(["empty", "header", "one", "small", "wide", "tall"], p=[0.05, 0.05, 0.15, 0.55, 0.1, 0.1])
    if not hostile:
        shape = "one" if shape in ("empty", "header") else shape
    rows = {"empty": 0, "header": 0, "one": 1, "small": int(rng.integers(2, 12)), "wide": int(rng.integers(1, 5)),
            "tall": int(rng.integers(50, 300))}[shape]
    cols = int(rng.integers(300, 3000)) if shape == "wide" else int(rng.integers(1 + (not hostile), 7))
    likelihood = str(rng.choice(cli.LIKELIHOODS))
    delimiter = str(rng.choice([",", ",", ",", ";", "\t", " ", '"']))
    header = [f"x{j}" for j in range(cols)]
    if hostile and rng.uniform() < 0.1:
        header[-1] = header[0]  # a duplicate name
    if rng.uniform() < 0.1:
        header[0] = str(rng.choice(["", "a\nb", "é", "x 0", "1"]))
    if hostile:
        numeric_bias = rng.choice([1.0, 0.995, 0.9, 0.5])
        body = [[_cell(rng, numeric_bias) for _ in range(cols)] for _ in range(rows)]
    else:
        body = [[_cell(rng, 1.0, special=0.01) for _ in range(cols)] for _ in range(rows)]
    for row in body:
        if likelihood in cli.BINARY:
            row[-1] = str(rng.choice(["0", "1"] if rng.uniform() < 0.95 else ["a", "b", "c"]))
        elif likelihood == "poisson":
            row[-1] = str(rng.choice(["0", "3", "17", "1e9", "1e18", "-2", "2.5"], p=[.3, .3, .3, .04, .03, .02, .01]))
    if hostile and rows > 1 and rng.uniform() < 0.1:
        body[-1] = body[-1][:-1] or ["1", "2"]  # ragged
    lines = [] if shape == "empty" else [header] + body
    newline = "\r\n" if rng.uniform() < 0.1 else "\n"
    text = newline.join(delimiter.join(_quote(f, delimiter) for f in line) for line in lines)
    path = tmp_path / f"case{index}.csv"
    path.write_bytes(("\ufeff" if rng.uniform() < 0.05 else "").encode() + text.encode("utf-8", "surrogatepass"))
    argv = ["--no-cache", "fit", str(path), "--likelihood", likelihood, "--quiet"]
    if delimiter != ",":
        argv += ["--delimiter", delimiter]
    if rng.uniform() < 0.2:
        argv += ["--output", str(tmp_path / f"out{index}.json") if not hostile else
                 str(rng.choice([str(tmp_path / f"out{index}.json"), str(tmp_path / "no" / "r.json"), str(tmp_path)]))]
    if hostile:
        for flag, values in _HOSTILE_OPTIONS.items():
            if rng.uniform() < 0.1:
                argv += [flag, str(rng.choice(values))]
        if rng.uniform() < 0.05:
            argv.append(str(rng.choice(["--bogus", "--rank", "--target"])))  # unknown, or missing its value
    else:
        if likelihood in _VALID_OPTIONS and rng.uniform() < 0.3:
            flag, values = _VALID_OPTIONS[likelihood]
            argv += [flag, str(rng.choice(values))]
        factor = str(rng.choice(list(cli.FACTORS)))
        argv += ["--factor", factor] + (["--rank", "1"] if cli.FACTORS[factor][1] else [])
        if likelihood in _cli_input.CONTINUOUS and rng.uniform() < 0.3:
            argv.append("--standardize-target")
    for flag in ("--standardize", "--no-bias", "--no-header") + (("--standardize-target",) if hostile else ()):
        if rng.uniform() < 0.1:
            argv.append(flag)
    return argv


class _Reached(BaseException):
    """Raised where the fit would import JAX: the input passed every check (not an Exception, so main lets it
    through)."""


def _assert_one_line_error(code, out, err, argv):
    assert code == 2, (code, argv, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gkl-jax: error: "), (argv, err)
    assert "Traceback" not in err and out == "", argv


def _assert_checked(problem, likelihood):
    """What the checks promise the fit: finite data of consistent shapes within the documented ranges."""
    X, y = problem.X, problem.y
    assert X.ndim == 2 and y.shape == (X.shape[0],) and X.shape[0] >= 1 and len(problem.columns) == X.shape[1]
    assert np.all(np.isfinite(X)) and np.all(np.isfinite(y))
    assert np.all(np.isfinite(np.einsum("ij,ij->j", X, X)))
    if likelihood in cli.BINARY:
        assert set(np.unique(y)) <= {-1.0, 1.0}
    elif likelihood == "poisson":
        assert np.all((y >= 0) & (y == np.round(y)) & (y <= _cli_input.MAX_COUNT))
    else:
        assert np.isfinite(np.sum(np.square(y)))


def test_fuzz_the_fit_command(capsys, tmp_path, monkeypatch):
    rng = np.random.default_rng(20261127)
    prepared = []
    real_prepare = _cli_input.prepare

    def recording_prepare(args):
        prepared.append((real_prepare(args), args.likelihood))
        return prepared[-1][0]

    monkeypatch.setattr(_cli_input, "prepare", recording_prepare)
    def stop(no_cache):
        raise _Reached

    if not FULL_RUN:
        monkeypatch.setattr(cli, "_start_jax", stop)
    tally = {"error": 0, "checked": 0, "fitted": 0}
    for index in range(NUM_CASES):
        argv = random_case(rng, tmp_path, index)
        prepared.clear()
        try:
            code = cli.main(argv)
        except _Reached:
            code = None
        captured = capsys.readouterr()
        if code == 2:
            _assert_one_line_error(code, captured.out, captured.err, argv)
            tally["error"] += 1
            continue
        assert "Traceback" not in captured.err and "internal error" not in captured.err, (argv, captured.err)
        if argv[0] == "demo":  # reaches JAX only with a good seed and directory
            assert code in (None, 0) and os.path.isdir(argv[4]), argv
            continue
        assert len(prepared) == 1, (argv, code, captured.err)
        _assert_checked(*prepared[0])
        tally["checked"] += 1
        if code == 0:
            assert "log Z >=" in captured.out, argv
            output = argv[argv.index("--output") + 1] if "--output" in argv else None
            if output:
                _strict_json(open(output).read())
            tally["fitted"] += 1
    # the generator reaches both outcomes (and the fit, in a full run)
    assert tally["error"] > NUM_CASES // 3 and tally["checked"] > NUM_CASES // 20, tally
    assert tally["fitted"] > 0 or not FULL_RUN, tally


def _strict_json(text):
    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("seed", range(3))
def test_fuzz_the_data_loaders(seed):
    """gk.datasets.load / info / data_path / synthetic_logistic with random arguments: the right data or a
    ValueError naming the argument."""
    rng = np.random.default_rng(seed)
    names = list(gk.datasets.available())
    junk = [None, 3, 2.5, b"sonar", ["sonar"], "", "Sonar", "../_uci.py", "data/sonar.csv", "sonar.csv", "é",
            "sonar\x00", "/etc/passwd", "README.txt", "sonar.names"]
    for _ in range(20):
        arg = names[rng.integers(len(names))] if rng.uniform() < 0.2 else junk[rng.integers(len(junk))]
        try:
            X, y, features = gk.datasets.load(arg)
        except ValueError as err:
            assert arg not in names and "name must be one of" in str(err)
        else:
            assert arg in names and X.shape == (y.shape[0], len(features)) and np.all(np.isfinite(X))
        try:
            path = gk.datasets.data_path(arg)
        except ValueError as err:
            assert "filename must be the plain name" in str(err)
        else:
            assert path.is_file() and path.name == arg
    for _ in range(20):
        dim, num_train, num_test, s = (rng.choice(np.array([1, 3, 0, -1, 2.5, "3", None, 4.0], dtype=object)) for _ in range(4))
        try:
            data = gk.datasets.synthetic_logistic(dim, num_train, num_test, seed=s)
        except ValueError as err:
            assert any(name in str(err) for name in ("dim", "num_train", "num_test", "seed")), str(err)
        else:
            assert data["X_train"].shape == (num_train, dim) and data["X_test"].shape == (num_test, dim)
            assert np.all(np.isfinite(data["X_train"])) and set(np.unique(data["y_train"])) <= {-1.0, 1.0}
