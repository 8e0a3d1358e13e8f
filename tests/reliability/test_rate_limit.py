"""A cap on concurrent LM requests independent of W, measured at the server; Retry-After honoured."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import dspy
import pytest

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.ledger import feed
from dspy_pxn.ledger.ledger import RunLedger
from dspy_pxn.ledger.limiter import LMCallLimiter, installed
from dspy_pxn.testing import LatencyServer
from tests.faults import Faults

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def run(server: LatencyServer, engine: dict, num_retries: int = 0, **kwargs):
    train, val, _ = sim.make_splits(seed=0, train=40, val=12, test=10)
    optimizer = BatchedGEPA(
        metric=sim.metric, p=4, n=2, max_metric_calls=130, num_threads=16,
        schedule="steps", selection="all",  # deterministic, so capped and uncapped runs compare candidate by candidate
        reflection_lm=server.lm("reflection", timeout=10.0, temperature=1.0, num_retries=num_retries, **engine),
        **kwargs,
    )
    with dspy.context(lm=server.lm("task", timeout=10.0, num_retries=num_retries, **engine)):
        return optimizer.compile(sim.seed_program(), trainset=train, valset=val).detailed_results


def instructions(result) -> list[str]:
    return [c.predict.signature.instructions for c in result.candidates]


def test_the_cap_holds_for_task_and_reflection_calls_whatever_the_worker_count(engine):
    with LatencyServer(task_latency=0.05, reflection_latency=0.15) as server:
        uncapped = run(server, engine)
        free = server.stats()
        server.reset_stats()
        capped = run(server, engine, max_concurrent_lm_calls=3)
        limited = server.stats()
    # Without a cap a step's 8 reflections and 16 workers' rollouts run at once; with it, never more than 3
    # requests are open at the server (every request counted, for as long as it is open).
    assert free["requests"]["max_in_flight"]["total"] > 3
    # (Exact peaks depend on scheduling on a loaded machine: assert the cap, and that it was reached for.)
    assert free["requests"]["max_in_flight"]["reflection"] > 3
    assert 2 <= limited["requests"]["max_in_flight"]["total"] <= 3
    assert limited["requests"]["max_in_flight"]["reflection"] <= 3
    assert 2 <= capped.lm_call_counts.peak_in_flight <= 3
    # The cap changes when calls run, not what is computed: same candidates, same spend.
    assert capped.total_metric_calls == uncapped.total_metric_calls
    assert instructions(capped) == instructions(uncapped)
    assert limited["requests"]["calls"]["total"] == free["requests"]["calls"]["total"] == capped.lm_call_counts.attempts


def test_one_limiter_caps_two_runs_sharing_a_provider(engine):
    limiter = LMCallLimiter(4)
    with LatencyServer(task_latency=0.05, reflection_latency=0.1) as server:
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda _: run(server, engine, max_concurrent_lm_calls=limiter), range(2)))
        stats = server.stats()
    assert 2 <= stats["requests"]["max_in_flight"]["total"] <= 4
    assert sum(r.lm_call_counts.calls for r in results) == stats["requests"]["calls"]["total"]
    assert limiter.in_flight() == 0  # every slot given back


def test_retry_after_is_honoured_instead_of_the_exponential_backoff(engine):
    """DSPy's own retry loop waits Retry-After (0.3 s) when the server sends it, not 1 s, 2 s, ..."""
    limiter, ledger = LMCallLimiter(1), RunLedger()
    with LatencyServer(faults=Faults(rate_limit_429=1.0, retry_after_s=0.3)) as server:
        with pytest.raises(Exception, match="RateLimit|rate limit"):  # the engine's one-time set-up, untimed
            server.warm_up(**engine)
        server.reset_stats()
        lm = server.lm("task", num_retries=3, timeout=5.0, **engine)
        with dspy.context(lm=lm), installed(limiter), feed.feeding(ledger, [lm]):
            started = time.perf_counter()
            with pytest.raises(Exception, match="RateLimit|rate limit"):
                dspy.Predict("question -> answer")(question="Apply rule zorp to 3.")
            elapsed = time.perf_counter() - started
        stats = server.stats()
    assert stats["faults"]["rate_limit_429"] == stats["requests"]["calls"]["total"] == 4
    assert 0.9 <= elapsed < 2.5, elapsed  # 3 waits of 0.3 s; the exponential backoff would be 7 s
    counts = ledger.tally().counts
    assert (counts.calls, counts.attempts, counts.retries, counts.failures) == (1, 4, 3, 1)
    assert limiter.in_flight() == 0


def test_a_rate_limited_run_completes_with_every_429_retried(engine):
    with LatencyServer(task_latency=0.02, reflection_latency=0.05,
                       faults=Faults(rate_limit_429=0.2, retry_after_s=0.05, seed=4)) as server:
        result = run(server, engine, num_retries=3, max_concurrent_lm_calls=4)
        stats = server.stats()
    counts = result.lm_call_counts
    assert stats["faults"]["rate_limit_429"] > 10
    # Every 429 was retried except the last attempt of a call that ran out of retries.
    assert counts.retries == stats["faults"]["rate_limit_429"] - counts.failures == counts.attempts - counts.calls
    assert sum(s.rollout_failures for s in result.steps) <= counts.failures <= 2  # 0.2**4 per call
    assert stats["requests"]["max_in_flight"]["total"] <= 4
    assert result.total_metric_calls == 12 + sum(s.rollouts for s in result.steps) <= 130


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8"])
def test_a_bad_cap_is_refused_up_front(bad):
    with pytest.raises(ValueError, match=r"max_concurrent_lm_calls must be an int >= 1 or None"):
        BatchedGEPA(metric=sim.metric, max_metric_calls=100, reflection_lm=sim.SimulatedLM(),
                    max_concurrent_lm_calls=bad)
