"""Every schedule side by side: wall-clock, ×floor, speedup over dspy.GEPA 1×1, and held-out, over seeds.

For each landscape (``depth``: one rule learned per reflection; ``breadth``: several per
reflection, noisy answers) and each latency model (``fixed``; ``lognormal`` with
p99/p50 ≈ 4), every configuration runs once per seed at equal budget on the simulated
LM, in this process, with the configured latencies slept in the calling threads (the
same waits as the latency server, without HTTP between). Rows, side by side in one run:

    dspy.GEPA                          upstream with its defaults (crossover on)
    BatchedGEPA                        the same call with only the class name changed (its defaults)
    dspy.GEPA 1x1                      upstream, merge off
    dspy.GEPA+PxNSampling 4x4          upstream with gepa's own P×N sampling
    steps 4x4 all | best | merge | merge+best     BatchedGEPA, schedule="steps"
    async 4x4 all | merge              BatchedGEPA, schedule="async"

Printed per (landscape, latency): wall (mean over seeds), ×floor (B·T_e/W, T_e the median call
time), ×limit (wall over max(floor, G·critical path), G the generations the run reached: its deepest
candidate's chain of parents back to the seed; a generation's critical path is 2·T_e + T_r + its
validation's waves (3·T_e + T_r where |val| ≤ W), plus T_r for a merge, so no schedule has that
candidate sooner; under lognormal call times the floor is at the mean call time and each wait of the
path is its expected value), G best and G reached (means: the best candidate's generations, what the
quality needed, and the deepest candidate's), speedup vs dspy.GEPA's mean wall (its defaults, or 1×1
with the crossover off), planned (what ``dspy-pxn plan`` predicts for the setting, from the configured
latencies, their spread and the planner's assumed acceptance, without a fitted run, and
its error against the measured wall), metric calls / B (max over seeds), held-out mean ± spread
(sample standard deviation) and the per-seed test scores. Everything is also written to
benchmarks/results/schedules.json.

    python benchmarks/bench_schedules.py                                  # the issue's regime, 5 seeds
    python benchmarks/bench_schedules.py --scale 0.25 --seeds 3           # quicker, same shape
    python benchmarks/bench_schedules.py --workers 64 --budget 3000 --val 150 --configs ...   # the wide regime
    python benchmarks/bench_schedules.py --server --parallel 1 --latencies fixed --configs ...  # over HTTP, on DSPy's default engine
    python benchmarks/bench_schedules.py --configs "dspy.GEPA,BatchedGEPA" --out benchmarks/results/class_swap.json
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import dspy
from gepa.strategies.proposal_sampling import PxNSampling

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.cli.plan import ASSUMED_ACCEPTANCE
from dspy_pxn.engine import width as widths
from dspy_pxn.engine.run import search_plan
from dspy_pxn.engine.width import auto_width, rows_reflection_reads, screening_minibatch
from dspy_pxn.ledger.budget import RunShape
from dspy_pxn.ledger.prices import token_prices, use_bundled_price_maps
from dspy_pxn.planning import RuntimeModel
from dspy_pxn.planning.spread import batch_seconds, mean_factor, sigma_of, slowest_factor
from dspy_pxn.proposer import selection as selections
from dspy_pxn.settings import Settings
from dspy_pxn.teleprompter import DEFAULTS
from dspy_pxn.testing.bill import PRICE_PAIR, dollars, from_server, from_simulated
from dspy_pxn.testing.landscape import Landscape, resolve_landscape

# A dspy.GEPA call with only the class name changed runs BatchedGEPA's defaults: at W = 16, B = 600 and
# |val| = 30, p="auto" comes to 3 proposals in flight, each screened on 8 examples, async, with the sibling merge
# (and the crossover).
CLASS_SWAP = {"BatchedGEPA": "async auto merge"}
# The class swap, and with one setting a user may add: ``reflection_minibatch_size=3`` screens on dspy.GEPA's 3
# (more proposals, so more reflection calls, at the same metric calls); "$": ``max_cost_usd`` set to what dspy.GEPA
# spent on the same call (``--equal-dollars-from``), the dollars binding rather than the metric calls ("+$": that cap
# added to the same call, its metric-call budget kept, whichever binds first ends the run); "pK": ``p=K``,
# fewer proposals in flight than ``p="auto"`` chooses (where each improvement builds on the last); "pK mM": both.
CLASS_SWAPS: dict[str, dict] = {
    "BatchedGEPA": {}, "BatchedGEPA m3": {"reflection_minibatch_size": 3},
    "BatchedGEPA p1": {"p": 1}, "BatchedGEPA p2": {"p": 2}, "BatchedGEPA p3": {"p": 3}, "BatchedGEPA p4": {"p": 4},
    "BatchedGEPA p5": {"p": 5}, "BatchedGEPA p1 async": {"p": 1, "schedule": "async"},
    "BatchedGEPA p2 m3": {"p": 2, "reflection_minibatch_size": 3}, "BatchedGEPA p2 best": {"p": 2, "selection": "best"},
    "BatchedGEPA p2 steps": {"p": 2, "schedule": "steps"},
    "BatchedGEPA p3 m3": {"p": 3, "reflection_minibatch_size": 3},
    "BatchedGEPA p4 m4": {"p": 4, "reflection_minibatch_size": 4},
    "BatchedGEPA p4 m3": {"p": 4, "reflection_minibatch_size": 3},
    "BatchedGEPA $": {"equal_dollars": True}, "BatchedGEPA m3 $": {"reflection_minibatch_size": 3, "equal_dollars": True},
    "BatchedGEPA p4 $": {"p": 4, "equal_dollars": True}, "BatchedGEPA +$": {"dollar_cap": True},
}
# An equal-dollar run's metric-call budget, in multiples of --budget: high enough that the dollars bind.
EQUAL_DOLLARS_CALLS = 10


def as_schedule(config: str) -> str:
    """A class swap's config as the schedule words it runs ("async auto merge", with its "mK" dial)."""
    if config not in CLASS_SWAPS:
        return config
    settings = CLASS_SWAPS[config]
    minibatch, p = settings.get("reflection_minibatch_size"), settings.get("p")
    if p is None:
        schedule = CLASS_SWAP["BatchedGEPA"]
    else:  # what BatchedGEPA runs at this width: gepa's own loop at one proposal, else the async merge
        given = {name: value for name, value in settings.items() if name not in ("equal_dollars", "dollar_cap")}
        chosen = Settings.of({**DEFAULTS, "metric": None, "reflection_lm": dspy.LM("openai/unused"), **given})
        loop, selection = search_plan(chosen, p)
        schedule = f"{loop} {p}x1 {selections.label(selection)}"
    return schedule + (f" m{minibatch}" if minibatch else "")

# p99/p50 of each latency model's call times (dspy_pxn.testing.latency); the planner has no straggler model.
P99_RATIOS = {"fixed": 1.0, "lognormal": 4.0}

DEFAULT_VALIDATIONS = (widths.MAX_VALIDATIONS_IN_FLIGHT, widths.SECOND_VALIDATION_MIN_IMPROVERS)

DEFAULT_CONFIGS = (
    "dspy.GEPA 1x1,dspy.GEPA+PxNSampling 4x4,steps 4x4 all,steps 4x4 best,steps 4x4 merge,steps 4x4 merge+best,"
    "async 4x4 all,async 4x4 merge"
)


def landscape_of(args, name: str) -> Landscape:
    """A preset landscape by name, or one defined on the command line (``--landscape NAME=JSON``)."""
    defined = dict(item.split("=", 1) for item in getattr(args, "landscape", None) or [])
    if name not in defined:
        return resolve_landscape(name)
    return resolve_landscape(json.dumps({"name": name, **json.loads(defined[name])}))


def lm(args, landscape: str, latency: str, seed: int, kind: str) -> sim.SimulatedLM:
    task_s = args.task_latency * args.scale
    return sim.SimulatedLM(
        f"openai/sim-{kind}", task_latency=task_s, reflection_latency=args.reflection_ratio * task_s, latency=latency,
        seed=seed * 2 + (kind == "reflection"), landscape=landscape_of(args, landscape),
    )


def price_the_simulated_models() -> None:
    """The simulated task and reflection models priced as the price pair, as a user registers a model litellm does
    not know: what a dollar cap (``max_cost_usd``) reads in the equal-dollar configs."""
    import litellm

    for role, model in PRICE_PAIR.items():
        price = token_prices(model)
        litellm.register_model({f"openai/sim-{role}": {"input_cost_per_token": price.prompt,
                                                        "output_cost_per_token": price.completion,
                                                        "litellm_provider": "openai", "mode": "chat"}})


def equal_dollars(args, landscape: str, latency: str, seed: int) -> float:
    """What dspy.GEPA spent on the same call (its row in ``--equal-dollars-from``), at the price pair."""
    report = json.loads(Path(args.equal_dollars_from).read_text())
    rows = report["tables"][f"{landscape}/{latency}"]["rows"]
    return next(r["usd"] for r in rows if r["config"] == "dspy.GEPA" and r["seed"] == seed)


def optimizer(config: str, args, reflection_lm: dspy.BaseLM, seed: int, pool=None,
              dollars: float | None = None) -> dspy.Teleprompter:
    swapped = dict(metric=sim.metric, max_metric_calls=args.budget, reflection_lm=reflection_lm,
                   num_threads=args.workers, seed=seed)
    if config == "dspy.GEPA":  # every other argument at dspy.GEPA's default (use_merge=True)
        return dspy.GEPA(**swapped, track_stats=True)
    if config in CLASS_SWAPS:  # the same call, the class name changed (and a setting a user may add)
        settings = dict(CLASS_SWAPS[config])
        if settings.pop("equal_dollars", False):  # what dspy.GEPA spent binds, not the metric calls
            settings.update(max_cost_usd=dollars, max_metric_calls=EQUAL_DOLLARS_CALLS * args.budget)
        if settings.pop("dollar_cap", False):  # the same call, and a cap at what dspy.GEPA spent on it
            settings.update(max_cost_usd=dollars)
        return BatchedGEPA(**{**swapped, **settings})
    common = {**swapped, "use_merge": False}
    if config == "dspy.GEPA 1x1":
        return dspy.GEPA(**common, track_stats=True)
    if config.startswith("dspy.GEPA+PxNSampling"):
        p, n = map(int, config.split()[-1].split("x"))
        return dspy.GEPA(**common, track_stats=True, gepa_kwargs={"sampling_strategy": PxNSampling(p, n)})
    # "async 4x4 merge" ("async auto merge": p="auto", the width following W within the budget), plus optional dials: "m6" (reflection minibatch of 6: each reflection reads
    # twice the feedback, screening costs twice the calls), "cache" (gepa's cache_evaluation: a
    # (candidate, example) pair already scored is not scored again; step loop only), "vK" (at most K
    # validations at once in the async schedule), "bK" (a validation beyond the first waits for K improvers;
    # the defaults: dspy_pxn.engine.width), "x" (gepa's crossover on, use_merge=True as in the defaults) and "ray:K" (rollouts
    # on K local Ray actors, started before the timer: where one driver process cannot feed W).
    schedule, shape, selection, *dials = config.split()
    p, n = ("auto", 1) if shape == "auto" else map(int, shape.split("x"))
    extra: dict = {}
    validations, second_after = DEFAULT_VALIDATIONS
    for dial in dials:
        if dial.startswith("m") and dial[1:].isdigit():
            extra["reflection_minibatch_size"] = int(dial[1:])
        elif dial == "cache":
            extra["gepa_kwargs"] = {"cache_evaluation": True}
        elif dial.startswith("b") and dial[1:].isdigit():
            second_after = int(dial[1:])
        elif dial.startswith("v") and dial[1:].isdigit():
            validations = int(dial[1:])
        elif dial.startswith("ray:") and dial[4:].isdigit():
            extra["pool"] = pool
        elif dial == "x":
            common["use_merge"] = True
        else:
            raise SystemExit(f"unknown dial {dial!r} in config {config!r}: use mK (minibatch K), vK, bK, x, cache or ray:K")
    # Process-wide: compare vK / bK configs with --parallel 1.
    widths.MAX_VALIDATIONS_IN_FLIGHT, widths.SECOND_VALIDATION_MIN_IMPROVERS = validations, second_after
    return BatchedGEPA(**common, p=p, n=n, schedule=schedule, selection=int(selection) if selection.isdigit()
                       else selection, **extra)


@contextmanager
def ray_pool(config: str, workers: int) -> Iterator[object | None]:
    """The config's warm Ray pool ("ray:K": K actors), or None: started here, so not billed to the run."""
    actors = next((int(dial[4:]) for dial in config.split() if dial.startswith("ray:")), None)
    if actors is None:
        yield None
        return
    from dspy_pxn.pools.ray import RayWorkerPool

    pool = RayWorkerPool(max_concurrency=workers, actors=actors)
    try:
        yield pool
    finally:
        pool.close()


@contextmanager
def task_and_reflection_lms(args, landscape: str, latency: str, seed: int
                            ) -> Iterator[tuple[dspy.BaseLM, dspy.BaseLM, Callable[[], dict]]]:
    """In-process simulated LMs, or with ``--server`` dspy.LM clients of a latency server of the
    same landscape and call times: every call then goes over HTTP on loopback (DSPy's default engine). The third
    item reads the bill where the calls were answered: calls and the tokens of the text sent and received."""
    if not args.server:
        task, reflection = lm(args, landscape, latency, seed, "task"), lm(args, landscape, latency, seed, "reflection")
        yield task, reflection, lambda: from_simulated(task, reflection)
        return
    task_s = args.task_latency * args.scale
    with sim.LatencyServer(task_latency=task_s, reflection_latency=args.reflection_ratio * task_s,
                           landscape=landscape_of(args, landscape), latency=latency, seed=seed) as server:
        server.warm_up()  # the engine's one-time start-up is not billed to the run
        server.reset_stats()
        yield server.lm("task"), server.lm("reflection"), lambda: from_server(server.stats())




def run_one(config: str, args, landscape: str, latency: str, seed: int) -> dict:
    train, val, test = sim.make_splits(seed=seed, train=args.train, val=args.val, test=args.test)
    with (task_and_reflection_lms(args, landscape, latency, seed) as (task_lm, reflection_lm, read_bill),
          dspy.context(lm=task_lm), ray_pool(config, args.workers) as pool):
        cap = equal_dollars(args, landscape, latency, seed) if "$" in config else None
        teleprompter = optimizer(config, args, reflection_lm, seed, pool, cap)
        start = time.perf_counter()
        best = teleprompter.compile(sim.seed_program(), trainset=train, valset=val)
        wall = time.perf_counter() - start
        bill = read_bill()
    results = best.detailed_results
    depths = lineage_depths(results.parents)
    # Held-out on an instant LM of the same landscape: the score, not its latency, is measured.
    with dspy.context(lm=sim.SimulatedLM(landscape=landscape_of(args, landscape))):
        test_score = dspy.Evaluate(devset=test, metric=sim.score, num_threads=16, display_progress=False)(best).score / 100
    return {"config": config, "seed": seed, "wall_s": wall, "metric_calls": results.total_metric_calls,
            "candidates": len(results.candidates), "best_val": max(results.val_aggregate_scores), "test": test_score,
            "generations": depths[results.best_idx], "deepest": max(depths), "bill": bill, "usd": dollars(bill),
            "stopped_by": getattr(results, "stopped_by", None)}  # dspy.GEPA's result does not say


def lineage_depths(parents: list[list[int | None]]) -> list[int]:
    """Generations behind each candidate: the longest chain of parents back to the seed (a merge counts its
    deepest parent). Each one costs at least a critical path, so a candidate G deep cannot exist sooner."""
    depths: dict[int, int] = {}

    def depth(i: int) -> int:
        if i not in depths:
            known = [p for p in (parents[i] or []) if p is not None]
            depths[i] = 1 + max(map(depth, known)) if known else 0
        return depths[i]

    return [depth(i) for i in range(len(parents))]


def critical_path_s(config: str, args, latency: str = "fixed") -> float:
    """One generation's unavoidable wait: the parent on its minibatch, the reflection, the child on the
    minibatch, its validation (2·T_e + T_r + the validation's waves on the pool, one where |val| ≤ W),
    plus a merge's reflection where the selection merges. Under
    lognormal call times each wait is its expected value: the slowest of m calls for a screening, the
    slowest of the validation's last wave, a reflection's mean (``dspy_pxn.planning.spread``)."""
    config = as_schedule(config)
    task_s = args.task_latency * args.scale
    reflection_s = args.reflection_ratio * task_s
    sigma = sigma_of(P99_RATIOS.get(latency, 1.0))
    reflection = reflection_s * mean_factor(sigma)
    screening = task_s * slowest_factor(3, sigma)
    validation = batch_seconds(args.val, args.workers, task_s, sigma)
    return 2 * screening + reflection + validation + (reflection if "merge" in config.split() else 0.0)


def limit_floor_s(args, latency: str) -> float:
    """The floor at the mean call time of the latency model: what a saturated pool pays per call."""
    return args.budget * args.task_latency * args.scale * mean_factor(sigma_of(P99_RATIOS.get(latency, 1.0))) \
        / args.workers


def planned_s(config: str, args, latency: str) -> float | None:
    """The planner's wall for a BatchedGEPA config, as ``dspy-pxn plan`` would predict it before the run."""
    words = as_schedule(config).split()
    if words[0] not in ("steps", "async") or latency not in P99_RATIOS:
        return None
    task_s = args.task_latency * args.scale
    minibatch = next((int(w[1:]) for w in words[3:] if w.startswith("m") and w[1:].isdigit()), None)
    wide = minibatch or screening_minibatch(args.train, args.val)  # the default's, above one proposal at a time
    shape = RunShape(workers=args.workers, budget=args.budget, val_size=args.val, minibatch_size=wide)
    p, n = (auto_width(shape), 1) if words[1] == "auto" else map(int, words[1].split("x"))
    if p * n == 1 and minibatch is None:
        shape = RunShape(workers=args.workers, budget=args.budget, val_size=args.val, minibatch_size=3)
    model = RuntimeModel(task_s=task_s, reflection_s=args.reflection_ratio * task_s, acceptance=ASSUMED_ACCEPTANCE,
                         latency_p99_ratio=P99_RATIOS[latency])
    selection = words[2]
    return model.predict(p, n, shape, int(selection) if selection.isdigit() else selection, words[0],
                         rows_reflection_reads(minibatch)).wall_s


def paired(mine: list[dict], theirs: list[dict], key: Callable[[dict], float]) -> tuple[float, float]:
    """Mean and standard error of ``key(mine) - key(theirs)``, paired by seed."""
    by_seed = {r["seed"]: r for r in theirs}
    differences = [key(r) - key(by_seed[r["seed"]]) for r in mine if r["seed"] in by_seed]
    if not differences:
        return float("nan"), float("nan")
    spread = statistics.stdev(differences) / len(differences) ** 0.5 if len(differences) > 1 else 0.0
    return statistics.mean(differences), spread


def bill_ratios(mine: list[dict], theirs: list[dict]) -> dict[str, float]:
    """The bill of ``mine`` over ``theirs`` (ratios of means): reflection calls, reflection tokens in and out,
    task tokens in, and dollars at the price pair."""
    def mean(rows: list[dict], read: Callable[[dict], float]) -> float:
        return statistics.mean(read(r) for r in rows)

    reads = {"reflection_calls": lambda r: r["bill"]["reflection"]["calls"],
             "reflection_in": lambda r: r["bill"]["reflection"]["prompt"],
             "reflection_out": lambda r: r["bill"]["reflection"]["completion"],
             "task_in": lambda r: r["bill"]["task"]["prompt"], "usd": lambda r: r["usd"]}
    return {name: mean(mine, read) / max(mean(theirs, read), 1e-12) for name, read in reads.items()}


def summarise(rows: list[dict], args, latency: str, landscape: str = "") -> list[dict]:
    floor = args.budget * args.task_latency * args.scale / args.workers
    table, baseline, baseline_rows = [], None, None
    if args.equal_dollars_from and "dspy.GEPA" not in args.configs.split(","):  # the dspy.GEPA runs priced there
        earlier = json.loads(Path(args.equal_dollars_from).read_text())["tables"][f"{landscape}/{latency}"]["rows"]
        baseline_rows = [r for r in earlier if r["config"] == "dspy.GEPA"]
        baseline = statistics.mean(r["wall_s"] for r in baseline_rows)
    for config in args.configs.split(","):
        mine = [r for r in rows if r["config"] == config]
        wall = statistics.mean(r["wall_s"] for r in mine)
        if baseline is None and config in ("dspy.GEPA", "dspy.GEPA 1x1"):
            baseline, baseline_rows = wall, mine
        tests = [r["test"] for r in mine]
        generations = statistics.mean(r["generations"] for r in mine)
        # The generations the run reached: its deepest candidate, which the run could not have had sooner.
        reached = [r["deepest"] for r in mine]
        limits = [max(limit_floor_s(args, latency), g * critical_path_s(config, args, latency)) for g in reached]
        table.append({
            "config": config, "wall_s": wall, "x_floor": wall / floor, "speedup": (baseline / wall) if baseline else None,
            "generations": generations, "deepest": statistics.mean(reached), "x_limit": statistics.mean(r["wall_s"] / lim for r, lim in zip(mine, limits)),
            "metric_calls": max(r["metric_calls"] for r in mine), "test_mean": statistics.mean(tests),
            "test_sd": statistics.stdev(tests) if len(tests) > 1 else 0.0, "tests": tests,
            "val_mean": statistics.mean(r["best_val"] for r in mine), "planned_s": planned_s(config, args, latency),
            "reflection_calls": statistics.mean(r["bill"]["reflection"]["calls"] for r in mine),
            "reflection_in": statistics.mean(r["bill"]["reflection"]["prompt"] for r in mine),
            "reflection_out": statistics.mean(r["bill"]["reflection"]["completion"] for r in mine),
            "usd": statistics.mean(r["usd"] for r in mine),
            **({"test_vs_baseline": paired(mine, baseline_rows, lambda r: r["test"]),
                "bill_vs_baseline": bill_ratios(mine, baseline_rows)} if baseline_rows and mine is not baseline_rows
               else {}),
        })
    return table


def regime_parser(doc: str, scale: float) -> argparse.ArgumentParser:
    """The regime's arguments (shared by the benchmarks that run it), with the runs' logs quietened."""
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("dspy", "gepa", "dspy_pxn"):
        logging.getLogger(noisy).setLevel(logging.ERROR)  # every run's per-iteration lines would bury the tables
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--task-latency", type=float, default=0.5, help="T_e in seconds (before --scale)")
    parser.add_argument("--scale", type=float, default=scale, help="multiply every latency (0.25: four times quicker)")
    parser.add_argument("--budget", type=int, default=600)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--train", type=int, default=60)
    parser.add_argument("--val", type=int, default=30)
    parser.add_argument("--test", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--landscapes", default="depth,breadth")
    parser.add_argument("--landscape", action="append", metavar="NAME=JSON",
                        help="define a landscape for --landscapes: its dspy_pxn.testing.Landscape fields as JSON, "
                             "e.g. 'noisy-chain={\"chain\": true, \"capacity\": 12, \"slip_rate\": 0.1}' (repeatable)")
    return parser


def main() -> None:
    parser = regime_parser(__doc__, scale=1.0)
    parser.add_argument("--reflection-ratio", type=float, default=4.0)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed+seeds-1 (add seeds to a run)")
    parser.add_argument("--latencies", default="fixed,lognormal")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS)
    parser.add_argument("--parallel", type=int, default=2,
                        help="runs at once (they mostly sleep; every configuration of one seed runs together)")
    parser.add_argument("--server", action="store_true",
                        help="every LM call through dspy.LM and HTTP to a latency server on loopback "
                             "(one per run) instead of in-process waits; use with --parallel 1")
    parser.add_argument("--equal-dollars-from", help="a results file with dspy.GEPA's rows: the '$' configs' dollars")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "schedules.json"))
    args = parser.parse_args()
    use_bundled_price_maps()  # the prices the dollars are stated at come with DSPy: no network
    price_the_simulated_models()

    report = {"args": vars(args), "price_pair": PRICE_PAIR, "tables": {}}
    for landscape in args.landscapes.split(","):
        for latency in args.latencies.split(","):
            jobs = [(c, s) for s in range(args.first_seed, args.first_seed + args.seeds) for c in args.configs.split(",")]
            with ThreadPoolExecutor(max_workers=args.parallel) as executor:
                rows = list(executor.map(lambda job: run_one(job[0], args, landscape, latency, job[1]), jobs))
            table = summarise(rows, args, latency, landscape)
            report["tables"][f"{landscape}/{latency}"] = {"rows": rows, "table": table}
            print(f"\n### landscape {landscape}, latency {latency} (T_e {args.task_latency * args.scale:g} s, "
                  f"T_r {args.reflection_ratio * args.task_latency * args.scale:g} s, B {args.budget}, W {args.workers}, "
                  f"|val| {args.val}, {args.seeds} seeds)\n")
            print("| config | wall s | x floor | x limit | G best | G reached | speedup | planned s (error) | metric calls / B | "
                  "held-out mean ± sd | best val | per seed |")
            print("|---|---|---|---|---|---|---|---|---|---|---|---|")
            for r in table:
                speedup = f"{r['speedup']:.2f}" if r["speedup"] else "—"
                planned = (f"{r['planned_s']:.1f} ({(r['planned_s'] - r['wall_s']) / r['wall_s']:+.0%})"
                           if r["planned_s"] else "—")
                print(f"| {r['config']} | {r['wall_s']:.1f} | {r['x_floor']:.2f} | {r['x_limit']:.2f} | "
                      f"{r['generations']:.1f} | {r['deepest']:.1f} | {speedup} | {planned} | {r['metric_calls']} / "
                      f"{args.budget} | {r['test_mean']:.3f} ± {r['test_sd']:.3f} | {r['val_mean']:.3f} | "
                      f"{' '.join(f'{t:.2f}' for t in r['tests'])} |", flush=True)
            print(f"\nThe bill, counted where the calls were answered; dollars at {PRICE_PAIR['task']} (task) and "
                  f"{PRICE_PAIR['reflection']} (reflection) list prices; paired by seed with the first dspy.GEPA row\n")
            print("| config | reflection calls | reflection tokens in / out | $ | held-out − dspy.GEPA (se) | "
                  "reflection calls × | reflection in × | $ × |")
            print("|---|---|---|---|---|---|---|---|")
            for r in table:
                against = r.get("test_vs_baseline")
                ratios = r.get("bill_vs_baseline")
                print(f"| {r['config']} | {r['reflection_calls']:.1f} | {r['reflection_in']:.0f} / "
                      f"{r['reflection_out']:.0f} | {r['usd']:.4f} | "
                      + (f"{against[0]:+.3f} ({against[1]:.3f}) | {ratios['reflection_calls']:.2f} | "
                         f"{ratios['reflection_in']:.2f} | {ratios['usd']:.2f} |" if against else "— | — | — | — |"),
                      flush=True)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
