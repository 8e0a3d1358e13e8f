"""The run's ledger on the engines users run: attempts, retries and dollars as the provider saw them.

Every LM call goes over HTTP to the latency server, which counts each request and each fault it
injected, so "retries counted" is checked against the server's own count, on DSPy's native engine
(a plain ``dspy.LM("openai/...")``) and on litellm.
"""

from __future__ import annotations

import contextvars
import json
import os
import subprocess
import sys
import textwrap

import dspy
import pytest

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.ledger.ledger import REFLECTING, RUNNING_PROGRAM, RunLedger
from dspy_pxn.testing import LatencyServer
from tests.faults import Faults

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("schedule", ["async", "steps"])
def test_retries_under_injected_faults_are_counted_as_the_server_saw_them(engine, schedule):
    # An async run may end with a reflection in flight whose child no budget could validate (it is abandoned, and
    # the server sees calls the run does not count): the comparison needs a run that ended without one.
    for _ in range(3):
        faults = Faults(rate_limit_429=0.12, error_500=0.04, retry_after_s=0.01, seed=3)
        with LatencyServer(task_latency=0.01, reflection_latency=0.02, faults=faults) as server:
            train, val, _ = sim.make_splits(seed=0, train=30, val=8, test=1)
            optimizer = BatchedGEPA(
                metric=sim.metric, p=2, n=2, max_metric_calls=160, num_threads=12, schedule=schedule,
                reflection_lm=server.lm("reflection", num_retries=6, temperature=1.0, **engine))
            with dspy.context(lm=server.lm("task", num_retries=6, **engine)):
                result = optimizer.compile(sim.seed_program(), trainset=train, valset=val).detailed_results
            stats = server.stats()
        if result.lm_call_counts.abandoned == 0:
            break
    counts, usage = result.lm_call_counts, result.usage
    assert counts.failures == 0 and counts.abandoned == 0  # six retries outlast a 16% fault rate here
    assert counts.retries == stats["faults"]["total"] > 0  # every fault was a failed attempt, sent again
    assert counts.attempts == counts.calls + counts.retries == stats["requests"]["calls"]["total"]
    assert usage.lm_calls == counts.calls == stats["calls"]["total"]
    # Each step record has its share: they add up to the run's (the first record has the seed's validation).
    assert sum(step.lm_retries for step in result.steps) == counts.retries
    assert sum(step.lm_calls for step in result.steps) == usage.lm_calls
    assert sum(step.prompt_tokens for step in result.steps) == usage.prompt_tokens


NO_NETWORK_RUN = textwrap.dedent("""
    import json, socket, sys
    reached = []
    def audit(event, args):
        if event == "socket.connect":
            address = args[1]
            host = address[0] if isinstance(address, tuple) else str(address)
            if host not in ("127.0.0.1", "::1", "localhost"):
                reached.append(host)
        elif event == "socket.getaddrinfo" and str(args[0]) not in ("127.0.0.1", "::1", "localhost"):
            reached.append(str(args[0]))
    sys.addaudithook(audit)
    import dspy
    from dspy_pxn import BatchedGEPA
    from dspy_pxn import testing as sim
    from dspy_pxn.testing import LatencyServer
    caps = json.loads(sys.argv[1])
    with LatencyServer(task_latency=0.0, reflection_latency=0.0) as server:
        train, val, _ = sim.make_splits(seed=0, train=20, val=6, test=1)
        task = dspy.LM("openai/sim-task", api_base=server.base_url, api_key="sim", cache=False, max_tokens=200)
        reflection = dspy.LM("openai/sim-reflection", api_base=server.base_url, api_key="sim", cache=False,
                             max_tokens=400)
        with dspy.context(lm=task):
            result = BatchedGEPA(metric=sim.metric, p=2, n=1, max_metric_calls=60, reflection_lm=reflection,
                                 **caps).compile(sim.seed_program(), trainset=train, valset=val).detailed_results
    print(json.dumps({"litellm": "litellm" in sys.modules, "reached": reached,
                      "calls": result.lm_call_counts.calls, "attempts": result.lm_call_counts.attempts}))
""")


@pytest.mark.parametrize("caps", [{}, {"max_cost_usd": 1.0}, {"max_wall_s": 120.0}], ids=["no cap", "dollars", "deadline"])
def test_a_native_engine_run_never_imports_litellm_nor_reaches_the_network(caps):
    env = {key: value for key, value in os.environ.items() if key != "LITELLM_LOCAL_MODEL_COST_MAP"}
    env["PYTHONPATH"] = ROOT
    done = subprocess.run([sys.executable, "-c", NO_NETWORK_RUN, json.dumps(caps)], capture_output=True, text=True,
                          env=env, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["litellm"] is False
    assert seen["reached"] == []
    assert seen["calls"] > 0 and seen["attempts"] == seen["calls"]  # no fault injected: one attempt each


def test_a_call_whose_attempts_dspy_did_not_tell_is_unknown_never_zero():
    ledger = RunLedger()
    context = contextvars.copy_context()
    context.run(ledger.call_started, "c1", "openai/sim")  # an LM that bypasses DSPy's execution: no attempt heard
    context.run(ledger.call_ended, "c1", None)
    counts = ledger.tally().counts
    assert counts.calls == 1 and counts.attempts is None and counts.retries is None


def test_each_billed_call_is_priced_once_to_the_budget_it_belongs_to():
    from dspy_pxn.ledger.prices import Price

    ledger = RunLedger({"openai/a": Price(1e-6, 2e-6)}, earlier_usd=(0.5, 0.1))
    billed = {"prompt_tokens": 100, "completion_tokens": 10}
    task, reflection = contextvars.copy_context(), contextvars.copy_context()
    task.run(ledger.call_started, "t", "openai/a")
    task.run(ledger.add_usage, "openai/a", billed)

    def reflect():
        with dspy.context(**{REFLECTING: True}):
            ledger.call_started("r", "openai/a")
            ledger.add_usage("openai/a", billed)

    reflection.run(reflect)
    assert task.run(ledger.call_in_progress).cost_usd == pytest.approx(1.2e-4)
    task.run(ledger.call_ended, "t", None)
    reflection.run(ledger.call_ended, "r", None)
    with dspy.context(**{RUNNING_PROGRAM: True}):  # the program's call, of an LM the run does not hold, unpriced
        ledger.add_usage("openai/unknown", billed)
    tally = ledger.tally()
    assert (tally.task_usd, tally.reflection_usd) == (pytest.approx(1.2e-4), pytest.approx(1.2e-4))
    assert ledger.spent_usd() == (pytest.approx(0.5 + 2.4e-4), pytest.approx(0.1 + 1.2e-4))
    assert (tally.billed, tally.unheld, tally.unpriced, tally.usage.cost_usd) == (3, 1, 1, pytest.approx(2.4e-4))


class TracksItsOwnUsage(dspy.Module):
    """A program that meters itself with DSPy's own tracker: its usage reaches the run when its block ends."""

    def __init__(self):
        super().__init__()
        self.solve = sim.seed_program()

    def forward(self, question):
        with dspy.track_usage():
            return self.solve(question=question)


def test_usage_a_program_tracks_itself_is_billed_to_the_run_and_not_called_unheld(splits, caplog):
    task_lm, reflection_lm = sim.SimulatedLM(), sim.SimulatedLM()
    train, val, _ = splits
    with dspy.context(lm=task_lm), dspy.track_usage() as outer:
        result = BatchedGEPA(metric=sim.metric, p=2, n=1, max_metric_calls=80, reflection_lm=reflection_lm,
                             num_threads=6).compile(TracksItsOwnUsage(), trainset=train, valset=val).detailed_results
    counts = result.lm_call_counts
    assert result.usage.lm_calls == counts.calls == task_lm.stats()["calls"]["total"] + reflection_lm.stats()[
        "calls"]["total"] - counts.abandoned
    assert not any("does not hold" in r.getMessage() for r in caplog.records)
    # An enclosing dspy.track_usage() hears the run's usage, as it does under dspy.GEPA.
    assert sum(len(entries) for entries in outer.usage_data.values()) >= result.usage.lm_calls


def test_under_a_cap_a_call_whose_slot_was_released_is_not_in_flight_beside_the_next():
    """DSPy tells a call's end to the context's callbacks (the cap) before the LM's own (the ledger's feed): the next
    call may take the slot, and start, before the ledger hears the first end. The peak counts calls running at once,
    as the provider sees them: never more than the cap."""
    from dspy_pxn.ledger.limiter import LMCallLimiter, installed

    limiter, ledger = LMCallLimiter(1), RunLedger()
    with installed(limiter):
        context = contextvars.copy_context()
        for call_id in ("a", "b"):  # as DSPy orders the callbacks: the cap's, then the ledger's
            context.run(limiter.on_lm_start, call_id, None, {})
            context.run(ledger.call_started, call_id, "openai/sim")
            context.run(limiter.on_lm_end, call_id, None)  # the slot is free: the next call starts...
        context.run(ledger.call_ended, "a", None)  # ...before the ledger hears the first one end
        context.run(ledger.call_ended, "b", None)
    counts = ledger.tally().counts
    assert counts.calls == 2 and counts.peak_in_flight == 1
    # Without a cap, the calls the ledger has heard start and not end are the ones in flight.
    uncapped = RunLedger()
    for call_id in ("a", "b"):
        uncapped.call_started(call_id, "openai/sim")
    for call_id in ("a", "b"):
        uncapped.call_ended(call_id, None)
    assert uncapped.tally().counts.peak_in_flight == 2
