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
# changed, under the former p="auto" (five validation windows: 5×1 async at W = 16, each proposal screened on 8
# examples, the sibling merge and the crossover), and with reflection_minibatch_size=3, 10 seeds, each run's bill
# counted where its calls were answered. Its dspy.GEPA rows are every W = 16 comparison's baseline.
CLASS_SWAP = "class_swap_bill.json"
# BatchedGEPA's defaults since the async schedule screens in stages and p="auto" leaves six validation windows (4 in
# flight at W 16, B 600, |val| 30); against CLASS_SWAP's dspy.GEPA runs, seed by seed.
CLASS_SWAP_DEFAULT = "class_swap_default.json"
# The defaults before staged screening (3 in flight, every proposal screened on 8), and the same with
# reflection_minibatch_size=3 (9 in flight then), the same seeds and dspy.GEPA runs.
BEFORE_STAGING = "class_swap_default_before_staging.json"
CLASS_SWAP_BASELINE, CLASS_SWAP_CONFIG, PAY_MORE = "dspy.GEPA", "BatchedGEPA", "BatchedGEPA m3"
# Its cells: the two landscapes where improvements are independent, and the chain, where each needs the last.
SWAP_CELLS = (*("depth/fixed", "depth/lognormal", "breadth/fixed", "breadth/lognormal"), "chain/fixed", "chain/lognormal")
INDEPENDENT = SWAP_CELLS[:4]
# The class swap on a wide pool: W = 64, B = 3000, |val| = 150, 5 seeds.
CLASS_SWAP_W64 = "class_swap_w64_bill.json"
# The class swap on three landscapes the defaults were not chosen on (bench_schedules.py --landscape), both
# optimizers side by side, W = 16, B = 600, 10 seeds.
CLASS_SWAP_UNSEEN = "class_swap_unseen.json"
# Other widths (p=3; p=5) and fewer in flight screened on dspy.GEPA's 3 (p=3, reflection_minibatch_size=3), one run
# of bench_schedules.py on the defaults' code, fixed call times, 10 seeds.
OTHER_SETTINGS = "class_swap_other_settings.json"
# Every improving child validated, each proposal screened on 3, 4 in flight: the budget split as dspy.GEPA splits it
# (p=4, selection="all", reflection_minibatch_size=3), seeds 0-9 with fixed and lognormal call times.
EVERY_IMPROVER = ("class_swap_all_m3.json", "class_swap_all_m3_lognormal.json")
EVERY_IMPROVER_CONFIG = "async 4x1 all m3 x"
# What a user may set instead of the defaults, each against dspy.GEPA on the same seeds (fixed call times): a config
# of bench_schedules.py, how the page names it, and its results file.
SETTINGS_TRIED = (
    (CLASS_SWAP_CONFIG, "the defaults (4 in flight, screened in stages)", CLASS_SWAP_DEFAULT),
    ("BatchedGEPA p3", "`p=3`", OTHER_SETTINGS),
    ("BatchedGEPA p5", "`p=5`", OTHER_SETTINGS),
    ("BatchedGEPA p3 m3", "`p=3, reflection_minibatch_size=3`", OTHER_SETTINGS),
)
# The held-out aim the class swap was measured against: no more than this below dspy.GEPA's.
HELD_OUT_AIM = -0.02
# The MLflow optimizer's aim: a final score no more than this below MLflow's own GEPA optimizer's.
MLFLOW_FINAL_AIM = -0.03

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
# p="auto" at W = 256 with today's defaults (screened in stages on ceil(|val|/4) rows, which p="auto" counts in its
# width: 8 in flight), crossover off, 3 seeds, fixed call times; WIDE's "auto" runs were screened on 3.
W256_DEFAULTS = "w256_defaults.json"
# The bill at W = 256 (3 seeds, fixed call times): dspy.GEPA 1×1 rerun for it, and p="auto" screened on 3 (the
# setting WIDE's "auto" runs measured) beside the defaults' runs above.
W256_BILL_BASELINE, W256_SCREENED_ON_3 = "w256_1x1_bill.json", "w256_screened_on_3_bill.json"
CURVES = "curves_w16.json"
# MLflow's optimize_prompts, each optimizer at its defaults, 30 rows, B = 300, with each run's bill: by setting.
MLFLOW_BILL = {"untraced, depth": "mlflow_prompts_bill_depth.json", "untraced, breadth": "mlflow_prompts_bill_breadth.json",
               "untraced, chain": "mlflow_prompts_bill_chain.json",
               "traced into a sqlite store, depth": "mlflow_prompts_bill_traced.json"}
# The same on three landscapes the defaults were not chosen on (the class swap's CLASS_SWAP_UNSEEN), untraced.
MLFLOW_UNSEEN = {f"untraced, {name}": f"mlflow_prompts_unseen_{name}.json" for name in ("noisy-chain", "shallow", "garbled")}
MLFLOW_UNTRACED = tuple(name for setting, name in MLFLOW_BILL.items() if setting.startswith("untraced"))
MLFLOW_OURS, MLFLOW_THEIRS = "BatchedGepaPromptOptimizer", "mlflow.GepaPromptOptimizer"


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


def class_swap(config: str = CLASS_SWAP_CONFIG, files: tuple[str, ...] = (CLASS_SWAP_DEFAULT,)) -> dict[str, Cell]:
    """BatchedGEPA's defaults (or ``config``) against dspy.GEPA's, the same call with only the class name changed."""
    named = [*SWAP_CELLS, *(name for name in load(files[0])["tables"] if name not in SWAP_CELLS)]
    present = [name for name in named if rows(list(files), config, name)]
    return {name: cell(list(files), config, [swap_baseline(files)], name, CLASS_SWAP_BASELINE) for name in present}


def swap_baseline(files: tuple[str, ...]) -> str:
    """Where dspy.GEPA's runs for a class-swap results file are: in the file, where it ran both optimizers side by
    side, else the W = 16 comparison's (the defaults' and the equal-dollar runs were measured against those)."""
    has_its_own = any(row["config"] == CLASS_SWAP_BASELINE
                      for table in load(files[0])["tables"].values() for row in table["rows"])
    return files[0] if has_its_own else CLASS_SWAP


def bill_ratio(files: list[str], config: str, name: str, read, baseline_files: list[str] | None = None,
               baseline: str = CLASS_SWAP_BASELINE) -> float:
    """The mean of ``read(row)`` for ``config`` over ``baseline``'s (dspy.GEPA's), in one cell, over the seeds both
    ran."""
    mine, base = rows(files, config, name), rows(baseline_files or files, baseline, name)
    seeds = sorted(set(mine) & set(base))
    return statistics.mean(read(mine[s]) for s in seeds) / statistics.mean(read(base[s]) for s in seeds)


BILL = {"reflection calls": lambda r: r["bill"]["reflection"]["calls"],
        "reflection tokens in": lambda r: r["bill"]["reflection"]["prompt"], "dollars": lambda r: r["usd"]}


def pooled(cells: dict[str, Cell]) -> str:
    """The held-out difference with dspy.GEPA over every seed of ``cells``, paired, with its standard error."""
    differences = [d for c in cells.values() for d in c.paired]
    se = statistics.stdev(differences) / math.sqrt(len(differences))
    return f"{signed(statistics.mean(differences), 3)} (se {se:.3f})"


def wide(workers: int, auto: list[str] | None = None) -> dict[str, Cell]:
    """p="auto" against dspy.GEPA 1×1 on a wide pool, in each cell its runs (WIDE's, or ``auto``'s) measured."""
    files = WIDE[workers]
    auto = auto or files["auto"]
    return {name: cell(auto, "async auto merge", files["baseline"], name) for name in CELLS
            if rows(auto, "async auto merge", name)}


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
    return max(r["metric_calls"] for cell_name in SWAP_CELLS for r in rows([name], config, cell_name).values())


def headlines() -> dict[str, str]:
    """The figures the README and the site quote, as they quote them."""
    swap, more = class_swap(), class_swap(PAY_MORE, (BEFORE_STAGING,))
    every_improver = class_swap(EVERY_IMPROVER_CONFIG, EVERY_IMPROVER)
    independent = {name: swap[name] for name in INDEPENDENT}
    chain = {name: c for name, c in swap.items() if name.startswith("chain")}
    four, every = w16("async 4x4 merge"), w16("async 4x4 all")
    best, merge = w16("steps 4x4 best"), w16("steps 4x4 merge")
    w64, w256 = wide(64), wide(256)
    w256_defaults = wide(256, [W256_DEFAULTS])
    missed = [name for name, c in independent.items() if c.vs_baseline < HELD_OUT_AIM]
    figures = {
        "class swap speedup": span(c.speedup for c in swap.values()) + "×",
        "class swap held-out vs dspy.GEPA": signed_span(c.vs_baseline for c in independent.values()),
        "class swap held-out pooled": pooled(independent),
        "class swap held-out chain": signed_span(c.vs_baseline for c in chain.values()),
        "class swap cells below the aim": ", ".join(missed) if missed else "none",
        "class swap dspy.GEPA metric calls": f"{most_calls(CLASS_SWAP, CLASS_SWAP_BASELINE)} of 600",
        "class swap metric calls": f"{most_calls(CLASS_SWAP_DEFAULT, CLASS_SWAP_CONFIG)} of 600",
        **{f"class swap {what} ×": span((bill_ratio([CLASS_SWAP_DEFAULT], CLASS_SWAP_CONFIG, name, read, [CLASS_SWAP])
                                         for name in swap), 2) + "×" for what, read in BILL.items()},
        "pay more held-out pooled": pooled({name: more[name] for name in INDEPENDENT}),
        **{f"pay more {what} ×": span((bill_ratio([BEFORE_STAGING], PAY_MORE, name, read, [CLASS_SWAP])
                                       for name in more), 2) + "×" for what, read in BILL.items()},
        "every improver speedup": span(c.speedup for c in every_improver.values()) + "×",
        **{f"every improver {what} ×": span((bill_ratio(list(EVERY_IMPROVER), EVERY_IMPROVER_CONFIG, name, read,
                                                        [CLASS_SWAP]) for name in every_improver), 2) + "×"
           for what, read in BILL.items()},
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
        "w256 defaults speedup": span(c.speedup for c in w256_defaults.values()) + "×",
        "w256 defaults held-out vs dspy.GEPA": signed_span(c.vs_baseline for c in w256_defaults.values()),
        **{f"w256 {setting} {what} ×": span((bill_ratio([file], config, name, read, [W256_BILL_BASELINE], BASELINE)
                                             for name in w256_defaults), 2) + "×"
           for setting, file, config in (("defaults", W256_DEFAULTS, "async auto merge"),
                                         ("screened on 3", W256_SCREENED_ON_3, "async auto merge m3"))
           for what, read in BILL.items()},
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
    if (RESULTS / CLASS_SWAP_W64).exists():
        wide_swap = class_swap(files=(CLASS_SWAP_W64,))
        wide_independent = {name: c for name, c in wide_swap.items() if name in INDEPENDENT}
        figures["class swap w64 speedup"] = span(c.speedup for c in wide_swap.values()) + "×"
        figures["class swap w64 held-out vs dspy.GEPA"] = signed_span(c.vs_baseline for c in wide_independent.values())
        figures["class swap w64 held-out pooled"] = pooled(wide_independent)
        figures["class swap w64 held-out chain"] = ", ".join(
            signed(c.vs_baseline, 3) for name, c in wide_swap.items() if name.startswith("chain"))
        for what, read in BILL.items():
            figures[f"class swap w64 {what} ×"] = span((bill_ratio([CLASS_SWAP_W64], CLASS_SWAP_CONFIG, name, read)
                                                        for name in wide_swap), 2) + "×"
    if (RESULTS / CLASS_SWAP_UNSEEN).exists():
        unseen = class_swap(files=(CLASS_SWAP_UNSEEN,))
        figures["class swap unseen speedup"] = span(c.speedup for c in unseen.values()) + "×"
        figures["class swap unseen held-out vs dspy.GEPA"] = signed_span(c.vs_baseline for c in unseen.values())
        figures["class swap unseen held-out pooled"] = pooled(unseen)
        for what, read in BILL.items():
            figures[f"class swap unseen {what} ×"] = span((bill_ratio([CLASS_SWAP_UNSEEN], CLASS_SWAP_CONFIG, name, read)
                                                           for name in unseen), 2) + "×"
    if all((RESULTS / name).exists() for name in MLFLOW_BILL.values()):
        untraced = [mlflow_compared(name) for name in MLFLOW_UNTRACED]
        figures["mlflow prompts speedup"] = span(c["speedup"] for c in untraced) + "×"
        figures["mlflow prompts traced speedup"] = f"{mlflow_compared(MLFLOW_BILL['traced into a sqlite store, depth'])['speedup']:.1f}×"
        figures["mlflow prompts final vs MLflow's"] = signed_span(c["final"][0] for c in untraced)
        figures["mlflow prompts dollars ×"] = span((c["usd"] for c in untraced), 2) + "×"
        figures["mlflow prompts reflection calls ×"] = span((c["reflection_calls"] for c in untraced), 2) + "×"
        figures["mlflow prompts final vs MLflow's, improvements independent"] = signed_span(
            c["final"][0] for name, c in zip(MLFLOW_UNTRACED, untraced) if "chain" not in name)
        figures["mlflow prompts final vs MLflow's, chain"] = signed(
            mlflow_compared(MLFLOW_BILL["untraced, chain"])["final"][0], 3)
        mlflow_calls = [r["predict_calls"] for name in MLFLOW_UNTRACED for r in load(name)["rows"]
                        if r["config"] == MLFLOW_THEIRS]
        figures["mlflow prompts MLflow's metric calls"] = f"{min(mlflow_calls)}-{max(mlflow_calls)}"
    for name in CELLS:
        figures[f"w16 held-out {name}"] = f"{four[name].test:.3f} ± {four[name].test_sd:.3f}"
        figures[f"w16 dspy.GEPA held-out {name}"] = f"{statistics.mean(four[name].baseline_tests):.3f}"
    return figures


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


def difference_text(c: Cell) -> str:
    """A cell's held-out difference with dspy.GEPA and its standard error, in bold where it misses the aim."""
    text = f"{signed(c.vs_baseline, 3)} ({c.paired_sd / math.sqrt(len(c.paired)):.3f})"
    return f"**{text}**" if c.vs_baseline < HELD_OUT_AIM else text


def table_class_swap(config: str = CLASS_SWAP_CONFIG, files: tuple[str, ...] = (CLASS_SWAP_DEFAULT,)) -> str:
    """The class swap as the Benchmarks page prints it: dspy.GEPA's call beside the same call with only the class
    changed (or ``config``): wall-clock, held-out (mean ± sd, the paired difference and its standard error) and the
    bill (reflection calls, reflection tokens in, dollars at the stated price pair) as ratios to dspy.GEPA's."""
    lines = [("| landscape / call times | wall: dspy.GEPA → BatchedGEPA | × sooner | held-out: dspy.GEPA → BatchedGEPA "
              "| difference (se) | reflection calls | reflection tokens in | $ |"), "|---|---|---|---|---|---|---|---|"]
    for name, c in class_swap(config, files).items():
        difference = difference_text(c)
        base = swap_baseline(files)
        bill = [bill_ratio(list(files), config, name, read, [base]) for read in BILL.values()]
        calls = [statistics.mean(BILL["reflection calls"](r) for r in rows([f], k, name).values())
                 for f, k in ((base, CLASS_SWAP_BASELINE), (files[0], config))]
        lines.append(f"| {name.replace('/', ' / ')} | {statistics.mean(c.baseline_walls):.1f} → {c.wall:.1f} s "
                     f"| {c.speedup:.2f}× | {statistics.mean(c.baseline_tests):.3f} → {c.test:.3f} | {difference} "
                     f"| {calls[0]:.1f} → {calls[1]:.1f} ({bill[0]:.2f}×) | {bill[1]:.2f}× | {bill[2]:.2f}× |")
    return "\n".join(lines)


def table_settings() -> str:
    """Each setting a user may choose against dspy.GEPA, per landscape (fixed call times): speed, held-out, the bill."""
    lines = ["| landscape | setting | × sooner | held-out − dspy.GEPA's (se) | reflection calls × | reflection tokens in × | $ × |",
             "|---|---|---|---|---|---|---|"]
    for landscape in ("depth", "breadth", "chain"):
        name = f"{landscape}/fixed"
        for config, label, source in SETTINGS_TRIED:
            if not (RESULTS / source).exists() or not rows([source], config, name):
                continue
            c = cell([source], config, [CLASS_SWAP], name, CLASS_SWAP_BASELINE)
            calls, tokens_in, usd = (bill_ratio([source], config, name, read, [CLASS_SWAP]) for read in BILL.values())
            lines.append(f"| {landscape} | {label} | {c.speedup:.2f}× | {difference_text(c)} | {calls:.2f}× "
                         f"| {tokens_in:.2f}× | {usd:.2f}× |")
    return "\n".join(lines)


def mlflow_compared(name: str) -> dict:
    """BatchedGepaPromptOptimizer against MLflow's optimizer in one bench_mlflow_prompts run, paired by seed."""
    return next(c for c in load(name)["compared"] if c["config"] == MLFLOW_OURS)


def table_mlflow(settings: dict[str, str] = MLFLOW_BILL) -> str:
    """Each MLflow setting, and each setting of ours measured beside it: speed, final and held-out scores paired by
    seed, the bill, and predict_fn calls."""
    lines = [("| setting | seeds | × sooner (per seed) | final: MLflow's → ours (− MLflow's, se) "
              "| held-out − MLflow's (se) | reflection calls: MLflow's → ours | reflection tokens in × | $ × "
              "| predict_fn calls of 300: MLflow's / ours |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for setting, name in settings.items():
        results = load(name)
        for c in results["compared"]:
            ours = c["config"]
            of = {config: [r for r in results["rows"] if r["config"] == config] for config in (MLFLOW_THEIRS, ours)}
            finals = [statistics.mean(r["final_score"] for r in of[k]) for k in (MLFLOW_THEIRS, ours)]
            reflections = [statistics.mean(r["bill"]["reflection"]["calls"] for r in of[k]) for k in (MLFLOW_THEIRS, ours)]
            calls = [f"{min(r['predict_calls'] for r in of[k])}-{max(r['predict_calls'] for r in of[k])}"
                     for k in (MLFLOW_THEIRS, ours)]
            final, held = c["final"], c["held_out"]
            difference = f"{signed(final[0], 3)}, {final[1]:.3f}"
            if final[0] < MLFLOW_FINAL_AIM:
                difference = f"**{difference}**"
            low, high = min(c["speedup_per_seed"]), max(c["speedup_per_seed"])
            label = setting if ours == MLFLOW_OURS else f"{setting}, `{ours.removeprefix(MLFLOW_OURS)}`"
            lines.append(f"| {label} | {c['seeds']} | {c['speedup']:.2f}× ({low:.2f}-{high:.2f}) "
                         f"| {finals[0]:.3f} → {finals[1]:.3f} ({difference}) | {signed(held[0], 3)} ({held[1]:.3f}) "
                         f"| {reflections[0]:.1f} → {reflections[1]:.1f} | {c['reflection_in']:.2f}× | {c['usd']:.2f}× "
                         f"| {calls[0]} / {calls[1]} |")
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
    names_in = list(cells)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    xs = range(len(names_in))
    for offset, (label, colour, walls, tests) in zip((-0.2, 0.2), (
            ("dspy.GEPA (its defaults)", "#444444", lambda c: c.baseline_walls, lambda c: c.baseline_tests),
            ("BatchedGEPA (the same call)", "#d1495b", lambda c: c.walls, lambda c: c.tests))):
        left.bar([x + offset for x in xs], [statistics.mean(walls(cells[n])) for n in names_in], width=0.4,
                 yerr=[statistics.stdev(walls(cells[n])) for n in names_in], color=colour, capsize=3, label=label)
        right.errorbar([x + offset for x in xs], [statistics.mean(tests(cells[n])) for n in names_in],
                       yerr=[statistics.stdev(tests(cells[n])) for n in names_in], fmt="o", color=colour, ms=8,
                       capsize=3, label=label)
        for x, n in zip(xs, names_in):
            right.scatter([x + offset] * len(tests(cells[n])), tests(cells[n]), color=colour, alpha=0.3, s=14)
    names = [n.replace("/", "\n") for n in names_in]
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
    for name, table in tables().items():
        print(f"\n{name}\n{table}")


def tables() -> dict[str, str]:
    """Every table the Benchmarks page (and, for the older ones, the log) prints, by the name the page marks it with."""
    found = {"TABLE_CLASS_SWAP": table_class_swap(), "TABLE_SETTINGS": table_settings(),
             "TABLE_W16": table_w16(), "TABLE_WIDTH": table_width()}
    if (RESULTS / CLASS_SWAP_W64).exists():
        found["TABLE_W64"] = table_class_swap(files=(CLASS_SWAP_W64,))
    if all((RESULTS / name).exists() for name in MLFLOW_UNSEEN.values()):
        found["TABLE_MLFLOW_UNSEEN"] = table_mlflow(MLFLOW_UNSEEN)
    if (RESULTS / CLASS_SWAP_UNSEEN).exists():
        found["TABLE_UNSEEN"] = table_class_swap(files=(CLASS_SWAP_UNSEEN,))
    if all((RESULTS / name).exists() for name in MLFLOW_BILL.values()):
        found["TABLE_MLFLOW"] = table_mlflow()
    return found


if __name__ == "__main__":
    main()
