"""benchmarks/bench_mlflow_prompts.py end to end at a tiny budget: MLflow's GepaPromptOptimizer against the latency
server (zero latency), predict_fn calls counted, reflection calls seen by the server, the JSON written."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.scripts import load_script

pytest.importorskip("mlflow")

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_mlflow_prompts.py"
FIELDS = {"config", "seed", "tracing", "wall_s", "optimize_s", "budget", "predict_calls", "predict_calls_setup",
          "server_task_calls", "reflection_calls", "max_in_flight", "initial_score", "final_score", "held_out_seed",
          "held_out_final", "final_template", "store_bytes", "traces"}


def load_bench() -> ModuleType:
    """The script as a module, its siblings importable as when it is run (``python benchmarks/...``)."""
    if str(BENCH.parent) not in sys.path:
        sys.path.insert(0, str(BENCH.parent))
    return load_script(BENCH)


@pytest.mark.parametrize("tracing", [True, False], ids=["tracing", "no-tracing"])
def test_main_counts_calls_and_writes_json(tmp_path: Path, tracing: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    monkeypatch.syspath_prepend(str(BENCH.parent))  # as when run as a script: its siblings import
    bench = load_bench()
    before = mlflow.get_tracking_uri()
    out = tmp_path / "bench.json"
    argv = ["--configs", "mlflow.GepaPromptOptimizer", "--rows", "6", "--budget", "20", "--task-latency", "0",
            "--reflection-latency", "0", "--test", "10", "--out", str(out)]
    report = bench.main(argv + ([] if tracing else ["--no-tracing", "--rows-alone"]))

    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    (row,) = report["rows"]
    assert FIELDS <= set(row)
    assert row["config"] == "mlflow.GepaPromptOptimizer" and row["tracing"] is tracing and row["budget"] == 20
    assert row["predict_calls"] >= 6  # at least the seed's full evaluation on the 6 rows
    assert row["predict_calls_setup"] == 1  # MLflow's pre-flight trace check
    # Every predict_fn call is one task call at the server; the reflection model (litellm) reached it too.
    assert row["server_task_calls"] == row["predict_calls"] + row["predict_calls_setup"]
    assert row["reflection_calls"] >= 1
    assert 0.0 <= row["initial_score"] <= row["final_score"] <= 1.0
    assert row["final_template"].startswith("Apply the named rule")
    assert (row["traces"] > 0) is tracing
    assert report["table"][0]["config"] == "mlflow.GepaPromptOptimizer"
    # Where the optimizer's wall went: its rows over the pool, and the pool's idle time split at the seed's
    # validation's end and the last reflection's start, which add up to the rest of the wall.
    assert 0 < row["busy_over_w_s"] <= row["optimize_s"] and row["mean_call_s"] > 0
    assert 0 < row["seed_end_s"] <= row["last_reflection_s"] < row["optimize_s"]
    idle = row["idle_seed_s"] + row["idle_search_s"] + row["idle_end_s"]
    assert idle == pytest.approx(row["optimize_s"] - row["busy_over_w_s"], abs=1e-6)
    # This process's CPU over the call (the rows' client work and the optimizer; the LM server is another process).
    assert 0 < row["cpu_s"] <= (os.cpu_count() or 1) * row["wall_s"] and report["table"][0]["cpu_s"] == row["cpu_s"]
    assert mlflow.get_tracking_uri() == before  # the temp store is not left behind
    if not tracing:  # the budget's rows timed with no optimizer, against the same server
        (alone,) = report["rows_alone"]
        assert alone["rows"] == 20 and alone["workers"] >= 1 and alone["wall_s"] > 0


def test_unknown_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        load_bench().main(["--configs", "nope", "--out", str(tmp_path / "x.json")])


def test_both_optimizers_side_by_side_ours_within_budget(tmp_path: Path) -> None:
    """The default run: BatchedGepaPromptOptimizer and MLflow's, same data, budget and server; ours never spends
    past the budget, and its floor is the runtime model's (its rows' waits over MLflow's evaluation width)."""
    bench = load_bench()
    report = bench.main(["--rows", "6", "--budget", "40", "--task-latency", "0.01", "--reflection-latency", "0",
                         "--test", "10", "--no-tracing", "--out", str(tmp_path / "both.json")])
    ours, theirs = report["rows"]
    assert (ours["config"], theirs["config"]) == ("BatchedGepaPromptOptimizer", "mlflow.GepaPromptOptimizer")
    assert 6 <= ours["predict_calls"] <= 40
    assert ours["server_task_calls"] == ours["predict_calls"] + ours["predict_calls_setup"]
    assert ours["floor_s"] == pytest.approx(ours["predict_calls"] * 0.01 / 10)
    assert 0.0 <= ours["initial_score"] <= ours["final_score"] <= 1.0
    assert ours["store"] == "sqlite" and not ours["tracing"]
