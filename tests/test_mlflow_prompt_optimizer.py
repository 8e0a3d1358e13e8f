"""BatchedGepaPromptOptimizer behind ``mlflow.genai.optimize_prompts``, against real MLflow: a sqlite store and
registry, MLflow's own eval_fn and scorers, a predict_fn that formats the registered prompt and answers with
the simulated model in process, and the simulated model reflecting (``dspy_pxn.testing``)."""

from __future__ import annotations

import json
import logging
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dspy
import pytest

mlflow = pytest.importorskip("mlflow")

from mlflow.genai.optimize.optimize import _build_eval_fn
from mlflow.genai.optimize.util import create_metric_from_scorers
from mlflow.genai.scorers import scorer
from mlflow.genai.utils.trace_utils import convert_predict_fn

from dspy_pxn import checks
from dspy_pxn import testing as sim
from dspy_pxn.pools import ThreadWorkerPool
from dspy_pxn.targets.mlflow_prompts.adapter import PromptAdapter, PromptRollouts
from dspy_pxn.targets.mlflow_prompts.evaluation import ConcurrentEvaluation
from dspy_pxn.targets.mlflow_prompts.optimizer import rows_in_flight
from dspy_pxn.testing.mlflow_state import mlflow_state_restored
from dspy_pxn.tracking import BatchedGepaPromptOptimizer

SIGNATURE = dspy.Signature("question -> answer")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{path}/m.db"
    with mlflow_state_restored():
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
        mlflow.set_experiment("prompt-optimizer")
        yield uri


rule_match = sim.mlflow_scorer()


@scorer(name="short")
def short(outputs: Any) -> float:
    return 1.0 if len(str(outputs)) < 6 else 0.0


class Task:
    """A registered seed prompt, train rows, and a predict_fn (counted, its concurrency measured) that formats
    the prompt in its own thread and answers with the simulated model."""

    def __init__(self, name: str, rows: int = 12, seed: int = 0, delay_s: float = 0.0):
        train, _, _ = sim.make_splits(seed=seed, train=rows, val=1, test=1)
        self.rows = [{"inputs": {"question": e.question}, "outputs": e.answer} for e in train]
        self.prompt = mlflow.genai.register_prompt(name=name, template=sim.seed_instruction())
        loaded = mlflow.genai.load_prompt(self.prompt.uri)
        self.lm, self.delay_s = sim.SimulatedLM(), delay_s
        self.calls, self.in_flight, self.peak = 0, 0, 0
        self._lock = threading.Lock()

        def predict_fn(question: str) -> str:
            with self._lock:
                self.calls += 1
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
            try:
                instructions = loaded.format()
                time.sleep(self.delay_s)
                with dspy.context(lm=self.lm):
                    return dspy.Predict(SIGNATURE.with_instructions(instructions))(question=question).answer
            finally:
                with self._lock:
                    self.in_flight -= 1

        self.predict_fn = predict_fn

    def eval_fn(self, scorers: list[Any]) -> Any:
        """MLflow's own eval_fn, as optimize_prompts builds it."""
        predict = convert_predict_fn(predict_fn=self.predict_fn, sample_input=self.rows[0]["inputs"])
        return _build_eval_fn(predict, create_metric_from_scorers(scorers))

    def optimize(self, optimizer: Any, scorers: list[Any] | None = None) -> Any:
        with mlflow.start_run() as run:
            result = mlflow.genai.optimize_prompts(predict_fn=self.predict_fn, train_data=self.rows,
                                                   prompt_uris=[self.prompt.uri], scorers=scorers or [rule_match],
                                                   optimizer=optimizer)
        result.run_id = run.info.run_id
        return result


def optimizer(budget: int, **kwargs: Any) -> BatchedGepaPromptOptimizer:
    return BatchedGepaPromptOptimizer(reflection_model=sim.SimulatedLM(), max_metric_calls=budget, **kwargs)


def serial_score(task: Task, template: str, scorers: list[Any]) -> tuple[float, dict[str, float]]:
    """The template re-evaluated by MLflow's own eval_fn, alone: the mean score and per-scorer means."""
    records = task.eval_fn(scorers)({task.prompt.name: template}, task.rows)
    per = {name: statistics.mean(r.individual_scores[name] for r in records) for name in records[0].individual_scores}
    return statistics.mean(r.score for r in records), per


def test_only_the_optimizer_changes_and_the_best_is_what_a_serial_evaluation_gives(store: str) -> None:
    task = Task("only-the-class", rows=12, delay_s=0.01)
    ours = optimizer(150, p=4, num_threads=8)
    result = task.optimize(ours, scorers=[rule_match, short])
    calls = task.calls

    (version,) = result.optimized_prompts
    assert version.name == task.prompt.name and version.version == 2  # MLflow registered it, as for its own
    assert result.optimizer_name == "BatchedGepaPromptOptimizer"
    assert result.final_eval_score > result.initial_eval_score
    final, per_scorer = serial_score(task, version.template, [rule_match, short])
    assert result.final_eval_score == pytest.approx(final)
    assert result.final_eval_score_per_scorer == pytest.approx(per_scorer)
    initial, initial_per = serial_score(task, sim.seed_instruction(), [rule_match, short])
    assert result.initial_eval_score == pytest.approx(initial)
    assert result.initial_eval_score_per_scorer == pytest.approx(initial_per)
    # Exact budget: every row is one predict_fn call (MLflow's own pre-flight check is one more, before optimize).
    assert calls - 1 == ours.last_run["metric_calls"] <= 150
    assert ours.last_run["p"] == 4 and ours.last_run["schedule"] == "async"
    assert task.peak > 1  # rows of different candidates ran at once


def test_candidates_and_steps_are_logged_as_mlflows_gepa_logs_them(store: str) -> None:
    task = Task("logged", rows=8)
    ours = optimizer(60, p=2)
    result = task.optimize(ours)
    client = mlflow.MlflowClient()
    listed = {a.path for a in client.list_artifacts(result.run_id, "prompt_candidates")}
    assert "prompt_candidates/iteration_0" in listed
    files = {a.path for a in client.list_artifacts(result.run_id, "prompt_candidates/iteration_0")}
    assert {f"prompt_candidates/iteration_0/{f}" for f in ("eval_results.json", "scores.json", "logged.txt")} <= files
    seed_dir = client.download_artifacts(result.run_id, "prompt_candidates/iteration_0")
    assert Path(seed_dir, "logged.txt").read_text() == sim.seed_instruction()
    scores = json.loads(Path(seed_dir, "scores.json").read_text())
    assert scores["aggregate"] == pytest.approx(result.initial_eval_score)
    history = client.get_metric_history(result.run_id, "eval_score")
    assert len(history) == len(listed) >= 2  # one per validated candidate, step k = iteration k
    assert sorted(m.step for m in history) == list(range(len(history)))
    assert max(m.value for m in history) == pytest.approx(result.final_eval_score)
    metrics = client.get_run(result.run_id).data.metrics
    assert any(key.startswith("search/") for key in metrics)  # the engine's step records


def test_rows_of_many_candidates_at_once_each_see_their_own_template(store: str) -> None:
    """The race: 8 candidates × 12 rows as one flat set of pool tasks on 8 threads; every row's output is its
    own candidate's template (predict_fn here returns the formatted prompt)."""
    name = "race"
    prompt = mlflow.genai.register_prompt(name=name, template="seed {{question}}")
    loaded = mlflow.genai.load_prompt(prompt.uri)

    def predict(question: str) -> str:
        text = loaded.format(question=question)
        time.sleep(0.005)
        return text

    rows = [{"inputs": {"question": f"q{i}"}, "outputs": "x"} for i in range(12)]
    evaluation = ConcurrentEvaluation(convert_predict_fn(predict_fn=predict, sample_input=rows[0]["inputs"]),
                                      create_metric_from_scorers([short]))
    candidates = [{name: f"candidate {k} {{{{question}}}}"} for k in range(8)]
    with evaluation.installed(), ThreadWorkerPool(8) as pool:
        adapter = PromptAdapter(PromptRollouts(evaluation, 0.0), val_size=len(rows), failure_score=0.0, pool=pool)
        batches = adapter.batch_evaluate([(c, rows) for c in candidates], capture_traces=True, phase="screening")
    wrong = sum(record.outputs != c[name].replace("{{question}}", record.inputs["question"])
                for c, batch in zip(candidates, batches, strict=True) for _, record in batch.trajectories)
    assert wrong == 0
    assert all(len(batch.trajectories) == len(rows) for batch in batches)


def test_an_mlflow_whose_internals_differ_falls_back_to_its_eval_fn_one_candidate_at_a_time(store: str, caplog) -> None:
    """An eval_fn the self-test cannot read (here: a wrapper without functools.wraps, as another MLflow's may be)
    is called as MLflow's optimizer calls it, never two at once; the run still finds the better prompt."""
    task = Task("fallback", rows=8)
    ours = optimizer(60, p=4)
    at_once, most = [0], [0]
    lock = threading.Lock()
    real = ours.optimize

    def optimize(eval_fn: Any, *rest: Any) -> Any:
        def opaque(candidate: dict[str, str], rows: list[dict[str, Any]]) -> Any:
            with lock:
                at_once[0] += 1
                most[0] = max(most[0], at_once[0])
            try:
                return eval_fn(candidate, rows)
            finally:
                with lock:
                    at_once[0] -= 1

        return real(opaque, *rest)

    ours.optimize = optimize
    with caplog.at_level(logging.WARNING):
        result = task.optimize(ours)
    assert f"MLflow {mlflow.__version__}" in caplog.text and "one candidate at a time" in caplog.text
    assert most[0] == 1
    assert result.final_eval_score >= result.initial_eval_score
    assert ours.last_run["metric_calls"] <= 60
    final, _ = serial_score(task, result.optimized_prompts[0].template, [rule_match])
    assert result.final_eval_score == pytest.approx(final)


@pytest.mark.parametrize("budget", [20, 47, 90])
def test_never_over_budget_where_mlflows_gepa_overshoots(store: str, budget: int) -> None:
    task = Task(f"budget-{budget}", rows=6)
    before = task.calls
    ours = optimizer(budget, p=3, num_threads=6)
    task.optimize(ours)
    assert task.calls - before - 1 <= budget  # 1: MLflow's pre-flight check
    assert ours.last_run["metric_calls"] == task.calls - before - 1


@pytest.mark.parametrize(("budget", "kwargs", "width"), [
    (300, {}, 6), (150, {}, 4), (150, {"n": 2}, 4), (150, {"p": "auto"}, 3), (90, {}, 2)])
def test_by_default_one_pipeline_runs_per_row_in_flight(store: str, budget: int, kwargs: dict[str, Any],
                                                          width: int) -> None:
    """P·N fills the 6 rows in flight, within what leaves the budget five validation windows: at B = 150 that is
    (150 / 5 − |val| 6) / 2m = 4, at B = 90 2. ``p="auto"`` is BatchedGEPA's six-window rule: (150 / 6 − 6) // 6 = 3."""
    task = Task(f"width-{budget}-{'-'.join(map(str, kwargs.values())) or 'default'}", rows=6)
    ours = optimizer(budget, num_threads=6, **kwargs)
    task.optimize(ours)
    assert ours.last_run["p"] * ours.last_run["n"] == width


@pytest.mark.parametrize(("gepa_kwargs", "minibatch"), [({}, 3), ({"reflection_minibatch_size": 5}, 5)])
def test_proposals_are_screened_on_gepa_optimizes_minibatch_unless_given(store: str, gepa_kwargs: dict[str, Any],
                                                                         minibatch: int) -> None:
    """gepa.optimize's 3 rows, as MLflow's optimizer screens, not BatchedGEPA's quarter of |val| (which at MLflow's
    budgets leaves too few validations): here 24 rows, where a quarter would be 6."""
    task = Task(f"minibatch-{minibatch}", rows=24)
    ours = optimizer(300, num_threads=6, gepa_kwargs=gepa_kwargs)
    task.optimize(ours)
    assert ours.last_run["minibatch"] == minibatch
    assert ours.last_run["p"] > 1  # proposals side by side, where BatchedGEPA's default would screen on 6


def test_bad_arguments_name_themselves() -> None:
    with pytest.raises(checks.ArgumentError, match="reflection_model"):
        BatchedGepaPromptOptimizer(reflection_model="gpt-5-mini")
    with pytest.raises(ValueError, match="max_metric_calls"):
        BatchedGepaPromptOptimizer(reflection_model=sim.SimulatedLM(), max_metric_calls=0)
    with pytest.raises(ValueError, match="num_threads"):
        BatchedGepaPromptOptimizer(reflection_model=sim.SimulatedLM(), num_threads=-2)
    with pytest.raises(ValueError, match="p"):
        BatchedGepaPromptOptimizer(reflection_model=sim.SimulatedLM(), p=0)


def test_traced_rows_stay_within_the_sql_stores_connections(store: str, monkeypatch, caplog) -> None:
    monkeypatch.delenv("MLFLOW_SQLALCHEMYSTORE_POOL_SIZE", raising=False)
    with caplog.at_level(logging.WARNING):
        assert rows_in_flight(40) == 15
    assert "MLFLOW_SQLALCHEMYSTORE_POOL_SIZE" in caplog.text
    monkeypatch.setenv("MLFLOW_SQLALCHEMYSTORE_POOL_SIZE", "40")
    assert rows_in_flight(40) == 40
    assert rows_in_flight(8) == 8


def test_a_broken_predict_fn_stops_the_run_naming_it(store: str) -> None:
    """predict_fn raising on every row is a broken predict_fn, not a prompt to optimize: the run stops after the
    seed's validation instead of returning the seed as its best."""
    task = Task("broken", rows=12)
    first = task.rows[0]["inputs"]["question"]  # MLflow calls predict_fn on the first row before optimizing

    def broken(question: str) -> str:
        if question == first:
            return "0"
        raise ConnectionError("no route to the model")

    with pytest.raises(RuntimeError, match="predict_fn raised on 11 of the 12 training rows"), mlflow.start_run():
        mlflow.genai.optimize_prompts(predict_fn=broken, train_data=task.rows, prompt_uris=[task.prompt.uri],
                                      scorers=[rule_match], optimizer=optimizer(40))


def test_a_prompt_predict_fn_never_reads_is_reported_once(store: str, caplog) -> None:
    task = Task("read", rows=6)
    other = mlflow.genai.register_prompt(name="never-read", template="unused {{x}}")
    with caplog.at_level(logging.WARNING), mlflow.start_run():
        mlflow.genai.optimize_prompts(predict_fn=task.predict_fn, train_data=task.rows,
                                      prompt_uris=[task.prompt.uri, other.uri], scorers=[rule_match],
                                      optimizer=optimizer(30))
    ours = [r for r in caplog.records if "not used during evaluation" in r.getMessage()
            and r.name.startswith("dspy_pxn")]
    assert len(ours) == 1 and "['never-read']" in ours[0].getMessage()


@pytest.mark.parametrize("engine", [None, "litellm"], ids=["dspy-default-engine", "litellm"])
def test_the_reflection_model_over_http_on_either_dspy_engine(store: str, engine: str | None) -> None:
    """reflection_model given as a dspy.LM aimed at an OpenAI-compatible server: reflections go over HTTP on DSPy's
    default engine and on litellm alike (the server saw them), within the budget. (Whether 40 calls on 6 rows find
    a better prompt is the search's luck, not what this checks.)"""
    task = Task(f"engine-{engine}", rows=6)
    with sim.LatencyServer(task_latency=0.0, reflection_latency=0.0) as server:
        lm = server.lm("reflection", **({"engine": engine} if engine else {}))
        ours = BatchedGepaPromptOptimizer(reflection_model=lm, max_metric_calls=40, p=2)
        result = task.optimize(ours)
        reflections = server.stats()["calls"]["reflection"]
    assert reflections >= 1
    assert result.final_eval_score >= result.initial_eval_score
    assert ours.last_run["metric_calls"] <= 40
