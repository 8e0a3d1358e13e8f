"""MLflow tracking for one BatchedGEPA compile: ``MlflowTracker`` starts an ``MlflowRun``.

Three rules shape this module:

- **Explicit run ids, never the fluent API.** MLflow's active run is thread-local, so
  a worker thread that logs through ``mlflow.log_*`` (or ``mlflow.dspy.autolog``) sees
  no active run and opens a new top-level one: an orphan. Every call here goes through
  ``MlflowClient`` with the run id it belongs to, and nesting is the
  ``mlflow.parentRunId`` tag set when the run is created, in the caller's context.
- **The optimizer never waits on MLflow.** Calls run in order on one background
  thread. The first failure (server unreachable at start, or gone mid-run; an HTTP
  server is probed before every call so a dead one is noticed at once instead of after
  MLflow's minutes of retries) turns tracking off for the run with one warning
  (``dspy_pxn.tracking.mlflow_io`` holds the calls, the probe and the writer thread).
- **The log directory is the truth; MLflow mirrors it.** ``run.json``, ``steps.jsonl``
  and ``proposals.jsonl`` are written first, so ``import_step_log(log_dir)`` can replay
  or complete the run in MLflow later, idempotently.

Default store: with no ``tracking_uri`` and no ``MLFLOW_TRACKING_URI``, MLflow 3.x uses
``sqlite:///mlflow.db`` in the working directory (``./mlruns`` if an old file store is
already there), which is exactly what ``mlflow ui`` started in that directory opens.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dspy_pxn.engine import description as described
from dspy_pxn.engine.description import RunDescription
from dspy_pxn.engine.records import StepRecord, read_step_log
from dspy_pxn.engine.resume import GEPA_STATE_FILE
from dspy_pxn.engine.tracker import TrackingArgumentError
from dspy_pxn.ledger.ledger import RunLedger
from dspy_pxn.tracking import runlog
from dspy_pxn.tracking.autolog import logs_compiles
from dspy_pxn.tracking.config import default_experiment, default_tracking_uri, require_mlflow, slug
from dspy_pxn.tracking.lineage import LineageObserver, read_proposals
from dspy_pxn.tracking.mlflow_io import (
    CONFIG_TAG,
    STOPPED_BY_TAG,
    SWEEP_TAG,
    BackgroundWriter,
    MlflowMirror,
    failure_series,
    probe,
)
from dspy_pxn.tracking.model import (
    ModelOptions,
    ModelSource,
    caller_settings,
    check_registered_model_name,
    default_prompt_prefix,
    model_name,
    model_source,
)
from dspy_pxn.tracking.parent import current_sweep
from dspy_pxn.tracking.runlog import COUNTED, FAILURES, Baseline, FinalMetrics, RunManifest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MlflowTracker:
    """Tracks each compile as an MLflow run. ``None`` fields are resolved when a run starts.

    Runs go to ``tracking_uri`` (else MLflow's own: ``MLFLOW_TRACKING_URI``, else
    ``./mlflow.db``), into ``experiment``; inside ``with sweep(...)`` a run nests under the
    sweep's parent run, and inside the caller's ``with mlflow.start_run():`` under that run.

    The optimized program is logged as the run's MLflow model (``mlflow.dspy`` flavor), named after
    the run's task and setting (``tags={"task": ...}``, else the ``dataset`` tag, else the program's
    class; then e.g. ``4x4-merge-async``), and registered as ``registered_model_name`` when given; each
    predictor's instruction is registered in the Prompt Registry of the run's experiment as
    ``<prompt_prefix>.<predictor>`` (default prefix: ``<experiment>.<program class>``, so re-runs add
    versions to the same prompts).
    """

    tracking_uri: str | None = None
    experiment: str | None = None
    run_name: str | None = None
    tags: Mapping[str, str] | tuple[tuple[str, str], ...] = ()  # kept as sorted pairs
    flush_timeout_s: float = 60.0  # the last records, the tables and the model (MLflow infers nothing: ~5 s)
    registered_model_name: str | None = None
    prompt_prefix: str | None = None

    def __post_init__(self) -> None:
        """Every argument checked when the tracker is made, before any LM call."""
        for name in ("tracking_uri", "experiment", "run_name"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"{name} must be a non-empty string, got {value!r}.")
        tags = dict(self.tags or {})
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
            raise ValueError(f"tags must map strings to strings, got {self.tags!r}, e.g. tags={{'dataset': 'hover'}}.")
        object.__setattr__(self, "tags", tuple(sorted(tags.items())))  # hashable, and one order
        check_registered_model_name(self.registered_model_name)
        prefix = self.prompt_prefix
        if prefix is not None and (not isinstance(prefix, str) or not prefix.strip()):
            raise ValueError(f"prompt_prefix must be a non-empty string, got {prefix!r}, e.g. prompt_prefix='hover-agent'.")

    @classmethod
    def by_default(cls, use_mlflow: bool) -> MlflowTracker | None:
        """The tracker a compile gets without a ``tracker=``: MLflow's with its defaults for ``use_mlflow=True``
        (dspy.GEPA's argument; MLflow must be installed), or when ``mlflow.dspy.autolog(log_compiles=True)`` is
        on; None otherwise."""
        if not (use_mlflow or logs_compiles()):
            return None
        require_mlflow("use_mlflow=True")
        return cls()

    def start(self, description: RunDescription, *, log_dir: str | None, usage: RunLedger) -> MlflowRun:
        """Resolve where the run goes (sweep, caller's active run, or this tracker's settings), then open it.

        Raises TrackingArgumentError only for contradictory arguments (before any LM call); an
        unreachable store is not an error, just a warning and an offline run.
        """
        import mlflow

        params = described.params(description)
        tags = dict(self.tags)
        if "dataset" in tags:
            params["dataset"] = tags["dataset"]  # the user's name for the data, where they gave one
        tags[CONFIG_TAG] = described.label(description)
        parent_sweep = current_sweep()
        parent_run_id: str | None = None
        online = True
        if parent_sweep is not None:
            sweep_uri, sweep_experiment = parent_sweep.manifest.tracking_uri, parent_sweep.manifest.experiment
            if self.tracking_uri not in (None, sweep_uri):
                raise TrackingArgumentError(
                    f"tracking_uri={self.tracking_uri!r} differs from the enclosing sweep's {sweep_uri!r}: a nested run "
                    "must live with its parent. Drop tracking_uri, or compile outside the sweep."
                )
            if self.experiment not in (None, sweep_experiment):
                raise TrackingArgumentError(
                    f"experiment={self.experiment!r} differs from the enclosing sweep's {sweep_experiment!r}: drop "
                    "experiment, or compile outside the sweep."
                )
            tracking_uri, experiment = sweep_uri, sweep_experiment
            parent_run_id = parent_sweep.run_id
            online = parent_sweep.online
            tags[SWEEP_TAG] = parent_sweep.manifest.run_name
        else:
            tracking_uri = self.tracking_uri or default_tracking_uri()
            experiment = self.experiment or default_experiment(tracking_uri)
            active = mlflow.active_run()
            if active is not None and self.tracking_uri is None and self.experiment is None:
                # Compiled inside the caller's `with mlflow.start_run():` -> nest under it, in its experiment.
                parent_run_id = active.info.run_id
                experiment = _experiment_name(tracking_uri, active.info.experiment_id) or experiment
        run_name = self.run_name or f"BatchedGEPA {described.label(description)}"
        options = ModelOptions(
            prompt_prefix=self.prompt_prefix or default_prompt_prefix(experiment, description.program),
            registered_model_name=self.registered_model_name,
            input_example=description.input_example,
            # The task the CLI names, else the user's name for the data, else the program's class: "sim-4x4".
            model_name=model_name(tags.get("task") or (params["dataset"] if params["dataset"] != "unnamed"
                                                       else description.program), described.label(description)),
        )
        resuming = log_dir is not None and os.path.exists(os.path.join(log_dir, GEPA_STATE_FILE))
        previous = RunManifest.load(log_dir) if resuming else None
        if previous is not None and previous.kind == "run" and previous.run_id:
            # The process died mid-run and compile() is resuming it: keep tracking the same MLflow run.
            previous.status = runlog.RUNNING
            manifest = previous
        else:
            if log_dir is None:
                log_dir = (
                    parent_sweep.child_log_dir(run_name)
                    if parent_sweep is not None
                    else tempfile.mkdtemp(prefix=f"dspy-pxn-{slug(run_name)}-")
                )
            manifest = RunManifest(
                kind="run", run_name=run_name, experiment=experiment, tracking_uri=tracking_uri,
                started_at=time.time(), params=dict(params), tags=tags, parent_run_id=parent_run_id,
            )
        tracker = MlflowRun(manifest, log_dir, usage, self.flush_timeout_s, online=online, resumed=manifest is previous,
                            model_options=options)
        if parent_sweep is not None:
            parent_sweep.children.append(log_dir)
        return tracker


class MlflowRun:
    """Mirrors one compile into MLflow: params at start, a step per StepRecord, results at the end.

    Started by ``MlflowTracker.start``; BatchedGEPA feeds it ``on_step`` (a step sink), its
    gepa callbacks (seed baseline, lineage), then calls ``finish`` or ``fail``. No method
    raises: a tracking problem is one warning, and the log directory keeps the run.
    """

    def __init__(
        self, manifest: RunManifest, log_dir: str, usage: RunLedger | None, flush_timeout_s: float, online: bool,
        resumed: bool = False, model_options: ModelOptions | None = None,
    ):
        self.manifest = manifest
        self.model_options = model_options
        self.dspy_settings = _caller_settings()  # made here, in the compiling thread, before the run's own context
        self.resumed = resumed  # continuing a run from its log_dir: reopen its MLflow run, keep its clock
        self.log_dir = log_dir
        self.usage = usage
        self.flush_timeout_s = flush_timeout_s
        self.lineage = LineageObserver(log_dir)
        # The failure series started so far (mlflow_io.step_metrics); a resumed run's earlier steps started some.
        self._failing = failure_series(read_step_log(log_dir)) if resumed else set()
        self._warned = False
        self._mirror: MlflowMirror | None = None
        self._writer: BackgroundWriter | None = None
        if online:
            self._go_online()
        self._save_manifest()

    @property
    def run_id(self) -> str | None:
        return self.manifest.run_id

    @property
    def online(self) -> bool:
        return self._writer is not None and not self._writer.failed

    @property
    def gepa_callbacks(self) -> list[Any]:
        return [self, self.lineage]

    def _go_online(self) -> None:
        uri = self.manifest.tracking_uri
        reason = probe(uri)
        if reason is None:
            try:
                self._mirror = MlflowMirror(uri)
                if self.resumed and self._mirror.run_exists(self.manifest.run_id):
                    self._mirror.reopen(self.manifest.run_id)
                else:
                    run_id = self._mirror.create_run(self.manifest, self.manifest.parent_run_id)
                    if not isinstance(run_id, str):
                        raise TypeError(f"MLflow returned {run_id!r} as a run id, not a string")
                    self.manifest.run_id = run_id
                self._mirror.log_params(self.manifest.run_id, self.manifest.params)
            except Exception as error:  # noqa: BLE001 - an unreachable, broken or stand-in MLflow: go offline
                reason = f"{type(error).__name__}: {error}"
        if reason is not None:
            self._mirror = None
            self.warn(reason)
            return
        self._writer = BackgroundWriter(uri, self.warn)
        logger.info(
            "MLflow run %s (%s) in experiment %r at %s", self.manifest.run_id, self.manifest.run_name,
            self.manifest.experiment, uri,
        )

    def warn(self, reason: str) -> None:
        """One warning per run, naming the way back: the log directory and the import call."""
        if self._warned:
            return
        self._warned = True
        logger.warning(
            "MLflow tracking stopped for run %r (%s): %s. The optimization goes on; every step and the results "
            "are kept in %s. Import them later with dspy_pxn.tracking.import_step_log(%r) (CLI: dspy-pxn "
            "mlflow-import %s).",
            self.manifest.run_name, self.manifest.tracking_uri, reason, self.log_dir, self.log_dir, self.log_dir,
        )

    def _submit(self, call: Callable[[MlflowMirror, str], None]) -> None:
        mirror, run_id, writer = self._mirror, self.manifest.run_id, self._writer
        if mirror is not None and run_id is not None and writer is not None:
            writer.submit(lambda: call(mirror, run_id))

    # -- gepa callbacks: the clock starts with gepa (not with MLflow's setup); the seed's
    # -- validation is step 0 of every curve.
    def on_optimization_start(self, event: dict) -> None:
        if self.resumed:
            return  # elapsed time keeps counting from the original start
        self.manifest.started_at = time.time()
        self._save_manifest()

    def on_valset_evaluated(self, event: dict) -> None:
        if event.get("iteration") != 0 or self.manifest.baseline is not None:
            return
        baseline = Baseline(
            val_score=float(event["average_score"]),
            metric_calls=int(event["num_examples_evaluated"]),
            elapsed_s=time.time() - self.manifest.started_at,
            cost_usd=self.usage.tally().cost_usd if self.usage is not None else None,
        )
        self.manifest.baseline = baseline
        self._save_manifest()
        started_at = self.manifest.started_at
        self._submit(lambda m, run_id: m.log_baseline(run_id, baseline, started_at))

    # -- step sink --------------------------------------------------------------------------------
    def on_step(self, record: StepRecord) -> None:
        started_at = self.manifest.started_at
        self._submit(lambda m, run_id: m.log_step(run_id, record, started_at, self._failing))

    # -- end of the run ---------------------------------------------------------------------------
    def finish(self, program: Any, results: Any) -> None:
        """``results``: the run's BatchedGEPAResult (steps, scores, usage, wall-clock, test score); None when
        gepa's result could not give them, and the run is recorded finished with its program alone."""
        steps = list(results.steps) if results is not None else []
        final = None if results is None else final_metrics(
            steps, results.val_aggregate_scores[results.best_idx], results.total_metric_calls, len(results.candidates),
            results.wall_s, results.usage, results.test_score,
        )
        try:
            self.manifest.final = final
            self.manifest.status = runlog.FINISHED
            write_outputs(self.log_dir, self.manifest, steps, program=program, lineage=self.lineage)
            self._save_manifest()
        except Exception as error:  # noqa: BLE001 - results stay in the returned program regardless
            logger.warning("Could not write the run's tables, program or plots to %s: %s", self.log_dir, error)
        source = self._keep_model_source(program, results)
        if final is not None:
            metrics = final.metrics()
            self._submit(lambda m, run_id: m.log_metrics(run_id, metrics, step=len(steps)))
            stopped_by = results.stopped_by
            self._submit(lambda m, run_id: m.client.set_tag(run_id, STOPPED_BY_TAG, stopped_by))
        self._submit(lambda m, run_id: m.upload(run_id, self.log_dir))
        if source is not None:
            self._submit(lambda m, run_id: m.log_program(run_id, source, self.warn_model))
        self._close(runlog.FINISHED)

    def _keep_model_source(self, program: Any, results: Any) -> ModelSource | None:
        """The program as it will be logged, kept in the log directory first (for ``mlflow-import``)."""
        if self.model_options is None or self.dspy_settings is None:
            return None
        try:
            source = model_source(program, self.dspy_settings, self.model_options, results)
            source.save(self.log_dir)
        except Exception as error:  # noqa: BLE001 - a program that cannot be copied or pickled: no model
            self.warn_model(f"it cannot be serialized ({type(error).__name__}: {error}); a program that holds locks, "
                            "open files or connections cannot be an MLflow model")
            return None
        return source

    def warn_model(self, reason: str) -> None:
        """A model or prompt MLflow refused is one warning; the run's other records go on."""
        logger.warning(
            "The optimized program of run %r is not (all) in MLflow: %s. The program is returned and saved in "
            "%s; once the cause is fixed, dspy-pxn mlflow-import %s logs a model MLflow did not take.",
            self.manifest.run_name, reason, self.log_dir, self.log_dir,
        )

    def fail(self, error: BaseException) -> None:
        self.manifest.status = runlog.FAILED
        self.manifest.tags = {**self.manifest.tags, "dspy_pxn.error": f"{type(error).__name__}: {error}"[:500]}
        self._save_manifest()
        self._submit(lambda m, run_id: m.upload(run_id, self.log_dir))
        self._close(runlog.FAILED)

    def _close(self, status: str) -> None:
        self._submit(lambda m, run_id: m.end(run_id, status))
        if self._writer is None:
            return
        if not self._writer.close(self.flush_timeout_s):
            self._writer.failed = True
            self.warn(f"it did not take the run's last records within {self.flush_timeout_s:.0f} s")

    def _save_manifest(self) -> None:
        try:
            self.manifest.save(self.log_dir)
        except Exception as error:  # noqa: BLE001 - a disk error, or a value that is not JSON: tracking only
            logger.warning("Could not write %s: %s", os.path.join(self.log_dir, runlog.MANIFEST_NAME), error)


def write_outputs(
    log_dir: str,
    manifest: RunManifest,
    steps: list[StepRecord],
    program: Any = None,
    lineage: LineageObserver | None = None,
) -> None:
    """The artifacts: program JSON, proposal and candidate tables, and the run's plots."""
    if program is not None:
        program.save(os.path.join(log_dir, runlog.PROGRAM_NAME))
    proposals = lineage.proposals if lineage is not None else read_proposals(log_dir)
    if proposals:
        runlog.write_table(os.path.join(log_dir, runlog.PROPOSALS_TABLE), proposals)
    if lineage is not None and lineage.candidates:
        runlog.write_table(os.path.join(log_dir, runlog.CANDIDATES_TABLE), lineage.candidates)
    if steps:
        from dspy_pxn.tracking.plots import plot_run

        plot_run(steps, manifest.baseline, manifest.started_at, os.path.join(log_dir, runlog.PLOTS_DIR))


def final_metrics(
    steps: list[StepRecord],
    best_val: float,
    metric_calls: int,
    candidates: int,
    wall_s: float,
    usage: Any = None,
    test_score: float | None = None,
) -> FinalMetrics:
    return FinalMetrics(
        best_val=best_val,
        metric_calls=metric_calls,
        iterations=len(steps),
        validation_trigger_fraction=sum(s.full_validation for s in steps) / len(steps) if steps else 0.0,
        candidates=candidates,
        wall_s=wall_s,
        lm_calls=getattr(usage, "lm_calls", 0),
        prompt_tokens=getattr(usage, "prompt_tokens", 0),
        completion_tokens=getattr(usage, "completion_tokens", 0),
        cost_usd=getattr(usage, "cost_usd", None),
        **{f"{role}_{name}": getattr(getattr(usage, role, None), name, default) for role in ("task", "reflection")
           for name, default in (("lm_calls", 0), ("prompt_tokens", 0), ("completion_tokens", 0), ("cost_usd", None))},
        test_score=test_score,
        **{name: sum(getattr(s, name) or 0 for s in steps) for name in (*COUNTED, *FAILURES)},
    )


def _caller_settings() -> dict[str, Any] | None:
    try:
        return caller_settings()
    except Exception as error:  # noqa: BLE001 - an LM that cannot be copied: the run goes on, without a model
        logger.warning("The DSPy settings cannot be kept for the run's MLflow model (%s: %s); it will not be logged.",
                       type(error).__name__, error)
        return None


def _experiment_name(tracking_uri: str, experiment_id: str) -> str | None:
    try:
        return MlflowMirror(tracking_uri).client.get_experiment(experiment_id).name
    except Exception:  # noqa: BLE001
        return None
