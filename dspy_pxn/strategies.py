"""gepa strategies that make a P×N step wide, diverse and exactly on budget.

Each is a small class passed to ``gepa.optimize`` through its own extension points
(sampling, selection, batch sampler, stopper); none changes gepa's engine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gepa.core.data_loader import DataLoader
from gepa.core.state import GEPAState
from gepa.gepa_utils import remove_dominated_programs
from gepa.proposer.base import CandidateProposal
from gepa.proposer.reflective_mutation.base import CandidateSelector
from gepa.strategies.acceptance import AcceptanceCriterion
from gepa.strategies.batch_sampler import BatchSampler, EpochShuffledBatchSampler
from gepa.strategies.proposal_sampling import ProposalTask
from gepa.strategies.proposal_selection import (
    AllImprovements,
    BestImprovement,
    SelectionStrategy,
    TopKImprovements,
)

# A merge proposal scores the merged program on at most this many val examples
# (gepa.proposer.merge: num_subsample_ids=5) before its full validation.
MERGE_SUBSAMPLE_CALLS = 5


@dataclass(frozen=True)
class BudgetGuard:
    """Plans each step so the run never spends more than ``max_metric_calls``.

    A reflective step with k proposals costs k·m calls to screen the parents, k·m to
    screen the children (m = minibatch size), and |val| per child sent to full
    validation. The guard sizes k before sampling, caps how many children are
    validated after screening, and stops the run once no useful step fits.
    """

    max_metric_calls: int
    valset_size: int
    minibatch_size: int
    use_merge: bool = False

    def remaining(self, state: GEPAState) -> int:
        return self.max_metric_calls - state.total_num_evals

    def smallest_step(self) -> int:
        """Calls needed for one proposal that is screened and validated (or one merge)."""
        reflective = 2 * self.minibatch_size + self.valset_size
        merge = MERGE_SUBSAMPLE_CALLS + self.valset_size if self.use_merge else 0
        return max(reflective, merge)

    def smallest_budget(self) -> int:
        """Calls for the seed's validation plus one proposal screened and validated: one useful step."""
        return self.valset_size + 2 * self.minibatch_size + self.valset_size

    def max_proposals(self, state: GEPAState) -> int:
        """Widest step that still leaves room to validate one child."""
        return max(0, (self.remaining(state) - self.valset_size) // (2 * self.minibatch_size))

    def max_validations(self, state: GEPAState) -> int:
        return max(0, self.remaining(state) // self.valset_size)


class ExactBudgetStopper:
    """Stops when the remaining budget cannot pay for the smallest useful step.

    Exposes ``max_metric_calls`` so gepa's progress bar and remaining-budget events
    read it as they read their own MaxMetricCallsStopper.
    """

    def __init__(self, guard: BudgetGuard):
        self.guard = guard
        self.max_metric_calls = guard.max_metric_calls

    def __call__(self, gepa_state: GEPAState) -> bool:
        return self.guard.remaining(gepa_state) < self.guard.smallest_step()


class SequentialMinibatchSampler(EpochShuffledBatchSampler):
    """gepa's epoch-shuffled minibatches, advancing one minibatch per *call*.

    gepa's sampler positions each iteration at ``iteration × minibatch_size`` and only
    offsets later calls within it, so with k tasks per iteration consecutive steps
    reuse k−1 of the previous step's minibatches: the same parents on the same data
    give the same reflection prompts. With one call per iteration (1×1) this sampler
    yields exactly gepa's sequence.
    """

    def __init__(self, minibatch_size: int, rng):
        super().__init__(minibatch_size=minibatch_size, rng=rng)
        self.calls = 0

    def next_minibatch_ids(self, loader: DataLoader, state: GEPAState) -> list:
        if len(loader) == 0:
            raise ValueError("Cannot sample a minibatch from an empty trainset.")
        position = self.calls * self.minibatch_size
        self.calls += 1
        epoch = 0 if self.epoch == -1 else position // max(len(self.shuffled_ids), 1)
        if not self.shuffled_ids or len(loader) != self.last_trainset_size or epoch > self.epoch:
            self.epoch = epoch
            self._update_shuffled(loader)
        start = position % len(self.shuffled_ids)
        return self.shuffled_ids[start : start + self.minibatch_size]


def pareto_front_programs(state: GEPAState) -> list[int]:
    """Non-dominated programs, best aggregate validation score first."""
    scores = state.per_program_tracked_scores
    front = remove_dominated_programs(state.get_pareto_front_mapping(), scores=scores)
    members = {program for programs in front.values() for program in programs}
    return sorted(members, key=lambda program: (-scores[program], program))


class DistinctParentsPxN:
    """P distinct parents × N mutations each, narrowed to what the budget can pay for.

    gepa's ``PxNSampling`` draws parents with replacement, so an 8×1 step often
    mutates the same parent several times. Here parents are drawn from the
    candidate selector until P distinct ones are found (bounded attempts), then
    topped up from the Pareto front; only a front smaller than P repeats parents.
    Each task gets its own minibatch. The first draw is the selector's own, so 1×1
    consumes the RNG exactly as gepa's ``SingleMutationSampling``.
    """

    def __init__(
        self,
        p: int,
        n: int,
        guard: BudgetGuard,
        on_sampled: Callable[[list[ProposalTask]], None] | None = None,
        draws_per_parent: int = 8,
    ):
        self.p = p
        self.n = n
        self.guard = guard
        self.on_sampled = on_sampled
        self.draws_per_parent = draws_per_parent

    def choose_parents(self, state: GEPAState, selector: CandidateSelector, count: int) -> list[int]:
        parents: list[int] = []
        for _ in range(count * self.draws_per_parent):
            if len(parents) == count:
                return parents
            parent = selector.select_candidate_idx(state)
            if parent not in parents:
                parents.append(parent)
        for program in pareto_front_programs(state):
            if len(parents) == count:
                break
            if program not in parents:
                parents.append(program)
        distinct = list(parents)
        while len(parents) < count:
            parents.append(distinct[len(parents) % len(distinct)])
        return parents

    def sample_tasks(
        self,
        state: GEPAState,
        candidate_selector: CandidateSelector,
        batch_sampler: BatchSampler,
        trainset: DataLoader,
    ) -> list[ProposalTask]:
        width = min(self.p * self.n, self.guard.max_proposals(state))
        if width < 1:
            return []
        parents = self.choose_parents(state, candidate_selector, math.ceil(width / self.n))
        tasks: list[ProposalTask] = []
        for parent in parents:
            for _ in range(self.n):
                if len(tasks) == width:
                    break
                ids = batch_sampler.next_minibatch_ids(trainset, state)
                tasks.append(ProposalTask(parent, state.program_candidates[parent], ids, trainset.fetch(ids)))
        if self.on_sampled is not None:
            self.on_sampled(tasks)
        return tasks


class BudgetCappedSelection:
    """Wraps a selection strategy so full validation never exceeds the budget.

    When the remaining budget validates fewer children than were selected, the ones
    with the largest minibatch improvement go first (ties keep proposal order).
    """

    def __init__(self, inner: SelectionStrategy, guard: BudgetGuard, on_selected: Callable[[int], None] | None = None):
        self.inner = inner
        self.guard = guard
        self.on_selected = on_selected

    def select(
        self,
        proposals: list[CandidateProposal],
        state: GEPAState,
        acceptance_criterion: AcceptanceCriterion,
    ) -> list[CandidateProposal]:
        if self.on_selected is not None:
            # gepa memoizes the criterion per batch, so counting improvers here is free; the
            # runtime model needs this per-proposal pass rate, which "best"/top-k selection hides.
            self.on_selected(sum(acceptance_criterion.should_accept(p, state) for p in proposals))
        selected = self.inner.select(proposals, state, acceptance_criterion)
        room = self.guard.max_validations(state)
        if len(selected) <= room:
            return selected
        ranked = sorted(selected, key=improvement, reverse=True)[:room]
        keep = {id(p) for p in ranked}
        return [p for p in selected if id(p) in keep]


def improvement(proposal: CandidateProposal) -> float:
    return sum(proposal.subsample_scores_after or []) - sum(proposal.subsample_scores_before or [])


def selection_strategy(selection: str | int | SelectionStrategy) -> SelectionStrategy:
    """'all' (every improving child), 'best' (the single best), an int k (top-k), or a gepa strategy."""
    if selection == "all":
        return AllImprovements()
    if selection == "best":
        return BestImprovement()
    if isinstance(selection, int) and not isinstance(selection, bool) and selection >= 1:
        return TopKImprovements(selection)
    if hasattr(selection, "select"):
        return selection  # type: ignore[return-value]
    raise ValueError(
        f"selection={selection!r} is not understood: use 'all', 'best', a positive int k (top-k), "
        "or a gepa SelectionStrategy instance."
    )


def unique_minibatches(tasks: Sequence[ProposalTask]) -> list[tuple[dict[str, str], list]]:
    """The (parent, minibatch) pairs gepa will evaluate with traces, deduplicated as gepa does."""
    seen: dict[tuple[int, tuple], tuple[dict[str, str], list]] = {}
    for task in tasks:
        seen.setdefault((task.parent_idx, tuple(task.minibatch_ids)), (task.parent_candidate, task.minibatch))
    return list(seen.values())
