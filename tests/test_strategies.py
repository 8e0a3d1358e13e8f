"""gepa strategies and the budget guard, one behaviour at a time (the pool and reflection have their own files)."""

import random
from types import SimpleNamespace

import dspy
from gepa.core.data_loader import ensure_loader
from gepa.proposer.base import CandidateProposal
from gepa.strategies.batch_sampler import EpochShuffledBatchSampler
from gepa.strategies.candidate_selector import ParetoCandidateSelector
from gepa.strategies.proposal_selection import AllImprovements

from dspy_pxn import testing as sim
from dspy_pxn.engine.events import StepEvents, StepListener, override
from dspy_pxn.engine.sampling import SequentialMinibatchSampler
from dspy_pxn.ledger.budget import BudgetGuard
from dspy_pxn.ledger.ledger import RunLedger
from dspy_pxn.pools import ThreadWorkerPool
from dspy_pxn.schedules.strategies import BudgetCappedSelection, DistinctParentsPxN, selected_within
from dspy_pxn.targets.program.adapter import BatchedAdapter


def test_sequential_sampler_matches_gepa_with_one_call_per_iteration():
    loader = ensure_loader(list(range(17)))
    ours, theirs = SequentialMinibatchSampler(3, random.Random(5)), EpochShuffledBatchSampler(3, random.Random(5))
    for i in range(40):
        state = SimpleNamespace(i=i)
        assert ours.next_minibatch_ids(loader, state) == theirs.next_minibatch_ids(loader, state)


def test_sequential_sampler_does_not_reuse_minibatches_across_wide_steps():
    loader = ensure_loader(list(range(48)))
    ours, theirs = SequentialMinibatchSampler(3, random.Random(0)), EpochShuffledBatchSampler(3, random.Random(0))
    ours_seen, theirs_seen = [], []
    for i in range(2):  # two steps of 8 tasks = 48 examples = one epoch
        state = SimpleNamespace(i=i)
        ours_seen += [tuple(ours.next_minibatch_ids(loader, state)) for _ in range(8)]
        theirs_seen += [tuple(theirs.next_minibatch_ids(loader, state)) for _ in range(8)]
    assert len(set(ours_seen)) == 16
    assert sorted(x for batch in ours_seen for x in batch) == list(range(48))
    assert len(set(theirs_seen)) < 16  # gepa's sampler repeats 7 of step 1's minibatches in step 2


class FrontState:
    """Just enough GEPAState for parent selection: programs 0..k, with a given front."""

    def __init__(self, scores, front):
        self.per_program_tracked_scores = scores
        self.program_candidates = [{"p": str(i)} for i in range(len(scores))]
        self._front = front
        self.total_num_evals = 0
        self.program_full_scores_val_set = scores

    def get_pareto_front_mapping(self):
        return self._front


class AlwaysSelects:
    def __init__(self, idx):
        self.idx, self.calls = idx, 0

    def select_candidate_idx(self, state):
        self.calls += 1
        return self.idx


def test_parents_are_topped_up_from_the_front_when_the_selector_repeats():
    state = FrontState([0.1, 0.9, 0.5, 0.7], {"a": {1}, "b": {3}, "c": {2}})
    sampler = DistinctParentsPxN(p=3, n=1, guard=BudgetGuard(10_000, 10, 3))
    assert sampler.choose_parents(state, AlwaysSelects(2), 3) == [2, 1, 3]


def test_parents_repeat_only_when_the_front_is_smaller_than_p():
    state = FrontState([0.1, 0.9], {"a": {1}})
    sampler = DistinctParentsPxN(p=4, n=1, guard=BudgetGuard(10_000, 10, 3))
    assert sampler.choose_parents(state, AlwaysSelects(1), 4) == [1, 1, 1, 1]


def test_a_front_no_larger_than_p_is_taken_whole_after_the_selectors_one_draw():
    # gepa's Pareto selector recomputes the front on every draw; with 2 non-dominated programs
    # and 4 parents wanted, draws after the first could only find what the front already says.
    state = FrontState([0.1, 0.9, 0.5, 0.7], {"a": {1}, "b": {3}, "c": {1, 3}})
    rng, one_draw = random.Random(0), random.Random(0)
    parents = DistinctParentsPxN(p=4, n=1, guard=BudgetGuard(10_000, 10, 3)).choose_parents(
        state, ParetoCandidateSelector(rng), 4)
    first = ParetoCandidateSelector(one_draw).select_candidate_idx(state)
    assert parents[0] == first and sorted(set(parents)) == [1, 3] and len(parents) == 4
    assert rng.getstate() == one_draw.getstate()  # exactly one draw's randomness consumed

    # A front larger than the parents wanted is still sampled by the selector, draw by draw.
    wide = FrontState([0.5] * 6, {i: {i} for i in range(6)})
    rng = random.Random(0)
    parents = DistinctParentsPxN(p=3, n=1, guard=BudgetGuard(10_000, 10, 3)).choose_parents(
        wide, ParetoCandidateSelector(rng), 3)
    assert len(set(parents)) == 3 and rng.getstate() != random.Random(0).getstate()


def test_a_single_parent_costs_exactly_one_selector_draw():
    selector = AlwaysSelects(0)
    DistinctParentsPxN(p=1, n=1, guard=BudgetGuard(1000, 10, 3)).choose_parents(FrontState([0.0], {"a": {0}}), selector, 1)
    assert selector.calls == 1


def test_budget_guard_sizes_steps():
    guard = BudgetGuard(max_metric_calls=100, valset_size=20, minibatch_size=3)
    state = SimpleNamespace(total_num_evals=50)
    assert guard.max_proposals(state) == 5  # 5·(3+3) + 20 = 50
    assert guard.max_validations(state) == 2
    assert guard.smallest_step() == 26
    crossing = BudgetGuard(100, 20, 1, crossover=True)
    assert crossing.smallest_step() == 22  # no crossover due: a reflective step, 2·1 + 20
    assert crossing.smallest_step(crossover_due=True) == 25  # a crossover first: 5 + 20


def proposal(before, after):
    return CandidateProposal(
        candidate={"x": str(after)}, parent_program_ids=[0], subsample_scores_before=before, subsample_scores_after=after
    )


def test_selection_validates_only_what_the_budget_pays_for_best_first():
    proposals = [proposal([0, 0, 0], [1, 0, 0]), proposal([0, 0, 0], [1, 1, 1]), proposal([0, 0, 0], [1, 1, 0])]
    guard = BudgetGuard(max_metric_calls=100, valset_size=20, minibatch_size=3)
    accept = SimpleNamespace(should_accept=lambda p, s: True)
    selected = BudgetCappedSelection(AllImprovements(), guard).select(proposals, SimpleNamespace(total_num_evals=55), accept)
    assert selected == [proposals[1], proposals[2]]  # room for 2 validations; order kept
    assert BudgetCappedSelection(AllImprovements(), guard).select(proposals, SimpleNamespace(total_num_evals=0), accept) == proposals
    # Within what a schedule reserved: the best improvement first, and nothing (no inner call) without room.
    assert selected_within(AllImprovements(), proposals, SimpleNamespace(total_num_evals=0), accept, 1) == [proposals[1]]
    assert selected_within(AllImprovements(), proposals, SimpleNamespace(total_num_evals=0), accept, 0) == []


class Heard(StepListener):
    def __init__(self):
        self.screened: list[tuple[int, int]] = []

    @override
    def children_screened(self, children, improved):
        self.screened.append((children, improved))


def test_the_step_loops_selection_reports_children_screened_and_improved():
    proposals = [proposal([0, 0, 0], [1, 0, 0]), proposal([1, 1, 1], [0, 0, 0]), proposal([0, 0, 0], [1, 1, 0])]
    heard = Heard()
    guard = BudgetGuard(max_metric_calls=100, valset_size=20, minibatch_size=3)
    improves = SimpleNamespace(should_accept=lambda p, s: sum(p.subsample_scores_after) > sum(p.subsample_scores_before))
    BudgetCappedSelection(AllImprovements(), guard, StepEvents([heard])).select(
        proposals, SimpleNamespace(total_num_evals=0), improves)
    assert heard.screened == [(3, 2)]


def test_reservations_keep_the_budget_exact_with_work_in_flight():
    """What the async schedule does with the guard: promise work, spend it as it lands, release the rest; the
    guard alone keeps what the work in flight may still give back."""
    guard = BudgetGuard(max_metric_calls=60, valset_size=10, minibatch_size=3)
    state = SpentCalls(10)  # the seed's validation
    pipelines = []
    while (reservation := guard.reserve_proposal(state)) is not None:  # each keeps |val| free beside it
        pipelines.append(reservation)
    assert len(pipelines) == 6 and guard.reserved == 36 and guard.remaining(state) == 14  # 10 + 36 + 14 = 60
    assert guard.can_still_validate(state) and sum(r.releasable for r in guard.open) == 18  # each child's 3
    guard.spend(state, 3)  # a parent's screening landed
    guard.release(pipelines[0], 3)  # ... and its child was never made (perfect parent)
    guard.close(pipelines[0])
    assert state.total_num_evals == 13 and guard.reserved == 30 and guard.remaining(state) == 17
    validation = guard.reserve_validations(state, wanted=5)
    assert validation.validations == 1  # 17 calls pay for one validation of 10
    assert guard.reserved == 40 and guard.remaining(state) == 7 and guard.reserve_proposal(state) is None
    for pipeline in pipelines[1:]:  # the five other pipelines reflect, then screen parent and child
        guard.commit(pipeline)
        guard.spend(state, 6)
        guard.close(pipeline)
    assert sum(r.releasable for r in guard.open) == 10  # the validation's, until its candidate is chosen
    guard.commit(validation)
    assert not guard.can_still_validate(state)  # 7 left, and nothing in flight can give any back
    guard.spend(state, 10)  # the validation
    guard.close(validation)
    assert guard.reserved == 0 and not guard.open and state.total_num_evals == 53 <= guard.max_metric_calls
    ledger = RunLedger()
    assert guard.ended(state, ledger) and ledger.stopped_by == "max_metric_calls"  # the guard says its budget ended it


class SpentCalls:
    def __init__(self, spent):
        self.total_num_evals = spent

    def increment_evals(self, count):
        self.total_num_evals += count


def test_a_rollout_that_raises_scores_the_failure_score_and_the_others_survive():
    class Fragile(dspy.Module):
        def __init__(self):
            super().__init__()
            self.predict = dspy.Predict("question -> answer")

        def forward(self, question):
            if "17" in question:
                raise RuntimeError("tool crashed")
            return self.predict(question=question)

    examples = [dspy.Example(question=f"Apply rule zorp to {x}.", answer=str(3 * x + 1)).with_inputs("question") for x in (5, 17, 9)]
    with ThreadWorkerPool(2) as pool, dspy.context(lm=sim.SimulatedLM()):
        adapter = BatchedAdapter(student_module=Fragile(), metric_fn=sim.metric, feedback_map={}, pool=pool, failure_score=-1.0)
        candidate = {"predict": "zorp(x) = 3*x + 1"}
        evaluation = adapter.evaluate(examples, candidate, capture_traces=True)
    assert evaluation.scores == [1.0, -1.0, 1.0]
    assert [t["example_ind"] for t in evaluation.trajectories] == [0, 2]


def test_dominated_programs_are_not_used_to_top_up():
    # Program 1 is only best where program 2 is too, so 2 dominates it: the front is {2, 3}.
    state = FrontState([0.1, 0.9, 0.5, 0.7], {"a": {1, 2}, "b": {3}, "c": {2}})
    sampler = DistinctParentsPxN(p=3, n=1, guard=BudgetGuard(10_000, 10, 3))
    assert sampler.choose_parents(state, AlwaysSelects(2), 3) == [2, 3, 2]
