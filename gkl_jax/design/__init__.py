"""Bayesian sequential experimental design driven by any fitted Gaussian (Challis & Barber 2013, Section 6.3)."""

from ._scores import as_gaussian as as_gaussian
from ._scores import candidate_gains as candidate_gains
from ._scores import greedy_selection as greedy_selection
from ._scores import information_gain as information_gain
from ._scores import leading_directions as leading_directions
from ._scores import optimal_directions as optimal_directions
from ._sequential import DesignStep as DesignStep
from ._sequential import SequentialDesign as SequentialDesign
from ._sequential import padded_measurement_sites as padded_measurement_sites
from ._sequential import sequential as sequential
from ._slm import map_estimate as map_estimate
from ._slm import smoothed_log_density as smoothed_log_density
from ._slm import sparse_linear_model as sparse_linear_model
