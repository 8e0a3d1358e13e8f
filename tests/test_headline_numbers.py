"""The headline figures of the README and the site are the results files' own.

``benchmarks/plot_benchmarks.py`` computes every headline figure, and the Benchmarks page's tables,
from the JSON in ``benchmarks/results/``. Here the pages are checked against it: each quoted figure
is present where it is quoted, names its results file, and no other speedup range is quoted on the
front pages. A rerun benchmark whose JSON moves a figure fails this test until the pages follow.
"""

from __future__ import annotations

import re

import pytest

from tests.scripts import ROOT, load_script

plotter = load_script(ROOT / "benchmarks" / "plot_benchmarks.py")
FIGURES = plotter.headlines()
PAGES = {name: (ROOT / name).read_text() for name in (
    "README.md", "docs/index.md", "docs/benchmarks.md", "docs/benchmark-log.md", "docs/guides/planning.md",
    "docs/concepts/merges.md", "docs/concepts/pxn.md", "docs/guides/from-dspy-gepa.md", "docs/reference/glossary.md",
    "docs/guides/mlflow-prompts.md")}
# The pages that give the class swap's result: each also names the cells where it missed its held-out aim.
CLASS_SWAP_PAGES = ["README.md", "docs/index.md", "docs/benchmarks.md", "docs/benchmark-log.md",
                    "docs/guides/from-dspy-gepa.md", "docs/guides/planning.md"]

# Where each headline figure is quoted, and the results file the page names beside it.
FRONT = ["README.md", "docs/index.md", "docs/benchmarks.md", "docs/guides/from-dspy-gepa.md"]
# The pages that compare the MLflow prompt optimizer with MLflow's own.
MLFLOW_PAGES = ["README.md", "docs/benchmarks.md", "docs/guides/mlflow-prompts.md"]
QUOTED = {
    "class swap speedup": (CLASS_SWAP_PAGES, "class_swap_default.json"),
    "class swap held-out vs dspy.GEPA": (CLASS_SWAP_PAGES, "class_swap_default.json"),
    "class swap held-out pooled": (CLASS_SWAP_PAGES, "class_swap_default.json"),
    "class swap held-out chain": (CLASS_SWAP_PAGES, "class_swap_default.json"),
    "class swap dollars ×": (CLASS_SWAP_PAGES, "class_swap_default.json"),
    "class swap reflection calls ×": (FRONT, "class_swap_default.json"),
    "pay more held-out pooled": (["docs/guides/from-dspy-gepa.md"], "class_swap_default_before_staging.json"),
    "pay more dollars ×": (["docs/guides/from-dspy-gepa.md"], "class_swap_default_before_staging.json"),
    "every improver speedup": (["docs/benchmarks.md", "docs/guides/from-dspy-gepa.md"], "class_swap_all_m3"),
    "every improver reflection calls ×": (["docs/benchmarks.md", "docs/guides/from-dspy-gepa.md"],
                                          "class_swap_all_m3"),
    "class swap dspy.GEPA metric calls": (["docs/benchmarks.md", "docs/guides/from-dspy-gepa.md"],
                                          "class_swap_bill.json"),
    "class swap w64 speedup": (["README.md", "docs/index.md", "docs/benchmarks.md"], "class_swap_w64_bill.json"),
    "class swap w64 held-out pooled": (["README.md", "docs/index.md", "docs/benchmarks.md"], "class_swap_w64_bill.json"),
    "class swap w64 dollars ×": (["README.md", "docs/index.md", "docs/benchmarks.md"], "class_swap_w64_bill.json"),
    "class swap w64 held-out chain": (["README.md", "docs/index.md", "docs/benchmarks.md"], "class_swap_w64_bill.json"),
    "class swap unseen speedup": (["docs/benchmarks.md", "docs/benchmark-log.md"], "class_swap_unseen.json"),
    "class swap unseen held-out pooled": (["docs/benchmarks.md", "docs/benchmark-log.md"], "class_swap_unseen.json"),
    "class swap unseen held-out vs dspy.GEPA": (["docs/benchmarks.md", "docs/benchmark-log.md"],
                                                "class_swap_unseen.json"),
    "class swap unseen reflection calls ×": (["docs/benchmarks.md", "docs/benchmark-log.md"], "class_swap_unseen.json"),
    "class swap unseen dollars ×": (["docs/benchmarks.md", "docs/benchmark-log.md"], "class_swap_unseen.json"),
    "mlflow prompts speedup": (MLFLOW_PAGES, "mlflow_prompts_bill_"),
    "mlflow prompts dollars ×": (MLFLOW_PAGES, "mlflow_prompts_bill_"),
    "mlflow prompts final vs MLflow's, chain": (MLFLOW_PAGES, "mlflow_prompts_bill_"),
    "mlflow prompts reflection calls ×": (["README.md", "docs/guides/mlflow-prompts.md"], "mlflow_prompts_bill_"),
    "mlflow prompts traced speedup": (["docs/benchmarks.md", "docs/guides/mlflow-prompts.md"], "mlflow_prompts_bill_"),
    "mlflow prompts MLflow's metric calls": (["docs/benchmarks.md", "docs/guides/mlflow-prompts.md"],
                                             "mlflow_prompts_bill_"),
    "w16 4x4 speedup": (["docs/benchmarks.md", "docs/guides/planning.md", "docs/concepts/merges.md"],
                        "schedules.json"),
    "w16 4x4 held-out vs dspy.GEPA": (["docs/benchmarks.md", "docs/guides/planning.md", "docs/concepts/merges.md"],
                                      "schedules.json"),
    "w16 all speedup": (["README.md", "docs/guides/planning.md"], "schedules.json"),
    "w16 all held-out": (["README.md", "docs/guides/planning.md"], "schedules.json"),
    "w16 all held-out loss": (["docs/concepts/merges.md"], "schedules.json"),
    "w16 dspy.GEPA held-out": (["README.md", "docs/guides/planning.md"], "schedules.json"),
    "w16 steps best speedup": (["README.md", "docs/guides/planning.md"], "schedules.json"),
    "w16 steps best held-out": (["README.md"], "schedules.json"),
    "w16 steps merge speedup": (["docs/guides/planning.md"], "schedules.json"),
    "w256 speedup": (["README.md", "docs/index.md", "docs/benchmarks.md", "docs/guides/planning.md"],
                     "end_not_waiting_w256_"),
    "w256 held-out vs dspy.GEPA": (["docs/benchmarks.md"], "end_not_waiting_w256_"),
    "w256 defaults speedup": (["README.md", "docs/index.md", "docs/benchmarks.md", "docs/guides/planning.md"],
                              "w256_defaults.json"),
    "w256 defaults held-out vs dspy.GEPA": (["docs/benchmarks.md"], "w256_defaults.json"),
    "w256 defaults dollars ×": (["README.md", "docs/index.md", "docs/benchmarks.md"], "w256_defaults.json"),
    "w256 screened on 3 dollars ×": (["README.md", "docs/index.md", "docs/benchmarks.md"], "end_not_waiting_w256_"),
    "w256 screened on 3 reflection calls ×": (["docs/benchmarks.md"], "w256_"),
    "w16 dspy.GEPA metric calls": (["docs/concepts/pxn.md", "docs/guides/from-dspy-gepa.md"], "schedules.json"),
    "w16 PxNSampling metric calls": (["docs/concepts/pxn.md", "docs/guides/from-dspy-gepa.md"],
                                     "schedules.json"),
    "w16 dspy.GEPA x floor": (["docs/reference/glossary.md"], "schedules.json"),
}


@pytest.mark.parametrize("figure", sorted(QUOTED))
def test_a_headline_figure_is_the_results_files_and_names_them(figure):
    pages, source = QUOTED[figure]
    for page in pages:
        text = PAGES[page]
        assert FIGURES[figure] in text, f"{page} should quote {figure} as {FIGURES[figure]!r}"
        assert source in text, f"{page} quotes {figure} without naming {source}"


def test_the_class_swap_is_quoted_with_the_cells_that_missed_its_held_out_aim():
    """Where the class swap's held-out range is given, so is every cell below dspy.GEPA's − 0.02, with its
    difference: a reader must not have to find the miss in a table."""
    missed = [name for name in plotter.INDEPENDENT if f"class swap held-out vs dspy.GEPA {name}" in FIGURES]
    assert FIGURES["class swap cells below the aim"] == (", ".join(missed) if missed else "none")
    for page in CLASS_SWAP_PAGES:
        for name in missed:
            assert name in PAGES[page], f"{page} gives the class swap's held-out without naming its miss in {name}"
            assert FIGURES[f"class swap held-out vs dspy.GEPA {name}"] in PAGES[page], (page, name)
    for name in missed:
        assert FIGURES[f"class swap held-out vs dspy.GEPA {name} per seed"] in PAGES["docs/benchmarks.md"], name


def test_the_front_pages_quote_no_speedup_range_the_results_do_not_give():
    """Every "a.b-c.d×" on the README, the home page and the Benchmarks page's headline table is a headline figure."""
    known = {value for value in FIGURES.values() if value.endswith("×")}
    benchmarks = PAGES["docs/benchmarks.md"]
    headline_table = benchmarks[benchmarks.index("## Headline results"):benchmarks.index("## How these were measured")]
    for where, text in (("README.md", PAGES["README.md"]), ("docs/index.md", PAGES["docs/index.md"]),
                        ("the headline table", headline_table)):
        for quoted in re.findall(r"\d+\.\d-\d+\.\d×", text):
            assert quoted in known, f"{where} quotes {quoted}, which no results file gives"


# The tables the benchmark log prints; the Benchmarks page prints the others.
LOG_TABLES = ("TABLE_W16", "TABLE_WIDTH", "TABLE_UNSEEN", "TABLE_MLFLOW_UNSEEN")


def test_the_benchmarks_pages_tables_are_computed_from_the_results():
    for name, table in plotter.tables().items():
        where = "docs/benchmark-log.md" if name in LOG_TABLES else "docs/benchmarks.md"
        assert table in PAGES[where], f"{where} should print {name} as plot_benchmarks.py computes it"


def test_the_benchmarks_page_shows_the_charts_the_script_draws():
    benchmarks = PAGES["docs/benchmarks.md"]
    charts = re.findall(r"\]\(assets/(bench_[a-z0-9_]+\.png)\)", benchmarks)
    assert len(charts) >= 3
    script = (ROOT / "benchmarks" / "plot_benchmarks.py").read_text()
    for chart in charts:
        assert chart in script, f"{chart} is not drawn by plot_benchmarks.py"
        assert (ROOT / "docs" / "assets" / chart).is_file(), f"run python benchmarks/plot_benchmarks.py ({chart})"
