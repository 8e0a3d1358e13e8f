"""The zoo's task data and metrics: addition questions with integer gold answers.

The pairs are chosen against ZooLM's rules: the validation set has two questions the careless model
slips on (sum divisible by 3) and two it misbehaves on when faulty (first addend divisible by 5),
so every shape's seed scores strictly between 0 and 1, faults or not. Some training sums reach
three digits, which the "short answer" reward of BestOfN and Refine rejects.
"""

from __future__ import annotations

import re
from typing import Any

import dspy
import numpy as np

TRAIN_PAIRS = [(12, 7), (33, 21), (40, 16), (58, 47), (9, 64), (71, 28), (25, 38), (14, 86), (67, 15), (90, 23)]
VAL_PAIRS = [(17, 25), (8, 13), (30, 14), (26, 9), (45, 11)]

Split = list[dspy.Example]


def question(a: int, b: int) -> str:
    return f"What is {a} + {b}?"


def examples(pairs: list[tuple[int, int]], key: str = "question", **extra: Any) -> Split:
    """One example per pair, its question under ``key`` (the program's input name), gold ``answer``."""
    return [dspy.Example(**{key: question(a, b)}, answer=a + b, **extra).with_inputs(key, *extra) for a, b in pairs]


def arithmetic() -> tuple[Split, Split]:
    """(train, val): the plain task."""
    return examples(TRAIN_PAIRS), examples(VAL_PAIRS)


def number(value: Any) -> float | None:
    """The first number in a field's value (str, int, float), or None: the model's answer as written."""
    m = re.search(r"-?\d+(?:\.\d+)?", str(value))
    return float(m.group()) if m else None


def answer_of(pred: Any, field: str = "answer") -> float | None:
    """``pred[field]`` as a number; None for a missing prediction or field (a failed rollout)."""
    try:
        return number(pred[field])
    except (KeyError, TypeError, AttributeError):
        return None


def graded(gold: dspy.Example, got: float | None) -> dspy.Prediction:
    """Score and feedback, the form GEPA's reflection learns from."""
    if got == gold.answer:
        return dspy.Prediction(score=1.0, feedback="Correct.")
    return dspy.Prediction(score=0.0, feedback=f"Wrong: expected {gold.answer}, got {got}. Add the numbers carefully.")


def feedback_metric(gold: dspy.Example, pred: Any, trace: Any = None, pred_name: str | None = None,
                    pred_trace: Any = None) -> dspy.Prediction:
    """The usual GEPA metric: the answer field against the gold total, with feedback."""
    return graded(gold, answer_of(pred))


def score_metric(gold: dspy.Example, pred: Any, trace: Any = None, pred_name: str | None = None,
                 pred_trace: Any = None) -> float:
    """A metric returning a bare float, as many users write one."""
    return float(answer_of(pred) == gold.answer)


def float32_metric(gold: dspy.Example, pred: Any, trace: Any = None, pred_name: str | None = None,
                   pred_trace: Any = None) -> np.float32:
    """A score computed in numpy and returned as ``np.float32``."""
    return np.float32(answer_of(pred) == gold.answer)


def isclose_metric(gold: dspy.Example, pred: Any, trace: Any = None, pred_name: str | None = None,
                   pred_trace: Any = None) -> np.bool_:
    """``np.isclose`` straight out: an ``np.bool_`` score."""
    got = answer_of(pred)
    return np.isclose(np.nan if got is None else got, gold.answer)


def int64_metric(gold: dspy.Example, pred: Any, trace: Any = None, pred_name: str | None = None,
                 pred_trace: Any = None) -> np.int64:
    """A count of correct answers summed in numpy: an ``np.int64`` score."""
    return np.sum(np.array([answer_of(pred) == gold.answer]), dtype=np.int64)
