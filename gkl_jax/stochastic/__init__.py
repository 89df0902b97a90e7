"""Data larger than one pass: minibatch (stochastic) G-KL fits and the full-data bound streamed in chunks."""

from ._minibatch import bound_chunked as bound_chunked
from ._minibatch import fit_minibatch as fit_minibatch
from ._minibatch import minibatch_bound as minibatch_bound
from ._subsample import SelectRows as SelectRows
from ._subsample import slice_sites as slice_sites
from ._subsample import take_sites as take_sites
