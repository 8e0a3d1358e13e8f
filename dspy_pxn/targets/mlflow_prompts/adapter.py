"""MLflow prompt templates as gepa candidates on the engine's pool: one task per (candidate, row).

``PromptAdapter`` is the *what* of a rollout for ``mlflow.genai.optimize_prompts`` (the *how* is
``dspy_pxn.engine.pooled_adapter.PooledAdapter``'s, as for a DSPy program): a row runs MLflow's
predict_fn under the candidate's templates and is scored by the user's scorers
(``ConcurrentEvaluation.evaluate_row``), and its ``EvaluationResultRecord`` is what gepa keeps
and reflects on, in the shape MLflow's own GEPA optimizer gives its reflection (the row's inputs,
outputs, expectations, the scorers' rationales and the trace's spans). Reflection is gepa's own
default (``StatelessReflectionLM``: its instruction-proposal prompt, one LM call per component),
as MLflow's GEPA optimizer runs it, asked of the reflection LM the run's context holds.

When the self-test of MLflow's internals fails, ``SerialPromptAdapter`` evaluates through MLflow's
own ``eval_fn``: one candidate at a time (its rows in MLflow's own pool), never two at once.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import dspy
from gepa import EvaluationBatch
from gepa.proposer.reflective_mutation.reflection_lm import StatelessReflectionLM

from dspy_pxn import checks
from dspy_pxn.engine.events import StepEvents
from dspy_pxn.engine.pooled_adapter import PooledAdapter, Task
from dspy_pxn.engine.resume import Checkpoint
from dspy_pxn.pools import WorkerPool
from dspy_pxn.proposer.reflection import first_text
from dspy_pxn.targets.mlflow_prompts.evaluation import ConcurrentEvaluation, EvalFn, warn_unread
from dspy_pxn.targets.program.rollout import METRIC_PROBLEM, RolloutResult

logger = logging.getLogger(__name__)

# The seed's validation rows whose predict_fn must raise (at least this share) for the run to stop: a
# predict_fn that fails nearly everywhere is broken, and no template can fix it.
BROKEN_PREDICT_SHARE = 0.9


class PromptRollouts:
    """The pool's rollout function: one row under one candidate, scored; never raises."""

    def __init__(self, evaluation: ConcurrentEvaluation, failure_score: float, callbacks: list[Any] | None = None):
        self.evaluation, self.failure_score = evaluation, failure_score
        self.callbacks = callbacks  # DSPy's callbacks for a row (MLflow's autologging among them); None: as they are
        self.read: set[str] = set()  # the prompt names predict_fn has read so far, in any row
        self._read_lock = threading.Lock()

    def __call__(self, task: Task) -> RolloutResult:
        candidate, row, _, _ = task
        try:
            with dspy.context(callbacks=self.callbacks) if self.callbacks is not None else nullcontext():
                outcome = self.evaluation.evaluate_row(candidate, row)
        except Exception as error:  # noqa: BLE001 - a scorer that raises scores the row as a failure
            checks.warn_once_per_metric(self.evaluation, "raised", "A scorer raised on a row (inputs %s); scoring "
                                        "it %s: %s: %s", row.get("inputs"), self.failure_score,
                                        type(error).__name__, error)
            return RolloutResult(None, self.failure_score, None, f"{METRIC_PROBLEM}{type(error).__name__}: {error}")
        with self._read_lock:
            self.read |= outcome.used
        record = outcome.record
        error = outcome.predict_error
        return RolloutResult(record, record.score, None,
                             error=f"{type(error).__name__}: {error}" if error is not None else None,
                             raised=error, where=None if error is None else "predict_fn")


class PromptAdapter(PooledAdapter):
    """gepa adapter for MLflow prompt templates, its rows on the engine's pool."""

    MERGE_FORMATS = ("plain", "dspy")  # its reflection is gepa's plain-text prompt (``propose``)

    def __init__(self, rollouts: Callable[[Task], RolloutResult], *, val_size: int, failure_score: float,
                 pool: WorkerPool, events: StepEvents | None = None, reflection_prompt_template: Any = None,
                 on_validated: Callable[[dict[str, str], list[Any]], None] | None = None,
                 prompt_names: Sequence[str] = (), reflection_examples: int | None = None,
                 checkpoint: Checkpoint | None = None):
        self.rollouts = rollouts
        self.reflection_examples = reflection_examples  # rows of a screening reflection reads (None: all)
        self.prompt_names = tuple(prompt_names)  # the seed's prompts, each of which predict_fn should read
        self.val_size, self.failure_score = val_size, failure_score
        self.reflection_prompt_template = reflection_prompt_template
        self.on_validated = on_validated  # hears each full validation's records (``PromptRunLog``)
        self.start_pooling(pool, events, checkpoint)

    # -- what a row means ------------------------------------------------------------------
    def to_evaluation_batch(self, candidate: dict[str, str], batch: Sequence[Any], results: list[RolloutResult],
                            capture: bool) -> EvaluationBatch:
        records = [r.prediction for r in results]
        scores = [self._score(r) for r in results]
        full_validation = not capture and len(batch) == self.val_size  # told apart as MLflow's optimizer does
        if full_validation and self.on_validated is not None and all(record is not None for record in records):
            self.on_validated(candidate, records)
        objective_scores = [dict(getattr(record, "individual_scores", None) or {}) for record in records]
        return EvaluationBatch(
            outputs=[getattr(record, "outputs", None) for record in records], scores=scores,
            trajectories=[(row, record) for row, record in enumerate(records) if record is not None] if capture else None,
            objective_scores=objective_scores if any(objective_scores) else None)

    def _score(self, result: RolloutResult) -> float:
        if result.score is None:
            return self.failure_score
        score, problem = checks.scored(result.score, self)
        return self.failure_score if problem is not None else score

    def scores_only(self, raw_scores: Sequence[Any], trajectories: list | None = None) -> EvaluationBatch:
        scores = [self.failure_score if s is None else float(s) for s in raw_scores]
        return EvaluationBatch(outputs=[None] * len(scores), scores=scores, trajectories=trajectories)

    def check_first_evaluation(self, results: list[RolloutResult], examples: list[Any]) -> None:
        """Stop, rather than search on, when the seed's validation shows predict_fn or the scorers broken."""
        if not results:
            return
        raised = [r for r in results if r.raised is not None]
        if len(raised) >= max(1, math.ceil(BROKEN_PREDICT_SHARE * len(results))):
            error = raised[0].raised
            message = (f"predict_fn raised on {len(raised)} of the {len(results)} training rows with the seed "
                       f"prompts (the first: {raised[0].error}), so it is broken, not its prompt. Fix predict_fn "
                       "(call it on one row's inputs), then run again.")
            raise RuntimeError(message) from error
        if all(r.prediction is None or r.prediction.score is None for r in results):
            raise ValueError(f"The scorers gave no score on any of the {len(results)} rows (first: "
                             f"{results[0].error or 'score None'}). Pass scorers= that return a number or a "
                             "Feedback with a value, then run again.")
        # MLflow's own warning, once (its eval_fn says it after every evaluation).
        warn_unread(set(self.prompt_names) - getattr(self.rollouts, "read", set(self.prompt_names)))

    def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: EvaluationBatch,
                                components_to_update: list[str]) -> dict[str, list[dict[str, Any]]]:
        """Each traced row as MLflow's GEPA optimizer shows it to reflection."""
        rows = []
        eval_batch = self.for_reflection(eval_batch)
        for index, ((_, record), score) in enumerate(zip(eval_batch.trajectories or [], eval_batch.scores,
                                                        strict=False)):
            spans = [{"name": span.name, "inputs": span.inputs, "outputs": span.outputs}
                     for span in (record.trace.data.spans if record.trace else [])]
            rows.append({"trace": spans, "score": score, "inputs": record.inputs, "outputs": record.outputs,
                         "expectations": record.expectations, "rationales": record.rationales, "index": index})
        return {name: [{"component_name": name, **row} for row in rows] for name in components_to_update}

    def trajectory_rows(self, evaluation: EvaluationBatch) -> list[int]:
        return [row for row, _ in evaluation.trajectories or []]

    def propose(self, candidate: dict[str, str], reflective_dataset: Any, components: list[str]) -> dict[str, str]:
        """gepa's default reflection (its prompt and parsing), asked of the LM the context holds."""
        lm = dspy.settings.lm
        proposer = StatelessReflectionLM(lambda prompt: first_text(lm(prompt)[0]), self.reflection_prompt_template)
        proposal, _ = proposer.reflect(candidate, reflective_dataset, components)
        return proposal.new_texts


class SerialPromptAdapter(PromptAdapter):
    """The fallback: MLflow's own ``eval_fn``, one candidate at a time, whatever the schedule asks."""

    def __init__(self, eval_fn: EvalFn, **kwargs: Any):
        super().__init__(rollouts=None, **kwargs)  # type: ignore[arg-type]
        self.eval_fn = eval_fn
        self._one_at_a_time = threading.Lock()

    def run_tasks(self, tasks: list[Task]) -> list[RolloutResult]:
        groups: dict[int, list[Task]] = {}
        for task in tasks:
            groups.setdefault(task[3], []).append(task)
        by_task: dict[int, RolloutResult] = {}
        for group in groups.values():
            candidate = group[0][0]
            with self._one_at_a_time:
                records = self.eval_fn(candidate, [row for _, row, _, _ in group])
            for task, record in zip(group, records, strict=True):
                by_task[id(task)] = RolloutResult(record, record.score, None)
        return [by_task[id(task)] for task in tasks]


