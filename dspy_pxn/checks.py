"""Argument checks that run before any LM call, each naming the argument and the fix.

dspy.GEPA reports most of these as bare ``AssertionError``s, or not at all (a metric
that cannot be called with three arguments silently scores every example 0).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import dspy


def positive_int(name: str, value: Any, hint: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}.{(' ' + hint) if hint else ''}")
    return value


def one_budget(auto: str | None, max_full_evals: int | None, max_metric_calls: int | None) -> None:
    given = {
        name: value
        for name, value in (("auto", auto), ("max_full_evals", max_full_evals), ("max_metric_calls", max_metric_calls))
        if value is not None
    }
    if len(given) != 1:
        raise ValueError(
            "Set exactly one budget: max_metric_calls=<int>, max_full_evals=<int>, or auto='light'|'medium'|'heavy'"
            f" (got {given or 'none'})."
        )
    if auto is not None and auto not in ("light", "medium", "heavy"):
        raise ValueError(f"auto must be 'light', 'medium' or 'heavy', got {auto!r}.")
    if max_full_evals is not None:
        positive_int("max_full_evals", max_full_evals)
    if max_metric_calls is not None:
        positive_int("max_metric_calls", max_metric_calls)


def feedback_metric(metric: Callable[..., Any]) -> None:
    """The metric is called with five arguments for feedback and three for scoring."""
    if not callable(metric):
        raise TypeError(f"metric must be callable, got {type(metric).__name__}.")
    try:
        signature = inspect.signature(metric)
    except (TypeError, ValueError):
        return  # builtins and C callables: nothing to inspect, trust the caller
    for count in (5, 3):
        try:
            signature.bind(*([None] * count))
        except TypeError as error:
            raise TypeError(
                "metric must have DSPy's GEPA feedback signature "
                "(gold, pred, trace=None, pred_name=None, pred_trace=None); "
                f"calling it with {count} arguments fails: {error}. See https://dspy.ai/api/optimizers/GEPA."
            ) from None


def dataset(name: str, examples: Sequence[Any] | None) -> list[dspy.Example]:
    if examples is None or len(examples) == 0:
        raise ValueError(f"{name} must be a non-empty list of dspy.Example, got {examples!r}.")
    for index, example in enumerate(examples):
        if not isinstance(example, dspy.Example):
            raise TypeError(f"{name}[{index}] must be a dspy.Example, got {type(example).__name__}.")
        try:
            inputs = example.inputs()
        except ValueError:
            raise ValueError(
                f"{name}[{index}] has no input fields declared; build it with dspy.Example(...).with_inputs('question')."
            ) from None
        if len(inputs.keys()) == 0:
            raise ValueError(f"{name}[{index}] declares no input fields; call .with_inputs(...) with its input keys.")
    return list(examples)


def program(student: Any) -> None:
    if not isinstance(student, dspy.Module):
        raise TypeError(f"student must be a dspy.Module, got {type(student).__name__}.")
    if not student.named_predictors():
        raise ValueError(
            "student has no predictors to optimize: GEPA rewrites the instructions of dspy.Predict "
            "(or ChainOfThought, ...) modules inside the program."
        )


def budget_covers_validation(max_metric_calls: int, valset_size: int) -> None:
    if max_metric_calls < valset_size:
        raise ValueError(
            f"The budget ({max_metric_calls} metric calls) is smaller than one full validation "
            f"(|valset| = {valset_size}): raise max_metric_calls or use a smaller valset."
        )
