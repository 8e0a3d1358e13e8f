"""How a gepa adapter's rollouts are scheduled: one pool task per (candidate, example), whatever the adapter.

gepa hands an adapter a batch and a candidate at a time (``evaluate``) and, from a P×N step, many at once
(``batch_evaluate``). ``PooledAdapter`` is the half of an adapter that decides *how* they run, for every kind of
candidate (``dspy_pxn.targets.program.adapter``, ``dspy_pxn.targets.mlflow_prompts.adapter``):

- every (candidate, example) pair is one pool task, so a long validation and short minibatches share W workers;
- traces are captured only for the parent minibatch evaluations that reflection reads;
- every batch of rollouts is reported with its phase (``StepEvents.evaluated``): a schedule names it; in gepa's step
  loop, which does not, the step loop's sampling tells the adapter a step's screening starts (``screening``) and its
  selection that validation does (``validating``);
- a resumed run's saved seed scores answer the seed's re-validation (``replay_once``), and the strategies'
  checkpoint rides in gepa's adapter state.

The other half, *what* a rollout means, is the subclass's: its picklable ``rollouts`` function (one task -> a
``RolloutResult``), ``prepare``, ``to_evaluation_batch``, ``scores_only`` and ``propose``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from gepa import EvaluationBatch
from gepa.strategies.proposal_sampling import ProposalTask

from dspy_pxn.engine.events import Phase, StepEvents
from dspy_pxn.engine.resume import CHECKPOINT_KEY, Checkpoint
from dspy_pxn.pools import WorkerPool
from dspy_pxn.targets.program.rollout import RolloutResult, candidate_key

# One rollout task: (candidate, example, capture the trace, the evaluation it belongs to).
Task = tuple[dict[str, str], Any, bool, int]


class PooledAdapter:
    """The scheduling half of a gepa adapter; subclasses say what one rollout is."""

    propose_new_texts = None  # gepa calls an adapter's proposer one task at a time: PooledReflection owns it

    rollouts: Callable[[Task], RolloutResult]  # picklable: a remote pool ships it once per run
    # The reply formats a sibling merge is asked in, in turn (dspy_pxn.proposer.sibling_merge): the one this
    # adapter's reflections use first, then the other.
    MERGE_FORMATS: tuple[str, ...] = ("dspy", "plain")

    # Driver-only state: a remote pool ships the adapter without it.
    _DRIVER_ONLY = ("pool", "events", "_lock", "_replays", "_traced_batches", "_step_phase", "checkpoint",
                    "_evaluations", "_first_evaluation_checked")

    def start_pooling(self, pool: WorkerPool | None, events: StepEvents | None,
                      checkpoint: Checkpoint | None = None) -> None:
        self.pool = pool
        self.events = events or StepEvents()
        self._traced_batches: set[tuple[str, tuple[int, ...]]] = set()
        self._step_phase: Phase = "validation"  # gepa's step loop: the seed's validation comes first
        self._replays: dict[tuple[str, tuple[int, ...]], EvaluationBatch] = {}
        self._lock = threading.Lock()
        # Strategy state saved with gepa's own state file (dspy_pxn.engine.resume); None: nothing to save.
        self.checkpoint = checkpoint
        # The run's first evaluation (the seed on the valset) shows whether the program and metric work at all.
        self._first_evaluation_checked = False
        self._evaluations = itertools.count()  # each evaluation is its own (dspy.GEPA builds a program per one)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self._DRIVER_ONLY}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.start_pooling(None, None)

    # -- what a subclass says about its rollouts -------------------------------------------
    def prepare(self, candidate: dict[str, str], evaluation: int) -> bool:
        """Ready the evaluation on the driver; False: the candidate cannot run, its batch scores as failures."""
        return True

    def check_first_evaluation(self, results: list[RolloutResult], examples: list[Any]) -> None:
        """Stop a run whose seed validation shows the task broken (raise), or let it go on."""

    def run_tasks(self, tasks: list[Task]) -> list[RolloutResult]:
        """Every task's result, in order: each one a pool task."""
        return self.pool.map(self.rollouts, tasks)

    def to_evaluation_batch(self, candidate: dict[str, str], batch: Sequence[Any], results: list[RolloutResult],
                            capture: bool) -> EvaluationBatch:
        raise NotImplementedError

    def scores_only(self, raw_scores: Sequence[Any], trajectories: list | None = None) -> EvaluationBatch:
        """An evaluation with scores and no outputs: a saved seed validation, or a candidate that cannot run."""
        raise NotImplementedError

    def propose(self, candidate: dict[str, str], reflective_dataset: Any, components: list[str]) -> dict[str, str]:
        """One reflection job's new texts, asked of the reflection LM in the current DSPy context."""
        raise NotImplementedError

    def trajectory_rows(self, evaluation: EvaluationBatch) -> list[int]:
        """The minibatch row each of ``evaluation.trajectories`` belongs to."""
        raise NotImplementedError

    def for_reflection(self, evaluation: EvaluationBatch) -> EvaluationBatch:
        """The parent's screening as reflection reads it: its ``reflection_examples`` lowest-scoring rows, where the
        minibatch is larger (``dspy_pxn.engine.width.screening_minibatch``); the whole evaluation otherwise."""
        keep = reflection_rows(evaluation.scores, getattr(self, "reflection_examples", None))
        if keep is None or evaluation.trajectories is None:
            return evaluation
        rows = set(keep)
        trajectories = [t for t, row in zip(evaluation.trajectories, self.trajectory_rows(evaluation), strict=True)
                        if row in rows]
        objective = evaluation.objective_scores
        return EvaluationBatch(outputs=[evaluation.outputs[i] for i in keep], scores=[evaluation.scores[i] for i in keep],
                               trajectories=trajectories,
                               objective_scores=[objective[i] for i in keep] if objective is not None else None)

    # -- gepa's adapter-state hook: our strategies' state is pickled with gepa's ----------------
    def get_adapter_state(self) -> dict[str, Any]:
        """The adapter's own state (dspy's random generator, for a program) and, when set, our checkpoint."""
        own = getattr(super(), "get_adapter_state", None)
        state = dict(own() if own is not None else {})
        if self.checkpoint is not None:
            snapshot, _ = self.checkpoint
            state[CHECKPOINT_KEY] = snapshot()
        return state

    def set_adapter_state(self, state: dict[str, Any]) -> None:
        own = getattr(super(), "set_adapter_state", None)
        if own is not None:
            own(state)
        saved = state.get(CHECKPOINT_KEY)
        if self.checkpoint is not None and saved is not None:
            _, restore = self.checkpoint
            restore(saved)

    def replay_once(self, candidate: dict[str, str], batch: Sequence[Any], evaluation: EvaluationBatch) -> None:
        """Answer the next evaluation of (candidate, batch) with ``evaluation`` instead of running it: on resume gepa
        re-evaluates the seed on the valset before it loads its saved state, then discards the result."""
        with self._lock:
            self._replays[self._batch_key(candidate, batch)] = evaluation

    # -- gepa's step loop, told by its sampling and its selection ----------------------------
    def screening(self, tasks: Sequence[ProposalTask]) -> None:
        """The step's screening starts. Reflection reads the sampled parents' minibatch evaluations, which gepa runs in
        the same ``batch_evaluate(items)`` call as the children's without saying which is which: each (parent,
        minibatch) pair the tasks name is marked here for traces (deduplicated as gepa does), and each mark is consumed
        by its first evaluation, so a child identical to its parent is not traced."""
        self._step_phase = "screening"
        pairs: dict[tuple[int, tuple], ProposalTask] = {}
        for task in tasks:
            pairs.setdefault((task.parent_idx, tuple(task.minibatch_ids)), task)
        with self._lock:
            self._traced_batches.update(self._batch_key(t.parent_candidate, t.minibatch) for t in pairs.values())

    def validating(self) -> None:
        """The step's selection starts: what gepa evaluates next is validation."""
        self._step_phase = "validation"

    @staticmethod
    def _batch_key(candidate: dict[str, str], batch: Sequence[Any]) -> tuple[str, tuple[int, ...]]:
        return candidate_key(candidate), tuple(id(example) for example in batch)

    def _wants_traces(self, candidate: dict[str, str], batch: Sequence[Any]) -> bool:
        key = self._batch_key(candidate, batch)
        with self._lock:
            traced = key in self._traced_batches
            self._traced_batches.discard(key)
        return traced

    def evaluate(self, batch, candidate, capture_traces=False, num_threads=None, *, phase: Phase | None = None):
        """gepa's evaluate; ``phase``: which phase the rollouts belong to (default: the step loop's)."""
        return self._evaluate_many([(candidate, batch, capture_traces)], phase or self._step_phase)[0]

    def batch_evaluate(self, items, *, capture_traces=None, phase: Phase | None = None):
        """Evaluate every (candidate, batch) pair as one flat set of pool tasks."""
        jobs = [(candidate, batch, self._wants_traces(candidate, batch) if capture_traces is None else capture_traces)
                for candidate, batch in items]
        return self._evaluate_many(jobs, phase or self._step_phase)

    def _evaluate_many(self, jobs: list[tuple[dict[str, str], Sequence[Any], bool]], phase: Phase
                       ) -> list[EvaluationBatch]:
        with self._lock:
            replayed = [self._replays.pop(self._batch_key(candidate, batch), None) for candidate, batch, _ in jobs]
        if any(r is not None for r in replayed):
            fresh = iter(self._evaluate_many([job for job, r in zip(jobs, replayed, strict=True) if r is None], phase))
            return [r if r is not None else next(fresh) for r in replayed]
        start = time.perf_counter()
        evaluation_ids = [next(self._evaluations) for _ in jobs]
        runnable = [self.prepare(candidate, evaluation)
                    for (candidate, _, _), evaluation in zip(jobs, evaluation_ids, strict=True)]
        tasks: list[Task] = [
            (candidate, example, capture, evaluation)
            for runs, evaluation, (candidate, batch, capture) in zip(runnable, evaluation_ids, jobs, strict=True)
            if runs
            for example in batch
        ]
        results = self.run_tasks(tasks)
        if not self._first_evaluation_checked:
            self._first_evaluation_checked = True
            self.check_first_evaluation(results, [example for _, example, _, _ in tasks])
        remaining = iter(results)
        evaluations = [self.to_evaluation_batch(candidate, batch, [next(remaining) for _ in batch], capture) if runs
                       else self.scores_only([None] * len(batch), [] if capture else None)
                       for runs, (candidate, batch, capture) in zip(runnable, jobs, strict=True)]
        # An example of a candidate that cannot run is scored too (failure_score): a failure.
        unrunnable = sum(len(batch) for runs, (_, batch, _) in zip(runnable, jobs, strict=True) if not runs)
        self.events.evaluated(phase, time.perf_counter() - start, len(tasks) + unrunnable,
                              sum(r.error is not None for r in results) + unrunnable)
        return evaluations


def reflection_rows(scores: Sequence[float], size: int | None) -> list[int] | None:
    """The ``size`` lowest-scoring rows (ties: the earlier row), in their order; None when all of them are read. The
    failures are where a metric's feedback says what to change; a row the parent already gets right mostly tells the
    reflection to keep what it has, which the instruction itself already shows."""
    if size is None or len(scores) <= size:
        return None
    return sorted(sorted(range(len(scores)), key=lambda row: (scores[row], row))[:size])
