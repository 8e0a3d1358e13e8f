"""Bad input is refused before any LM call, with the argument named and the fix given."""

import dspy
import pytest
from gepa.strategies.proposal_sampling import (
    IndependentSampling,
    PxNSampling,
    SameParentSampling,
    SingleMutationSampling,
)
from gepa.strategies.proposal_selection import BestImprovement

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from tests.conftest import seed_program


class CountingLM(sim.SimulatedLM):
    """Fails the test if any error path reaches an LM call."""

    def forward(self, *args, **kwargs):
        raise AssertionError("an LM was called before the argument error")


@pytest.fixture
def reflection_lm():
    return CountingLM()


def make(reflection_lm, **kwargs):
    kwargs.setdefault("max_metric_calls", 100)
    return BatchedGEPA(metric=sim.metric, reflection_lm=reflection_lm, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"p": 0}, "p must be an int >= 1"),
        ({"p": 2.5}, "p must be an int >= 1"),
        ({"n": -1}, "n must be an int >= 1"),
        ({"n": True}, "n must be an int >= 1"),
        ({"num_threads": 0}, "num_threads must be an int >= 1"),
        ({"reflection_minibatch_size": 0}, "reflection_minibatch_size must be an int >= 1"),
        ({"auto": "light"}, "Set one budget"),
        ({"max_full_evals": 2}, "Set one budget"),
        ({"max_metric_calls": 0}, "max_metric_calls must be an int >= 1"),
        ({"selection": "worst"}, "selection='worst' is not understood"),
        ({"candidate_selection_strategy": "random"}, "candidate_selection_strategy='random' is unknown"),
        ({"gepa_kwargs": {"sampling_strategy": object()}}, "pass p=... and n=..."),
        ({"gepa_kwargs": {"batch_sampler": object()}}, "gepa_kwargs may not set ['batch_sampler']"),
        ({"gepa_kwargs": {"sampling_strategy": PxNSampling(2, 2)}, "p": 4}, "Pass p and n, or gepa_kwargs"),
        ({"gepa_kwargs": {"selection_strategy": BestImprovement()}, "selection": "all"}, "Pass selection=... or"),
    ],
)
def test_bad_arguments_are_named(reflection_lm, kwargs, message):
    with pytest.raises(ValueError) as error:
        make(reflection_lm, **kwargs)
    assert message in str(error.value)


def test_gepas_own_strategies_in_gepa_kwargs_are_read_as_batched_gepas_arguments(reflection_lm):
    """dspy.GEPA's docs name gepa's sampling and selection strategies, callbacks and stoppers for gepa_kwargs."""
    stopper, callback = (lambda state: False), object()
    optimizer = make(reflection_lm, gepa_kwargs={"sampling_strategy": PxNSampling(3, 2), "callbacks": [callback],
                                                 "selection_strategy": BestImprovement(), "stop_callbacks": stopper})
    settings = optimizer.settings
    assert (settings.p, settings.n) == (3, 2) and isinstance(settings.selection, BestImprovement)
    assert settings.callbacks == (callback,) and settings.stop_callbacks == (stopper,) and dict(settings.gepa_kwargs) == {}
    for sampling, shape in ((SingleMutationSampling(), (1, 1)), (SameParentSampling(4), (1, 4)),
                            (IndependentSampling(4), (4, 1))):
        optimizer = make(reflection_lm, gepa_kwargs={"sampling_strategy": sampling})
        assert (optimizer.settings.p, optimizer.settings.n) == shape


def test_metric_without_gepa_or_dspy_signature(reflection_lm):
    def two_argument_metric(gold, pred):
        return 1.0

    with pytest.raises(TypeError, match=r"GEPA feedback signature .*pred_name=None.*\(gold, pred, trace=None\)"):
        BatchedGEPA(metric=two_argument_metric, max_metric_calls=100, reflection_lm=reflection_lm)

    def four_required(gold, pred, trace, pred_name):
        return 1.0

    with pytest.raises(TypeError, match=r"calling it with 3 or 5 arguments fails.*trace=None"):
        BatchedGEPA(metric=four_required, max_metric_calls=100, reflection_lm=reflection_lm)


def test_no_reflection_lm_and_no_default():
    with dspy.context(lm=None):
        with pytest.raises(ValueError, match=r"No reflection LM: pass reflection_lm=.* dspy.configure\(lm=...\)"):
            BatchedGEPA(metric=sim.metric, max_metric_calls=100)


def test_default_lm_is_used_as_reflection_lm(splits):
    lm = sim.SimulatedLM()
    with dspy.context(lm=lm):
        BatchedGEPA(metric=sim.metric, max_metric_calls=40).compile(seed_program(), trainset=splits.train,
                                                                    valset=splits.val[:6])
    assert lm.stats()["calls"]["reflection"] >= 1


@pytest.mark.parametrize(
    ("compile_kwargs", "error", "message"),
    [
        ({"trainset": []}, ValueError, "trainset must be a non-empty list"),
        ({"valset": []}, ValueError, "valset must be a non-empty list"),
        ({"trainset": [{"question": "q"}]}, TypeError, r"trainset\[0\] must be a dspy.Example"),
        ({"trainset": [dspy.Example(question="q", answer="1")]}, ValueError, r"trainset\[0\] has no input fields"),
        ({"teacher": seed_program()}, ValueError, "teacher is not supported"),
    ],
)
def test_bad_datasets(reflection_lm, splits, compile_kwargs, error, message):
    kwargs = {"trainset": splits.train, "valset": splits.val, **compile_kwargs}
    with pytest.raises(error, match=message):
        make(reflection_lm).compile(seed_program(), **kwargs)


def test_program_without_predictors(reflection_lm, splits):
    class NoPredictors(dspy.Module):
        def forward(self, question):
            return dspy.Prediction(answer="1")

    with pytest.raises(ValueError, match="student has nothing to optimize"):
        make(reflection_lm).compile(NoPredictors(), trainset=splits.train, valset=splits.val)
    with pytest.raises(TypeError, match="student must be a dspy.Module"):
        make(reflection_lm).compile(lambda question: question, trainset=splits.train, valset=splits.val)
