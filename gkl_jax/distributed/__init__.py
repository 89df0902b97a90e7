"""Scale-out: many models as one vectorised program, and the site axis split over devices and hosts."""

from ._batched import TRACE_COUNT as TRACE_COUNT
from ._batched import fit_batched as fit_batched
from ._batched import stack_models as stack_models
from ._sharding import SITE_AXIS as SITE_AXIS
from ._sharding import compiled_text as compiled_text
from ._sharding import replicate as replicate
from ._sharding import shard_sites as shard_sites
from ._sharding import site_mesh as site_mesh
