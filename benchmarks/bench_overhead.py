"""Driver overhead: rollouts per second and driver CPU per metric call at zero LM latency.

With a zero-latency LM server (a subprocess on loopback, every call through dspy.LM -> HTTP, on
DSPy's default engine or ``--engine litellm``) nothing waits on a model, so the optimizer's own process is the
bottleneck: its CPU time per metric call is what it costs to hand out and collect one
rollout, and it bounds the workers one driver can feed (W ≈ T_e / CPU per call).
Side by side in one run: dspy.GEPA 1×1 and + gepa's PxNSampling, BatchedGEPA's step loop
and async schedule on threads and on a local Ray pool, at each W.

    python benchmarks/bench_overhead.py                                 # W 16,64, 3 rounds; ~20 min
    python benchmarks/bench_overhead.py --workers 16,64,256 --profile   # + where the driver's time goes
    python benchmarks/bench_overhead.py --workers 64 --configs "BatchedGEPA 16x1,BatchedGEPA 16x1 ray:1,BatchedGEPA 16x1 ray:2,BatchedGEPA 16x1 ray:4"
    python benchmarks/bench_overhead.py --workers 64 --task light --in-process --configs "dspy.GEPA 1x1,BatchedGEPA 1x1"
                                        # per-call overhead alone: a bare Predict on the in-process zero-latency LM

``--task light`` asks the same questions of a bare ``dspy.Predict`` (one output field, no reasoning);
``--in-process`` answers with the simulated LM in this process instead of the server (no engine,
no HTTP), so what is left per call is DSPy's own path and what the optimizer adds to it.
                                                                        # throughput as Ray actors are added

The machine is shared and noisy, so every configuration runs ``--repeats`` times in rounds
(each round runs all configurations of a W once, in an order rotated per round, so drift in
the machine's load falls on all of them alike); the table prints each one's median and its
range over the rounds.

Driver CPU is ``time.process_time()`` of this process (all its threads, Ray's own included;
neither the LM server nor Ray's actor processes). ``--profile`` (needs ``pip install yappi``) reruns
dspy.GEPA + PxNSampling and BatchedGEPA under yappi's CPU clock and prints the driver's
self CPU time by library and dspy_pxn's hottest functions.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Self

import dspy
from gepa.strategies.proposal_sampling import PxNSampling

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.testing import LatencyServer

RESULTS = Path(__file__).parent / "results"


@dataclass
class Row:
    config: str
    workers: int
    wall_s: float
    metric_calls: int
    rollouts_per_s: float
    cpu_ms_per_call: float


class InProcessLMs:
    """Stands in for the latency server: the same answers from ``SimulatedLM`` in this process, at zero latency."""

    def lm(self, kind: str, **kw: object) -> dspy.BaseLM:
        return sim.SimulatedLM()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def make_optimizer(config: str, workers: int, server: LatencyServer | InProcessLMs, args, pool=None) -> dspy.Teleprompter:
    common = dict(metric=sim.metric, max_metric_calls=args.budget, reflection_lm=server.lm("reflection", **engine(args)),
                  num_threads=workers, use_merge=False, seed=0)
    shape = config.split()[1]
    p, n = map(int, shape.split("x"))
    if config.startswith("dspy.GEPA+PxNSampling"):
        return dspy.GEPA(**common, track_stats=True, gepa_kwargs={"sampling_strategy": PxNSampling(p, n)})
    if config.startswith("dspy.GEPA"):
        return dspy.GEPA(**common, track_stats=True)
    schedule = "async" if "async" in config else "steps"
    return BatchedGEPA(**common, p=p, n=n, schedule=schedule, selection="all", tracker=False,
                       pool=pool if ray_actors(config) else None)


def engine(args) -> dict[str, str]:
    """The ``dspy.LM`` keyword for ``--engine``: DSPy's default (native) takes none."""
    return {} if args.engine == "native" else {"engine": args.engine}


def ray_actors(config: str) -> int | None:
    """Actor processes a config's Ray pool has: "ray" is one per CPU, "ray:K" is K; None without Ray."""
    token = next((t for t in config.split() if t.startswith("ray")), None)
    if token is None:
        return None
    return int(token.partition(":")[2] or os.cpu_count() or 1)


def seed_program(task: str) -> dspy.Module:
    """``rules``: the simulated task's chain of thought. ``light``: the same questions asked of a bare
    ``dspy.Predict`` (no reasoning field, a one-number answer), so the LM path is as cheap as DSPy gets
    and what an optimizer adds per call is most of what is measured."""
    if task == "rules":
        return sim.seed_program()
    return dspy.Predict(dspy.Signature("question -> answer", sim.seed_instruction()))


def run_one(config: str, workers: int, server: LatencyServer | InProcessLMs, args, pool=None) -> Row:
    """One compile; with a Ray config, ``pool`` is a RayWorkerPool with that config's actors."""
    train, val, _ = sim.make_splits(seed=0, train=args.train, val=args.val, test=1)
    optimizer = make_optimizer(config, workers, server, args, pool)
    with dspy.context(lm=server.lm("task", **engine(args))):
        cpu, start = time.process_time(), time.perf_counter()
        best = optimizer.compile(seed_program(args.task), trainset=train, valset=val)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    calls = best.detailed_results.total_metric_calls
    return Row(config, workers, wall, calls, calls / wall, 1000 * cpu / calls)


LIBRARIES = ("dspy_pxn", "gepa", "dspy", "litellm", "httpx", "httpcore", "openai", "pydantic", "json_repair",
             "tqdm", "ray")


def library_of(path: str) -> str:
    for name in LIBRARIES:
        if f"/{name}/" in path:
            return name
    return "python stdlib / other"


def cpu_profile(config: str, workers: int, server: LatencyServer | InProcessLMs, args) -> dict[str, object]:
    """Self CPU time by library and dspy_pxn's own hottest functions, over every thread (yappi, CPU clock)."""
    import yappi

    yappi.set_clock_type("cpu")
    yappi.clear_stats()
    yappi.start(builtins=False, profile_threads=True)
    try:
        run_one(config, workers, server, args)
    finally:
        yappi.stop()
    stats = yappi.get_func_stats()
    by_library: collections.Counter[str] = collections.Counter()
    ours: collections.Counter[str] = collections.Counter()
    for stat in stats:
        library = library_of(stat.module)
        by_library[library] += stat.tsub
        if library == "dspy_pxn":
            ours[f"{Path(stat.module).name}:{stat.name}"] += stat.tsub
    total = sum(by_library.values()) or 1.0
    return {"by_library": [(k, v / total) for k, v in by_library.most_common()],
            "dspy_pxn_functions_s": ours.most_common(12), "total_cpu_s": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="16,64", help="W values, comma-separated")
    parser.add_argument("--budget", type=int, default=2000)
    parser.add_argument("--train", type=int, default=60)
    parser.add_argument("--val", type=int, default=30)
    parser.add_argument("--configs", default="dspy.GEPA 1x1,dspy.GEPA+PxNSampling 16x1,BatchedGEPA 1x1,"
                                             "BatchedGEPA 16x1,BatchedGEPA 16x1 async,BatchedGEPA 16x1 ray,"
                                             "BatchedGEPA 16x1 async ray",
                        help='comma-separated; "ray" runs rollouts on one Ray actor per CPU, "ray:K" on K actors')
    parser.add_argument("--task", choices=("rules", "light"), default="rules",
                        help="rules: the simulated task's chain of thought; light: a bare Predict, tiny prompts")
    parser.add_argument("--in-process", action="store_true",
                        help="answer with the in-process simulated LM (no engine, no HTTP) instead of the server")
    parser.add_argument("--engine", choices=("native", "litellm"), default="native",
                        help="the DSPy engine of the server's LMs: native (DSPy's default, lm15) or litellm")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per W (median and range are printed)")
    parser.add_argument("--profile", action="store_true", help="sample the driver's stacks in one run per W")
    parser.add_argument("--out", default=str(RESULTS / "overhead.json"))
    args = parser.parse_args()
    configs = [c.strip() for c in args.configs.split(",")]
    rows: list[Row] = []
    profiles: dict[str, list[tuple[str, float]]] = {}
    if any(ray_actors(c) for c in configs):
        import ray

        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)  # shared by every pool
    with (InProcessLMs() if args.in_process else LatencyServer(task_latency=0.0, reflection_latency=0.0)) as server:
        for workers in (int(w) for w in args.workers.split(",")):
            ray_pools = {}  # one pool per actor count, kept over the rounds (actors start once)
            for actors in dict.fromkeys(filter(None, map(ray_actors, configs))):
                from dspy_pxn.pools.ray import RayWorkerPool

                ray_pools[actors] = RayWorkerPool(max_concurrency=workers, actors=actors)
            try:
                for round_ in range(args.repeats):
                    for config in configs[round_ % len(configs):] + configs[:round_ % len(configs)]:
                        row = run_one(config, workers, server, args, ray_pools.get(ray_actors(config)))
                        rows.append(row)
                        print(f"W {workers:4d} {config:30s} {row.rollouts_per_s:7.1f} rollouts/s "
                              f"{row.cpu_ms_per_call:6.2f} ms CPU/call ({row.metric_calls} calls, {row.wall_s:.1f} s)",
                              flush=True)
                if args.profile:
                    for config in ("dspy.GEPA+PxNSampling 16x1", "BatchedGEPA 16x1", "BatchedGEPA 16x1 async"):
                        profiles[f"W{workers} {config}"] = cpu_profile(config, workers, server, args)
            finally:
                for ray_pool in ray_pools.values():
                    ray_pool.close()

    table = summarise(rows, configs)
    print("\n| W | config | rollouts/s (median, range) | driver CPU ms / metric call (median, range) | "
          "CPU vs dspy.GEPA same shape |")
    print("|---|---|---|---|---|")
    for line in table:
        ratio = f"{line['cpu_vs_upstream']:.2f}x" if line["cpu_vs_upstream"] else ""
        print(f"| {line['workers']} | {line['config']} | {line['rollouts_per_s']:.0f} ({line['rollouts_per_s_min']:.0f}-"
              f"{line['rollouts_per_s_max']:.0f}) | {line['cpu_ms']:.2f} ({line['cpu_ms_min']:.2f}-{line['cpu_ms_max']:.2f}) "
              f"| {ratio} |")
    for name, profile in profiles.items():
        print(f"\nwhere the driver's CPU goes (self time, all threads), {name}: {profile['total_cpu_s']:.1f} s")
        for library, share in profile["by_library"]:
            print(f"  {share:6.1%}  {library}")
        for function, seconds in profile["dspy_pxn_functions_s"]:
            print(f"         {seconds:6.2f} s  dspy_pxn {function}")
    Path(args.out).write_text(json.dumps({"args": vars(args), "table": table, "rows": [asdict(r) for r in rows],
                                          "profiles": profiles}, indent=2))


def summarise(rows: list[Row], configs: list[str]) -> list[dict[str, object]]:
    """Median and range per (W, config) over the rounds; CPU against dspy.GEPA of the same P×N shape."""
    table = []
    for workers in dict.fromkeys(r.workers for r in rows):
        for config in configs:
            mine = [r for r in rows if r.workers == workers and r.config == config]
            rates, cpus = [r.rollouts_per_s for r in mine], [r.cpu_ms_per_call for r in mine]
            table.append({"workers": workers, "config": config, "rounds": len(mine),
                          "rollouts_per_s": statistics.median(rates), "rollouts_per_s_min": min(rates),
                          "rollouts_per_s_max": max(rates), "cpu_ms": statistics.median(cpus),
                          "cpu_ms_min": min(cpus), "cpu_ms_max": max(cpus)})
    for line in table:
        upstream = next((u for u in table if u["workers"] == line["workers"] and str(u["config"]).startswith("dspy.GEPA")
                         and str(u["config"]).split()[1] == str(line["config"]).split()[1]), None)
        line["cpu_vs_upstream"] = line["cpu_ms"] / upstream["cpu_ms"] if upstream else None
    return table


if __name__ == "__main__":
    main()
