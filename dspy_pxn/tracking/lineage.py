"""Which parent each proposal came from and what became of it: the per-proposal and candidate tables.

A StepRecord counts a step's proposals; comparing P×N settings also needs to see them
one by one (did the child beat its parent on the minibatch, was it validated, which
candidate did it become) and the lineage of the candidate pool. gepa leaves the
per-task scores in ``state.full_program_trace`` and announces each child's texts with
``on_proposal_end``; this gepa callback pairs them after every step and appends the
rows to ``proposals.jsonl`` as it goes, so a crash loses nothing already decided.

Rows are numbered by gepa's iteration (``state.i + 1``, as ``StepRecord.step``), so a resumed run
continues the log where the saved state left it: the rows of a step the state does not include (it
was in flight when the process died) are dropped, since the resumed run does that step again.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from gepa.core.state import GEPAState

from dspy_pxn.engine.candidates import pareto_front_programs
from dspy_pxn.proposer.reflection import FEEDBACK_KEY, feedback_text

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
# The asynchronous schedule's proposal ids ("p17": its pipelines' launch count, which restarts in a resumed process).
NUMBERED_ID = re.compile(r"p(\d+)")


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


def crossover_row(state: GEPAState, trace: dict[str, Any], step: int, new: list[int]) -> ProposalRecord:
    """The step gepa's crossover took in its loop (``use_merge``): the crossed candidate, validated or not."""
    first, _, _ = trace["merged_entities"]
    return ProposalRecord(
        step=step, task=0, parent=first, minibatch_ids=list(trace.get("subsample_ids") or []),
        parent_minibatch_score=_mean(trace.get("id1_subsample_scores")),
        child_minibatch_score=_mean(trace.get("new_program_subsample_scores")),
        outcome=VALIDATED if new else NOT_IMPROVED, candidate=new[0] if new else None,
        val_score=state.program_full_scores_val_set[new[0]] if new else None, proposal_id=f"{step}-crossover",
        reason=None if new else "the crossover scored below its better parent on its val examples",
    )


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


def step_of(state: GEPAState) -> int:
    """The step gepa's state is in (or last finished): its iteration number, as its events and StepRecord count
    it, so a resumed state carries it on."""
    return state.i + 1


def read_proposals(log_dir: str) -> list[ProposalRecord]:
    path = os.path.join(log_dir, PROPOSALS_LOG_NAME)
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        return [ProposalRecord(**json.loads(line)) for line in handle if line.strip()]


def keep_first_proposals(log_dir: str, completed_steps: int) -> list[ProposalRecord]:
    """Keep the rows of the steps gepa's saved state includes (as ``StepLog.keep_first``); return them.

    A step's rows are written as it ends and the state is saved as the next one starts: a process killed in
    between leaves rows of a step the resumed run does again, which would then be logged twice."""
    path = os.path.join(log_dir, PROPOSALS_LOG_NAME)
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        kept = [row for row in map(_whole_row, handle) if row is not None and row.step <= completed_steps]
    with open(path + ".tmp", "w") as handle:
        handle.writelines(json.dumps(asdict(row), sort_keys=True) + "\n" for row in kept)
    os.replace(path + ".tmp", path)
    return kept


def _whole_row(line: str) -> ProposalRecord | None:
    """A logged row, or None for a blank line or the last line a killed process left half-written."""
    try:
        return ProposalRecord(**json.loads(line)) if line.strip() else None
    except json.JSONDecodeError:
        return None


def numbered_ids(rows: list[ProposalRecord]) -> int:
    """The largest ``p<k>`` proposal id among ``rows`` (0 if none): where a resumed process's ids continue."""
    ids = [i for row in rows for i in [row.proposal_id, *row.merged_from] if i]
    return max((int(match[1]) for match in map(NUMBERED_ID.fullmatch, ids) if match), default=0)


class LineageObserver:
    """gepa callback that records every proposal of every step, and the final candidate pool."""

    def __init__(self, log_dir: str | None = None):
        self.log_dir = log_dir
        self.proposals: list[ProposalRecord] = []
        self.candidates: list[CandidateRecord] = []
        self._texts: list[dict[str, str]] = []
        self._replies: list[dict[str, str]] = []
        self._feedback: list[str] = []
        self._decided: list[ProposalRecord] = []
        self._step_of: dict[int, int] = {0: 0}
        self._known = 1
        self._rows_of_step: Counter[int] = Counter()  # rows logged per step: where a step's next task number starts
        self._id_offset = 0  # added to a resumed process's "p<k>" ids, which restart at p1
        self._taken_up = False  # whether the rows an earlier process of this run wrote have been taken up

    def on_iteration_start(self, event: dict) -> None:
        state: GEPAState = event["state"]
        self._take_up(step_of(state) - 1)
        self._texts, self._replies, self._feedback = [], [], []
        self._known = len(state.program_candidates)

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
            step=-1, task=-1, parent=event["parent"],  # its step and task: the window it is logged with (_keep)
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
        step = step_of(state)
        new = list(range(self._known, len(state.program_candidates)))
        for idx in new:
            self._step_of[idx] = step
        self._keep(step, self._rows(state, step, new))

    def _take_up(self, completed_steps: int) -> None:
        """Once, before this process logs a row: continue what an earlier process of the run logged (nothing, in
        a fresh run): keep the rows of the steps gepa's state includes, its candidates' steps, and its ids."""
        if self._taken_up:
            return
        self._taken_up = True
        kept = keep_first_proposals(self.log_dir, completed_steps) if self.log_dir is not None else []
        self.proposals = kept + self.proposals
        self._rows_of_step.update(row.step for row in kept)
        self._step_of.update({row.candidate: row.step for row in kept
                              if row.outcome == VALIDATED and row.candidate is not None})
        self._id_offset = numbered_ids(kept)

    def _continued_id(self, proposal_id: str) -> str:
        """A ``p<k>`` id past the earlier process's, so no id is logged twice in a resumed run; others as given."""
        match = NUMBERED_ID.fullmatch(proposal_id)
        return f"p{int(match[1]) + self._id_offset}" if match and self._id_offset else proposal_id

    def _keep(self, step: int, rows: list[ProposalRecord]) -> None:
        """This step's rows, with the proposals a schedule decided since the last step, to memory and the log.

        A decided proposal's task number continues the step's rows: a step may be logged twice (a window's end,
        then what was decided after it, at the run's end)."""
        first = self._rows_of_step[step] + len(rows)
        for task, row in enumerate(self._decided, start=first):
            row.step, row.task = step, task
            if row.proposal_id:
                row.proposal_id = self._continued_id(row.proposal_id)
            row.merged_from = [self._continued_id(source) for source in row.merged_from]
        rows, self._decided = rows + self._decided, []
        self._rows_of_step[step] += len(rows)
        self.proposals.extend(rows)
        if self.log_dir is not None and rows:
            os.makedirs(self.log_dir, exist_ok=True)
            with open(os.path.join(self.log_dir, PROPOSALS_LOG_NAME), "a") as handle:
                handle.writelines(json.dumps(asdict(row), sort_keys=True) + "\n" for row in rows)

    def on_optimization_end(self, event: dict) -> None:
        state: GEPAState = event["final_state"]
        self._take_up(step_of(state))  # a resumed run that had no step left to do
        self._keep(step_of(state), [])  # what was decided after the last step ended (e.g. children of the last window)
        self.candidates = candidate_table(state, event["best_candidate_idx"], self._step_of)

    def _rows(self, state: GEPAState, step: int, new: list[int]) -> list[ProposalRecord]:
        trace = state.full_program_trace[-1] if state.full_program_trace else {}
        if "merged_entities" in trace:  # gepa's crossover took the step
            return [crossover_row(state, trace, step, new)]
        if "tasks" not in trace:  # not a step of gepa's loop (the async schedule tells its own)
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
                step=step,
                task=position,
                parent=parent,
                minibatch_ids=list(task.get("subsample_ids") or []),
                parent_minibatch_score=_mean(task.get("subsample_scores")),
                child_minibatch_score=_mean(task.get("new_subsample_scores")),
                outcome=NO_PROPOSAL,
            )
            if "new_subsample_scores" in task:
                row.proposal_id = f"{step}-{position}"
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
        return rows + self._merges(state, step, sorted(unclaimed), rows)

    def _merges(self, state: GEPAState, step: int, unclaimed: list[int],
                rows: list[ProposalRecord]) -> list[ProposalRecord]:
        """A validated candidate that is no screened child is a sibling merge of the step's improving children."""
        improvers = [row for row in rows if row.outcome in (NOT_SELECTED, VALIDATED)]
        merges = []
        for index in unclaimed:
            for row in improvers:
                if row.outcome == NOT_SELECTED:
                    row.outcome, row.reason = MERGED, f"merged into candidate {index}"
            parents = [p for p in state.parent_program_for_candidate[index] if p is not None]
            merges.append(ProposalRecord(
                step=step, task=len(rows) + len(merges), parent=parents[0] if parents else -1, minibatch_ids=[],
                parent_minibatch_score=None, child_minibatch_score=None, outcome=VALIDATED, candidate=index,
                val_score=state.program_full_scores_val_set[index],
                proposal_id=f"{step}-{'merge' if improvers else 'crossover'}{len(merges)}",
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
