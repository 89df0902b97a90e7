"""Long sessions (issue 38): XLA's CPU backend keeps ~300 memory mappings per compiled fit, and a process that
compiled ~200 fits of different shapes segfaulted at Linux's default vm.max_map_count (65530), and each compiled
program holds ~25 MB of heap. `gkl_jax._memory` clears JAX's compilation caches (and trims the heap) after a
compilation that leaves the process past `mapping_limit()`. Each test
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
from gkl_jax import _memory
fits, peak, anon = int(sys.argv[1]), 0, []
factors = (gk.factors.Full, gk.factors.Diagonal)
potential = gk.potentials.Logistic if sys.argv[2] == "logistic" else gk.potentials.Gaussian
for i in range(fits):
    D, N = 1 + i % 13, 3 + i                  # a new shape every fit
    rng = np.random.default_rng(i)
    H, y = rng.normal(size=(N, D)), np.where(rng.normal(size=N) > 0, 1.0, -1.0)
    res = gk.fit(gk.Model(gk.priors.Isotropic(D, 1.0), gk.Sites(H, potential(y))), factors[i % 2]())
    assert np.isfinite(float(res.log_z)) and bool(res.converged)
    peak = max(peak, _memory.mapping_count())
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    anon.append(int(status["RssAnon"].split()[0]) // 1024)
print(peak, _memory.RELEASES["count"], _memory.mapping_limit(), max(anon) - anon[0])
"""


def _session(fits, potential, limit=None):
    env = dict(os.environ)
    env.pop("GKL_JAX_MAX_MAPPINGS", None)       # tests/conftest.py turns the release off in the suite's workers
    if limit is not None:
        env["GKL_JAX_MAX_MAPPINGS"] = str(limit)
    out = subprocess.run([sys.executable, "-c", _SCRIPT, str(fits), potential], env=env, capture_output=True,
                         text=True, timeout=3600)
    assert out.returncode == 0, out.stderr[-2000:]
    return [int(x) for x in out.stdout.split()]


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts Linux memory mappings")
@pytest.mark.slow
def test_mappings_and_memory_stay_bounded_across_shapes():
    """Six shapes under a limit of 1000 mappings (a fresh process holds ~450, a compiled fit ~300 and ~25 MB
    of heap): the caches are cleared whenever a compilation crosses it, the count measured after each fit never
    exceeds it, and the heap stays within a few programs' worth (without the release: ~275 MB more)."""
    peak, releases, limit, growth_mb = _session(6, "gaussian", limit=1000)
    assert limit == 1000 and releases >= 2 and peak <= limit, (peak, releases)
    assert growth_mb < 150, growth_mb


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts Linux memory mappings")
@pytest.mark.extended
def test_two_hundred_shapes_in_one_process():
    """200 logistic fits of different shapes (Full and Diagonal) at the kernel's own vm.max_map_count: the
    process ends normally with its mappings below the library's limit (12,288 here)."""
    peak, releases, limit, _ = _session(200, "logistic")
    assert peak <= limit and releases >= 1
