"""A dspy.GEPA call with only the class name changed: P×N at the concurrency the call already had, never above it.

dspy.GEPA runs its rollouts on ``num_threads`` threads, or DSPy's ``num_threads`` setting when it is not
given; the same call to BatchedGEPA fills that many workers with proposals (``p="auto"``) and never runs
more rollouts at once. How much sooner, and how good, is measured side by side with dspy.GEPA in
``benchmarks/bench_schedules.py --configs "dspy.GEPA,BatchedGEPA"`` (``docs/benchmarks.md``).
"""

from types import SimpleNamespace

import dspy
import pytest

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from tests.scripts import ROOT, load_script


@pytest.mark.parametrize(("num_threads", "setting", "width"), [(16, None, 4), (None, None, 4), (None, 2, 2)],
                         ids=["num_threads=16", "DSPy's default", "dspy.context(num_threads=2)"])
def test_a_class_swap_runs_wide_at_the_calls_concurrency_and_never_above_it(num_threads, setting, width):
    train, val, _ = sim.make_splits(seed=0, train=60, val=30, test=1)
    task = sim.SimulatedLM(task_latency=0.01)
    arguments = dict(metric=sim.metric, max_metric_calls=600, reflection_lm=sim.SimulatedLM(reflection_latency=0.02))
    if num_threads is not None:
        arguments["num_threads"] = num_threads
    with dspy.context(lm=task, **({"num_threads": setting} if setting is not None else {})):
        result = BatchedGEPA(**arguments).compile(sim.seed_program(), trainset=train, valset=val).detailed_results
    workers = num_threads or setting or dspy.settings.num_threads  # DSPy's own default (8) when neither is set
    # p="auto": one proposal per worker, at most what buys six windows of proposals screened on up to 8 examples
    assert width == min(workers, 4)
    assert result.num_workers == workers
    assert {(step.p * step.n, step.schedule) for step in result.steps} == {(width, "async")}
    assert task.stats()["max_in_flight"]["task"] <= workers  # never more rollouts in flight than the call had
    assert result.total_metric_calls <= 600


def test_the_benchmarks_dollar_capped_class_swaps_keep_or_loosen_the_call_budget_as_named():
    """``bench_schedules.py``'s equal-dollar configs: "+$" is the same call with ``max_cost_usd`` added (its metric-call
    budget kept, whichever binds first ends the run); "$" loosens the metric calls so the dollars bind."""
    bench = load_script(ROOT / "benchmarks" / "bench_schedules.py")
    args = SimpleNamespace(budget=600, workers=16)
    capped = bench.optimizer("BatchedGEPA +$", args, sim.SimulatedLM(), seed=0, dollars=0.12).settings
    assert (capped.max_metric_calls, capped.max_cost_usd, capped.p) == (600, 0.12, "auto")
    bound = bench.optimizer("BatchedGEPA p4 $", args, sim.SimulatedLM(), seed=0, dollars=0.12).settings
    assert (bound.max_metric_calls, bound.max_cost_usd, bound.p) == (bench.EQUAL_DOLLARS_CALLS * 600, 0.12, 4)
    assert bench.as_schedule("BatchedGEPA +$") == bench.as_schedule("BatchedGEPA")
