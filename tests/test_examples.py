"""Every script in examples/ runs, in a reduced size, against the loopback latency server.

Each example takes ``--lm/--reflection-lm/--api-base`` (quickstart starts its own server), so
the test runs exactly the code a user copies, only pointed at a local OpenAI-compatible LM.
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.scripts import load_script
from tests.test_programs_helpers import require_data

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str) -> ModuleType:
    return load_script(EXAMPLES / f"{name}.py", f"example_{name}")


@pytest.fixture(scope="module")
def sweep_store(tmp_path_factory, sim_lm_flags):
    """examples/sweep.py once, shared with the compare_runs test that reads its runs back."""
    data = str(require_data("gsm8k"))
    tmp = tmp_path_factory.mktemp("sweep")
    uri = f"sqlite:///{tmp}/mlflow.db"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
            load_example("sweep").main([*sim_lm_flags, "--configs", "1x1,2x1", "--budget", "15", "--sizes", "4,3,3",
                                    "--workers", "4", "--data-dir", data, "--tracking-uri", uri, "--experiment", "ex-sweep",
                                    "--log-dir", str(tmp / "runs")])
    return uri, tmp, printed.getvalue()


def test_quickstart(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["quickstart.py", "--budget", "80", "--task-latency", "0.01"])
    load_example("quickstart").main()
    out = capsys.readouterr().out
    assert "test: seed" in out and "optimized instruction" in out
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert steps and all("metric calls" in line for line in steps)
    # Every printed step did something: screened a proposal or validated a candidate.
    assert not [line for line in steps if "0 proposals screened" in line and "none validated" in line]


def test_optimize_math(sim_lm_flags, tmp_path, capsys):
    data = str(require_data("livebench_math"))
    load_example("optimize_math").main([*sim_lm_flags, "--data-dir", data, "--p", "2", "--n", "1", "--budget", "15", "--workers", "4",
                                        "--train-size", "4", "--val-size", "3", "--test-size", "3",
                                        "--log-dir", str(tmp_path)])
    assert "instruction:" in capsys.readouterr().out and (tmp_path / "program.json").is_file()


def test_optimize_hover_builds_a_stand_in_corpus(sim_lm_flags, tmp_path, capsys):
    data = str(require_data("hover"))
    load_example("optimize_hover").main([*sim_lm_flags, "--data-dir", data, "--p", "1", "--n", "1", "--budget", "10", "--workers", "4",
                                         "--train-size", "3", "--val-size", "2", "--test-size", "2",
                                         "--log-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "write_query" in out and (tmp_path / "program.json").is_file()


def test_sweep_prints_the_comparison(sweep_store):
    _, tmp, printed = sweep_store
    assert "2x1" in printed.replace("2×1", "2x1") and (tmp / "runs" / "comparison" / "comparison.md").is_file()


def test_compare_runs_reads_the_sweep(sweep_store, tmp_path, capsys):
    uri, _, _ = sweep_store
    load_example("compare_runs").main(["--experiment", "ex-sweep", "--tracking-uri", uri, "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "1x1" in out.replace("1×1", "1x1") and "plots:" in out


def test_optimize_mlflow_prompts(capsys, monkeypatch):
    pytest.importorskip("mlflow")
    for name in ("OPENAI_BASE_URL", "OPENAI_API_BASE", "OPENAI_API_KEY"):  # the example sets them: put back after
        monkeypatch.setenv(name, "unused")
    from dspy_pxn.testing.mlflow_state import mlflow_state_restored

    with mlflow_state_restored():
        report = load_example("optimize_mlflow_prompts").main(["--budget", "40", "--rows", "6",
                                                               "--task-latency", "0.01"])
    ours = report["BatchedGepaPromptOptimizer"]
    assert ours["metric_calls"] <= 40 and ours["final"] >= ours["initial"]
    assert ours["uri"].startswith("prompts:/rule_arithmetic/")
    assert "optimized prompt:" in capsys.readouterr().out
