"""The Benchmarks page's charts and headline numbers, computed from the results files, never typed in.

    python benchmarks/plot_benchmarks.py            # writes docs/assets/bench_*.png and prints the headlines

Every number the README and the site give as a headline is computed here from the JSON in
benchmarks/results/ (``headlines()``); tests/test_headline_numbers.py checks the pages against it.
Speedup is dspy.GEPA's mean wall-clock over the setting's, as bench_schedules.py computes it: dspy.GEPA
with its defaults (crossover on) in class_swap.json, dspy.GEPA 1×1 with the crossover off everywhere
else; held-out is the mean over seeds of the score on 100-200 unseen examples.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ASSETS = Path(__file__).resolve().parents[1] / "docs" / "assets"
CELLS = ("depth/fixed", "depth/lognormal", "breadth/fixed", "breadth/lognormal")
BASELINE = "dspy.GEPA 1x1"

# The class swap: a dspy.GEPA call (all its defaults, crossover on) beside the same call with only the class name
# changed (BatchedGEPA's defaults: p="auto", 15×1 async with the sibling merge and the crossover at W = 16), 5 seeds.
CLASS_SWAP = "class_swap.json"
CLASS_SWAP_BASELINE, CLASS_SWAP_CONFIG = "dspy.GEPA", "BatchedGEPA"
# The held-out aim the class swap was measured against: no more than this below dspy.GEPA's, in every cell.
HELD_OUT_AIM = -0.02

# The W = 16 comparison: every setting beside dspy.GEPA 1×1 in one run of bench_schedules.py, crossover off
# (use_merge=False) in every row; BatchedGEPA's P×N given explicitly (p=4, n=4).
W16 = "schedules.json"
# The same regime through dspy.LM and HTTP to the latency server on loopback (3 seeds, fixed call times).
W16_HTTP = "schedules_server.json"
# Wider pools: p="auto" (async, sibling merge, crossover off) in its latest measurement, and dspy.GEPA 1×1 on the
# same seeds in the same regime, from its own invocations (one 1×1 run takes 1-15 minutes there).
WIDE = {
    64: {"auto": ["end_not_waiting_w64_after.json"],
         "baseline": ["schedules_wide_w64.json", "schedules_wide_w64_lognormal.json", "schedules_wide_w64_seeds34.json"]},
    256: {"auto": ["end_not_waiting_w256_after.json", "end_not_waiting_w256_seeds1014.json"],
          "baseline": ["schedules_wide_w256_1x1_scale05.json", "schedules_wide_w256_1x1_seeds1014.json",
                       "schedules_wide_w256_1x1_lognormal_seeds1014.json"]},
}
CURVES = "curves_w16.json"
# bench_mlflow_prompts.py untraced, both landscapes, two runs each: MLflow's GepaPromptOptimizer beside
# BatchedGepaPromptOptimizer.
MLFLOW_PROMPTS = ("mlflow_prompts_notrace.json", "mlflow_prompts_notrace_breadth.json",
                  "mlflow_prompts_notrace_earlier.json", "mlflow_prompts_notrace_breadth_earlier.json")


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def rows(names: Iterable[str], config: str, cell: str) -> dict[int, dict]:
    """The per-seed rows of one config in one landscape/latency cell, over several results files, by seed."""
    found: dict[int, dict] = {}
    for name in names:
        for row in load(name)["tables"].get(cell, {}).get("rows", []):
            if row["config"] == config:
                found[row["seed"]] = row
    return found


@dataclass(frozen=True)
class Cell:
    """One setting against its dspy.GEPA baseline in one landscape/latency cell, over the seeds both ran."""

    walls: list[float]
    tests: list[float]
    baseline_walls: list[float]
    baseline_tests: list[float]

    @property
    def wall(self) -> float:
        return statistics.mean(self.walls)

    @property
    def speedup(self) -> float:
        return statistics.mean(self.baseline_walls) / self.wall

    @property
    def test(self) -> float:
        return statistics.mean(self.tests)

    @property
    def test_sd(self) -> float:
        return statistics.stdev(self.tests)

    @property
    def vs_baseline(self) -> float:
        """Held-out minus the baseline's, the mean over the seeds both ran."""
        return self.test - statistics.mean(self.baseline_tests)

    @property
    def paired(self) -> list[float]:
        """Held-out minus the baseline's, seed by seed."""
        return [a - b for a, b in zip(self.tests, self.baseline_tests)]

    @property
    def paired_sd(self) -> float:
        return statistics.stdev(self.paired)


def cell(files: list[str], config: str, baseline_files: list[str], name: str, baseline: str = BASELINE) -> Cell:
    mine, base = rows(files, config, name), rows(baseline_files, baseline, name)
    seeds = sorted(set(mine) & set(base))
    return Cell([mine[s]["wall_s"] for s in seeds], [mine[s]["test"] for s in seeds],
                [base[s]["wall_s"] for s in seeds], [base[s]["test"] for s in seeds])


def w16(config: str) -> dict[str, Cell]:
    return {name: cell([W16], config, [W16], name) for name in CELLS}


def class_swap() -> dict[str, Cell]:
    """BatchedGEPA's defaults against dspy.GEPA's, the same call with only the class name changed."""
    return {name: cell([CLASS_SWAP], CLASS_SWAP_CONFIG, [CLASS_SWAP], name, CLASS_SWAP_BASELINE) for name in CELLS}


def wide(workers: int) -> dict[str, Cell]:
    files = WIDE[workers]
    return {name: cell(files["auto"], "async auto merge", files["baseline"], name) for name in CELLS}


def span(values: Iterable[float], digits: int = 1) -> str:
    values = list(values)
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def signed(value: float, digits: int = 2) -> str:
    return f"{value:+.{digits}f}".replace("-", "−")


def signed_span(values: Iterable[float]) -> str:
    values = list(values)
    return f"{signed(min(values))} to {signed(max(values))}"


def most_calls(name: str, config: str) -> int:
    """The most metric calls any seed of ``config`` spent in a results file, over every cell."""
    return max(r["metric_calls"] for cell_name in CELLS for r in rows([name], config, cell_name).values())


def headlines() -> dict[str, str]:
    """The figures the README and the site quote, as they quote them."""
    swap = class_swap()
    four, every = w16("async 4x4 merge"), w16("async 4x4 all")
    best, merge = w16("steps 4x4 best"), w16("steps 4x4 merge")
    w64, w256 = wide(64), wide(256)
    missed = [name for name, c in swap.items() if c.vs_baseline < HELD_OUT_AIM]
    figures = {
        "class swap speedup": span(c.speedup for c in swap.values()) + "×",
        "class swap held-out vs dspy.GEPA": signed_span(c.vs_baseline for c in swap.values()),
        "class swap cells below the aim": ", ".join(missed) if missed else "none",
        "class swap dspy.GEPA metric calls": f"{most_calls(CLASS_SWAP, CLASS_SWAP_BASELINE)} of 600",
        "class swap metric calls": f"{most_calls(CLASS_SWAP, CLASS_SWAP_CONFIG)} of 600",
        "w16 4x4 speedup": span(c.speedup for c in four.values()) + "×",
        "w16 4x4 held-out vs dspy.GEPA": signed_span(c.vs_baseline for c in four.values()),
        "w16 all speedup": span(c.speedup for c in every.values()) + "×",
        "w16 all held-out": span((c.test for c in every.values()), 2),
        "w16 all held-out loss": span((-c.vs_baseline for c in every.values()), 2),
        "w16 dspy.GEPA held-out": span((statistics.mean(c.baseline_tests) for c in four.values()), 2),
        "w16 steps best speedup": span(c.speedup for c in best.values()) + "×",
        "w16 steps best held-out": span((c.test for c in best.values()), 2),
        "w16 steps merge speedup": span(c.speedup for c in merge.values()) + "×",
        "w64 speedup": span(c.speedup for c in w64.values()) + "×",
        "w64 held-out vs dspy.GEPA": signed_span(c.vs_baseline for c in w64.values()),
        "w256 speedup": span(c.speedup for c in w256.values()) + "×",
        "w256 held-out vs dspy.GEPA": signed_span(c.vs_baseline for c in w256.values()),
    }
    for name in missed:
        c = swap[name]
        figures[f"class swap held-out vs dspy.GEPA {name}"] = signed(c.vs_baseline, 3)
        figures[f"class swap held-out vs dspy.GEPA {name} per seed"] = ", ".join(signed(d) for d in c.paired)
    http = {name: cell([W16_HTTP], "async 4x4 merge", [W16_HTTP], name) for name in ("depth/fixed", "breadth/fixed")}
    figures["w16 http speedup"] = span(c.speedup for c in http.values()) + "×"
    for name, c in http.items():
        figures[f"w16 http held-out vs dspy.GEPA {name}"] = f"{abs(c.vs_baseline):.2f} {'below' if c.vs_baseline < 0 else 'above'}"
    figures["w16 dspy.GEPA metric calls"] = f"{most_calls(W16, BASELINE)} of 600"
    figures["w16 PxNSampling metric calls"] = f"{most_calls(W16, 'dspy.GEPA+PxNSampling 4x4')} of 600"
    figures["w16 4x4 metric calls"] = f"{most_calls(W16, 'async 4x4 merge')} of 600"
    floor = floor_s([W16])
    figures["w16 dspy.GEPA x floor"] = span(statistics.mean(c.baseline_walls) / floor for c in four.values()) + "×"
    figures["mlflow prompts speedup"] = span(mlflow_prompts_speedup(name) for name in MLFLOW_PROMPTS) + "×"
    mlflow_calls = [r["predict_calls"] for name in MLFLOW_PROMPTS for r in load(name)["rows"]
                    if r["config"] == "mlflow.GepaPromptOptimizer"]
    figures["mlflow prompts MLflow's metric calls"] = f"{min(mlflow_calls)}-{max(mlflow_calls)}"
    for name in CELLS:
        figures[f"w16 held-out {name}"] = f"{four[name].test:.3f} ± {four[name].test_sd:.3f}"
        figures[f"w16 dspy.GEPA held-out {name}"] = f"{statistics.mean(four[name].baseline_tests):.3f}"
    return figures


def mlflow_prompts_speedup(name: str) -> float:
    """MLflow's GepaPromptOptimizer's mean wall over BatchedGepaPromptOptimizer's, in one bench_mlflow_prompts run."""
    rows = load(name)["rows"]
    walls = {config: statistics.mean(r["wall_s"] for r in rows if r["config"] == config)
             for config in ("mlflow.GepaPromptOptimizer", "BatchedGepaPromptOptimizer")}
    return walls["mlflow.GepaPromptOptimizer"] / walls["BatchedGepaPromptOptimizer"]


def floor_s(files: list[str]) -> float:
    """B·T_e/W of a regime (T_e the median call time), read from a results file's arguments."""
    args = load(files[0])["args"]
    return args["budget"] * args["task_latency"] * args["scale"] / args["workers"]


W16_TABLE = (  # bench_schedules.py config, what the page calls it
    (BASELINE, "dspy.GEPA 1×1"),
    ("dspy.GEPA+PxNSampling 4x4", "dspy.GEPA with gepa's `PxNSampling(4, 4)`"),
    ("async 4x4 merge", "BatchedGEPA `p=4, n=4`"),
    ("async 4x4 all", "`p=4, n=4, selection=\"all\"`"),
    ("steps 4x4 best", "`p=4, n=4, schedule=\"steps\", selection=\"best\"`"),
    ("steps 4x4 merge", "`p=4, n=4, schedule=\"steps\"`"),
)


def table_class_swap() -> str:
    """The class swap as the Benchmarks page prints it: dspy.GEPA's call, and the same with only the class changed."""
    lines = [("| landscape / call times | dspy.GEPA: wall | BatchedGEPA: wall | × sooner | held-out: dspy.GEPA "
              "| BatchedGEPA | difference (per seed) | metric calls of 600: dspy.GEPA / BatchedGEPA |"),
             "|---|---|---|---|---|---|---|---|"]
    for name, c in class_swap().items():
        spent = [max(r["metric_calls"] for r in rows([CLASS_SWAP], config, name).values())
                 for config in (CLASS_SWAP_BASELINE, CLASS_SWAP_CONFIG)]
        difference = f"{signed(c.vs_baseline, 3)} ({' '.join(signed(d) for d in c.paired)})"
        if c.vs_baseline < HELD_OUT_AIM:
            difference = f"**{difference}**"
        lines.append(f"| {name.replace('/', ' / ')} | {statistics.mean(c.baseline_walls):.1f} s | {c.wall:.1f} s "
                     f"| {c.speedup:.2f}× | {statistics.mean(c.baseline_tests):.3f} ± {statistics.stdev(c.baseline_tests):.3f} "
                     f"| {c.test:.3f} ± {c.test_sd:.3f} | {difference} | {spent[0]} / {spent[1]} |")
    return "\n".join(lines)


def table_w16() -> str:
    """The W = 16 comparison as the Benchmarks page prints it: every setting against dspy.GEPA 1×1, 5 seeds."""
    lines = [("| setting | × faster than dspy.GEPA 1×1 | held-out, depth (fixed / lognormal) | "
              "held-out, breadth (fixed / lognormal) |"), "|---|---|---|---|"]
    for config, label in W16_TABLE:
        cells = w16(config) if config != BASELINE else None
        speed = "1" if cells is None else span(c.speedup for c in cells.values()) + "×"
        held = []
        for landscape in ("depth", "breadth"):
            pair = []
            for latency in ("fixed", "lognormal"):
                tests = [r["test"] for r in rows([W16], config, f"{landscape}/{latency}").values()]
                pair.append(f"{statistics.mean(tests):.2f} ± {statistics.stdev(tests):.2f}")
            held.append(" / ".join(pair))
        lines.append(f"| {label} | {speed} | {held[0]} | {held[1]} |")
    return "\n".join(lines)


def table_width() -> str:
    """BatchedGEPA (4×4 at W = 16, p="auto" wider; crossover off) against dspy.GEPA 1×1 at W = 16, 64 and 256, per
    landscape, fixed / lognormal call times."""
    regimes = {16: (w16("async 4x4 merge"), [W16], "600, 30"), 64: (wide(64), WIDE[64]["auto"], "3000, 150"),
               256: (wide(256), WIDE[256]["auto"], "5000, 150")}
    lines = [("| W (B, \\|val\\|) | landscape | seeds | × faster than dspy.GEPA 1×1 | × the floor | "
              "held-out minus dspy.GEPA's |"), "|---|---|---|---|---|---|"]
    for workers, (cells, files, shape) in regimes.items():
        floor = floor_s(files)
        for landscape in ("depth", "breadth"):
            fixed, lognormal = cells[f"{landscape}/fixed"], cells[f"{landscape}/lognormal"]
            lines.append(f"| {workers} ({shape}) | {landscape} | {len(fixed.tests)} | "
                         f"{fixed.speedup:.1f} / {lognormal.speedup:.1f} | "
                         f"{fixed.wall / floor:.2f} / {lognormal.wall / floor:.2f} | "
                         f"{signed(fixed.vs_baseline)} / {signed(lognormal.vs_baseline)} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- charts

SETTINGS = (  # bench_schedules.py config, label, colour
    (BASELINE, "dspy.GEPA 1×1", "#444444"),
    ("dspy.GEPA+PxNSampling 4x4", "dspy.GEPA + PxNSampling 4×4", "#999999"),
    ("steps 4x4 all", "steps, all", "#8fb3d9"),
    ("steps 4x4 best", "steps, best", "#3f7fbf"),
    ("steps 4x4 merge", "steps, merge", "#1b4f8a"),
    ("async 4x4 all", "async, all", "#f2a65a"),
    ("async 4x4 merge", "async, merge", "#d1495b"),
)


def chart_class_swap(plt, out: Path) -> None:
    """dspy.GEPA's call and the same call with only the class name changed: wall-clock and held-out, per cell."""
    cells = class_swap()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.8))
    xs = range(len(CELLS))
    for offset, (label, colour, walls, tests) in zip((-0.2, 0.2), (
            ("dspy.GEPA (its defaults)", "#444444", lambda c: c.baseline_walls, lambda c: c.baseline_tests),
            ("BatchedGEPA (the same call)", "#d1495b", lambda c: c.walls, lambda c: c.tests))):
        left.bar([x + offset for x in xs], [statistics.mean(walls(cells[n])) for n in CELLS], width=0.4,
                 yerr=[statistics.stdev(walls(cells[n])) for n in CELLS], color=colour, capsize=3, label=label)
        right.errorbar([x + offset for x in xs], [statistics.mean(tests(cells[n])) for n in CELLS],
                       yerr=[statistics.stdev(tests(cells[n])) for n in CELLS], fmt="o", color=colour, ms=8,
                       capsize=3, label=label)
        for x, n in zip(xs, CELLS):
            right.scatter([x + offset] * len(tests(cells[n])), tests(cells[n]), color=colour, alpha=0.3, s=14)
    names = [n.replace("/", "\n") for n in CELLS]
    for ax in (left, right):
        ax.set_xticks(list(xs), labels=names)
        ax.grid(alpha=0.3, axis="y")
    left.set_ylabel("wall-clock, s (mean ± sd)")
    left.set_title("wall-clock", fontsize=11)
    left.legend(fontsize=10)
    right.set_ylabel("held-out score (mean ± sd; dots: seeds)")
    right.set_title("held-out quality", fontsize=11)
    args = load(CLASS_SWAP)["args"]
    fig.suptitle(f"Only the class name changed: W = {args['workers']}, B = {args['budget']}, |val| = {args['val']}, "
                 f"{args['seeds']} seeds", fontsize=13)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def chart_w16(plt, out: Path) -> None:
    """Held-out against wall-clock for every setting at W = 16, with the seeds' spread on both axes."""
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, 2, figsize=(10, 6), sharey=True)
    for ax, landscape in zip(axes, ("depth", "breadth")):
        for config, label, colour in SETTINGS:
            for latency, marker_face in (("fixed", colour), ("lognormal", "white")):
                mine = list(rows([W16], config, f"{landscape}/{latency}").values())
                walls, tests = [r["wall_s"] for r in mine], [r["test"] for r in mine]
                ax.errorbar(statistics.mean(walls), statistics.mean(tests), xerr=statistics.stdev(walls),
                            yerr=statistics.stdev(tests), fmt="o", color=colour, mfc=marker_face, mew=1.6, ms=8,
                            capsize=3, elinewidth=1, label=label if latency == "fixed" else None)
        ax.set_xscale("log")
        ax.set_xticks([20, 30, 50, 100, 150, 200], labels=["20", "30", "50", "100", "150", "200"])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{landscape} landscape")
        ax.set_xlabel("wall-clock, s (log scale)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out score (mean ± sd, 5 seeds)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=11, frameon=False,
               title="filled: fixed call times; hollow: lognormal (p99 = 4× the median)", title_fontsize=11)
    fig.suptitle("W = 16, B = 600, |val| = 30: up and to the left is better", fontsize=13)
    fig.tight_layout(rect=(0, 0.2, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def chart_width(plt, out: Path) -> None:
    """BatchedGEPA's speedup over dspy.GEPA 1×1, and its held-out difference, against the pool's width (4×4 at
    W = 16, p="auto" at 64 and 256; the crossover off in every run)."""
    regimes = {16: w16("async 4x4 merge"), 64: wide(64), 256: wide(256)}
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.8))
    styles = {"depth/fixed": ("#1b4f8a", "o", "-"), "depth/lognormal": ("#1b4f8a", "s", "--"),
              "breadth/fixed": ("#d1495b", "o", "-"), "breadth/lognormal": ("#d1495b", "s", "--")}
    xs = list(regimes)
    for offset, name in zip((-0.06, -0.02, 0.02, 0.06), CELLS):
        colour, marker, line = styles[name]
        shifted = [x * 2 ** offset for x in xs]
        left.plot(xs, [regimes[x][name].speedup for x in xs], marker=marker, ls=line, color=colour, label=name)
        right.errorbar(shifted, [regimes[x][name].vs_baseline for x in xs],
                       yerr=[regimes[x][name].paired_sd for x in xs], marker=marker, ls=line, color=colour,
                       capsize=3, label=name)
    labels = ["16\nB 600\n4×4", "64\nB 3000\nauto", "256\nB 5000\nauto"]
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, labels=labels)
        ax.set_xlabel("pool width W (workers)")
        ax.grid(alpha=0.3)
    left.set_ylabel("× faster than dspy.GEPA 1×1")
    left.set_ylim(bottom=0)
    left.legend(fontsize=10)
    right.axhline(0, color="#444444", lw=1)
    right.set_ylabel("held-out minus dspy.GEPA 1×1's")
    right.set_title("held-out: mean ± sd of the per-seed difference", fontsize=11)
    left.set_title("speedup: ratio of mean wall-clocks", fontsize=11)
    seeds = {x: len(regimes[x]["depth/fixed"].tests) for x in xs}
    fig.suptitle("BatchedGEPA against dspy.GEPA 1×1 as the pool widens (seeds: "
                 + ", ".join(f"{n} at W = {x}" for x, n in seeds.items()) + ")", fontsize=13)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def best_so_far(points: list[list[float]], grid: list[float]) -> list[float]:
    """The best validation score reached by each time of ``grid`` (0 before the seed's validation)."""
    out, best, i = [], None, 0
    ordered = sorted(points)
    for t in grid:
        while i < len(ordered) and ordered[i][0] <= t:
            best = ordered[i][1] if best is None else max(best, ordered[i][1])
            i += 1
        out.append(best if best is not None else float("nan"))
    return out


def chart_curves(plt, out: Path) -> None:
    """Best validation score so far against wall-clock, dspy.GEPA 1×1 and BatchedGEPA 4×4, each seed and the mean."""
    data = load(CURVES)
    args = data["args"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 5.2), sharey=True)
    colours = {BASELINE: "#444444", "async 4x4 merge": "#d1495b"}
    labels = {BASELINE: "dspy.GEPA 1×1", "async 4x4 merge": "BatchedGEPA p=4, n=4"}
    for ax, landscape in zip(axes, ("depth", "breadth")):
        runs = [r for r in data["runs"] if r["landscape"] == landscape]
        end = max(r["wall_s"] for r in runs)
        grid = [end * i / 400 for i in range(401)]
        for config, colour in colours.items():
            mine = [r for r in runs if r["config"] == config]
            curves = []
            for run in mine:
                curve = best_so_far(run["validations"], grid)
                curve = [v if t <= run["wall_s"] else curve[-1] for t, v in zip(grid, curve)]
                curves.append(curve)
                ax.step(grid, [v if t <= run["wall_s"] else float("nan") for t, v in zip(grid, curve)],
                        where="post", color=colour, alpha=0.25, lw=1)
            mean = [float("nan") if any(math.isnan(v) for v in vals) else statistics.mean(vals) for vals in zip(*curves)]
            last = max(r["wall_s"] for r in mine)
            ax.step([t for t in grid if t <= last], [m for t, m in zip(grid, mean) if t <= last], where="post",
                    color=colour, lw=2.2, label=f"{labels[config]}: mean of {len(mine)} seeds")
        ax.set_title(f"{landscape} landscape")
        ax.set_xlabel("wall-clock, s")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("best validation score so far")
    handles, legend = axes[0].get_legend_handles_labels()
    fig.legend(handles, legend, loc="lower center", ncol=2, fontsize=11, frameon=False)
    scale = args["scale"]
    fig.suptitle(f"W = {args['workers']}, B = {args['budget']}, |val| = {args['val']}; task call "
                 f"{args['task_latency'] * scale:g} s, reflection {4 * args['task_latency'] * scale:g} s (fixed); "
                 "thin lines: single seeds", fontsize=12)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 12})  # the site shows these about 700 px wide
    ASSETS.mkdir(parents=True, exist_ok=True)
    chart_class_swap(plt, ASSETS / "bench_class_swap.png")
    chart_w16(plt, ASSETS / "bench_w16_tradeoff.png")
    chart_width(plt, ASSETS / "bench_speedup_vs_width.png")
    if (RESULTS / CURVES).exists():
        chart_curves(plt, ASSETS / "bench_best_so_far.png")
    for name, value in headlines().items():
        print(f"{name}: {value}")
    print(f"\n{table_class_swap()}\n\n{table_w16()}\n\n{table_width()}")


if __name__ == "__main__":
    main()
