"""One BLAS/LAPACK thread during the multiclass fits.

JAX's CPU Cholesky, eigh and triangular solves call the LAPACK of SciPy's bundled OpenBLAS, whose worker threads
busy-wait for work. On a machine whose cores are shared with other processes they thrash, by orders of
magnitude for small factorisations (`benchmarks/README.md`, "Multiclass GP classification"). The fits are
sequences of many small factorisations, for which one thread is as fast as several on an idle machine, so they
run inside `single_blas_thread()`. It uses `threadpoolctl` (installed
with scikit-learn; the `sklearn` extra) and does nothing without it.
"""

import contextlib
import functools


@contextlib.contextmanager
def single_blas_thread():
    """A context in which BLAS/LAPACK libraries loaded in the process use one thread (no-op without
    threadpoolctl)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
        yield
        return
    with threadpool_limits(1, user_api="blas"):
        yield


def single_threaded(fn):
    """`fn` run inside `single_blas_thread()`."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with single_blas_thread():
            return fn(*args, **kwargs)

    return wrapper
