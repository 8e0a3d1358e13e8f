"""DSPy adapter whose rollouts go through one worker pool, one task per example.

``BatchedAdapter`` keeps everything of dspy's ``DspyAdapter`` that is about *what* a rollout means (building the
program from a candidate, reflective datasets, feedback, dspy's proposers); ``PooledAdapter`` decides *how* rollouts
are scheduled (``dspy_pxn.engine.pooled_adapter``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import dspy
from dspy.primitives import Example
from dspy.primitives.code_interpreter import CodeInterpreterError
from dspy.teleprompt.gepa.gepa_utils import DspyAdapter
from gepa import EvaluationBatch

from dspy_pxn.engine.events import StepEvents
from dspy_pxn.engine.pooled_adapter import PooledAdapter
from dspy_pxn.engine.resume import Checkpoint
from dspy_pxn.pools import WorkerPool
from dspy_pxn.pools.memo import lru_memo
from dspy_pxn.targets.program.rollout import (
    PROGRAMS_KEPT,
    RolloutResult,
    RolloutTask,
    candidate_key,
    check_seed_validation,
    run_rollout,
)

logger = logging.getLogger(__name__)


class BatchedAdapter(PooledAdapter, DspyAdapter):
    """DspyAdapter with pooled rollouts, trace capture only where reflection needs it."""

    _DRIVER_ONLY = (*PooledAdapter._DRIVER_ONLY, "rollouts", "_programs")

    def __init__(self, *args: Any, pool: WorkerPool, events: StepEvents | None = None,
                 reflection_examples: int | None = None, checkpoint: Checkpoint | None = None, **kwargs: Any):
        DspyAdapter.__init__(self, *args, **kwargs)
        self.reflection_examples = reflection_examples  # rows of a screening reflection reads (None: all)
        self.start_pooling(pool, events, checkpoint)
        self._start_rollouts()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._start_rollouts()

    def _start_rollouts(self) -> None:
        """The pool's rollout function is this adapter's ``rollout``: a task names its candidate (a few strings), not a
        built program, so a remote pool ships the adapter (and the student) once per run, and each process builds
        the programs it runs."""
        self._programs = lru_memo(PROGRAMS_KEPT)
        self.rollouts = self.rollout

    def program(self, candidate: dict[str, str], evaluation: int) -> dspy.Module:
        """The evaluation's program, built on first use; a candidate that cannot be built raises. Each evaluation (one
        candidate on one batch) gets its own program, shared by its rollouts, as dspy.GEPA builds one per
        ``DspyAdapter.evaluate`` shared by ``dspy.Evaluate``'s threads: a stateful program sees what it would there."""
        return self._programs((candidate_key(candidate), evaluation), lambda: self.build_program(candidate))

    def rollout(self, task: RolloutTask) -> RolloutResult:
        """One (candidate, example, capture-trace, evaluation) task, run and scored."""
        candidate, example, capture, evaluation = task
        # Private in dspy: which components are dspy.Flex code, as dspy's adapter decided it at construction.
        return run_rollout(self.program(candidate, evaluation), example, self.metric_fn, capture, self.failure_score,
                           bool(self._flex_paths))

    def prepare(self, candidate: dict[str, str], evaluation: int) -> bool:
        """Build the evaluation's program here, where a candidate that cannot be built is scored as
        failures without a rollout; the pool's workers then use it (or, remote, build their own)."""
        try:
            self.program(candidate, evaluation)
        except (SyntaxError, CodeInterpreterError) as error:
            logger.warning("Candidate failed to build (%s); scoring its batch as failures.", error)
            return False
        return True

    def check_first_evaluation(self, results: list[RolloutResult], examples: list[Any]) -> None:
        check_seed_validation(results, examples, self.metric_fn)

    def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: EvaluationBatch,
                                components_to_update: list[str]) -> dict[str, Any]:
        """dspy's reflective dataset, of the rows reflection reads (``for_reflection``)."""
        return DspyAdapter.make_reflective_dataset(self, candidate, self.for_reflection(eval_batch), components_to_update)

    def trajectory_rows(self, evaluation: EvaluationBatch) -> list[int]:
        return [trajectory["example_ind"] for trajectory in evaluation.trajectories or []]

    def propose(self, candidate: dict[str, str], reflective_dataset: Any, components: list[str]) -> dict[str, str]:
        """dspy.GEPA's own proposers (instruction and dspy.Flex code), its prompts and parsing."""
        return DspyAdapter.propose_new_texts(self, candidate, reflective_dataset, components)

    def scores_only(self, raw_scores: Sequence[Any], trajectories: list | None = None) -> EvaluationBatch:
        # Private in dspy: its one conversion of raw metric results (numbers, or Predictions with a score and
        # objective scores) into gepa's batch, failures scored failure_score. There is no public way.
        return self._make_evaluation_batch(outputs=[None] * len(raw_scores), raw_scores=list(raw_scores),
                                           trajectories=trajectories)

    def to_evaluation_batch(self, candidate: dict[str, str], batch: Sequence[Example], results: list[RolloutResult],
                            capture: bool) -> EvaluationBatch:
        trajectories = None
        if capture:
            trajectories = [
                {"example_ind": index, "example": example, "prediction": r.prediction, "trace": r.trace, "score": r.score}
                for index, (example, r) in enumerate(zip(batch, results, strict=True))
                if r.trace is not None
            ]
        return self._make_evaluation_batch(outputs=[r.prediction for r in results],
                                           raw_scores=[r.score for r in results], trajectories=trajectories)
