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
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import TYPE_CHECKING

from dspy_pxn.records import STEP_LOG_NAME, StepRecord
from dspy_pxn.tracking import runlog
from dspy_pxn.tracking.runlog import Baseline, RunManifest

if TYPE_CHECKING:
    from mlflow import MlflowClient

PROBE_TIMEOUT_S = 2.0
KIND_TAG, CONFIG_TAG, SWEEP_TAG = "dspy_pxn.kind", "dspy_pxn.config", "dspy_pxn.sweep"
IMPORTED_TAG = "dspy_pxn.imported_from"
PARENT_TAG = "mlflow.parentRunId"  # how MLflow nests a run under another

# StepRecord fields that identify the step or the run rather than measure the step.
NOT_STEP_METRICS = {
    "step", "kind", "budget", "num_workers", "new_candidates", "started_at", "minibatch_size", "val_size",
}
# Files of a log directory that are uploaded as artifacts (gepa's pickled state is not).
ARTIFACT_FILES = (
    runlog.MANIFEST_NAME, STEP_LOG_NAME, "proposals.jsonl", runlog.PROGRAM_NAME,
    runlog.PROPOSALS_TABLE, runlog.CANDIDATES_TABLE,
)


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
        from mlflow.entities import Metric

        stamp = int((timestamp_s or time.time()) * 1000)
        self.client.log_batch(run_id, metrics=[Metric(key, value, stamp, step) for key, value in metrics.items()])

    def logged_steps(self, run_id: str) -> set[int]:
        return {m.step for m in self.client.get_metric_history(run_id, "metric_calls_total")}

    def upload(self, run_id: str, log_dir: str) -> None:
        for name in ARTIFACT_FILES:
            path = os.path.join(log_dir, name)
            if os.path.exists(path):
                self.client.log_artifact(run_id, path)
        plots = os.path.join(log_dir, runlog.PLOTS_DIR)
        if os.path.isdir(plots) and os.listdir(plots):
            self.client.log_artifacts(run_id, plots, runlog.PLOTS_DIR)

    def end(self, run_id: str, status: str, end_time_s: float | None = None) -> None:
        self.client.set_terminated(run_id, status, end_time=int((end_time_s or time.time()) * 1000))


def step_metrics(record: StepRecord, run_started_at: float) -> dict[str, float]:
    """Every numeric field of the step (booleans as 0/1), plus seconds since the run started."""
    metrics: dict[str, float] = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if f.name in NOT_STEP_METRICS or value is None or not isinstance(value, (int, float)):
            continue
        metrics[f.name] = float(value)
    metrics["crossover"] = float(record.kind == "crossover")
    metrics["elapsed_s"] = record.started_at + record.wall_s - run_started_at
    return metrics


def baseline_metrics(baseline: Baseline) -> dict[str, float]:
    metrics = {
        "best_val": baseline.val_score,
        "mean_val": baseline.val_score,
        "metric_calls_total": float(baseline.metric_calls),
        "elapsed_s": baseline.elapsed_s,
        "pareto_front_size": 1.0,
    }
    if baseline.cost_usd is not None:
        metrics["cost_usd_total"] = baseline.cost_usd
    return metrics


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
