"""How dspy-pxn talks to MLflow: explicit run ids, a reachability probe, one writer thread.

Every call names its run (``MlflowClient``, never the fluent ``mlflow.log_*`` whose
active run is thread-local), so calls made from any thread land in the right run and
nesting never depends on which thread is asking. ``tracking`` decides *what* to log and
*when*; this module only knows *how*.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from typing import TYPE_CHECKING

from dspy_pxn.engine.records import STEP_LOG_NAME, StepRecord
from dspy_pxn.tracking import runlog
from dspy_pxn.tracking.model import ModelSource, log_program, register_model
from dspy_pxn.tracking.runlog import FAILURES, Baseline, RunManifest

if TYPE_CHECKING:
    from mlflow import MlflowClient

PROBE_TIMEOUT_S = 2.0
KIND_TAG, CONFIG_TAG, SWEEP_TAG = "dspy_pxn.kind", "dspy_pxn.config", "dspy_pxn.sweep"
IMPORTED_TAG = "dspy_pxn.imported_from"
PARENT_TAG = "mlflow.parentRunId"  # how MLflow nests a run under another
MODEL_TAG = "dspy_pxn.model_uri"  # the run's optimized program, as an MLflow model URI (a sweep's: its best run's)
BEST_RUN_TAG = "dspy_pxn.best_run_id"  # on a sweep's run: the child with the best validation score
STOPPED_BY_TAG = "dspy_pxn.stopped_by"  # the budget that ended the search (BatchedGEPAResult.stopped_by)

# The run page groups metrics by the prefix before "/": each StepRecord field goes to the section a
# user looks in. Fields not named here identify the step or are constants (params), not step metrics.
METRIC_SECTIONS = {
    "search": ("best_val", "mean_val", "pareto_front_size", "width", "distinct_parents", "proposals", "improved",
               "accepted", "full_validation", "sibling_merged", "reflection_failures", "metric_calls",
               "metric_calls_total"),
    "cost": ("lm_calls", "prompt_tokens", "completion_tokens", "cost_usd", "cost_usd_total", "lm_retries",
             "lm_failures", "task_lm_calls", "task_prompt_tokens", "task_completion_tokens", "task_cost_usd",
             "reflection_lm_calls", "reflection_prompt_tokens", "reflection_completion_tokens",
             "reflection_cost_usd"),
    "time": ("wall_s", "reflection_s", "screening_s", "validation_s", "sibling_merge_s"),
    "pool": ("worker_utilisation", "rollouts", "rollout_failures"),
    # What is left of max_cost_usd and max_wall_s (when given), and the time until the first budget binds.
    "budget": ("cost_usd_left", "wall_s_left", "time_left_s"),
}
SECTION_OF = {name: section for section, names in METRIC_SECTIONS.items() for name in names}
# The two charts a user opens the run for: the best validation score by metric calls spent (step = metric
# calls) and by wall-clock (step = milliseconds since the start). MLflow's run page sorts its sections by
# name, so "best_val" comes first (then budget, cost, pool, search, time, totals; unprefixed "Model metrics" last).
BEST_BY_CALLS, BEST_BY_WALL_CLOCK = "best_val/by_metric_calls", "best_val/by_wall_clock_ms"
ELAPSED = "time/elapsed_s"
# Files of a log directory that are uploaded as artifacts (gepa's pickled state is not).
ARTIFACT_FILES = (
    runlog.MANIFEST_NAME, STEP_LOG_NAME, "proposals.jsonl", runlog.PROGRAM_NAME,
    runlog.PROPOSALS_TABLE, runlog.CANDIDATES_TABLE,
)
# The same tables as MLflow tables (the run's "Artifacts" tab shows them as tables, searchable).
MLFLOW_TABLES = {runlog.PROPOSALS_TABLE: "tables/proposals.json", runlog.CANDIDATES_TABLE: "tables/candidates.json"}


def metric_key(field_name: str) -> str:
    """A StepRecord field's MLflow metric name: ``<section>/<field>``."""
    return f"{SECTION_OF[field_name]}/{field_name}"


def probe(tracking_uri: str) -> str | None:
    """Why an HTTP tracking server cannot be reached right now (None: reachable, or not HTTP).

    MLflow's own client retries a refused connection for minutes; one short request
    tells a dead server apart at once. Any HTTP answer, even an error, means "up".
    """
    if not tracking_uri.startswith(("http://", "https://")):
        return None
    import requests

    try:
        requests.get(tracking_uri.rstrip("/") + "/health", timeout=PROBE_TIMEOUT_S)
    except requests.RequestException as error:
        return f"{type(error).__name__}: {error}"
    return None


class MlflowMirror:
    """The MLflow calls of dspy-pxn, all by explicit run id."""

    def __init__(self, tracking_uri: str):
        from mlflow import MlflowClient

        self.tracking_uri = tracking_uri
        self.client: MlflowClient = MlflowClient(tracking_uri)

    def experiment_id(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except Exception:  # created meanwhile by another process
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def run_exists(self, run_id: str | None) -> bool:
        if not run_id:
            return False
        try:
            self.client.get_run(run_id)
        except Exception:  # noqa: BLE001 - MlflowException(RESOURCE_DOES_NOT_EXIST) and friends
            return False
        return True

    def reopen(self, run_id: str) -> None:
        """Mark a run that a killed process left RUNNING (or FAILED) as running again."""
        self.client.update_run(run_id, status="RUNNING")

    def create_run(self, manifest: RunManifest, parent_run_id: str | None, extra_tags: Mapping[str, str] = ()) -> str:
        tags = {**manifest.tags, KIND_TAG: manifest.kind, **dict(extra_tags)}
        if parent_run_id:
            tags[PARENT_TAG] = parent_run_id
        run = self.client.create_run(
            self.experiment_id(manifest.experiment),
            start_time=int(manifest.started_at * 1000),
            tags=tags,
            run_name=manifest.run_name,
        )
        return run.info.run_id

    def log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        """Log the params the run does not have yet (MLflow params are write-once)."""
        from mlflow.entities import Param

        have = self.client.get_run(run_id).data.params
        missing = [Param(key, str(value)) for key, value in params.items() if key not in have]
        for start in range(0, len(missing), 100):
            self.client.log_batch(run_id, params=missing[start : start + 100])

    def log_metrics(
        self, run_id: str, metrics: Mapping[str, float], step: int = 0, timestamp_s: float | None = None
    ) -> None:
        self.log_points(run_id, [(key, value, step) for key, value in metrics.items()], timestamp_s)

    def log_points(self, run_id: str, points: list[tuple[str, float, int]],
                   timestamp_s: float | None = None) -> None:
        """Metrics that each have their own step (the first charts' x axes are not the step number)."""
        from mlflow.entities import Metric

        stamp = int((timestamp_s or time.time()) * 1000)
        self.client.log_batch(run_id, metrics=[Metric(key, value, stamp, step) for key, value, step in points])

    def log_step(self, run_id: str, record: StepRecord, run_started_at: float, failing: set[str]) -> None:
        """One StepRecord: its sections' metrics at its step, and the best score by calls and by wall-clock.
        ``failing``: the failure series started by the run's earlier steps (this step's are added)."""
        ended = record.started_at + record.wall_s
        self.log_metrics(run_id, step_metrics(record, run_started_at, failing), step=record.step, timestamp_s=ended)
        self.log_points(run_id, best_val_points(record.best_val, record.metric_calls_total, ended - run_started_at),
                        timestamp_s=ended)

    def log_baseline(self, run_id: str, baseline: Baseline, run_started_at: float) -> None:
        """The seed program's validation: step 0 of every curve."""
        stamp = run_started_at + baseline.elapsed_s
        self.log_metrics(run_id, baseline_metrics(baseline), step=0, timestamp_s=stamp)
        self.log_points(run_id, best_val_points(baseline.val_score, baseline.metric_calls, baseline.elapsed_s),
                        timestamp_s=stamp)

    def logged_steps(self, run_id: str) -> set[int]:
        return {m.step for m in self.client.get_metric_history(run_id, metric_key("metric_calls_total"))}

    def upload(self, run_id: str, log_dir: str) -> None:
        for name in ARTIFACT_FILES:
            path = os.path.join(log_dir, name)
            if os.path.exists(path):
                self.client.log_artifact(run_id, path)
        for name, artifact_file in MLFLOW_TABLES.items():
            path = os.path.join(log_dir, name)
            if os.path.exists(path):
                self.client.log_table(run_id, runlog.read_table(path), artifact_file)
        plots = os.path.join(log_dir, runlog.PLOTS_DIR)
        if os.path.isdir(plots) and os.listdir(plots):
            self.client.log_artifacts(run_id, plots, runlog.PLOTS_DIR)

    def log_program(self, run_id: str, source: ModelSource, on_failure: Callable[[str], None]) -> None:
        """The optimized program as the run's model, with its prompts.

        A model MLflow refuses, or a registered model name the registry refuses, is ``on_failure``'s
        to report: the run's other records go on, so this never raises for it.
        """
        try:
            logged = log_program(self.client, run_id, source, source.metrics.get("val_score"))
        except Exception as error:  # noqa: BLE001 - a refused model is not a lost run
            on_failure(f"{type(error).__name__}: {error}")
            return
        self.client.set_tag(run_id, MODEL_TAG, logged.model_uri)
        name = source.options.registered_model_name
        if name:
            try:
                register_model(self.client, name, logged.model_uri, run_id)
            except Exception as error:  # noqa: BLE001 - the model is logged; only its registry entry is missing
                on_failure(f"it is logged as {logged.model_uri}, but the Model Registry refused it as {name!r} "
                           f"({type(error).__name__}: {error}); register it with "
                           f"mlflow.register_model({logged.model_uri!r}, {name!r})")

    def end(self, run_id: str, status: str, end_time_s: float | None = None) -> None:
        self.client.set_terminated(run_id, status, end_time=int((end_time_s or time.time()) * 1000))


def step_metrics(record: StepRecord, run_started_at: float, failing: set[str]) -> dict[str, float]:
    """The step's measurements by section (booleans as 0/1), and seconds since the run started.

    A crossover step (gepa's ``use_merge``) is marked by ``search/crossover`` = 1; other steps log
    nothing for it, so a run without crossover has no chart of zeros. Likewise a failure series
    (``FAILURES``) is logged from the first step where something of its kind failed: ``failing``
    holds the series the run's earlier steps started, and gains this step's.
    """
    failing |= failure_series([record])
    metrics = {metric_key(f.name): float(value) for f in fields(record)
               if f.name in SECTION_OF and isinstance(value := getattr(record, f.name), (int, float))
               and (f.name not in FAILURES or metric_key(f.name) in failing)}
    if record.kind == "crossover":
        metrics["search/crossover"] = 1.0
    metrics[ELAPSED] = record.started_at + record.wall_s - run_started_at
    return metrics


def failure_series(records: Iterable[StepRecord]) -> set[str]:
    """The failure series (metric keys) that records start: those of the kinds of failure they had."""
    return {metric_key(name) for record in records for name in FAILURES if getattr(record, name)}


def baseline_metrics(baseline: Baseline) -> dict[str, float]:
    metrics = {
        metric_key("best_val"): baseline.val_score,
        metric_key("mean_val"): baseline.val_score,
        metric_key("metric_calls_total"): float(baseline.metric_calls),
        ELAPSED: baseline.elapsed_s,
        metric_key("pareto_front_size"): 1.0,
    }
    if baseline.cost_usd is not None:
        metrics[metric_key("cost_usd_total")] = baseline.cost_usd
    return metrics


def best_val_points(best_val: float, metric_calls: int, elapsed_s: float) -> list[tuple[str, float, int]]:
    """The two first charts' points for one moment of the run: (metric, value, step)."""
    return [(BEST_BY_CALLS, best_val, int(metric_calls)),
            (BEST_BY_WALL_CLOCK, best_val, round(elapsed_s * 1000))]


class BackgroundWriter:
    """Runs MLflow calls in order on one daemon thread; the first failure ends tracking for the run."""

    def __init__(self, tracking_uri: str, on_failure: Callable[[str], None]):
        self.tracking_uri = tracking_uri
        self.on_failure = on_failure
        self.failed = False
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="dspy-pxn-mlflow", daemon=True)
        self._thread.start()

    def submit(self, call: Callable[[], None]) -> None:
        if not self.failed:
            self._queue.put(call)

    def close(self, timeout_s: float) -> bool:
        """Stop after the queued calls; False if they did not finish within ``timeout_s``."""
        self._queue.put(None)
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while (call := self._queue.get()) is not None:
            if self.failed:
                continue
            reason = probe(self.tracking_uri)
            if reason is None:
                try:
                    call()
                    continue
                except Exception as error:  # noqa: BLE001 - tracking must never stop the run
                    reason = f"{type(error).__name__}: {error}"
            self.failed = True
            self.on_failure(reason)
