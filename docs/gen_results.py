"""Writes the results pages of the docs site (docs/results/*.md) from the result files under version control.

    python docs/gen_results.py            # regenerate docs/results/*.md
    python docs/gen_results.py --check    # exit 1 if a committed page differs from what the result files give

Every number on a results page comes from here: the papers' values from the constants of the benchmark scripts
(read with `ast`, so nothing is imported or run), ours from the small JSON files under `benchmarks/results/`,
which are committed, so every clone and every hosted build shows them. A file holds either what a benchmark run
wrote with `--json benchmarks/results/NAME.json` (per data set or per split rows) or, where only the summary of a
run was recorded, that summary with a `header` saying where it comes from ({"header": ..., "summary": ...} or
{"header": ..., "results": ...}). Rerun the benchmark with the command on its page, then this script; the test
suite fails when a committed page and its result file disagree. The dated record of the runs (commands,
machines, notes) is `benchmarks/README.md`.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # its helpers beside it (run as a script)
from _results_format import HEADER, ROOT, literal, load_json, mean_se, missing, pm, provenance, split  # noqa: E402
from _results_gp_scale import GP_SCALE_JSON, gp_scale_page  # noqa: E402
from _results_pages import (  # noqa: E402
    CHAI_JSON,
    GPC_JSON,
    SED_SYN_JSON,
    chai_figure_page,
    chai_page,
    figures_page,
    thesis_page,
)
from _results_reliability import RELIABILITY_JSON, reliability_page  # noqa: E402

OUT = os.path.join(ROOT, "docs", "results")


# ---------------------------------------------------------------------------------------------- Tables 2-4


TABLES_JSON = "benchmarks/results/tables_2_4.json"
TABLES_CMD = ["python benchmarks/logistic_tables.py --dims 250 500 1000 --repeats 10 \\",
              "    --factors chevron banded subspace fa fa-random diagonal full --json " + TABLES_JSON]
FACTORS = ("chevron", "banded", "subspace", "fa")
FACTOR_NAMES = {"chevron": "Chevron", "banded": "Banded", "subspace": "Subspace", "fa": "FactorAnalysis",
                "fa-random": "FactorAnalysis (random start)", "diagonal": "Diagonal", "full": "Full"}
METRICS = ("time", "bound", "error", "tll")


def paper_tables():
    """{(D, N, K): {factor: {metric: (mean, se)}}} from logistic_tables.py's transcription of Tables 2-4."""
    out = {}
    for D, (sizes, ks, rows) in literal("logistic_tables.py", "_T").items():
        for i, N in enumerate(sizes):
            for j, K in enumerate(ks):
                col = 2 * (2 * i + j)
                out[(D, N, K)] = {f: {m: tuple(float(x) for x in rows[f][k].split()[col:col + 2])
                                      for k, m in enumerate(METRICS)} for f in rows}
    return out


def factor_cell(cell):
    """(mean wall time, (B/N mean, se) or None, (tll/N mean, se) or None, converged, fits) of one factor's cell:
    per-data-set rows as logistic_tables.py writes them, or a recorded summary {"time": s, "converged": "k/n"}."""
    if "rows" in cell:
        rows = cell["rows"]
        return (mean_se([r["wall"] for r in rows])[0], mean_se([r["bound"] for r in rows]),
                mean_se([r["tll"] for r in rows]), sum(bool(r["converged"]) for r in rows), len(rows))
    conv, fits = (int(x) for x in cell["converged"].split("/"))
    return cell["time"], cell.get("bound"), cell.get("tll"), conv, fits


def paper_values(paper):
    """The paper's time, B/N and tll/N per cell, for the cells where ours lack the accuracy columns."""
    md = []
    for D in sorted({k[0] for k in paper}):
        md.append(f"### The paper's values, D = {D}: time s; B/N; tll/N\n\n| N | K | " +
                  " | ".join(FACTOR_NAMES[f] for f in FACTORS) + " |\n")
        md.append("|---|---|" + "---|" * len(FACTORS) + "\n")
        for (d, N, K), cell in sorted(paper.items()):
            if d == D:
                md.append(f"| {N} | {K} | " + " | ".join(
                    f"{cell[f]['time'][0]:.2f}; {pm(cell[f]['bound'])}; {pm(cell[f]['tll'])}" for f in FACTORS) +
                    " |\n")
        md.append("\n")
    return "".join(md)


def tables_page():
    paper = paper_tables()
    data = load_json(TABLES_JSON)
    md = [HEADER, "# Tables 2-4: structured factors on logistic regression\n\n",
          "Challis & Barber (2013), Section 6.2: synthetic Bayesian logistic regression "
          "(`gk.datasets.synthetic_logistic`), prior $\\mathcal{N}(0, I)$, $N_\\text{trn} = D/2, D, 5D$, "
          "$K = 0.05 D$ and $0.1 D$, $N_\\text{tst} = 10 D$, fits stopped at $\\max |\\nabla B| \\le 10^{-3}$. "
          "Times are the mean wall time of a fit (compilation excluded); the paper's were Matlab on an 8-core "
          "Intel E5450. B/N is the bound per training point, tll/N the test log-likelihood per test point; mean ± "
          "standard error over the data sets.\n\n"]
    if data is None:
        md.append(missing(TABLES_CMD, TABLES_JSON))
        md.append(paper_values(paper))
        return "".join(md)
    md.append(provenance(data.get("header"), TABLES_JSON))
    cells = data.get("cells", [])
    accuracy = False
    for D in sorted({c["D"] for c in cells}):
        rows = [c for c in cells if c["D"] == D]
        names = [f for f in ("chevron", "banded", "subspace", "fa", "fa-random", "diagonal", "full")
                 if any(f in c["factors"] for c in rows)]
        md.append(f"## D = {D}\n\n### Time: ours (s), the paper's (s), paper / ours\n\n")
        md.append("| N | K | " + " | ".join(FACTOR_NAMES[f] for f in names) + " |\n")
        md.append("|---|---|" + "---|" * len(names) + "\n")
        for c in rows:
            ref = paper.get((D, c["N"], c["K"]), {})
            cols = []
            for f in names:
                if f not in c["factors"]:
                    cols.append("-")
                    continue
                wall, _, _, conv, fits = factor_cell(c["factors"][f])
                text = f"{wall:.3f}"
                pf = ref.get("fa" if f == "fa-random" else f)
                if pf:
                    text += f" / {pf['time'][0]:.2f} (x{pf['time'][0] / max(wall, 1e-12):.1f})"
                if conv < fits:
                    text += f", {conv}/{fits} converged"
                cols.append(text)
            md.append(f"| {c['N']} | {c['K']} | " + " | ".join(cols) + " |\n")
        md.append("\n")
        if not any(factor_cell(cell)[1] is not None for c in rows for cell in c["factors"].values()):
            continue
        accuracy = True
        md.append("### B/N and tll/N: ours | the paper's\n\n")
        md.append("| N | K | " + " | ".join(FACTOR_NAMES[f] for f in names) + " |\n")
        md.append("|---|---|" + "---|" * len(names) + "\n")
        for c in rows:
            ref = paper.get((D, c["N"], c["K"]), {})
            cols = []
            for f in names:
                if f not in c["factors"]:
                    cols.append("-")
                    continue
                _, b, t, _, _ = factor_cell(c["factors"][f])
                text = f"{pm(b, 3)}; {pm(t, 3)}"
                pf = ref.get("fa" if f == "fa-random" else f)
                if pf:
                    text += f" \\| {pm(pf['bound'])}; {pm(pf['tll'])}"
                cols.append(text)
            md.append(f"| {c['N']} | {c['K']} | " + " | ".join(cols) + " |\n")
        md.append("\n")
    if not accuracy:
        md.append("## Accuracy\n\nThe run above kept its times only, not our bounds and test "
                  "log-likelihoods per cell. Rerun the command below to record them beside the times; the paper's "
                  "values follow.\n\n```bash\n" + "\n".join(TABLES_CMD) + "\n```\n\n")
        md.append(paper_values(paper))
    return "".join(md)


# ---------------------------------------------------------------------------------------------- Table 1


TABLE1_JSON = "benchmarks/results/table1.json"
TABLE1_CMD = ["python benchmarks/gp_regression_table1.py --datasets slump,neal,friedman,boston --steps 200 \\",
              "    --json " + TABLE1_JSON]
TABLE1_COLUMNS = {"exact": "exact (Gaussian)", "t/gkl": "Student-t G-KL", "t/local": "Student-t VB",
                  "t/laplace": "Student-t Laplace", "lap/gkl": "Laplace G-KL", "lap/local": "Laplace VB",
                  "lap/ep": "Laplace EP"}


def table1_page():
    paper = literal("gp_regression_table1.py", "PAPER")
    data = load_json(TABLE1_JSON)
    md = [HEADER, "# Table 1: robust GP regression\n\n",
          "Challis & Barber (2013), Section 6.1 and Table 1: GP regression with Student-t and Laplace likelihoods "
          "on Concrete Slump, Friedman, Neal and Boston (10 partitions each), kernel hyperparameters by ML-II on "
          "each method's own evidence, likelihood scale chosen on a validation set. LML: the method's log evidence "
          "on the training set; MSE: test mean squared error in the units of y; TLP: mean test log predictive "
          "density. Mean ± standard error over partitions.\n\n"]
    if data is None:
        md.append(missing(TABLE1_CMD, TABLE1_JSON))
    header, data = split(data) if data is not None else (None, {})
    if header is not None:
        md.append(provenance(header, TABLE1_JSON))
    md.append("| data | method | LML ours | LML paper | MSE ours | MSE paper | TLP ours | TLP paper | converged |\n")
    md.append("|---|---|---|---|---|---|---|---|---|\n")
    for name, cols in paper.items():
        for col, refs in cols.items():
            ours = (data or {}).get(name, {}).get(col, {})
            cells = []
            for key, ref in zip(("lml", "mse", "tlp"), refs):
                cells.append(pm(tuple(ours[key])) if ours.get(key) else "-")
                cells.append("-" if ref is None else f"{ref[0]} ± {ref[1]}")
            md.append(f"| {name} | {TABLE1_COLUMNS[col]} | " + " | ".join(cells) +
                      f" | {ours.get('converged', '-')} |\n")
    return "".join(md)


# ---------------------------------------------------------------------------------------------- King & Lawrence


KL_JSON = "benchmarks/results/kl_corrected.json"


def king_lawrence_page():
    err, speed = literal("kl_corrected.py", "PAPER_ERR"), literal("kl_corrected.py", "PAPER_SPEEDUP")
    data = load_json(KL_JSON)
    md = [HEADER, "# King & Lawrence (2006), Table 1: the KL-corrected bound\n\n",
          "PPA GP classification (probit, SE kernel) with hyperparameters learned by the standard bound L and by "
          "the KL-corrected bound L' of King & Lawrence (2006), `gk.gp.ppa`. The paper reports the test error "
          "and the CPU-time speed-up of the corrected scheme.\n\n"]
    if data is None:
        md.append(missing(["python benchmarks/kl_corrected.py --datasets pima,twonorm,moons,german,ringnorm "
                           "--n-train 200 --warm --json " + KL_JSON], KL_JSON))
        return "".join(md)
    header, data = split(data)
    md.append(provenance(header, KL_JSON))
    md.append("| data | test error % ours | paper | speed-up ours (compiled) | paper | iterations (corrected, "
              "standard) |\n|---|---|---|---|---|---|\n")
    for name in err:
        ours = data.get(name, {})
        ratio = "-" if "speedup" not in ours else f"x{ours['speedup']:g}" + (
            f" (x{ours['speedup_warm']:g})" if ours.get("speedup_warm") is not None else "")
        iterations = " / ".join(str(i) for i in ours["iterations"]) if "iterations" in ours else "-"
        md.append(f"| {name} | {ours.get('error', '-')} | {err[name]} | {ratio} | "
                  f"{'-' if speed[name] is None else 'x' + str(speed[name])} | {iterations} |\n")
    return "".join(md)


# ---------------------------------------------------------------------------------------------- index


PAGES = {
    "tables-2-4.md": tables_page,
    "table-1.md": table1_page,
    "figures-8-10.md": figures_page,
    "chai-tables-3-5.md": chai_page,
    "chai-figure-5.md": chai_figure_page,
    "king-lawrence.md": king_lawrence_page,
    "thesis-ch4.md": thesis_page,
    "reliability.md": reliability_page,
    "gp-scale.md": gp_scale_page,
}
SOURCES = {"tables-2-4.md": TABLES_JSON, "table-1.md": TABLE1_JSON, "figures-8-10.md": SED_SYN_JSON,
           "chai-tables-3-5.md": CHAI_JSON, "chai-figure-5.md": None, "king-lawrence.md": KL_JSON,
           "thesis-ch4.md": GPC_JSON, "reliability.md": RELIABILITY_JSON,
           "gp-scale.md": GP_SCALE_JSON}


def index_page():
    md = [HEADER, "# Results\n\n",
          "One page per reproduced table or figure of the papers, ours beside theirs. The pages are generated by "
          "`docs/gen_results.py` from small result files kept with the code under `benchmarks/results/`, so "
          "every checkout and every build of this site shows the same numbers; each page names the run (command, "
          "date, machine) its numbers come from and what that run did not record. `benchmarks/README.md` keeps "
          "the notes of every run, and [design decisions](../design-decisions.md) the experiments behind the "
          "defaults.\n\n",
          "| page | source | ours on the page |\n|---|---|---|\n"]
    for page, source in SOURCES.items():
        title = PAGES[page]().split("\n# ", 1)[1].split("\n", 1)[0]
        status = "figure only" if source is None else ("yes" if os.path.exists(os.path.join(ROOT, source))
                                                        else "no (the command is on the page)")
        md.append(f"| [{title}]({page}) | `{source or 'benchmarks/figures/'}` | {status} |\n")
    return "".join(md)


def generate():
    pages = {name: fn() for name, fn in PAGES.items()}
    pages["index.md"] = index_page()
    return pages


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with docs/results/ instead of writing")
    args = ap.parse_args(argv)
    stale = []
    for name, text in generate().items():
        path = os.path.join(OUT, name)
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if args.check:
            if old != text:
                stale.append(name)
        elif old != text:
            os.makedirs(OUT, exist_ok=True)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
            print(f"wrote docs/results/{name}")
    if stale:
        print("stale results pages (run python docs/gen_results.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
