"""Write a benchmark's summary into its committed result file (benchmarks/results/*.json), which
docs/gen_results.py turns into a results page of the docs.

The file is {"header": {...}, "results": {data set: {...}}}. A run updates the data sets it ran and keeps the
others, so a table can be refreshed one data set at a time; the header names the last run and lists the data
sets whose entries come from earlier runs.
"""

import json
import math
import os
import platform
import sys
import time


def _finite(value):
    """JSON has no NaN: non-finite floats (an s.e. of one partition) become null, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def update_result_file(path, results, note=None):
    """Merge `results` ({data set: entry}) into the result file at `path` and stamp its header with this run.

    Args:
        path: the JSON file, e.g. benchmarks/results/table1.json (created if missing).
        results: {data set name: JSON-serialisable entry} of this run; entries of other data sets are kept.
        note: optional text for the header's "recorded" field (what the run did not record, its caveats).

    Returns:
        The dictionary written.
    """
    import jax

    old = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            old = json.load(fh).get("results", {})
    kept = sorted(set(old) - set(results))
    header = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "jax": f"{jax.__version__} ({jax.default_backend().upper()})",
              "dtype": "float64" if jax.config.jax_enable_x64 else "float32"}
    notes = ([note] if note else []) + ([f"{', '.join(kept)} from earlier runs"] if kept else [])
    if notes:
        header["recorded"] = "; ".join(notes)
    data = {"header": header, "results": _finite({**old, **results})}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")
    return data
