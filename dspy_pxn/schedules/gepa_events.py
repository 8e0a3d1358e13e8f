"""gepa's callback events, told as gepa's engine tells them, for a schedule that is not gepa's loop.

A user's gepa callbacks (and the MLflow tracker's) are written against what
``GEPAEngine.run`` announces: when the optimization and each iteration start and end,
when the state is saved, when a candidate is validated, accepted or rejected, when the
Pareto front moves and the budget is spent. The asynchronous schedule drives gepa's
state itself, so it announces the same events, built with gepa's own event types, here.
Every announcement is made under the schedule's lock: callbacks never run concurrently.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

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
from gepa.core.state import GEPAState, ValsetEvaluation
from gepa.proposer.base import CandidateProposal

from dspy_pxn.strategies import FULL_EVALUATION, best_program


class GepaNotifier:
    """Announces a run to gepa callbacks. Iteration numbers are gepa's: ``state.i + 1``."""

    def __init__(self, callbacks: Sequence[Any], lock: threading.RLock, budget: int):
        self.callbacks = list(callbacks)
        self.lock = lock
        self.budget = budget

    def _tell(self, method: str, event: Any) -> None:
        with self.lock:
            notify_callbacks(self.callbacks, method, event)

    def optimization_start(self, seed_candidate: dict[str, str], trainset_size: int, valset_size: int,
                           config: dict[str, Any]) -> None:
        self._tell("on_optimization_start", OptimizationStartEvent(
            seed_candidate=seed_candidate, trainset_size=trainset_size, valset_size=valset_size, config=config))

    def seed_validated(self, state: GEPAState, valset_size: int) -> None:
        """The seed's validation (iteration 0); from now on every spent metric call is announced too."""
        scores = state.prog_candidate_val_subscores[0]
        self._tell("on_valset_evaluated", ValsetEvaluatedEvent(
            iteration=0, candidate_idx=0, candidate=state.program_candidates[0], scores_by_val_id=dict(scores),
            average_score=FULL_EVALUATION.get_valset_score(0, state), num_examples_evaluated=len(scores),
            total_valset_size=valset_size, parent_ids=[], is_best_program=True, outputs_by_val_id=None))
        state.add_budget_hook(lambda total, delta: self._tell("on_budget_updated", BudgetUpdatedEvent(
            iteration=state.i + 1, metric_calls_used=total, metric_calls_delta=delta,
            metric_calls_remaining=max(0, self.budget - total))))

    def state_saved(self, state: GEPAState, run_dir: str | None) -> None:
        self._tell("on_state_saved", StateSavedEvent(iteration=state.i + 1, run_dir=run_dir))

    def iteration_start(self, state: GEPAState, trainset: DataLoader) -> None:
        self._tell("on_iteration_start", IterationStartEvent(iteration=state.i + 1, state=state,
                                                             trainset_loader=trainset))

    def iteration_end(self, state: GEPAState, accepted: bool) -> None:
        self._tell("on_iteration_end", IterationEndEvent(iteration=state.i + 1, state=state,
                                                         proposal_accepted=accepted))

    def validated(self, state: GEPAState, index: int, proposal: CandidateProposal, evaluation: ValsetEvaluation,
                  valset_size: int, front_before: set[int]) -> None:
        """A validated candidate joined the pool: the front's move, its validation, its acceptance."""
        front_after = pareto_front(state)
        self._tell("on_pareto_front_updated", ParetoFrontUpdatedEvent(
            iteration=state.i + 1, new_front=sorted(front_after), displaced_candidates=sorted(front_before - front_after)))
        self._tell("on_valset_evaluated", ValsetEvaluatedEvent(
            iteration=state.i + 1, candidate_idx=index, candidate=proposal.candidate,
            scores_by_val_id=dict(evaluation.scores_by_val_id), average_score=FULL_EVALUATION.get_valset_score(index, state),
            num_examples_evaluated=len(evaluation.scores_by_val_id), total_valset_size=valset_size,
            parent_ids=list(proposal.parent_program_ids), is_best_program=index == best_program(state),
            outputs_by_val_id=None))
        self._tell("on_candidate_accepted", CandidateAcceptedEvent(
            iteration=state.i + 1, new_candidate_idx=index, new_score=sum(proposal.subsample_scores_after or ()),
            parent_ids=list(proposal.parent_program_ids)))
        self.decided(proposal.parent_program_ids[0], "validated", None, proposal, candidate=index,
                     val_score=FULL_EVALUATION.get_valset_score(index, state))

    def rejected(self, state: GEPAState, proposal: CandidateProposal, reason: str, outcome: str) -> None:
        self._tell("on_candidate_rejected", CandidateRejectedEvent(
            iteration=state.i + 1, old_score=sum(proposal.subsample_scores_before or ()),
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

    def merge_attempted(self, state: GEPAState, proposal: CandidateProposal) -> None:
        self._tell("on_merge_attempted", MergeAttemptedEvent(
            iteration=state.i + 1, parent_ids=list(proposal.parent_program_ids), merged_candidate=proposal.candidate))

    def merge_rejected(self, state: GEPAState, proposal: CandidateProposal) -> None:
        """A crossover scored below its better parent on its val examples (gepa's engine's words)."""
        before, after = proposal.subsample_scores_before, sum(proposal.subsample_scores_after or ())
        self._tell("on_merge_rejected", MergeRejectedEvent(
            iteration=state.i + 1, parent_ids=list(proposal.parent_program_ids),
            reason=f"Merged score {after} worse than both parents {before}"))
        self.decided(proposal.parent_program_ids[0], "not_improved", "the crossover scored below its better parent",
                     proposal)

    def merge_accepted(self, state: GEPAState, index: int, proposal: CandidateProposal) -> None:
        self._tell("on_merge_accepted", MergeAcceptedEvent(
            iteration=state.i + 1, new_candidate_idx=index, parent_ids=list(proposal.parent_program_ids)))

    def optimization_end(self, state: GEPAState) -> None:
        self._tell("on_optimization_end", OptimizationEndEvent(
            best_candidate_idx=best_program(state), total_iterations=state.i,
            total_metric_calls=state.total_num_evals, final_state=state))


def pareto_front(state: GEPAState) -> set[int]:
    """Every program on some key's front (what gepa's engine compares before and after a candidate joins)."""
    return {program for programs in state.get_pareto_front_mapping().values() for program in programs}
