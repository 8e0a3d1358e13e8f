"""Budgets in dollars and a deadline, against the latency server: every call over HTTP, on each DSPy engine.

The server bills what a provider would (its own token counts per model, ``stats()["tokens"]``), so
"never over the cap" and "dollars exact" are checked against the server's bill, not our own count.
"""

from __future__ import annotations

import os
import re
import time

import dspy
import pytest
from gepa.core.state import GEPAState
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspy_pxn import BatchedGEPA, read_step_log
from dspy_pxn import testing as sim
from dspy_pxn.engine.resume import saved_dollars
from dspy_pxn.engine.width import auto_parents
from dspy_pxn.ledger.budget import RunShape
from dspy_pxn.ledger.caps import RunCaps
from dspy_pxn.ledger.ledger import REFLECTING, RunLedger
from dspy_pxn.ledger.prices import Price
from dspy_pxn.testing import LatencyServer
from tests.budgets import smallest_step
from tests.compiling import compile_sim
from tests.prices import PRICES, priced_models

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = pytest.importorskip("litellm")

@pytest.fixture(scope="module")
def priced():
    with priced_models():
        yield


@pytest.fixture(scope="module")
def server(priced):
    with LatencyServer(task_latency=0.02, reflection_latency=0.04) as running:
        yield running


def billed(stats: dict, model: str | None = None) -> float:
    """What the server's token counts cost at the registered prices."""
    total = 0.0
    for name, tokens in stats["tokens"].items():
        prompt, completion = PRICES[f"openai/{name}"]
        if model is None or name == model:
            total += tokens["prompt"] * prompt + tokens["completion"] * completion
    return total


def compile_priced(server, engine, *, schedule="async", p=4, budget=3000, val=8, seed=0, log_dir=None, **caps):
    """A run on the server's priced models, and what the server billed for it."""
    server.reset_stats()
    result = compile_sim(
        splits=sim.make_splits(seed=seed, train=40, val=val, test=1),
        lm=server.lm("priced-task", max_tokens=150, **engine),
        reflection_lm=server.lm("priced-reflection", max_tokens=300, temperature=1.0, **engine),
        p=p, n=1, max_metric_calls=budget, num_threads=12, schedule=schedule, seed=seed, log_dir=log_dir, **caps,
    ).results
    return result, server.stats()


@pytest.mark.parametrize("schedule", ["async", "steps"])
@pytest.mark.parametrize(("seed", "cap"), [(0, 0.02), (1, 0.035), (2, 0.05)])
def test_a_dollar_cap_is_never_exceeded_and_the_dollars_are_exact(server, schedule, seed, cap, engine):
    result, stats = compile_priced(server, engine, schedule=schedule, seed=seed, max_cost_usd=cap)
    spent = billed(stats)
    assert spent <= cap
    assert result.stopped_by == "max_cost_usd"  # the metric-call budget is far from binding
    assert result.usage.cost_usd == pytest.approx(spent, rel=1e-9, abs=1e-12)  # every billed call, once
    assert spent > 0.3 * cap  # the cap is spent, not left mostly unused
    assert result.total_metric_calls <= 3000 and len(result.candidates) >= 1
    if result.steps:
        assert result.steps[-1].cost_usd_left == pytest.approx(cap - spent, abs=1e-9)


def test_the_dollars_left_are_counted_in_metric_calls_at_the_runs_cost_per_call():
    """What ``p="auto"`` plans from under a dollar cap: the dollars left over the dollars per metric call so far, by
    the cap that buys the fewest; nothing before a priced call or without a dollar cap."""
    ledger = RunLedger({"openai/a": Price(1e-6, 2e-6)})
    assert RunCaps(ledger, 1.0, None, None).metric_calls_affordable(10) is None  # nothing spent yet
    billed = {"prompt_tokens": 100, "completion_tokens": 10}  # $0.00012 a call
    with dspy.context(**{REFLECTING: True}):
        ledger.add_usage("openai/a", billed)
    for _ in range(3):
        ledger.add_usage("openai/a", billed)
    spent = 4 * 1.2e-4  # a quarter of it reflection's
    assert RunCaps(ledger, 0.01, None, None).metric_calls_affordable(20) == pytest.approx((0.01 - spent) / (spent / 20))
    reflection_cap = RunCaps(ledger, 1.0, 0.001, None).metric_calls_affordable(20)  # the reflection cap buys fewer
    assert reflection_cap == pytest.approx((0.001 - 1.2e-4) / (1.2e-4 / 20))
    assert RunCaps(ledger, None, None, 60.0).metric_calls_affordable(20) is None  # a deadline alone counts no dollars


def test_auto_width_follows_the_calls_a_binding_dollar_cap_buys(server, engine, caplog):
    """p="auto" plans its width from max_metric_calls; where the dollars will bind long before those calls are
    spent, it is planned again from the calls the dollars left buy, so the run keeps its validation windows."""
    with caplog.at_level("INFO", logger="dspy_pxn.engine.width"):
        result, stats = compile_priced(server, engine, p="auto", budget=3000, max_cost_usd=0.3)
    assert billed(stats) <= 0.3 and result.stopped_by == "max_cost_usd"
    said = [r.getMessage() for r in caplog.records if "proposals in flight, not" in r.getMessage()]
    assert said  # narrowed, and said so each time it narrowed further
    for message in said:
        width, planned, affordable = map(int, re.match(r"p='auto': (\d+) proposals in flight, not (\d+): the dollar "
                                                       r"cap buys about (\d+) metric calls", message).groups())
        assert planned == 12 and width == auto_parents(RunShape(12, affordable, 8, 3), 1) < planned
        assert affordable < 3000
    widths_said = [int(message.split()[1]) for message in said]
    assert widths_said == sorted(widths_said, reverse=True) and result.total_metric_calls < 3000
    with caplog.at_level("INFO", logger="dspy_pxn.engine.width"):
        caplog.clear()
        loose, _ = compile_priced(server, engine, p="auto", budget=200, max_cost_usd=10.0)  # the calls bind first
    assert loose.stopped_by == "max_metric_calls"
    assert not [r for r in caplog.records if "proposals in flight, not" in r.getMessage()]


@pytest.mark.parametrize("schedule", ["async", "steps"])
def test_the_metric_call_budget_still_ends_the_run_when_it_binds_first(server, schedule, engine):
    result, stats = compile_priced(server, engine, schedule=schedule, budget=60, max_cost_usd=10.0)
    assert result.stopped_by == "max_metric_calls"
    assert result.total_metric_calls <= 60 and billed(stats) < 10.0


@pytest.mark.parametrize("schedule", ["async", "steps"])
def test_a_reflection_cap_holds_the_reflection_lm_alone(server, schedule, engine):
    cap = 0.004
    result, stats = compile_priced(server, engine, schedule=schedule, gepa_kwargs={"max_reflection_cost": cap})
    assert billed(stats, "sim-priced-reflection") <= cap
    assert result.stopped_by == "max_reflection_cost"
    assert billed(stats, "sim-priced-task") > 0


def test_the_mlflow_prompt_optimizer_takes_the_reflection_cap_by_the_same_name():
    """One name for one thing: gepa's ``max_reflection_cost`` in ``gepa_kwargs``, on both optimizers."""
    pytest.importorskip("mlflow")
    from dspy_pxn.tracking import BatchedGepaPromptOptimizer

    optimizer = BatchedGepaPromptOptimizer(reflection_model=dspy.LM("openai/gpt-4.1-mini", api_key="x"),
                                           max_metric_calls=300, gepa_kwargs={"max_reflection_cost": 2.5})
    assert optimizer._checked.max_reflection_cost_usd == 2.5
    with pytest.raises(TypeError, match="max_reflection_cost_usd"):
        BatchedGepaPromptOptimizer(reflection_model="openai:/gpt-4.1-mini", max_reflection_cost_usd=2.5)


def test_gepas_max_reflection_cost_is_the_same_cap():
    optimizer = BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(), max_metric_calls=100,
                            gepa_kwargs={"max_reflection_cost": 2.5})
    assert optimizer.settings.max_reflection_cost_usd == 2.5 and "max_reflection_cost" not in optimizer.settings.gepa_kwargs
    assert optimizer.gepa_kwargs == {"max_reflection_cost": 2.5}  # dspy.GEPA's attribute: what was passed


@pytest.mark.parametrize(("argument", "value"), [("max_cost_usd", 0), ("max_cost_usd", -1.0), ("max_wall_s", "1h"),
                                                 ("max_reflection_cost", float("inf"))])
def test_a_cap_that_is_not_a_positive_number_is_refused_by_name(argument, value):
    given = {"gepa_kwargs": {argument: value}} if argument == "max_reflection_cost" else {argument: value}
    with pytest.raises(ValueError, match=rf"{argument}\W* must be a number above 0"):
        BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(), max_metric_calls=100, **given)


def test_a_model_no_price_map_knows_is_refused_before_any_call(server):
    unknown = dspy.LM("openai/model-nobody-priced", api_base="https://llm.example.com/v1", api_key="k",
                      max_tokens=100)
    train, val, _ = sim.make_splits(seed=0, train=10, val=4, test=1)
    server.reset_stats()
    with dspy.context(lm=unknown), pytest.raises(ValueError, match=r"price map.*litellm\.register_model.*cost_per_token"):
        BatchedGEPA(metric=sim.metric, reflection_lm=server.lm("priced-reflection", max_tokens=300),
                    max_metric_calls=100, max_cost_usd=1.0).compile(sim.seed_program(), trainset=train, valset=val)
    assert server.stats()["requests"]["calls"]["total"] == 0


def test_a_priced_model_without_max_tokens_is_refused_naming_it(server, engine):
    train, val, _ = sim.make_splits(seed=0, train=10, val=4, test=1)
    with dspy.context(lm=server.lm("priced-task", **engine)), pytest.raises(ValueError, match=r"max_tokens=\.\.\."):
        BatchedGEPA(metric=sim.metric, reflection_lm=server.lm("priced-reflection", max_tokens=300, **engine),
                    max_metric_calls=100, max_cost_usd=1.0).compile(sim.seed_program(), trainset=train, valset=val)


def test_a_model_served_on_localhost_costs_nothing(server, engine):
    """An unregistered model at a loopback api_base is priced at 0: the cap never binds."""
    train, val, _ = sim.make_splits(seed=0, train=30, val=6, test=1)
    with dspy.context(lm=server.lm("local-task", **engine)):
        result = BatchedGEPA(metric=sim.metric, p=2, reflection_lm=server.lm("local-reflection", **engine), num_threads=8,
                             max_metric_calls=80, max_cost_usd=0.000001).compile(
            sim.seed_program(), trainset=train, valset=val).detailed_results
    assert result.stopped_by == "max_metric_calls"


def test_a_cap_that_cannot_pay_for_the_seeds_validation_says_so(server, engine):
    with pytest.raises(ValueError, match="ran out while the seed program was scored on the valset"):
        compile_priced(server, engine, max_cost_usd=0.0005)


@pytest.mark.parametrize("schedule", ["async", "steps"])
def test_a_deadline_is_met_within_one_calls_latency(priced, schedule, engine):
    deadline, reflection_latency = 3.0, 0.5
    with LatencyServer(task_latency=0.25, reflection_latency=reflection_latency) as slow:
        started = time.perf_counter()
        result, _ = compile_priced(slow, engine, schedule=schedule, budget=5000, max_wall_s=deadline)
        elapsed = time.perf_counter() - started
    assert result.stopped_by == "max_wall_s"
    # The search ends within one call of the deadline (plus the driver's own bookkeeping on a busy machine).
    assert result.wall_s <= deadline + reflection_latency + 0.5
    assert elapsed <= deadline + reflection_latency + 1.5
    assert len(result.candidates) >= 1 and result.total_metric_calls < 5000


@pytest.mark.parametrize("schedule", ["async", "steps"])
def test_a_resumed_run_keeps_the_dollars_it_had_spent(server, tmp_path, schedule, engine):
    log_dir = str(tmp_path / "run")
    first, first_stats = compile_priced(server, engine, schedule=schedule, log_dir=log_dir, max_cost_usd=0.015)
    first_spent = billed(first_stats)
    assert first.stopped_by == "max_cost_usd"
    assert saved_dollars(GEPAState.load(log_dir))[0] == pytest.approx(first_spent, rel=1e-9)
    # The same cap again: nothing is left to spend beyond a call or two's worth, so the run ends at once.
    again, again_stats = compile_priced(server, engine, schedule=schedule, log_dir=log_dir, max_cost_usd=0.015)
    assert first_spent + billed(again_stats) <= 0.015
    # A larger cap continues from what was spent, and the two runs together stay within it.
    more, more_stats = compile_priced(server, engine, schedule=schedule, log_dir=log_dir, max_cost_usd=0.03)
    total = first_spent + billed(again_stats) + billed(more_stats)
    assert total <= 0.03 and billed(more_stats) > 0
    assert saved_dollars(GEPAState.load(log_dir))[0] == pytest.approx(total, rel=1e-9)
    assert read_step_log(log_dir)[-1].cost_usd_left == pytest.approx(0.03 - total, abs=1e-9)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    schedule=st.sampled_from(["async", "steps"]), p=st.integers(1, 4), n=st.integers(1, 2),
    workers=st.integers(1, 8), cap=st.floats(0.01, 0.06), seed=st.integers(0, 3),
    selection=st.sampled_from(["all", "best", "merge"]),
)
def test_dollar_cap_property(priced, schedule, p, n, workers, cap, seed, selection):
    """Any shape, schedule, selection and cap: the run never spends more than the cap, and the meter's dollars
    are the sum of the calls' costs (the in-process model reports each call's tokens)."""
    train, val, _ = sim.make_splits(seed=seed, train=30, val=5, test=1)
    task = sim.SimulatedLM(model="openai/sim-priced-task", max_tokens=300)
    reflection = sim.SimulatedLM(model="openai/sim-priced-reflection", max_tokens=600)
    with dspy.context(lm=task):
        result = BatchedGEPA(
            metric=sim.metric, p=p, n=n, max_metric_calls=5000, num_threads=workers, schedule=schedule,
            selection=selection, seed=seed, reflection_lm=reflection, max_cost_usd=cap,
        ).compile(sim.seed_program(), trainset=train, valset=val).detailed_results
    spent = sum(PRICES[lm.model][0] * lm.stats()["tokens"]["prompt"]
                + PRICES[lm.model][1] * lm.stats()["tokens"]["completion"] for lm in (task, reflection))
    assert spent <= cap
    assert result.usage.cost_usd == pytest.approx(spent, rel=1e-9, abs=1e-12)
    assert result.stopped_by == "max_cost_usd"


@pytest.mark.parametrize("schedule", ["async", "steps"])
@pytest.mark.parametrize(("level", "minibatch", "p"), [("light", 1, 1), ("light", 3, 4), ("medium", 5, 2),
                                                      ("light", 4, 4)])
def test_auto_is_dspy_gepas_budget_spent_to_the_last_step_it_pays_for(schedule, level, minibatch, p, caplog):
    train, val, _ = sim.make_splits(seed=0, train=40, val=6, test=1)
    budget = dspy.GEPA(metric=sim.metric, auto=level, reflection_lm=sim.SimulatedLM()).auto_budget(
        num_preds=1, num_candidates={"light": 6, "medium": 12}[level], valset_size=len(val))
    with dspy.context(lm=sim.SimulatedLM()), caplog.at_level("INFO", logger="dspy_pxn"):
        result = BatchedGEPA(metric=sim.metric, auto=level, p=p, reflection_minibatch_size=minibatch,
                             schedule=schedule, reflection_lm=sim.SimulatedLM(temperature=1.0)).compile(
            sim.seed_program(), trainset=train, valset=val).detailed_results
    assert result.budget == budget and result.stopped_by == "auto"
    assert budget - smallest_step(minibatch, len(val)) < result.total_metric_calls <= budget
    assert any(f"auto={level!r}: {budget} metric calls, as dspy.GEPA's auto gives" in r.getMessage()
               for r in caplog.records)


def test_mlflow_shows_the_dollars_and_time_left_and_which_budget_ended_the_run(server, tmp_path, engine):
    mlflow = pytest.importorskip("mlflow")
    from dspy_pxn.tracking import MlflowTracker

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    result, stats = compile_priced(server, engine, max_cost_usd=0.03, max_wall_s=600,
                                   tracker=MlflowTracker(tracking_uri=uri, experiment="caps"))
    client = mlflow.MlflowClient(uri)
    run = client.get_run(result.mlflow_run_id)
    assert run.data.tags["dspy_pxn.stopped_by"] == "max_cost_usd"
    assert run.data.params["max_cost_usd"] == "0.03" and run.data.params["max_wall_s"] == "600.0"
    left = client.get_metric_history(run.info.run_id, "budget/cost_usd_left")
    assert left and left[-1].value == pytest.approx(0.03 - billed(stats), abs=1e-9)
    assert all(a.value >= b.value for a, b in zip(left, left[1:]))  # dollars left only go down
    seconds = client.get_metric_history(run.info.run_id, "budget/wall_s_left")
    assert seconds and 0 < seconds[-1].value < 600
    # The time left is the first budget's: the dollars run out long before 600 s or 3000 metric calls.
    eta = client.get_metric_history(run.info.run_id, "budget/time_left_s")
    assert eta and all(e.value < s.value for e, s in zip(eta, seconds))
    assert {r.time_left_budget for r in result.steps} <= {"max_cost_usd", "max_metric_calls"}


def test_the_progress_line_shows_dollars_and_time_left():
    from dspy_pxn.cli.output import progress_line
    from dspy_pxn.engine.records import StepRecord

    fields = {name: 0 for name in StepRecord.__dataclass_fields__}
    record = StepRecord(**{**fields, "kind": "reflective", "new_candidates": [], "budget": 100, "best_val": 0.5,
                           "mean_val": 0.5, "schedule": "async", "cost_usd_total": 1.25, "cost_usd_left": 3.75,
                           "wall_s_left": 90.0, "time_left_s": 42.0, "time_left_budget": "max_cost_usd"})
    line = progress_line(record)
    assert "$1.2500 spent, $3.7500 left" in line and "90.0 s to the deadline" in line
    assert "~42.0 s left (max_cost_usd)" in line
    assert "left" not in progress_line(StepRecord(**{**fields, "kind": "reflective", "new_candidates": [],
                                                     "budget": 100, "best_val": 0.5, "mean_val": 0.5,
                                                     "cost_usd_left": None, "wall_s_left": None,
                                                     "time_left_s": None, "time_left_budget": None}))


@pytest.mark.parametrize("schedule", ["async", "steps"])
def test_a_resumed_auto_run_spends_no_more_than_its_budget(schedule, tmp_path):
    train, val, _ = sim.make_splits(seed=0, train=40, val=6, test=1)
    lm, log_dir = sim.SimulatedLM(), str(tmp_path / "run")

    def compile_once():
        with dspy.context(lm=lm):
            return BatchedGEPA(metric=sim.metric, auto="light", p=2, schedule=schedule, log_dir=log_dir,
                               reflection_lm=sim.SimulatedLM(temperature=1.0)).compile(
                sim.seed_program(), trainset=train, valset=val).detailed_results

    first = compile_once()
    calls = lm.stats()["calls"]["total"]
    again = compile_once()
    assert lm.stats()["calls"]["total"] == calls  # its budget was spent: nothing is left to do
    assert again.total_metric_calls == first.total_metric_calls <= again.budget
    assert again.stopped_by == "auto"
