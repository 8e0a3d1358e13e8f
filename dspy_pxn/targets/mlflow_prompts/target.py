"""MLflow prompt templates as what a run optimizes (``dspy_pxn.engine.target``): the engine's second target.

The candidates are MLflow's (prompt name -> template; a chat prompt as its JSON messages), the data is
MLflow's training rows (also the validation rows, as in MLflow's GEPA optimizer), the task LMs are the
user's predict_fn's (not the run's to see: the budget is in metric calls, one per row), and a finished
search returns MLflow's ``PromptOptimizerOutput``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import dspy

from dspy_pxn import checks
from dspy_pxn.engine.events import StepEvents
from dspy_pxn.engine.resume import Checkpoint
from dspy_pxn.engine.target import TargetData, TargetShape
from dspy_pxn.pools import WorkerPool
from dspy_pxn.targets.mlflow_prompts.adapter import PromptAdapter, PromptRollouts, SerialPromptAdapter
from dspy_pxn.targets.mlflow_prompts.evaluation import ConcurrentEvaluation, EvalFn
from dspy_pxn.targets.mlflow_prompts.run_log import PromptRunLog

if TYPE_CHECKING:
    from gepa.core.result import GEPAResult

    from dspy_pxn.engine.run import Live, Run
    from dspy_pxn.settings import Settings

logger = logging.getLogger(__name__)


@dataclass
class PromptTarget:
    """MLflow prompts, evaluated concurrently (``evaluation``) or, when MLflow's internals are not the
    ones tested, through MLflow's own ``eval_fn`` one candidate at a time."""

    seed_candidate: dict[str, str]
    eval_fn: EvalFn
    evaluation: ConcurrentEvaluation | None  # None: the serial fallback
    reflection_prompt_template: Any = None
    run_log: PromptRunLog | None = None
    code_components: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)  # the last run's measurements (``result``)
    val_size: int = 0  # the validation rows (the training rows): set by ``prepare``
    row_callbacks: list[Any] = field(default_factory=list)  # DSPy's callbacks as the search began (``around_search``)

    def prepare(self, settings: Settings, trainset: Any, valset: Any, testset: Any) -> TargetData:
        """The training rows, which are also the validation rows (MLflow checked them, predict_fn and the scorers
        before ``optimize``). No LM of the task is the run's: predict_fn's LMs are the user's; the run hears the
        reflection LM only."""
        rows = list(trainset or [])
        if not rows:
            raise checks.ArgumentError("train_data is empty: BatchedGepaPromptOptimizer needs training rows "
                                       "(each with 'inputs', and 'expectations' or 'outputs').")
        bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict) or "inputs" not in row), None)
        if bad is not None:
            raise checks.ArgumentError(f"train_data row {bad} has no 'inputs': each row is a dict with 'inputs' "
                                       "(and 'expectations'), as mlflow.genai.optimize_prompts passes them.")
        self.val_size = len(rows)
        inputs = rows[0].get("inputs")
        shape = TargetShape(name="mlflow prompts", components=len(self.seed_candidate), task_lms=(),
                            input_example=dict(inputs) if isinstance(inputs, dict) else {"inputs": inputs})
        return TargetData(rows, rows, None, shape, lms=())

    @contextmanager
    def around_search(self) -> Iterator[None]:
        """Rows are traced, as MLflow's evaluation traces them (reflection reads their spans); the search's own
        LM calls (reflections, sibling merges) are not, as MLflow's GEPA optimizer's reflections (litellm, not
        DSPy) are not: MLflow's DSPy autologging callback is left out of the search's context, and each row
        puts it back (``PromptRollouts``)."""
        callbacks = list(dspy.settings.get("callbacks") or [])
        self.row_callbacks = callbacks
        with dspy.context(callbacks=[c for c in callbacks if not type(c).__module__.startswith("mlflow.")]):
            yield

    def adapter(self, settings: Settings, pool: WorkerPool, events: StepEvents, reflection_examples: int,
                checkpoint: Checkpoint) -> PromptAdapter:
        options: dict[str, Any] = {
            "val_size": self.val_size, "failure_score": settings.failure_score, "pool": pool, "events": events,
            "reflection_examples": reflection_examples, "checkpoint": checkpoint,
            "reflection_prompt_template": self.reflection_prompt_template,
            "on_validated": self.run_log.validated if self.run_log is not None else None,
            "prompt_names": tuple(self.seed_candidate)}
        if self.evaluation is None:
            return SerialPromptAdapter(self.eval_fn, **options)
        return PromptAdapter(PromptRollouts(self.evaluation, settings.failure_score, self.row_callbacks), **options)

    def result(self, run: Run, gepa_result: GEPAResult, live: Live, stopped_by: str) -> Any:
        """MLflow's ``PromptOptimizerOutput``: the best candidate, the seed's and the best's scores (per scorer
        too, from gepa's objective scores), as MLflow's GEPA optimizer reports them."""
        from mlflow.genai.optimize.types import PromptOptimizerOutput

        scores = list(gepa_result.val_aggregate_scores)
        best = gepa_result.best_idx
        subscores = list(getattr(gepa_result, "val_aggregate_subscores", None) or [])
        self.details = {"metric_calls": gepa_result.total_metric_calls, "budget": run.shape.budget,
                        "candidates": len(gepa_result.candidates), "steps": len(live.recorder.steps),
                        "wall_s": live.ledger.elapsed(), "stopped_by": stopped_by, "p": run.p, "n": run.n,
                        "minibatch": run.minibatch_size, "schedule": run.schedule, "num_workers": live.pool.num_workers,
                        "best_idx": best, "val_aggregate_scores": scores}
        return PromptOptimizerOutput(
            optimized_prompts=dict(gepa_result.best_candidate),
            initial_eval_score=scores[0] if scores else None,
            final_eval_score=scores[best] if scores else None,
            initial_eval_score_per_scorer=dict(subscores[0] or {}) if subscores else {},
            final_eval_score_per_scorer=dict(subscores[best] or {}) if len(subscores) > best else {},
        )
