"""MLflow tracking against real stores: a local sqlite store and `mlflow server` processes on loopback."""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import dspy
import mlflow
import pytest
from dspy.clients.base_lm import GLOBAL_HISTORY
from mlflow import MlflowClient

from dspy_pxn import read_step_log
from dspy_pxn import testing as sim
from dspy_pxn.ledger.prices import token_prices
from dspy_pxn.testing import LatencyServer
from dspy_pxn.testing.mlflow_server import NO_PROXY, MlflowServer, free_port
from dspy_pxn.tracking import (
    BEST_RUN_TAG,
    CONFIG_TAG,
    KIND_TAG,
    MODEL_TAG,
    PARENT_TAG,
    MlflowTracker,
    import_step_log,
    sweep,
)
from dspy_pxn.tracking.lineage import VALIDATED, read_proposals
from dspy_pxn.tracking.mlflow_io import metric_key
from dspy_pxn.tracking.runlog import RunManifest
from tests.compiling import compile_sim
from tests.faults import Faults

SECRET = "sk-test-do-not-log"


@pytest.fixture
def default_mlflow_uri(monkeypatch):
    """No tracking URI set anywhere, as for a user who never configured MLflow; restored after."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    mlflow.set_tracking_uri(None)
    yield
    mlflow.set_tracking_uri(None)


def history(client: MlflowClient, run_id: str, key: str) -> dict[int, float]:
    metrics = client.get_metric_history(run_id, key)
    steps = [m.step for m in metrics]
    assert len(steps) == len(set(steps)), f"{key} logged twice at one step: {sorted(steps)}"
    return {m.step: m.value for m in metrics}


def tracking_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("dspy_pxn.tracking") and r.levelno >= logging.WARNING]


# ----------------------------------------------------------------------------- a P×N run on a server
def test_pxn_run_on_the_latency_server_is_mirrored_step_by_step(mlflow_server, tmp_path, engine):
    train, val, _ = sim.make_splits(seed=0, train=24, val=8, test=10)
    log_dir = str(tmp_path / "run")
    faults = Faults(rate_limit_429=0.08, retry_after_s=0.01, seed=5)  # retried: each step's retries are logged
    with LatencyServer(task_latency=0.01, reflection_latency=0.05, faults=faults) as lm_server:
        # A model name the price maps know, served by the loopback server: every call has a price.
        def lm(**kw):
            return dspy.LM("openai/gpt-4o-mini", api_base=lm_server.base_url, api_key=SECRET, cache=False,
                           num_retries=5, **engine, **kw)

        tracker = MlflowTracker(tracking_uri=mlflow_server.uri, experiment="pxn-latency", run_name="2x2 on loopback",
                                tags={"dataset": "sim-rules"})
        seen = {entry["uuid"] for entry in GLOBAL_HISTORY}
        result = compile_sim(splits=(train, val), lm=lm(temperature=0.0), reflection_lm=lm(temperature=1.0), p=2, n=2,
                             max_metric_calls=110, schedule="steps", selection="all", tracker=tracker,
                             log_dir=log_dir).results
        calls, requests = lm_server.stats()["calls"], lm_server.stats()["requests"]["calls"]
    ours = [entry for entry in GLOBAL_HISTORY if entry["uuid"] not in seen]
    steps = result.steps
    assert len(steps) >= 2 and max(s.width for s in steps) == 4

    # Tokens and dollars: every LM call counted once; dollars agree with the engine's own cost of each call.
    assert result.usage.lm_calls == len(ours) == calls["total"]
    assert result.usage.unpriced_calls == 0
    assert result.usage.cost_usd == pytest.approx(sum(entry["cost"] for entry in ours), rel=1e-9)
    price = token_prices("openai/gpt-4o-mini")
    for step in steps:
        assert step.lm_calls > 0 and step.prompt_tokens > 0
        assert step.cost_usd == pytest.approx(price.of(step.prompt_tokens, step.completion_tokens))
    manifest = RunManifest.load(log_dir)
    # The first record has the seed's validation too: the records add up to the run, its retries included.
    assert 0 < manifest.baseline.cost_usd <= steps[0].cost_usd
    assert sum(s.cost_usd for s in steps) == pytest.approx(result.usage.cost_usd)
    assert steps[-1].cost_usd_total == pytest.approx(result.usage.cost_usd)
    counts = result.lm_call_counts
    assert counts.attempts == requests["total"] and counts.retries == requests["total"] - calls["total"] > 0
    assert sum(s.lm_retries for s in steps) == counts.retries

    client = MlflowClient(mlflow_server.uri)
    run = client.get_run(result.mlflow_run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "2x2 on loopback"
    assert client.get_experiment(run.info.experiment_id).name == "pxn-latency"
    params = run.data.params
    assert {k: params[k] for k in ("p", "n", "num_workers", "budget", "seed", "selection")} == {
        "p": "2", "n": "2", "num_workers": "8", "budget": "110", "seed": "0", "selection": "all"}
    assert params["task_lm"] == params["reflection_lm"] == "openai/gpt-4o-mini"
    assert (params["program"], params["dataset"], params["trainset_size"], params["valset_size"]) == (
        "ChainOfThought", "sim-rules", "24", "8")
    assert run.data.tags[CONFIG_TAG] == "2x2" and run.data.tags[KIND_TAG] == "run"
    with open(os.path.join(log_dir, "run.json")) as handle:
        logged_text = json.dumps([run.data.params, run.data.tags]) + handle.read()
    assert SECRET not in logged_text and lm_server.base_url not in logged_text

    # One MLflow step per StepRecord, each metric equal to the record; step 0 is the seed validation.
    for key in ("proposals", "accepted", "full_validation", "mean_val", "pareto_front_size", "metric_calls",
                "wall_s", "reflection_s", "screening_s", "validation_s", "worker_utilisation",
                "prompt_tokens", "completion_tokens", "cost_usd", "lm_retries"):
        logged = history(client, run.info.run_id, metric_key(key))
        if key in ("mean_val", "pareto_front_size"):
            assert logged.pop(0) == (manifest.baseline.val_score if key == "mean_val" else 1.0)
        # A failure series starts at the first step that had one (here: a retried 429), then every step.
        shown = steps[next(i for i, s in enumerate(steps) if s.lm_retries):] if key == "lm_retries" else steps
        assert sorted(logged) == [s.step for s in shown], key
        assert [logged[s.step] for s in shown] == pytest.approx([float(getattr(s, key)) for s in shown]), key
    assert not {"cost/lm_failures", "pool/rollout_failures", "search/reflection_failures"} & set(run.data.metrics)
    best = history(client, run.info.run_id, "search/best_val")
    assert best == pytest.approx({0: result.val_aggregate_scores[0], **{s.step: s.best_val for s in steps}})
    calls_total = history(client, run.info.run_id, "search/metric_calls_total")
    assert calls_total[0] == len(val) and calls_total[steps[-1].step] == result.total_metric_calls
    elapsed = history(client, run.info.run_id, "time/elapsed_s")
    assert list(elapsed.values()) == sorted(elapsed.values()) and elapsed[steps[-1].step] <= result.wall_s + 0.05
    final = run.data.metrics
    assert final["totals/metric_calls"] == result.total_metric_calls <= 110
    assert final["totals/iterations"] == len(steps)
    assert final["totals/validation_trigger_fraction"] == pytest.approx(sum(s.full_validation for s in steps) / len(steps))
    assert final["totals/wall_s"] == pytest.approx(result.wall_s)
    assert final["totals/cost_usd"] == pytest.approx(result.usage.cost_usd)
    assert "totals/test_score" not in final  # no testset given
    # Run totals beside the step series (whose last value the run overview shows), failures only where some were.
    for key in ("proposals", "improved", "accepted", "rollouts"):
        assert final[f"totals/{key}"] == sum(getattr(s, key) for s in steps), key
    assert final["totals/lm_retries"] == counts.retries and "totals/lm_failures" not in final

    # Artifacts: optimized program, lineage, per-proposal table, step log, plots.
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"program.json", "candidates.csv", "proposals.csv", "steps.jsonl", "run.json", "plots"} <= names
    assert {a.path for a in client.list_artifacts(run.info.run_id, "plots")} == {
        "plots/val_vs_metric_calls.png", "plots/step_times.png"}
    downloaded = client.download_artifacts(run.info.run_id, "program.json", str(tmp_path / "dl"))
    loaded = sim.seed_program()
    loaded.load(downloaded)
    best_program = result.candidates[result.best_idx]
    best_instructions = best_program.predict.signature.instructions
    assert loaded.predict.signature.instructions == best_instructions != sim.seed_instruction()
    steps_file = client.download_artifacts(run.info.run_id, "steps.jsonl", str(tmp_path / "dl"))
    assert read_step_log(os.path.dirname(steps_file)) == list(steps)
    import csv

    with open(client.download_artifacts(run.info.run_id, "candidates.csv", str(tmp_path / "dl"))) as handle:
        candidates = list(csv.DictReader(handle))
    assert [json.loads(row["parents"]) for row in candidates] == [
        [p for p in parents if p is not None] for parents in result.parents]
    assert [float(row["val_score"]) for row in candidates] == pytest.approx(result.val_aggregate_scores)
    proposals = read_proposals(log_dir)
    assert len(proposals) == sum(s.width for s in steps)
    assert sorted(p.candidate for p in proposals if p.outcome == VALIDATED) == list(range(1, len(result.candidates)))
    for p in proposals:
        if p.outcome == VALIDATED:
            assert p.parent in [q for q in result.parents[p.candidate] if q is not None]
            assert p.child_minibatch_score > p.parent_minibatch_score


# ----------------------------------------------------------------------------- sweeps and nesting
def _all_runs(client: MlflowClient):
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments, max_results=5000)


def test_a_sweep_is_one_parent_with_a_child_per_config_and_no_orphans(mlflow_server, tmp_path):
    """mlflow.dspy.autolog on, and the test set scored in worker threads: still exactly 3 new runs."""
    client = MlflowClient(mlflow_server.uri)
    before = {r.info.run_id for r in _all_runs(client)}
    mlflow.set_tracking_uri(mlflow_server.uri)  # where autolog's fluent runs (orphans) would go
    mlflow.dspy.autolog(log_traces=False, log_evals=True, log_compiles=True, silent=True)
    try:
        with sweep("grid", experiment="pxn-sweep", tracking_uri=mlflow_server.uri, log_dir=str(tmp_path / "sweep")) as grid:
            testset = sim.make_splits(seed=0, test=12).test
            results = [compile_sim(lm=sim.SimulatedLM(), p=p, n=n, max_metric_calls=70, testset=testset).results
                       for p, n in [(1, 1), (2, 1)]]
    finally:
        mlflow.dspy.autolog(disable=True)
        mlflow.set_tracking_uri(None)
    new = [r for r in _all_runs(client) if r.info.run_id not in before]
    assert len(new) == 3, [(r.info.run_name, r.data.tags.get(PARENT_TAG)) for r in new]
    parent = next(r for r in new if r.data.tags[KIND_TAG] == "sweep")
    children = [r for r in new if r is not parent]
    assert parent.info.run_id == grid.run_id and parent.info.status == "FINISHED"
    assert {r.data.tags[PARENT_TAG] for r in children} == {grid.run_id}
    assert {r.info.experiment_id for r in new} == {parent.info.experiment_id}
    assert sorted(r.info.run_id for r in children) == sorted(r.mlflow_run_id for r in results)
    for child, result in zip(sorted(children, key=lambda r: r.data.params["p"]), results, strict=True):
        assert child.data.metrics["totals/test_score"] == pytest.approx(result.test_score)
        assert child.data.metrics["totals/val_test_gap"] == pytest.approx(max(result.val_aggregate_scores) - result.test_score)
    comparison = {a.path for a in client.list_artifacts(grid.run_id, "comparison")}
    assert {"comparison/comparison.md", "comparison/val_vs_metric_calls.png"} <= comparison
    # Every child logged its program as a model; the parent names the best child and its model.
    best_val = {r.info.run_id: r.data.metrics["totals/best_val"] for r in children}
    assert parent.data.tags[BEST_RUN_TAG] in {run_id for run_id, v in best_val.items() if v == max(best_val.values())}
    best = next(r for r in children if r.info.run_id == parent.data.tags[BEST_RUN_TAG])
    assert all(r.data.tags[MODEL_TAG].startswith("models:/") for r in children)
    assert parent.data.tags[MODEL_TAG] == best.data.tags[MODEL_TAG]


def test_a_run_compiled_inside_the_callers_mlflow_run_nests_under_it(tmp_path, default_mlflow_uri, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outer_experiment = MlflowClient().create_experiment("outer-experiment")
    with mlflow.start_run(run_name="outer", experiment_id=outer_experiment) as outer:
        result = compile_sim(lm=sim.SimulatedLM(), p=2, n=1, max_metric_calls=60, use_mlflow=True).results
    client = MlflowClient()
    child = client.get_run(result.mlflow_run_id)
    assert child.data.tags[PARENT_TAG] == outer.info.run_id
    assert child.info.experiment_id == outer.info.experiment_id
    assert len(client.search_runs([outer.info.experiment_id])) == 2


# ----------------------------------------------------------------------------- the embedded default
@pytest.mark.slow  # starts a real `mlflow ui` server
def test_without_a_uri_runs_go_to_the_local_store_that_the_browse_hint_opens(tmp_path, default_mlflow_uri,
                                                                             monkeypatch):
    from dspy_pxn.cli.output import MLFLOW_UI, browse_hint

    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    result = compile_sim(lm=sim.SimulatedLM(), p=2, n=2, max_metric_calls=60, use_mlflow=True).results
    assert result.mlflow_run_id is not None
    experiment_id = MlflowClient().get_run(result.mlflow_run_id).info.experiment_id
    # What `dspy-pxn optimize` prints for the local default store (sqlite:///mlflow.db), run as printed from
    # another directory: the relative store is named by its absolute path.
    command, page = browse_hint(mlflow.get_tracking_uri(), experiment_id, result.mlflow_run_id).split(", then open ")
    assert command.startswith("mlflow ui --backend-store-uri sqlite:////") and command.endswith("/work/mlflow.db")
    assert page == f"{MLFLOW_UI}/#/experiments/{experiment_id}/runs/{result.mlflow_run_id}"
    port = free_port()
    ui = subprocess.Popen(
        # One worker and another port than the default, to start fast and beside anything on 5000.
        [sys.executable, "-m", *shlex.split(command), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env=dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
    )
    try:
        ui_uri = MlflowServer(str(tmp_path), port).uri
        deadline = time.monotonic() + 90
        while True:
            try:
                with NO_PROXY.open(ui_uri + "/health", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline and ui.poll() is None, "mlflow ui did not start"
                time.sleep(0.2)
        seen_by_ui = MlflowClient(ui_uri)
        run = seen_by_ui.get_run(result.mlflow_run_id)
        assert seen_by_ui.get_experiment(run.info.experiment_id).name == "dspy-pxn"
        assert len(seen_by_ui.get_metric_history(run.info.run_id, "search/best_val")) == len(result.steps) + 1
        assert "program.json" in {a.path for a in seen_by_ui.list_artifacts(run.info.run_id)}
    finally:
        os.killpg(ui.pid, signal.SIGKILL)
        ui.wait(timeout=10)


# ----------------------------------------------------------------------------- MLflow going away
@pytest.mark.slow  # a killed tracking server
def test_tracking_server_killed_mid_run_then_the_log_dir_is_imported(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="dspy_pxn.tracking")
    log_dir = str(tmp_path / "run")
    tracking = MlflowServer(str(tmp_path)).start()
    try:
        def kill_at_step_2(record):
            if record.step == 2:
                time.sleep(1.0)  # let step 1 reach the server, so the kill falls between two calls
                tracking.kill()

        started = time.monotonic()
        result = compile_sim(lm=sim.SimulatedLM(), p=2, n=2, max_metric_calls=150, log_dir=log_dir,
                             tracker=MlflowTracker(tracking_uri=tracking.uri, experiment="killed"),
                             gepa_kwargs={"callbacks": [SimpleNamespace(on_step_record=kill_at_step_2)]}).results
        assert time.monotonic() - started < 20, "the optimizer waited on the dead server"
        assert len(result.steps) >= 3  # steps 2 and later never reached the live server
        assert read_step_log(log_dir) == list(result.steps)
        warnings = tracking_warnings(caplog)
        assert len(warnings) == 1 and log_dir in warnings[0] and "import_step_log" in warnings[0]
        manifest = RunManifest.load(log_dir)
        assert manifest.status == "FINISHED" and manifest.run_id == result.mlflow_run_id and manifest.final is not None

        tracking.start()  # same port, same store: the run is still there, marked RUNNING
        client = MlflowClient(tracking.uri)
        assert client.get_run(result.mlflow_run_id).info.status == "RUNNING"
        assert len(history(client, result.mlflow_run_id, "search/best_val")) < len(result.steps) + 1
        [imported] = import_step_log(log_dir)
        assert imported.resumed and imported.run_id == result.mlflow_run_id and imported.steps_logged >= 1
        run = client.get_run(result.mlflow_run_id)
        assert run.info.status == "FINISHED"
        assert sorted(history(client, run.info.run_id, "search/best_val")) == list(range(len(result.steps) + 1))
        assert run.data.metrics["totals/metric_calls"] == result.total_metric_calls
        assert "candidates.csv" in {a.path for a in client.list_artifacts(run.info.run_id)}
        # Importing again changes nothing.
        [again] = import_step_log(log_dir)
        assert again.run_id == run.info.run_id and again.steps_logged == 0
        assert len(client.get_metric_history(run.info.run_id, "search/best_val")) == len(result.steps) + 1
        assert len(client.search_runs([run.info.experiment_id])) == 1
    finally:
        tracking.kill()


def test_unreachable_server_at_start_warns_once_and_the_run_imports_later(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="dspy_pxn.tracking")
    dead = f"http://127.0.0.1:{free_port()}"
    log_dir = str(tmp_path / "run")
    result = compile_sim(lm=sim.SimulatedLM(), p=2, n=1, max_metric_calls=80, log_dir=log_dir,
                         tracker=MlflowTracker(tracking_uri=dead)).results
    assert result.mlflow_run_id is None and len(result.steps) >= 2
    assert len(tracking_warnings(caplog)) == 1
    with pytest.raises(ConnectionError, match="unreachable"):
        import_step_log(log_dir)  # still down: import says so instead of hanging in retries
    store = f"sqlite:///{tmp_path}/later.db"
    [imported] = import_step_log(log_dir, tracking_uri=store, experiment="later")
    assert not imported.resumed and imported.steps_logged == len(result.steps)
    client = MlflowClient(store)
    run = client.get_run(imported.run_id)
    assert run.info.status == "FINISHED" and run.data.params["p"] == "2"
    assert history(client, run.info.run_id, "search/metric_calls_total")[len(result.steps)] == result.total_metric_calls


def test_an_untracked_run_log_dir_imports_from_its_steps_alone(tmp_path):
    log_dir = str(tmp_path / "plain")
    result = compile_sim(lm=sim.SimulatedLM(), p=1, n=1, max_metric_calls=60, log_dir=log_dir).results
    assert not os.path.exists(os.path.join(log_dir, "run.json"))
    store = f"sqlite:///{tmp_path}/store.db"
    [imported] = import_step_log(log_dir, tracking_uri=store)
    client = MlflowClient(store)
    run = client.get_run(imported.run_id)
    assert run.data.params["p"] == "1" and run.data.tags[CONFIG_TAG] == "1x1"
    assert sorted(history(client, run.info.run_id, "search/best_val")) == [s.step for s in result.steps]
    assert {a.path for a in client.list_artifacts(run.info.run_id, "plots")} == {
        "plots/val_vs_metric_calls.png", "plots/step_times.png"}


# ----------------------------------------------------------------------------- argument errors
def test_tracking_arguments_are_checked_before_any_lm_call(tmp_path):
    # The tracker checks its arguments when it is made, before any compile.
    with pytest.raises(ValueError, match="tags must map strings to strings"):
        MlflowTracker(tags={"n": 1})
    with pytest.raises(ValueError, match="experiment must be a non-empty string, got ''"):
        MlflowTracker(experiment="")
    with pytest.raises(ValueError, match="tracking_uri must be a non-empty string"):
        MlflowTracker(tracking_uri="  ")
    with pytest.raises(FileNotFoundError, match="not a dspy-pxn run directory"):
        import_step_log(str(tmp_path))
    store = f"sqlite:///{tmp_path}/s.db"
    with (
        sweep("s", tracking_uri=store, log_dir=str(tmp_path / "s")),
        pytest.raises(ValueError, match="enclosing sweep"),
    ):
        compile_sim(lm=sim.SimulatedLM(), max_metric_calls=50,
                    tracker=MlflowTracker(tracking_uri="sqlite:///elsewhere.db"))
