"""Multi-process G-KL on JAX's multi-controller runtime: 2 processes on localhost (extended: 4 processes, and 2
processes of 2 virtual devices each), each holding its own rows, give the one-process fit, gradient and sparse GP
fit to round-off, and reject bad input with the same ValueError on every process. The workers are
tests/_multiprocess_check.py; they compile while the references run here."""

import json
import os
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import gkl_jax as gk

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _multiprocess_data import (  # noqa: E402
    MINIBATCH,
    gp_data,
    logistic_data,
    logistic_model,
    regression_data,
    regression_model,
    sparse_model,
    variance_log_z,
)

TIMEOUT_S = 420   # the whole run; a worker past it is killed (no test waits on a stuck collective)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Run:
    """`num` worker processes started at once; `results()` waits (bounded) and parses their RESULT lines."""

    def __init__(self, num, everything, tmp, devices=1):
        port, self.tmp, self.start = _free_port(), tmp, time.monotonic()
        env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
                   PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(HERE), os.environ.get("PYTHONPATH")])))
        self.procs = []
        for pid in range(num):
            args = [sys.executable, os.path.join(HERE, "_multiprocess_check.py"), str(pid), str(num), str(port)]
            with open(tmp / f"{pid}.out", "w") as out, open(tmp / f"{pid}.err", "w") as err:
                self.procs.append(subprocess.Popen(args + (["all"] if everything else []), stdout=out, stderr=err,
                                                   env=env, cwd=os.path.dirname(HERE)))

    def kill(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def results(self):
        try:
            for proc in self.procs:
                proc.wait(timeout=max(1.0, TIMEOUT_S - (time.monotonic() - self.start)))
        except subprocess.TimeoutExpired:
            self.kill()
        outs = []
        for pid, proc in enumerate(self.procs):
            text = (self.tmp / f"{pid}.out").read_text()
            lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
            assert proc.returncode == 0 and lines, (
                f"process {pid} exited with {proc.returncode}:\n{(self.tmp / f'{pid}.err').read_text()[-3000:]}")
            outs.append(json.loads(lines[-1][len("RESULT "):]))
        return outs


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """Started when the module's first test asks for it, so the workers compile while the references run."""
    run = _Run(2, False, tmp_path_factory.mktemp("two_processes"))
    yield run
    run.kill()


@pytest.fixture(scope="module")
def references():
    """The same fits in this one process, unsharded."""
    X, y = logistic_data()
    model = logistic_model(X, y)
    res = gk.fit(model, gk.factors.Diagonal(), tol=1e-9)
    x, t, Z = gp_data()
    sparse = gk.fit(sparse_model(x, t, Z), gk.factors.Full(), tol=1e-9)
    return dict(model=model, res=res, sparse=sparse,
                d_log_z_d_variance=float(jax.jit(jax.grad(variance_log_z, argnums=1))(model, model.prior.variance)))


def _check_core(outs, ref, num, devices=1):
    for out in outs:
        assert out["process_count"] == num and out["devices"] == num * devices
        assert out["spans_processes"] and out["replicated"]          # rows split over processes, q replicated
        assert out["local_values"] and out["host_copy"]
        assert out["converged"] and out["sparse_converged"]
        np.testing.assert_allclose(out["log_z"], float(ref["res"].log_z), rtol=1e-12)
        np.testing.assert_allclose(out["bound"], float(ref["res"].log_z), rtol=1e-12)
        np.testing.assert_allclose(out["mean"], np.asarray(ref["res"].q.mean), rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(out["d"], np.asarray(ref["res"].q.factor.d), rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(out["whole_bound"], float(ref["res"].log_z), rtol=1e-12)
        np.testing.assert_allclose(out["d_log_z_d_variance"], ref["d_log_z_d_variance"], rtol=1e-8)
        np.testing.assert_allclose(out["sparse_log_z"], float(ref["sparse"].log_z), rtol=1e-12)
        np.testing.assert_allclose(out["sparse_mean"], np.asarray(ref["sparse"].q.mean), rtol=1e-8, atol=1e-10)
        # Bad input: the same ValueError on every process, never a hang.
        assert "different numbers of rows" in out["errors"]["rows"]
        assert "differ in width between processes" in out["errors"]["width"]
        assert "does not hold every device of jax.devices()" in out["errors"]["mesh"]
        assert "or in value" in out["errors"]["whole"]
    assert all(out["errors"] == outs[0]["errors"] for out in outs)


@pytest.mark.slow
def test_two_processes_match_one(two_processes, references):
    _check_core(two_processes.results(), references, 2)


@pytest.mark.extended
def test_four_processes_match_one_in_every_verb(tmp_path, references):
    run = _Run(4, True, tmp_path)
    try:
        model = references["model"]
        with pytest.warns(UserWarning, match="fit_minibatch"):      # 40 steps: short of the optimum, as intended
            mb = gk.stochastic.fit_minibatch(model, gk.factors.Diagonal(), **MINIBATCH)
        grad_mean = jax.jit(jax.grad(gk.bound, argnums=1))(model, mb.q).mean
        free = gk.fit(regression_model(*regression_data()), gk.factors.Full(), tol=1e-9)
        outs = run.results()
    finally:
        run.kill()
    _check_core(outs, references, 4)
    for out in outs:
        np.testing.assert_allclose(out["grad_mean"], np.asarray(grad_mean), rtol=1e-9, atol=1e-9)
        assert out["all_reduce_ops"] == 1       # one cross-process sum per bound and gradient (XLA inserts it)
        np.testing.assert_allclose(out["minibatch_log_z"], float(mb.log_z), rtol=1e-10)
        np.testing.assert_allclose(out["minibatch_mean"], np.asarray(mb.q.mean), rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(out["prior_free_log_z"], float(free.log_z), rtol=1e-12)


@pytest.mark.extended
def test_two_processes_of_two_devices_each(tmp_path, references):
    run = _Run(2, False, tmp_path, devices=2)
    try:
        outs = run.results()
    finally:
        run.kill()
    _check_core(outs, references, 2, devices=2)
