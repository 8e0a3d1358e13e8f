"""p="auto": the width follows the worker pool, capped so the budget still buys several validation windows."""

from __future__ import annotations

import logging

import dspy
import pytest

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.cli import main as cli
from dspy_pxn.engine.width import (
    MAX_VALIDATIONS_IN_FLIGHT,
    MIN_VALIDATION_WINDOWS,
    PROMPT_VALIDATION_WINDOWS,
    SECOND_VALIDATION_MIN_IMPROVERS,
    auto_parents,
    auto_width,
    starts_validation,
)
from dspy_pxn.ledger.budget import RunShape


@pytest.mark.parametrize(("workers", "budget", "val_size", "expected"), [
    (32, 3000, 150, 32),    # the pool's width: the budget buys (3000/6 - 150)/6 = 58 proposals per window
    (512, 3000, 150, 58),   # a wider pool than the budget can use: the budget's cap
    (16, 600, 30, 11),      # W = 16, B = 600: (600/6 - 30)/6 = 11, under the pool
    (8, 200, 30, 1),        # a budget that buys little: one proposal at a time, never none
    (4, 100_000, 30, 4),
])
def test_the_auto_width_is_the_pool_capped_by_the_budget(workers, budget, val_size, expected):
    shape = RunShape(workers=workers, budget=budget, val_size=val_size, minibatch_size=3)
    width = auto_width(shape)
    assert width == expected
    if 1 < width < workers:  # capped by the budget: one more proposal each window would cost a window
        per_window = 2 * shape.minibatch_size * width + val_size
        assert budget / per_window >= MIN_VALIDATION_WINDOWS
        assert budget / (per_window + 2 * shape.minibatch_size) < MIN_VALIDATION_WINDOWS


@pytest.mark.parametrize(("workers", "budget", "expected"), [
    (10, 300, 5),    # MLflow's evaluation width at B = 300, |val| = 30: (300/5 - 30)/6 = 5 fit, the pool has 10
    (64, 300, 5),    # a pool far wider than the budget: the five windows' cap, not one window of 64
    (64, 900, 25),   # a larger budget: (900/5 - 30)/6 = 25
    (10, 100, 1),    # MLflow's default budget buys little beside a 30-row validation
])
def test_the_prompt_width_leaves_five_windows(workers, budget, expected):
    shape = RunShape(workers=workers, budget=budget, val_size=30, minibatch_size=3)
    assert auto_width(shape, PROMPT_VALIDATION_WINDOWS) == expected
    assert auto_width(shape) <= expected  # BatchedGEPA's six windows: never wider


def test_a_validation_starts_alone_for_one_improver_and_beside_another_only_for_enough():
    assert not starts_validation(running=0, waiting=0)
    assert starts_validation(running=0, waiting=1)
    assert not starts_validation(running=1, waiting=SECOND_VALIDATION_MIN_IMPROVERS - 1)
    assert starts_validation(running=1, waiting=SECOND_VALIDATION_MIN_IMPROVERS)
    assert not starts_validation(running=MAX_VALIDATIONS_IN_FLIGHT, waiting=10 * SECOND_VALIDATION_MIN_IMPROVERS)


def test_auto_parents_are_whole_parents_of_the_width():
    shape = RunShape(workers=32, budget=3000, val_size=150, minibatch_size=3)
    assert auto_parents(shape, 1) == 32
    assert auto_parents(shape, 4) == 8
    assert auto_parents(RunShape(workers=64, budget=3000, val_size=150, minibatch_size=3), 4) == 14  # 58 // 4
    assert auto_parents(RunShape(workers=2, budget=3000, val_size=150), 4) == 1


def test_a_compile_with_p_auto_fills_the_pool_within_the_budget(splits, task_lm, caplog):
    train, val, _ = splits
    caplog.set_level(logging.INFO, logger="dspy_pxn.engine.run")
    best = BatchedGEPA(metric=sim.metric, p="auto", max_metric_calls=400, num_threads=32,
                       reflection_lm=sim.SimulatedLM(), tracker=False).compile(
        sim.seed_program(), trainset=train, valset=val)
    results = best.detailed_results
    expected = auto_width(RunShape(workers=32, budget=400, val_size=len(val)))
    assert 1 < expected < 32  # this budget caps the width below the pool
    assert {(step.p, step.n, step.schedule) for step in results.steps} == {(expected, 1, "async")}
    assert results.total_metric_calls <= 400
    assert f"p='auto': P×N = {expected}×1" in caplog.text


def test_p_auto_without_num_threads_takes_dspys_pool_size(splits, task_lm):
    train, val, _ = splits
    with dspy.context(num_threads=6):
        best = BatchedGEPA(metric=sim.metric, p="auto", max_metric_calls=600, reflection_lm=sim.SimulatedLM(),
                           tracker=False).compile(sim.seed_program(), trainset=train, valset=val)
    assert {(step.p, step.num_workers) for step in best.detailed_results.steps} == {(6, 6)}


@pytest.mark.parametrize("p", ["wide", 0, 2.5])
def test_a_p_that_is_neither_a_count_nor_auto_names_both(p):
    with pytest.raises(ValueError, match=r"p=.*'auto'"):
        BatchedGEPA(metric=sim.metric, p=p, max_metric_calls=100, reflection_lm=sim.SimulatedLM())


def test_the_cli_takes_p_auto_and_refuses_a_word_that_is_not(capsys):
    with pytest.raises(SystemExit):
        cli(["optimize", "sim", "--p", "wide"])
    assert "neither a number of parents (e.g. 4) nor 'auto'" in capsys.readouterr().err


def test_optimize_with_p_auto_runs_and_says_the_width_it_chose(tmp_path, capsys):
    assert cli(["optimize", "sim", "--p", "auto", "--n", "1", "--task-latency", "0.002", "--train-size", "24",
                "--val-size", "8", "--test-size", "8", "--budget", "200", "--workers", "16", "--no-mlflow",
                "--log-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    width = auto_width(RunShape(workers=16, budget=200, val_size=8))
    assert f"{width}×1 async, wall-clock" in out


def test_plan_says_what_p_auto_would_run(capsys):
    assert cli(["plan", "--workers", "64", "--budget", "3000", "--val-size", "150", "--task-latency", "0.25",
                "--reflection-latency", "1", "--schedules", "async", "--selection", "merge"]) == 0
    # Six windows of proposals screened on up to 38 examples (a quarter of |val|): (3000/6 - 150) // 76 = 4.
    assert "p='auto' runs 4×1 merge (async) here" in capsys.readouterr().out
