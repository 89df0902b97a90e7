import os

# The suite is compile-bound. XLA's CPU backend at LLVM optimisation level 0 and without its fusion emitters
# compiled the ionosphere Full fit in 2.1 s instead of 13.2 s with XLA's defaults (the loaded machine; the
# library's own choice, no fusion emitters at level 2, took 8.8 s there: `gkl_jax._xla_options`), and ran it 2-3x
# slower; the compiled programs compute the same IEEE results (no fast-math either way). Set before the backend
# starts; inherited by the notebook kernels and CLI subprocesses the tests launch, and respected by
# `gkl_jax._xla_options` (options set in XLA_FLAGS win).
for _flag in ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false"):
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
# One BLAS thread per worker: two xdist workers on two cores with OpenBLAS's default thread pool each (LAPACK
# behind JAX's CPU Cholesky and triangular solves) oversubscribe the cores, and OpenBLAS's threads busy-wait (a
# 300 x 300 Cholesky: 324 ms with 2 threads on a loaded machine, 0.97 ms with 1).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# The CLI keeps compiled programs in a persistent cache under ~/.cache; the tests that run it in-process would
# turn that on for the whole session. Off here; tests/test_cli_process.py checks the cache in subprocesses.
os.environ.setdefault("GKL_JAX_CACHE_DIR", "")
# The library clears JAX's caches when a compilation crosses its mapping limit (gkl_jax._memory);
# inside a test that would recompile what the test is counting. The suite releases between tests instead (below);
# tests/test_long_session.py checks the library's release in subprocesses.
os.environ.setdefault("GKL_JAX_MAX_MAPPINGS", "0")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)

_MAX_MAPPINGS = int(os.environ.get("GKL_TEST_MAX_MAPPINGS", "8000"))
"""XLA's CPU backend keeps every compiled program's code in its own memory mappings (~500 for one compiled
`gk.fit` here), freed only with the program. One pytest worker compiles thousands of programs; at Linux's default
vm.max_map_count of 65530 the next compilation segfaults inside XLA (seen at 65,382 mappings in
test_multiclass). Past this count the jit caches are cleared between tests, which frees them, and the C heap is
trimmed. Memory: on 2 idle cores the default run's workers peaked at 4.7 and 5.0 GB resident with 40,000 (10.1 GB
together) and at 2.5 and 3.3 GB with 16,000 (5.4 GB together), in the same 14 min 45-50 s; with 8,000 at 1.6 and 2.0 GB
(3.8 GB together, within the 4 GB for 2 workers) in 15 min 20 s (GKL_TEST_MAX_MAPPINGS overrides it)."""


def pytest_addoption(parser):
    parser.addoption("--extended", action="store_true", default=False,
                     help="also run the tests marked `extended` (large example budgets, whole-notebook runs, "
                          "long sessions); the nightly workflow runs them. GKL_EXTENDED=1 does the same.")


def _listed_slow():
    """Node ids in tests/slow_tests.txt (written by tests/_slow_list.py from a timed run)."""
    path = os.path.join(os.path.dirname(__file__), "slow_tests.txt")
    with open(path) as fh:
        return {line.strip() for line in fh if line.strip() and not line.startswith("#")}


def pytest_collection_modifyitems(config, items):
    """Three tiers: `-m "not slow"` is the quick subset; the default run adds the `slow` tests (marked in their
    file or listed in tests/slow_tests.txt); `--extended` (or GKL_EXTENDED=1) adds the `extended` ones, which are
    otherwise skipped with the reason."""
    listed = _listed_slow()
    for item in items:
        if item.nodeid in listed or item.nodeid.split("[")[0] in listed:     # a line without [...]: every case
            item.add_marker(pytest.mark.slow)
    if config.getoption("--extended") or os.environ.get("GKL_EXTENDED", "") == "1":
        return
    skip = pytest.mark.skip(reason="extended tier: run with `pytest --extended` (nightly workflow)")
    for item in items:
        if "extended" in item.keywords:
            item.add_marker(skip)


_COMPILE_LOG = os.environ.get("GKL_TEST_COMPILE_LOG", "")
"""A file each worker appends `test<TAB>event<TAB>program<TAB>seconds` lines to, one per tracing, lowering and XLA
compilation (JAX's monitoring events): where the suite's time goes (`python tests/_compile_report.py FILE`)."""
_current_test = ["(collection)"]

if _COMPILE_LOG:
    def _log_compile(event, seconds, fun_name="?", **_):
        if event.startswith("/jax/core/compile/") or event.startswith("/jax/compilation_cache/"):
            with open(_COMPILE_LOG, "a") as out:
                out.write(f"{_current_test[0]}\t{event.rsplit('/', 1)[-1]}\t{fun_name}\t{seconds:.4f}\n")

    jax.monitoring.register_event_duration_secs_listener(_log_compile)


@pytest.fixture(autouse=True)
def _release_compiled_programs(request):
    _current_test[0] = request.node.nodeid
    yield
    from gkl_jax._memory import release_if_crowded

    release_if_crowded(_MAX_MAPPINGS)


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(0)


@pytest.fixture
def ieee_float32():
    """float32 matrix products in full precision, also on GPU and TPU, where JAX's default uses TF32/bfloat16
    passes (about 1e-3 relative), for tests that call operators directly against IEEE float32 oracles (`fit`,
    `bound` and the GP prior set it themselves). On an H200 (jax 0.11.2) such a test failed without it; the CPU
    computes float32 products in full precision either way."""
    with jax.default_matmul_precision("highest"):
        yield
