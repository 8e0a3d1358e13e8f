"""The runtime model's latency spread: batches wait for their slowest call, a full pool pays the mean."""

import math
import random
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dspy_pxn.cli import main as cli
from dspy_pxn.planning import RunShape, RuntimeModel
from dspy_pxn.planning.spread import Z_99, batch_seconds, mean_factor, sigma_of, slowest_factor
from dspy_pxn.testing.latency import LOGNORMAL_SIGMA, draw_latency

SHAPE = RunShape(workers=16, budget=600, val_size=30, minibatch_size=3)


def test_the_ratio_names_the_p99_over_the_median():
    assert math.exp(Z_99 * sigma_of(4.0)) == pytest.approx(4.0)
    assert sigma_of(4.0) == pytest.approx(LOGNORMAL_SIGMA, rel=1e-3)  # the simulated LM's "lognormal"
    assert sigma_of(1.0) == 0.0


@pytest.mark.parametrize("calls", [1, 3, 22, 150])
def test_the_slowest_of_k_calls_matches_the_simulated_lm_s_draws(calls):
    rng = random.Random(calls)
    trials = 3000
    measured = statistics.mean(max(draw_latency(1.0, "lognormal", rng) for _ in range(calls)) for _ in range(trials))
    assert slowest_factor(calls, LOGNORMAL_SIGMA) == pytest.approx(measured, rel=0.03)
    if calls == 1:
        assert slowest_factor(1, LOGNORMAL_SIGMA) == pytest.approx(mean_factor(LOGNORMAL_SIGMA), rel=1e-3)


@given(st.integers(1, 2000), st.integers(1, 512), st.floats(0.01, 10))
def test_without_a_spread_a_batch_takes_its_waves(calls, workers, call_s):
    assert batch_seconds(calls, workers, call_s, 0.0) == pytest.approx(math.ceil(calls / workers) * call_s)


@pytest.mark.parametrize("ratio", [0.5, -1, float("nan"), float("inf"), True])
def test_a_ratio_below_one_is_refused_by_name(ratio):
    with pytest.raises(ValueError, match="latency_p99_ratio"):
        RuntimeModel(task_s=1.0, reflection_s=4.0, acceptance=0.2, latency_p99_ratio=ratio)


def test_with_a_spread_each_step_waits_for_its_slowest_calls():
    """Zero acceptance: the seed's validation, then 90 steps of parent, reflection, child (the closed form of
    test_runtime_model's fixed-latency case, each wait now the slowest of its batch)."""
    model = RuntimeModel(task_s=1.0, reflection_s=4.0, acceptance=0.0, step_overhead_s=0.1, latency_p99_ratio=4.0)
    sigma = model.sigma
    prediction = model.predict(1, 1, SHAPE)
    assert prediction.iterations == 90
    seed = mean_factor(sigma) + slowest_factor(16, sigma)  # 30 calls on 16 workers: a full wave, then the last
    step = 2 * slowest_factor(3, sigma) + 4.0 * slowest_factor(1, sigma) + 0.1
    assert prediction.wall_s == pytest.approx(seed + 90 * step)


@pytest.mark.parametrize(("schedule", "p", "n", "selection"),
                         [("steps", 1, 1, "all"), ("steps", 4, 4, "merge"), ("async", 4, 4, "merge"),
                          ("async", 16, 1, "best")])
def test_a_longer_tail_never_makes_a_run_quicker(schedule, p, n, selection):
    walls = [RuntimeModel(task_s=0.5, reflection_s=2.0, acceptance=0.3, latency_p99_ratio=ratio)
             .predict(p, n, SHAPE, selection, schedule).wall_s for ratio in (1.0, 2.0, 4.0, 8.0)]
    assert walls == sorted(walls) and walls[-1] > walls[0] * 1.3


def _auto_line(out: str) -> float:
    """The defaults' predicted wall-clock in seconds, as the plan prints it ("95.2 s" or "2.9 min")."""
    line = next(line for line in out.splitlines() if line.startswith("defaults: p='auto'"))
    value, unit = line.split("within the budget): ")[1].split(",")[0].split()
    return float(value) * {"s": 1, "min": 60, "h": 3600}[unit]


def test_plan_takes_the_spread_and_predicts_a_wide_run_slower(capsys):
    argv = ["plan", "--workers", "256", "--budget", "5000", "--val-size", "150", "--task-latency", "1",
            "--reflection-latency", "4"]
    assert cli(argv) == 0
    fixed = _auto_line(capsys.readouterr().out)
    assert cli([*argv, "--latency-p99-ratio", "4"]) == 0
    out = capsys.readouterr().out
    assert "p99/p50 4" in out
    assert _auto_line(out) > 1.5 * fixed


def test_plan_refuses_a_spread_beside_a_fitted_run_and_a_ratio_below_one(tmp_path, capsys):
    base = ["plan", "--workers", "8", "--budget", "300", "--val-size", "30"]
    assert cli([*base, "--latency-p99-ratio", "0.5"]) == 2
    assert "--latency-p99-ratio must be at least 1" in capsys.readouterr().err
    assert cli([*base, "--latency-p99-ratio", "4", "--from-run", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--latency-p99-ratio" in err and "--from-run" in err
