"""ConcurrentEvaluation against real MLflow: a sqlite store, prompts in its registry, MLflow's own eval_fn
(``_build_eval_fn``) and scorers, a predict_fn that formats the registered prompt (no LM)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

mlflow = pytest.importorskip("mlflow")

from mlflow.entities.model_registry import PromptVersion
from mlflow.genai.optimize.optimize import _build_eval_fn
from mlflow.genai.optimize.util import create_metric_from_scorers
from mlflow.genai.scorers import scorer
from mlflow.genai.utils.trace_utils import convert_predict_fn

from dspy_pxn.targets.mlflow_prompts import (
    ConcurrentEvaluation,
    mlflow_internals,
    self_test,
    serial_fallback_warning,
)
from dspy_pxn.testing.mlflow_state import mlflow_state_restored

ORIGINAL = PromptVersion.__dict__["template"]
SEED = "seed: answer {{question}}"
ROWS = [{"inputs": {"question": f"q{i}"}, "outputs": f"seed: answer q{i}"} for i in range(24)]


@scorer
def exact(outputs: str, expectations: dict[str, Any]) -> bool:
    return outputs == expectations["expected_response"]


@scorer
def brevity(outputs: str) -> float:
    return 1.0 / len(outputs)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One sqlite tracking + registry store for the module (its migrations take seconds), traces kept in it."""
    path = tmp_path_factory.mktemp("mlflow")
    with mlflow_state_restored():
        mlflow.set_tracking_uri(f"sqlite:///{path}/m.db")
        mlflow.set_registry_uri(f"sqlite:///{path}/m.db")
        mlflow.set_experiment("prompt-evaluation")
        yield


@pytest.fixture(scope="module")
def qa(store: None) -> dict[str, Any]:
    """A registered text prompt, a predict_fn formatting it (slow enough for rows to overlap), the metric,
    and MLflow's own eval_fn built from them as optimize_prompts builds it."""
    prompt = mlflow.genai.register_prompt(name="qa", template=SEED)
    loaded = mlflow.genai.load_prompt(prompt.uri)

    def predict(question: str) -> str:
        text = loaded.format(question=question)
        time.sleep(0.02)
        return text

    predict_fn = convert_predict_fn(predict_fn=predict, sample_input=ROWS[0]["inputs"])
    metric_fn = create_metric_from_scorers([exact, brevity])
    return {"name": prompt.name, "eval_fn": _build_eval_fn(predict_fn, metric_fn)}


def candidates(n: int) -> list[str]:
    return [f"candidate {k}: answer {{{{question}}}}" for k in range(n)]


def wrong_rows(template: str, records: list[Any]) -> int:
    """Rows whose output is not ``template`` formatted with the row's question."""
    return sum(r.outputs != template.replace("{{question}}", r.inputs["question"]) for r in records)


def at_once(calls: list[Callable[[], Any]]) -> tuple[list[Any], list[BaseException]]:
    """Run the calls in threads released together; their results (None for a failure) and failures."""
    barrier, results, errors = threading.Barrier(len(calls)), [None] * len(calls), []

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = calls[i]()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, errors


def test_eight_candidates_at_once_each_row_runs_its_own_candidate(qa: dict[str, Any]) -> None:
    evaluation = ConcurrentEvaluation.from_eval_fn(qa["eval_fn"], max_workers=8)
    templates = candidates(8)
    with evaluation.installed():
        start = time.perf_counter()
        results, errors = at_once([lambda t=t: evaluation.evaluate({qa["name"]: t}, ROWS) for t in templates])
        elapsed = time.perf_counter() - start
    assert not errors
    assert [wrong_rows(t, r) for t, r in zip(templates, results, strict=True)] == [0] * 8
    assert all(len(r) == 24 and r[0].trace is not None for r in results)  # traced into the sqlite store
    print(f"\n8 candidates x 24 traced rows in {elapsed:.2f}s ({8 * 24 / elapsed:.0f} rows/s)")


def test_mlflows_own_eval_fn_mixes_candidates_when_called_at_once(
    qa: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The problem ConcurrentEvaluation solves, shown on the installed MLflow (skipped if it never mixes).
    4 row workers per call: 3 calls x 10 (the default) traced rows at once exhaust the sqlite store's
    connection pool (5 + 10 overflow) and stall 30 s."""
    monkeypatch.setenv("MLFLOW_GENAI_EVAL_MAX_WORKERS", "4")
    templates, wrong, errors = candidates(3), 0, []
    try:
        for _ in range(3):
            calls = [lambda t=t: qa["eval_fn"]({qa["name"]: t}, ROWS[:8]) for t in templates]
            results, failed = at_once(calls)
            errors += failed
            wrong += sum(wrong_rows(t, r) for t, r in zip(templates, results, strict=True) if r is not None)
            if wrong:
                break
    finally:  # concurrent gorilla reverts can leave a candidate's patch on the class
        PromptVersion.template = ORIGINAL
        for leftover in ("_gorilla_original_template", "_gorilla_active_patch_template"):
            if leftover in PromptVersion.__dict__:
                delattr(PromptVersion, leftover)
    if not wrong:
        pytest.skip(f"MLflow {mlflow.__version__}'s eval_fn did not mix candidates in 3 attempts ({errors=})")
    assert wrong > 0
    print(f"\nMLflow's eval_fn, 3 calls at once: {wrong} of {3 * 8} rows ran another candidate's template")


def test_one_candidate_serially_matches_mlflows_eval_fn(qa: dict[str, Any]) -> None:
    candidate = {qa["name"]: "Q: {{question}}"}
    rows = ROWS[:6] + [{"inputs": {"question": "q0"}, "expectations": {"expected_response": "Q: q0"}}]
    theirs = qa["eval_fn"](candidate, rows)
    with ConcurrentEvaluation.from_eval_fn(qa["eval_fn"]).installed() as evaluation:
        ours = evaluation.evaluate(candidate, rows)

    def fields(r: Any) -> tuple[Any, ...]:
        return r.inputs, r.outputs, r.expectations, r.score, r.rationales, r.individual_scores, r.trace is None

    assert [fields(r) for r in ours] == [fields(r) for r in theirs]
    assert ours[-1].individual_scores["exact"] == 1.0 and ours[0].individual_scores["exact"] == 0.0


def test_predict_fn_failures_and_no_metric_are_handled_as_mlflow_does(store: None) -> None:
    def predict(question: str) -> str:
        raise ValueError("boom")

    eval_fn = _build_eval_fn(lambda inputs: predict(**inputs), None)
    with ConcurrentEvaluation.from_eval_fn(eval_fn).installed() as evaluation:
        (ours,) = evaluation.evaluate({}, ROWS[:1])
    (theirs,) = eval_fn({}, ROWS[:1])
    assert ours.outputs == theirs.outputs == "Failed to invoke the predict_fn with {'question': 'q0'}: boom"
    assert ours.score is theirs.score is None and ours.individual_scores == theirs.individual_scores == {}


def test_unused_prompts_are_reported_and_warned_about(qa: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    evaluation = ConcurrentEvaluation.from_eval_fn(qa["eval_fn"])
    with evaluation.installed(), caplog.at_level(logging.WARNING):
        _, used = evaluation.evaluate_with_usage({qa["name"]: SEED, "elsewhere": "x"}, ROWS[:2])
    assert used == {qa["name"]}
    assert "['elsewhere']" in caplog.text and "not used during evaluation" in caplog.text


@pytest.mark.skipif(not hasattr(__import__("mlflow.genai.optimize.optimize", fromlist=["x"]), "_deserialize_chat_template"),
                    reason="this MLflow optimizes text prompts only (its eval_fn cannot run a chat prompt)")
def test_chat_prompts_keep_their_list_of_messages_shape(store: None) -> None:
    chat = mlflow.genai.register_prompt(name="chat", template=[{"role": "user", "content": "seed {{question}}"}])
    loaded = mlflow.genai.load_prompt(chat.uri)
    eval_fn = _build_eval_fn(lambda inputs: loaded.format(**inputs), None)
    candidate = {chat.name: json.dumps([{"role": "system", "content": "be brief"},
                                        {"role": "user", "content": "cand {{question}}"}])}
    with ConcurrentEvaluation.from_eval_fn(eval_fn).installed() as evaluation:
        (record,) = evaluation.evaluate(candidate, ROWS[:1])
        assert loaded.template == [{"role": "user", "content": "seed {{question}}"}]  # outside a candidate
    assert record.outputs == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "cand q0"}]
    assert record.outputs == eval_fn(candidate, ROWS[:1])[0].outputs


def test_with_tracing_disabled_rows_have_no_trace(qa: dict[str, Any]) -> None:
    mlflow.tracing.disable()
    try:
        with ConcurrentEvaluation.from_eval_fn(qa["eval_fn"]).installed() as evaluation:
            records = evaluation.evaluate({qa["name"]: "T {{question}}"}, ROWS[:4])
    finally:
        mlflow.tracing.enable()
    assert wrong_rows("T {{question}}", records) == 0 and all(r.trace is None for r in records)


def test_the_override_lives_only_inside_installed(qa: dict[str, Any]) -> None:
    evaluation = ConcurrentEvaluation.from_eval_fn(qa["eval_fn"])
    assert PromptVersion.__dict__["template"] is ORIGINAL
    with pytest.raises(RuntimeError, match="installed"):
        evaluation.evaluate({qa["name"]: SEED}, ROWS[:1])
    with evaluation.installed():
        assert PromptVersion.__dict__["template"] is not ORIGINAL
        assert mlflow.genai.load_prompt(f"prompts:/{qa['name']}/1").template == SEED  # no candidate here
    assert PromptVersion.__dict__["template"] is ORIGINAL


def test_self_test_passes_on_the_installed_mlflow(qa: dict[str, Any]) -> None:
    assert self_test(qa["eval_fn"]) is None
    assert self_test(ConcurrentEvaluation.from_eval_fn(qa["eval_fn"])) is None
    assert PromptVersion.__dict__["template"] is ORIGINAL


def test_self_test_names_a_missing_internal() -> None:
    def plain(candidate: dict[str, str], rows: list[dict[str, Any]]) -> list[Any]:
        return []

    reason = self_test(plain)
    assert reason is not None and "predict_fn" in reason
    warning = serial_fallback_warning(reason)
    assert mlflow.__version__ in warning and reason in warning


def test_self_test_fails_when_the_template_property_is_already_patched() -> None:
    PromptVersion.template = property(lambda self: "patched")
    try:
        assert "not MLflow's own property" in (self_test(ConcurrentEvaluation(lambda inputs: None, None)) or "")
    finally:
        PromptVersion.template = ORIGINAL


def test_every_internal_is_named_in_one_place() -> None:
    names = " ".join(mlflow_internals())
    for internal in ("_build_eval_fn", "PromptVersion.template", "set_prediction_context", "get_trace",
                     "configure_autologging_for_evaluation", "_deserialize_chat_template", "EvaluationResultRecord"):
        assert internal in names
