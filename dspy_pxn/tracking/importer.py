"""Replaying a run's log directory into MLflow later: a run tracked offline, or one that lost its server.

The log directory is the truth and MLflow mirrors it, so importing is idempotent: a run
MLflow already has is completed in place (only the steps, params and results it lacks),
any other is created.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from dspy_pxn.engine.records import STEP_LOG_NAME, read_step_log
from dspy_pxn.tracking import runlog
from dspy_pxn.tracking.config import DEFAULT_EXPERIMENT, default_tracking_uri, require_mlflow
from dspy_pxn.tracking.mlflow_io import CONFIG_TAG, IMPORTED_TAG, MlflowMirror, failure_series, probe
from dspy_pxn.tracking.mlflow_run import final_metrics, write_outputs
from dspy_pxn.tracking.model import ModelSource, model_of
from dspy_pxn.tracking.runlog import FinalMetrics, RunManifest


@dataclass(frozen=True)
class ImportedRun:
    """What ``import_step_log`` did with one log directory."""

    log_dir: str
    run_id: str
    resumed: bool  # True: completed the run MLflow already had; False: created a new run
    steps_logged: int


def import_step_log(
    log_dir: str, tracking_uri: str | None = None, experiment: str | None = None
) -> list[ImportedRun]:
    """Replay a run's log directory (or a sweep's, with its children) into MLflow.

    Destination: ``tracking_uri``/``experiment`` if given, else the ones the run was
    started with, else MLflow's defaults. If the run already exists there (tracking
    stopped mid-run), it is completed in place: only the steps, params and results it
    lacks are logged, so importing twice changes nothing. Otherwise a new run is created.
    A directory with only ``steps.jsonl`` (an untracked run) is imported too.
    """
    require_mlflow("import_step_log")
    if not os.path.isdir(log_dir):
        raise FileNotFoundError(f"log_dir={log_dir!r} is not a directory; pass the log_dir the run was given.")
    manifest = RunManifest.load(log_dir) or _manifest_from_steps(log_dir)
    if manifest is None:
        raise FileNotFoundError(
            f"log_dir={log_dir!r} holds neither {runlog.MANIFEST_NAME} nor {STEP_LOG_NAME}: it is not a dspy-pxn run "
            "directory. Pass the directory given as BatchedGEPA(log_dir=...) or named in the tracking warning."
        )
    if manifest.kind != "sweep":
        return [_import_run(log_dir, manifest, tracking_uri, experiment, parent_run_id=None)]
    parent = _import_run(log_dir, manifest, tracking_uri, experiment, parent_run_id=None)
    imported = [parent]
    for child in sorted(os.listdir(log_dir)):
        path = os.path.join(log_dir, child)
        child_manifest = RunManifest.load(path) if os.path.isdir(path) else None
        if child_manifest is None and os.path.isdir(path):
            child_manifest = _manifest_from_steps(path)
        if child_manifest is not None:
            imported.append(_import_run(path, child_manifest, tracking_uri, experiment, parent_run_id=parent.run_id))
    return imported


def _import_run(
    log_dir: str, manifest: RunManifest, tracking_uri: str | None, experiment: str | None, parent_run_id: str | None
) -> ImportedRun:
    """``_replay`` on a thread of its own, as a live run logs on its writer thread: MLflow links every metric a
    thread logs to that thread's *active model*, which loading a model sets (``mlflow.dspy.load_model``), so
    replayed in the caller's thread the run's metrics would become a model's the caller loaded, one that may not
    even be in this store."""
    with ThreadPoolExecutor(1, thread_name_prefix="dspy-pxn-import") as thread:
        return thread.submit(_replay, log_dir, manifest, tracking_uri, experiment, parent_run_id).result()


def _replay(
    log_dir: str, manifest: RunManifest, tracking_uri: str | None, experiment: str | None, parent_run_id: str | None
) -> ImportedRun:
    uri = tracking_uri or manifest.tracking_uri or default_tracking_uri()
    reason = probe(uri)
    if reason is not None:
        raise ConnectionError(
            f"MLflow tracking server {uri} is unreachable ({reason}); start it, or pass tracking_uri=..."
        )
    mirror = MlflowMirror(uri)
    # Complete the run in place only where it was started; another experiment gets a new run.
    resumed = mirror.run_exists(manifest.run_id) and experiment in (None, manifest.experiment)
    if not resumed:
        manifest.experiment = experiment or manifest.experiment or DEFAULT_EXPERIMENT
        parent = parent_run_id or (manifest.parent_run_id if mirror.run_exists(manifest.parent_run_id) else None)
        manifest.parent_run_id = parent
        manifest.run_id = mirror.create_run(manifest, parent, {IMPORTED_TAG: os.path.abspath(log_dir)})
    run_id = manifest.run_id
    assert run_id is not None
    mirror.log_params(run_id, manifest.params)
    logged = 0
    if manifest.kind == "run":
        done = mirror.logged_steps(run_id)
        if manifest.baseline is not None and 0 not in done:
            mirror.log_baseline(run_id, manifest.baseline, manifest.started_at)
        steps = read_step_log(log_dir)
        failing: set[str] = set()  # the failure series started so far, by the steps already logged too
        for record in steps:
            if record.step in done:
                failing |= failure_series([record])
            else:
                mirror.log_step(run_id, record, manifest.started_at, failing)
                logged += 1
        if steps and not os.path.isdir(os.path.join(log_dir, runlog.PLOTS_DIR)):
            write_outputs(log_dir, manifest, steps)
        if manifest.final is not None:
            mirror.log_metrics(run_id, manifest.final.metrics(), step=len(steps))
    manifest.tracking_uri = uri
    manifest.save(log_dir)
    mirror.upload(run_id, log_dir)
    source = ModelSource.load(log_dir)
    if source is not None and model_of(mirror.client, run_id) is None:  # an import logs no model twice
        mirror.log_program(run_id, source, on_failure=_refused)
    # A run still marked RUNNING on disk is one whose process died before finishing.
    mirror.end(run_id, manifest.status if manifest.status != runlog.RUNNING else "KILLED")
    return ImportedRun(log_dir=log_dir, run_id=run_id, resumed=resumed, steps_logged=logged)


def _refused(reason: str) -> None:
    raise RuntimeError(f"MLflow did not take the run's program as a model: {reason}. Fix what it names (e.g. a "
                       "registry that refuses writes), then import again: nothing already imported is repeated.")


def _manifest_from_steps(log_dir: str) -> RunManifest | None:
    """A manifest for a log directory that has steps but no run.json (a run compiled untracked)."""
    steps = read_step_log(log_dir)
    if not steps:
        return None
    first, last = steps[0], steps[-1]
    label = f"{first.p}x{first.n}"
    final = final_metrics(
        steps,
        best_val=max(s.best_val for s in steps),
        metric_calls=last.metric_calls_total,
        candidates=1 + sum(s.accepted for s in steps),
        wall_s=last.started_at + last.wall_s - first.started_at,
    )
    final = FinalMetrics(**{**final.__dict__, "cost_usd": last.cost_usd_total})
    return RunManifest(
        kind="run",
        run_name=f"BatchedGEPA {label} ({os.path.basename(os.path.abspath(log_dir))})",
        experiment=DEFAULT_EXPERIMENT,
        tracking_uri="",
        started_at=first.started_at,
        params={
            "p": str(first.p), "n": str(first.n), "num_workers": str(first.num_workers), "budget": str(first.budget),
            "reflection_minibatch_size": str(first.minibatch_size), "valset_size": str(first.val_size),
        },
        tags={CONFIG_TAG: label},
        status=runlog.FINISHED,
        final=final,
    )
