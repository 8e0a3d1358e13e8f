"""Candidate evaluation for ``mlflow.genai.optimize_prompts`` that many threads can run at once.

MLflow's ``eval_fn`` (``mlflow.genai.optimize.optimize._build_eval_fn``) installs a candidate by
patching ``PromptVersion.template`` on the class and reverting it afterwards, and enters the
process-wide ``configure_autologging_for_evaluation`` per call: two calls at once run rows with
each other's template (or the seed's). Here the property is overridden once, for the whole
optimization (``with evaluation.installed():``), and reads the candidate from a ``ContextVar``;
every row runs in a copy of its caller's context, so each thread sees its own candidate.

MLflow internals relied on: ``mlflow_internals()``; checked by ``self_test()`` at the start, else the
caller falls back to MLflow's own ``eval_fn``, one candidate at a time (``serial_fallback_warning``).
"""

from __future__ import annotations

import contextvars
import inspect
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

_logger = logging.getLogger(__name__)

EvalFn = Callable[[dict[str, str], list[dict[str, Any]]], list[Any]]
CLOSURE_CELLS = ("predict_fn", "metric_fn")
_RECORD_FIELDS = ("inputs", "outputs", "expectations", "score", "trace", "rationales", "individual_scores")


def mlflow_internals() -> dict[str, str]:
    """Every MLflow internal this module relies on, and what it assumes of it: the one place to
    read when a new MLflow release breaks ``self_test``."""
    return {
        "mlflow.genai.optimize.optimize._build_eval_fn": "returns eval_fn whose closure has cells named "
        "'predict_fn' and 'metric_fn' (found by eval_fn.__code__.co_freevars, read from eval_fn.__closure__)",
        "predict_fn (closure cell)": "already converted by convert_predict_fn: called as predict_fn(inputs_dict)",
        "metric_fn (closure cell)": "None, or metric_fn(inputs=, outputs=, expectations=, trace=) "
        "-> (score, rationales, individual_scores)",
        "mlflow.entities.model_registry.PromptVersion.template": "a property defined on the class, reading "
        "self._tags[mlflow.prompt.constants.PROMPT_TEXT_TAG_KEY]; PromptVersion.format() reads self.template",
        "PromptVersion.name / PromptVersion.is_text_prompt": "the prompt's registry name; False for chat prompts",
        "mlflow.genai.optimize.optimize._deserialize_chat_template": "chat candidates are a JSON list of messages "
        "(absent on MLflow 3.13.0, which optimizes text prompts only: json.loads is used then)",
        "mlflow.pyfunc.set_prediction_context / mlflow.pyfunc.Context": "Context(request_id=, is_evaluate=True) makes "
        "the row's trace synchronous and findable by its request id",
        "mlflow.get_trace": "get_trace(request_id, silent=True) -> the row's Trace, or None (tracing off)",
        "mlflow.tracing.provider.is_tracing_enabled": "False when tracing is off (no row trace to fetch)",
        "mlflow.metrics.genai.model_utils._parse_model_uri": "'<provider>:/<model>' -> (provider, model), as MLflow's "
        "GEPA optimizer reads reflection_model",
        "mlflow.genai.optimize.optimizers.base.BasePromptOptimizer": "optimize(eval_fn, train_data, target_prompts, "
        "enable_tracking) -> PromptOptimizerOutput; optimize_prompts registers the optimized templates",
        "mlflow.models.evaluation.utils.trace.configure_autologging_for_evaluation": "process-wide, "
        "entered once (enable_tracing=True) around the whole optimization",
        "mlflow.genai.optimize.types.EvaluationResultRecord": "a dataclass with fields " + ", ".join(_RECORD_FIELDS),
        "mlflow.environment_variables.MLFLOW_GENAI_EVAL_MAX_WORKERS": "the default size of the row pool",
    }


class MlflowInternalsChanged(RuntimeError):
    """An MLflow internal listed by ``mlflow_internals()`` is not what this module expects."""


def warn_unread(names: set[str]) -> None:
    """MLflow's own warning for candidate prompts predict_fn never read (no ``format()``, or a mismatched name)."""
    if names:
        _logger.warning(
            "The following prompts were not used during evaluation: %s. This may indicate that predict_fn is "
            "not calling format() for these prompts, or the prompt names don't match. "
            "Please verify that your predict_fn uses all prompts specified in prompt_uris.", sorted(names))


def serial_fallback_warning(reason: str) -> str:
    """The warning to log when ``self_test`` fails and candidates go through MLflow's own eval_fn."""
    import mlflow

    return (f"dspy-pxn: concurrent prompt evaluation is unavailable on MLflow {mlflow.__version__} ({reason}); "
            "falling back to MLflow's own eval_fn, one candidate at a time (slower, same results).")


@dataclass
class _Candidate:
    """The candidate a context evaluates (prompt name -> template; chat prompts as JSON) and the names read."""

    prompts: dict[str, str]
    used: set[str] = field(default_factory=set)


_CANDIDATE: contextvars.ContextVar[_Candidate | None] = contextvars.ContextVar("dspy_pxn_prompt_candidate", default=None)
_install_lock = threading.Lock()
_install_depth = 0
_original: property | None = None


def _chat_template(serialized: str, name: str) -> list[dict[str, Any]]:
    """A chat candidate back in the ``list[dict]`` shape, validated as MLflow does when it can."""
    try:
        from mlflow.genai.optimize.optimize import _deserialize_chat_template
    except ImportError:  # MLflow 3.13.0: chat prompts are refused before optimization starts
        return json.loads(serialized)
    return _deserialize_chat_template(serialized, name)


def _template_property(original: property) -> property:
    """``PromptVersion.template`` reading this context's candidate, or MLflow's own property when the
    context has none for the prompt (the seed's template, outside any evaluation)."""
    read_original = original.fget

    def template(self: Any) -> str | list[dict[str, Any]]:
        candidate = _CANDIDATE.get()
        if candidate is None or self.name not in candidate.prompts:
            return read_original(self)
        candidate.used.add(self.name)
        text = candidate.prompts[self.name]
        return text if self.is_text_prompt else _chat_template(text, self.name)

    return property(template, doc=original.__doc__)


@contextmanager
def template_override() -> Iterator[None]:
    """Override ``PromptVersion.template`` (reference-counted: nested and concurrent uses share one
    override); MLflow's property is back once the last use ends."""
    global _install_depth, _original
    from mlflow.entities.model_registry import PromptVersion

    with _install_lock:
        if _install_depth == 0:
            current = PromptVersion.__dict__.get("template")
            if not isinstance(current, property) or getattr(current.fget, "__qualname__", "") != "PromptVersion.template":
                raise MlflowInternalsChanged(f"PromptVersion.template is not MLflow's own property: {current!r}")
            _original = current
            PromptVersion.template = _template_property(current)
        _install_depth += 1
    try:
        yield
    finally:
        with _install_lock:
            _install_depth -= 1
            if _install_depth == 0:
                PromptVersion.template = _original


def _closure_cells(eval_fn: Callable[..., Any]) -> dict[str, Any]:
    """``predict_fn`` and ``metric_fn`` out of MLflow's eval_fn closure (raises MlflowInternalsChanged); an eval_fn
    wrapped with ``functools.wraps`` (a timer, a logger) is read through to MLflow's own."""
    eval_fn = inspect.unwrap(eval_fn)
    code, closure = getattr(eval_fn, "__code__", None), getattr(eval_fn, "__closure__", None) or ()
    names = code.co_freevars if code is not None else ()
    missing = [name for name in CLOSURE_CELLS if name not in names]
    if missing:
        raise MlflowInternalsChanged(f"eval_fn's closure has no cell named {', '.join(missing)} (has {names})")
    cells = {name: closure[names.index(name)].cell_contents for name in CLOSURE_CELLS}
    if not callable(cells["predict_fn"]) or not (cells["metric_fn"] is None or callable(cells["metric_fn"])):
        raise MlflowInternalsChanged("eval_fn's predict_fn/metric_fn cells are not functions")
    return cells


class ConcurrentEvaluation:
    """MLflow's eval_fn, re-done so that many threads can evaluate different candidates at once.

    ``evaluate`` runs only inside ``installed()``, which overrides ``PromptVersion.template``, enters
    MLflow's evaluation autologging and starts the row pool, once for the whole optimization.
    """

    def __init__(self, predict_fn: Callable[[dict[str, Any]], Any], metric_fn: Callable[..., Any] | None,
                 *, max_workers: int | None = None) -> None:
        self.predict_fn, self.metric_fn, self.max_workers = predict_fn, metric_fn, max_workers
        self._executor: ThreadPoolExecutor | None = None

    @classmethod
    def from_eval_fn(cls, eval_fn: EvalFn, *, max_workers: int | None = None) -> ConcurrentEvaluation:
        """The evaluation of the ``predict_fn`` and ``metric_fn`` MLflow's eval_fn closes over."""
        cells = _closure_cells(eval_fn)
        return cls(cells["predict_fn"], cells["metric_fn"], max_workers=max_workers)

    @contextmanager
    def installed(self) -> Iterator[ConcurrentEvaluation]:
        """The override, evaluation autologging (tracing on) and a row pool of ``max_workers`` threads
        (default ``MLFLOW_GENAI_EVAL_MAX_WORKERS``), shared by every ``evaluate`` call inside."""
        from mlflow.environment_variables import MLFLOW_GENAI_EVAL_MAX_WORKERS
        from mlflow.models.evaluation.utils.trace import configure_autologging_for_evaluation
        from mlflow.tracing.provider import is_tracing_enabled

        if self._executor is not None:
            raise RuntimeError("ConcurrentEvaluation.installed() is already active")
        with ExitStack() as stack:
            stack.enter_context(template_override())
            if is_tracing_enabled():  # with tracing off, MLflow's autologging would only add callbacks to every row
                stack.enter_context(configure_autologging_for_evaluation(enable_tracing=True))
            self._executor = stack.enter_context(ThreadPoolExecutor(
                max_workers=self.max_workers or MLFLOW_GENAI_EVAL_MAX_WORKERS.get(),
                thread_name_prefix="PxnPromptEvaluation"))
            try:
                yield self
            finally:
                self._executor = None

    def evaluate(self, candidate: dict[str, str], rows: list[dict[str, Any]]) -> list[Any]:
        """``EvaluationResultRecord``s for ``rows`` under ``candidate``, as MLflow's ``eval_fn(candidate, rows)``
        returns them; safe to call from many threads at once."""
        return self.evaluate_with_usage(candidate, rows)[0]

    def evaluate_with_usage(self, candidate: dict[str, str], rows: list[dict[str, Any]]) -> tuple[list[Any], set[str]]:
        """``evaluate``, and the names of the candidate's prompts that were read; warns about unread ones as
        MLflow does (predict_fn not calling ``format()``, or a mismatched name)."""
        executor = self._executor
        if executor is None:
            raise RuntimeError("call evaluate() inside `with evaluation.installed():`")
        # A copy of this context per row (a Context can't be entered by two threads at once). Unlike MLflow's
        # pool, rows so inherit the caller's context: under an active span, row traces become its children.
        futures = [executor.submit(contextvars.copy_context().run, self.evaluate_row, candidate, row) for row in rows]
        outcomes = [future.result() for future in futures]
        used = set().union(*(outcome.used for outcome in outcomes))
        warn_unread(set(candidate) - used)
        return [outcome.record for outcome in outcomes], used

    def evaluate_row(self, candidate: dict[str, str], row: dict[str, Any]) -> RowOutcome:
        """One row under ``candidate``, in the calling thread (a pool worker of the engine): the candidate is
        this context's only while the row runs. Inside ``installed()``."""
        active = _Candidate(dict(candidate))
        token = _CANDIDATE.set(active)
        try:
            outcome = self._run_row(row)
        finally:
            _CANDIDATE.reset(token)
        outcome.used = set(active.used)
        return outcome

    def _run_row(self, record: dict[str, Any]) -> RowOutcome:
        """One row, as MLflow's ``_run_single``: predict under a prediction context, fetch the trace, score.
        A predict_fn that raises is scored on MLflow's failure message, as MLflow does; its error is kept."""
        import mlflow
        from mlflow.genai.optimize.types import EvaluationResultRecord
        from mlflow.pyfunc import Context, set_prediction_context
        from mlflow.tracing.provider import is_tracing_enabled

        inputs = record["inputs"]
        expectations = record.get("expectations") or {"expected_response": record.get("outputs")}
        request_id = str(uuid.uuid4())
        error = None
        with set_prediction_context(Context(request_id=request_id, is_evaluate=True)):
            try:
                outputs = self.predict_fn(inputs)
            except Exception as e:  # noqa: BLE001 - MLflow scores the failure message as the output
                outputs = f"Failed to invoke the predict_fn with {inputs}: {e}"
                error = e
        # With tracing off there is no trace to find; MLflow's own eval_fn asks the store anyway (a query per row).
        trace = mlflow.get_trace(request_id, silent=True) if is_tracing_enabled() else None
        if self.metric_fn is not None:
            score, rationales, individual_scores = self.metric_fn(
                inputs=inputs, outputs=outputs, expectations=expectations, trace=trace)
        else:
            score, rationales, individual_scores = None, {}, {}
        return RowOutcome(EvaluationResultRecord(
            inputs=inputs, outputs=outputs, expectations=expectations, score=score, trace=trace,
            rationales=rationales, individual_scores=individual_scores), error)


@dataclass
class RowOutcome:
    """One row's ``EvaluationResultRecord``, the predict_fn's own exception (None when it answered) and the
    names of the candidate's prompts it read."""

    record: Any
    predict_error: BaseException | None
    used: set[str] = field(default_factory=set)


def _check_imports() -> None:
    """Import every internal ``mlflow_internals()`` names (ImportError/AttributeError when one moved)."""
    import dataclasses

    import mlflow
    from mlflow.environment_variables import MLFLOW_GENAI_EVAL_MAX_WORKERS  # noqa: F401
    from mlflow.genai.optimize.types import EvaluationResultRecord
    from mlflow.models.evaluation.utils.trace import configure_autologging_for_evaluation  # noqa: F401
    from mlflow.prompt.constants import PROMPT_TEXT_TAG_KEY  # noqa: F401
    from mlflow.pyfunc import Context, set_prediction_context  # noqa: F401
    from mlflow.tracing.provider import is_tracing_enabled  # noqa: F401

    Context(request_id="x", is_evaluate=True)
    if not callable(mlflow.get_trace):
        raise TypeError("mlflow.get_trace is not a function")
    if missing := set(_RECORD_FIELDS) - {f.name for f in dataclasses.fields(EvaluationResultRecord)}:
        raise AttributeError(f"EvaluationResultRecord has no {sorted(missing)}")


def self_test(evaluation: ConcurrentEvaluation | EvalFn) -> str | None:
    """None when the MLflow internals behave as this module expects, else the reason (for
    ``serial_fallback_warning``). Takes the evaluation, or MLflow's eval_fn to build it from.

    Checks: the closure cells; the imports; that inside a candidate context ``PromptVersion(...).template``
    and ``.format()`` give the candidate (chat prompts as a list of messages) and outside it the seed;
    that two threads with different candidates, released together, each see their own; and that
    MLflow's property is back afterwards."""
    from mlflow.entities.model_registry import PromptVersion

    try:
        if not isinstance(evaluation, ConcurrentEvaluation):
            ConcurrentEvaluation.from_eval_fn(evaluation)
        _check_imports()
        original = PromptVersion.__dict__.get("template")
        text = PromptVersion(name="pxn-self-test", version=1, template="seed {{x}}")
        chat = PromptVersion(name="pxn-self-test-chat", version=1, template=[{"role": "user", "content": "seed"}])
        messages = [{"role": "user", "content": "candidate {{x}}"}]
        with template_override():
            if text.template != "seed {{x}}" or chat.template != [{"role": "user", "content": "seed"}]:
                return "PromptVersion.template changed outside a candidate context"
            token = _CANDIDATE.set(_Candidate({text.name: "cand {{x}}", chat.name: json.dumps(messages)}))
            try:
                if text.template != "cand {{x}}" or text.format(x=1) != "cand 1" or chat.template != messages:
                    return "the PromptVersion.template override is not what PromptVersion reads"
            finally:
                _CANDIDATE.reset(token)
            if text.template != "seed {{x}}":
                return "the candidate leaked out of its context"
            barrier, seen = threading.Barrier(2, timeout=10), {}

            def read(name: str) -> None:
                _CANDIDATE.set(_Candidate({text.name: name}))
                barrier.wait()
                first = text.template
                barrier.wait()
                seen[name] = (first, text.template)

            with ThreadPoolExecutor(2) as pool:  # fresh threads: each starts with no candidate
                list(pool.map(read, ("a", "b")))
            if seen != {"a": ("a", "a"), "b": ("b", "b")}:
                return f"two threads did not each see their own candidate: {seen}"
        if PromptVersion.__dict__.get("template") is not original:
            return "PromptVersion.template was not restored"
    except Exception as e:  # noqa: BLE001 - any failure means: don't trust the internals
        return f"{type(e).__name__}: {e}"
    return None
