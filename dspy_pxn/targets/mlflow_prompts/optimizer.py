"""``BatchedGepaPromptOptimizer``: P×N GEPA behind ``mlflow.genai.optimize_prompts``; a user changes only ``optimizer=``.

    mlflow.genai.optimize_prompts(predict_fn=..., train_data=..., prompt_uris=[...], scorers=[...],
                                  optimizer=BatchedGepaPromptOptimizer(reflection_model="openai:/gpt-5-mini",
                                                                       max_metric_calls=300))

It runs the engine ``BatchedGEPA`` runs (``dspy_pxn.engine.run``: the budget guard, the pool, P×N proposals,
the asynchronous schedule, the sibling merge and gepa's crossover), with MLflow prompt templates as its
target (``target.PromptTarget``). MLflow's ``eval_fn`` is not thread-safe, so rows are evaluated by
``ConcurrentEvaluation`` (the same predict_fn and scorers; each row sees its own candidate); when its
self-test fails on this MLflow, candidates go through MLflow's ``eval_fn`` one at a time, with a warning.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import nullcontext
from dataclasses import replace
from typing import Any, Literal

import dspy

from dspy_pxn import checks
from dspy_pxn.engine.run import Run
from dspy_pxn.engine.width import PROMPT_VALIDATION_WINDOWS, REFLECTION_EXAMPLES, auto_parents
from dspy_pxn.ledger.budget import RunShape
from dspy_pxn.schedules import search
from dspy_pxn.settings import Settings
from dspy_pxn.targets.mlflow_prompts.evaluation import ConcurrentEvaluation, EvalFn, self_test, serial_fallback_warning
from dspy_pxn.targets.mlflow_prompts.run_log import PromptRunLog
from dspy_pxn.targets.mlflow_prompts.target import PromptTarget
from dspy_pxn.teleprompter import DEFAULTS

logger = logging.getLogger(__name__)

# gepa.optimize's arguments (MLflow's ``gepa_kwargs``) that are BatchedGEPA's under the same meaning.
GEPA_TO_OURS = {"seed": "seed", "reflection_minibatch_size": "reflection_minibatch_size",
                "candidate_selection_strategy": "candidate_selection_strategy", "use_merge": "use_merge",
                "max_merge_invocations": "max_merge_invocations", "skip_perfect_score": "skip_perfect_score",
                "perfect_score": "perfect_score", "module_selector": "component_selector"}
# Rows a SQL tracking store serves at once by default (MLflow's SQLAlchemy pool: 5, overflow 10): more traced
# rows in flight wait up to 30 s for a connection.
SQL_POOL_DEFAULTS = {"MLFLOW_SQLALCHEMYSTORE_POOL_SIZE": 5, "MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW": 10}


def _base() -> type:
    from mlflow.genai.optimize.optimizers.base import BasePromptOptimizer

    return BasePromptOptimizer


class BatchedGepaPromptOptimizer(_base()):  # type: ignore[misc]
    """MLflow's GEPA prompt optimizer, P×N wide and exact on its budget.

    Args:
        reflection_model: The reflection LM, as MLflow takes it (``"<provider>:/<model>"``, e.g.
            ``"openai:/gpt-5-mini"``), or a ``dspy.LM``.
        max_metric_calls: The budget: rows evaluated (each one predict_fn call and one scoring), never exceeded.
        display_progress_bar: gepa's progress bar, where gepa's step loop runs (``schedule="steps"``).
        gepa_kwargs: gepa.optimize's arguments, as for MLflow's optimizer: ``seed``, ``reflection_minibatch_size``
            (3 unless given, as gepa.optimize's: the rows each proposal is screened on and reflection reads),
            ``candidate_selection_strategy``, ``use_merge``, ``max_merge_invocations``, ``skip_perfect_score``,
            ``perfect_score``, ``module_selector`` and ``reflection_prompt_template`` keep their meaning; gepa's
            ``callbacks`` and ``stop_callbacks`` are heard; ``max_reflection_cost`` caps the dollars of reflection
            calls (gepa's name for it, as for ``BatchedGEPA``; predict_fn's own LM calls are the user's: the run
            does not see their cost).
        p: Parents per step. Default: one pipeline per row in flight (``num_threads // n``), within what
            leaves the budget ``PROMPT_VALIDATION_WINDOWS`` validation windows. ``"auto"`` is ``BatchedGEPA``'s
            rule (``MIN_VALIDATION_WINDOWS``), which runs narrower at MLflow's budgets.
        n: Mutations per parent.
        num_threads: Rows evaluated at once. Default: MLflow's ``MLFLOW_GENAI_EVAL_MAX_WORKERS`` (its own
            evaluation's width), kept within the SQL store's connections when traces go to one.
        schedule: ``"steps"`` or ``"async"``, as ``BatchedGEPA``'s (default: chosen with the width).
        selection: Which improving children are validated, as ``BatchedGEPA``'s (default: with the width).
        max_wall_s: A deadline for the search, in seconds.
    """

    def __init__(self, reflection_model: str | dspy.BaseLM, max_metric_calls: int = 100,
                 display_progress_bar: bool = False, gepa_kwargs: dict[str, Any] | None = None, *,
                 p: int | Literal["auto"] | None = None, n: int = 1, num_threads: int | None = None,
                 schedule: Literal["steps", "async"] | None = None, selection: Any = None,
                 max_wall_s: float | None = None):
        self.reflection_model = reflection_model
        self.max_metric_calls = max_metric_calls
        self.display_progress_bar = display_progress_bar
        self.gepa_kwargs = dict(gepa_kwargs or {})
        self.reflection_lm = reflection_lm_of(reflection_model)
        checks.positive_int("max_metric_calls", max_metric_calls, "It is the number of rows evaluated, e.g. 300.")
        checks.positive_int("num_threads", num_threads, "It is the number of rows evaluated at once, e.g. 16.",
                            or_none=True)
        self.num_threads = num_threads
        rest = dict(self.gepa_kwargs)
        ours = {GEPA_TO_OURS[key]: rest.pop(key) for key in list(rest) if key in GEPA_TO_OURS}
        # gepa.optimize's own default, what MLflow's optimizer screens on, not BatchedGEPA's wider screening: at
        # MLflow's budgets (a few hundred rows, |val| = the rows) validations are what buy depth, and screening
        # on a quarter of the rows left 2-3 of them: 0.16 below MLflow's final score (benchmark log, "MLflow
        # prompt optimization and its bill").
        ours.setdefault("reflection_minibatch_size", REFLECTION_EXAMPLES)
        self.reflection_prompt_template = rest.pop("reflection_prompt_template", None)
        for key in ("max_metric_calls", "use_mlflow", "reflection_lm"):
            rest.pop(key, None)  # the optimizer's own arguments, or MLflow's
        rest["display_progress_bar"] = display_progress_bar  # gepa's bar, in gepa's step loop
        self.p = p
        self._optimizer_args = dict(n=n, schedule=schedule, selection=selection, max_wall_s=max_wall_s, **ours)
        self._gepa_rest = rest
        # Every argument checked now, before any data; the width (p=None) is known only at optimize().
        self._checked = self._settings(num_threads, 1 if p is None else p)
        self.last_run: dict[str, Any] = {}  # the last optimize's measurements: metric calls, wall, steps, ...

    def _settings(self, num_threads: int | None, p: int | str) -> Settings:
        """The engine's settings, checked as ``BatchedGEPA``'s are (``Settings.of``), from this optimizer's."""
        return Settings.of({**DEFAULTS, "max_metric_calls": self.max_metric_calls, "reflection_lm": self.reflection_lm,
                            "num_threads": num_threads or 1, "tracker": False, "gepa_kwargs": dict(self._gepa_rest),
                            "p": p, **self._optimizer_args})

    def _parents(self, workers: int, rows: int) -> int | str:
        """The optimizer's p, or one pipeline per row in flight within ``PROMPT_VALIDATION_WINDOWS`` windows."""
        if self.p is not None:
            return self.p
        shape = RunShape(workers, self.max_metric_calls, rows, self._checked.reflection_minibatch_size)
        return auto_parents(shape, self._checked.n, windows=PROMPT_VALIDATION_WINDOWS)

    def optimize(self, eval_fn: EvalFn, train_data: list[dict[str, Any]], target_prompts: dict[str, str],
                 enable_tracking: bool = True) -> Any:
        """MLflow's optimizer contract: the best templates, with the seed's and their scores."""
        import mlflow

        if eval_fn is None or not train_data:
            raise checks.ArgumentError("BatchedGepaPromptOptimizer needs train_data and scorers: pass "
                                       "train_data=[{'inputs': ..., 'expectations': ...}, ...] and scorers=[...].")
        evaluation: ConcurrentEvaluation | None = None
        try:
            evaluation = ConcurrentEvaluation.from_eval_fn(eval_fn)
        except Exception as error:  # noqa: BLE001 - reported by the self-test below
            reason: str | None = f"{type(error).__name__}: {error}"
        else:
            reason = self_test(evaluation)
        if reason is not None:
            logger.warning("%s", serial_fallback_warning(reason))
            evaluation = None
        workers = 1 if evaluation is None else rows_in_flight(self.num_threads)
        settings = self._settings(workers, self._parents(workers, len(train_data)))
        active = mlflow.active_run() if enable_tracking else None
        run_log = (PromptRunLog(active.info.run_id, mlflow.get_tracking_uri(), time.time())
                   if active is not None else None)
        target = PromptTarget(dict(target_prompts), eval_fn, evaluation, self.reflection_prompt_template, run_log)
        try:
            if run_log is not None:  # it hears every step's record, as a gepa callback with on_step_record
                settings = replace(settings, callbacks=(*settings.callbacks, run_log))
            try:
                run = Run.prepare(settings, target, train_data, None)
            except checks.BudgetBuysNoValidation as nothing:
                logger.warning("%s", nothing)
                return _unchanged(target_prompts)
            with evaluation.installed() if evaluation is not None else nullcontext(), run.resources() as live:
                gepa_result = search(run, live)
                output = target.result(run, gepa_result, live, run.ended(gepa_result, live))
        finally:
            if run_log is not None:
                run_log.close()
        self.last_run = dict(target.details)
        return output


def reflection_lm_of(reflection_model: Any) -> dspy.BaseLM:
    """A ``dspy.LM`` for MLflow's ``"<provider>:/<model>"`` (as MLflow's GEPA optimizer hands it to gepa:
    ``<provider>/<model>``, through litellm, uncached), or the LM given."""
    if isinstance(reflection_model, dspy.BaseLM):
        return reflection_model
    if not isinstance(reflection_model, str):
        raise checks.ArgumentError(f"reflection_model={reflection_model!r}: pass a model URI such as "
                                   "'openai:/gpt-5-mini', or a dspy.LM.")
    from mlflow.metrics.genai.model_utils import _parse_model_uri

    try:
        provider, model = _parse_model_uri(reflection_model)
    except Exception as error:  # noqa: BLE001 - MLflow's message says the format
        raise checks.ArgumentError(f"reflection_model={reflection_model!r}: {error}") from None
    return dspy.LM(f"{provider}/{model}", cache=False)


def rows_in_flight(num_threads: int | None) -> int:
    """The optimizer's num_threads, or MLflow's evaluation width; within a SQL store's connections when
    traces are written to one (more would wait 30 s for a connection), said once."""
    import mlflow
    from mlflow.environment_variables import MLFLOW_GENAI_EVAL_MAX_WORKERS

    wanted = num_threads or MLFLOW_GENAI_EVAL_MAX_WORKERS.get()
    uri = mlflow.get_tracking_uri()
    from mlflow.tracing.provider import is_tracing_enabled

    if not is_tracing_enabled() or not uri.split(":", 1)[0].split("+", 1)[0] in {"sqlite", "postgresql", "mysql", "mssql"}:
        return wanted
    connections = sum(int(os.environ.get(name, default)) for name, default in SQL_POOL_DEFAULTS.items())
    if wanted > connections:
        logger.warning("num_threads=%d traced rows at once would wait for the SQL tracking store's %d connections "
                       "(%s): evaluating %d rows at once. Raise MLFLOW_SQLALCHEMYSTORE_POOL_SIZE (e.g. to %d) or "
                       "log to a tracking server for more.", wanted, connections, uri, connections, wanted)
        return connections
    return wanted


def _unchanged(target_prompts: dict[str, str]) -> Any:
    from mlflow.genai.optimize.types import PromptOptimizerOutput

    return PromptOptimizerOutput(optimized_prompts=dict(target_prompts))
