"""The optimized program as an MLflow model, its instructions in the Prompt Registry, the proposal and candidate
tables, and compiling under ``mlflow.dspy.autolog()``: against a real `mlflow server` and a loopback LM server."""

from __future__ import annotations

import json
import logging
import threading
from types import SimpleNamespace

import dspy
import mlflow
import pytest
from mlflow import MlflowClient

from dspy_pxn import testing as sim
from dspy_pxn.testing import LatencyServer
from dspy_pxn.testing.mlflow_server import MlflowServer, free_port
from dspy_pxn.tracking import MODEL_TAG, MlflowTracker, import_step_log, sweep
from dspy_pxn.tracking.lineage import MERGED, NO_PROPOSAL, VALIDATED
from dspy_pxn.tracking.model import MODEL_SOURCE_NAME, PROGRAM_TAG
from tests.budgets import smallest_step
from tests.compiling import compile_sim


@pytest.fixture(scope="module")
def lm_server():
    with LatencyServer(task_latency=0.005, reflection_latency=0.01) as running:
        yield running


@pytest.fixture(autouse=True)
def api_key_in_the_environment(monkeypatch):
    """The loaded model reads the provider's key from the environment, as litellm does (none is serialized)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-loopback")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")


@pytest.fixture
def global_mlflow_and_dspy_restored():
    """``mlflow.dspy.load_model`` configures dspy.settings globally, and loading needs MLflow's global URI."""
    settings = {key: dspy.settings.get(key) for key in ("lm", "adapter", "callbacks", "track_usage")}
    yield
    mlflow.set_tracking_uri(None)
    dspy.configure(**settings)


def lm(server: LatencyServer, **kwargs) -> dspy.LM:
    return dspy.LM("openai/sim-task", api_base=server.base_url, cache=False, num_retries=0, timeout=10, **kwargs)


def compile_tracked(lm_server: LatencyServer, **kwargs):
    """A compile on the loopback server's LMs (90 metric calls unless told); the program and its valset."""
    train, val, _ = sim.make_splits(seed=0, train=24, val=8, test=8)
    kwargs.setdefault("max_metric_calls", 90)
    program, _ = compile_sim(splits=(train, val), lm=lm(lm_server, temperature=0.0),
                             reflection_lm=lm(lm_server, temperature=1.0), **kwargs)
    return program, val


def tracked(mlflow_server, experiment: str, **kwargs) -> MlflowTracker:
    return MlflowTracker(tracking_uri=mlflow_server.uri, experiment=experiment, **kwargs)


def model_id_of(client: MlflowClient, run_id: str) -> str:
    return client.get_run(run_id).data.tags[MODEL_TAG].removeprefix("models:/")


def download_table(client: MlflowClient, run_id: str, name: str, tmp_path) -> list[dict]:
    path = client.download_artifacts(run_id, f"tables/{name}.json", str(tmp_path / f"{name}-{run_id}"))
    with open(path) as handle:
        table = json.load(handle)
    return [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]


# ----------------------------------------------------------------------------- the program as a model
def test_the_optimized_program_is_the_runs_model_and_answers_like_it(
    mlflow_server, lm_server, global_mlflow_and_dspy_restored
):
    program, val = compile_tracked(lm_server, p=2, n=2,
                                   tracker=tracked(mlflow_server, "as-model", registered_model_name="pxn-program"),
                                   testset=sim.make_splits(seed=1, test=8).test)
    results = program.detailed_results
    client = MlflowClient(mlflow_server.uri)
    run_id = results.mlflow_run_id
    model = client.get_logged_model(model_id_of(client, run_id))
    run = client.get_run(run_id)
    # Named after the run's program and setting, with the run's settings as its parameters.
    assert model.source_run_id == run_id and "READY" in str(model.status)
    assert model.name == "ChainOfThought-2x2-merge-async" and model.tags[PROGRAM_TAG] == "ChainOfThought"
    assert model.params == run.data.params and model.params["p"] == model.params["n"] == "2"
    assert [output.model_id for output in run.outputs.model_outputs] == [model.model_id]
    # The model's own metrics: the seed's and the optimized program's scores, nothing else of the run.
    assert {m.key: m.value for m in model.metrics} == pytest.approx({
        "val_score": results.val_aggregate_scores[results.best_idx],
        "seed_val_score": results.val_aggregate_scores[0], "test_score": results.test_score})
    [version] = client.search_model_versions("name='pxn-program'")
    assert version.source == f"models:/{model.model_id}" and version.run_id == run_id

    model_uri = f"models:/{model.model_id}"
    mlflow.set_tracking_uri(mlflow_server.uri)
    info = mlflow.models.get_model_info(model_uri)
    # The program's signature (its input fields; its predictor's output fields, what it returns), not the data's:
    # a valset example's labels are answer and rule.
    assert info.signature.inputs.input_names() == list(program.predict.signature.input_fields) == ["question"]
    assert info.signature.outputs.input_names() == list(program.predict.signature.output_fields) == [
        "reasoning", "answer"]
    assert info.saved_input_example_info
    pyfunc = mlflow.pyfunc.load_model(model_uri)  # answers with the LM it was logged with, no context needed
    loaded = mlflow.dspy.load_model(model_uri)
    for example in val[:4]:
        with dspy.context(lm=lm(lm_server, temperature=0.0)):
            expected = program(**example.inputs()).toDict()
            assert loaded(**example.inputs()).toDict() == expected
        assert pyfunc.predict(dict(example.inputs())) == expected
    assert [p.signature.instructions for _, p in loaded.named_predictors()] == [
        p.signature.instructions for _, p in program.named_predictors()]


def test_instructions_are_prompt_versions_and_a_rerun_adds_versions_not_prompts(mlflow_server, lm_server):
    client = MlflowClient(mlflow_server.uri)
    programs, run_ids = [], []
    for seed in (0, 1):
        tracker = MlflowTracker(tracking_uri=mlflow_server.uri, experiment="prompts", prompt_prefix="rules-agent")
        program, _ = compile_tracked(lm_server, p=2, n=1, seed=seed, tracker=tracker, max_metric_calls=70)
        programs.append(program)
        run_ids.append(program.detailed_results.mlflow_run_id)
    assert [p.name for p in client.search_prompts(filter_string="name LIKE 'rules-agent%'")] == ["rules-agent.predict"]
    instructions = [p.predict.signature.instructions for p in programs]
    versions = list(client.search_prompt_versions("rules-agent.predict"))
    assert sorted(v.template for v in versions) == sorted(set(instructions))  # an unchanged instruction adds none
    # Filed under the runs' experiment (its Prompts page lists it), not MLflow's current one (Default, "0").
    experiment_id = client.get_run(run_ids[0]).info.experiment_id
    assert client.get_prompt("rules-agent.predict").tags["_mlflow_experiment_ids"] == f",{experiment_id},"
    assert [p.name for p in client.search_prompts(filter_string=f"experiment_id = '{experiment_id}'")] == [
        "rules-agent.predict"]
    for program, run_id, text in zip(programs, run_ids, instructions, strict=True):
        linked = json.loads(client.get_logged_model(model_id_of(client, run_id)).tags["mlflow.linkedPrompts"])
        assert [entry["name"] for entry in linked] == ["rules-agent.predict"]
        assert json.loads(client.get_run(run_id).data.tags["mlflow.linkedPrompts"]) == linked  # the run's too
        prompt = client.get_prompt_version("rules-agent.predict", linked[0]["version"])
        assert prompt.template == text
        best = program.detailed_results.val_aggregate_scores[program.detailed_results.best_idx]
        if prompt.tags.get("dspy_pxn.run_id") == run_id:  # registered by this run (not reused from the first)
            assert float(prompt.tags["dspy_pxn.val_score"]) == pytest.approx(best)


def test_default_prompt_names_come_from_the_experiment_and_program(mlflow_server, lm_server):
    program, _ = compile_tracked(lm_server, p=1, n=1, tracker=tracked(mlflow_server, "named"), max_metric_calls=40)
    client = MlflowClient(mlflow_server.uri)
    linked = json.loads(client.get_logged_model(
        model_id_of(client, program.detailed_results.mlflow_run_id)).tags["mlflow.linkedPrompts"])
    assert [entry["name"] for entry in linked] == ["named.ChainOfThought.predict"]


def test_logging_to_the_runs_server_leaves_the_users_mlflow_uri_as_it_was(mlflow_server, lm_server, tmp_path,
                                                                            monkeypatch):
    from mlflow.tracking._tracking_service import utils as tracking_service

    mlflow.set_tracking_uri(None)
    users_store = f"sqlite:///{tmp_path}/users.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", users_store)
    compile_tracked(lm_server, p=1, n=1, max_metric_calls=40,
                    tracker=tracked(mlflow_server, "elsewhere", registered_model_name="elsewhere-program"))
    assert tracking_service._tracking_uri is None  # not pinned: a later MLFLOW_TRACKING_URI still counts
    assert mlflow.get_tracking_uri() == users_store
    later_store = f"sqlite:///{tmp_path}/later.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", later_store)
    assert mlflow.get_tracking_uri() == later_store
    assert MlflowClient(mlflow_server.uri).get_registered_model("elsewhere-program").latest_versions


# ----------------------------------------------------------------------------- tables
@pytest.mark.parametrize("schedule", ["steps", "async"])
def test_every_proposal_and_candidate_is_a_row_of_the_runs_tables(mlflow_server, lm_server, schedule, tmp_path):
    program, _ = compile_tracked(lm_server, p=3, n=2, schedule=schedule, selection="merge", max_metric_calls=160,
                                 tracker=tracked(mlflow_server, f"tables-{schedule}"))
    results = program.detailed_results
    client = MlflowClient(mlflow_server.uri)
    candidates = download_table(client, results.mlflow_run_id, "candidates", tmp_path)
    proposals = download_table(client, results.mlflow_run_id, "proposals", tmp_path)
    assert [int(row["candidate"]) for row in candidates] == list(range(len(results.candidates)))
    assert json.loads(candidates[0]["parents"]) == [] and all(json.loads(r["parents"]) for r in candidates[1:])
    assert [row["val_score"] for row in candidates] == pytest.approx(results.val_aggregate_scores)
    assert json.loads(candidates[results.best_idx]["instructions"])["predict"] == \
        program.predict.signature.instructions

    validated = [row for row in proposals if row["outcome"] == VALIDATED]
    assert sorted(int(row["candidate"]) for row in validated) == list(range(1, len(results.candidates)))
    for row in validated:
        assert row["val_score"] == pytest.approx(results.val_aggregate_scores[int(row["candidate"])])
    assert all(row["reason"] for row in proposals if row["outcome"] != VALIDATED)
    screened = [row for row in proposals if row["child_minibatch_score"] not in (None, "")]
    assert len(screened) == sum(step.proposals for step in results.steps)
    assert all(row["feedback"] and row["reflection_output"] for row in screened)
    ids = {row["proposal_id"] for row in proposals}
    merges = [row for row in proposals if json.loads(row["merged_from"])]
    assert merges, "a 3x2 merge run merges improving siblings at least once"
    for merge in merges:
        assert set(json.loads(merge["merged_from"])) <= ids and merge["outcome"] == VALIDATED
    assert {row["outcome"] for row in proposals} <= {VALIDATED, MERGED, NO_PROPOSAL, "not_improved",
                                                     "improved_not_selected", "duplicate"}


# ----------------------------------------------------------------------------- autolog
def test_under_autolog_a_compile_is_one_run_of_ours_without_rollout_traces(mlflow_server, lm_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "autolog")  # the user's experiment, as MLflow's own runs take it
    mlflow.set_tracking_uri(mlflow_server.uri)
    experiment = MlflowClient(mlflow_server.uri).get_experiment(
        MlflowClient(mlflow_server.uri).create_experiment("autolog"))
    mlflow.dspy.autolog(log_compiles=True, silent=True)
    try:
        program, val = compile_tracked(lm_server, p=2, n=1, max_metric_calls=60)  # no tracking argument at all
        with mlflow.start_run(run_name="outer") as outer:
            nested, _ = compile_tracked(lm_server, p=1, n=1, max_metric_calls=40)
        mlflow.flush_trace_async_logging()
        assert mlflow.search_traces(locations=[experiment.experiment_id]).empty  # thousands of rollouts: none traced
        with dspy.context(lm=lm(lm_server, temperature=0.0)):
            program(**val[0].inputs())  # outside a compile, autolog traces as the user asked
        mlflow.flush_trace_async_logging()
        assert len(mlflow.search_traces(locations=[experiment.experiment_id])) == 1
    finally:
        mlflow.dspy.autolog(disable=True)
        dspy.configure(track_usage=False)
        mlflow.set_tracking_uri(None)
    client = MlflowClient(mlflow_server.uri)
    runs = {r.info.run_id: r for r in client.search_runs([experiment.experiment_id])}
    ours = program.detailed_results.mlflow_run_id
    assert set(runs) == {ours, outer.info.run_id, nested.detailed_results.mlflow_run_id}
    assert runs[nested.detailed_results.mlflow_run_id].data.tags["mlflow.parentRunId"] == outer.info.run_id
    assert "mlflow.parentRunId" not in runs[ours].data.tags and MODEL_TAG in runs[ours].data.tags


# ----------------------------------------------------------------------------- failures
class Unpicklable(dspy.Module):
    """A program holding a lock: it runs, but cannot be serialized as a model."""

    def __init__(self):
        super().__init__()
        self.predict = dspy.ChainOfThought(sim.seed_program().predict.signature)
        self.lock = threading.Lock()

    def forward(self, **kwargs):
        return self.predict(**kwargs)


def test_a_program_that_cannot_be_serialized_is_one_warning_and_the_run_finishes(mlflow_server, lm_server, caplog):
    caplog.set_level(logging.WARNING, logger="dspy_pxn.tracking")
    program, _ = compile_sim(Unpicklable(), lm=lm(lm_server, temperature=0.0),
                             reflection_lm=lm(lm_server, temperature=1.0), p=2, n=1, max_metric_calls=60, tracker=tracked(mlflow_server, "unserializable"))
    run = MlflowClient(mlflow_server.uri).get_run(program.detailed_results.mlflow_run_id)
    assert run.info.status == "FINISHED" and MODEL_TAG not in run.data.tags
    assert "search/best_val" in run.data.metrics and "totals/metric_calls" in run.data.metrics
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("dspy_pxn")]
    assert len(warnings) == 1 and "cannot be serialized" in warnings[0] and "mlflow-import" in warnings[0]


def test_a_registry_that_is_down_at_the_end_loses_no_model_the_import_logs_it(
    tmp_path, lm_server, caplog, global_mlflow_and_dspy_restored
):
    caplog.set_level(logging.WARNING, logger="dspy_pxn.tracking")
    tracking = MlflowServer(str(tmp_path), free_port()).start()
    log_dir = str(tmp_path / "run")
    try:
        def stop_the_server_when_the_search_ends(record):
            if record.budget - record.metric_calls_total < smallest_step(record.minibatch_size, record.val_size):
                tracking.kill()  # no room for another step: the end is near

        program, val = compile_tracked(lm_server, p=2, n=1, max_metric_calls=60, log_dir=log_dir,
                                       tracker=MlflowTracker(tracking_uri=tracking.uri, experiment="down"),
                                       gepa_kwargs={"callbacks": [
                                           SimpleNamespace(on_step_record=stop_the_server_when_the_search_ends)]})
        assert tracking.proc is None, "the server was stopped before the run ended"
        results = program.detailed_results  # the search's result is returned regardless: its best candidate
        assert len(results.candidates) >= 2, "the search accepted a candidate, so the best is a real choice"
        assert results.val_aggregate_scores[results.best_idx] == max(results.val_aggregate_scores)
        assert program.predict.signature.instructions == \
            results.candidates[results.best_idx].predict.signature.instructions
        assert (tmp_path / "run" / MODEL_SOURCE_NAME).exists()
        tracking.start()
        client = MlflowClient(tracking.uri)
        run_id = program.detailed_results.mlflow_run_id
        assert MODEL_TAG not in client.get_run(run_id).data.tags
        import_step_log(log_dir)
        model_uri = client.get_run(run_id).data.tags[MODEL_TAG]
        mlflow.set_tracking_uri(tracking.uri)
        loaded = mlflow.dspy.load_model(model_uri)
        with dspy.context(lm=lm(lm_server, temperature=0.0)):
            assert loaded(**val[0].inputs()).toDict() == program(**val[0].inputs()).toDict()
        import_step_log(log_dir)  # again, with that model loaded (MLflow's active model): nothing is logged twice,
        assert len(client.get_run(run_id).outputs.model_outputs) == 1  # and the run's metrics are not the model's
        model = client.get_logged_model(model_uri.removeprefix("models:/"))
        assert {m.key for m in model.metrics} == {"val_score", "seed_val_score"}
    finally:
        tracking.kill()
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("dspy_pxn")]) == 1


# ----------------------------------------------------------------------------- what is logged where
def test_each_step_field_goes_to_its_section_and_constants_are_not_metrics():
    from dspy_pxn.tracking.mlflow_io import best_val_points, step_metrics
    from tests.test_records import record

    reflective = record(started_at=100.0, wall_s=2.0)
    metrics = step_metrics(reflective, run_started_at=99.0, failing=set())
    assert {key.split("/")[0] for key in metrics} == {"search", "cost", "time", "pool"}
    assert metrics["search/best_val"] == reflective.best_val and metrics["time/elapsed_s"] == pytest.approx(3.0)
    assert not {"search/p", "search/n", "p", "n", "search/crossover"} & set(metrics)  # constants are params
    assert step_metrics(record(kind="crossover"), 0.0, set())["search/crossover"] == 1.0
    # A failure series starts at the first step where something of its kind failed, then goes on at every step.
    failures = {"search/reflection_failures", "pool/rollout_failures", "cost/lm_retries", "cost/lm_failures"}
    failing: set[str] = set()
    steps = [record(rollout_failures=0, lm_retries=0), record(rollout_failures=2, lm_retries=0),
             record(rollout_failures=0, lm_retries=3)]
    logged = [failures & set(step_metrics(step, 0.0, failing)) for step in steps]
    assert logged == [set(), {"pool/rollout_failures"}, {"pool/rollout_failures", "cost/lm_retries"}]
    assert step_metrics(steps[2], 0.0, set(failing))["pool/rollout_failures"] == 0.0
    assert best_val_points(0.5, metric_calls=120, elapsed_s=2.5) == [
        ("best_val/by_metric_calls", 0.5, 120), ("best_val/by_wall_clock_ms", 0.5, 2500)]


def test_a_table_reads_back_with_numbers_as_numbers(tmp_path):
    from dspy_pxn.tracking.lineage import ProposalRecord
    from dspy_pxn.tracking.runlog import read_table, write_table

    rows = [ProposalRecord(step=1, task=0, parent=0, minibatch_ids=[3, 4], parent_minibatch_score=0.5,
                           child_minibatch_score=None, outcome=VALIDATED, candidate=2, proposal_id="1-0",
                           merged_from=["1-1"])]
    write_table(str(tmp_path / "t.csv"), rows)
    table = read_table(str(tmp_path / "t.csv"))
    assert table["candidate"] == [2] and table["parent_minibatch_score"] == [0.5]
    assert table["child_minibatch_score"] == [None] and table["proposal_id"] == ["1-0"]
    assert json.loads(table["merged_from"][0]) == ["1-1"] and table["outcome"] == [VALIDATED]


@pytest.mark.parametrize("name", ["prompt_prefix", "registered_model_name"])
def test_a_name_that_is_not_a_string_fails_naming_the_argument(name):
    with pytest.raises(ValueError, match=name):
        MlflowTracker(**{name: "  "})
    with pytest.raises(ValueError, match="registered_model_name must be a non-empty string, got 7"):
        MlflowTracker(registered_model_name=7)


def test_a_registry_that_refuses_the_name_is_one_warning_the_model_is_logged(mlflow_server, lm_server, caplog):
    caplog.set_level(logging.WARNING, logger="dspy_pxn.tracking")
    MlflowClient(mlflow_server.uri).register_prompt("taken-by-a-prompt", "a prompt owns this name")
    program, _ = compile_tracked(lm_server, p=2, n=1, max_metric_calls=60,
                                 tracker=tracked(mlflow_server, "refused", registered_model_name="taken-by-a-prompt"))
    run = MlflowClient(mlflow_server.uri).get_run(program.detailed_results.mlflow_run_id)
    assert run.info.status == "FINISHED" and run.data.tags[MODEL_TAG].startswith("models:/")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("dspy_pxn")]
    assert len(warnings) == 1 and "mlflow.register_model(" in warnings[0] and "taken-by-a-prompt" in warnings[0]


def test_a_model_name_mlflow_cannot_hold_fails_before_the_search(tmp_path):
    with pytest.raises(ValueError, match="cannot contain '/' or ':'"):
        MlflowTracker(registered_model_name="team/agent")
    with pytest.raises(ValueError, match="registered_model_name='team:agent'"):  # a sweep, before its parent run
        with sweep("grid", tracking_uri=f"sqlite:///{tmp_path}/never.db", registered_model_name="team:agent"):
            pass
    assert not (tmp_path / "never.db").exists()
