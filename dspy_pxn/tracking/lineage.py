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

from dspy_pxn.reflection import FEEDBACK_KEY, feedback_text
from dspy_pxn.strategies import pareto_front_programs

PROPOSALS_LOG_NAME = "proposals.jsonl"

# Outcomes of one sampled (parent, minibatch) task.
VALIDATED = "validated"  # screened, improved, fully validated and added to the pool
NOT_SELECTED = "improved_not_selected"  # improved on its minibatch; selection or the budget passed it over
NOT_IMPROVED = "not_improved"  # did not beat its parent on the minibatch
DUPLICATE = "duplicate"  # the same program as another proposal of the step, or one already in the pool
NO_PROPOSAL = "no_proposal"  # skipped (perfect minibatch, failed reflection, no trajectories)
MERGED = "merged"  # improved on its minibatch and was folded into a sibling merge that was validated
REASONS = {  # why a proposal was not accepted, in a user's words, where the schedule gives no reason of its own
    NOT_SELECTED: "improved on its minibatch; the selection or the budget passed it over",
    NOT_IMPROVED: "did not beat its parent on the minibatch",
    DUPLICATE: "the same program as another candidate",
    NO_PROPOSAL: "no child: perfect minibatch, no trajectories, or the reflection proposed nothing",
    MERGED: "merged into a sibling merge",
}
EXCERPT_CHARS = 1500  # of feedback and reflection output per row: enough to read, small enough for a table


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
    proposal_id: str | None = None
    reason: str | None = None  # why it was not accepted (None when it was)
    feedback: str = ""  # an excerpt of the metric feedback the reflection read
    reflection_output: str = ""  # an excerpt of the reflection LM's raw reply
    merged_from: list[str] = field(default_factory=list)  # a sibling merge: the proposals it folded in


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


def excerpt(texts: Any) -> str:
    """Per-component texts (or one text) as one table cell, cut to ``EXCERPT_CHARS``."""
    if isinstance(texts, dict):
        texts = "\n\n".join(f"[{name}]\n{text}" for name, text in texts.items() if text) if len(texts) > 1 else \
            next(iter(texts.values()), "")
    text = str(texts or "")
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"


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
        self._replies: list[dict[str, str]] = []
        self._feedback: list[str] = []
        self._decided: list[ProposalRecord] = []
        self._step_of: dict[int, int] = {0: 0}
        self._known = 1

    def on_iteration_start(self, event: dict) -> None:
        self._texts, self._replies, self._feedback = [], [], []
        self._known = len(event["state"].program_candidates)

    def on_proposal_start(self, event: dict) -> None:
        dataset = event.get("reflective_dataset") or {}
        self._feedback.append(excerpt({c: feedback_text(dataset, c) for c in event.get("components") or []}))

    def on_proposal_end(self, event: dict) -> None:
        self._texts.append(dict(event["new_instructions"]))
        self._replies.append(dict(event.get("raw_lm_outputs") or {}))

    def on_proposal_decided(self, event: dict) -> None:
        """dspy-pxn's own event, from a schedule that is not gepa's loop: one proposal and its fate."""
        proposal = event.get("proposal")
        metadata = dict(getattr(proposal, "metadata", None) or {})
        replies = {k.split(":", 1)[1]: v for k, v in metadata.items() if k.startswith("raw_lm_output:")}
        self._decided.append(ProposalRecord(
            step=-1, task=len(self._decided), parent=event["parent"],  # its step: the window it is logged with
            minibatch_ids=list(event.get("minibatch_ids") or []),
            parent_minibatch_score=_mean(getattr(proposal, "subsample_scores_before", None) or event.get("scores")),
            child_minibatch_score=_mean(getattr(proposal, "subsample_scores_after", None)),
            outcome=event["outcome"], candidate=event.get("candidate"), val_score=event.get("val_score"),
            proposal_id=metadata.get("proposal_id"), reason=event.get("reason"),
            feedback=excerpt(metadata.get(FEEDBACK_KEY) or {}), reflection_output=excerpt(replies),
            merged_from=[str(source) for source in metadata.get("merged_from") or []],
        ))

    def on_iteration_end(self, event: dict) -> None:
        state: GEPAState = event["state"]
        self._step += 1
        new = list(range(self._known, len(state.program_candidates)))
        for idx in new:
            self._step_of[idx] = self._step
        self._keep(self._rows(state, new))

    def _keep(self, rows: list[ProposalRecord]) -> None:
        """This step's rows, with the proposals a schedule decided since the last step, to memory and the log."""
        for row in self._decided:
            row.step = self._step
        rows, self._decided = rows + self._decided, []
        self.proposals.extend(rows)
        if self.log_dir is not None and rows:
            os.makedirs(self.log_dir, exist_ok=True)
            with open(os.path.join(self.log_dir, PROPOSALS_LOG_NAME), "a") as handle:
                handle.writelines(json.dumps(asdict(row), sort_keys=True) + "\n" for row in rows)

    def on_optimization_end(self, event: dict) -> None:
        self._keep([])  # what was decided after the last step ended (e.g. children of the last window)
        self.candidates = candidate_table(event["final_state"], event["best_candidate_idx"], self._step_of)

    def _rows(self, state: GEPAState, new: list[int]) -> list[ProposalRecord]:
        trace = state.full_program_trace[-1] if state.full_program_trace else {}
        if "tasks" not in trace:  # not a step of gepa's loop (crossover, or the async schedule, which tells its own)
            return []
        tasks = trace["tasks"] or []
        screened = [t for t in tasks if "new_subsample_scores" in t]
        # gepa announces one on_proposal_end per screened child, in task order.
        paired = len(self._texts) == len(screened)
        texts = iter(self._texts if paired else [None] * len(screened))
        replies = iter(self._replies if paired else [{}] * len(screened))
        feedback = iter(self._feedback if len(self._feedback) == len(screened) else [""] * len(screened))
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
                row.proposal_id = f"{self._step}-{position}"
                row.feedback, row.reflection_output = next(feedback), excerpt(next(replies))
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
            row.reason = None if row.outcome == VALIDATED else REASONS[row.outcome]
            rows.append(row)
        return rows + self._merges(state, sorted(unclaimed), rows)

    def _merges(self, state: GEPAState, unclaimed: list[int], rows: list[ProposalRecord]) -> list[ProposalRecord]:
        """A validated candidate that is no screened child is a sibling merge of the step's improving children."""
        improvers = [row for row in rows if row.outcome in (NOT_SELECTED, VALIDATED)]
        merges = []
        for index in unclaimed:
            for row in improvers:
                if row.outcome == NOT_SELECTED:
                    row.outcome, row.reason = MERGED, f"merged into candidate {index}"
            parents = [p for p in state.parent_program_for_candidate[index] if p is not None]
            merges.append(ProposalRecord(
                step=self._step, task=len(rows) + len(merges), parent=parents[0] if parents else -1, minibatch_ids=[],
                parent_minibatch_score=None, child_minibatch_score=None, outcome=VALIDATED, candidate=index,
                val_score=state.program_full_scores_val_set[index],
                proposal_id=f"{self._step}-{'merge' if improvers else 'crossover'}{len(merges)}",
                merged_from=[row.proposal_id for row in improvers if row.proposal_id],
            ))
        return merges


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
