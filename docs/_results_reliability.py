"""The reliability page of the results section: the tallies of issue 63's budgets (the hard robust-GP tier, the
rotated quasi-separable sets under every factor, the nightly budget by family), from
`benchmarks/results/reliability.json`.

The file holds {"sections": [...]}, each section {"title", "header" (command, date, machine, code, recorded),
"columns", "rows", "note"}: a table as recorded by the run its header names."""

from _results_format import HEADER, load_json, missing, provenance

RELIABILITY_JSON = "benchmarks/results/reliability.json"
RELIABILITY_CMDS = ["python benchmarks/robust_defaults.py --hard 40",
                    "GKL_EXTENDED=1 python -m pytest tests/test_reliability.py -k rotated_sets",
                    "GKL_EXTENDED=1 GKL_PROPERTY_TALLY=tally.jsonl python -m pytest -n 0 tests/test_nightly_budget.py"]


def reliability_page():
    """The page: one table per recorded section."""
    md = [HEADER, "# Reliability: issue 63's budgets\n\n",
          "Tallies of the reliability budgets: the default robust-GP fit against the best of its alternatives on "
          "the hard tier, false convergences on improper (rotated quasi-separable) targets under every factor, "
          "and the nightly budget of random cases across `gk.fit`, `gk.gp`, the baselines, `gk.multiclass` and "
          "the scikit-learn estimators, with the invariants each family checks (`tests/test_nightly_budget.py`). "
          "Every failure of a budget is a bug to fix, not noise.\n\n"]
    data = load_json(RELIABILITY_JSON)
    if data is None:
        md.append(missing(RELIABILITY_CMDS, RELIABILITY_JSON))
        return "".join(md)
    for section in data["sections"]:
        md.append(f"## {section['title']}\n\n")
        md.append(provenance(section.get("header"), RELIABILITY_JSON))
        columns = section["columns"]
        md.append("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n")
        for row in section["rows"]:
            md.append("| " + " | ".join(str(row.get(c, "-")) for c in columns) + " |\n")
        if section.get("note"):
            md.append("\n" + section["note"] + "\n")
        md.append("\n")
    return "".join(md).rstrip("\n") + "\n"
