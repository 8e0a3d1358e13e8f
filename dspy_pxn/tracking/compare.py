"""Runs side by side, as the paper compares them: score against metric calls, wall-clock and dollars.

``compare_experiment`` reads the runs of an MLflow experiment through the MLflow API
(so it works on runs logged live, imported later, or by another machine), draws one
line per run in up to three PNGs (a figure no run has data for is left out, and the table says
why) and writes a markdown table with the speed-up over the 1×1 run of the same setup.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

from dspy_pxn.tracking.plots import DPI, FIGSIZE, pyplot

PLOTS = {
    "metric_calls": ("val_vs_metric_calls.png", "metric calls"),
    "elapsed_s": ("val_vs_wall_clock.png", "wall-clock (s)"),
    "cost_usd": ("val_vs_dollars.png", "LM cost ($)"),
}
TABLE_NAME = "comparison.md"
# What two runs must share for their wall-clocks and scores to compare: the budget, the data,
# the models and the worker pool. P, N, selection and the other dials are what a comparison varies.
SETUP_PARAMS = ("budget", "trainset_size", "valset_size", "testset_size", "dataset", "program", "task_lm",
                "reflection_lm", "num_workers")


@dataclass(frozen=True)
class CurvePoint:
    """The run after one step (step 0: the seed program's validation)."""

    step: int
    metric_calls: float
    elapsed_s: float
    cost_usd: float | None
    best_val: float


@dataclass(frozen=True)
class RunResult:
    """One run as MLflow holds it: its configuration, final numbers and best-val curve."""

    run_id: str
    name: str
    config: str
    p: int | None
    n: int | None
    status: str
    iterations: int | None
    validation_trigger_fraction: float | None
    wall_s: float | None
    best_val: float | None
    test_score: float | None
    cost_usd: float | None
    metric_calls: int | None
    curve: tuple[CurvePoint, ...]
    setup: tuple[tuple[str, str], ...] = ()  # SETUP_PARAMS as logged; runs compare only within one setup
    model_uri: str | None = None  # the optimized program, logged as the run's MLflow model

    @property
    def val_test_gap(self) -> float | None:
        if self.best_val is None or self.test_score is None:
            return None
        return self.best_val - self.test_score


@dataclass(frozen=True)
class Comparison:
    runs: tuple[RunResult, ...]
    plots: tuple[str, ...]  # the figures drawn: a figure no run has data for is left out
    table_path: str
    table: str  # the markdown table, then one line per figure left out saying why
    left_out: tuple[str, ...] = ()  # those lines


# ----------------------------------------------------------------------------- reading MLflow
# Where each number is, and where runs logged by versions before the run page's sections kept it.
CURVE_METRICS = {"best_val": ("search/best_val", "best_val"),
                 "metric_calls": ("search/metric_calls_total", "metric_calls_total"),
                 "elapsed_s": ("time/elapsed_s", "elapsed_s"), "cost_usd": ("cost/cost_usd_total", "cost_usd_total")}
SUMMARY_METRICS = {"iterations": ("totals/iterations", "iterations"),
                   "validation_trigger_fraction": ("totals/validation_trigger_fraction", "validation_trigger_fraction"),
                   "wall_s": ("totals/wall_s", "total_wall_s"), "test_score": ("totals/test_score", "test_score"),
                   "cost_usd": ("totals/cost_usd", "total_cost_usd"),
                   "metric_calls": ("totals/metric_calls", "total_metric_calls")}


def _logged_name(run, names: tuple[str, ...]) -> str:
    """The first of a metric's names the run has (today's, else an older version's)."""
    return next((name for name in names if name in run.data.metrics), names[0])


def _history(client, run, names: tuple[str, ...]) -> dict[int, float]:
    """A metric's values by step, under the first of its names the run has."""
    return {m.step: m.value for m in client.get_metric_history(run.info.run_id, _logged_name(run, names))}


def _number(value: str | None, cast: type = int):
    try:
        return cast(float(value)) if value is not None else None
    except ValueError:
        return None


def load_runs(experiment: str, tracking_uri: str | None = None, parent_run_id: str | None = None) -> list[RunResult]:
    """The dspy-pxn runs (not sweep parents) of ``experiment``, oldest first."""
    from mlflow import MlflowClient

    from dspy_pxn.tracking.config import default_tracking_uri
    from dspy_pxn.tracking.mlflow_io import CONFIG_TAG, KIND_TAG, MODEL_TAG, PARENT_TAG

    uri = tracking_uri or default_tracking_uri()
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        names = sorted(e.name for e in client.search_experiments())
        raise ValueError(f"experiment={experiment!r} does not exist at {uri}; its experiments are {names}. "
                         "Pass the experiment name the runs were logged to, and tracking_uri=... if not the default.")
    query = f"tags.`{KIND_TAG}` = 'run'"
    if parent_run_id:
        query += f" and tags.`{PARENT_TAG}` = '{parent_run_id}'"
    runs = []
    order = ["attributes.start_time ASC"]
    for run in client.search_runs([found.experiment_id], query, order_by=order, max_results=5000):
        params = run.data.params
        metrics = {key: run.data.metrics.get(_logged_name(run, names)) for key, names in SUMMARY_METRICS.items()}
        histories = {key: _history(client, run, names) for key, names in CURVE_METRICS.items()}
        curve = tuple(
            CurvePoint(
                step=step,
                metric_calls=histories["metric_calls"].get(step, float("nan")),
                elapsed_s=histories["elapsed_s"].get(step, float("nan")),
                cost_usd=histories["cost_usd"].get(step),
                best_val=value,
            )
            for step, value in sorted(histories["best_val"].items())
        )
        runs.append(
            RunResult(
                run_id=run.info.run_id,
                name=run.info.run_name or run.info.run_id[:8],
                config=run.data.tags.get(CONFIG_TAG) or f"{params.get('p', '?')}x{params.get('n', '?')}",
                p=_number(params.get("p")),
                n=_number(params.get("n")),
                status=run.info.status,
                iterations=_number(metrics.get("iterations")),
                validation_trigger_fraction=metrics.get("validation_trigger_fraction"),
                wall_s=metrics["wall_s"],
                best_val=curve[-1].best_val if curve else None,
                test_score=metrics["test_score"],
                cost_usd=metrics["cost_usd"],
                metric_calls=_number(metrics["metric_calls"]),
                curve=curve,
                setup=tuple((key, params[key]) for key in SETUP_PARAMS if key in params),
                model_uri=run.data.tags.get(MODEL_TAG),
            )
        )
    return runs


# ----------------------------------------------------------------------------- figures and table
def _labels(runs: Sequence[RunResult]) -> list[str]:
    """Run names, made unique with a short run id where two runs share one."""
    names = [run.name for run in runs]
    return [
        name if names.count(name) == 1 else f"{name} ({run.run_id[:6]})"
        for name, run in zip(names, runs, strict=True)
    ]


def plot_comparison(runs: Sequence[RunResult], out_dir: str) -> tuple[list[str], list[str]]:
    """Best validation score against metric calls, wall-clock and dollars; one line per run.

    Returns the figures drawn and, for each figure left out because no run has data for its axis (dollars, when
    no LM price is known), one line saying why: an empty frame says nothing, and a missing file without a reason
    looks like a bug."""
    plt = pyplot()
    os.makedirs(out_dir, exist_ok=True)
    paths, left_out = [], []
    labels = _labels(runs)
    for axis, (file_name, axis_label) in PLOTS.items():
        curves = []
        for run, label in zip(runs, labels, strict=True):
            points = [(getattr(pt, axis), pt.best_val) for pt in run.curve if getattr(pt, axis) is not None]
            points = [(x, y) for x, y in points if not math.isnan(x)]  # a metric the run did not log
            if points:
                curves.append((label, points))
        if not curves:
            left_out.append(f"No {file_name}: " + (
                "no LM price is known for these runs' models (local and unknown models are unpriced), so no run "
                "logged dollars." if axis == "cost_usd" else f"no run logged its {axis_label}."))
            continue
        fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
        for label, points in curves:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, drawstyle="steps-post", marker="o", markersize=3, label=label)
        ax.legend(fontsize="small", loc="lower right")
        ax.set_xlabel(axis_label)
        ax.set_ylabel("best validation score")
        ax.set_title(f"Best validation score vs {axis_label}")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = os.path.join(out_dir, file_name)
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths, left_out


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def setups(runs: Sequence[RunResult]) -> list[tuple[tuple[str, str], ...]]:
    """The distinct setups among the runs, in order of first appearance."""
    seen: list[tuple[tuple[str, str], ...]] = []
    for run in runs:
        if run.setup not in seen:
            seen.append(run.setup)
    return seen


def setup_differences(all_setups: Sequence[tuple[tuple[str, str], ...]]) -> list[str]:
    """The setup parameters whose values are not the same in every setup."""
    keys = {key for setup in all_setups for key, _ in setup}
    return sorted(key for key in keys if len({dict(setup).get(key) for setup in all_setups}) > 1)


def comparison_table(runs: Sequence[RunResult]) -> str:
    """Markdown: config, iterations, validation-trigger fraction, wall, speed-up vs 1×1, scores.

    Only like is compared with like: a run's speed-up is over the 1×1 run of the same setup
    (budget, data sizes, models, workers). When the runs span several setups, a column names
    each run's setup and the lines below the table say what differs between them.
    """
    all_setups = setups(runs)
    names = {setup: chr(ord("A") + index) for index, setup in enumerate(all_setups)}
    baselines = {
        setup: next((run for run in runs if run.setup == setup and run.p == 1 and run.n == 1 and run.wall_s), None)
        for setup in all_setups
    }
    several = len(all_setups) > 1
    header = (
        "| config | run |" + (" setup |" if several else "") + " iterations | validation-trigger fraction | wall s "
        "| speedup vs 1x1 | metric calls | cost $ | best val | test | val-test gap |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for run, label in zip(runs, _labels(runs), strict=True):
        baseline = baselines[run.setup]
        speedup = baseline.wall_s / run.wall_s if baseline is not None and run.wall_s else None
        lines.append(
            f"| {run.config} | {label} |" + (f" {names[run.setup]} |" if several else "")
            + f" {_fmt(run.iterations)} | {_fmt(run.validation_trigger_fraction, 2)} "
            f"| {_fmt(run.wall_s, 1)} | {_fmt(speedup, 2)} | {_fmt(run.metric_calls)} | {_fmt(run.cost_usd, 4)} "
            f"| {_fmt(run.best_val)} | {_fmt(run.test_score)} | {_fmt(run.val_test_gap)} |"
        )
    if several:
        differing = setup_differences(all_setups)
        lines.append("")
        lines.append(f"These runs do not share one setup: they differ in {', '.join(differing)}. Speed-ups are "
                     "computed only against the 1x1 run of the same setup; compare scores across setups with care.")
        for setup in all_setups:
            values = dict(setup)
            lines.append(f"- setup {names[setup]}: " + ", ".join(f"{key}={values.get(key, '?')}" for key in differing))
    best = best_run(runs)
    if best is not None:
        lines.append("")
        lines.append(f"Best run by validation score: {best.name} ({best.config}, val {_fmt(best.best_val)}"
                     + (f", test {_fmt(best.test_score)}" if best.test_score is not None else "")
                     + (f"); its program: `mlflow.dspy.load_model(\"{best.model_uri}\")`." if best.model_uri
                        else "); it logged no model."))
    missing = [names[setup] for setup, baseline in baselines.items() if baseline is None]
    if missing:
        lines.append("")
        lines.append("No finished 1x1 run " + (f"in setup {', '.join(missing)}" if several else "among these runs")
                     + ": speed-up is not computed there.")
    return "\n".join(lines) + "\n"


def best_run(runs: Sequence[RunResult]) -> RunResult | None:
    """The finished run with the best validation score (the earliest of equals), if any has one."""
    scored = [run for run in runs if run.best_val is not None and run.status == "FINISHED"]
    return max(scored, key=lambda run: run.best_val, default=None)


def compare_runs(runs: Sequence[RunResult], out_dir: str) -> Comparison:
    plots, left_out = plot_comparison(runs, out_dir)
    for stale in {name for name, _ in PLOTS.values()} - {os.path.basename(path) for path in plots}:
        with contextlib.suppress(FileNotFoundError):  # an earlier comparison's figure in the same directory
            os.remove(os.path.join(out_dir, stale))
    table = comparison_table(runs) + "".join(f"\n{line}\n" for line in left_out)
    table_path = os.path.join(out_dir, TABLE_NAME)
    with open(table_path, "w") as handle:
        handle.write(table)
    return Comparison(runs=tuple(runs), plots=tuple(plots), table_path=table_path, table=table,
                      left_out=tuple(left_out))


def compare_experiment(
    experiment: str, out_dir: str, tracking_uri: str | None = None, *, parent_run_id: str | None = None
) -> Comparison:
    """Read the experiment's runs through MLflow and write the PNGs and ``comparison.md`` to ``out_dir``.

    ``parent_run_id`` narrows the comparison to the children of one sweep.
    """
    runs = load_runs(experiment, tracking_uri, parent_run_id=parent_run_id)
    if not runs:
        raise ValueError(
            f"experiment={experiment!r} has no dspy-pxn runs to compare; log some with "
            "BatchedGEPA(..., tracker=MlflowTracker(experiment=...)) or dspy_pxn.tracking.import_step_log(log_dir)."
        )
    return compare_runs(runs, out_dir)
