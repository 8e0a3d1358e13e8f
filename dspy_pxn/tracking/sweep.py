"""Sweeps: one parent MLflow run whose children are the BatchedGEPA runs compiled inside it.

Nesting is decided here and at each compile, in the caller's context, and carried as
explicit run ids, so worker threads cannot create orphan runs.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

from dspy_pxn.engine.tracker import tracking_by_default
from dspy_pxn.tracking import runlog
from dspy_pxn.tracking.config import default_experiment, default_tracking_uri, require_mlflow, slug
from dspy_pxn.tracking.mlflow_io import BEST_RUN_TAG, MODEL_TAG, SWEEP_TAG, MlflowMirror, probe
from dspy_pxn.tracking.mlflow_run import MlflowTracker
from dspy_pxn.tracking.model import check_registered_model_name, register_model
from dspy_pxn.tracking.parent import CURRENT_SWEEP, Sweep
from dspy_pxn.tracking.runlog import RunManifest

logger = logging.getLogger(__name__)


@contextmanager
def sweep(
    name: str,
    *,
    experiment: str | None = None,
    tracking_uri: str | None = None,
    log_dir: str | None = None,
    compare: bool = True,
    registered_model_name: str | None = None,
) -> Iterator[Sweep]:
    """One parent MLflow run; every BatchedGEPA compiled inside the block is a nested child.

    Nesting is decided here and at each compile, in the caller's context, and carried as
    explicit run ids, so worker threads cannot create orphan runs. With ``compare`` the
    children's comparison (plots and table, ``dspy_pxn.tracking.compare``) is attached to the parent,
    and the parent names its best child and that child's program (tags ``dspy_pxn.best_run_id``,
    ``dspy_pxn.model_uri``); ``registered_model_name`` registers that program in the Model Registry.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"sweep name must be a non-empty string, got {name!r}, e.g. sweep('pxn-grid').")
    check_registered_model_name(registered_model_name)
    require_mlflow("sweep(...)")
    uri = tracking_uri or default_tracking_uri()
    manifest = RunManifest(
        kind="sweep",
        run_name=name,
        experiment=experiment or default_experiment(uri),
        tracking_uri=uri,
        started_at=time.time(),
        tags={SWEEP_TAG: name},
    )
    log_dir = log_dir or tempfile.mkdtemp(prefix=f"dspy-pxn-sweep-{slug(name)}-")
    mirror: MlflowMirror | None = None
    reason = probe(manifest.tracking_uri)
    if reason is None:
        try:
            mirror = MlflowMirror(manifest.tracking_uri)
            manifest.run_id = mirror.create_run(manifest, None)
        except Exception as error:  # noqa: BLE001
            mirror, reason = None, f"{type(error).__name__}: {error}"
    if reason is not None:
        logger.warning(
            "MLflow tracking is off for sweep %r (%s): %s. Its runs go on and are kept in %s; import them later "
            "with dspy_pxn.tracking.import_step_log(%r).", name, manifest.tracking_uri, reason, log_dir, log_dir,
        )
    manifest.save(log_dir)
    current = Sweep(manifest, log_dir, online=mirror is not None)
    token = CURRENT_SWEEP.set(current)
    status = runlog.FAILED
    try:
        with tracking_by_default(MlflowTracker()):  # the runs inside are tracked, nested under this one
            yield current
        status = runlog.FINISHED
    finally:
        CURRENT_SWEEP.reset(token)
        manifest.status = status
        manifest.save(log_dir)
        if mirror is not None and manifest.run_id is not None:
            _end_sweep(mirror, current, status, compare, registered_model_name)


def _end_sweep(mirror: MlflowMirror, current: Sweep, status: str, compare: bool,
               registered_model_name: str | None) -> None:
    run_id = current.manifest.run_id
    assert run_id is not None
    try:
        if (compare or registered_model_name) and current.children:
            from dspy_pxn.tracking.compare import best_run, compare_runs, load_runs

            runs = load_runs(current.manifest.experiment, mirror.tracking_uri, parent_run_id=run_id)
            if runs and compare:
                out = os.path.join(current.log_dir, "comparison")
                compare_runs(runs, out)
                mirror.client.log_artifacts(run_id, out, "comparison")
            best = best_run(runs)
            if best is not None:  # the sweep's answer, on its own page: which child won, and its program
                mirror.client.set_tag(run_id, BEST_RUN_TAG, best.run_id)
                if best.model_uri:
                    mirror.client.set_tag(run_id, MODEL_TAG, best.model_uri)
                if best.model_uri and registered_model_name:
                    register_model(mirror.client, registered_model_name, best.model_uri, best.run_id)
        mirror.log_params(run_id, {"runs": str(len(current.children))})
        mirror.end(run_id, status)
    except Exception as error:  # noqa: BLE001
        logger.warning("Could not close sweep run %s in MLflow: %s", run_id, error)
