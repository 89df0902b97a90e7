"""The bundled UCI data sets: shapes, encodings, no missing values, attribution and packaging."""

import fnmatch
import pathlib
import tomllib

import numpy as np
import pytest

import gkl_jax as gk

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = ROOT / "gkl_jax" / "datasets" / "data"

# name -> (rows, inputs, task)
EXPECTED = {
    "ionosphere": (351, 34, "binary"),
    "sonar": (208, 60, "binary"),
    "breast-cancer-wisconsin": (683, 9, "binary"),
    "pima": (768, 8, "binary"),
    "german": (1000, 48, "binary"),
    "banknote": (1372, 4, "binary"),
    "new-thyroid": (215, 5, "multiclass"),
    "glass": (214, 9, "multiclass"),
    "housing": (506, 13, "regression"),
    "slump": (103, 9, "regression"),
}


def test_available_lists_every_loader():
    assert set(gk.datasets.available()) == set(EXPECTED)
    assert list(gk.datasets.available()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_load_shapes_and_encoding(name):
    rows, inputs, task = EXPECTED[name]
    X, y, names = gk.datasets.load(name)
    assert X.shape == (rows, inputs) and X.dtype == np.float64
    assert y.shape == (rows,)
    assert np.all(np.isfinite(X)) and np.all(np.isfinite(y))
    assert len(names) == inputs and len(set(names)) == inputs and all(isinstance(n, str) and n for n in names)
    meta = gk.datasets.info(name)
    assert meta["task"] == task and meta["num_rows"] == rows and meta["num_features"] == inputs
    assert meta["description"].strip() and meta["target"]
    if task == "binary":
        assert y.dtype == np.float64 and set(np.unique(y)) == {-1.0, 1.0}
        assert set(meta["labels"].values()) == {-1.0, 1.0}
    elif task == "multiclass":
        assert y.dtype == np.int64
        np.testing.assert_array_equal(np.unique(y), np.arange(len(meta["labels"])))
    else:
        assert y.dtype == np.float64 and meta["labels"] is None and np.std(y) > 0


def test_named_tuple_fields():
    data = gk.datasets.load("banknote")
    X, y, names = data
    assert data.X is X and data.y is y and data.feature_names == names


@pytest.mark.parametrize("name, positives", [("ionosphere", 225), ("sonar", 111), ("pima", 268),
                                             ("german", 300), ("banknote", 610)])
def test_class_balance_matches_the_uci_description(name, positives):
    _, y, _ = gk.datasets.load(name)
    assert int(np.sum(y == 1)) == positives


def test_multiclass_counts():
    np.testing.assert_array_equal(np.bincount(gk.datasets.load("new-thyroid").y), [150, 35, 30])
    np.testing.assert_array_equal(np.bincount(gk.datasets.load("glass").y), [70, 76, 17, 13, 9, 29])


def test_breast_cancer_drops_rows_with_missing_values():
    raw = (DATA / "breast-cancer-wisconsin.csv").read_text().split()
    assert len(raw) == 699 and sum("?" in line for line in raw) == 16
    X, y, names = gk.datasets.load("breast-cancer-wisconsin")
    assert X.min() >= 1 and X.max() <= 10 and names[5] == "bare_nuclei"


def test_german_one_hot_encoding():
    X, _, names = gk.datasets.load("german")
    indicators = [j for j, n in enumerate(names) if "=" in n]
    assert len(indicators) == 41 and set(np.unique(X[:, indicators])) == {0.0, 1.0}
    checking = [j for j, n in enumerate(names) if n.startswith("checking_status=")]
    assert [names[j] for j in checking] == ["checking_status=A12", "checking_status=A13", "checking_status=A14"]
    # the reference level A11 is the rows with no checking_status indicator set
    raw_first = [line.split(",")[0] for line in (DATA / "german.csv").read_text().split()]
    np.testing.assert_array_equal(X[:, checking].sum(axis=1) == 0, np.array(raw_first) == "A11")


def test_slump_target_is_compressive_strength():
    X, y, names = gk.datasets.load("slump")
    lines = (DATA / "slump_test.data").read_text().strip().splitlines()
    first = [float(v) for v in lines[1].split(",")]
    assert "Compressive Strength" in lines[0].split(",")[-1]
    assert y[0] == first[-1] and list(X[0]) == first[1:-1]
    assert names[-2:] == ("slump_cm", "flow_cm")


def test_housing_target_is_medv():
    X, y, names = gk.datasets.load("housing")
    assert names[-1] == "LSTAT" and y.min() == 5.0 and y.max() == 50.0


@pytest.mark.parametrize("bad", ["iris", "Sonar", "", None, 3])
def test_unknown_name_lists_the_choices(bad):
    with pytest.raises(ValueError, match="name must be one of .*ionosphere.*sonar"):
        gk.datasets.load(bad)
    with pytest.raises(ValueError, match="name must be one of"):
        gk.datasets.info(bad)


def test_data_path_rejects_unknown_files():
    assert gk.datasets.data_path("README.txt").is_file()
    with pytest.raises(ValueError, match="filename"):
        gk.datasets.data_path("nope.csv")


def test_data_path_accepts_every_bundled_file():
    for path in DATA.iterdir():
        if path.is_file():
            assert gk.datasets.data_path(path.name).read_bytes() == path.read_bytes()


@pytest.mark.parametrize("bad", ["/etc/passwd", "../_uci.py", "../__init__.py", "./sonar.csv", "data/sonar.csv",
                                 str(DATA / "sonar.csv"), "", ".", "..", "SONAR.CSV", None, 3, b"sonar.csv"])
def test_data_path_refuses_anything_but_a_bundled_file_name(bad):
    """Only a plain file name inside data/: no path outside it (or into it), and a ValueError, not a TypeError,
    for a non-string."""
    with pytest.raises(ValueError, match="filename must be the plain name of a bundled data file"):
        gk.datasets.data_path(bad)


def test_every_data_file_has_its_attribution():
    data_files = sorted(p.name for p in DATA.iterdir() if p.suffix in (".csv", ".data"))
    assert len(data_files) == 10
    readme = (DATA / "README.txt").read_text()
    assert "UCI Machine Learning Repository" in readme and "CC BY 4.0" in readme
    for name in data_files:
        names_file = DATA / (name.rsplit(".", 1)[0] + ".names")
        assert names_file.is_file() and names_file.stat().st_size > 200, name
        assert name in readme and names_file.name in readme
    for name in gk.datasets.available():
        assert gk.datasets.info(name)["names_file"] in readme


def test_package_data_globs_cover_the_bundled_files():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["gkl_jax.datasets"]
    for path in DATA.iterdir():
        rel = f"data/{path.name}"
        assert any(fnmatch.fnmatch(rel, pattern) for pattern in patterns), rel
