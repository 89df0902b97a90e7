#!/usr/bin/env bash
# The GPU check: one prepared command for a lent accelerator. It installs nothing (the machine's python3 must
# have jax with its CUDA plugin, equinox, optax, numpy, pytest, pytest-xdist; numpyro and scikit-learn for the
# tests that use them), runs benchmarks/gpu.py on a small set of parts, then the whole test suite with xdist
# workers, and writes every log into one folder.
#
#   bash benchmarks/gpu_check.sh [OUTDIR]          # default benchmarks/out/gpu_check
#
# Environment: GKL_GPU_WORKERS (default 12 pytest workers), GKL_GPU_BENCH_TIMEOUT (s, default 150),
# GKL_GPU_SUITE_TIMEOUT (s, default 400), GKL_GPU_BENCH_ARGS (default: the vmap and 10^6-site parts and the
# D = 250 rows of Tables 2-4, both precisions). Exit status: the suite's.
set -uo pipefail

out="${1:-benchmarks/out/gpu_check}"
mkdir -p "$out"
export XLA_PYTHON_CLIENT_PREALLOCATE=false   # many workers share one GPU
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python="${PYTHON:-python3}"

{
    date -u +"%Y-%m-%d %H:%M UTC"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
    "$python" -c "import jax, equinox, optax, numpy; print('jax', jax.__version__, jax.devices()); \
print('equinox', equinox.__version__, 'optax', optax.__version__, 'numpy', numpy.__version__)"
    nproc
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

bench_args="${GKL_GPU_BENCH_ARGS:---parts vmap,big,table --dims 250 --dtypes float64,float32}"
echo "==> benchmarks/gpu.py $bench_args"
# shellcheck disable=SC2086
timeout "${GKL_GPU_BENCH_TIMEOUT:-150}" "$python" benchmarks/gpu.py $bench_args --out "$out" > "$out/gpu.log" 2>&1
echo "gpu.py exit $?"
tail -40 "$out/gpu.log"

echo "==> the test suite, ${GKL_GPU_WORKERS:-12} workers"
start=$(date +%s)
timeout "${GKL_GPU_SUITE_TIMEOUT:-400}" "$python" -m pytest tests -o addopts="" -p no:cacheprovider \
    -n "${GKL_GPU_WORKERS:-12}" --dist worksteal -rfE -v --durations=15 --junitxml "$out/junit.xml" \
    > "$out/suite.log" 2>&1
status=$?
echo "suite exit $status after $(( $(date +%s) - start )) s"
grep -E "passed|failed|FAILED|ERROR" "$out/suite.log" | tail -40
exit $status
