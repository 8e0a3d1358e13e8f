"""Queries of the pool of candidates gepa's state holds: the best one, the Pareto front, a child's improvement.

Every part of the run that asks "which is the best candidate" asks here, so there is one rule (gepa's own
``FullEvaluationPolicy``, what ``GEPAResult.best_idx`` reads).
"""

from __future__ import annotations

from gepa.core.state import GEPAState
from gepa.gepa_utils import remove_dominated_programs
from gepa.proposer.base import CandidateProposal
from gepa.strategies.eval_policy import FullEvaluationPolicy

FULL_EVALUATION = FullEvaluationPolicy()


def best_program(state: GEPAState) -> int:
    """The run's best candidate: the highest mean validation score, the earliest on a tie."""
    return FULL_EVALUATION.get_best_program(state)


def mean_val_score(state: GEPAState, program: int) -> float:
    """A candidate's mean validation score, as ``best_program`` compares them."""
    scores = state.prog_candidate_val_subscores[program]
    return sum(scores.values()) / len(scores) if scores else float("-inf")


def ties_the_best(state: GEPAState, program: int) -> bool:
    """Whether ``program`` scores as high as the best candidate (which is the earliest of those that do)."""
    return mean_val_score(state, program) >= mean_val_score(state, best_program(state))


def pareto_front_programs(state: GEPAState) -> list[int]:
    """Non-dominated programs, best aggregate validation score first."""
    scores = state.per_program_tracked_scores
    front = remove_dominated_programs(state.get_pareto_front_mapping(), scores=scores)
    members = {program for programs in front.values() for program in programs}
    return sorted(members, key=lambda program: (-scores[program], program))


def improvement(proposal: CandidateProposal) -> float:
    """How much a child beat its parent on their shared minibatch (sum of scores)."""
    return sum(proposal.subsample_scores_after or []) - sum(proposal.subsample_scores_before or [])
