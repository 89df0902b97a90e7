"""Long sessions (issue 38): XLA's CPU backend keeps ~300 memory mappings per compiled fit, and a process that
compiled ~200 fits of different shapes segfaulted at Linux's default vm.max_map_count (65530). `gkl_jax._xla`
clears JAX's compilation caches after a compilation that leaves the process past `mapping_limit()`. Each test
runs in a fresh subprocess (the suite's own processes clear caches between tests: tests/conftest.py)."""

import os
import subprocess
import sys

import pytest

_SCRIPT = """
import sys
import jax
import numpy as np
jax.config.update("jax_enable_x64", True)
import gkl_jax as gk
from gkl_jax import _xla
fits, peak = int(sys.argv[1]), 0
factors = (gk.factors.Full, gk.factors.Diagonal)
potential = gk.potentials.Logistic if sys.argv[2] == "logistic" else gk.potentials.Gaussian
for i in range(fits):
    D, N = 1 + i % 13, 3 + i                  # a new shape every fit
    rng = np.random.default_rng(i)
    H, y = rng.normal(size=(N, D)), np.where(rng.normal(size=N) > 0, 1.0, -1.0)
    res = gk.fit(gk.Model(gk.priors.Isotropic(D, 1.0), gk.Sites(H, potential(y))), factors[i % 2]())
    assert np.isfinite(float(res.log_z)) and bool(res.converged)
    peak = max(peak, _xla.mapping_count())
print(peak, _xla.RELEASES["count"], _xla.mapping_limit())
"""


def _session(fits, potential, limit=None):
    env = dict(os.environ)
    if limit is not None:
        env["GKL_JAX_MAX_MAPPINGS"] = str(limit)
    out = subprocess.run([sys.executable, "-c", _SCRIPT, str(fits), potential], env=env, capture_output=True,
                         text=True, timeout=3600)
    assert out.returncode == 0, out.stderr[-2000:]
    return [int(x) for x in out.stdout.split()]


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts Linux memory mappings")
@pytest.mark.slow
def test_mappings_stay_below_the_limit_across_shapes():
    """Ten shapes under a limit of 1500 mappings (a fresh process holds ~450, a compiled fit ~300): the caches
    are cleared whenever a compilation crosses it, and the count measured after each fit never exceeds it."""
    peak, releases, limit = _session(10, "gaussian", limit=1500)
    assert limit == 1500 and releases >= 2 and peak <= limit


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts Linux memory mappings")
@pytest.mark.extended
def test_two_hundred_shapes_in_one_process():
    """200 logistic fits of different shapes (Full and Diagonal) at the kernel's own vm.max_map_count: the
    process ends normally with its mappings below half of it."""
    peak, releases, limit = _session(200, "logistic")
    assert peak <= limit
