"""BatchedGEPA end to end on the deterministic in-process simulated LM."""

import json
import os

import dspy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspy_pxn import BatchedGEPA, read_step_log
from dspy_pxn import testing as sim
from tests.budgets import smallest_step
from tests.compiling import compile_sim
from tests.conftest import seed_program

# Most tests here check the step loop's structure (widths, per-step counts, determinism); the
# async schedule, the default above 1×1, has its own invariants in test_async.py.
STEP_LOOP = {"schedule": "steps", "selection": "all"}


def candidates_of(result):
    return [{name: pred.signature.instructions for name, pred in c.named_predictors()} for c in result.candidates]


@pytest.mark.parametrize("use_merge", [True, False], ids=["dspy.GEPA's default use_merge", "use_merge=False"])
def test_1x1_proposes_the_same_candidates_as_dspy_gepa(task_lm, splits, use_merge):
    train, val, _ = splits
    budget = 200
    reference = dspy.GEPA(
        metric=sim.metric, max_metric_calls=budget, reflection_lm=sim.SimulatedLM(), num_threads=4,
        use_merge=use_merge, seed=3, track_stats=True,
    ).compile(seed_program(), trainset=train, valset=val).detailed_results
    ours = compile_sim(seed_program(), splits, p=1, n=1, max_metric_calls=budget, seed=3, use_merge=use_merge,
                       **STEP_LOOP).results

    theirs_candidates, our_candidates = candidates_of(reference), candidates_of(ours)
    assert len(our_candidates) >= 3, "the run should make progress for the comparison to mean something"
    # dspy.GEPA may overshoot the budget by one last step; ours stops before it.
    assert our_candidates == theirs_candidates[: len(our_candidates)]
    assert len(theirs_candidates) - len(our_candidates) <= 1
    assert ours.parents == reference.parents[: len(our_candidates)]
    assert ours.val_aggregate_scores == reference.val_aggregate_scores[: len(our_candidates)]
    assert ours.total_metric_calls <= budget


@pytest.mark.parametrize(
    ("p", "n", "budget", "minibatch"),
    [(1, 1, 50, 3), (2, 2, 97, 3), (8, 1, 151, 3), (2, 4, 133, 2), (4, 4, 300, 3), (3, 1, 40, 1), (16, 1, 30, 3)],
)
@pytest.mark.parametrize("schedule", ["steps", None])  # None: the default (async above 1×1)
def test_budget_is_never_exceeded_and_not_left_unused(task_lm, splits, p, n, budget, minibatch, schedule):
    result = compile_sim(
        seed_program(), splits, p=p, n=n, max_metric_calls=budget, reflection_minibatch_size=minibatch,
        schedule=schedule, selection=None,
    ).results
    val_size = len(splits.val)
    assert result.total_metric_calls <= budget
    # It stops only once no proposal can be screened and validated any more.
    assert budget - result.total_metric_calls < smallest_step(minibatch, val_size)
    assert sum(step.metric_calls for step in result.steps) + val_size == result.total_metric_calls
    if schedule == "steps":  # an async record window spans as many pipelines as ran during one validation
        assert all(step.width <= p * n for step in result.steps)


def test_steps_are_recorded_in_the_result_and_log_dir(task_lm, splits, tmp_path):
    log_dir = str(tmp_path / "run")
    result = compile_sim(seed_program(), splits, p=2, n=2, max_metric_calls=120, log_dir=log_dir, **STEP_LOOP).results
    logged = read_step_log(log_dir)
    assert [s.step for s in logged] == list(range(1, len(result.steps) + 1))
    assert logged == list(result.steps)
    assert os.path.exists(os.path.join(log_dir, "gepa_state.bin"))
    accepted = [idx for step in result.steps for idx in step.new_candidates]
    assert accepted == list(range(1, len(result.candidates)))
    for step in result.steps:
        assert step.full_validation == (step.accepted > 0)
        assert step.proposals <= step.width
        assert 0.0 <= step.worker_utilisation <= 1.0 + 1e-6
        json.loads(step.to_json())
    assert result.steps[-1].metric_calls_total == result.total_metric_calls
    assert result.steps[-1].best_val == max(result.val_aggregate_scores)


def test_validation_of_many_children_fills_the_whole_pool(splits):
    task = sim.SimulatedLM(task_latency=0.02)
    with dspy.context(lm=task):
        result = compile_sim(seed_program(), splits, p=4, n=2, max_metric_calls=250, num_threads=6, **STEP_LOOP).results
    assert task.stats()["max_in_flight"]["task"] == 6
    assert any(step.accepted >= 2 for step in result.steps)


def test_traces_are_captured_only_for_parent_minibatches(task_lm, splits, monkeypatch):
    from dspy_pxn.targets.program import adapter  # its rollout calls run_rollout

    train, val, _ = splits
    val_ids = {id(example) for example in val}
    calls = []
    original = adapter.run_rollout

    def recording(program, example, metric, capture_trace, *args):
        calls.append((id(example) in val_ids, capture_trace))
        return original(program, example, metric, capture_trace, *args)

    monkeypatch.setattr(adapter, "run_rollout", recording)
    optimizer = BatchedGEPA(metric=sim.metric, p=2, n=2, max_metric_calls=120, reflection_lm=sim.SimulatedLM(),
                            **STEP_LOOP)
    result = optimizer.compile(seed_program(), trainset=train, valset=val).detailed_results
    traced_val = [traced for is_val, traced in calls if is_val and traced]
    traced_train = [traced for is_val, traced in calls if not is_val and traced]
    untraced_train = [1 for is_val, traced in calls if not is_val and not traced]
    assert traced_val == []
    # Parents are traced (k·m per step), children are not (k·m per step).
    assert len(traced_train) == len(untraced_train) == sum(s.width for s in result.steps) * 3


@pytest.mark.parametrize("schedule", ["steps", "async"])
def test_each_evaluation_builds_its_program_once_and_its_rollouts_share_it(task_lm, splits, monkeypatch, schedule):
    """As dspy.GEPA: one program per evaluation (a candidate on a batch), shared by that batch's rollouts, so a
    program that keeps state between calls sees what it sees under dspy.GEPA, and no more builds than that."""
    import threading

    from dspy.teleprompt.gepa.gepa_utils import DspyAdapter

    from dspy_pxn.targets.program.adapter import BatchedAdapter

    evaluating, built, evaluations = threading.local(), [], []
    original_build, original_evaluate = DspyAdapter.build_program, BatchedAdapter._evaluate_many

    def build(self, candidate):
        if getattr(evaluating, "on", False):
            built.append(tuple(sorted(candidate.items())))
        return original_build(self, candidate)

    def evaluate(self, jobs, phase):
        evaluating.on = True
        evaluations.extend((tuple(sorted(candidate.items())), len(batch)) for candidate, batch, _ in jobs)
        try:
            return original_evaluate(self, jobs, phase)
        finally:
            evaluating.on = False

    monkeypatch.setattr(DspyAdapter, "build_program", build)
    monkeypatch.setattr(BatchedAdapter, "_evaluate_many", evaluate)
    result = compile_sim(seed_program(), splits, p=2, n=2, max_metric_calls=200, schedule=schedule,
                         selection="all").results
    assert len(result.candidates) > 1
    assert sorted(built) == sorted(candidate for candidate, size in evaluations if size)
    assert sum(size for _, size in evaluations) > 2 * len(built)  # each build serves a batch of rollouts


class Counting(dspy.Module):
    """A program that keeps state between calls: how many examples this instance has answered."""

    def __init__(self):
        super().__init__()
        self.solve = seed_program()
        self.answered = 0

    def forward(self, question):
        self.answered += 1
        return dspy.Prediction(answer=self.solve(question=question).answer, answered=self.answered)


def test_a_stateful_program_sees_a_fresh_instance_per_evaluation_as_under_dspy_gepa(task_lm, splits):
    train, val, _ = splits
    seen = {"dspy.GEPA": [], "BatchedGEPA": []}

    def metric_for(name):
        def metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
            if pred_name is None:
                seen[name].append(pred.answered)
            return sim.metric(gold, pred, trace, pred_name, pred_trace)
        return metric

    dspy.GEPA(metric=metric_for("dspy.GEPA"), max_metric_calls=60, reflection_lm=sim.SimulatedLM(), num_threads=1,
              track_stats=True).compile(Counting(), trainset=train, valset=val)
    BatchedGEPA(metric=metric_for("BatchedGEPA"), p=1, n=1, max_metric_calls=60, reflection_lm=sim.SimulatedLM(),
                num_threads=1).compile(Counting(), trainset=train, valset=val)
    # One thread: each evaluation's instance counts 1, 2, ... up to its batch size, never more.
    assert max(seen["BatchedGEPA"]) == max(seen["dspy.GEPA"]) == len(val)
    assert seen["BatchedGEPA"] == seen["dspy.GEPA"][: len(seen["BatchedGEPA"])]


def test_parents_of_a_step_are_distinct_once_the_front_allows(task_lm):
    train, val, _ = sim.make_splits(seed=1, train=45, val=20, test=10)
    optimizer = BatchedGEPA(metric=sim.metric, p=4, n=1, max_metric_calls=400, reflection_lm=sim.SimulatedLM(),
                            **STEP_LOOP)
    result = optimizer.compile(seed_program(), trainset=train, valset=val).detailed_results
    assert any(step.distinct_parents > 1 for step in result.steps)
    previous_front = 1
    for step in result.steps:
        assert step.distinct_parents >= min(step.width, previous_front)
        previous_front = step.pareto_front_size


@pytest.mark.parametrize("schedule", ["steps", None])
def test_returns_a_runnable_program_that_beats_the_seed(task_lm, splits, schedule):
    optimized, results = compile_sim(seed_program(), splits, p=2, n=2, max_metric_calls=300, schedule=schedule,
                                     selection=None)
    assert results.val_aggregate_scores[results.best_idx] > results.val_aggregate_scores[0]
    test = splits.test
    evaluate = dspy.Evaluate(devset=test, metric=sim.score, num_threads=4)
    assert evaluate(optimized).score > evaluate(seed_program()).score


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    p=st.integers(1, 6), n=st.integers(1, 4), minibatch=st.integers(1, 4),
    val_size=st.integers(1, 15), extra_budget=st.integers(0, 250), seed=st.integers(0, 3),
    schedule=st.sampled_from(["steps", None]),
)
def test_budget_property_over_many_shapes(task_lm, p, n, minibatch, val_size, extra_budget, seed, schedule):
    train, val, _ = sim.make_splits(seed=seed, train=20, val=val_size, test=1)
    budget = 2 * val_size + 2 * minibatch + extra_budget  # budgets that buy no step are refused (test_drop_in)
    optimizer = BatchedGEPA(
        metric=sim.metric, p=p, n=n, max_metric_calls=budget, reflection_minibatch_size=minibatch,
        reflection_lm=sim.SimulatedLM(), num_threads=4, seed=seed, schedule=schedule,
    )
    result = optimizer.compile(seed_program(), trainset=train, valset=val).detailed_results
    assert result.total_metric_calls <= budget
    assert budget - result.total_metric_calls < smallest_step(minibatch, val_size)
    assert sum(step.metric_calls for step in result.steps) + val_size == result.total_metric_calls
