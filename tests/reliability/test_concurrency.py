"""64 workers on the real HTTP path: the step log, gepa's saved state and the result agree exactly.

CI runs a ~30 s run. ``DSPY_PXN_LONG_CONCURRENCY=1`` runs the same property check for minutes
(budget 12000, ~3 min on two cores) — run it before a release.
"""

from __future__ import annotations

import os
from collections import Counter

import dspy
import pytest
from gepa.core.state import GEPAState

from dspy_pxn import BatchedGEPA, read_step_log
from dspy_pxn import testing as sim
from dspy_pxn.testing import LatencyServer
from tests.faults import Faults
from tests.threads import threads_left_behind

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

LONG = os.environ.get("DSPY_PXN_LONG_CONCURRENCY") == "1"


def check_run_against_gepa_state(result, log_dir: str, val_size: int, budget: int) -> dict[str, int]:
    """The property: nothing lost, nothing counted twice, between the step log, gepa's state and the result."""
    steps = list(result.steps)
    # No lost or duplicated step records: the log on disk is exactly the in-memory records, numbered 1..k.
    assert read_step_log(log_dir) == steps
    assert [s.step for s in steps] == list(range(1, len(steps) + 1))

    state = GEPAState.load(log_dir)
    assert state.i + 1 == len(steps)
    assert state.total_num_evals == result.total_metric_calls == steps[-1].metric_calls_total <= budget
    # Metric calls: every step's delta adds up; every metric call is one rollout the adapter ran.
    running = val_size
    for step in steps:
        running += step.metric_calls
        assert step.metric_calls_total == running
        assert step.metric_calls == step.rollouts
    assert running == result.total_metric_calls

    # Candidates: each index added by exactly one step, in order, and gepa holds exactly those.
    added = [c for s in steps for c in s.new_candidates]
    assert added == list(range(1, len(result.candidates)))
    assert len(state.program_candidates) == len(result.candidates) == len(state.parent_program_for_candidate)
    for index, parents in enumerate(state.parent_program_for_candidate):
        assert all(p is None or p < index for p in parents)  # a parent always existed before its child
    assert [sum(s.accepted for s in steps)] == [len(added)]
    # Every candidate was fully validated once: a score for every val example, and the aggregate is their mean.
    for index, subscores in enumerate(state.prog_candidate_val_subscores):
        assert len(subscores) == val_size, index
        assert result.val_aggregate_scores[index] == pytest.approx(sum(subscores.values()) / val_size)
    assert steps[-1].best_val == pytest.approx(max(result.val_aggregate_scores))

    # gepa dedupes identical children selected in one iteration (engine: "Duplicate of another candidate
    # selected this iteration"), not across iterations: a later step may re-add an existing text.
    key = [repr(sorted(c.items())) for c in state.program_candidates]
    for step in steps:
        assert len({key[c] for c in step.new_candidates}) == len(step.new_candidates), step
    texts = Counter(key)
    return {"candidates": len(result.candidates), "duplicate_texts": sum(n - 1 for n in texts.values()),
            "steps": len(steps)}


@pytest.mark.parametrize("schedule", ["steps", "async"])
@pytest.mark.parametrize("faulty", [False, True], ids=["clean", "5pct-faults"])
def test_64_workers_keep_step_log_and_gepa_state_consistent(tmp_path, faulty, schedule):
    budget = 12000 if LONG else (600 if faulty else 1400)
    train, val, _ = sim.make_splits(seed=1, train=200, val=24, test=10)
    log_dir = str(tmp_path / "run")
    faults = None
    if faulty:  # hangs are covered in test_faults; here the retries' backoff would only slow CI
        faults = Faults(error_500=0.01, rate_limit_429=0.03, malformed=0.01, retry_after_s=0.05, seed=11)
    # Calls long enough that a loaded 2-core CI machine can put 64 of them in flight: how many overlap
    # is about latency / the client's CPU per call (at 0.3 s a busy run peaked at 47).
    with LatencyServer(task_latency=0.6, reflection_latency=1.0, faults=faults) as server:
        optimizer = BatchedGEPA(
            metric=sim.metric, p=8, n=4, max_metric_calls=budget, num_threads=64, log_dir=log_dir, seed=3,
            schedule=schedule, selection="all" if schedule == "steps" else "merge",
            reflection_lm=server.lm("reflection", num_retries=3, timeout=2.0, temperature=1.0),
        )
        with dspy.context(lm=server.lm("task", num_retries=3, timeout=2.0)):
            result = optimizer.compile(sim.seed_program(), trainset=train, valset=val).detailed_results
        left_behind = threads_left_behind()
        stats = server.stats()
    found = check_run_against_gepa_state(result, log_dir, len(val), budget)
    # Enough work to check: the merge validates one candidate per window where "all" validates several.
    assert found["steps"] >= 2 and found["candidates"] >= (5 if schedule == "steps" else 3)
    # 64 workers were really used at once (32 proposals x minibatch 3 = 96 screening rollouts per step).
    in_flight = stats["requests"]["max_in_flight"]
    assert in_flight["total"] >= 48
    assert in_flight["task"] <= 64
    if schedule == "steps":  # reflections take a worker of the one pool
        assert in_flight["total"] <= 64
    else:  # reflections run in the 32 pipelines' own threads, beside the 64 rollout workers (and one merge)
        assert in_flight["total"] <= 64 + 32 + 1
    assert not left_behind
    if faulty:
        assert stats["faults"]["total"] > 0 and result.lm_call_counts.retries > 0
    # gepa adds a proposal whose text equals an existing candidate as a new index (it does not dedupe);
    # with this simulator that would need two reflections to produce the same definitions in the same order.
    print(f"\n{found} lm={result.lm_call_counts} wall={result.wall_s:.1f}s")
