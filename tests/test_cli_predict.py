"""`gkl-jax fit --save` then `gkl-jax predict`: probabilities and regression predictions against the library,
and one-line errors with status 2."""

import _helpers_cli
import numpy as np
from _helpers_cli import D, N, _one_line_error, _write, run

import gkl_jax as gk

# fixtures shared with the other test_cli_* files (defined in _helpers_cli.py)
files = _helpers_cli.files


# ------------------------------------------------------------------------------------------------ fit --save, predict


def _predictions(text):
    lines = text.strip().splitlines()
    return lines[0].split(","), np.array([[float(v) for v in line.split(",")] for line in lines[1:]])


def test_fit_save_then_predict_probabilities(capsys, files, tmp_path):
    """`fit --save` then `predict` on the same file (its target column ignored): the probability of the +1
    label is gk.predict's predictive integral under the library's own fit."""
    model_path = tmp_path / "model.gkl"
    code, _, err = run(capsys, "fit", files["strings"], "--save", model_path, "--quiet")
    assert code == 0, err
    code, out, err = run(capsys, "predict", model_path, files["strings"])
    assert code == 0 and err == "", err
    header, table = _predictions(out)
    H = np.hstack([files["X"], np.ones((N, 1))])
    model = gk.Model(gk.priors.Isotropic(dim=D + 1, variance=1.0),
                     gk.Sites(H, gk.potentials.Logistic(np.where(files["yes"], 1.0, -1.0))))
    reference = gk.predict(gk.fit(model), H, "logistic").probability
    assert header == ["probability_yes"] and table.shape == (N, 1)
    np.testing.assert_allclose(table[:, 0], reference, rtol=1e-9)


def test_fit_save_then_predict_regression_in_the_target_units(capsys, files, tmp_path):
    """Standardised inputs and target, columns reordered and no target in the prediction file: the predictive
    mean and sd (noise included) are the conjugate closed form's, in the target's units."""
    model_path, out_path = tmp_path / "reg.gkl", tmp_path / "pred.csv"
    code, _, err = run(capsys, "fit", files["regression"], "--likelihood", "gaussian", "--standardize",
                       "--standardize-target", "--save", model_path, "--quiet")
    assert code == 0, err
    X, y = files["X"], files["y_reg"]
    new = X[:5] + 0.5
    data = _write(tmp_path / "new.csv", ["c", "a", "b"], [[r[2], r[0], r[1]] for r in new])
    code, out, err = run(capsys, "predict", model_path, data, "--output", out_path)
    assert code == 0 and out == "", err
    header, table = _predictions(out_path.read_text())
    mu, sd = X.mean(0), X.std(0)
    H = np.hstack([(X - mu) / sd, np.ones((N, 1))])
    c, s = y.mean(), y.std()
    S = np.linalg.inv(H.T @ H + np.eye(D + 1))
    m = S @ H.T @ ((y - c) / s)
    Hn = np.hstack([(new - mu) / sd, np.ones((5, 1))])
    assert header == ["mean", "sd"]
    np.testing.assert_allclose(table[:, 0], c + s * Hn @ m, rtol=1e-7)
    np.testing.assert_allclose(table[:, 1], s * np.sqrt(np.einsum("nd,de,ne->n", Hn, S, Hn) + 1.0), rtol=1e-7)


def test_predict_errors_are_one_line_with_status_2(capsys, files, tmp_path):
    """Columns that do not match name the missing and extra ones; a file that is not a --save model (a Result
    saved by gk.save, a CSV, a truncated model) and a --save path that cannot be written are refused."""
    model_path = tmp_path / "model.gkl"
    assert run(capsys, "fit", files["strings"], "--save", model_path, "--quiet")[0] == 0
    data = _write(tmp_path / "cols.csv", ["a", "c", "d", "e"], [[1, 2, 3, 4]])
    _one_line_error(*run(capsys, "predict", model_path, data), "missing 'b'; extra 'd', 'e'")
    result_path = tmp_path / "result.gkl"
    gk.save(result_path, gk.fit(gk.Model(gk.priors.Isotropic(2, 1.0), gk.Sites(np.eye(2), gk.potentials.Logistic(
        [1.0, -1.0])))))
    _one_line_error(*run(capsys, "predict", result_path, files["strings"]), "holds a Result, not a model saved by "
                                                                            "'gkl-jax fit --save'")
    _one_line_error(*run(capsys, "predict", files["strings"], files["strings"]), "is not a gkl-jax model file")
    truncated = tmp_path / "truncated.gkl"
    truncated.write_bytes(model_path.read_bytes()[:-30])
    _one_line_error(*run(capsys, "predict", truncated, files["strings"]), f"{truncated} is corrupt")
    _one_line_error(*run(capsys, "fit", files["strings"], "--save", tmp_path / "no" / "m.gkl"),
                    "cannot write --save")
