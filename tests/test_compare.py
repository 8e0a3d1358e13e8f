"""Comparison of real logged runs: three sweeps' worth of MLflow runs in a local sqlite store."""

from __future__ import annotations

import dspy
import pytest
from PIL import Image

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.tracking import MlflowTracker, sweep
from dspy_pxn.tracking.compare import compare_experiment, load_runs

CONFIGS = [(1, 1, "all"), (2, 2, "all"), (4, 1, "best")]
PRICED = "openai/gpt-4o-mini"  # the simulated LM under a name litellm's price map knows


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    store = f"sqlite:///{root}/mlflow.db"
    train, val, test = sim.make_splits(seed=0, train=24, val=8, test=12)
    results = {}
    with sweep("grid", experiment="cmp", tracking_uri=store, log_dir=str(root / "sweep"), compare=False) as grid:
        for p, n, selection in CONFIGS:
            optimizer = BatchedGEPA(
                metric=sim.metric, p=p, n=n, selection=selection, max_metric_calls=100, num_threads=8,
                reflection_lm=sim.SimulatedLM(PRICED, reflection_latency=0.02),
            )
            with dspy.context(lm=sim.SimulatedLM(PRICED, task_latency=0.004)):
                results[(p, n)] = optimizer.compile(sim.seed_program(), trainset=train, valset=val,
                                                    testset=test).detailed_results
    return store, root, results, grid.run_id, len(val)


def table_rows(table: str) -> dict[str, dict[str, str]]:
    lines = [line for line in table.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True)) for line in lines[2:]]
    return {row["config"]: row for row in rows}


def test_compare_writes_three_figures_and_a_table_from_the_logged_runs(logged, tmp_path):
    store, _, results, _, _ = logged
    comparison = compare_experiment("cmp", str(tmp_path / "out"), tracking_uri=store)

    assert [p.rsplit("/", 1)[1] for p in comparison.plots] == [
        "val_vs_metric_calls.png", "val_vs_wall_clock.png", "val_vs_dollars.png"]
    for path in comparison.plots:
        with Image.open(path) as image:
            image.verify()
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size == (700, 450)
            colors = image.convert("RGB").getcolors(maxcolors=1 << 16)
            assert colors is None or len(colors) > 50, f"{path} looks blank"

    rows = table_rows(comparison.table)
    with open(comparison.table_path) as handle:
        assert handle.read() == comparison.table
    assert set(rows) == {"1x1", "2x2 async", "4x1 best async"}  # above 1x1 the default schedule is async
    wall_1x1 = results[(1, 1)].wall_s
    for (p, n, selection), config in zip(CONFIGS, ["1x1", "2x2 async", "4x1 best async"], strict=True):
        row, result = rows[config], results[(p, n)]
        steps = result.steps
        best = max(result.val_aggregate_scores)
        assert int(row["iterations"]) == len(steps)
        assert float(row["validation-trigger fraction"]) == pytest.approx(
            sum(s.full_validation for s in steps) / len(steps), abs=0.005)
        assert float(row["wall s"]) == pytest.approx(result.wall_s, abs=0.05)
        assert float(row["speedup vs 1x1"]) == pytest.approx(wall_1x1 / result.wall_s, abs=0.005)
        assert int(row["metric calls"]) == result.total_metric_calls
        assert float(row["cost $"]) == pytest.approx(result.usage.cost_usd, abs=5e-5)
        assert float(row["best val"]) == pytest.approx(best, abs=5e-4)
        assert float(row["test"]) == pytest.approx(result.test_score, abs=5e-4)
        assert float(row["val-test gap"]) == pytest.approx(best - result.test_score, abs=1e-3)
    assert rows["1x1"]["speedup vs 1x1"] == "1.00"


def test_runs_read_back_through_mlflow_carry_each_runs_curve(logged):
    store, _, results, sweep_run_id, val_size = logged
    runs = load_runs("cmp", store, parent_run_id=sweep_run_id)
    assert [(run.p, run.n) for run in runs] == [(p, n) for p, n, _ in CONFIGS]
    for run in runs:
        result = results[(run.p, run.n)]
        curve = run.curve
        assert [pt.step for pt in curve] == list(range(len(result.steps) + 1))
        assert curve[0].metric_calls == val_size and curve[-1].metric_calls == result.total_metric_calls
        assert [pt.best_val for pt in curve[1:]] == pytest.approx([s.best_val for s in result.steps])
        for axis in ("metric_calls", "elapsed_s", "cost_usd"):
            xs = [getattr(pt, axis) for pt in curve]
            assert xs == sorted(xs) and xs[0] >= 0, axis
        assert curve[-1].cost_usd == pytest.approx(result.usage.cost_usd)


def test_compare_names_a_missing_experiment_and_the_ones_that_exist(logged, tmp_path):
    store = logged[0]
    with pytest.raises(ValueError, match=r"experiment='nope' does not exist.*'cmp'"):
        compare_experiment("nope", str(tmp_path), tracking_uri=store)


def test_runs_with_another_budget_or_data_are_flagged_not_compared(logged, tmp_path):
    store = logged[0]
    train, val, _ = sim.make_splits(seed=0, train=24, val=8, test=12)
    for p, n, budget, valset in [(1, 1, 60, val), (2, 2, 60, val), (2, 2, 100, val), (1, 1, 60, val[:6])]:
        with dspy.context(lm=sim.SimulatedLM(task_latency=0.004)):
            BatchedGEPA(metric=sim.metric, p=p, n=n, max_metric_calls=budget, num_threads=8,
                        tracker=MlflowTracker(tracking_uri=store, experiment="mixed"),
                        reflection_lm=sim.SimulatedLM()).compile(
                sim.seed_program(), trainset=train, valset=valset)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "val_vs_dollars.png").write_bytes(b"an earlier comparison's figure")
    comparison = compare_experiment("mixed", str(tmp_path / "out"), tracking_uri=store)
    table = comparison.table
    # The simulated LM has no price: no dollar figure (not an empty frame, nor an earlier one), and one line why.
    assert [p.rsplit("/", 1)[1] for p in comparison.plots] == ["val_vs_metric_calls.png", "val_vs_wall_clock.png"]
    assert not (tmp_path / "out" / "val_vs_dollars.png").exists()
    assert comparison.left_out == (("No val_vs_dollars.png: no LM price is known for these runs' models (local "
                                    "and unknown models are unpriced), so no run logged dollars."),)
    assert table.endswith(f"\n{comparison.left_out[0]}\n")
    lines = [line for line in table.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True)) for line in lines[2:]]
    assert [row["setup"] for row in rows] == ["A", "A", "B", "C"]
    setup_a = {(run.p, run.n): run for run in comparison.runs
               if dict(run.setup).get("budget") == "60" and dict(run.setup).get("valset_size") == "8"}
    # The 2x2 is measured against setup A's 1x1 (a ratio of two wall-clocks, which may round to 1.00 on a
    # run this small), not against itself or another setup's 1x1.
    assert rows[0]["speedup vs 1x1"] == "1.00"
    assert rows[1]["speedup vs 1x1"] == f"{setup_a[1, 1].wall_s / setup_a[2, 2].wall_s:.2f}"
    assert rows[2]["speedup vs 1x1"] == "—"  # no 1x1 ran with budget 100: no speed-up against another budget
    assert rows[3]["speedup vs 1x1"] == "1.00"  # the 1x1 on 6 val examples is its own baseline
    assert "they differ in budget, valset_size" in table
    assert "- setup B: budget=100, valset_size=8" in table
    assert "No finished 1x1 run in setup B" in table
