"""LM faults injected by the latency server, through the real dspy.LM -> HTTP path on each DSPy engine.

What is proven here: a P×N run with 10% faulty calls completes on an exact budget; a
rollout whose LM call finally fails scores ``failure_score`` and is counted once; a
failed reflection drops only its proposal; a hung request is cut by the client
timeout (no worker waits for the hang); retries are counted per step and agree with
the server's own count of requests.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import threading
import time

import dspy
import pytest
from dspy.utils.callback import BaseCallback

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.testing import LatencyServer
from dspy_pxn.testing.latency_server import INJECTED_REPLIES as FAULT_KINDS
from tests.faults import Faults
from tests.threads import threads_left_behind

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def chat(server: LatencyServer, content: str) -> tuple[int, dict, dict]:
    port = int(server.base_url.split(":")[2].split("/")[0])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]})
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = json.loads(response.read() or b"{}")
    headers = {k.lower(): v for k, v in response.getheaders()}
    conn.close()
    return response.status, data, headers


# ----------------------------------------------------------------------------- the server's faults
def test_fault_draws_are_deterministic_by_seed_and_fresh_per_retry():
    faults = Faults.uniform(0.6, seed=7)
    draws = [faults.draw("task", f"request {i}", 0) for i in range(600)]
    assert draws == [Faults.uniform(0.6, seed=7).draw("task", f"request {i}", 0) for i in range(600)]
    assert draws != [Faults.uniform(0.6, seed=8).draw("task", f"request {i}", 0) for i in range(600)]
    faulty = [d for d in draws if d is not None]
    assert 0.5 < len(faulty) / len(draws) < 0.7 and set(faulty) == set(FAULT_KINDS[:-1])
    # A retry (next attempt of the same request) is an independent draw; persistent ones never clear.
    assert [faults.draw("task", "request 0", a) for a in range(20)].count(None) > 0
    assert {Faults(persistent_500=1.0).draw("task", "x", a) for a in range(5)} == {"persistent_500"}
    assert Faults(error_500=1.0, kinds=("reflection",)).draw("task", "x", 0) is None
    with pytest.raises(ValueError, match="fault rates"):
        Faults(error_500=0.7, empty=0.5)


def test_covering_each_kind_sends_every_fault_first_once_per_new_request_then_draws_as_usual():
    faults = Faults.uniform(0.06, persistent_500=0.01, seed=1, cover_each_kind=True)
    first = [faults.draw("task", f"request {i}", 0) for i in range(len(FAULT_KINDS))]
    assert sorted(first) == sorted(FAULT_KINDS)
    persistent = f"request {first.index('persistent_500')}"
    assert {faults.draw("task", persistent, a) for a in range(1, 4)} == {"persistent_500"}  # it never clears
    # A retry of a covered request, and every later request, gets the seeded draw of a plain injector.
    plain = Faults.uniform(0.06, persistent_500=0.01, seed=1)
    retried = f"request {first.index('error_500')}"
    assert faults.draw("task", retried, 1) == plain.draw("task", retried, 1)
    assert [faults.draw("task", f"later {i}", 0) for i in range(300)] == [
        plain.draw("task", f"later {i}", 0) for i in range(300)]
    assert Faults.from_json(faults.to_json()) == faults


@pytest.mark.parametrize("kind", ["error_500", "rate_limit_429", "malformed", "truncated", "empty"])
def test_each_fault_kind_on_the_wire(kind):
    with LatencyServer(faults=Faults(**{kind: 1.0}, retry_after_s=0.25)) as server:
        status, body, headers = chat(server, "Apply rule zorp to 3.")
        stats = server.stats()
    assert stats["faults"][kind] == 1 and stats["faults"]["total"] == 1
    assert stats["requests"]["calls"]["total"] == 1
    if kind == "error_500":
        assert status == 500 and body["error"]["type"] == "server_error"
    elif kind == "rate_limit_429":
        assert status == 429 and headers["retry-after"] == "0.25"
    else:
        assert status == 200
        choice = body["choices"][0]
        content = choice["message"]["content"]
        if kind == "malformed":
            assert content and "[[ ##" not in content
        elif kind == "truncated":
            assert choice["finish_reason"] == "length" and "[[ ## completed ## ]]" not in content
        else:
            assert content == ""


def test_a_hang_outlasts_the_client_timeout_and_is_retried(engine):
    with LatencyServer(faults=Faults(hang=1.0, hang_s=60)) as server:
        lm = server.lm("task", num_retries=1, timeout=0.5, **engine)
        started = time.perf_counter()
        with pytest.raises(Exception, match="[Tt]imed? ?out"), dspy.context(lm=lm):
            dspy.Predict("question -> answer")(question="Apply rule zorp to 3.")
        elapsed = time.perf_counter() - started
        time.sleep(0.3)  # the server notices the closed sockets
        stats = server.stats()
    # Two attempts of 0.5 s and DSPy's 1 s backoff, not the 60 s hang.
    assert 1.9 < elapsed < 10
    assert stats["faults"]["hang"] == stats["requests"]["calls"]["total"] == 2
    assert stats["requests"]["in_flight"]["total"] == 0  # the hung handlers gave up with their clients


# ----------------------------------------------------------------------------- a P×N run under faults
class CountingMetric:
    """sim.metric, counting the scoring calls (three arguments: one per rollout that produced a prediction)."""

    def __init__(self):
        self.scored = 0
        self._lock = threading.Lock()

    def __call__(self, gold, pred, trace=None, pred_name=None, pred_trace=None):
        if pred_name is None:
            with self._lock:
                self.scored += 1
        return sim.metric(gold, pred, trace, pred_name, pred_trace)


class SeedPhase(BaseCallback):  # BatchedGEPA also hands its callbacks to DSPy's compile hooks
    """gepa callback: the metric's scoring count when the first iteration starts (the seed validation's)."""

    def __init__(self, metric: CountingMetric):
        super().__init__()
        self.metric, self.scored = metric, None

    def on_iteration_start(self, event):
        if self.scored is None:
            self.scored = self.metric.scored


def test_pxn_run_with_ten_percent_faulty_calls_completes_on_an_exact_budget(caplog, engine):
    """Every fault kind at once (10% of requests) plus 2% of requests that fail on every attempt."""
    train, val, _ = sim.make_splits(seed=0, train=40, val=12, test=10)
    faults = Faults.uniform(0.10, persistent_500=0.02, retry_after_s=0.05, hang_s=120, seed=2, cover_each_kind=True)
    metric = CountingMetric()
    seed_phase = SeedPhase(metric)
    budget = 200
    with LatencyServer(task_latency=0.02, reflection_latency=0.1, faults=faults) as server:
        optimizer = BatchedGEPA(
            metric=metric, p=4, n=2, max_metric_calls=budget, num_threads=8, failure_score=0.0,
            reflection_lm=server.lm("reflection", num_retries=2, timeout=1.0, temperature=1.0, **engine),
            gepa_kwargs={"callbacks": [seed_phase]},
        )
        started = time.perf_counter()
        with dspy.context(lm=server.lm("task", num_retries=2, timeout=1.0, **engine)), caplog.at_level(logging.WARNING):
            result = optimizer.compile(sim.seed_program(), trainset=train, valset=val).detailed_results
        wall = time.perf_counter() - started
        left_behind = threads_left_behind()  # reflections the run returned without come back first
        stats = server.stats()
    steps = result.steps
    counts = result.lm_call_counts

    # The run met every kind of fault and still finished, with no pool thread left behind.
    assert all(stats["faults"][kind] > 0 for kind in FAULT_KINDS), stats["faults"]
    assert len(steps) >= 2
    assert not left_behind
    # Hangs last 120 s at the server; the 1 s client timeout cut every one of them.
    assert wall < 90, wall

    # Exact budget: gepa counted one metric call per (candidate, example) rollout, failed or not.
    assert result.total_metric_calls == len(val) + sum(s.rollouts for s in steps) <= budget
    assert result.total_metric_calls == steps[-1].metric_calls_total
    assert sum(s.metric_calls for s in steps) == result.total_metric_calls - len(val)
    # Each rollout was either scored by the metric once, or scored failure_score without it: never both.
    search_failures = sum(s.rollout_failures for s in steps)
    assert search_failures > 0
    assert (metric.scored - seed_phase.scored) + search_failures == sum(s.rollouts for s in steps)

    # Retries: the client counted exactly the requests the server received, but for those of reflections
    # the run returned without (no budget was left to validate their children), each tried at most 3 times.
    abandoned = counts.abandoned
    assert counts.attempts <= stats["requests"]["calls"]["total"] <= counts.attempts + 3 * abandoned
    assert counts.retries == counts.attempts - counts.calls > 0
    assert sum(s.lm_retries for s in steps) == counts.retries  # the first record has the seed validation's
    # Calls that finally failed are exactly the persistent faults (each tried 1 + 2 times).
    assert counts.failures <= stats["faults"]["persistent_500"] // 3 <= counts.failures + abandoned
    assert counts.failures > 0
    # Each finally-failed call failed one rollout (the seed's validation's, in the first record, included), one
    # reflection or one sibling merge (which then keeps the best child), and was reported.
    seed_failures = len(val) - seed_phase.scored
    merge_failures = sum("Merging" in r.getMessage() and "failed" in r.getMessage() for r in caplog.records)
    assert sum(s.lm_failures for s in steps) == counts.failures
    assert counts.failures <= (search_failures + seed_failures + sum(s.reflection_failures for s in steps)
                               + merge_failures)
    warned = [r.getMessage() for r in caplog.records if "Program raised on an example" in r.getMessage()]
    assert len(warned) >= counts.failures - sum(s.reflection_failures for s in steps) - merge_failures
    assert all("LMServerError" in w or "LMTimeoutError" in w or "LMRateLimitError" in w for w in warned)


def test_a_rollout_whose_lm_call_finally_fails_scores_failure_score_once(engine):
    """A third of the task requests fail on every attempt; failure_score=0.25 marks them in gepa's scores."""
    train, val, _ = sim.make_splits(seed=0, train=24, val=12, test=10)
    with LatencyServer(faults=Faults(persistent_500=0.34, kinds=("task",), seed=3)) as server:
        optimizer = BatchedGEPA(
            metric=sim.metric, p=2, n=1, max_metric_calls=40, num_threads=6, failure_score=0.25,
            reflection_lm=server.lm("reflection", num_retries=0, timeout=5.0, **engine),
        )
        with dspy.context(lm=server.lm("task", num_retries=1, timeout=5.0, **engine)):
            result = optimizer.compile(sim.seed_program(), trainset=train, valset=val).detailed_results
        stats = server.stats()
    seed_scores = list(result.val_subscores[0].values()) if isinstance(result.val_subscores[0], dict) else list(
        result.val_subscores[0])
    seed_failures = seed_scores.count(0.25)
    assert len(seed_scores) == len(val) and 0 < seed_failures < len(val)
    assert set(seed_scores) <= {0.0, 1.0, 0.25}
    failures = seed_failures + sum(s.rollout_failures for s in result.steps)
    # Each failing rollout: one LM call tried twice (num_retries=1), scored once, counted once.
    assert stats["faults"]["persistent_500"] == 2 * failures == 2 * result.lm_call_counts.failures
    assert result.total_metric_calls == len(val) + sum(s.rollouts for s in result.steps) <= 40


def test_a_failed_reflection_drops_only_its_proposal(engine):
    """Half of the reflection requests fail (no retries): those proposals vanish, the others are screened."""
    train, val, _ = sim.make_splits(seed=0, train=40, val=8, test=10)
    with LatencyServer(faults=Faults(persistent_500=0.5, kinds=("reflection",), seed=5)) as server:
        optimizer = BatchedGEPA(
            metric=sim.metric, p=4, n=2, max_metric_calls=120, num_threads=8, skip_perfect_score=False,
            schedule="steps", selection="all",  # reflections per step: the step loop's accounting
            reflection_lm=server.lm("reflection", num_retries=0, timeout=5.0, temperature=1.0, **engine),
        )
        with dspy.context(lm=server.lm("task", num_retries=0, timeout=5.0, **engine)):
            result = optimizer.compile(sim.seed_program(), trainset=train, valset=val).detailed_results
        stats = server.stats()
    steps = result.steps
    failed = sum(s.reflection_failures for s in steps)
    assert failed == stats["faults"]["persistent_500"] > 0
    assert stats["requests"]["calls"]["reflection"] == sum(s.width for s in steps)
    for step in steps:
        # Every sampled task whose reflection succeeded became a screened proposal; no other was lost.
        assert step.proposals == step.width - step.reflection_failures, step
    assert any(s.proposals > 0 for s in steps)
    assert result.total_metric_calls == len(val) + sum(s.rollouts for s in steps) <= 120
