"""The zoo's programs: small modules written the way DSPy's docs and GEPA tutorials write them.

Each class is one program shape; plain modules (``dspy.Predict``, ``dspy.ReAct``, ...) are built
directly in ``shapes.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import dspy
import pydantic

from tests.zoo.lm import ZooLM

TINY_PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJR"
            "U5ErkJggg==")


# --------------------------------------------------------------------------- signatures
class Question(dspy.Signature):
    """Answer the arithmetic question."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField()


class TypedAnswer(dspy.Signature):
    """Answer the arithmetic question, with the parity and the addends of the total."""

    question: str = dspy.InputField()
    answer: float = dspy.OutputField()
    is_even: bool = dspy.OutputField()
    parts: dict[str, Any] = dspy.OutputField()


class Solution(pydantic.BaseModel):
    total: int
    explanation: str
    confident: bool


class Solve(dspy.Signature):
    """Solve the arithmetic question."""

    question: str = dspy.InputField()
    solution: Solution = dspy.OutputField()


class Parity(dspy.Signature):
    """Say whether the total asked for is even or odd."""

    question: str = dspy.InputField()
    parity: Literal["even", "odd"] = dspy.OutputField()


class Steps(dspy.Signature):
    """List the addends of the question, then their total."""

    question: str = dspy.InputField()
    steps: list[str] = dspy.OutputField(desc="the addends, then the total")


class Conversation(dspy.Signature):
    """Answer the user's latest arithmetic question."""

    history: dspy.History = dspy.InputField()
    question: str = dspy.InputField()
    answer: str = dspy.OutputField()


class Worksheet(dspy.Signature):
    """Answer the question printed beside the worksheet image."""

    image: dspy.Image = dspy.InputField()
    question: str = dspy.InputField()
    answer: str = dspy.OutputField()


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def short_answer(args: dict[str, Any], pred: dspy.Prediction) -> float:
    """BestOfN's and Refine's reward: answers of at most two characters (three-digit sums fail it)."""
    return 1.0 if len(str(pred.answer).strip()) <= 2 else 0.0


# --------------------------------------------------------------------------- modules
class PlanThenSolve(dspy.Module):
    """Two stages: a plan, then a chain of thought answering with it."""

    def __init__(self) -> None:
        super().__init__()
        self.plan = dspy.Predict("question -> plan")
        self.solve = dspy.ChainOfThought("question, plan -> answer")

    def forward(self, question: str) -> dspy.Prediction:
        plan = self.plan(question=question).plan
        return self.solve(question=question, plan=plan)


class PerPredictorLMs(PlanThenSolve):
    """The two stages on models of their own (``set_lm``), not the context's."""

    def __init__(self) -> None:
        super().__init__()
        self.plan.set_lm(ZooLM("zoo-planner"))
        self.solve.set_lm(ZooLM("zoo-solver"))


class ParallelPair(dspy.Module):
    """Two predictors run through dspy.Parallel inside forward; they must agree."""

    def __init__(self) -> None:
        super().__init__()
        self.first = dspy.Predict(Question)
        self.second = dspy.ChainOfThought(Question)

    def forward(self, question: str) -> dspy.Prediction:
        # No progress bar: tqdm's registry is not thread-safe across rollout threads.
        first, second = dspy.Parallel(num_threads=2, disable_progress_bar=True)(
            [(self.first, {"question": question}), (self.second, {"question": question})])
        return dspy.Prediction(answer=first.answer if first.answer == second.answer else "disagree")


class Batched(dspy.Module):
    """A predictor run through Module.batch inside forward."""

    def __init__(self) -> None:
        super().__init__()
        self.solve = dspy.Predict(Question)

    def forward(self, question: str) -> dspy.Prediction:
        (pred,) = self.solve.batch([dspy.Example(question=question).with_inputs("question")], num_threads=2,
                                   disable_progress_bar=True)
        return dspy.Prediction(answer=pred.answer)


class SyncAndAsync(dspy.Module):
    """A module with both forward and aforward, as DSPy's async tutorial writes them."""

    def __init__(self) -> None:
        super().__init__()
        self.solve = dspy.ChainOfThought(Question)

    def forward(self, question: str) -> dspy.Prediction:
        return self.solve(question=question)

    async def aforward(self, question: str) -> dspy.Prediction:
        return await self.solve.acall(question=question)


def with_demos() -> dspy.Predict:
    """A predictor shipped with hand-written demos."""
    predict = dspy.Predict(Question)
    predict.demos = [dspy.Example(question="What is 2 + 3?", answer="5"),
                     dspy.Example(question="What is 10 + 4?", answer="14")]
    return predict


class Pipeline(dspy.Module):
    """Predictors held in a plain Python list attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.stages = [dspy.Predict("question -> plan"), dspy.ChainOfThought("question, plan -> answer")]

    def forward(self, question: str) -> dspy.Prediction:
        plan = self.stages[0](question=question).plan
        return self.stages[1](question=question, plan=plan)


class DictOutputs(dspy.Module):
    """forward builds its outputs as a dict and returns them as a Prediction (read by key)."""

    def __init__(self) -> None:
        super().__init__()
        self.solve = dspy.Predict(Question)

    def forward(self, question: str) -> dspy.Prediction:
        outputs = {"question": question, "answer": self.solve(question=question).answer}
        return dspy.Prediction(**outputs)


class Compare(dspy.Module):
    """Three chain-of-thought attempts (n=3), reconciled by dspy.MultiChainComparison."""

    def __init__(self) -> None:
        super().__init__()
        self.attempt = dspy.ChainOfThought(Question, n=3)
        self.compare = dspy.MultiChainComparison(Question, M=3)

    def forward(self, question: str) -> dspy.Prediction:
        completions = self.attempt(question=question).completions
        return self.compare(completions=completions, question=question)


class Majority(dspy.Module):
    """Three completions (``n=3``) and dspy.majority over them."""

    def __init__(self) -> None:
        super().__init__()
        self.solve = dspy.Predict(Question, n=3)

    def forward(self, question: str) -> dspy.Prediction:
        return dspy.majority(self.solve(question=question))


class Renamed(dspy.Module):
    """forward(**kwargs) reading the example's ``query`` and passing it on as ``question``."""

    def __init__(self) -> None:
        super().__init__()
        self.solve = dspy.Predict(Question)

    def forward(self, **kwargs: Any) -> dspy.Prediction:
        return self.solve(question=kwargs["query"])


def traced(forward: Callable[..., Any]) -> Callable[..., Any]:
    """A pass-through decorator without functools.wraps, as users' logging and timing decorators often are:
    the decorated forward's signature is the wrapper's ``(self, *args, **kwargs)``."""
    def wrapper(self: dspy.Module, *args: Any, **kwargs: Any) -> Any:
        return forward(self, *args, **kwargs)
    return wrapper


class Decorated(dspy.Module):
    """forward wrapped by ``traced``; its ``question`` is the predictor's ``problem``."""

    def __init__(self) -> None:
        super().__init__()
        self.solve = dspy.Predict("problem -> answer")

    @traced
    def forward(self, question: str) -> dspy.Prediction:
        return self.solve(problem=question)
