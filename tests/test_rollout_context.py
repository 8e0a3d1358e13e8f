"""A program, its metric and a custom proposer see under BatchedGEPA what they see under dspy.GEPA.

Each records what DSPy's settings say to it (the trace, the LM, the adapter, the callbacks, usage
tracking, the thread count) in every rollout (screening, validation, the held-out score) and every
reflection; the sets of what was seen must be the same under dspy.GEPA and BatchedGEPA (1×1, and
the defaults, which run wide and async). What dspy-pxn adds to a run's context is its own: private
setting keys (``dspy_pxn_*``) and the run's usage tracker, which DSPy's modules read only to bill
calls and attach usage (``tests/test_drop_in.py`` checks usage as a metric reads it); a dollar cap
or ``max_concurrent_lm_calls`` adds a callback that gates LM calls, which this default run has not.
"""

from __future__ import annotations

from typing import Any

import dspy
import pytest
from dspy.utils.callback import BaseCallback

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim

SEEN: dict[str, set[tuple]] = {}
LABEL: list[str] = []  # the optimizer being watched


class UsersCallback(BaseCallback):
    """A DSPy callback the user configured: it must stay the only one a rollout sees."""


TASK_LM, REFLECTION_LM, ADAPTER, CALLBACK = sim.SimulatedLM(), sim.SimulatedLM(), dspy.ChatAdapter(), UsersCallback()


def settings_seen(where: str) -> tuple:
    settings = dspy.settings
    return (where, type(settings.trace).__name__, settings.lm is TASK_LM, settings.lm is REFLECTION_LM,
            settings.adapter is ADAPTER, tuple(id(c) for c in settings.callbacks or ()) == (id(CALLBACK),),
            settings.track_usage, settings.num_threads)


def seen(entry: tuple) -> None:
    SEEN.setdefault(LABEL[0], set()).add(entry)


class Probe(dspy.Module):
    def __init__(self):
        super().__init__()
        self.cot = sim.seed_program()

    def forward(self, question):
        seen(settings_seen("forward"))
        trace = dspy.settings.trace
        prediction = self.cot(question=question)
        seen(("the predictor's call is in the trace", trace[-1][0] is self.cot.predict))
        return prediction


def metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
    if pred_name is None:
        seen(("metric", type(trace).__name__, type(pred).__name__))
    return sim.metric(gold, pred, trace, pred_name, pred_trace)


class Proposer:
    """A custom instruction proposer (dspy.GEPA's ``instruction_proposer``) that appends the known rules."""

    def __call__(self, candidate: dict[str, str], reflective_dataset: Any, components_to_update: list[str]):
        seen(settings_seen("proposer"))
        rules = "\n".join(rule.definition for rule in sim.RULES[:5])
        return {name: candidate[name] + "\n" + rules for name in components_to_update}


OPTIMIZERS = {
    "dspy.GEPA": lambda: dspy.GEPA(metric=metric, max_metric_calls=120, instruction_proposer=Proposer(),
                                   num_threads=4, track_stats=True),
    "BatchedGEPA 1x1": lambda: BatchedGEPA(metric=metric, max_metric_calls=120, instruction_proposer=Proposer(),
                                           num_threads=4, p=1, n=1),
    "BatchedGEPA": lambda: BatchedGEPA(metric=metric, max_metric_calls=120, instruction_proposer=Proposer(),
                                       num_threads=4),
}
TRAIN, VAL, TEST = sim.make_splits(seed=0, train=30, val=6, test=6)
HELD_OUT = {"dspy.GEPA": {}, "BatchedGEPA 1x1": {"testset": TEST}, "BatchedGEPA": {"testset": TEST}}  # compile's


@pytest.mark.parametrize("track_usage", [False, True])
def test_rollouts_metric_and_proposer_see_dspys_context(track_usage):
    SEEN.clear()
    for label, make in OPTIMIZERS.items():
        LABEL[:] = [label]
        with dspy.context(lm=TASK_LM, adapter=ADAPTER, callbacks=[CALLBACK], track_usage=track_usage):
            result = make().compile(Probe(), trainset=TRAIN, valset=VAL, **HELD_OUT[label]).detailed_results
        assert len(result.candidates) > 1  # a reflection ran, and the child was validated
    assert ("forward", "list", True, False, True, True, track_usage, dspy.settings.num_threads) in SEEN["dspy.GEPA"]
    assert SEEN["BatchedGEPA 1x1"] == SEEN["BatchedGEPA"] == SEEN["dspy.GEPA"]
