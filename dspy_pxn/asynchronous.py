"""``schedule="async"``: proposals flow through the pool with no step barrier.

In gepa's step loop every step waits for its slowest piece: all P·N parent evaluations,
then all reflections, then all child evaluations, then the validations, before the next
step samples anything. With real, variable LM latency the pool idles behind stragglers.
Here ``width`` (= P·N) proposal pipelines are always in flight, each one parent → its
minibatch (traced) → one reflection → the child on the same minibatch. Improving children
queue up; whenever no validation is running, the queued ones go through the run's
selection (all | best | top-k | merge | merge+best) and are validated together, and new
pipelines pick parents from the front as it stands when they start. Reflections run in
the pipelines' own threads, never on a rollout worker, so they cannot starve rollouts.

gepa's ``GEPAState`` is the single record: candidates are added with its own
``update_state_with_new_program``, it is saved (with our strategies' state, through the
adapter-state hook) before each record window, and ``GEPAResult.from_state`` reads it at
the end, exactly as after ``gepa.optimize``. What gepa lacks for this is a scheduler seam:
its engine owns the loop, so this module drives the state with gepa's components
(candidate selector, batch sampler, component selector, acceptance, adapter) instead.

The budget is exact: a pipeline reserves its 2·m screening calls when it starts and the
run always keeps |val| calls beyond every reservation, so the validation of whatever
improves can be paid for; a validation reserves |val| per candidate before it starts.

One StepRecord is written per *record window*: from the end of one validation to the end
of the next (or the run). It counts the proposals that finished in it, so the step log,
MLflow curves and the runtime model read async runs like step runs. Async runs are not
bit-reproducible: which pipeline finishes first depends on latency.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from gepa.core.callbacks import notify_callbacks
from gepa.core.data_loader import DataLoader
from gepa.core.state import GEPAState, ValsetEvaluation, initialize_gepa_state
from gepa.proposer.base import CandidateProposal
from gepa.strategies.acceptance import StrictImprovementAcceptance
from gepa.strategies.proposal_sampling import ProposalTask

from dspy_pxn.adapter import BatchedAdapter
from dspy_pxn.budget import BudgetGuard
from dspy_pxn.events import StepEvents
from dspy_pxn.reflection import PooledReflection
from dspy_pxn.steps import StepRecorder

logger = logging.getLogger(__name__)


@dataclass
class _Done:
    """A finished pipeline: its proposal (None when it proposed nothing) and whether it improved."""

    proposal: CandidateProposal | None
    improved: bool


class _ReservedBudget:
    """The state as a validation's budget-capped selection must see it: only the calls it reserved are left."""

    def __init__(self, state: GEPAState, budget: int, reserved_for_it: int):
        self._state = state
        self.total_num_evals = budget - reserved_for_it

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)


class AsyncSchedule:
    """Runs a BatchedGEPA search with ``width`` proposals in flight; returns gepa's state."""

    def __init__(
        self,
        *,
        adapter: BatchedAdapter,
        reflection: PooledReflection,
        selection: Any,  # BudgetCappedSelection over the run's selection
        guard: BudgetGuard,
        sampler: Any,
        candidate_selector: Any,
        component_selector: Any,
        trainset: DataLoader,
        valset: DataLoader,
        width: int,
        events: StepEvents,
        recorder: StepRecorder,
        most_validated: Callable[[int], int],
        callbacks: Sequence[Any],
        run_dir: str | None,
        skip_perfect_score: bool,
        perfect_score: float | None,
        track_best_outputs: bool,
        use_cloudpickle: bool,
    ):
        self.adapter, self.reflection, self.selection, self.guard = adapter, reflection, selection, guard
        self.sampler, self.candidate_selector, self.component_selector = sampler, candidate_selector, component_selector
        self.trainset, self.valset, self.width = trainset, valset, width
        # The recorder first, as in gepa's engine: every callback hears what gepa's own loop would tell it.
        self.events, self.recorder, self.callbacks = events, recorder, [recorder, *callbacks]
        self.most_validated = most_validated  # the selection's bound: how many of n improvers it may validate
        self.run_dir, self.skip_perfect_score, self.perfect_score = run_dir, skip_perfect_score, perfect_score
        self.track_best_outputs, self.use_cloudpickle = track_best_outputs, use_cloudpickle
        self.acceptance = StrictImprovementAcceptance()
        # Every read or write of the state and the reservations; events are heard under it too, so a
        # screening's rollouts and its metric calls always land in the same record window.
        self.lock = threading.RLock()
        events.add(self)
        events.serialize_with(self.lock)
        self.reserved = 0  # metric calls promised to work in flight, not yet counted in the state
        self.state: GEPAState | None = None

    # ------------------------------------------------------------------------------ run
    def run(self, seed_candidate: dict[str, str]) -> GEPAState:
        notify_callbacks(self.callbacks, "on_optimization_start", {
            "seed_candidate": seed_candidate, "trainset_size": len(self.trainset), "valset_size": len(self.valset),
            "config": {"schedule": "async", "width": self.width},
        })
        state = self.state = self._initial_state(seed_candidate)
        pipelines = ThreadPoolExecutor(max_workers=self.width, thread_name_prefix="dspy-pxn-proposal")
        validator = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dspy-pxn-validation")
        in_flight: dict[Future, str] = {}
        queued: list[CandidateProposal] = []
        error: BaseException | None = None
        self._open_window()
        try:
            while True:
                if error is None:
                    self._launch(pipelines, in_flight)
                    if queued and "validation" not in in_flight.values():
                        batch, queued = queued, []
                        self._start_validation(validator, in_flight, batch)
                if not in_flight:
                    if queued and error is None:
                        continue
                    break
                done, _ = wait(list(in_flight), return_when=FIRST_COMPLETED)
                for future in done:
                    kind = in_flight.pop(future)
                    try:
                        outcome = future.result()
                    except BaseException as failure:  # noqa: BLE001 - stop launching, drain, then raise
                        error = error or failure
                        continue
                    if kind == "proposal":
                        queued += self._finished_proposal(outcome)
                    else:
                        self._finished_validation(*outcome)
        finally:
            pipelines.shutdown(wait=True)
            validator.shutdown(wait=True)
            self._close_window()
            self._save()
        if error is not None:
            raise error
        notify_callbacks(self.callbacks, "on_optimization_end", {
            "best_candidate_idx": max(range(len(state.program_candidates)),
                                      key=lambda i: state.program_full_scores_val_set[i]),
            "total_iterations": state.i, "total_metric_calls": state.total_num_evals, "final_state": state,
        })
        return state

    def _initial_state(self, seed_candidate: dict[str, str]) -> GEPAState:
        ids = list(self.valset.all_ids())
        evaluation = self.adapter.evaluate(self.valset.fetch(ids), seed_candidate, capture_traces=False)
        state = initialize_gepa_state(
            run_dir=self.run_dir, logger=_GepaLog(), seed_candidate=seed_candidate,
            seed_valset_evaluation=_valset_evaluation(ids, evaluation), track_best_outputs=self.track_best_outputs,
        )
        setter = getattr(self.adapter, "set_adapter_state", None)
        if setter is not None:
            setter(state.adapter_state)
        scores = state.prog_candidate_val_subscores[0]
        notify_callbacks(self.callbacks, "on_valset_evaluated", {
            "iteration": 0, "candidate_idx": 0, "candidate": seed_candidate, "scores_by_val_id": dict(scores),
            "average_score": state.program_full_scores_val_set[0], "num_examples_evaluated": len(scores),
            "total_valset_size": len(ids), "parent_ids": [], "is_best_program": True, "outputs_by_val_id": None,
        })
        return state

    # ------------------------------------------------------------------------------ proposals
    def _can_launch(self) -> bool:
        """Room for one more pipeline's screening while |val| stays free for a validation."""
        m, val = self.guard.minibatch_size, self.guard.valset_size
        remaining = self.guard.max_metric_calls - self.state.total_num_evals - self.reserved
        return remaining >= 2 * m + val

    def _launch(self, executor: ThreadPoolExecutor, in_flight: dict[Future, str]) -> None:
        while sum(kind == "proposal" for kind in in_flight.values()) < self.width:
            with self.lock:
                if not self._can_launch():
                    return
                state = self.state
                parent = self.candidate_selector.select_candidate_idx(state)
                ids = self.sampler.next_minibatch_ids(self.trainset, state)
                task = ProposalTask(parent, state.program_candidates[parent], ids, self.trainset.fetch(ids))
                self.reserved += 2 * len(ids)
            self.events.tasks_sampled([task])
            in_flight[executor.submit(contextvars.copy_context().run, self._pipeline, task)] = "proposal"

    def _pipeline(self, task: ProposalTask) -> _Done:
        """Parent on its minibatch (traced), one reflection, the child on the same minibatch."""
        size = len(task.minibatch)
        self.events.phase.set("screening")
        before = self.adapter.evaluate(task.minibatch, task.parent_candidate, capture_traces=True)
        perfect = self.skip_perfect_score and self.perfect_score is not None and all(
            s is not None and s >= self.perfect_score for s in before.scores)
        if perfect or not before.trajectories:
            self._release(size)
            return _Done(None, False)
        with self.lock:
            components = self.component_selector(self.state, before.trajectories, before.scores, task.parent_idx,
                                                 task.parent_candidate)
        try:
            dataset = self.adapter.make_reflective_dataset(task.parent_candidate, before, components)
        except Exception as error:  # noqa: BLE001 - as gepa: a task whose dataset cannot be built is skipped
            logger.info("No reflective dataset for parent %d: %s", task.parent_idx, error)
            self._release(size)
            return _Done(None, False)
        reflected = self.reflection.propose((task.parent_candidate, dataset, components))
        if not reflected.new_texts:
            self._release(size)
            return _Done(None, False)
        child = {**task.parent_candidate, **reflected.new_texts}
        self.events.phase.set("screening")
        after = self.adapter.evaluate(task.minibatch, child, capture_traces=False)
        proposal = CandidateProposal(
            candidate=child, parent_program_ids=[task.parent_idx], subsample_indices=list(task.minibatch_ids),
            subsample_scores_before=list(before.scores), subsample_scores_after=list(after.scores),
            tag="reflective_mutation", metadata=dict(reflected.metadata),
        )
        with self.lock:
            improved = self.acceptance.should_accept(proposal, self.state)
        return _Done(proposal, improved)

    def evaluated(self, seconds: float, rollouts: int, failures: int, phase: str) -> None:
        """A pipeline's screening rollouts are spent (heard under the lock, beside the recorder's count);
        validations are counted where they enter the state."""
        if phase == "screening":
            self.state.increment_evals(rollouts)
            self.reserved -= rollouts

    def _release(self, calls: int) -> None:
        with self.lock:
            self.reserved -= calls

    def _finished_proposal(self, done: _Done) -> list[CandidateProposal]:
        if done.proposal is None:
            return []
        if done.improved:
            return [done.proposal]
        self._rejected(done.proposal, "no improvement on the minibatch")
        return []

    def _rejected(self, proposal: CandidateProposal, reason: str) -> None:
        notify_callbacks(self.callbacks, "on_candidate_rejected", {
            "iteration": self.state.i, "old_score": sum(proposal.subsample_scores_before or ()),
            "new_score": sum(proposal.subsample_scores_after or ()), "reason": reason})

    # ------------------------------------------------------------------------------ validation
    def _start_validation(self, executor: ThreadPoolExecutor, in_flight: dict[Future, str],
                          batch: list[CandidateProposal]) -> None:
        """Reserve the validations the selection may ask for, then select and validate off the driver thread
        (a merge's reflection call must not hold up the pipelines)."""
        val = self.guard.valset_size
        with self.lock:
            free = self.guard.max_metric_calls - self.state.total_num_evals - self.reserved
            room = min(self.most_validated(len(batch)), free // val)
            self.reserved += room * val
        self.events.children_screened(len(batch))
        in_flight[executor.submit(contextvars.copy_context().run, self._validate, batch, room)] = "validation"

    def _validate(self, batch: list[CandidateProposal], room: int
                  ) -> tuple[list[CandidateProposal], list[Any], list[CandidateProposal]]:
        self.events.phase.set("validation")
        view = _ReservedBudget(self.state, self.guard.max_metric_calls, room * self.guard.valset_size)
        selected = self.selection.select(batch, view, self.acceptance) if room else []
        with self.lock:
            self.reserved -= (room - len(selected)) * self.guard.valset_size
        ids = list(self.valset.all_ids())
        examples = self.valset.fetch(ids)
        evaluations = self.adapter.batch_evaluate([(p.candidate, examples) for p in selected], capture_traces=False)
        chosen = {id(p) for p in selected}
        return selected, [_valset_evaluation(ids, e) for e in evaluations], [p for p in batch if id(p) not in chosen]

    def _finished_validation(self, selected: list[CandidateProposal], evaluations: list[ValsetEvaluation],
                             dropped: list[CandidateProposal]) -> None:
        for proposal in dropped:
            self._rejected(proposal, "not selected for validation")
        if not selected:
            return
        with self.lock:
            state = self.state
            for proposal, evaluation in zip(selected, evaluations, strict=True):
                discovered_at = state.total_num_evals
                calls = len(evaluation.scores_by_val_id)
                state.increment_evals(calls)
                self.reserved -= self.guard.valset_size
                state.num_full_ds_evals += 1
                index = state.update_state_with_new_program(
                    parent_program_idx=proposal.parent_program_ids, new_program=proposal.candidate,
                    valset_evaluation=evaluation, run_dir=self.run_dir,
                    num_metric_calls_by_discovery_of_new_program=discovered_at,
                )
                score = state.program_full_scores_val_set[index]
                parents = list(proposal.parent_program_ids)
                notify_callbacks(self.callbacks, "on_valset_evaluated", {
                    "iteration": state.i, "candidate_idx": index, "candidate": proposal.candidate,
                    "scores_by_val_id": dict(evaluation.scores_by_val_id), "average_score": score,
                    "num_examples_evaluated": calls, "total_valset_size": self.guard.valset_size,
                    "parent_ids": parents, "is_best_program": score >= max(state.program_full_scores_val_set),
                    "outputs_by_val_id": None,
                })
                notify_callbacks(self.callbacks, "on_candidate_accepted", {
                    "iteration": state.i, "new_candidate_idx": index, "new_score": score, "parent_ids": parents,
                })
            self._accepted_in_window = True
            # One window ends where the next begins, with no rollout landing in between and in neither.
            self._close_window()
            self._open_window()

    # ------------------------------------------------------------------------------ record windows
    def _open_window(self) -> None:
        """As gepa's engine starts an iteration: save the state, count the iteration, reset the recorder."""
        with self.lock:
            self._save()
            self.state.i += 1
            self.state.full_program_trace.append({"i": self.state.i, "schedule": "async"})
            notify_callbacks(self.callbacks, "on_iteration_start", {
                "iteration": self.state.i, "state": self.state, "trainset_loader": self.trainset})
            self._window_open, self._accepted_in_window = True, False

    def _close_window(self) -> None:
        """Write the window's StepRecord; a window in which nothing happened is taken back."""
        if not getattr(self, "_window_open", False):
            return
        with self.lock:
            self._window_open = False
            event = {"iteration": self.state.i, "state": self.state, "proposal_accepted": self._accepted_in_window}
            if self.recorder.window_is_empty():
                # The other callbacks heard this iteration start: they hear it end, with nothing in it.
                notify_callbacks(self.callbacks[1:], "on_iteration_end", event)
                self.state.i -= 1
                self.state.full_program_trace.pop()
                return
            notify_callbacks(self.callbacks, "on_iteration_end", event)

    def _save(self) -> None:
        getter = getattr(self.adapter, "get_adapter_state", None)
        if getter is not None:
            self.state.adapter_state = dict(getter())
        self.state.save(self.run_dir, use_cloudpickle=self.use_cloudpickle)


def _valset_evaluation(ids: list[Any], evaluation: Any) -> ValsetEvaluation:
    objectives = list(evaluation.objective_scores) if evaluation.objective_scores else None
    return ValsetEvaluation(
        outputs_by_val_id=dict(zip(ids, evaluation.outputs, strict=False)),
        scores_by_val_id=dict(zip(ids, evaluation.scores, strict=False)),
        objective_scores_by_val_id=dict(zip(ids, objectives, strict=False)) if objectives else None,
    )


class _GepaLog:
    """gepa's logger protocol, to this module's logger."""

    def log(self, message: str) -> None:
        logger.info(message)
