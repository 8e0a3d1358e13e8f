"""gepa's engine's bookkeeping, for the asynchronous schedule: the state, its windows, and what callbacks hear.

gepa's ``GEPAEngine.run`` owns its loop, and with it the chores around each iteration: starting and ending it, saving
the state, letting validated candidates join it, and announcing all of that to gepa's callbacks (the MLflow tracker,
a user's callbacks, the lineage table). The asynchronous schedule has *windows* instead, the work that finished
between the end of one validation and the end of the next; ``Windows`` does those chores for them.

A window begins with its first step event, so none is empty, and that is when gepa's iteration number (``state.i``,
a resumed run's included) is counted; one StepRecord is written per window. Every announcement is made with gepa's
own event types, under the schedule's lock: callbacks never run concurrently.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dspy.teleprompt.gepa.gepa_utils import LoggerAdapter
from gepa.core.callbacks import (
    BudgetUpdatedEvent,
    CandidateAcceptedEvent,
    CandidateRejectedEvent,
    IterationEndEvent,
    IterationStartEvent,
    MergeAcceptedEvent,
    MergeAttemptedEvent,
    MergeRejectedEvent,
    OptimizationEndEvent,
    OptimizationStartEvent,
    ParetoFrontUpdatedEvent,
    StateSavedEvent,
    ValsetEvaluatedEvent,
    notify_callbacks,
)
from gepa.core.data_loader import DataLoader
from gepa.core.state import GEPAState, ValsetEvaluation, initialize_gepa_state
from gepa.proposer.base import CandidateProposal

from dspy_pxn.engine.candidates import FULL_EVALUATION, best_program
from dspy_pxn.engine.events import Phase, StepEvents, StepListener, override
from dspy_pxn.engine.pooled_adapter import PooledAdapter
from dspy_pxn.engine.records import StepRecorder
from dspy_pxn.ledger.budget import BudgetGuard
from dspy_pxn.ledger.caps import seed_validation_paid
from dspy_pxn.settings import Settings

logger = logging.getLogger(__name__)

MERGE_TAG = "merge"  # gepa's tag on a crossover's proposal


@dataclass
class Validated:
    """A validation's outcome: the candidates it validated, their scores, the improvers it passed over."""

    selected: list[CandidateProposal]
    evaluations: list[ValsetEvaluation]
    passed_over: list[CandidateProposal]
    discovered_at: int  # metric calls spent when the validation began: gepa's "discovered at"


class Windows(StepListener):
    """The run's gepa state, kept as gepa's engine keeps it, one window at a time; one instance per run."""

    def __init__(self, adapter: PooledAdapter, events: StepEvents, recorder: StepRecorder, guard: BudgetGuard,
                 gepa_callbacks: Sequence[Any], settings: Settings, seed_candidate: dict[str, str],
                 trainset: DataLoader, valset: DataLoader):
        self.adapter, self.events, self.recorder, self.guard, self.settings = adapter, events, recorder, guard, settings
        self.gepa_callbacks, self.seed_candidate = gepa_callbacks, seed_candidate
        self.trainset, self.valset = trainset, valset
        self.lock = events.lock
        self.state: GEPAState | None = None
        self.open = False  # the current window has had an event, and gepa has been told its iteration began
        self.accepted_in_window = False

    def _tell(self, method: str, event: Any) -> None:
        with self.lock:
            notify_callbacks(self.gepa_callbacks, method, event)

    # ------------------------------------------------------------------------------ the run's ends
    def begin(self, config: dict[str, Any]) -> GEPAState:
        """The seed validated on the valset, or the saved state a resumed run continues (gepa's own rule)."""
        self._tell("on_optimization_start", OptimizationStartEvent(
            seed_candidate=self.seed_candidate, trainset_size=len(self.trainset), valset_size=len(self.valset),
            config=config))
        ids = list(self.valset.all_ids())
        with seed_validation_paid():
            evaluation = self.adapter.evaluate(self.valset.fetch(ids), self.seed_candidate, phase="validation")
        settings = self.settings
        state = self.state = initialize_gepa_state(
            run_dir=settings.log_dir, logger=LoggerAdapter(logger), seed_candidate=self.seed_candidate,
            seed_valset_evaluation=valset_evaluation(ids, evaluation), track_best_outputs=settings.track_best_outputs)
        self.adapter.set_adapter_state(state.adapter_state)
        scores = state.prog_candidate_val_subscores[0]
        self._tell("on_valset_evaluated", ValsetEvaluatedEvent(
            iteration=0, candidate_idx=0, candidate=state.program_candidates[0], scores_by_val_id=dict(scores),
            average_score=FULL_EVALUATION.get_valset_score(0, state), num_examples_evaluated=len(scores),
            total_valset_size=len(ids), parent_ids=[], is_best_program=True, outputs_by_val_id=None))
        budget = self.guard.max_metric_calls  # from now on every spent metric call is announced too
        state.add_budget_hook(lambda total, delta: self._tell("on_budget_updated", BudgetUpdatedEvent(
            iteration=state.i + 1, metric_calls_used=total, metric_calls_delta=delta,
            metric_calls_remaining=max(0, budget - total))))
        self.events.add(self, first=True)  # a window starts before anything counts in it
        return state

    def close(self, unvalidated: Sequence[CandidateProposal]) -> None:
        """The search is over: improvers still queued are rejected, the last window is ended and the state saved."""
        with self.lock:
            for proposal in unvalidated:
                self.rejected(proposal, "the run's budget ended before its validation", "improved_not_selected")
            if self.recorder.calls_since_last_record():  # calls whose step event never came (a drain cut
                self._start()  # short by a cap, a reflection that returned as the run ended)
            self._end()
            self._save()

    def optimization_end(self) -> None:
        self._tell("on_optimization_end", OptimizationEndEvent(
            best_candidate_idx=best_program(self.state), total_iterations=self.state.i,
            total_metric_calls=self.state.total_num_evals, final_state=self.state))

    # ------------------------------------------------------------------------------ windows
    def _start(self) -> None:
        """As gepa's engine starts an iteration: save the state, count the iteration, tell the callbacks."""
        if self.open:
            return
        self.open, self.accepted_in_window = True, False
        self._save()
        state = self.state
        state.i += 1
        state.full_program_trace.append({"i": state.i, "schedule": "async"})
        self.recorder.start(state)
        self._tell("on_iteration_start", IterationStartEvent(iteration=state.i + 1, state=state,
                                                             trainset_loader=self.trainset))

    def _end(self) -> None:
        """Write the window's StepRecord and end gepa's iteration; nothing, if the window never began."""
        if not self.open:
            return
        self.open = False
        self.recorder.end(self.state)
        self._tell("on_iteration_end", IterationEndEvent(iteration=self.state.i + 1, state=self.state,
                                                         proposal_accepted=self.accepted_in_window))

    def _save(self) -> None:
        state = self.state
        state.adapter_state = dict(self.adapter.get_adapter_state())
        state.save(self.settings.log_dir, use_cloudpickle=bool(self.settings.gepa_kwargs.get("use_cloudpickle")))
        self._tell("on_state_saved", StateSavedEvent(iteration=state.i + 1, run_dir=self.settings.log_dir))

    # -- step events: each one starts the window it lands in; rollouts spend what was reserved for them
    @override
    def tasks_sampled(self, tasks: Any) -> None:
        self._start()

    @override
    def children_screened(self, children: int, improved: int) -> None:
        self._start()

    @override
    def reflected(self, seconds: float, jobs: int, failed: int) -> None:
        self._start()

    @override
    def sibling_merged(self, seconds: float, children: int) -> None:
        self._start()

    @override
    def evaluated(self, phase: Phase, seconds: float, rollouts: int, failures: int) -> None:
        self._start()
        # Calls are spent in the window their rollouts finish in, as the recorder counts them: with two
        # validations in flight, one may finish before the other's candidates join and end the window.
        self.guard.spend(self.state, rollouts)

    # ------------------------------------------------------------------------------ candidates
    def join(self, validated: Validated) -> list[tuple[CandidateProposal, int]]:
        """The validated candidates join gepa's state, as its engine adds them, and end their window; each
        with its index in the pool."""
        state, joined = self.state, []
        with self.lock:
            merged = {source for p in validated.selected for source in (p.metadata or {}).get("merged_from", [])}
            for proposal in validated.passed_over:
                if (proposal.metadata or {}).get("proposal_id") in merged:
                    self.rejected(proposal, "merged into a sibling merge", "merged")
                else:
                    self.rejected(proposal, "not selected for validation", "improved_not_selected")
            if not validated.selected:
                return joined
            self._start()
            for proposal, evaluation in zip(validated.selected, validated.evaluations, strict=True):
                crossed = proposal.tag == MERGE_TAG
                if crossed:
                    self.recorder.on_merge_attempted({})  # the window's validation is a crossover's
                front_before = pareto_front(state)
                state.num_full_ds_evals += 1
                index = state.update_state_with_new_program(
                    parent_program_idx=proposal.parent_program_ids, new_program=proposal.candidate,
                    valset_evaluation=evaluation, run_dir=self.settings.log_dir,
                    num_metric_calls_by_discovery_of_new_program=validated.discovered_at)
                state.full_program_trace[-1].setdefault("new_program_indices", []).append(index)
                self.recorder.accepted(index)
                self._validated(index, proposal, evaluation, front_before)
                if crossed:
                    self._tell("on_merge_accepted", MergeAcceptedEvent(
                        iteration=state.i + 1, new_candidate_idx=index, parent_ids=list(proposal.parent_program_ids)))
                joined.append((proposal, index))
            self.accepted_in_window = True
            self._end()
            self._write_candidate_tree()
        return joined

    def _write_candidate_tree(self) -> None:
        """gepa's candidate tree in ``log_dir``, rewritten as each candidate joins, as gepa's engine writes it."""
        log_dir = self.settings.log_dir
        if log_dir is None:
            return
        try:
            from gepa.visualization import candidate_tree_html

            with open(os.path.join(log_dir, "candidate_tree.html"), "w") as tree:
                tree.write(candidate_tree_html(self.state))
        except Exception as error:  # noqa: BLE001 - as gepa's engine: a picture never stops the search
            logger.warning("Could not write the candidate tree to %s: %s", log_dir, error)

    def _validated(self, index: int, proposal: CandidateProposal, evaluation: ValsetEvaluation,
                   front_before: set[int]) -> None:
        """A validated candidate joined the pool: the front's move, its validation, its acceptance."""
        state = self.state
        front_after = pareto_front(state)
        self._tell("on_pareto_front_updated", ParetoFrontUpdatedEvent(
            iteration=state.i + 1, new_front=sorted(front_after), displaced_candidates=sorted(front_before - front_after)))
        score = FULL_EVALUATION.get_valset_score(index, state)
        self._tell("on_valset_evaluated", ValsetEvaluatedEvent(
            iteration=state.i + 1, candidate_idx=index, candidate=proposal.candidate,
            scores_by_val_id=dict(evaluation.scores_by_val_id), average_score=score,
            num_examples_evaluated=len(evaluation.scores_by_val_id), total_valset_size=len(self.valset),
            parent_ids=list(proposal.parent_program_ids), is_best_program=index == best_program(state),
            outputs_by_val_id=None))
        self._tell("on_candidate_accepted", CandidateAcceptedEvent(
            iteration=state.i + 1, new_candidate_idx=index, new_score=sum(proposal.subsample_scores_after or ()),
            parent_ids=list(proposal.parent_program_ids)))
        self.decided(proposal.parent_program_ids[0], "validated", None, proposal, candidate=index, val_score=score)

    def rejected(self, proposal: CandidateProposal, reason: str, outcome: str) -> None:
        self._tell("on_candidate_rejected", CandidateRejectedEvent(
            iteration=self.state.i + 1, old_score=sum(proposal.subsample_scores_before or ()),
            new_score=sum(proposal.subsample_scores_after or ()), reason=reason))
        self.decided(proposal.parent_program_ids[0], outcome, reason, proposal)

    def decided(self, parent: int, outcome: str, reason: str | None, proposal: CandidateProposal | None = None,
                minibatch_ids: Sequence[Any] = (), scores: Sequence[float] = (), candidate: int | None = None,
                val_score: float | None = None) -> None:
        """dspy-pxn's own event (gepa's loop has none like it): one proposal and what became of it, for the
        proposals table (``dspy_pxn.tracking.lineage``). A callback without ``on_proposal_decided`` hears nothing."""
        self._tell("on_proposal_decided", {
            "parent": parent, "outcome": outcome, "reason": reason, "proposal": proposal,
            "minibatch_ids": list(proposal.subsample_indices if proposal is not None else minibatch_ids),
            "scores": list(scores), "candidate": candidate, "val_score": val_score,
        })

    def merge_attempted(self, proposal: CandidateProposal) -> None:
        self._tell("on_merge_attempted", MergeAttemptedEvent(
            iteration=self.state.i + 1, parent_ids=list(proposal.parent_program_ids), merged_candidate=proposal.candidate))

    def merge_rejected(self, proposal: CandidateProposal) -> None:
        """A crossover scored below its better parent on its val examples (gepa's engine's words)."""
        before, after = proposal.subsample_scores_before, sum(proposal.subsample_scores_after or ())
        self._tell("on_merge_rejected", MergeRejectedEvent(
            iteration=self.state.i + 1, parent_ids=list(proposal.parent_program_ids),
            reason=f"Merged score {after} worse than both parents {before}"))
        self.decided(proposal.parent_program_ids[0], "not_improved", "the crossover scored below its better parent",
                     proposal)


def valset_evaluation(ids: list[Any], evaluation: Any) -> ValsetEvaluation:
    """An adapter's evaluation of the valset, keyed by val id as gepa's state keeps it."""
    objectives = evaluation.objective_scores
    return ValsetEvaluation(outputs_by_val_id=dict(zip(ids, evaluation.outputs, strict=False)),
                            scores_by_val_id=dict(zip(ids, evaluation.scores, strict=False)),
                            objective_scores_by_val_id=dict(zip(ids, objectives, strict=False)) if objectives else None)


def pareto_front(state: GEPAState) -> set[int]:
    """Every program on some key's front (what gepa's engine compares before and after a candidate joins)."""
    return {program for programs in state.get_pareto_front_mapping().values() for program in programs}
