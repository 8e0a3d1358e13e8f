"""BatchedGEPA's former argument names: each still works for one release, with a DeprecationWarning naming its
replacement, shown at the caller's line (``dspy_pxn.deprecated``).

For each name: the warning, and that the run still does what the name did, seen in a real compile where there is
something to see (compared with its replacement's run where the two can be compared: the step loop on the simulated
LM is deterministic). A former name beside its new one is refused where the two would say different things. The
CLI's former ``--mlflow-uri`` still works too, with a notice on stderr.

The project's pytest settings turn this warning into an error anywhere else: here each use is under
``pytest.deprecated_call`` or ``pytest.warns``. MLflow runs go to a sqlite store in the test's tmp_path.
"""

from __future__ import annotations

import re
import warnings

import mlflow
import pytest
from mlflow import MlflowClient

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.cli import main as cli
from dspy_pxn.tracking import MlflowTracker, sweep
from tests.compiling import compile_sim
from tests.prices import PRICES, priced_models

# The step loop on the simulated LM: deterministic, so a former name and its replacement give the same run.
TINY = {"p": 2, "n": 1, "max_metric_calls": 60, "schedule": "steps", "selection": "all", "num_threads": 8}
MLFLOW_REPLACEMENT = "tracker=dspy_pxn.tracking.MlflowTracker("
SHORTHANDS = ("mlflow", "tracking_uri", "experiment", "run_name", "run_tags", "registered_model_name")


def deprecation(name: str, replacement: str = ""):
    """Expects BatchedGEPA(name=...)'s warning, naming ``replacement``."""
    return pytest.deprecated_call(match=rf"BatchedGEPA\({name}=\.\.\.\) is deprecated.*pass {re.escape(replacement)}")


def names_warned(caught) -> list[str]:
    """The former names BatchedGEPA's warnings are about, in order."""
    return [re.match(r"BatchedGEPA\((\w+)=\.\.\.\) is deprecated", str(w.message)).group(1) for w in caught
            if issubclass(w.category, DeprecationWarning) and str(w.message).startswith("BatchedGEPA(")]


def former(name: str, replacement: str, **kwargs) -> BatchedGEPA:
    """BatchedGEPA built with a former name (in ``kwargs``, which override ``TINY``): one warning, naming the
    replacement, shown at this file's line (the caller's, not dspy_pxn's)."""
    with deprecation(name, replacement) as caught:
        optimizer = BatchedGEPA(metric=sim.metric, **{**TINY, "reflection_lm": sim.SimulatedLM(), **kwargs})
    assert names_warned(caught) == [name]
    assert [w.filename for w in caught if str(w.message).startswith("BatchedGEPA(")] == [__file__]
    return optimizer


def compiled(optimizer: BatchedGEPA, **kwargs):
    """The optimizer's compile of the seed program on the simulated task: its detailed_results."""
    return compile_sim(optimizer=optimizer, lm=sim.SimulatedLM(), **kwargs).results


class Heard:
    """A gepa callback recording the engine's events by name."""

    def __init__(self):
        self.events: list[str] = []

    def __getattr__(self, name):
        if not name.startswith("on_") or name == "on_step_record":
            raise AttributeError(name)
        return lambda event: self.events.append(name)


# ----------------------------------------------------------------------------- callbacks, step_sinks
def test_callbacks_still_hear_gepas_events_as_gepa_kwargs_callbacks_do():
    heard = Heard()
    results = compiled(former("callbacks", "gepa_kwargs={'callbacks': [...]}", callbacks=[heard]))
    assert heard.events[0] == "on_optimization_start" and heard.events[-1] == "on_optimization_end"
    assert heard.events.count("on_iteration_start") == heard.events.count("on_iteration_end") >= len(results.steps) >= 1
    assert heard.events.count("on_candidate_accepted") == len(results.candidates) - 1 >= 1
    again = Heard()
    compile_sim(lm=sim.SimulatedLM(), gepa_kwargs={"callbacks": [again]}, **TINY)
    assert again.events == heard.events  # the same events, in the same order, as the new spelling's


def test_callbacks_beside_gepa_kwargs_callbacks_are_all_heard():
    first, second = Heard(), Heard()
    with deprecation("callbacks", "gepa_kwargs={'callbacks': [...]}"):
        optimizer = BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(), callbacks=[second],
                                gepa_kwargs={"callbacks": [first]}, **TINY)
    assert optimizer.settings.callbacks == (first, second)
    compiled(optimizer)
    assert first.events and first.events == second.events


def test_step_sinks_still_hear_every_step_record_of_a_compile():
    records = []
    optimizer = former("step_sinks", "a gepa callback with on_step_record(record), in gepa_kwargs={'callbacks': [...]}",
                       step_sinks=[records.append])
    results = compiled(optimizer)
    assert len(results.steps) >= 2 and records == list(results.steps)
    assert [record.step for record in records] == list(range(1, len(records) + 1))


# ----------------------------------------------------------------------------- display_progress_bar
def test_display_progress_bar_still_shows_gepas_progress_bar(capfd):
    optimizer = former("display_progress_bar", "gepa_kwargs={'display_progress_bar': True}", display_progress_bar=True)
    assert optimizer.settings.display_progress_bar is True
    compiled(optimizer)
    assert "GEPA Optimization" in capfd.readouterr().err  # gepa's own tqdm bar, which the step loop shows
    compile_sim(lm=sim.SimulatedLM(), **TINY)
    assert "GEPA Optimization" not in capfd.readouterr().err  # off unless asked for, as in gepa


def test_display_progress_bar_beside_gepa_kwargs_is_refused():
    with pytest.raises(ValueError, match="not both"), deprecation("display_progress_bar", "gepa_kwargs="):
        BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(), display_progress_bar=True,
                    gepa_kwargs={"display_progress_bar": False}, **TINY)


# ----------------------------------------------------------------------------- max_reflection_cost_usd
@pytest.fixture
def priced():
    with priced_models():
        yield


def test_max_reflection_cost_usd_still_caps_the_reflection_lm_alone(priced):
    cap = 0.02  # a few reflections' worth
    task = sim.SimulatedLM(model="openai/sim-priced-task", max_tokens=300)
    reflection = sim.SimulatedLM(model="openai/sim-priced-reflection", max_tokens=600)
    optimizer = former("max_reflection_cost_usd", "gepa_kwargs={'max_reflection_cost': ...} (gepa's own name for it)",
                       max_reflection_cost_usd=cap, reflection_lm=reflection, max_metric_calls=5000)
    assert optimizer.settings.max_reflection_cost_usd == cap
    results = compile_sim(optimizer=optimizer, splits=sim.make_splits(seed=0, train=30, val=5, test=1), lm=task).results

    def spent(lm) -> float:
        prompt, completion = PRICES[lm.model]
        return prompt * lm.stats()["tokens"]["prompt"] + completion * lm.stats()["tokens"]["completion"]

    assert results.stopped_by == "max_reflection_cost" and results.total_metric_calls < 5000
    assert 0 < spent(reflection) <= cap < spent(reflection) + spent(task)  # the reflection LM's dollars only
    assert len(results.candidates) >= 2


def test_max_reflection_cost_usd_beside_gepas_name_is_refused():
    with pytest.raises(ValueError, match="not both"), deprecation("max_reflection_cost_usd", "gepa_kwargs="):
        BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(), max_metric_calls=100,
                    max_reflection_cost_usd=1.0, gepa_kwargs={"max_reflection_cost": 2.5})


# ----------------------------------------------------------------------------- testset
def test_a_testset_given_to_the_constructor_is_still_scored_as_compiles_is():
    test = sim.make_splits(seed=1, test=10).test
    results = compiled(former("testset", "compile(..., testset=...)", testset=test))
    assert results.test_score is not None
    assert results.test_score == compile_sim(lm=sim.SimulatedLM(), testset=test, **TINY).results.test_score


def test_compiles_testset_is_the_one_scored_when_both_are_given():
    constructor, given = sim.make_splits(seed=1, test=10).test, sim.make_splits(seed=2, test=3).test
    results = compiled(former("testset", "compile(..., testset=...)", testset=constructor), testset=given)
    assert results.test_score == compile_sim(lm=sim.SimulatedLM(), testset=given, **TINY).results.test_score
    assert results.test_score != compile_sim(lm=sim.SimulatedLM(), testset=constructor, **TINY).results.test_score


# ----------------------------------------------------------------------------- the MLflow shorthands
def test_the_mlflow_shorthands_still_track_the_run_where_and_as_they_say(tmp_path):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    with pytest.warns(DeprecationWarning, match=re.escape(MLFLOW_REPLACEMENT)) as caught:
        optimizer = BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(), tracking_uri=store,
                                experiment="former-names", run_name="named the former way",
                                run_tags={"dataset": "sim-rules"}, registered_model_name="former-program", **TINY)
    assert sorted(names_warned(caught)) == sorted(SHORTHANDS[1:])  # one warning per name given
    assert optimizer.settings.tracker == MlflowTracker(
        tracking_uri=store, experiment="former-names", run_name="named the former way",
        tags={"dataset": "sim-rules"}, registered_model_name="former-program")
    results = compiled(optimizer)
    client = MlflowClient(store)
    run = client.get_run(results.mlflow_run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "named the former way"
    assert client.get_experiment(run.info.experiment_id).name == "former-names"
    assert run.data.params["dataset"] == "sim-rules" and run.data.params["p"] == "2"
    [version] = client.search_model_versions("name='former-program'")
    assert version.run_id == run.info.run_id


def test_mlflow_true_is_use_mlflows_tracker():
    optimizer = former("mlflow", MLFLOW_REPLACEMENT, mlflow=True)
    assert optimizer.settings.tracker == MlflowTracker()
    assert optimizer.settings.tracker == BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(),
                                                     use_mlflow=True).settings.tracker


def test_mlflow_false_still_leaves_a_run_untracked_even_inside_a_sweep(tmp_path):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    optimizer = former("mlflow", MLFLOW_REPLACEMENT, mlflow=False)
    assert optimizer.settings.tracker is False
    with sweep("untracked-inside", tracking_uri=store, log_dir=str(tmp_path / "sweep"), compare=False) as grid:
        results = compiled(optimizer)
    assert results.mlflow_run_id is None
    client = MlflowClient(store)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [r.info.run_id for r in runs] == [grid.run_id]  # the sweep's own run, and no child


@pytest.mark.parametrize(("arguments", "message"), [
    ({"mlflow": False, "tracking_uri": "http://127.0.0.1:5000"}, r"mlflow=False contradicts \['tracking_uri'\]"),
    ({"experiment": ""}, "experiment must be a non-empty string, got ''"),
    ({"run_tags": {"n": 1}}, r"tags must map strings to strings, got \{'n': 1\}"),
    ({"registered_model_name": "team/agent"}, "registered_model_name='team/agent': MLflow model names cannot contain"),
    ({"tracking_uri": "sqlite:///never.db", "tracker": MlflowTracker()}, "are two trackers: pass one of them"),
], ids=["mlflow=False-with-a-uri", "empty-experiment", "run_tags-not-strings", "model-name-with-a-slash",
        "shorthand-beside-tracker"])
def test_bad_shorthands_still_fail_when_the_optimizer_is_built(arguments, message):
    with pytest.raises(ValueError, match=message), pytest.deprecated_call(match=re.escape(MLFLOW_REPLACEMENT)):
        BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(), **TINY, **arguments)


def test_use_mlflow_and_the_new_names_are_not_deprecated(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(), use_mlflow=True, **TINY)
        BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(), **TINY,
                    tracker=MlflowTracker(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", experiment="e", run_name="r",
                                          tags={"dataset": "d"}, registered_model_name="m"),
                    gepa_kwargs={"callbacks": [Heard()], "display_progress_bar": True, "max_reflection_cost": 1.0})
        BatchedGEPA(metric=sim.metric, reflection_lm=sim.SimulatedLM(), tracker=False, **TINY)
    assert names_warned(caught) == []


# ----------------------------------------------------------------------------- the CLI's --mlflow-uri
def test_the_former_mlflow_uri_flag_still_chooses_the_store_and_says_what_to_type(tmp_path, capsys):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    try:
        assert cli(["optimize", "sim", "--p", "1", "--n", "1", "--task-latency", "0.001", "--train-size", "6",
                    "--val-size", "4", "--test-size", "4", "--budget", "20", "--workers", "4", "--mlflow-uri", store,
                    "--experiment", "former-flag", "--log-dir", str(tmp_path / "run")]) == 0
    finally:
        mlflow.set_tracking_uri(None)
    captured = capsys.readouterr()
    assert "--mlflow-uri is deprecated: use --tracking-uri" in captured.err
    run_id = captured.out.split("MLflow run ")[1].split()[0]
    client = MlflowClient(store)
    assert client.get_experiment(client.get_run(run_id).info.experiment_id).name == "former-flag"
