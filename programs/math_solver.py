"""LiveBench-Math: a chain-of-thought solver, its GEPA feedback metric, and the data split.

The solver is one ``dspy.ChainOfThought(question -> answer)``; GEPA optimizes its
instruction. The metric's score is LiveBench-Math's own verdict (dspy_pxn.programs.math_scoring), so
the numbers it reports are LiveBench-Math numbers. Each question also carries its own
answer-format rules (five repeated letters, three digits, a list of identifiers, a boxed
LaTeX expression), stricter than LiveBench's grader; the feedback states them next to the
expected answer, including on answers LiveBench counts correct ("counted correct, but ..."),
because following the format is half of what the instruction has to teach.

    from dspy_pxn.programs.math_solver import MathSolver, metric, load_livebench_math
    train, val, test = load_livebench_math()            # $DSPY_PXN_DATA_DIR, or online=True
    best = BatchedGEPA(metric=metric, ...).compile(MathSolver(), trainset=train, valset=val)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dspy
from dspy_pxn.programs.data import load_livebench_math
from dspy_pxn.programs.math_scoring import Grade, scorer_for

__all__ = ["SolveMath", "MathSolver", "SEED_INSTRUCTION", "grade", "make_metric", "metric", "score", "load_livebench_math"]

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
        self.metric = metric  # its GEPA feedback metric: BatchedGEPA uses it when given none

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


def grade(gold: dspy.Example, pred: Any, *, judge_lm: Any = None) -> Grade:
    """LiveBench's verdict on ``pred.answer`` for the gold example's subtask (an empty answer when there is none).

    The question text goes along: LiveBench's AMC/SMC rules read the choices' values from it.
    """
    subtask = _field(gold, "subtask")
    if not subtask:
        raise ValueError(
            "LiveBench-Math gold example has no `subtask` field; build examples with "
            "dspy_pxn.programs.data.livebench_math_example(row) or load_livebench_math()."
        )
    scorer = scorer_for(str(subtask), judge_lm=judge_lm)
    answer = str(_field(pred, "answer", "") or "")
    return scorer.grade(str(_field(gold, "answer", "")), answer, str(_field(gold, "question", "") or ""))


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _feedback(result: Grade, strict: bool = False) -> str:
    """What the reflection LM reads: LiveBench's verdict and why, then the question's own format where it was missed."""
    if result.correct and not result.hints:
        return (f"Correct. The answer {result.got} matches the expected answer {result.expected} "
                f"({result.reason}) in the required format ({result.format_rule}).")
    if result.correct:
        verdict = ("Scored 0 in strict mode although LiveBench counts it correct" if strict
                   else "Counted correct by LiveBench's rules")
        hints = "; ".join(result.hints)
        return f"{verdict} ({result.reason}), but {hints}. The question requires {result.format_rule}."
    head = "Partially correct" if result.score > 0 else "Incorrect"
    parts = [
        f"{head} (score {result.score:.2f}).",
        f"The expected answer is {result.expected}.",
        f"Read from the answer: {result.got if result.got is not None else 'nothing in the required format'}.",
        f"The question requires {result.format_rule}.",
    ]
    parts += [_sentence(p) for p in (*result.problems, *result.hints)]
    return " ".join(parts)


Metric = Callable[..., dspy.Prediction]


def make_metric(*, judge_lm: Any = None, strict: bool = False) -> Metric:
    """A GEPA feedback metric whose score is LiveBench's verdict.

    ``judge_lm`` (a ``dspy.LM``, off by default) is asked about the AMPS_Hard answers that
    LiveBench leaves to its own LLM judge; without it those are decided by value (equal or
    negated counts). ``strict=True`` is the strict mode: it also demands the format each
    question asks for (five letters, three digits last, ``Answer:``, a boxed exact answer
    in the requested form), so its scores are not LiveBench scores.
    """

    def metric(gold, pred, trace=None, pred_name=None, pred_trace=None) -> dspy.Prediction:
        result = grade(gold, pred, judge_lm=judge_lm)
        return dspy.Prediction(score=result.strict_score if strict else result.score,
                               feedback=_feedback(result, strict))

    metric.__doc__ = (
        "DSPy GEPA feedback metric: LiveBench-Math's score"
        + (" in strict mode" if strict else "")
        + ", and feedback with the expected answer, LiveBench's reason and the question's own format. "
        "The solver has one predictor, so the feedback is the same for every ``pred_name``."
    )
    return metric


metric = make_metric()


def score(gold, pred, trace=None) -> float:
    """LiveBench's score alone, for ``dspy.Evaluate``."""
    return grade(gold, pred).score
