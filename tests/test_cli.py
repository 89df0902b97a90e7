"""The `gkl-jax` command line: demo, fit for every likelihood, JSON output, label mapping, error handling, input
hints. Save and predict: tests/test_cli_predict.py; the process (broken pipes, entry point, compilation cache):
tests/test_cli_process.py."""

import json

import _helpers_cli
import numpy as np
import pytest
from _helpers_cli import D, N, _one_line_error, _write, run

import gkl_jax as gk
from gkl_jax import _cli_input

# fixtures shared with the other test_cli_* files (defined in _helpers_cli.py)
files = _helpers_cli.files


# ------------------------------------------------------------------------------------------------ basics


def test_version(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.strip() == f"gkl-jax {gk.__version__}"


def test_help_and_missing_command(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "demo" in out and "fit" in out
    code, _, err = run(capsys)
    assert code == 2 and "usage" in err


def test_demo_end_to_end(capsys, tmp_path):
    code, out, err = run(capsys, "demo", "--output-dir", tmp_path / "out", "--seed", 0)
    assert code == 0, err
    assert "G-KL Full" in out and "G-KL Diagonal" in out and "MAP (Newton)" in out
    assert "[5/5]" in err
    png = tmp_path / "out" / "gkl_jax_demo.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = {line.split()[1]: line.split() for line in out.splitlines() if line.startswith("G-KL")}
    full, diag = float(rows["Full"][2]), float(rows["Diagonal"][2])
    assert full > diag  # the full factor family contains the diagonal one
    for r in rows.values():
        assert 0.8 < float(r[3]) <= 1.0  # test accuracy on ionosphere


# ------------------------------------------------------------------------------------------------ fit


@pytest.mark.parametrize("likelihood, key, extra", [
    ("logistic", "strings", []),
    ("probit", "strings", []),
    ("gaussian", "regression", ["--noise-variance", "0.2"]),
    ("laplace", "regression", ["--scale", "0.5"]),
    ("student-t", "regression", ["--dof", "5", "--scale", "0.5"]),
    ("poisson", "counts", []),
])
def test_fit_each_likelihood(capsys, files, likelihood, key, extra):
    # logistic uses the full factor, shared (same shapes, one compilation) with the JSON tests below
    factor = "full" if likelihood == "logistic" else "diagonal"
    code, out, err = run(capsys, "fit", files[key], "--likelihood", likelihood, "--factor", factor,
                         "--quiet", *extra)
    assert code == 0, err
    assert err == ""
    table = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("  ")}
    for column in ("a", "b", "c", "bias"):
        mean, sd = map(float, table[column])
        assert np.isfinite(mean) and sd > 0
    assert float(table["b"][0]) < 0 < float(table["a"][0])  # the generating weights are (1, -2, 0.5)
    assert "log Z >=" in out and "converged: yes" in out


def test_fit_json_matches_the_library(capsys, files, tmp_path):
    path = tmp_path / "result.json"
    code, out, err = run(capsys, "fit", files["strings"], "--target", "label", "--factor", "full",
                         "--prior-variance", "2", "--output", path)
    assert code == 0, err
    assert "[1/2] fitting the full G-KL factor" in err and "[2/2] writing" in err
    assert "label mapping: 'no' -> -1, 'yes' -> +1" in out
    result = json.loads(path.read_text())
    assert result["columns"] == ["a", "b", "c", "bias"] and result["target"] == "label"
    assert result["label_mapping"] == {"no": -1.0, "yes": 1.0}
    assert result["likelihood"] == "logistic" and result["factor"] == "full"
    assert result["prior_variance"] == 2.0 and result["num_rows"] == N and result["converged"] is True
    H = np.hstack([files["X"], np.ones((N, 1))])
    y = np.where(files["yes"], 1.0, -1.0)
    model = gk.Model(gk.priors.Isotropic(dim=D + 1, variance=2.0), gk.Sites(H, gk.potentials.Logistic(y)))
    ref = gk.fit(model, factor=gk.factors.Full())
    np.testing.assert_allclose(result["mean"], ref.q.mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(result["sd"], np.sqrt(ref.q.marginal_variances()), rtol=1e-9)
    np.testing.assert_allclose(result["log_z"], ref.log_z, rtol=1e-12)


@pytest.mark.parametrize("name, factor", [("chevron", gk.factors.Chevron(rows=2)),
                                          ("factor-analysis", gk.factors.FactorAnalysis(rank=2))])
def test_fit_with_a_structured_factor_matches_the_library(capsys, files, tmp_path, name, factor):
    path = tmp_path / "result.json"
    code, out, err = run(capsys, "fit", files["strings"], "--factor", name, "--rank", "2", "--output", path)
    assert code == 0, err
    assert f"{name} ({'rows' if name == 'chevron' else 'rank'}=2) factor" in out
    result = json.loads(path.read_text())
    assert result["factor"] == name and result["rank"] == 2 and result["converged"] is True
    H = np.hstack([files["X"], np.ones((N, 1))])
    model = gk.Model(gk.priors.Isotropic(dim=D + 1, variance=1.0),
                     gk.Sites(H, gk.potentials.Logistic(np.where(files["yes"], 1.0, -1.0))))
    ref = gk.fit(model, factor=factor)
    np.testing.assert_allclose(result["mean"], ref.q.mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(result["sd"], np.sqrt(ref.q.marginal_variances()), rtol=1e-9)
    np.testing.assert_allclose(result["log_z"], ref.log_z, rtol=1e-12)
    # a structured factor's bound is below the Full one's (papers/000 §4: a subset of the covariances)
    full = gk.fit(model, factor=gk.factors.Full())
    assert result["log_z"] <= float(full.log_z) + 1e-9


def test_fit_no_header_integer_target_and_zero_one_labels(capsys, files, tmp_path):
    path = tmp_path / "r.json"
    code, out, err = run(capsys, "fit", files["zero_one_first"], "--no-header", "--target", "0",
                         "--prior-variance", "2", "--output", path, "--quiet")
    assert code == 0, err
    result = json.loads(path.read_text())
    assert result["columns"] == ["c1", "c2", "c3", "bias"] and result["target"] == "c0"
    assert result["label_mapping"] == {"0": -1.0, "1": 1.0}
    # same data as strings.csv with yes -> 1: the same posterior
    code, _, _ = run(capsys, "fit", files["strings"], "--prior-variance", "2",
                     "--output", tmp_path / "s.json", "--quiet")
    other = json.loads((tmp_path / "s.json").read_text())
    np.testing.assert_allclose(result["mean"], other["mean"], rtol=1e-10)


def test_fit_standardized_with_positive_label(capsys, files, tmp_path):
    path = tmp_path / "full.json"
    code, out, err = run(capsys, "fit", files["strings"], "--factor", "full", "--standardize", "--positive-label",
                         "no", "--output", path, "--quiet")
    assert code == 0, err
    result = json.loads(path.read_text())
    assert result["factor"] == "full" and result["label_mapping"] == {"no": 1.0, "yes": -1.0}
    np.testing.assert_allclose(result["standardization"]["mean"], files["X"].mean(axis=0))
    assert float(result["mean"][1]) > 0  # labels flipped: the weight of b changes sign
    assert "standardised" in out


@pytest.mark.parametrize("values, expected", [
    (["0", "1", "1", "0"], {"0": -1.0, "1": 1.0}),
    (["1", "-1", "1"], {"-1": -1.0, "1": 1.0}),
    (["+1", "-1"], {"-1": -1.0, "+1": 1.0}),
    (["1", "1.0", "0"], {"0": -1.0, "1": 1.0, "1.0": 1.0}),
    (["4", "2", "10"][:2], {"2": -1.0, "4": 1.0}),
    (["10", "9"], {"9": -1.0, "10": 1.0}),  # numeric, not string, order
    (["g", "b", "g"], {"b": -1.0, "g": 1.0}),
    (["1", "1"], {"1": 1.0}),  # one class of a 0/1 coding is still unambiguous
    (["1_000", "999"], {"1_000": -1.0, "999": 1.0}),  # '1_000' is a string, not 1000
])
def test_binary_label_mapping(values, expected):
    y, mapping = _cli_input.binary_labels(values, list(range(2, 2 + len(values))), "t")
    assert mapping == expected
    np.testing.assert_array_equal(y, [expected[v] for v in values])


def test_binary_label_mapping_positive_label():
    y, mapping = _cli_input.binary_labels(["0", "1", "0"], [2, 3, 4], "t", positive="0")
    assert mapping == {"0": 1.0, "1": -1.0} and list(y) == [1.0, -1.0, 1.0]
    _, mapping = _cli_input.binary_labels(["yes"], [2], "t", positive="yes")
    assert mapping == {"yes": 1.0}


@pytest.mark.parametrize("args, fragment", [
    (["{dir}/missing.csv"], "file not found"),
    (["{dir}"], "is a directory"),
    (["{strings}", "--target", "nope"], "unknown target column 'nope'; columns: 'a', 'b', 'c', 'label'"),
    (["{strings}", "--target", "7"], "--target 7 is out of range: the file has 4 columns (indices 0 to 3, or -4"),
    (["{strings}", "--target", "-5"], "--target -5 is out of range"),
    (["{non_numeric}"], "non-numeric value 'abc' in column 'b' (line 2)"),
    (["{nan}"], "missing or NaN value 'nan' in column 'b' (line 7)"),
    (["{inf}"], "non-finite value '-inf' in column 'c' (line 3)"),
    (["{empty_field}"], "missing or NaN value '' in column 'b' (line 4)"),
    (["{three_labels}"], "bad labels in target column 'label'"),
    (["{one_label}"], "only one class 'yes'"),
    (["{ragged}"], "line 6: 2 fields, expected 4"),
    (["{underscore}"], "non-numeric value '1_000' in column 'a' (line 3)"),  # float() would read 1000
    (["{huge}"], "values in column 'a' are too large (up to "),
    (["{header_only}"], "no data rows"),
    (["{empty}"], "has no rows"),
    (["{strings}", "--prior-variance", "0"], "--prior-variance: must be a positive finite number, got '0'"),
    (["{strings}", "--prior-variance", "-1"], "must be a positive finite number"),
    (["{strings}", "--prior-variance", "inf"], "must be a positive finite number"),
    (["{strings}", "--prior-variance", "abc"], "must be a positive finite number"),
    (["{regression}", "--likelihood", "student-t", "--dof", "0"], "--dof: must be a positive"),
    (["{strings}", "--likelihood", "gaussian"], "non-numeric value 'no' in column 'label'"),
    (["{strings}", "--likelihood", "poisson"], "non-numeric value 'no'"),
    (["{negative_counts}", "--likelihood", "poisson"], "counts for poisson must be non-negative integers"),
    (["{fractional_counts}", "--likelihood", "poisson"], "counts for poisson must be non-negative integers"),
    (["{strings}", "--dof", "3"], "--dof applies only to --likelihood student-t"),
    (["{strings}", "--noise-variance", "1"], "--noise-variance applies only to --likelihood gaussian"),
    (["{regression}", "--likelihood", "gaussian", "--positive-label", "1"], "--positive-label applies only"),
    (["{strings}", "--positive-label", "maybe"], "--positive-label 'maybe' does not occur"),
    (["{strings}", "--likelihood", "cauchy"], "invalid choice: 'cauchy'"),
    (["{strings}", "--factor", "cholesky"], "invalid choice: 'cholesky'"),
    (["{strings}", "--factor", "banded"], "--factor banded needs --rank K (its bandwidth; D = 4 weights)"),
    (["{strings}", "--factor", "banded", "--rank", "4"], "--rank 4 is too large for --factor banded: its "
                                                          "bandwidth must be <= 3 for D = 4 weights"),
    (["{strings}", "--factor", "chevron", "--rank", "5"], "its rows must be <= 4"),
    (["{strings}", "--factor", "subspace", "--rank", "0"], "--rank: must be a positive integer, got '0'"),
    (["{strings}", "--factor", "chevron", "--rank", "0"], "--rank: must be a positive integer, got '0'"),
    (["{strings}", "--factor", "banded", "--rank", "0"], "--rank: must be a positive integer, got '0'"),
    (["{strings}", "--factor", "factor-analysis", "--rank", "0"], "--rank: must be a positive integer"),
    (["{strings}", "--factor", "factor-analysis", "--rank", "-2"], "--rank: must be a positive integer"),
    (["{strings}", "--factor", "diagonal", "--rank", "2"], "--rank applies only to --factor chevron / banded"),
    (["{strings}", "--output", "{dir}/no/such/dir/r.json"], "directory"),
    (["{strings}", "--output", "{dir}"], "is a directory"),
    (["{strings}", "--delimiter", ";;"], "--delimiter must be one character"),
    (["{strings}", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_fit_errors_are_one_line_with_status_2(capsys, files, args, fragment):
    argv = ["fit"] + [a.format(**{k: v for k, v in files.items() if isinstance(v, str)}) for a in args]
    _one_line_error(*run(capsys, *argv), fragment)


def test_demo_output_dir_that_is_a_file(capsys, tmp_path):
    target = tmp_path / "file.txt"
    target.write_text("x")
    _one_line_error(*run(capsys, "demo", "--output-dir", target), "exists and is not a directory")


@pytest.mark.parametrize("seed", ["x", "-1", "1.5"])
def test_demo_bad_seed(capsys, tmp_path, seed):
    """Refused while parsing, before the demo creates its output directory."""
    out_dir = tmp_path / "out"
    _one_line_error(*run(capsys, "demo", "--seed", seed, "--output-dir", out_dir),
                    f"--seed: must be a non-negative integer, got '{seed}'")
    assert not out_dir.exists()


# ------------------------------------------------------------------------------------------------ hints (issue 64)


@pytest.mark.parametrize("delimiter, typed, name", [(";", "';'", "semicolons"), ("\t", "$'\\t'", "tabs")])
def test_one_column_header_gets_a_delimiter_hint(capsys, files, tmp_path, delimiter, typed, name):
    """A file that is one column under ',' but several under ';' or a tab: the error names --delimiter, and that
    delimiter reads it."""
    path = tmp_path / "semi.csv"
    rows = [delimiter.join(["a", "b", "c", "label"])] + [
        delimiter.join([str(v) for v in x] + ["yes" if t else "no"]) for x, t in zip(files["X"], files["yes"])]
    path.write_text("\n".join(rows) + "\n")
    _one_line_error(*run(capsys, "fit", path), f"its first row splits into 4 columns at {name}: pass --delimiter "
                                               f"{typed}")
    names, body = _cli_input.read_table(str(path), delimiter=delimiter)
    assert names == ["a", "b", "c", "label"] and len(body) == N
    plain = tmp_path / "one.csv"
    plain.write_text("y\n1\n2\n")
    code, _, err = run(capsys, "fit", plain)
    assert code == 2 and "found 1" in err and "--delimiter" not in err


def test_large_scale_binary_inputs_get_a_standardize_note(capsys, files, tmp_path):
    """Logistic inputs with a column sd above 100 get one warning line naming the column and --standardize; with
    --standardize, or a Gaussian likelihood, none."""
    X = files["X"] * np.array([1.0, 1e4, 1.0])
    path = _write(tmp_path / "big.csv", ["a", "b", "c", "label"],
                  [list(x) + ["yes" if t else "no"] for x, t in zip(X, files["yes"])])
    code, _, err = run(capsys, "fit", path, "--quiet")
    notes = [line for line in err.splitlines() if "--standardize" in line]
    assert code == 0 and len(notes) == 1 and f"'b' (sd {X[:, 1].std():.3g})" in notes[0] and "'a'" not in notes[0], err
    code, _, err = run(capsys, "fit", path, "--quiet", "--standardize")
    assert code == 0 and "sd above" not in err
