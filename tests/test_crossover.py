"""gepa's crossover (use_merge=True, dspy.GEPA's default) runs under both schedules, within the budget.

A crossover needs two candidates that each changed a different component of a common ancestor, so
the program here has two predictors: each answers the questions about half of the rules, and each
learns only from its own questions' feedback.
"""

import dspy
import pytest

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim

EARLY = {rule.name for rule in sim.RULES[::2]}


class Router(dspy.Module):
    """Two predictors, one per half of the rules: a crossover can join what each half learned."""

    def __init__(self):
        super().__init__()
        self.early = sim.seed_program()
        self.late = sim.seed_program()

    def forward(self, question):
        rule = question.split()[2]  # "Apply rule zorp to 3."
        return (self.early if rule in EARLY else self.late)(question=question)


class Heard:
    """A gepa callback: the crossovers the run announced."""

    def __init__(self):
        self.attempted, self.accepted = [], []

    def on_merge_attempted(self, event):
        self.attempted.append(event["parent_ids"])

    def on_merge_accepted(self, event):
        self.accepted.append(event["new_candidate_idx"])


@pytest.mark.parametrize("schedule", ["steps", "async"])
def test_the_crossover_runs_on_a_two_predictor_program_within_budget(schedule):
    """Children validated one by one (``selection="all"``) leave the branches a crossover joins; the sibling merge,
    which folds them into the pool's best, leaves it fewer to join. (Pipelines started beside a validation build on
    its candidate, so the async schedule branches less: 1000 calls leave it room to branch.)"""
    train, val, _ = sim.make_splits(seed=2, train=60, val=16, test=1)
    heard = Heard()
    with dspy.context(lm=sim.SimulatedLM(landscape="breadth")):
        result = BatchedGEPA(metric=sim.metric, p=4, n=1, max_metric_calls=1000, num_threads=8, schedule=schedule,
                             selection="all", reflection_lm=sim.SimulatedLM(landscape="breadth"),
                             gepa_kwargs={"callbacks": [heard]},
                             seed=1, max_merge_invocations=3).compile(Router(), trainset=train, valset=val
                                                                      ).detailed_results
    assert heard.attempted, "a two-predictor program whose halves improve apart should call for a crossover"
    assert all(len(parents) == 2 for parents in heard.attempted)
    if schedule == "async":  # gepa's loop bounds the crossovers it owes, not those it accepts (6 here, of 3)
        assert len(heard.accepted) <= 3
    for index in heard.accepted:  # a crossover joins the pool with both its parents
        assert len(result.parents[index]) == 2
    assert result.total_metric_calls <= 1000


def test_without_use_merge_no_crossover_is_tried():
    train, val, _ = sim.make_splits(seed=2, train=60, val=16, test=1)
    heard = Heard()
    with dspy.context(lm=sim.SimulatedLM(landscape="breadth")):
        BatchedGEPA(metric=sim.metric, p=4, n=1, max_metric_calls=400, num_threads=8, use_merge=False,
                    reflection_lm=sim.SimulatedLM(landscape="breadth"), gepa_kwargs={"callbacks": [heard]},
                    seed=1).compile(
            Router(), trainset=train, valset=val)
    assert heard.attempted == []


@pytest.mark.parametrize("schedule", ["steps", "async"])
def test_every_validated_candidate_a_crossover_included_is_one_row_of_the_proposals_table(schedule):
    from dspy_pxn.tracking.lineage import VALIDATED, LineageObserver

    train, val, _ = sim.make_splits(seed=0, train=60, val=16, test=1)
    lineage, heard = LineageObserver(), Heard()
    with dspy.context(lm=sim.SimulatedLM(landscape="breadth")):
        result = BatchedGEPA(metric=sim.metric, p=4, n=1, max_metric_calls=700, num_threads=8, schedule=schedule,
                             reflection_lm=sim.SimulatedLM(landscape="breadth"), reflection_minibatch_size=3,
                             gepa_kwargs={"callbacks": [lineage, heard]},
                             seed=0).compile(Router(), trainset=train, valset=val).detailed_results
    if schedule == "steps":  # deterministic: this seed's run accepts crossovers (the async one may or may not)
        assert heard.accepted
    validated = sorted(row.candidate for row in lineage.proposals if row.outcome == VALIDATED)
    assert validated == list(range(1, len(result.candidates)))  # crossovers among them, each once
