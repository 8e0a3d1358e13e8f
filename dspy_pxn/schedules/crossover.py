"""gepa's crossover (``use_merge=True``) in the asynchronous schedule, where dspy.GEPA's would run.

gepa's engine tries a crossover at the start of an iteration that follows one which added a candidate,
while crossovers are due (one per candidate added, up to ``max_merge_invocations`` accepted); the attempt
takes the place of that iteration's reflective step, and an accepted crossover does not call for another.
The asynchronous schedule has no iterations to replace: each validation that adds candidates plays the
iteration that found them, and the next launch starts one crossover in one of the width's pipeline slots.
gepa's own ``MergeProposer`` picks the pair, their common ancestor and the few val examples, crosses the
components and scores the crossed candidate, which is validated when it scores at least its better parent
there (gepa's engine's rule) and joins the pool with both parents.

The proposer reads gepa's state under the schedule's lock; its rollouts run with the lock released
(``_evaluate``), so the pipelines go on meanwhile. Its metric calls are reserved with the budget guard
before it starts and spent as its rollouts are reported, like a pipeline's.
"""

from __future__ import annotations

import copy
import logging
import threading
from typing import Any

from dspy.teleprompt.gepa.gepa_utils import LoggerAdapter
from gepa.core.data_loader import DataLoader
from gepa.core.state import GEPAState
from gepa.proposer.base import CandidateProposal
from gepa.proposer.merge import MergeProposer

from dspy_pxn.engine.pooled_adapter import PooledAdapter
from dspy_pxn.ledger.budget import CROSSOVER_SUBSAMPLE_CALLS, BudgetGuard, Reservation
from dspy_pxn.schedules.windows import MERGE_TAG, Validated, Windows, valset_evaluation

logger = logging.getLogger(__name__)


class AsyncCrossover:
    """When a crossover is due, and the one crossover attempt of the run in flight at a time."""

    def __init__(self, adapter: PooledAdapter, valset: DataLoader, guard: BudgetGuard, lock: threading.RLock,
                 rng: Any, max_merge_invocations: int, val_overlap_floor: int, callbacks: list[Any]):
        self.adapter, self.valset, self.guard, self.lock = adapter, valset, guard, lock
        self.proposer = MergeProposer(
            logger=LoggerAdapter(logger), valset=valset, evaluator=self._evaluate, use_merge=True,
            max_merge_invocations=max_merge_invocations, val_overlap_floor=val_overlap_floor, rng=rng,
            callbacks=callbacks)
        self.in_flight: Reservation | None = None  # the one attempt in flight, and what the guard promised it
        self._evaluated = 0

    # -- gepa's engine's bookkeeping, under the schedule's lock ------------------------------------
    def found_new_program(self) -> None:
        """A candidate other than a crossover joined the pool: a crossover is due (gepa's engine's rule)."""
        self.proposer.last_iter_found_new_program = True
        if self.proposer.total_merges_tested < self.proposer.max_merge_invocations:
            self.proposer.merges_due += 1

    def accepted(self) -> None:
        """A crossover joined the pool: one due crossover done, one of ``max_merge_invocations`` tested."""
        self.proposer.merges_due -= 1
        self.proposer.total_merges_tested += 1

    def start(self, state: GEPAState) -> bool:
        """Reserve a due crossover's screening, leaving |val| free for its validation; False when none is
        due or the budget has no room for one."""
        due = self.proposer.merges_due > 0 and self.proposer.last_iter_found_new_program
        # Candidates found while a crossover is in flight owe more than gepa's one-at-a-time loop would; the
        # attempts stop at max_merge_invocations accepted, as its argument says.
        spent = self.proposer.total_merges_tested >= self.proposer.max_merge_invocations
        if self.in_flight is not None or not due or spent:
            return False
        self.in_flight = self.guard.reserve_crossover(state)
        return self.in_flight is not None

    # -- the attempt, in a pipeline thread ----------------------------------------------------------
    def propose(self, state: GEPAState) -> CandidateProposal | None:
        """gepa's crossover proposal (scored on its val examples), or None when it found no pair to cross.
        Under the schedule's lock, held once by this thread: the proposer's rollouts release it."""
        self._evaluated = 0
        try:
            # The same pool (a shallow copy), with an eval count and an iteration trace of its own. Its metric calls
            # are spent by the guard as each rollout is reported, so the proposer's count is not added a second
            # time (nor announced); the notes it writes for gepa's loop's trace go nowhere (an async window's entry
            # is the schedule's, and the crossover is told as its own proposal).
            seen = copy.copy(state)
            seen.full_program_trace, seen._budget_hooks = [{}], []
            proposal = self.proposer.propose(seen)
        finally:
            self.proposer.last_iter_found_new_program = False  # an attempt consumes the new program's turn
            self.guard.release(self.in_flight, CROSSOVER_SUBSAMPLE_CALLS - self._evaluated)
            self.guard.close(self.in_flight)
        return proposal if proposal is not None and proposal.tag == MERGE_TAG else None

    def _evaluate(self, batch: list[Any], candidate: dict[str, str]) -> tuple[Any, Any, Any]:
        """gepa's evaluator for the proposer: the crossed candidate on its val examples, the lock released."""
        self.guard.commit(self.in_flight)  # its screening is being spent: none of it comes back
        self.lock.release()
        try:
            evaluation = self.adapter.evaluate(batch, candidate, capture_traces=False, phase="screening")
        finally:
            self.lock.acquire()
        self._evaluated += len(batch)
        return evaluation.outputs, evaluation.scores, evaluation.objective_scores

    def attempt(self, windows: Windows) -> Validated | None:
        """One crossover, in a pipeline thread: proposed and scored, then validated if it improves (the pool
        is joined by the schedule, as for any validated candidate)."""
        try:
            with self.lock:
                proposal = self.propose(windows.state)
                if proposal is None:
                    return None
                windows.merge_attempted(proposal)
                if not improves(proposal):
                    windows.merge_rejected(proposal)
                    return None
                validation = self.guard.reserve_validations(windows.state, 1)
                if validation is None:
                    windows.rejected(proposal, "no budget left to validate it", "improved_not_selected")
                    return None
                self.guard.commit(validation)
                discovered_at = windows.state.total_num_evals
            ids = list(self.valset.all_ids())
            try:
                evaluation = self.adapter.evaluate(self.valset.fetch(ids), proposal.candidate, capture_traces=False,
                                                   phase="validation")
            finally:
                with self.lock:
                    self.guard.close(validation)
            return Validated([proposal], [valset_evaluation(ids, evaluation)], [], discovered_at)
        finally:
            with self.lock:
                self.in_flight = None


def improves(proposal: CandidateProposal) -> bool:
    """gepa's engine's acceptance of a crossover: at least as good as its better parent on its val examples."""
    parents = proposal.subsample_scores_before or [float("-inf"), float("-inf")]
    return sum(proposal.subsample_scores_after or []) >= max(parents)
