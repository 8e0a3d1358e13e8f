"""The runtime model: closed forms, monotonicity, fitting, bad input, the planner CLI."""

import json
import math
import re
import statistics
import struct
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.cli import main as cli
from dspy_pxn.engine.records import STEP_LOG_NAME, StepRecord
from dspy_pxn.planning import DEFAULT_SHAPES, RunShape, RuntimeModel, floor_seconds, parse_shapes, shapes_for
from dspy_pxn.planning.measured import MEASURED
from dspy_pxn.tracking.plots import plot_model_vs_measured
from tests.conftest import seed_program

SHAPE = RunShape(workers=16, budget=600, val_size=30, minibatch_size=3)


def test_zero_acceptance_never_validates_and_spends_the_budget_on_screening():
    model = RuntimeModel(task_s=1.0, reflection_s=4.0, acceptance=0.0, step_overhead_s=0.1)
    prediction = model.predict(1, 1, SHAPE)
    # Seed validation leaves 570 calls; each step costs 2·m = 6 and the guard stops below 2m + |val| = 36.
    assert prediction.iterations == (570 - 36) // 6 + 1 == 90
    assert prediction.validation_trigger_fraction == 0.0
    # Seed validation: 30 calls in 2 waves; each step: parent wave + reflection + child wave + overhead.
    assert prediction.wall_s == pytest.approx(2 * 1.0 + 90 * (1.0 + 4.0 + 1.0 + 0.1))
    assert prediction.metric_calls == 30 + 90 * 6


def test_certain_acceptance_validates_every_iteration():
    model = RuntimeModel(task_s=1.0, reflection_s=4.0, acceptance=1.0)
    prediction = model.predict(1, 1, SHAPE)
    assert prediction.iterations == 570 // 36 == 15
    assert prediction.validation_trigger_fraction == 1.0
    assert prediction.wall_s == pytest.approx(2.0 + 15 * (1 + 4 + 1 + 2))
    assert prediction.metric_calls == 30 + 15 * 36


@pytest.mark.parametrize(("workers", "waves"), [(16, 1), (4, 4)])
def test_validation_is_one_wave_when_kv_fits_the_pool_and_kv_over_w_otherwise(workers, waves):
    # k = 2 children of |val| = 8: kV = 16 fits 16 workers in one wave; 4 workers need 4.
    shape = RunShape(workers=workers, budget=8 + 2 * (2 * 2 * 1 + 16), val_size=8, minibatch_size=1)
    model = RuntimeModel(task_s=1.0, reflection_s=0.0, acceptance=1.0)
    prediction = model.predict(2, 1, shape)
    assert prediction.iterations == 2
    seed_waves = math.ceil(8 / workers)
    assert prediction.wall_s == pytest.approx(seed_waves + 2 * (2 + waves))


def test_selection_best_validates_one_child_per_step():
    model = RuntimeModel(task_s=1.0, reflection_s=4.0, acceptance=1.0)
    every, best = model.predict(4, 4, SHAPE, "all"), model.predict(4, 4, SHAPE, "best")
    assert best.iterations > every.iterations
    assert best.metric_calls <= SHAPE.budget and every.metric_calls <= SHAPE.budget
    assert model.predict(4, 4, SHAPE, 1).wall_s == best.wall_s


def test_floor_is_the_papers_bound():
    model = RuntimeModel(task_s=0.5, reflection_s=2.0, acceptance=0.3)
    assert floor_seconds(600, 0.5, 16) == 18.75
    assert model.predict(4, 4, SHAPE).floor_s == 18.75
    assert model.predict(4, 4, SHAPE).x_floor == pytest.approx(model.predict(4, 4, SHAPE).wall_s / 18.75)


def test_trigger_probability_is_q_k():
    model = RuntimeModel(task_s=1.0, reflection_s=1.0, acceptance=0.17)
    assert model.trigger_probability(1) == pytest.approx(0.17)
    assert model.trigger_probability(4) == pytest.approx(1 - 0.83**4)  # the paper's 2×2: ~53%


latency = st.floats(min_value=0.01, max_value=10.0)
probability = st.floats(min_value=0.0, max_value=1.0)


@settings(max_examples=60, deadline=None)
@example(t_e=1.0, t_r=1.0, a=0.7421875, p=8, n=4, workers=1, val=1, m=1, extra=63)  # pmf summed to 1 + ulp
@given(t_e=latency, t_r=latency, a=probability, p=st.integers(1, 8), n=st.integers(1, 4),
       workers=st.integers(1, 64), val=st.integers(1, 60), m=st.integers(1, 5), extra=st.integers(0, 800))
def test_predictions_respect_budget_floor_and_monotonicity(t_e, t_r, a, p, n, workers, val, m, extra):
    shape = RunShape(workers=workers, budget=val + extra, val_size=val, minibatch_size=m)
    model = RuntimeModel(task_s=t_e, reflection_s=t_r, acceptance=a)
    prediction = model.predict(p, n, shape)
    assert prediction.metric_calls <= shape.budget + 1e-6
    # No run beats its calls spread perfectly over the pool.
    assert prediction.wall_s >= prediction.metric_calls * t_e / workers - 1e-6
    assert prediction.wall_s == pytest.approx(
        prediction.step_latency_s + prediction.validation_latency_s + prediction.pool_wait_s)
    assert 0.0 <= prediction.validation_trigger_fraction <= 1.0
    # More workers never slow a run; slower calls never speed it up.
    wider_pool = RunShape(workers=workers * 2, budget=shape.budget, val_size=val, minibatch_size=m)
    assert model.predict(p, n, wider_pool).wall_s <= prediction.wall_s + 1e-9
    slower = RuntimeModel(task_s=t_e * 1.5, reflection_s=t_r * 1.5, acceptance=a)
    assert slower.predict(p, n, shape).wall_s >= prediction.wall_s - 1e-9
    assert model.trigger_probability(p * n + 1) >= model.trigger_probability(p * n) - 1e-12


def synthetic_steps(model: RuntimeModel, shape: RunShape, widths_and_improvers, selection_cap=None):
    """Step records as a run with exactly `model`'s latencies would write them."""
    W, V, m = shape.workers, shape.val_size, shape.minibatch_size
    records = []
    for step, (width, improved) in enumerate(widths_and_improvers, 1):
        accepted = min(improved, selection_cap) if selection_cap else improved
        screening = 2 * math.ceil(width * m / W) * model.task_s
        validation = math.ceil(accepted * V / W) * model.task_s
        reflection = math.ceil(width / W) * model.reflection_s
        records.append(StepRecord(
            step=step, kind="reflective", p=width, n=1, width=width, distinct_parents=width, proposals=width,
            accepted=accepted, full_validation=accepted > 0, new_candidates=[], metric_calls=0,
            metric_calls_total=0, budget=shape.budget, best_val=0.0, mean_val=0.0, pareto_front_size=1,
            wall_s=screening + validation + reflection + model.step_overhead_s, reflection_s=reflection,
            screening_s=screening, validation_s=validation, rollouts=0, rollout_failures=0,
            reflection_failures=0, worker_utilisation=0.0, num_workers=W, improved=improved,
            minibatch_size=m, val_size=V,
        ))
    return records


@pytest.mark.parametrize("selection_cap", [None, 1])
def test_fit_recovers_the_latencies_and_acceptance_that_produced_the_records(selection_cap):
    truth = RuntimeModel(task_s=0.7, reflection_s=2.9, acceptance=0.25, step_overhead_s=0.05)
    steps = synthetic_steps(truth, SHAPE, [(16, 4), (16, 5), (8, 1), (16, 6), (1, 0), (4, 0)], selection_cap)
    fitted = RuntimeModel.fit(steps)
    assert fitted.task_s == pytest.approx(0.7)
    assert fitted.reflection_s == pytest.approx(2.9)
    assert fitted.step_overhead_s == pytest.approx(0.05)
    assert fitted.acceptance == pytest.approx(16 / 61)  # improvers / proposals, whatever selection kept


def test_fit_refuses_records_without_progress_or_sizes():
    with pytest.raises(ValueError, match="no reflective step"):
        RuntimeModel.fit([])
    truth = RuntimeModel(task_s=1.0, reflection_s=1.0, acceptance=0.5)
    old = synthetic_steps(truth, SHAPE, [(4, 2)])
    old[0].val_size = 0
    with pytest.raises(ValueError, match="val_size="):
        RuntimeModel.fit(old)
    assert RuntimeModel.fit(old, val_size=30).task_s == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        (dict(task_s=-1.0, reflection_s=1.0, acceptance=0.5), "task_s"),
        (dict(task_s=1.0, reflection_s=math.nan, acceptance=0.5), "reflection_s"),
        (dict(task_s=1.0, reflection_s=1.0, acceptance=1.2), "acceptance"),
        (dict(task_s=1.0, reflection_s=1.0, acceptance=-0.1), "acceptance"),
        (dict(task_s=1.0, reflection_s=1.0, acceptance=0.5, step_overhead_s=-2), "step_overhead_s"),
    ],
)
def test_bad_model_parameters_name_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        RuntimeModel(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        (dict(workers=0, budget=600, val_size=30), "workers"),
        (dict(workers=16, budget=600, val_size=0), "val_size"),
        (dict(workers=16, budget=20, val_size=30), "budget"),
        (dict(workers=16, budget=600, val_size=30, minibatch_size=0), "minibatch_size"),
    ],
)
def test_bad_run_shape_names_the_argument(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        RunShape(**kwargs)


def test_bad_shapes_and_selection_are_refused():
    model = RuntimeModel(task_s=1.0, reflection_s=1.0, acceptance=0.5)
    with pytest.raises(ValueError, match="p=0"):
        model.predict(0, 1, SHAPE)
    with pytest.raises(ValueError, match="selection"):
        model.predict(1, 1, SHAPE, "fastest")
    with pytest.raises(ValueError, match="PxN"):
        parse_shapes("2x2,eight")
    assert parse_shapes("1x1, 8X2") == [(1, 1), (8, 2)]


def test_planner_ranks_by_predicted_wall_clock():
    model = RuntimeModel(task_s=0.5, reflection_s=2.0, acceptance=0.3)
    ranked = model.plan(SHAPE, [(1, 1), (2, 2), (4, 4), (8, 1)])
    walls = [p.wall_s for p in ranked]
    assert walls == sorted(walls)
    # In the paper's regime (reflection 4x a call, W=16) 1×1 is the slowest and has the most iterations.
    assert (ranked[-1].p, ranked[-1].n) == (1, 1)
    assert ranked[-1].iterations == max(p.iterations for p in ranked)


@pytest.mark.parametrize(("workers", "widest"), [(16, 32), (64, 32), (192, 64), (256, 64), (512, 128)])
def test_the_planner_ranks_shapes_as_wide_as_the_pool_can_feed(workers, widest):
    shape = RunShape(workers=workers, budget=5000, val_size=150, minibatch_size=3)
    shapes = shapes_for(shape)
    assert max(p * n for p, n in shapes) == widest
    assert all(p * n * shape.minibatch_size <= workers for p, n in shapes if p * n > 32)  # never wider than W/m
    assert set(DEFAULT_SHAPES) <= set(shapes) and len(set(shapes)) == len(shapes)
    ranked = RuntimeModel(task_s=2.0, reflection_s=8.0, acceptance=0.17).plan(shape)
    assert {(pr.p, pr.n) for pr in ranked} == set(shapes)


def test_plan_on_a_wide_pool_shows_wide_shapes(capsys):
    assert cli(["plan", "--workers", "256", "--budget", "5000", "--val-size", "150", "--task-latency", "2",
                "--reflection-latency", "8", "--schedules", "async", "--selection", "all", "--top", "40",
                "--minibatch-size", "3"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if re.match(r"\| \d+ \|", line)]
    widths = {int(p) * int(n) for p, n in (row.split("|")[3].strip().split("×") for row in rows)}
    assert 64 in widths and max(widths) == 64


def test_records_from_a_real_run_fit_and_carry_what_the_model_needs(task_lm, splits, tmp_path):
    train, val, _ = splits
    best = BatchedGEPA(
        metric=sim.metric, p=4, n=2, max_metric_calls=180, reflection_lm=sim.SimulatedLM(), num_threads=8,
        selection="best", schedule="steps", log_dir=str(tmp_path),
    ).compile(seed_program(), trainset=train, valset=val)
    steps = best.detailed_results.steps
    assert all(s.minibatch_size == 3 and s.val_size == len(val) for s in steps)
    assert all(s.improved >= s.accepted and s.accepted <= 1 for s in steps)
    assert any(s.improved > 1 for s in steps), "best selection should hide some improvers from `accepted`"
    model = RuntimeModel.fit(steps)
    assert model.acceptance == pytest.approx(sum(s.improved for s in steps) / sum(s.width for s in steps))
    assert model.predict(4, 2, RunShape(8, 180, len(val))).iterations >= 1

    assert cli(["plan", "--workers", "8", "--budget", "180", "--val-size", str(len(val)),
                "--from-run", str(tmp_path), "--shapes", "1x1,4x2", "--selection", "best"]) == 0


def test_plan_command_prints_a_ranked_table(capsys):
    assert cli(["plan", "--workers", "64", "--budget", "3000", "--val-size", "150", "--shapes", "1x1,2x2,8x1",
                "--schedules", "steps", "--selection", "all"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    # Wider is faster and shallower: all three are on the front, fastest first.
    assert [row.split("|")[3].strip() for row in rows] == ["8×1", "2×2", "1×1"]
    assert all(row.split("|")[11].strip() == "yes" for row in rows)
    assert "assumed" in out and "floor" in out


def test_the_planner_ranks_the_front_of_speed_and_depth_and_picks_a_deep_enough_setting(capsys):
    model = RuntimeModel(task_s=0.5, reflection_s=2.0, acceptance=0.35)
    predictions = [model.predict(p, n, SHAPE, sel, sch) for sch in ("steps", "async") for sel in ("all", "best")
                   for p, n in ((1, 1), (2, 2), (4, 4))]
    front = model.front(predictions)
    assert [p.wall_s for p in front] == sorted(p.wall_s for p in front)
    assert [p.generations for p in front] == sorted(p.generations for p in front)  # each slower one is deeper
    widest_all = model.predict(4, 4, SHAPE, "all", "steps")
    assert widest_all not in front  # as fast as others but shallower: wall-clock alone would have picked it
    assert cli(["plan", "--workers", "16", "--budget", "600", "--val-size", "30", "--task-latency", "0.5",
                "--reflection-latency", "2", "--acceptance", "0.35", "--shapes", "1x1,4x4"]) == 0
    out = capsys.readouterr().out
    pick = out.split("\npick ")[1]
    generations = float(pick.split(" generations,")[0].rsplit(" ", 1)[1])
    one_by_one = float(out.split("1×1 reaches ")[1].split()[0])
    # A measured setting deep enough, or the defaults (measured to keep dspy.GEPA's held-out at their own depth).
    assert generations >= one_by_one / 2 or pick.rstrip().endswith("(the defaults).")


def test_the_plan_always_shows_the_defaults_and_marks_what_was_never_measured(capsys):
    """The top of the time ranking is often a setting whose held-out quality nobody measured."""
    assert cli(["plan", "--workers", "16", "--budget", "600", "--val-size", "30"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    table = {(cells[1].strip(), cells[2].strip(), cells[3].strip()): cells for cells in rows}
    defaults = table[("async", "4×1", "merge")]  # p="auto" at W = 16, B = 600, |val| = 30, screened in stages
    assert defaults[0].strip() == "defaults" and defaults[-1].strip().startswith("measured -0.0")
    assert any(cells[-1].strip() == "never measured" for cells in table.values())
    one_at_a_time = MEASURED[("steps", "1x1", "all")].held_out  # dspy.GEPA's own search, measured as a class swap
    assert abs(one_at_a_time) < 0.01 and table[("steps", "1×1", "all")][-1].strip() == f"measured {one_at_a_time:+.3f}"
    assert cli(["plan", "--workers", "16", "--budget", "600", "--val-size", "30", "--top", "1"]) == 0
    assert "| defaults | async | 4×1 | merge |" in capsys.readouterr().out  # shown even outside the top


def test_the_plan_never_picks_a_setting_measured_to_lose_held_out(capsys):
    """Sixteen proposals a step in the step loop were measured 0.3 below dspy.GEPA's held-out score at W 16, B 600:
    however much sooner the model predicts them, the pick is a setting measured to keep it, here the defaults."""
    assert cli(["plan", "--workers", "16", "--budget", "600", "--val-size", "30", "--shapes", "1x1,16x1",
                "--schedules", "steps", "--selection", "best", "--min-generations", "0"]) == 0
    out = capsys.readouterr().out
    rows = {line.split("|")[3].strip(): line.split("|") for line in out.splitlines() if "| steps |" in line}
    defaults = next(line.split("|") for line in out.splitlines() if line.startswith("| defaults |"))
    wide = rows["16×1"]
    assert wide[-2].strip() == "measured -0.307"
    assert parse_duration(wide[5]) < parse_duration(defaults[5])  # predicted sooner, and still not picked
    assert out.split("\npick ")[1].startswith("4×1 merge (async)") and out.rstrip().endswith("(the defaults).")


def test_a_figure_measured_on_another_pool_is_shown_as_such_and_never_picked(capsys):
    """Held-out scores move with the regime (the pool sets the width, the windows, the budget's split), so a setting
    measured at W 16 says so on a plan for W 64, and its figure does not make it a pick there."""
    from types import SimpleNamespace

    from dspy_pxn.cli.plan import keeps_held_out

    assert cli(["plan", "--workers", "64", "--budget", "3000", "--val-size", "150", "--shapes", "4x4,8x4",
                "--schedules", "async", "--selection", "merge"]) == 0
    rows = {line.split("|")[3].strip(): line.split("|")[-2].strip()
            for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "| async |" in line}
    assert rows["4×4"] == f"measured {MEASURED[('async', '4x4', 'merge')].held_out:+.3f} at W 16"
    assert rows["8×4"] == f"measured {MEASURED[('async', '8x4', 'merge')].held_out:+.3f}"  # measured at W 64
    four_wide = SimpleNamespace(schedule="async", p=4, n=1, selection="merge")  # kept dspy.GEPA's score at W 16
    assert MEASURED[("async", "4x1", "merge")].keeps_held_out
    assert keeps_held_out(four_wide, 16) and not keeps_held_out(four_wide, 64)
    one_at_a_time = SimpleNamespace(schedule="steps", p=1, n=1, selection="all")  # dspy.GEPA's search on any pool
    assert keeps_held_out(one_at_a_time, 64) and keeps_held_out(one_at_a_time, 256)


def parse_duration(cell: str) -> float:
    value, unit = cell.split()
    return float(value) * {"s": 1, "min": 60, "h": 3600}[unit]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--workers", "0", "--budget", "3000", "--val-size", "150"], "workers"),
        (["plan", "--workers", "8", "--budget", "3000", "--val-size", "150", "--acceptance", "2"], "acceptance"),
        (["plan", "--workers", "8", "--budget", "3000", "--val-size", "150", "--from-run", "/nonexistent"],
         "--from-run"),
        (["plan", "--workers", "8", "--budget", "3000", "--val-size", "150", "--shapes", "2by2"], "PxN"),
    ],
)
def test_plan_command_errors_are_one_line(capsys, argv, message):
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_plan_from_a_directory_without_a_step_log_says_what_to_do(tmp_path, capsys):
    assert cli(["plan", "--workers", "8", "--budget", "300", "--val-size", "30", "--from-run", str(tmp_path)]) == 2
    assert STEP_LOG_NAME in capsys.readouterr().err


def test_plot_writes_a_png_with_the_measured_points(tmp_path):
    model = RuntimeModel(task_s=0.5, reflection_s=2.0, acceptance=0.3)
    path = plot_model_vs_measured({"fit": model}, SHAPE, {(1, 1): 120.0, (4, 4): 30.0}, tmp_path / "model.png")
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert (width, height) == (840, 540)  # 7 x 4.5 inches at 120 dpi


# Where each held-out figure the planner holds was measured: the results file, the config it names there, and the
# file with the runs it is paired with (dspy.GEPA's; None: the same file's first config, 1×1).
MEASURED_IN = {
    ("async", "auto", "merge"): ("class_swap_default.json", "BatchedGEPA", "class_swap_bill.json"),
    ("steps", "1x1", "all"): ("class_swap_p1_p2.json", "BatchedGEPA p1", "class_swap_bill.json"),
    ("async", "2x1", "merge"): ("class_swap_p1_p2.json", "BatchedGEPA p2", "class_swap_bill.json"),
    ("async", "3x1", "merge"): ("class_swap_staged_width.json", "BatchedGEPA p3", "class_swap_bill.json"),
    ("async", "4x1", "merge"): ("class_swap_staged_width.json", "BatchedGEPA p4", "class_swap_bill.json"),
    ("async", "5x1", "merge"): ("class_swap_staged_width.json", "BatchedGEPA p5", "class_swap_bill.json"),
    ("async", "4x4", "merge"): ("class_swap_async_4x4.json", "async 4x4 merge x", "class_swap_bill.json"),
    ("async", "8x4", "merge"): ("class_swap_w64_async_8x4.json", "async 8x4 merge x",
                                "class_swap_w64_bill.json"),
    **{("steps", shape, selection): ("heldout.json", f"{shape}{label}", None)
       for shape, selection, label in (("4x4", "all", ""), ("8x2", "all", ""), ("16x1", "all", ""),
                                       ("4x4", "best", " best"), ("8x2", "best", " best"), ("16x1", "best", " best"),
                                       ("4x4", "top-2", " top2"), ("16x1", "top-2", " top2"))},
}


def test_every_held_out_figure_the_planner_holds_is_its_results_file_s():
    """The planner's figures are the paired differences in the files they name, recomputed: a rerun that moves a
    file, or a figure typed without one, fails here."""
    results = Path(__file__).parent.parent / "benchmarks" / "results"
    assert set(MEASURED) == set(MEASURED_IN)
    for key, (name, config, against) in MEASURED_IN.items():
        tables = json.loads((results / name).read_text())["tables"]
        theirs = json.loads((results / against).read_text())["tables"] if against else tables
        differences = []
        for cell, table in tables.items():
            mine = {r["seed"]: r["test"] for r in table["rows"] if r["config"] == config}
            baseline = {r["seed"]: r["test"] for r in theirs.get(cell, {}).get("rows", [])
                        if r["config"] == ("dspy.GEPA" if against else "1x1")}
            differences += [mine[seed] - baseline[seed] for seed in mine if seed in baseline]
        assert len(differences) >= 10, key  # independent seeds, on more than one landscape
        assert MEASURED[key].held_out == pytest.approx(statistics.mean(differences), abs=0.0015), key
        assert name in MEASURED[key].where


# The chain runs the link yield was checked on (W 16, B 600, |val| 30, fixed call times, 10 seeds each): the results
# file, the config, and how many proposals it keeps in flight.
CHAIN_RUNS = (
    ("class_swap_p1_p2.json", "BatchedGEPA p1", 1),
    ("class_swap_chain_pieces.json", "BatchedGEPA p2 m3", 2), ("class_swap_p1_p2.json", "BatchedGEPA p2", 2),
    ("class_swap_all_m3.json", "async 3x1 all m3 x", 3), ("class_swap_staged_width.json", "BatchedGEPA p3", 3),
    ("class_swap_narrower.json", "BatchedGEPA p3 m3", 3), ("class_swap_all_m3.json", "async 4x1 all m3 x", 4),
    ("class_swap_default.json", "BatchedGEPA", 4), ("class_swap_staged_width.json", "BatchedGEPA p5", 5),
)


def test_the_link_yield_is_what_the_chain_measured_at_every_width():
    """Depth per reflection call on the chain landscape, one at a time and 2-5 side by side, against
    ``link_yield``'s a/(1 + a(w − 1)) with a measured at one at a time: no parameter is fitted to the wider runs."""
    results = Path(__file__).parent.parent / "benchmarks" / "results"

    def measured_yield(name: str, config: str) -> float:
        rows = [r for r in json.loads((results / name).read_text())["tables"]["chain/fixed"]["rows"]
                if r["config"] == config]
        assert len(rows) == 10, (name, config)
        return sum(r["generations"] for r in rows) / sum(r["bill"]["reflection"]["calls"] for r in rows)

    one_at_a_time = measured_yield(*CHAIN_RUNS[0][:2])
    model = RuntimeModel(task_s=0.2, reflection_s=0.8, acceptance=one_at_a_time)
    for name, config, in_flight in CHAIN_RUNS[1:]:
        assert measured_yield(name, config) == pytest.approx(model.link_yield(in_flight), rel=0.12), config
    assert model.link_yield(1) == pytest.approx(one_at_a_time)
    assert model.link_yield(4) < model.link_yield(2) < model.link_yield(1)


def test_chain_depth_is_the_depth_one_at_a_time_and_less_beside_it():
    model = RuntimeModel(task_s=0.2, reflection_s=0.8, acceptance=0.18)
    serial = model.predict(1, 1, SHAPE)
    assert serial.chain_depth == pytest.approx(serial.generations)
    staged = RunShape(workers=16, budget=600, val_size=30, minibatch_size=8)
    depths = [model.predict(k, 1, staged, "merge", "async", reflection_rows=3).chain_depth for k in (2, 4, 8)]
    assert serial.chain_depth > depths[0] > depths[1] > depths[2] > 0
    for k in (2, 4, 8):  # never deeper than the windows the run validates
        wide = model.predict(k, 1, staged, "merge", "async", reflection_rows=3)
        assert wide.chain_depth <= wide.generations
    never = RuntimeModel(task_s=0.2, reflection_s=0.8, acceptance=0.0)
    assert never.predict(4, 1, staged, "merge", "async").chain_depth == 0
    with pytest.raises(ValueError, match="in_flight"):
        model.link_yield(0)
