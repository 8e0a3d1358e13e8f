"""`dspy-pxn` subcommands over a real MLflow sqlite store: plan from a run id, compare, import."""

import os

import dspy
import pytest
from mlflow import MlflowClient

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.cli import main as cli
from dspy_pxn.tracking import MlflowTracker
from tests.conftest import seed_program


@pytest.fixture(scope="module")
def tracked_runs(tmp_path_factory):
    """Two small tracked runs (1×1 and 2×2) in a fresh sqlite store, each with a log_dir."""
    tmp_path = tmp_path_factory.mktemp("cli")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    train, val, test = sim.make_splits(seed=0, train=24, val=8, test=12)
    results = {}
    for p, n in [(1, 1), (2, 2)]:
        with dspy.context(lm=sim.SimulatedLM()):
            best = BatchedGEPA(
                metric=sim.metric, p=p, n=n, max_metric_calls=90, reflection_lm=sim.SimulatedLM(), num_threads=4,
                tracker=MlflowTracker(tracking_uri=uri, experiment="cli", run_name=f"{p}x{n}"),
                log_dir=str(tmp_path / f"log-{p}x{n}"),
            ).compile(seed_program(), trainset=train, valset=val, testset=test)
        results[(p, n)] = best.detailed_results
    return uri, results, tmp_path


def test_plan_fits_the_step_log_stored_in_an_mlflow_run(tracked_runs, capsys):
    uri, results, _ = tracked_runs
    run_id = results[(2, 2)].mlflow_run_id
    assert cli(["plan", "--workers", "4", "--budget", "90", "--val-size", "8", "--from-run", run_id,
                "--tracking-uri", uri, "--shapes", "1x1,2x2"]) == 0
    out = capsys.readouterr().out
    assert f"fitted from {run_id}" in out and "| 1 |" in out and "| 2 |" in out


def test_plan_with_an_unknown_run_id_says_what_to_check(tracked_runs, capsys):
    uri, _, _ = tracked_runs
    assert cli(["plan", "--workers", "4", "--budget", "90", "--val-size", "8", "--from-run", "0" * 32,
                "--tracking-uri", uri]) == 2
    assert "--tracking-uri" in capsys.readouterr().err


def test_compare_writes_the_table_and_plots_for_the_experiment(tracked_runs, capsys):
    uri, results, tmp_path = tracked_runs
    out_dir = tmp_path / "comparison"
    assert cli(["compare", "--experiment", "cli", "--tracking-uri", uri, "--out", str(out_dir)]) == 0
    printed = capsys.readouterr().out
    assert "1x1" in printed and "2x2" in printed
    written = set(os.listdir(out_dir))
    # The simulated LMs have no price, so the dollars figure is left out and the table says why.
    assert written == {"comparison.md", "val_vs_metric_calls.png", "val_vs_wall_clock.png"}
    assert "No val_vs_dollars.png" in (out_dir / "comparison.md").read_text()


def test_mlflow_import_replays_a_log_dir_into_another_store(tracked_runs, capsys):
    _, results, tmp_path = tracked_runs
    other = f"sqlite:///{tmp_path}/other.db"
    assert cli(["mlflow-import", str(tmp_path / "log-2x2"), "--tracking-uri", other, "--experiment", "moved"]) == 0
    assert "created MLflow run" in capsys.readouterr().out
    client = MlflowClient(other)
    runs = client.search_runs([client.get_experiment_by_name("moved").experiment_id])
    assert len(runs) == 1
    assert runs[0].data.metrics["totals/metric_calls"] == results[(2, 2)].total_metric_calls


def test_mlflow_import_of_a_directory_that_is_not_a_run_is_one_line(tmp_path, capsys):
    assert cli(["mlflow-import", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "log_dir" in err
