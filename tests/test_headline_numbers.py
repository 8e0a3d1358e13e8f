"""The headline figures of the README and the site are the results files' own.

``benchmarks/plot_benchmarks.py`` computes every headline figure, and the Benchmarks page's tables,
from the JSON in ``benchmarks/results/``. Here the pages are checked against it: each quoted figure
is present where it is quoted, names its results file, and no other speedup range is quoted on the
front pages. A rerun benchmark whose JSON moves a figure fails this test until the pages follow.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_plotter():
    spec = importlib.util.spec_from_file_location("plot_benchmarks", ROOT / "benchmarks" / "plot_benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


plotter = _load_plotter()
FIGURES = plotter.headlines()
PAGES = {name: (ROOT / name).read_text() for name in (
    "README.md", "docs/index.md", "docs/benchmarks.md", "docs/benchmark-log.md", "docs/guides/planning.md",
    "docs/concepts/merges.md", "docs/concepts/pxn.md", "docs/guides/from-dspy-gepa.md", "docs/reference/glossary.md",
    "docs/guides/mlflow-prompts.md")}
# The pages that give the class swap's result: each also names the cells where it missed its held-out aim.
CLASS_SWAP_PAGES = ["README.md", "docs/index.md", "docs/benchmarks.md", "docs/benchmark-log.md",
                    "docs/guides/from-dspy-gepa.md", "docs/guides/planning.md"]

# Where each headline figure is quoted, and the results file the page names beside it.
QUOTED = {
    "class swap speedup": (CLASS_SWAP_PAGES, "class_swap.json"),
    "class swap held-out vs dspy.GEPA": (CLASS_SWAP_PAGES, "class_swap.json"),
    "class swap dspy.GEPA metric calls": (["docs/benchmarks.md", "docs/guides/from-dspy-gepa.md"], "class_swap.json"),
    "w16 4x4 speedup": (["docs/benchmarks.md", "docs/guides/planning.md", "docs/concepts/merges.md"],
                        "schedules.json"),
    "w16 4x4 held-out vs dspy.GEPA": (["docs/benchmarks.md", "docs/guides/planning.md", "docs/concepts/merges.md"],
                                      "schedules.json"),
    "w16 all speedup": (["README.md", "docs/guides/planning.md"], "schedules.json"),
    "w16 all held-out": (["README.md", "docs/guides/planning.md"], "schedules.json"),
    "w16 all held-out loss": (["docs/benchmarks.md", "docs/concepts/merges.md"], "schedules.json"),
    "w16 dspy.GEPA held-out": (["README.md", "docs/guides/planning.md"], "schedules.json"),
    "w16 steps best speedup": (["README.md", "docs/guides/planning.md"], "schedules.json"),
    "w16 steps best held-out": (["README.md"], "schedules.json"),
    "w16 steps merge speedup": (["docs/guides/planning.md"], "schedules.json"),
    "w64 speedup": (["README.md", "docs/index.md", "docs/benchmarks.md", "docs/guides/planning.md"],
                    "end_not_waiting_w"),
    "w64 held-out vs dspy.GEPA": (["docs/benchmarks.md"], "end_not_waiting_w64_after.json"),
    "w256 speedup": (["README.md", "docs/index.md", "docs/benchmarks.md", "docs/guides/planning.md"],
                     "end_not_waiting_w"),
    "w256 held-out vs dspy.GEPA": (["docs/benchmarks.md"], "end_not_waiting_w256_"),
    "w16 http speedup": (["docs/benchmarks.md"], "schedules_server.json"),
    "w16 http held-out vs dspy.GEPA depth/fixed": (["docs/benchmarks.md"], "schedules_server.json"),
    "w16 http held-out vs dspy.GEPA breadth/fixed": (["docs/benchmarks.md"], "schedules_server.json"),
    "w16 dspy.GEPA metric calls": (["docs/benchmarks.md", "docs/concepts/pxn.md", "docs/guides/from-dspy-gepa.md"],
                                   "schedules.json"),
    "w16 PxNSampling metric calls": (["docs/benchmarks.md", "docs/concepts/pxn.md", "docs/guides/from-dspy-gepa.md"],
                                     "schedules.json"),
    "w16 dspy.GEPA x floor": (["docs/reference/glossary.md"], "schedules.json"),
    "mlflow prompts speedup": (["README.md", "docs/benchmarks.md", "docs/guides/mlflow-prompts.md"],
                               "mlflow_prompts_notrace"),
    "mlflow prompts MLflow's metric calls": (["docs/guides/mlflow-prompts.md"], "mlflow_prompts_notrace"),
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
    missed = [name for name in plotter.CELLS if f"class swap held-out vs dspy.GEPA {name}" in FIGURES]
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


def test_the_benchmarks_pages_tables_are_computed_from_the_results():
    benchmarks = PAGES["docs/benchmarks.md"]
    assert plotter.table_class_swap() in benchmarks
    assert plotter.table_w16() in benchmarks
    assert plotter.table_width() in benchmarks


def test_the_benchmarks_page_shows_the_charts_the_script_draws():
    benchmarks = PAGES["docs/benchmarks.md"]
    charts = re.findall(r"\]\(assets/(bench_[a-z0-9_]+\.png)\)", benchmarks)
    assert len(charts) >= 3
    script = (ROOT / "benchmarks" / "plot_benchmarks.py").read_text()
    for chart in charts:
        assert chart in script, f"{chart} is not drawn by plot_benchmarks.py"
        assert (ROOT / "docs" / "assets" / chart).is_file(), f"run python benchmarks/plot_benchmarks.py ({chart})"
