"""The zoo: one ``Shape`` per program shape. A new shape is one entry in ``SHAPES``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dspy
from dspy.primitives.local_interpreter import LocalInterpreter

from tests.zoo import programs as p
from tests.zoo import task
from tests.zoo.lm import Fault, ZooLM

Data = Callable[[], tuple[task.Split, task.Split]]


@dataclass(frozen=True)
class Shape:
    """A program shape and what it needs to compile: its data, metric, settings and compile arguments.

    ``settings`` are extra ``dspy.context`` keywords (e.g. an adapter), built fresh per compile;
    ``fault`` makes the task LM misbehave on some questions; ``valset=False`` compiles with the
    trainset only (GEPA then validates on the trainset).
    """

    name: str
    program: Callable[[], dspy.Module]
    metric: Callable[..., Any] = task.feedback_metric
    data: Data = task.arithmetic
    settings: Callable[[], dict[str, Any]] = dict
    fault: Fault | None = None
    valset: bool = True


def with_history() -> tuple[task.Split, task.Split]:
    """Every question asked after an earlier turn of the conversation."""
    history = dspy.History(messages=[{"question": "What is 1 + 1?", "answer": "2"}])
    return (task.examples(task.TRAIN_PAIRS, history=history), task.examples(task.VAL_PAIRS, history=history))


def with_image() -> tuple[task.Split, task.Split]:
    """Every question beside a (tiny, inline) worksheet image."""
    image = dspy.Image(p.TINY_PNG)
    return task.examples(task.TRAIN_PAIRS, image=image), task.examples(task.VAL_PAIRS, image=image)


def as_query() -> tuple[task.Split, task.Split]:
    """The question under the input name ``query``."""
    return task.examples(task.TRAIN_PAIRS, key="query"), task.examples(task.VAL_PAIRS, key="query")


def field_metric(name: str) -> Callable[..., dspy.Prediction]:
    """The feedback metric on another output field than ``answer``."""
    def metric(gold: dspy.Example, pred: Any, trace: Any = None, pred_name: str | None = None,
               pred_trace: Any = None) -> dspy.Prediction:
        return task.graded(gold, task.answer_of(pred, name))
    metric.__name__ = f"{name}_metric"
    return metric


def solution_metric(gold: dspy.Example, pred: Any, trace: Any = None, pred_name: str | None = None,
                    pred_trace: Any = None) -> dspy.Prediction:
    """Reads the total of a pydantic ``Solution`` output."""
    return task.graded(gold, getattr(getattr(pred, "solution", None), "total", None))


def parity_metric(gold: dspy.Example, pred: Any, trace: Any = None, pred_name: str | None = None,
                  pred_trace: Any = None) -> float:
    """The Literal output against the gold total's parity."""
    return float(getattr(pred, "parity", None) == ("even" if gold.answer % 2 == 0 else "odd"))


def steps_metric(gold: dspy.Example, pred: Any, trace: Any = None, pred_name: str | None = None,
                 pred_trace: Any = None) -> dspy.Prediction:
    """The last of the listed steps is the total."""
    steps = getattr(pred, "steps", None) or [None]
    return task.graded(gold, task.number(steps[-1]))


SHAPES: list[Shape] = [
    Shape("predict", lambda: dspy.Predict("question -> answer")),
    Shape("chain_of_thought", lambda: dspy.ChainOfThought("question -> answer")),
    Shape("two_stage", p.PlanThenSolve),
    Shape("react_tool", lambda: dspy.ReAct("question -> answer: int", tools=[p.add], max_iters=3)),
    Shape("react_v2_tool", lambda: dspy.ReActV2("question -> answer: int", tools=[p.add], max_iters=3)),
    Shape("json_adapter", lambda: dspy.Predict(p.TypedAnswer), settings=lambda: {"adapter": dspy.JSONAdapter()}),
    Shape("xml_adapter", lambda: dspy.ChainOfThought(p.Steps), metric=steps_metric,
          settings=lambda: {"adapter": dspy.XMLAdapter()}),
    Shape("two_step_adapter", lambda: dspy.ChainOfThought(p.Question),
          settings=lambda: {"adapter": dspy.TwoStepAdapter(ZooLM("zoo-extractor"))}),
    Shape("typed_outputs", lambda: dspy.Predict(p.TypedAnswer)),
    Shape("pydantic_output", lambda: dspy.Predict(p.Solve), metric=solution_metric),
    Shape("literal_output", lambda: dspy.Predict(p.Parity), metric=parity_metric),
    Shape("list_output", lambda: dspy.Predict(p.Steps), metric=steps_metric),
    Shape("parallel_in_forward", p.ParallelPair),
    Shape("batch_in_forward", p.Batched),
    Shape("history_input", lambda: dspy.Predict(p.Conversation), data=with_history),
    Shape("image_input", lambda: dspy.Predict(p.Worksheet), data=with_image),
    Shape("forward_and_aforward", p.SyncAndAsync),
    Shape("per_predictor_lms", p.PerPredictorLMs),
    Shape("preset_demos", p.with_demos),
    Shape("predictors_in_list", p.Pipeline),
    Shape("dict_prediction", p.DictOutputs, metric=field_metric("answer")),
    Shape("no_valset", lambda: dspy.ChainOfThought("question -> answer"), valset=False),
    Shape("malformed_replies", lambda: dspy.Predict("question -> answer"), fault="malformed"),
    Shape("lm_errors", lambda: dspy.ChainOfThought("question -> answer"), fault="error"),
    Shape("best_of_n", lambda: dspy.BestOfN(dspy.ChainOfThought(p.Question), N=3, reward_fn=p.short_answer,
                                            threshold=1.0)),
    Shape("refine", lambda: dspy.Refine(dspy.ChainOfThought(p.Question), N=3, reward_fn=p.short_answer,
                                        threshold=1.0)),
    Shape("multi_chain_comparison", p.Compare),
    Shape("predict_n_majority", p.Majority),
    Shape("kwargs_renaming_forward", p.Renamed, data=as_query),
    Shape("decorated_forward", p.Decorated),
    Shape("metric_np_float32", lambda: dspy.Predict("question -> answer"), metric=task.float32_metric),
    Shape("metric_np_bool", lambda: dspy.Predict("question -> answer"), metric=task.isclose_metric),
    Shape("metric_np_int64", lambda: dspy.Predict("question -> answer"), metric=task.int64_metric),
    Shape("metric_plain_float", lambda: dspy.ChainOfThought("question -> answer"), metric=task.score_metric),
    Shape("flex", lambda: dspy.Flex(p.Question, interpreter_factory=LocalInterpreter)),
]
