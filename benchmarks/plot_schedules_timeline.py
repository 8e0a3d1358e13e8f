"""Draw every LM call of a step-loop run and of an async run, thread by thread (docs/assets/schedules_timeline.png).

Both runs are real: BatchedGEPA 4×4 against the simulated model on loopback, every call through
dspy.LM and HTTP, task calls of 0.2 s and reflections of 0.8 s, W = 16, 300 metric calls.
A DSPy callback records when each LM call starts and ends and in which thread; dashed lines mark
where each StepRecord (a step, or an async window) ends.

    python benchmarks/plot_schedules_timeline.py [--out docs/assets/schedules_timeline.png]
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import dspy
from dspy.utils.callback import BaseCallback

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim

ROOT = Path(__file__).resolve().parents[1]


class CallTimes(BaseCallback):
    """(thread, kind, start, end) for every LM call made in its context."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float, float]] = []
        self._open: dict[str, tuple[str, str, float]] = {}
        self._lock = threading.Lock()

    def on_lm_start(self, call_id, instance, inputs):
        kind = "reflection" if "reflection" in str(getattr(instance, "model", "")) else "task"
        with self._lock:
            self._open[call_id] = (threading.current_thread().name, kind, time.time())

    def on_lm_end(self, call_id, outputs, exception=None):
        with self._lock:
            thread, kind, start = self._open.pop(call_id)
            self.calls.append((thread, kind, start, time.time()))


def run(schedule: str, server: sim.LatencyServer, args) -> tuple[CallTimes, list, float]:
    train, val, _ = sim.make_splits(seed=0, train=60, val=20, test=1)
    times = CallTimes()
    optimizer = BatchedGEPA(metric=sim.metric, p=4, n=4, max_metric_calls=args.budget, num_threads=16,
                            schedule=schedule, selection="merge", reflection_lm=server.lm("reflection"))
    started = time.time()
    with dspy.context(lm=server.lm("task"), callbacks=[times]):
        result = optimizer.compile(sim.seed_program(), trainset=train, valset=val).detailed_results
    return times, list(result.steps), started


def draw(runs: dict[str, tuple[CallTimes, list, float]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = max(max(c[3] for c in times.calls) - started for times, _, started in runs.values())
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 7.5), sharex=True)
    colours = {"task": "#4c72b0", "reflection": "#dd8452"}
    for ax, (title, (times, steps, started)) in zip(axes, runs.items(), strict=True):
        threads = sorted({c[0] for c in times.calls}, key=lambda name: (("proposal" in name), name))
        rows = {name: i for i, name in enumerate(threads)}
        for thread, kind, start, stop in times.calls:
            ax.barh(rows[thread], stop - start, left=start - started, height=0.8, color=colours[kind], linewidth=0)
        for step in steps:
            ax.axvline(step.started_at + step.wall_s - started, color="grey", linestyle="--", linewidth=0.8)
        pool = sum(1 for name in threads if "proposal" not in name)
        ax.set_yticks([])
        ax.set_ylabel(f"{pool} pool threads" + (f" + {len(threads) - pool} pipelines" if len(threads) > pool else ""))
        wall = steps[-1].started_at + steps[-1].wall_s - started if steps else end
        ax.set_title(f"{title}: {len(steps)} records, search ends at {wall:.1f} s", fontsize=10, loc="left")
        ax.set_xlim(0, end)
    axes[-1].set_xlabel("seconds since the compile started")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    fig.legend(handles, ["task call (a rollout)", "reflection call"], loc="upper right", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=int, default=300)
    parser.add_argument("--out", default=str(ROOT / "docs" / "assets" / "schedules_timeline.png"))
    args = parser.parse_args()
    runs = {}
    for schedule, title in (("steps", 'schedule="steps"'), ("async", 'schedule="async"')):
        with sim.LatencyServer(task_latency=0.2, reflection_latency=0.8) as server:
            server.warm_up()  # the engine's one-time set-up is not part of either run
            runs[title] = run(schedule, server, args)
    draw(runs, Path(args.out))


if __name__ == "__main__":
    main()
