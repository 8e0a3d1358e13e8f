"""Which parent each proposal came from and what became of it: the per-proposal and candidate tables.

A StepRecord counts a step's proposals; comparing P×N settings also needs to see them
one by one (did the child beat its parent on the minibatch, was it validated, which
candidate did it become) and the lineage of the candidate pool. gepa leaves the
per-task scores in ``state.full_program_trace`` and announces each child's texts with
``on_proposal_end``; this gepa callback pairs them after every step and appends the
rows to ``proposals.jsonl`` as it goes, so a crash loses nothing already decided.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from gepa.core.state import GEPAState

from dspy_pxn.strategies import pareto_front_programs

PROPOSALS_LOG_NAME = "proposals.jsonl"

# Outcomes of one sampled (parent, minibatch) task.
VALIDATED = "validated"  # screened, improved, fully validated and added to the pool
NOT_SELECTED = "improved_not_selected"  # improved on its minibatch; selection or the budget passed it over
NOT_IMPROVED = "not_improved"  # did not beat its parent on the minibatch
DUPLICATE = "duplicate"  # the same program as another proposal of the step, or one already in the pool
NO_PROPOSAL = "no_proposal"  # skipped (perfect minibatch, failed reflection, no trajectories)


@dataclass
class ProposalRecord:
    """One sampled task of one step. Minibatch scores are means over the minibatch."""

    step: int
    task: int
    parent: int
    minibatch_ids: list[Any]
    parent_minibatch_score: float | None
    child_minibatch_score: float | None
    outcome: str
    candidate: int | None = None
    val_score: float | None = None


@dataclass
class CandidateRecord:
    """One program of the pool: where it came from, when, and how it scored."""

    candidate: int
    parents: list[int]
    step: int  # 0 for the seed program
    val_score: float
    metric_calls_at_discovery: int
    on_pareto_front: bool
    best: bool
    instructions: dict[str, str] = field(default_factory=dict)


def _mean(scores: Any) -> float | None:
    values = [float(s) for s in scores or [] if s is not None]
    return sum(values) / len(values) if values else None


def read_proposals(log_dir: str) -> list[ProposalRecord]:
    path = os.path.join(log_dir, PROPOSALS_LOG_NAME)
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        return [ProposalRecord(**json.loads(line)) for line in handle if line.strip()]


class LineageObserver:
    """gepa callback that records every proposal of every step, and the final candidate pool."""

    def __init__(self, log_dir: str | None = None):
        self.log_dir = log_dir
        self.proposals: list[ProposalRecord] = []
        self.candidates: list[CandidateRecord] = []
        self._step = 0
        self._texts: list[dict[str, str]] = []
        self._step_of: dict[int, int] = {0: 0}
        self._known = 1

    def on_iteration_start(self, event: dict) -> None:
        self._texts = []
        self._known = len(event["state"].program_candidates)

    def on_proposal_end(self, event: dict) -> None:
        self._texts.append(dict(event["new_instructions"]))

    def on_iteration_end(self, event: dict) -> None:
        state: GEPAState = event["state"]
        self._step += 1
        new = list(range(self._known, len(state.program_candidates)))
        for idx in new:
            self._step_of[idx] = self._step
        rows = self._rows(state, new)
        self.proposals.extend(rows)
        if self.log_dir is not None and rows:
            os.makedirs(self.log_dir, exist_ok=True)
            with open(os.path.join(self.log_dir, PROPOSALS_LOG_NAME), "a") as handle:
                handle.writelines(json.dumps(asdict(row), sort_keys=True) + "\n" for row in rows)

    def on_optimization_end(self, event: dict) -> None:
        self.candidates = candidate_table(event["final_state"], event["best_candidate_idx"], self._step_of)

    def _rows(self, state: GEPAState, new: list[int]) -> list[ProposalRecord]:
        trace = state.full_program_trace[-1] if state.full_program_trace else {}
        tasks = trace.get("tasks") or []
        screened = [t for t in tasks if "new_subsample_scores" in t]
        # gepa announces one on_proposal_end per screened child, in task order.
        texts = iter(self._texts if len(self._texts) == len(screened) else [None] * len(screened))
        unclaimed = set(new)
        rows = []
        for position, task in enumerate(tasks):
            parent = task["parent_idx"]
            row = ProposalRecord(
                step=self._step,
                task=position,
                parent=parent,
                minibatch_ids=list(task.get("subsample_ids") or []),
                parent_minibatch_score=_mean(task.get("subsample_scores")),
                child_minibatch_score=_mean(task.get("new_subsample_scores")),
                outcome=NO_PROPOSAL,
            )
            if "new_subsample_scores" in task:
                child_texts = next(texts)
                child = {**state.program_candidates[parent], **(child_texts or {})}
                match = next(
                    (i for i in sorted(unclaimed) if child_texts and state.program_candidates[i] == child), None
                )
                if match is not None:
                    unclaimed.discard(match)
                    row.outcome, row.candidate = VALIDATED, match
                    row.val_score = state.program_full_scores_val_set[match]
                elif child_texts and child in state.program_candidates:
                    row.outcome = DUPLICATE
                elif sum(task["new_subsample_scores"]) > sum(task.get("subsample_scores") or []):
                    row.outcome = NOT_SELECTED
                else:
                    row.outcome = NOT_IMPROVED
            rows.append(row)
        return rows


def candidate_table(state: GEPAState, best_idx: int, step_of: dict[int, int]) -> list[CandidateRecord]:
    on_front = set(pareto_front_programs(state))
    return [
        CandidateRecord(
            candidate=idx,
            parents=[p for p in state.parent_program_for_candidate[idx] if p is not None],
            step=step_of.get(idx, -1),
            val_score=state.program_full_scores_val_set[idx],
            metric_calls_at_discovery=state.num_metric_calls_by_discovery[idx],
            on_pareto_front=idx in on_front,
            best=idx == best_idx,
            instructions=dict(candidate),
        )
        for idx, candidate in enumerate(state.program_candidates)
    ]
