"""Loaders for the small UCI data sets bundled in `gkl_jax/datasets/data/` (attribution in `data/README.txt`).

Every loader returns a `Dataset(X, y, feature_names)` named tuple (so `X, y, names = load("sonar")` works):

- `X`: float64 array (num_rows, num_features), raw (unstandardised) inputs;
- `y`: binary tasks: float64 labels in {-1, +1} (ready for `potentials.Logistic`/`Probit`);
  multi-class tasks: int64 class indices 0..K-1; regression tasks: float64 targets;
- `feature_names`: tuple of str, one per column of X.

`info(name)` gives the task type, the label mapping, the number of rows and columns, the source file and the
full UCI description (`.names` text).
"""

import csv
import io
from importlib import resources
from typing import NamedTuple

import numpy as np


class Dataset(NamedTuple):
    """A loaded data set: inputs X (float64), targets y, and the input column names.

    Attributes:
        X: (num_rows, num_features) float64 array of raw (unstandardised) inputs.
        y: (num_rows,) targets: float64 labels in {-1, +1} (binary tasks), int64 class indices 0..K-1
            (multi-class tasks) or float64 values (regression).
        feature_names: tuple of num_features str.
    """

    X: np.ndarray
    y: np.ndarray
    feature_names: tuple


_GERMAN_ATTRIBUTES = (
    ("checking_status", True), ("duration_months", False), ("credit_history", True), ("purpose", True),
    ("credit_amount", False), ("savings", True), ("employment_since", True), ("installment_rate", False),
    ("personal_status_sex", True), ("other_debtors", True), ("residence_since", False), ("property", True),
    ("age_years", False), ("other_installment_plans", True), ("housing", True), ("existing_credits", False),
    ("job", True), ("num_dependents", False), ("telephone", True), ("foreign_worker", True),
)

# name -> file, task, feature names (None: generated or special), label mapping (original -> y), notes.
_SPECS = {
    "ionosphere": dict(
        file="ionosphere.csv", names_file="ionosphere.names", task="binary",
        features=tuple(f"pulse{i // 2 + 1:02d}_{'re' if i % 2 == 0 else 'im'}" for i in range(34)),
        labels={"g": 1.0, "b": -1.0},
        target="radar return: 'g' (good, +1) or 'b' (bad, -1)",
        notes="Column pulse01_im is constant (all zeros)."),
    "sonar": dict(
        file="sonar.csv", names_file="sonar.names", task="binary",
        features=tuple(f"band{i + 1:02d}" for i in range(60)),
        labels={"M": 1.0, "R": -1.0},
        target="object: 'M' (metal cylinder/mine, +1) or 'R' (rock, -1)",
        notes=""),
    "breast-cancer-wisconsin": dict(
        file="breast-cancer-wisconsin.csv", names_file="breast-cancer-wisconsin.names", task="binary",
        features=("clump_thickness", "uniformity_cell_size", "uniformity_cell_shape", "marginal_adhesion",
                  "single_epithelial_cell_size", "bare_nuclei", "bland_chromatin", "normal_nucleoli",
                  "mitoses"),
        labels={"4": 1.0, "2": -1.0},
        target="diagnosis: 4 (malignant, +1) or 2 (benign, -1)",
        notes="The 16 rows with a missing value ('?', all in bare_nuclei) are dropped: 699 -> 683 rows. "
              "The sample code number (id) is not part of the bundled file."),
    "pima": dict(
        file="pima-indians-diabetes.csv", names_file="pima-indians-diabetes.names", task="binary",
        features=("pregnancies", "plasma_glucose", "diastolic_blood_pressure", "triceps_skin_fold",
                  "serum_insulin", "bmi", "diabetes_pedigree", "age_years"),
        labels={"1": 1.0, "0": -1.0},
        target="tested positive for diabetes: 1 (+1) or 0 (-1)",
        notes="Zeros in glucose, blood pressure, skin fold, insulin and BMI are missing values in the original "
              "data; they are kept as 0 (as most published comparisons do)."),
    "german": dict(
        file="german.csv", names_file="german.names", task="binary",
        features=None,
        labels={"2": 1.0, "1": -1.0},
        target="credit risk: 2 (bad, +1) or 1 (good, -1)",
        notes="The 13 qualitative attributes are one-hot encoded with the first level present in the data "
              "(in code order, e.g. A11) as the reference level, so that X has 7 numeric + 41 indicator = 48 "
              "columns named 'attribute=code' (codes explained in german.names)."),
    "banknote": dict(
        file="banknote_authentication.csv", names_file="banknote_authentication.names", task="binary",
        features=("wavelet_variance", "wavelet_skewness", "wavelet_curtosis", "image_entropy"),
        labels={"1": 1.0, "0": -1.0},
        target="class: 1 (+1) or 0 (-1); the UCI description does not say which of genuine/forged is which",
        notes=""),
    "new-thyroid": dict(
        file="new-thyroid.csv", names_file="new-thyroid.names", task="multiclass",
        features=("t3_resin_uptake", "total_serum_thyroxin", "total_serum_triiodothyronine", "basal_tsh",
                  "max_abs_diff_tsh"),
        labels={"1": 0, "2": 1, "3": 2},
        target="thyroid state: 1 normal -> 0, 2 hyper -> 1, 3 hypo -> 2",
        notes="The class, first in the original file, is the last column of the bundled copy."),
    "glass": dict(
        file="glass.csv", names_file="glass.names", task="multiclass",
        features=("refractive_index", "Na", "Mg", "Al", "Si", "K", "Ca", "Ba", "Fe"),
        labels={"1": 0, "2": 1, "3": 2, "5": 3, "6": 4, "7": 5},
        target="glass type 1, 2, 3, 5, 6, 7 -> 0..5 (type 4, vehicle windows non-float, has no rows)",
        notes="The Id column is not part of the bundled file."),
    "housing": dict(
        file="housing.csv", names_file="housing.names", task="regression",
        features=("CRIM", "ZN", "INDUS", "CHAS", "NOX", "RM", "AGE", "DIS", "RAD", "TAX", "PTRATIO", "B",
                  "LSTAT"),
        labels=None,
        target="MEDV: median value of owner-occupied homes in $1000's",
        notes="Boston housing; the target is censored at 50.0."),
    "slump": dict(
        file="slump_test.data", names_file="slump_test.names", task="regression",
        features=("cement", "slag", "fly_ash", "water", "superplasticizer", "coarse_aggregate",
                  "fine_aggregate", "slump_cm", "flow_cm"),
        labels=None,
        target="28-day compressive strength (MPa)",
        notes="Target choice: the data set has 7 ingredient inputs and 3 outputs (slump, flow, 28-day "
              "compressive strength). Following the D = 9 reported for this data set by Challis & Barber "
              "(Challis & Barber 2013, Section 6.1), the 7 ingredients plus slump and flow are the inputs and the "
              "compressive strength is the target. The row number column 'No' is dropped."),
}


def available() -> tuple:
    """The names accepted by `load` and `info`.

    Returns:
        tuple of str, sorted.
    """
    return tuple(sorted(_SPECS))


def _spec(name):
    if not isinstance(name, str) or name not in _SPECS:
        raise ValueError(f"name must be one of {', '.join(available())}; got {name!r}")
    return _SPECS[name]


def _bundled_files() -> set:
    """The plain file names in the package's `data/` folder."""
    return {entry.name for entry in resources.files(__package__).joinpath("data").iterdir() if entry.is_file()}


def data_path(filename: str):
    """A `importlib.resources` Traversable for one bundled file (e.g. 'sonar.names' or 'README.txt').

    Args:
        filename: the plain name of a file in `gkl_jax/datasets/data/`.

    Returns:
        `importlib.resources.abc.Traversable` (read it with `.read_text()` or `.open()`).

    Raises:
        ValueError: anything but a bundled file's plain name (a path, another folder's file, a non-string).
    """
    if not isinstance(filename, str) or filename not in _bundled_files():
        raise ValueError(f"filename must be the plain name of a bundled data file in gkl_jax/datasets/data/ (e.g. "
                         f"'sonar.names'); {filename!r} is not one")
    return resources.files(__package__).joinpath("data", filename)


def _read_rows(filename, *, header=False):
    text = data_path(filename).read_text(encoding="utf-8")
    rows = [[field.strip() for field in row] for row in csv.reader(io.StringIO(text)) if row]
    return (rows[0], rows[1:]) if header else (None, rows)


def _floats(rows, name):
    try:
        return np.array(rows, dtype=np.float64)
    except ValueError as err:  # pragma: no cover - the bundled files are checked by the tests
        raise ValueError(f"bundled data set {name!r} has a non-numeric entry: {err}") from None


def _german(rows):
    columns, names = [], []
    for j, (attr, qualitative) in enumerate(_GERMAN_ATTRIBUTES):
        values = [row[j] for row in rows]
        if not qualitative:
            columns.append(np.array(values, dtype=np.float64))
            names.append(attr)
            continue
        levels = sorted(set(values), key=lambda code: int(code[1:]))
        for level in levels[1:]:
            columns.append(np.array([v == level for v in values], dtype=np.float64))
            names.append(f"{attr}={level}")
    return np.stack(columns, axis=1), tuple(names)


def load(name: str) -> Dataset:
    """Load a bundled data set by name. See the module doc for the label encodings and `info(name)` for each
    set's target, label mapping and notes.

    Args:
        name: one of `available()`.

    Returns:
        `Dataset(X, y, feature_names)`: X (num_rows, num_features) float64, y (num_rows,).

    Raises:
        ValueError: an unknown name (the message lists the choices).
    """
    spec = _spec(name)
    _, rows = _read_rows(spec["file"], header=name == "slump")
    if name == "breast-cancer-wisconsin":
        rows = [row for row in rows if "?" not in row]
    targets = [row[-1] for row in rows]
    inputs = [row[:-1] for row in rows]
    if name == "german":
        X, features = _german(inputs)
    elif name == "slump":
        table = _floats([row[1:] for row in rows], name)  # drop the row number
        X = np.concatenate([table[:, :7], table[:, 7:9]], axis=1)
        features = spec["features"]
        targets = table[:, 9]
    else:
        X = _floats(inputs, name)
        features = spec["features"]
    if spec["task"] == "regression":
        y = np.asarray(targets, dtype=np.float64) if name == "slump" else _floats(targets, name)
    else:
        mapping = spec["labels"]
        dtype = np.float64 if spec["task"] == "binary" else np.int64
        y = np.array([mapping[t] for t in targets], dtype=dtype)
    if X.shape[1] != len(features):  # pragma: no cover - guards the hand-written tables above
        raise ValueError(f"bundled data set {name!r} has {X.shape[1]} inputs but {len(features)} names")
    return Dataset(X, y, tuple(features))


def info(name: str) -> dict:
    """Metadata of a bundled data set: task ('binary', 'multiclass', 'regression'), target (text), labels
    (original label -> value in y; None for regression), num_rows, num_features, file, names_file, notes and
    description (the UCI `.names` text with origin and citation).

    Args:
        name: one of `available()`.

    Returns:
        dict with the keys name, task, target, labels, num_rows, num_features, file, names_file, notes and
        description.

    Raises:
        ValueError: an unknown name.
    """
    spec = _spec(name)
    X, _, _ = load(name)
    return {
        "name": name, "task": spec["task"], "target": spec["target"],
        "labels": None if spec["labels"] is None else dict(spec["labels"]),
        "num_rows": int(X.shape[0]), "num_features": int(X.shape[1]),
        "file": spec["file"], "names_file": spec["names_file"], "notes": spec["notes"],
        "description": data_path(spec["names_file"]).read_text(encoding="utf-8", errors="replace"),
    }
