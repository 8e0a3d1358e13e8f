"""What the command line prints: durations, the per-step progress line, the run's summary."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Any, TextIO

from dspy_pxn.engine.records import StepRecord
from dspy_pxn.ledger.ledger import answered_from_cache


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes = seconds / 60
    return f"{minutes:.1f} min" if minutes < 120 else f"{minutes / 60:.2f} h"


BAR_WIDTH = 20


def budget_bar(used: int, budget: int) -> str:
    """The budget spent so far as a bar: a run ends when its metric calls do, not after N steps."""
    filled = min(BAR_WIDTH, round(BAR_WIDTH * used / budget)) if budget > 0 else 0
    return "[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]"


def progress_line(record: StepRecord) -> str:
    """One line per step: where the budgets are, and what the step did in a user's words."""
    caps = ""
    if record.cost_usd_left is not None:
        caps += f" | ${record.cost_usd_total or 0.0:.4f} spent, ${record.cost_usd_left:.4f} left"
    if record.wall_s_left is not None:
        caps += f" | {duration(record.wall_s_left)} to the deadline"
    if record.time_left_s is not None:
        caps += f" | ~{duration(record.time_left_s)} left ({record.time_left_budget})"
    return (f"step {record.step:>3} {budget_bar(record.metric_calls_total, record.budget)} "
            f"metric calls {record.metric_calls_total:>5}/{record.budget}{caps} | {record.summary()} | "
            f"{record.wall_s:.1f} s")


class ProgressPrinter:
    """A gepa callback that prints a line per step (every gepa callback may hear the StepRecords)."""

    def __init__(self, out: TextIO):
        self.out = out

    def on_step_record(self, record: StepRecord) -> None:
        print(progress_line(record), file=self.out, flush=True)


@dataclass(frozen=True)
class RunOutcome:
    """What the summary prints: the optimized program, its results, and the seed's held-out score."""

    program: Any
    seed_test: float | None
    program_path: str
    tracking_uri: str | None
    experiment: str | None
    model_uri: str | None = None  # the optimized program as the run's MLflow model
    experiment_id: str | None = None  # the run's experiment, for the run page's address


def score(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def shape_of(results: Any) -> str:
    """The P×N the run had (what ``--p auto`` came to), from its step records."""
    if not results.steps:
        return ""
    first = results.steps[0]
    return f"{first.p}×{first.n} {first.schedule}, "


def summary(outcome: RunOutcome) -> str:
    """Seed vs optimized on val and test, time, calls, cost, instructions, and where everything went."""
    results = outcome.program.detailed_results
    seed_val, best_val = results.val_aggregate_scores[0], results.val_aggregate_scores[results.best_idx]
    usage = results.usage
    cost = (f"${usage.cost_usd:.4f}" if usage.cost_usd is not None
            else "n/a (no price for these models in DSPy's or litellm's map; local models are free)")
    lines = [
        "",
        "== summary ==",
        f"val:  seed {score(seed_val)} -> optimized {score(best_val)}",
        f"test: seed {score(outcome.seed_test)} -> optimized {score(results.test_score)}",
        shape_of(results) + (f"wall-clock {duration(results.wall_s)} (search), {len(results.steps)} steps, "
                             f"{results.total_metric_calls}/{results.budget} metric calls, "
                             f"{len(results.candidates)} candidates, ended by {results.stopped_by}"),
        f"cost {cost}; {usage.lm_calls} LM calls, {usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens",
        *(f"  {role}: {part.lm_calls} LM calls, {part.prompt_tokens} prompt + {part.completion_tokens} completion "
          f"tokens" + (f", ${part.cost_usd:.4f}" if part.cost_usd is not None else "")
          for role, part in (("task", usage.task), ("reflection", usage.reflection)) if part is not None),
        *([f"note: only {usage.lm_calls} LM calls for {results.total_metric_calls} metric calls: most answers came "
           "from DSPy's cache (--cache), so the wall-clock and cost above are not a fresh run's."]
          if answered_from_cache(usage, results.total_metric_calls) else []),
        "optimized instructions:",
    ]
    for name, predictor in outcome.program.named_predictors():
        text = predictor.signature.instructions.strip().replace("\n", "\n    ")
        lines.append(f"  [{name}]\n    {text}")
    if results.best_idx == 0:
        lines.append("  (no proposal beat the seed: the optimized program is the seed program)")
    lines.append(f"saved program: {outcome.program_path} (load with program.load(path))")
    if results.mlflow_run_id:
        lines.append(f"MLflow run {results.mlflow_run_id} in experiment {outcome.experiment!r} at {outcome.tracking_uri}")
        lines.append(f"browse: {browse_hint(outcome.tracking_uri, outcome.experiment_id, results.mlflow_run_id)}")
        if outcome.model_uri:
            lines.append(f"MLflow model {outcome.model_uri} (load with mlflow.dspy.load_model({outcome.model_uri!r}); "
                         f"serve with mlflow models serve -m {outcome.model_uri})")
    elif outcome.tracking_uri:
        lines.append(f"MLflow tracking did not reach {outcome.tracking_uri}; import later with "
                     f"dspy-pxn mlflow-import {os.path.dirname(outcome.program_path)}")
    return "\n".join(lines)


MLFLOW_UI = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default


def browse_hint(tracking_uri: str, experiment_id: str | None, run_id: str) -> str:
    """How to open the run, for its kind of tracking URI.

    A tracking server already serves its UI: the hint is the run page's address there (``mlflow ui
    --backend-store-uri http://...`` fails: a server is not a store). A local store (sqlite, a directory, a
    database) needs ``mlflow ui`` to serve it: the hint is that command, a relative sqlite path made absolute so it
    works from any directory, then the run page's address on ``mlflow ui``'s default port. Databricks is its
    workspace's UI."""
    page = f"#/experiments/{experiment_id}/runs/{run_id}" if experiment_id else ""
    if tracking_uri.startswith(("http://", "https://")):
        return f"open {tracking_uri.rstrip('/')}/{page}"
    if tracking_uri.startswith("databricks"):
        return "open the run in your Databricks workspace (Experiments)"
    store = tracking_uri
    if store.startswith("sqlite:///") and not store.startswith("sqlite:////"):
        store = "sqlite:///" + os.path.abspath(store.removeprefix("sqlite:///"))
    return f"mlflow ui --backend-store-uri {shlex.quote(store)}, then open {MLFLOW_UI}/{page}"
