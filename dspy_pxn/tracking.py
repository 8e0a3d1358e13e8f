"""MLflow tracking for BatchedGEPA: one run per compile, sweeps as nested runs, import later.

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
  (``dspy_pxn.mlflow_io`` holds the calls, the probe and the writer thread).
- **The log directory is the truth; MLflow mirrors it.** ``run.json``, ``steps.jsonl``
  and ``proposals.jsonl`` are written first, so ``import_step_log(log_dir)`` can replay
  or complete the run in MLflow later, idempotently.

Default store: with no ``tracking_uri`` and no ``MLFLOW_TRACKING_URI``, MLflow 3.x uses
``sqlite:///mlflow.db`` in the working directory (``./mlruns`` if an old file store is
already there), which is exactly what ``mlflow ui`` started in that directory opens.
"""

from __future__ import annotations

import contextvars
import importlib.util
import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from dspy_pxn import runlog
from dspy_pxn.components import code_components
from dspy_pxn.lineage import LineageObserver, read_proposals
from dspy_pxn.mlflow_io import (
    CONFIG_TAG,
    IMPORTED_TAG,
    KIND_TAG,
    PARENT_TAG,
    SWEEP_TAG,
    BackgroundWriter,
    MlflowMirror,
    baseline_metrics,
    probe,
    step_metrics,
)
from dspy_pxn.runlog import Baseline, FinalMetrics, RunManifest
from dspy_pxn.steps import STEP_LOG_NAME, StepRecord, read_step_log
from dspy_pxn.usage import UsageMeter

__all__ = [
    "CONFIG_TAG", "KIND_TAG", "PARENT_TAG", "SWEEP_TAG", "ImportedRun", "RunTracker", "Sweep", "TrackingConfig",
    "current_sweep", "import_step_log", "start_for", "sweep", "tracking_config",
]

logger = logging.getLogger(__name__)

DEFAULT_EXPERIMENT = "dspy-pxn"
INSTALL_HINT = "pip install 'dspy-pxn[mlflow]' (or pip install 'mlflow>=3.4,<4')"


# ----------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class TrackingConfig:
    """Where a run goes. ``None`` fields are resolved when the run starts (see ``start_run``)."""

    tracking_uri: str | None = None
    experiment: str | None = None
    run_name: str | None = None
    tags: tuple[tuple[str, str], ...] = ()
    flush_timeout_s: float = 30.0


def tracking_config(
    mlflow: bool | None,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    run_name: str | None = None,
    run_tags: Mapping[str, str] | None = None,
) -> TrackingConfig | None:
    """Check BatchedGEPA's tracking arguments before any LM call; None means "not asked for".

    Any of ``tracking_uri``/``experiment``/``run_name``/``run_tags`` turns tracking on;
    ``mlflow=False`` with one of them is a contradiction and fails here.
    """
    arguments = {"tracking_uri": tracking_uri, "experiment": experiment, "run_name": run_name, "run_tags": run_tags}
    given = {name: value for name, value in arguments.items() if value is not None}
    if mlflow is not None and not isinstance(mlflow, bool):
        raise TypeError(
            f"mlflow must be True, False or None, got {mlflow!r}. Pass tracking_uri=... to choose a server."
        )
    if mlflow is False and given:
        raise ValueError(
            f"mlflow=False contradicts {sorted(given)}: drop them, or set mlflow=True to track the run in MLflow."
        )
    for name in ("tracking_uri", "experiment", "run_name"):
        value = given.get(name)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"{name} must be a non-empty string, got {value!r}.")
    tags = dict(run_tags or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
        raise ValueError(
            f"run_tags must map strings to strings, got {run_tags!r}, e.g. run_tags={{'dataset': 'hover'}}."
        )
    if not (mlflow or given):
        return None
    require_mlflow("mlflow=True" if mlflow else f"{min(given)}=...")
    return TrackingConfig(tracking_uri, experiment, run_name, tuple(sorted(tags.items())))


def require_mlflow(asked_by: str) -> None:
    if "mlflow" in sys.modules:
        return  # imported already (find_spec refuses a module object that has no spec)
    if importlib.util.find_spec("mlflow") is None:
        raise ImportError(f"{asked_by} needs the mlflow package, which is not installed: {INSTALL_HINT}.")


def default_tracking_uri() -> str:
    """What MLflow itself resolves: set_tracking_uri, MLFLOW_TRACKING_URI, else the local default store."""
    import mlflow

    return mlflow.get_tracking_uri()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "run"


# ----------------------------------------------------------------------------- one run
class RunTracker:
    """Mirrors one compile into MLflow: params at start, a step per StepRecord, results at the end.

    Built by ``start_run``; BatchedGEPA feeds it ``on_step`` (a step sink), its gepa
    callbacks (seed baseline, lineage), then calls ``finish`` or ``fail``. No method
    raises: a tracking problem is one warning, and the log directory keeps the run.
    """

    def __init__(
        self, manifest: RunManifest, log_dir: str, usage: UsageMeter | None, flush_timeout_s: float, online: bool,
        resumed: bool = False,
    ):
        self.manifest = manifest
        self.resumed = resumed  # continuing a run from its log_dir: reopen its MLflow run, keep its clock
        self.log_dir = log_dir
        self.usage = usage
        self.flush_timeout_s = flush_timeout_s
        self.lineage = LineageObserver(log_dir)
        self._warned = False
        self._mirror: MlflowMirror | None = None
        self._writer: BackgroundWriter | None = None
        if online:
            self._go_online()
        manifest.save(log_dir)

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
                    self.manifest.run_id = self._mirror.create_run(self.manifest, self.manifest.parent_run_id)
                self._mirror.log_params(self.manifest.run_id, self.manifest.params)
            except Exception as error:  # noqa: BLE001
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
            cost_usd=self.usage.totals().cost_usd if self.usage is not None else None,
        )
        self.manifest.baseline = baseline
        self._save_manifest()
        self._submit(lambda m, run_id: m.log_metrics(run_id, baseline_metrics(baseline), step=0))

    # -- step sink --------------------------------------------------------------------------------
    def on_step(self, record: StepRecord) -> None:
        metrics = step_metrics(record, self.manifest.started_at)
        ended = record.started_at + record.wall_s
        self._submit(lambda m, run_id: m.log_metrics(run_id, metrics, step=record.step, timestamp_s=ended))

    # -- end of the run ---------------------------------------------------------------------------
    def finish(self, program: Any, final: FinalMetrics, steps: list[StepRecord]) -> None:
        try:
            self.manifest.final = final
            self.manifest.status = runlog.FINISHED
            write_outputs(self.log_dir, self.manifest, steps, program=program, lineage=self.lineage)
            self._save_manifest()
        except Exception as error:  # noqa: BLE001 - results stay in the returned program regardless
            logger.warning("Could not write the run's tables, program or plots to %s: %s", self.log_dir, error)
        metrics = final.metrics()
        self._submit(lambda m, run_id: m.log_metrics(run_id, metrics, step=len(steps)))
        self._submit(lambda m, run_id: m.upload(run_id, self.log_dir))
        self._close(runlog.FINISHED)

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
        except OSError as error:
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
        from dspy_pxn.compare import plot_run

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
        test_score=test_score,
    )


# ----------------------------------------------------------------------------- sweeps
@dataclass
class Sweep:
    """A parent run whose children are the BatchedGEPA runs compiled inside ``with sweep(...)``."""

    manifest: RunManifest
    log_dir: str
    online: bool
    children: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str | None:
        return self.manifest.run_id

    def child_log_dir(self, run_name: str) -> str:
        return os.path.join(self.log_dir, f"{len(self.children) + 1:02d}-{_slug(run_name)}")


_CURRENT_SWEEP: contextvars.ContextVar[Sweep | None] = contextvars.ContextVar("dspy_pxn_sweep", default=None)


def current_sweep() -> Sweep | None:
    return _CURRENT_SWEEP.get()


@contextmanager
def sweep(
    name: str,
    *,
    experiment: str | None = None,
    tracking_uri: str | None = None,
    log_dir: str | None = None,
    compare: bool = True,
) -> Iterator[Sweep]:
    """One parent MLflow run; every BatchedGEPA compiled inside the block is a nested child.

    Nesting is decided here and at each compile, in the caller's context, and carried as
    explicit run ids, so worker threads cannot create orphan runs. With ``compare`` the
    children's comparison (plots and table, ``dspy_pxn.compare``) is attached to the parent.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"sweep name must be a non-empty string, got {name!r}, e.g. sweep('pxn-grid').")
    require_mlflow("sweep(...)")
    manifest = RunManifest(
        kind="sweep",
        run_name=name,
        experiment=experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT,
        tracking_uri=tracking_uri or default_tracking_uri(),
        started_at=time.time(),
        tags={SWEEP_TAG: name},
    )
    log_dir = log_dir or tempfile.mkdtemp(prefix=f"dspy-pxn-sweep-{_slug(name)}-")
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
    token = _CURRENT_SWEEP.set(current)
    status = runlog.FAILED
    try:
        yield current
        status = runlog.FINISHED
    finally:
        _CURRENT_SWEEP.reset(token)
        manifest.status = status
        manifest.save(log_dir)
        if mirror is not None and manifest.run_id is not None:
            _end_sweep(mirror, current, status, compare)


def _end_sweep(mirror: MlflowMirror, current: Sweep, status: str, compare: bool) -> None:
    run_id = current.manifest.run_id
    assert run_id is not None
    try:
        if compare and current.children:
            from dspy_pxn.compare import compare_runs, load_runs

            runs = load_runs(current.manifest.experiment, mirror.tracking_uri, parent_run_id=run_id)
            if runs:
                out = os.path.join(current.log_dir, "comparison")
                compare_runs(runs, out)
                mirror.client.log_artifacts(run_id, out, "comparison")
        mirror.log_params(run_id, {"runs": str(len(current.children))})
        mirror.end(run_id, status)
    except Exception as error:  # noqa: BLE001
        logger.warning("Could not close sweep run %s in MLflow: %s", run_id, error)


# ----------------------------------------------------------------------------- starting a run
def selection_label(strategy: Any) -> str:
    from gepa.strategies.proposal_selection import AllImprovements, BestImprovement, TopKImprovements

    if isinstance(strategy, AllImprovements):
        return "all"
    if isinstance(strategy, BestImprovement):
        return "best"
    if isinstance(strategy, TopKImprovements):
        return f"top-{strategy.k}"
    return type(strategy).__name__


def lm_name(lm: Any) -> str:
    """The model string only: an LM's kwargs hold api_key and api_base, which are never logged."""
    if lm is None:
        return "none"
    return str(getattr(lm, "model", None) or type(lm).__name__)


def run_params(
    optimizer: Any, student: Any, trainset: list, valset: list, budget: int, num_workers: int, reflection_lm: Any = None
) -> dict[str, str]:
    """What distinguishes one configuration from another: P, N, W, budget, LMs, program, data."""
    import dspy

    task_lms = {lm_name(p.lm) for _, p in student.named_predictors() if getattr(p, "lm", None) is not None}
    task_lms = task_lms or {lm_name(dspy.settings.lm)}
    tags = dict(optimizer.tracking.tags) if optimizer.tracking is not None else {}
    testset = getattr(optimizer, "testset", None) or []
    params = {
        "p": optimizer.p,
        "n": optimizer.n,
        "num_workers": num_workers,
        "budget": budget,
        "seed": optimizer.seed,
        "selection": selection_label(optimizer.selection),
        "reflection_minibatch_size": optimizer.reflection_minibatch_size,
        "candidate_selection_strategy": (
            optimizer.candidate_selection_strategy
            if isinstance(optimizer.candidate_selection_strategy, str)
            else type(optimizer.candidate_selection_strategy).__name__
        ),
        "use_merge": optimizer.use_merge,
        "task_lm": ",".join(sorted(task_lms)),
        "reflection_lm": lm_name(reflection_lm) if reflection_lm is not None else "custom proposer",
        "program": type(student).__name__,
        "predictors": len(student.named_predictors()),
        "code_components": len(code_components(student)),
        "dataset": tags.get("dataset") or getattr(trainset, "name", None) or "unnamed",
        "trainset_size": len(trainset),
        "valset_size": len(valset),
        "testset_size": len(testset),
    }
    return {key: str(value) for key, value in params.items()}


def start_for(
    optimizer: Any, student: Any, trainset: list, valset: list, budget: int, num_workers: int, usage: UsageMeter,
    reflection_lm: Any = None,
) -> RunTracker | None:
    """The tracker for one BatchedGEPA compile, or None when it is not tracked.

    Tracked when the optimizer asked for it, or when it is compiled inside ``with
    sweep(...)`` and did not say ``mlflow=False``.
    """
    config = optimizer.tracking
    if config is None and optimizer.mlflow is None and current_sweep() is not None:
        config = TrackingConfig()
    if config is None:
        return None
    label = f"{optimizer.p}x{optimizer.n}"
    selection = selection_label(optimizer.selection)
    if selection != "all":
        label += f" {selection}"
    params = run_params(optimizer, student, trainset, valset, budget, num_workers, reflection_lm)
    return start_run(config, params=params, config_label=label, log_dir=optimizer.log_dir, usage=usage)


def start_run(
    config: TrackingConfig,
    *,
    params: Mapping[str, str],
    config_label: str,
    log_dir: str | None,
    usage: UsageMeter | None,
) -> RunTracker:
    """Resolve where the run goes (sweep, caller's active run, or config), then open it.

    Raises ValueError only for contradictory arguments (before any LM call); an
    unreachable store is not an error, just a warning and an offline run.
    """
    import mlflow

    parent_sweep = current_sweep()
    parent_run_id: str | None = None
    online = True
    tags = {**dict(config.tags), CONFIG_TAG: config_label}
    if parent_sweep is not None:
        sweep_uri, sweep_experiment = parent_sweep.manifest.tracking_uri, parent_sweep.manifest.experiment
        if config.tracking_uri not in (None, sweep_uri):
            raise ValueError(
                f"tracking_uri={config.tracking_uri!r} differs from the enclosing sweep's {sweep_uri!r}: a nested run "
                "must live with its parent. Drop tracking_uri, or compile outside the sweep."
            )
        if config.experiment not in (None, sweep_experiment):
            raise ValueError(
                f"experiment={config.experiment!r} differs from the enclosing sweep's {sweep_experiment!r}: drop "
                "experiment, or compile outside the sweep."
            )
        tracking_uri, experiment = sweep_uri, sweep_experiment
        parent_run_id = parent_sweep.run_id
        online = parent_sweep.online
        tags[SWEEP_TAG] = parent_sweep.manifest.run_name
    else:
        tracking_uri = config.tracking_uri or default_tracking_uri()
        experiment = config.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
        active = mlflow.active_run()
        if active is not None and config.tracking_uri is None and config.experiment is None:
            # Compiled inside the caller's `with mlflow.start_run():` -> nest under it, in its experiment.
            parent_run_id = active.info.run_id
            experiment = _experiment_name(tracking_uri, active.info.experiment_id) or experiment
    run_name = config.run_name or f"BatchedGEPA {config_label}"
    previous = RunManifest.load(log_dir) if log_dir is not None and resuming(log_dir) else None
    if previous is not None and previous.kind == "run" and previous.run_id:
        # The process died mid-run and compile() is resuming it: keep tracking the same MLflow run.
        previous.status = runlog.RUNNING
        tracker = RunTracker(previous, log_dir, usage, config.flush_timeout_s, online=online, resumed=True)
        if parent_sweep is not None:
            parent_sweep.children.append(log_dir)
        return tracker
    if log_dir is None:
        log_dir = (
            parent_sweep.child_log_dir(run_name)
            if parent_sweep is not None
            else tempfile.mkdtemp(prefix=f"dspy-pxn-{_slug(run_name)}-")
        )
    manifest = RunManifest(
        kind="run",
        run_name=run_name,
        experiment=experiment,
        tracking_uri=tracking_uri,
        started_at=time.time(),
        params=dict(params),
        tags=tags,
        parent_run_id=parent_run_id,
    )
    tracker = RunTracker(manifest, log_dir, usage, config.flush_timeout_s, online=online)
    if parent_sweep is not None:
        parent_sweep.children.append(log_dir)
    return tracker


def resuming(log_dir: str) -> bool:
    """True when compile() will continue a saved run in ``log_dir`` (see dspy_pxn.resume)."""
    from dspy_pxn.resume import GEPA_STATE_FILE

    return os.path.exists(os.path.join(log_dir, GEPA_STATE_FILE))


def _experiment_name(tracking_uri: str, experiment_id: str) -> str | None:
    try:
        return MlflowMirror(tracking_uri).client.get_experiment(experiment_id).name
    except Exception:  # noqa: BLE001
        return None


# ----------------------------------------------------------------------------- import later
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
            mirror.log_metrics(run_id, baseline_metrics(manifest.baseline), step=0)
        steps = read_step_log(log_dir)
        for record in steps:
            if record.step not in done:
                metrics = step_metrics(record, manifest.started_at)
                mirror.log_metrics(run_id, metrics, record.step, record.started_at + record.wall_s)
                logged += 1
        if steps and not os.path.isdir(os.path.join(log_dir, runlog.PLOTS_DIR)):
            write_outputs(log_dir, manifest, steps)
        if manifest.final is not None:
            mirror.log_metrics(run_id, manifest.final.metrics(), step=len(steps))
    manifest.tracking_uri = uri
    manifest.save(log_dir)
    mirror.upload(run_id, log_dir)
    # A run still marked RUNNING on disk is one whose process died before finishing.
    mirror.end(run_id, manifest.status if manifest.status != runlog.RUNNING else "KILLED")
    return ImportedRun(log_dir=log_dir, run_id=run_id, resumed=resumed, steps_logged=logged)


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
