"""The metric a run optimizes: the user's, the program's own, or a plain DSPy metric made GEPA's.

GEPA calls its metric with five arguments ``(gold, pred, trace, pred_name, pred_trace)`` and reads feedback text from
it. Users have many plain DSPy metrics ``(gold, pred, trace=None)`` returning a number; dspy.GEPA refuses them.
BatchedGEPA calls them with the three arguments they take: the reflection then sees only the score ("This trajectory
got a score of 0.0"), which works but gives the reflection LM less to go on than feedback text, so it says so once.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

FEEDBACK_SIGNATURE = "(gold, pred, trace=None, pred_name=None, pred_trace=None)"


def arity(metric: Callable[..., Any]) -> int | None:
    """5 for a GEPA feedback metric, 3 for a plain DSPy metric, None when the signature cannot be read; anything
    else raises TypeError."""
    if not callable(metric):
        raise TypeError(f"metric must be callable, got {type(metric).__name__}: pass metric=<function {FEEDBACK_SIGNATURE}>.")
    try:
        signature = inspect.signature(metric)
    except (TypeError, ValueError):
        return None  # builtins and C callables: nothing to inspect, trust the caller
    for count in (5, 3):
        try:
            signature.bind(*([None] * count))
            return count
        except TypeError:
            continue
    raise TypeError(f"metric must have DSPy's GEPA feedback signature {FEEDBACK_SIGNATURE} or a plain DSPy metric's "
                    f"(gold, pred, trace=None); {getattr(metric, '__name__', 'it')}{signature} takes neither "
                    "(calling it with 3 or 5 arguments fails). Add the missing parameters, e.g. trace=None. "
                    "See https://dspy.ai/api/optimizers/GEPA.")


def as_feedback_metric(metric: Callable[..., Any]) -> Callable[..., Any]:
    """The metric, callable with GEPA's five arguments (a plain metric is given the three it takes)."""
    if arity(metric) != 3:
        return metric

    def feedback_metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        return metric(gold, pred, trace)

    feedback_metric.__name__ = getattr(metric, "__name__", "metric")
    feedback_metric.__wrapped__ = metric  # type: ignore[attr-defined]
    logger.info("metric %s returns a score only: GEPA's reflection will see just the score. A metric that also returns "
                "feedback text, dspy.Prediction(score=..., feedback=...), with the signature %s, tells the reflection "
                "LM what went wrong and usually finds better instructions.", feedback_metric.__name__,
                FEEDBACK_SIGNATURE)
    return feedback_metric


def resolve(metric: Callable[..., Any] | None, student: Any) -> Callable[..., Any]:
    """The metric given to BatchedGEPA, else the program's own ``program.metric``."""
    if metric is None:
        metric = getattr(student, "metric", None)
    if metric is None:
        raise TypeError(f"No metric: pass BatchedGEPA(metric=...) with the signature {FEEDBACK_SIGNATURE} (or a plain "
                        "(gold, pred, trace=None) metric), or give the program a .metric attribute (every ready-made "
                        "task program carries one).")
    return as_feedback_metric(metric)


def feedback_function(metric: Callable[..., Any], pred_name: str, predictor: Any) -> Callable[..., dict]:
    """Per-predictor feedback in the shape DspyAdapter's reflective dataset expects: dspy.GEPA builds the same
    closure inside ``compile``, where it cannot be imported from."""

    def feedback(predictor_output, predictor_inputs, module_inputs, module_outputs, captured_trace) -> dict:
        outcome = metric(module_inputs, module_outputs, captured_trace, pred_name, [(predictor, predictor_inputs, predictor_output)])
        if hasattr(outcome, "feedback"):
            if outcome["feedback"] is None:
                outcome["feedback"] = f"This trajectory got a score of {outcome['score']}."
            return outcome
        return {"score": outcome, "feedback": f"This trajectory got a score of {outcome}."}

    return feedback
