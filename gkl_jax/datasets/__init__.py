"""Bundled small data sets (with their attribution) and the papers' synthetic generators.

    X, y, feature_names = gk.datasets.load("ionosphere")   # see gk.datasets.available()
    gk.datasets.info("ionosphere")                          # task, label mapping, notes, UCI description

The UCI files and their `.names` descriptions live in `gkl_jax/datasets/data/` (origin, licence and citations
in `data/README.txt`).
"""

from ._synthetic import synthetic_logistic as synthetic_logistic
from ._uci import Dataset as Dataset
from ._uci import available as available
from ._uci import data_path as data_path
from ._uci import info as info
from ._uci import load as load
