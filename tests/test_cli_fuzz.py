"""Fuzzing the command line and the data loaders (issue 38): random CSV files and options, from a seeded generator.

Every case must end in one of two ways: a one-line `gkl-jax: error: ...` on stderr with exit status 2 (nothing
on stdout, no traceback), or data handed to the fit that is finite and in range. The quick run checks 150 cases
in-process and stops each valid one where the fit would import JAX (`cli._start_jax`), so no case compiles;
`GKL_JAX_FUZZ=N` runs N cases and also fits every valid one, checking exit status 0 and strict JSON (about 0.5 s
a case once the shapes are compiled; N = 2000 is a nightly-sized run). The targeted tests below fit for real.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import gkl_jax as gk
from gkl_jax import _cli_input, cli

FULL_RUN = int(os.environ.get("GKL_JAX_FUZZ", "0"))
NUM_CASES = FULL_RUN or 150

_NUMBERS = ["0", "1", "-1", "2.5", "1e-3", "-7", "3", "0.0", "1e300", "-1e300", "1e302", "1e308",
            "1.7976931348623157e308", "1e-320", "1e18", "1e9", "1000000001", "4.2e1", " 5 ", "+3", ".5", "5.", "1E5"]
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
            if tally["fitted"] % 20 == 0:  # each shape compiles anew: release the programs (vm.max_map_count)
                import jax

                jax.clear_caches()
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
        choices = np.array([1, 3, 0, -1, 2.5, "3", None, 4.0], dtype=object)
        dim, num_train, num_test, s = (rng.choice(choices) for _ in range(4))
        try:
            data = gk.datasets.synthetic_logistic(dim, num_train, num_test, seed=s)
        except ValueError as err:
            assert any(name in str(err) for name in ("dim", "num_train", "num_test", "seed")), str(err)
        else:
            assert data["X_train"].shape == (num_train, dim) and data["X_test"].shape == (num_test, dim)
            assert np.all(np.isfinite(data["X_train"])) and set(np.unique(data["y_train"])) <= {-1.0, 1.0}


# ------------------------------------------------------------------------------ a new user's cases (issue 38, item 6)


def _csv(path, header, rows):
    path.write_text("\n".join(",".join(str(v) for v in row) for row in [header] + list(rows)) + "\n")
    return str(path)


def _run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("likelihood, target, fragment", [
    ("gaussian", "1e302", "target values in column 'y' are too large (up to 1e+302"),
    ("student-t", "-1.5e200", "target values in column 'y' are too large"),
    ("poisson", "1e18", "count '1e18' in column 'y' (line 3) is above 1e+09"),
    ("logistic", "1e302", "bad labels in target column 'y'"),
])
def test_huge_targets_and_counts_are_refused(capsys, tmp_path, likelihood, target, fragment):
    path = _csv(tmp_path / "t.csv", ["a", "y"], [[0.5, 1], [-1.0, target], [2.0, 0], [0.1, 1]])
    code, out, err = _run(capsys, "fit", path, "--likelihood", likelihood)
    _assert_one_line_error(code, out, err, likelihood)
    assert fragment in err, err


def _stop_before_jax(monkeypatch):
    def stop(no_cache):
        raise _Reached

    monkeypatch.setattr(cli, "_start_jax", stop)


@pytest.mark.parametrize("flags, warned", [([], True), (["--noise-variance", "6000"], False),
                                           (["--standardize-target"], False)])
def test_a_target_far_from_the_noise_scale_gets_a_hint(capsys, tmp_path, monkeypatch, flags, warned):
    """A target with sd 77 (as diabetes') and the default noise variance 1: one warning line suggesting
    --standardize-target, unless the noise is set to its scale or the target standardised. Stops before JAX."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=30)
    path = _csv(tmp_path / "t.csv", ["a", "y"], zip(x, 150 + 77 * rng.normal(size=30)))
    _stop_before_jax(monkeypatch)
    with pytest.raises(_Reached):
        cli.main(["fit", path, "--likelihood", "gaussian", "--quiet", *flags])
    err = capsys.readouterr().err
    assert err.count("\n") == (1 if warned else 0), err
    if warned:
        assert err.startswith("gkl-jax: warning: the target's sd (") and "--standardize-target" in err


def test_standardize_target_reports_the_exact_evidence_in_the_original_units(capsys, tmp_path):
    """Gaussian sites and the Full factor: G-KL is exact, so with --standardize-target log Z must be the closed
    form log N(y'; 0, V H H^T + v I) of the standardised target y' = (y - c) / s, minus N log s (the density of
    y = c + s y'), and the weights s m' (bias c + s m'_bias). The JSON is standard (no NaN or Infinity)."""
    rng = np.random.default_rng(1)
    N = 25
    X = np.round(rng.normal(size=(N, 2)), 4)
    y = np.round(300 + 80 * (X @ [1.0, -0.5]) + 20 * rng.normal(size=N), 3)
    path = _csv(tmp_path / "d.csv", ["a", "b", "y"], [list(x) + [t] for x, t in zip(X, y)])
    out_path = tmp_path / "r.json"
    code, out, err = _run(capsys, "--no-cache", "fit", path, "--likelihood", "gaussian", "--noise-variance", "0.3",
                          "--prior-variance", "2", "--standardize-target", "--output", out_path, "--quiet")
    assert code == 0 and err == "", err
    assert "target fitted standardised (mean" in out
    result = _strict_json(out_path.read_text())
    c, s = y.mean(), y.std()
    assert result["target_standardization"] == pytest.approx({"mean": c, "sd": s}, rel=1e-12)
    H = np.hstack([X, np.ones((N, 1))])
    t = (y - c) / s
    cov = 2.0 * H @ H.T + 0.3 * np.eye(N)
    _, logdet = np.linalg.slogdet(cov)
    exact = -0.5 * (N * np.log(2 * np.pi) + logdet + t @ np.linalg.solve(cov, t)) - N * np.log(s)
    np.testing.assert_allclose(result["log_z"], exact, rtol=1e-9)
    precision = H.T @ H / 0.3 + np.eye(3) / 2.0
    m = np.linalg.solve(precision, H.T @ t / 0.3)
    np.testing.assert_allclose(result["mean"], s * m + np.array([0, 0, c]), rtol=1e-7)
    np.testing.assert_allclose(result["sd"], s * np.sqrt(np.diag(np.linalg.inv(precision))), rtol=1e-7)
    code, out, err = _run(capsys, "fit", path, "--likelihood", "poisson", "--standardize-target")
    assert code == 2 and "--standardize-target applies only to --likelihood gaussian" in err


_NO_JAX = """
import sys, time
start = time.perf_counter()
{setup}
from gkl_jax import cli
codes = [cli.main(["--version"]), cli.main(["fit", "missing.csv"]), cli.main(["fit", "x.csv", "--rank", "0"])]
heavy = sorted(m for m in ("jax", "numpy", "gkl_jax._cli_input", "gkl_jax._fit") if m in sys.modules)
print(codes, heavy, round(time.perf_counter() - start, 3))
"""
_BARE_PACKAGE = """
import types
package = types.ModuleType("gkl_jax")
package.__path__, package.__version__ = [{path!r}], "0.1.0"
sys.modules["gkl_jax"] = package
"""


def _no_jax_run(setup):
    done = subprocess.run([sys.executable, "-c", _NO_JAX.format(setup=setup)], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip(), done.stderr


def test_version_help_and_input_errors_do_not_import_jax():
    """`gkl-jax --version`, a missing file and a bad argument end before JAX (or numpy) is imported. cli.py is
    checked below the package's __init__ (a bare package module standing in for it); the whole command, from
    `import gkl_jax`, where gkl_jax/__init__.py loads its subpackages lazily."""
    package_dir = os.path.dirname(gk.__file__)
    out, err = _no_jax_run(_BARE_PACKAGE.format(path=package_dir))
    assert out.startswith("gkl-jax 0.1.0\n[0, 2, 2] [] "), out
    assert err.splitlines() == ["gkl-jax: error: file not found: missing.csv",
                                "gkl-jax: error: argument --rank: must be a positive integer, got '0' (see "
                                "'gkl-jax fit --help')"], err
    if not hasattr(gk, "__getattr__"):  # no lazy loading (PEP 562): `import gkl_jax` alone imports JAX
        pytest.skip("gkl_jax/__init__.py imports its subpackages (and JAX) eagerly")
    out, _ = _no_jax_run("")
    assert "[0, 2, 2] [] " in out, out


def test_the_demo_writes_into_its_own_folder(capsys, tmp_path, monkeypatch):
    """`gkl-jax demo` from a clone's root writes ./gkl-jax-demo/gkl_jax_demo.png (ignored by git), not a PNG
    beside the sources. Stops before JAX."""
    monkeypatch.chdir(tmp_path)
    _stop_before_jax(monkeypatch)
    with pytest.raises(_Reached):
        cli.main(["demo", "--quiet"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [cli.DEMO_DIR]
