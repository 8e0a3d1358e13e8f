"""LiveBench-Math: a chain-of-thought solver, its GEPA feedback metric, and the data split.

The solver is one ``dspy.ChainOfThought(question -> answer)``; GEPA optimizes its
instruction. Each question carries its own answer-format rules (five repeated letters,
three digits, a list of identifiers, a boxed LaTeX expression), so the metric's feedback
always states the rule the question set next to the expected answer: following the format
is half of what the instruction has to teach.

    from dspy_pxn.programs.math_solver import MathSolver, metric, load_livebench_math
    train, val, test = load_livebench_math()            # $DSPY_PXN_DATA_DIR, or online=True
    best = BatchedGEPA(metric=metric, ...).compile(MathSolver(), trainset=train, valset=val)
"""

from __future__ import annotations

from typing import Any

import dspy

from dspy_pxn.programs.data import load_livebench_math
from dspy_pxn.programs.math_scoring import Grade, scorer_for

__all__ = ["SolveMath", "MathSolver", "SEED_INSTRUCTION", "grade", "metric", "score", "load_livebench_math"]

SEED_INSTRUCTION = (
    "Solve the math problem. Think step by step, then give the final answer in exactly the format "
    "the problem asks for."
)


class SolveMath(dspy.Signature):
    """Solve the math problem. Think step by step, then give the final answer in exactly the format the problem asks for."""

    question: str = dspy.InputField(desc="the problem, including its own instructions for the answer format")
    answer: str = dspy.OutputField(desc="the final answer only, in exactly the format the problem asks for")


class MathSolver(dspy.Module):
    """Chain of thought over ``question -> answer``; GEPA's one component is ``solve.predict``."""

    def __init__(self, instruction: str = SEED_INSTRUCTION) -> None:
        super().__init__()
        self.solve = dspy.ChainOfThought(SolveMath.with_instructions(instruction))

    def forward(self, question: str) -> dspy.Prediction:
        return self.solve(question=question)


def _field(obj: Any, name: str, default: Any = None) -> Any:
    if obj is None:
        return default
    if hasattr(obj, "get"):
        value = obj.get(name, default)
        if value is not None:
            return value
    return getattr(obj, name, default)


def grade(gold: dspy.Example, pred: Any) -> Grade:
    """The subtask's scorer applied to ``pred.answer`` (an empty answer when the program produced none)."""
    subtask = _field(gold, "subtask")
    if not subtask:
        raise ValueError(
            "LiveBench-Math gold example has no `subtask` field; build examples with "
            "dspy_pxn.programs.data.livebench_math_example(row) or load_livebench_math()."
        )
    return scorer_for(str(subtask)).grade(str(_field(gold, "answer", "")), str(_field(pred, "answer", "") or ""))


def _feedback(result: Grade) -> str:
    head = "Correct." if result.correct else ("Partially correct" if result.score > 0 else "Incorrect")
    if result.correct:
        return f"Correct. The answer {result.got} matches the expected answer and the required format ({result.format_rule})."
    parts = [
        f"{head} (score {result.score:.2f}).",
        f"The expected answer is {result.expected}.",
        f"Read from the answer: {result.got if result.got is not None else 'nothing in the required format'}.",
        f"The question requires {result.format_rule}.",
    ]
    parts += [p[:1].upper() + p[1:] + ("" if p.endswith(".") else ".") for p in result.problems]
    return " ".join(parts)


def metric(gold, pred, trace=None, pred_name=None, pred_trace=None) -> dspy.Prediction:
    """DSPy GEPA feedback metric: the subtask score, and feedback with the expected answer and the demanded format.

    For olympiad questions the feedback lists which ``<missing k>`` positions are wrong.
    The solver has one predictor, so the feedback is the same for every ``pred_name``.
    """
    result = grade(gold, pred)
    return dspy.Prediction(score=result.score, feedback=_feedback(result))


def score(gold, pred, trace=None) -> float:
    """The metric's score alone, for ``dspy.Evaluate``."""
    return grade(gold, pred).score
