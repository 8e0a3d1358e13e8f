"""gepa strategies that make a P×N step wide, diverse and exactly on budget.

Each is a small class passed to ``gepa.optimize`` through its own extension points
(sampling, selection, batch sampler, stopper); none changes gepa's engine.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from gepa.core.data_loader import DataLoader
from gepa.core.state import GEPAState
from gepa.proposer.base import CandidateProposal
from gepa.proposer.reflective_mutation.base import CandidateSelector
from gepa.strategies.acceptance import AcceptanceCriterion
from gepa.strategies.batch_sampler import BatchSampler
from gepa.strategies.candidate_selector import ParetoCandidateSelector
from gepa.strategies.proposal_sampling import ProposalTask
from gepa.strategies.proposal_selection import SelectionStrategy

from dspy_pxn.engine.candidates import improvement, pareto_front_programs
from dspy_pxn.engine.events import StepEvents
from dspy_pxn.ledger.budget import BudgetGuard
from dspy_pxn.ledger.caps import RunCaps
from dspy_pxn.ledger.ledger import RunLedger

# Selector draws per parent wanted before DistinctParentsPxN tops its parents up from the Pareto front.
DRAWS_PER_PARENT = 8


class ExactBudgetStopper:
    """Stops when the remaining budget cannot pay for the smallest useful step (a crossover's, when gepa's
    loop will try one next: ``crossover_due``). ``max_metric_calls``: gepa's progress bar and remaining-budget
    events read it as they read their own MaxMetricCallsStopper's.
    """

    def __init__(self, guard: BudgetGuard, ledger: RunLedger, crossover_due: Callable[[], bool] = lambda: False):
        self.guard, self.ledger, self.crossover_due = guard, ledger, crossover_due
        self.max_metric_calls = guard.max_metric_calls

    def __call__(self, gepa_state: GEPAState) -> bool:
        return self.guard.ended(gepa_state, self.ledger, self.crossover_due())


def stopper_telling(stop: RunLedger, stopper: Callable[[GEPAState], bool]) -> Callable[[GEPAState], bool]:
    """A user's gepa stopper (``gepa_kwargs["stop_callbacks"]``) that, when it ends the run, says so on the run's
    stop signal, so the run reports ``stopped_by="stop_callbacks"``."""

    def telling(gepa_state: GEPAState) -> bool:
        if not stopper(gepa_state):
            return False
        stop.end("stop_callbacks", f"{getattr(stopper, '__name__', type(stopper).__name__)} said the run is over")
        return True

    return telling


class CapsStopper:
    """Stops before a step the run's dollars or deadline cannot pay for or finish (``dspy_pxn.ledger.caps``):
    P·N screenings, their reflections and one validation, at what the run measured so far."""

    def __init__(self, caps: RunCaps, guard: BudgetGuard, width: int, workers: int):
        self.caps, self.guard, self.width, self.workers = caps, guard, width, workers

    def __call__(self, gepa_state: GEPAState) -> bool:
        screening = self.width * self.guard.proposal_cost()
        waves = 2 * -(-screening // (2 * self.workers)) + -(-self.guard.valset_size // self.workers)
        return self.caps.blocks(rollouts=screening + self.guard.valset_size, reflections=self.width,
                                rollout_waves=waves, reflections_in_series=1) is not None


class DistinctParentsPxN:
    """P distinct parents × N mutations each, narrowed to what the budget can pay for.

    gepa's ``PxNSampling`` draws parents with replacement, so an 8×1 step often mutates the same parent
    several times. Here parents are drawn from the candidate selector until P distinct ones are found
    (bounded attempts), then topped up from the Pareto front; only a front smaller than P repeats parents.
    Each task gets its own minibatch. The first draw is the selector's own, so 1×1 consumes the RNG exactly
    as gepa's ``SingleMutationSampling``.
    """

    def __init__(self, p: int, n: int, guard: BudgetGuard, events: StepEvents | None = None,
                 one_at_a_time: Callable[[], bool] = lambda: False):
        self.p, self.n, self.guard = p, n, guard
        self.events = events or StepEvents()
        self.one_at_a_time = one_at_a_time  # True once the run cannot merge: a step is one proposal from then on

    def choose_parents(self, state: GEPAState, selector: CandidateSelector, count: int) -> list[int]:
        parents = [selector.select_candidate_idx(state)]  # the selector's own first draw, as gepa's
        if count == 1:
            return parents
        front = pareto_front_programs(state)
        draws = count * DRAWS_PER_PARENT - 1
        if type(selector) is ParetoCandidateSelector and len(front) <= count:
            # gepa's Pareto selector draws from exactly this front, and every draw recomputes it
            # (quadratic in the programs): more draws could only find the members taken below.
            draws = 0
        for _ in range(draws):
            if len(parents) == count:
                return parents
            parent = selector.select_candidate_idx(state)
            if parent not in parents:
                parents.append(parent)
        parents += [program for program in front if program not in parents][:count - len(parents)]
        return parents + [parents[i % len(parents)] for i in range(len(parents), count)]

    def sample_tasks(self, state: GEPAState, candidate_selector: CandidateSelector, batch_sampler: BatchSampler,
                     trainset: DataLoader) -> list[ProposalTask]:
        width = min(1 if self.one_at_a_time() else self.p * self.n, self.guard.max_proposals(state))
        if width < 1:
            return []
        parents = self.choose_parents(state, candidate_selector, math.ceil(width / self.n))
        # Fewer rows than the minibatch only for a first proposal the budget cannot pay for in full.
        rows = self.guard.screening_rows(self.guard.remaining(state), self.guard.first_proposal(state))
        tasks: list[ProposalTask] = []
        for parent in [parent for parent in parents for _ in range(self.n)][:width]:
            ids = batch_sampler.next_minibatch_ids(trainset, state)[:rows]
            tasks.append(ProposalTask(parent, state.program_candidates[parent], ids, trainset.fetch(ids)))
        self.events.tasks_sampled(tasks)
        return tasks


class BudgetCappedSelection:
    """Wraps a selection strategy so gepa's step loop never validates past the budget.

    When the budget validates fewer children than were selected, the ones with the largest minibatch
    improvement go first (``selected_within``, which the asynchronous schedule calls with the validations
    it reserved). ``select`` also reports the step's screening, which gepa's loop does not tell, and says validation
    starts (``validating``: the adapter's phase from here on).
    """

    def __init__(self, inner: SelectionStrategy, guard: BudgetGuard, events: StepEvents | None = None,
                 validating: Callable[[], None] = lambda: None):
        self.inner, self.guard, self.validating = inner, guard, validating
        self.events = events or StepEvents()

    def select(self, proposals: list[CandidateProposal], state: GEPAState,
               acceptance_criterion: AcceptanceCriterion) -> list[CandidateProposal]:
        # gepa memoizes the criterion per batch, so counting improvers here is free; the
        # runtime model needs this per-proposal pass rate, which "best"/top-k selection hides.
        improved = sum(acceptance_criterion.should_accept(p, state) for p in proposals)
        self.events.children_screened(len(proposals), improved)
        self.validating()
        return selected_within(self.inner, proposals, state, acceptance_criterion, self.guard.max_validations(state))


def selected_within(selection: SelectionStrategy, proposals: list[CandidateProposal], state: GEPAState,
                    acceptance_criterion: AcceptanceCriterion, validations: int) -> list[CandidateProposal]:
    """``selection``'s choice, cut to at most ``validations`` candidates, best improvement first (ties keep
    proposal order)."""
    if validations < 1:
        return []
    selected = selection.select(proposals, state, acceptance_criterion)
    if len(selected) <= validations:
        return selected
    ranked = sorted(selected, key=improvement, reverse=True)[:validations]
    keep = {id(p) for p in ranked}
    return [p for p in selected if id(p) in keep]
