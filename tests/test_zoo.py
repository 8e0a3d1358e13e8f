"""The program zoo: every shape compiles alike under dspy.GEPA and BatchedGEPA (p=1, n=1 and defaults).

One fake model (tests/zoo/lm.py) answers every program, so the seed's validation score must be the
same number under all three optimizers; it is checked to lie strictly between 0 and 1 under
dspy.GEPA first, so the equality is not vacuous and a failure below is BatchedGEPA's, not the model's.
"""

from __future__ import annotations

from typing import Any

import dspy
import pytest

from dspy_pxn import BatchedGEPA
from dspy_pxn.proposer.sibling_merge import MergeImprovements
from tests.compiling import compile_sim
from tests.zoo.lm import CAREFUL, ZooLM
from tests.zoo.shapes import SHAPES, Shape

# Enough for the defaults to run wide: p="auto" on 4 workers with |val| = 5 comes to 2 proposals in flight; a shape
# without a valset validates on the 10 training examples, which takes 160 for 2.
MAX_METRIC_CALLS = 120
MAX_METRIC_CALLS_NO_VALSET = 160


def budget(shape: Shape) -> int:
    return MAX_METRIC_CALLS if shape.valset else MAX_METRIC_CALLS_NO_VALSET
OPTIMIZERS: dict[str, tuple[type, dict[str, Any]]] = {
    "dspy.GEPA": (dspy.GEPA, {"track_stats": True}),
    "BatchedGEPA(p=1, n=1)": (BatchedGEPA, {"p": 1, "n": 1}),
    "BatchedGEPA()": (BatchedGEPA, {}),
}


def compile_shape(shape: Shape, optimizer: type, kwargs: dict[str, Any]) -> dspy.Module:
    """The shape's program compiled by ``optimizer`` on fresh fake LMs, inside dspy.context only."""
    train, val = shape.data()
    return compile_sim(shape.program(), (train, val if shape.valset else None), optimizer=optimizer,
                       metric=shape.metric, lm=ZooLM(fault=shape.fault), reflection_lm=ZooLM("zoo-reflection"),
                       context=shape.settings(), max_metric_calls=budget(shape), num_threads=4, seed=0,
                       **kwargs).program


@pytest.mark.parametrize("shape", SHAPES, ids=[shape.name for shape in SHAPES])
def test_shape_compiles_alike_under_dspy_gepa_and_batched_gepa(shape: Shape) -> None:
    """Each optimizer is tried even when another fails, so one report names every failing one."""
    student = shape.program()
    compiled: dict[str, dspy.Module] = {}
    errors: dict[str, str] = {}
    for label, (optimizer, kwargs) in OPTIMIZERS.items():
        try:
            compiled[label] = compile_shape(shape, optimizer, kwargs)
        except Exception as error:  # noqa: BLE001 - every optimizer is tried, and each failure reported
            errors[label] = f"{type(error).__name__}: {error}"
    assert not errors, f"compile failed: {errors}"

    seeds = {label: prog.detailed_results.val_aggregate_scores[0] for label, prog in compiled.items()}
    assert 0 < seeds["dspy.GEPA"] < 1, f"the fake LM gives no mixed seed score: {seeds}"
    # approx: a float32 metric's mean is a float32 under dspy.GEPA (0.6 is 0.60000002 there).
    assert all(score == pytest.approx(seeds["dspy.GEPA"], rel=1e-6) for score in seeds.values()), (
        f"seed validation scores differ: {seeds}")

    wide = compiled["BatchedGEPA()"].detailed_results.steps
    assert wide and wide[0].p * wide[0].n > 1, "the defaults should run more than one proposal at once"

    names = [name for name, _ in student.named_predictors()]
    for label, prog in compiled.items():
        assert type(prog) is type(student), f"{label} returned a {type(prog).__name__}"
        assert [name for name, _ in prog.named_predictors()] == names, label
        if label != "dspy.GEPA":  # dspy.GEPA may overshoot its budget
            assert prog.detailed_results.total_metric_calls <= budget(shape), label


@pytest.mark.parametrize("adapter", [dspy.ChatAdapter(), dspy.JSONAdapter(), dspy.XMLAdapter(),
                                     dspy.TwoStepAdapter(ZooLM("zoo-extractor"))], ids=lambda a: type(a).__name__)
def test_the_zoo_lm_answers_a_sibling_merge_under_every_adapter(adapter: dspy.Adapter) -> None:
    """A sibling merge needs several improving children in one step, which the p=1, n=1 compiles above
    never have: the zoo LM's answer to its prompt is checked here instead."""
    with dspy.context(lm=ZooLM("zoo-reflection"), adapter=adapter):
        merged = dspy.Predict(MergeImprovements)(current_instruction="Add the numbers.\nShow the sum.",
                                                 improved_instructions="+ Carry the tens.")
    assert merged.merged_instruction == f"Add the numbers.\nShow the sum. {CAREFUL}"
