"""BatchedGEPA through the real dspy.LM -> litellm -> HTTP path, measured at the server."""

import dspy

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.testing import LatencyServer
from tests.conftest import seed_program


def test_pxn_run_overlaps_reflections_and_spends_exactly_its_metric_calls():
    train, val, _ = sim.make_splits(seed=0, train=40, val=12, test=10)
    with LatencyServer(task_latency=0.05, reflection_latency=0.4) as server:
        optimizer = BatchedGEPA(
            metric=sim.metric, p=4, n=2, max_metric_calls=160, num_threads=8, reflection_lm=server.lm("reflection"),
            schedule="steps", selection="all",  # one round of reflections per step: the step loop's claim
        )
        with dspy.context(lm=server.lm("task")):
            result = optimizer.compile(seed_program(), trainset=train, valset=val).detailed_results
        stats = server.stats()
    assert stats["max_in_flight"]["reflection"] == 8 == max(step.width for step in result.steps)
    assert stats["max_in_flight"]["task"] == 8
    # No cache and one LM call per rollout: the server saw exactly the metric calls gepa counted.
    assert stats["calls"]["task"] == result.total_metric_calls <= 160
    # One reflection call per sampled task, less the parents skipped for a perfect minibatch.
    assert sum(s.proposals for s in result.steps) <= stats["calls"]["reflection"] <= sum(s.width for s in result.steps)
