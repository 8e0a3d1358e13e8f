"""DSPy adapter whose rollouts go through one worker pool, one task per example.

``BatchedAdapter`` subclasses dspy's ``DspyAdapter`` and keeps everything that is
about *what* a rollout means (building the program from a candidate, reflective
datasets, feedback) while replacing *how* rollouts are scheduled:

- every (candidate, example) pair of a gepa batch is one pool task, so a long
  validation and short minibatches share W workers instead of a static split;
- traces are captured only for the parent minibatch evaluations that reflection
  reads, never for children screening or full validation;
- every batch of rollouts is reported with its phase (``StepEvents.evaluated``): a schedule
  that calls the adapter says which phase it is in; in gepa's step loop the adapter follows
  the step (sampling starts screening, selection starts validation) as a step listener;
- proposal generation is handed to :class:`dspy_pxn.reflection.PooledReflection`
  (``propose_new_texts = None`` tells gepa the adapter does not own it), because
  gepa calls an adapter's ``propose_new_texts`` one task at a time.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from dspy.primitives import Example
from dspy.primitives.code_interpreter import CodeInterpreterError
from dspy.teleprompt.gepa.gepa_utils import DspyAdapter
from gepa import EvaluationBatch
from gepa.strategies.proposal_sampling import ProposalTask

from dspy_pxn.events import Phase, StepEvents, StepListener, override
from dspy_pxn.pools import WorkerPool
from dspy_pxn.resume import CHECKPOINT_KEY, Checkpoint
from dspy_pxn.rollout import CandidateRollouts, RolloutResult, candidate_key, check_seed_validation

logger = logging.getLogger(__name__)


class BatchedAdapter(DspyAdapter, StepListener):
    """DspyAdapter with pooled rollouts, trace capture only where reflection needs it."""

    propose_new_texts = None  # type: ignore[assignment]  # see the module docstring

    def __init__(self, *args: Any, pool: WorkerPool, events: StepEvents | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.pool = pool
        self.events = events or StepEvents()
        self._traced_batches: set[tuple[str, tuple[int, ...]]] = set()
        self._step_phase: Phase = "validation"  # gepa's step loop: the seed's validation comes first
        self._replays: dict[tuple[str, tuple[int, ...]], EvaluationBatch] = {}
        self._lock = threading.Lock()
        # Strategy state saved with gepa's own state file (dspy_pxn.resume); None: nothing to save.
        self.checkpoint: Checkpoint | None = None
        # The run's first evaluation (the seed on the valset) shows whether the program and metric work at all.
        self._first_evaluation_checked = False
        self._evaluations = itertools.count()  # each evaluation builds its own program, as dspy.GEPA's does
        self.rollouts = self._rollout_function()

    # Driver-only state: a remote pool ships the adapter (student, metric, proposers) without it.
    _DRIVER_ONLY = ("pool", "events", "_lock", "_replays", "_traced_batches", "_step_phase", "checkpoint", "rollouts",
                    "_evaluations")

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self._DRIVER_ONLY}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, pool=None, events=StepEvents(), _lock=threading.Lock(), _replays={},
                             _traced_batches=set(), _step_phase="validation", checkpoint=None,
                             _evaluations=itertools.count())
        self.rollouts = self._rollout_function()

    def _rollout_function(self) -> CandidateRollouts:
        """One rollout function for the whole run, so a remote pool ships it (and the student) once."""
        # Private in dspy: which components are dspy.Flex code, as dspy's adapter decided it at construction.
        return CandidateRollouts(self.build_program, self.metric_fn, self.failure_score,
                                 code_components=bool(self._flex_paths))

    # -- gepa's adapter-state hook: our strategies' state is pickled with gepa's ----------------
    def get_adapter_state(self) -> dict[str, Any]:
        """dspy's own adapter state (its random generator) and, when set, our strategies' checkpoint."""
        state = dict(super().get_adapter_state())
        if self.checkpoint is not None:
            snapshot, _ = self.checkpoint
            state[CHECKPOINT_KEY] = snapshot()
        return state

    def set_adapter_state(self, state: dict[str, Any]) -> None:
        super().set_adapter_state(state)
        saved = state.get(CHECKPOINT_KEY)
        if self.checkpoint is not None and saved is not None:
            _, restore = self.checkpoint
            restore(saved)

    def replay_once(self, candidate: dict[str, str], batch: Sequence[Example], evaluation: EvaluationBatch) -> None:
        """Answer the next evaluation of (candidate, batch) with ``evaluation`` instead of running it.

        On resume gepa re-evaluates the seed on the valset before it loads its saved state,
        then discards the result; the saved scores answer that call without LM calls.
        """
        with self._lock:
            self._replays[self._batch_key(candidate, batch)] = evaluation

    # -- gepa's step loop, followed as a step listener ------------------------------------
    @override
    def tasks_sampled(self, tasks: Sequence[ProposalTask]) -> None:
        """The step's screening starts; the sampled parents' minibatch evaluations are the ones reflection reads.

        gepa evaluates parents and children of a step through the same ``batch_evaluate(items)`` call
        without saying which is which; the sampled tasks name the parents, so each (parent, minibatch)
        pair is marked here for traces. Each mark is consumed by its first evaluation, so a child
        identical to its parent is not traced.
        """
        self._step_phase = "screening"
        with self._lock:
            self._traced_batches.update(self._batch_key(parent, batch) for parent, batch in unique_minibatches(tasks))

    @override
    def children_screened(self, children: int, improved: int) -> None:
        """The step's selection starts: what gepa evaluates next is validation."""
        self._step_phase = "validation"

    @staticmethod
    def _batch_key(candidate: dict[str, str], batch: Sequence[Example]) -> tuple[str, tuple[int, ...]]:
        return candidate_key(candidate), tuple(id(example) for example in batch)

    def _wants_traces(self, candidate: dict[str, str], batch: Sequence[Example]) -> bool:
        key = self._batch_key(candidate, batch)
        with self._lock:
            if key in self._traced_batches:
                self._traced_batches.discard(key)
                return True
        return False

    def evaluate(self, batch, candidate, capture_traces=False, num_threads=None, *, phase: Phase | None = None):
        """gepa's evaluate; ``phase``: which phase the rollouts belong to (default: the step loop's)."""
        return self._evaluate_many([(candidate, batch, capture_traces)], phase or self._step_phase)[0]

    def batch_evaluate(self, items, *, capture_traces=None, phase: Phase | None = None):
        """Evaluate every (candidate, batch) pair as one flat set of pool tasks."""
        jobs = [
            (candidate, batch, self._wants_traces(candidate, batch) if capture_traces is None else capture_traces)
            for candidate, batch in items
        ]
        return self._evaluate_many(jobs, phase or self._step_phase)

    def _evaluate_many(self, jobs: list[tuple[dict[str, str], Sequence[Example], bool]], phase: Phase
                       ) -> list[EvaluationBatch]:
        with self._lock:
            replayed = [self._replays.pop(self._batch_key(candidate, batch), None) for candidate, batch, _ in jobs]
        if any(r is not None for r in replayed):
            fresh = iter(self._evaluate_many([job for job, r in zip(jobs, replayed, strict=True) if r is None], phase))
            return [r if r is not None else next(fresh) for r in replayed]
        start = time.perf_counter()
        evaluation_ids = [next(self._evaluations) for _ in jobs]
        buildable = [self._builds(candidate, evaluation)
                     for (candidate, _, _), evaluation in zip(jobs, evaluation_ids, strict=True)]
        tasks = [
            (candidate, example, capture, evaluation)
            for builds, evaluation, (candidate, batch, capture) in zip(buildable, evaluation_ids, jobs, strict=True)
            if builds
            for example in batch
        ]
        results = self.pool.map(self.rollouts, tasks)
        if not self._first_evaluation_checked:
            self._first_evaluation_checked = True
            check_seed_validation(results, [example for _, example, _, _ in tasks], self.metric_fn)
        failures = sum(1 for r in results if r.error is not None)
        scored = len(tasks)  # an example of a candidate that cannot be built is scored too: failure_score
        remaining = iter(results)
        evaluations = []
        for builds, (_, batch, capture) in zip(buildable, jobs, strict=True):
            if not builds:
                failures += len(batch)
                scored += len(batch)
                evaluations.append(self.scores_only([None] * len(batch), [] if capture else None))
                continue
            evaluations.append(self._to_evaluation_batch(batch, [next(remaining) for _ in batch], capture))
        self.events.evaluated(phase, time.perf_counter() - start, scored, failures)
        return evaluations

    def _builds(self, candidate: dict[str, str], evaluation: int) -> bool:
        """Build the evaluation's program here, where a candidate that cannot be built is scored as
        failures without a rollout; the pool's workers then use it (or, remote, build their own)."""
        try:
            self.rollouts.program(candidate, evaluation)
        except (SyntaxError, CodeInterpreterError) as error:
            logger.warning("Candidate failed to build (%s); scoring its batch as failures.", error)
            return False
        return True

    def scores_only(self, raw_scores: Sequence[Any], trajectories: list | None = None) -> EvaluationBatch:
        """An evaluation with scores and no outputs: a saved seed validation, or a candidate that cannot be built."""
        return self._evaluation_batch([None] * len(raw_scores), raw_scores, trajectories)

    def _evaluation_batch(self, outputs: list[Any], raw_scores: Sequence[Any], trajectories: list | None
                          ) -> EvaluationBatch:
        # Private in dspy: its one conversion of raw metric results (numbers, or Predictions with a score and
        # objective scores) into gepa's batch, failures scored failure_score. There is no public way.
        return self._make_evaluation_batch(outputs=outputs, raw_scores=list(raw_scores), trajectories=trajectories)

    def _to_evaluation_batch(self, batch: Sequence[Example], results: list[RolloutResult], capture: bool) -> EvaluationBatch:
        trajectories = None
        if capture:
            trajectories = [
                {"example_ind": index, "example": example, "prediction": r.prediction, "trace": r.trace, "score": r.score}
                for index, (example, r) in enumerate(zip(batch, results, strict=True))
                if r.trace is not None
            ]
        return self._evaluation_batch([r.prediction for r in results], [r.score for r in results], trajectories)


def unique_minibatches(tasks: Sequence[ProposalTask]) -> list[tuple[dict[str, str], list]]:
    """The (parent, minibatch) pairs gepa will evaluate with traces, deduplicated as gepa does."""
    seen: dict[tuple[int, tuple], tuple[dict[str, str], list]] = {}
    for task in tasks:
        seen.setdefault((task.parent_idx, tuple(task.minibatch_ids)), (task.parent_candidate, task.minibatch))
    return list(seen.values())
