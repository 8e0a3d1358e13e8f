"""DSPy adapter whose rollouts go through one worker pool, one task per example.

``BatchedAdapter`` subclasses dspy's ``DspyAdapter`` and keeps everything that is
about *what* a rollout means (building the program from a candidate, reflective
datasets, feedback, dspy's proposers), while ``PooledAdapter`` decides *how* rollouts
are scheduled (``dspy_pxn.engine.pooled_adapter``: one pool task per example, traces only
where reflection reads them, each batch reported with its phase).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from dspy.primitives import Example
from dspy.primitives.code_interpreter import CodeInterpreterError
from dspy.teleprompt.gepa.gepa_utils import DspyAdapter
from gepa import EvaluationBatch

from dspy_pxn.engine.events import StepEvents
from dspy_pxn.engine.pooled_adapter import PooledAdapter
from dspy_pxn.pools import WorkerPool
from dspy_pxn.targets.program.rollout import CandidateRollouts, RolloutResult, check_seed_validation

logger = logging.getLogger(__name__)


class BatchedAdapter(PooledAdapter, DspyAdapter):
    """DspyAdapter with pooled rollouts, trace capture only where reflection needs it."""

    _DRIVER_ONLY = (*PooledAdapter._DRIVER_ONLY, "rollouts")

    def __init__(self, *args: Any, pool: WorkerPool, events: StepEvents | None = None,
                 reflection_examples: int | None = None, **kwargs: Any):
        DspyAdapter.__init__(self, *args, **kwargs)
        self.reflection_examples = reflection_examples  # rows of a screening reflection reads (None: all)
        self.start_pooling(pool, events)
        self.rollouts = self._rollout_function()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.rollouts = self._rollout_function()

    def _rollout_function(self) -> CandidateRollouts:
        """One rollout function for the whole run, so a remote pool ships it (and the student) once."""
        # Private in dspy: which components are dspy.Flex code, as dspy's adapter decided it at construction.
        return CandidateRollouts(self.build_program, self.metric_fn, self.failure_score,
                                 code_components=bool(self._flex_paths))

    def prepare(self, candidate: dict[str, str], evaluation: int) -> bool:
        """Build the evaluation's program here, where a candidate that cannot be built is scored as
        failures without a rollout; the pool's workers then use it (or, remote, build their own)."""
        try:
            self.rollouts.program(candidate, evaluation)
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
        return self._evaluation_batch([None] * len(raw_scores), raw_scores, trajectories)

    def _evaluation_batch(self, outputs: list[Any], raw_scores: Sequence[Any], trajectories: list | None
                          ) -> EvaluationBatch:
        # Private in dspy: its one conversion of raw metric results (numbers, or Predictions with a score and
        # objective scores) into gepa's batch, failures scored failure_score. There is no public way.
        return self._make_evaluation_batch(outputs=outputs, raw_scores=list(raw_scores), trajectories=trajectories)

    def to_evaluation_batch(self, candidate: dict[str, str], batch: Sequence[Example], results: list[RolloutResult],
                            capture: bool) -> EvaluationBatch:
        trajectories = None
        if capture:
            trajectories = [
                {"example_ind": index, "example": example, "prediction": r.prediction, "trace": r.trace, "score": r.score}
                for index, (example, r) in enumerate(zip(batch, results, strict=True))
                if r.trace is not None
            ]
        return self._evaluation_batch([r.prediction for r in results], [r.score for r in results], trajectories)
