"""The bad input battery: each case is a clear error before any LM call, or a per-rollout failure
reported with the example and the cause (scored failure_score, counted once) — never a traceback from
inside gepa. The decision per case is documented in ``dspy_pxn.checks``.
"""

from __future__ import annotations

import logging
import math
import os

import dspy
import numpy as np
import pytest

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim


class NoCallLM(sim.SimulatedLM):
    def forward(self, *args, **kwargs):
        raise AssertionError("an LM was called before the argument error")


@pytest.fixture
def splits():
    return sim.make_splits(seed=0, train=20, val=6, test=6)


def metric_returning(value_for):
    def metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        outcome = sim.metric(gold, pred, trace, pred_name, pred_trace)
        return value_for(gold, outcome)
    return metric


def odd(gold) -> bool:
    return int(gold.answer) % 2 == 1


def run(splits, metric, program=None, **kwargs):
    optimizer = BatchedGEPA(metric=metric, max_metric_calls=40, num_threads=4, failure_score=0.0,
                            reflection_lm=sim.SimulatedLM(), **kwargs)
    with dspy.context(lm=sim.SimulatedLM()):
        return optimizer.compile(program or sim.seed_program(), trainset=splits.train, valset=splits.val)


def raise_key_error(gold, outcome):
    raise KeyError("label")


# ----------------------------------------------------------------------------- per-rollout failures
@pytest.mark.parametrize(
    ("case", "value_for", "message"),
    [
        ("raises", lambda g, o: raise_key_error(g, o) if odd(g) else o, "Metric raised on an example"),
        ("None", lambda g, o: None if odd(g) else o, "returned no score (None)"),
        ("NaN", lambda g, o: math.nan if odd(g) else o, "returned nan, not a finite number"),
        ("inf", lambda g, o: dspy.Prediction(score=math.inf, feedback="") if odd(g) else o, "returned inf"),
        ("string", lambda g, o: "great" if odd(g) else o, "returned str 'great' instead of a number"),
    ],
)
def test_a_bad_metric_result_fails_that_rollout_only(splits, caplog, case, value_for, message):
    with caplog.at_level(logging.WARNING, logger="dspy_pxn"):
        result = run(splits, metric_returning(value_for)).detailed_results
    warnings = [r.getMessage() for r in caplog.records if message in r.getMessage()]
    bad_val = [ex for ex in splits.val if odd(ex)]
    assert bad_val and len(warnings) == 1  # one line per kind of metric failure, not one per rollout
    # The warning names a failing example and says what it was scored.
    assert any(f"question={ex.question!r}" in warnings[0] for ex in bad_val) and "scoring it 0.0" in warnings[0]
    # gepa got finite numbers only; each bad rollout scored failure_score and counted once.
    seed_scores = result.val_subscores[0]
    seed_scores = list(seed_scores.values()) if isinstance(seed_scores, dict) else list(seed_scores)
    assert len(seed_scores) == len(splits.val) and all(math.isfinite(s) for s in seed_scores)
    assert [s for s, ex in zip(seed_scores, splits.val) if odd(ex)] == [0.0] * len(bad_val)
    assert all(math.isfinite(v) for v in result.val_aggregate_scores)
    assert result.total_metric_calls == len(splits.val) + sum(s.rollouts for s in result.steps) <= 40


def test_a_score_outside_0_1_is_kept_with_one_warning(splits, caplog):
    with caplog.at_level(logging.WARNING, logger="dspy_pxn"):
        result = run(splits, metric_returning(lambda g, o: dspy.Prediction(score=o.score * 10, feedback=o.feedback)))
    warnings = [r.getMessage() for r in caplog.records if "outside [0, 1]" in r.getMessage()]
    assert len(warnings) == 1 and "perfect_score" in warnings[0]
    assert max(result.detailed_results.val_aggregate_scores) > 1.0  # kept, not clipped or failed


def test_bool_scores_are_accepted_silently(splits, caplog):
    with caplog.at_level(logging.WARNING, logger="dspy_pxn"):
        run(splits, metric_returning(lambda g, o: o.score == 1.0))
    assert not [r for r in caplog.records if "Metric" in r.getMessage()]


@pytest.mark.parametrize("to_number", [np.float32, np.float64, np.int64, np.bool_, np.array],
                         ids=["float32", "float64", "int64", "bool_", "0-d array"])
@pytest.mark.parametrize("in_a_prediction", [False, True], ids=["number", "Prediction(score=...)"])
def test_a_numpy_score_is_a_real_number_converted_to_a_float_once(splits, caplog, to_number, in_a_prediction):
    """dspy.GEPA adds numpy scores up (np.isclose gives np.bool_): here too, with no warning and the same result."""
    def returning(number):
        def metric(gold, outcome):
            score = number(outcome.score)
            return dspy.Prediction(score=score, feedback=outcome.feedback) if in_a_prediction else score
        return metric_returning(metric)

    plain = run(splits, returning(float), p=1, n=1).detailed_results
    with caplog.at_level(logging.WARNING, logger="dspy_pxn"):
        result = run(splits, returning(to_number), p=1, n=1).detailed_results
    assert not [r for r in caplog.records if "Metric" in r.getMessage()]
    assert result.val_aggregate_scores == plain.val_aggregate_scores
    assert all(type(score) is float for subscores in result.val_subscores for score in subscores.values())


def test_an_object_holding_a_score_is_read_as_its_score(splits):
    """Not only a dspy.Prediction: any object with a ``score`` (a dataclass, a namespace) is scored by it."""
    from types import SimpleNamespace

    plain = run(splits, metric_returning(lambda g, o: o.score), p=1, n=1).detailed_results
    held = run(splits, metric_returning(lambda g, o: SimpleNamespace(score=np.float32(o.score))), p=1,
               n=1).detailed_results
    assert held.val_aggregate_scores == plain.val_aggregate_scores


def test_a_program_that_raises_on_some_inputs_fails_those_rollouts(splits, caplog):
    class Picky(dspy.Module):
        def __init__(self):
            super().__init__()
            self.cot = sim.seed_program()

        def forward(self, question):
            if "1." in question or "3." in question:
                raise RuntimeError("cannot handle this question")
            return self.cot(question=question)

    with caplog.at_level(logging.WARNING, logger="dspy_pxn"):
        result = run(splits, sim.metric, Picky()).detailed_results
    warnings = [r.getMessage() for r in caplog.records if "Program raised on an example" in r.getMessage()]
    assert warnings and all("question=" in w and "RuntimeError: cannot handle this question" in w for w in warnings)
    assert result.total_metric_calls == len(splits.val) + sum(s.rollouts for s in result.steps)


class Broken(dspy.Module):
    """A program that raises on every example but the ones ``spared`` names: broken, not badly prompted."""

    def __init__(self, spared: str = "never"):
        super().__init__()
        self.cot = sim.seed_program()
        self.spared = spared

    def forward(self, question):
        if self.spared not in question:
            return self.missing_helper(question)  # an AttributeError, raised in the program's own code
        return self.cot(question=question)


@pytest.mark.parametrize("schedule", ["steps", "async"])
def test_a_seed_that_raises_on_every_validation_example_stops_the_run_with_the_programs_own_exception(
        splits, schedule):
    lm = sim.SimulatedLM()
    optimizer = BatchedGEPA(metric=sim.metric, max_metric_calls=60, p=2, n=1, schedule=schedule,
                            reflection_lm=sim.SimulatedLM())
    with dspy.context(lm=lm), pytest.raises(AttributeError, match="missing_helper") as raised:
        optimizer.compile(Broken(), trainset=splits.train, valset=splits.val)
    notes = "\n".join(getattr(raised.value, "__notes__", []))
    if hasattr(raised.value, "add_note"):  # Python 3.11+: the exception says which example and where
        assert f"raised on {len(splits.val)} of the {len(splits.val)} validation examples" in notes
        assert "question='Apply rule" in notes and "test_bad_input.py" in notes and "in forward" in notes
    assert raised.traceback[-1].name == "__getattr__" or "forward" in [entry.name for entry in raised.traceback]
    assert lm.stats()["calls"]["reflection"] == 0  # no search on a broken program


def test_a_seed_that_raises_on_some_validation_examples_is_searched_as_under_dspy_gepa(splits):
    """Occasional failures keep dspy.GEPA's behaviour: scored as failures, logged, the search goes on."""
    spared = splits.val[0].question.split()[2]  # the rule of the first example: the program answers its questions
    assert sum(spared in example.question for example in splits.val) >= 1
    result = run(splits, sim.metric, Broken(spared=spared)).detailed_results
    assert len(result.candidates) >= 1 and result.total_metric_calls > len(splits.val)


# ----------------------------------------------------------------------------- errors up front
def test_examples_a_forward_cannot_take_are_refused_up_front(splits):
    """A forward that names its parameters fails on every such example under dspy.GEPA too: refused here, early."""
    optimizer = BatchedGEPA(metric=sim.metric, max_metric_calls=40, reflection_lm=NoCallLM())

    class Named(dspy.Module):
        def __init__(self):
            super().__init__()
            self.cot = sim.seed_program()

        def forward(self, question, context):
            return self.cot(question=question)

    with dspy.context(lm=NoCallLM()):
        with pytest.raises(ValueError, match=r"trainset\[0\] does not match the program's forward\(question, context\) "
                                             r"\(missing a required argument: 'context'\).*with_inputs"):
            optimizer.compile(Named(), trainset=splits.train, valset=splits.val)


def test_examples_missing_a_predictors_input_fields_warn_and_run_as_dspys_predict_does(splits, caplog):
    """ChainOfThought takes **kwargs: nothing is guessed, and DSPy's Predict warns and runs without the field."""
    renamed = [dspy.Example(query=ex.question, answer=ex.answer).with_inputs("query") for ex in splits.val]
    with dspy.context(lm=sim.SimulatedLM()), caplog.at_level(logging.WARNING, logger="dspy_pxn"):
        best = BatchedGEPA(metric=sim.metric, max_metric_calls=40, p=1, n=1, reflection_lm=sim.SimulatedLM()).compile(
            sim.seed_program(), trainset=splits.train, valset=renamed)
    assert sum("valset[0] declares inputs ['query'], without ['question']" in r.getMessage()
               for r in caplog.records) == 1
    assert best.detailed_results.total_metric_calls <= 40


def test_a_log_dir_that_is_not_writable_is_refused_up_front(splits, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    optimizer = BatchedGEPA(metric=sim.metric, max_metric_calls=40, reflection_lm=NoCallLM(),
                            log_dir=str(blocker / "run"))
    with dspy.context(lm=NoCallLM()):
        with pytest.raises(ValueError, match=r"log_dir='.*a-file/run' is not a writable directory .*log_dir=None"):
            optimizer.compile(sim.seed_program(), trainset=splits.train, valset=splits.val)
    if os.geteuid() != 0:  # root writes anywhere: the read-only case only means something for other users
        readonly = tmp_path / "ro"
        readonly.mkdir(mode=0o500)
        optimizer = BatchedGEPA(metric=sim.metric, max_metric_calls=40, reflection_lm=NoCallLM(), log_dir=str(readonly))
        with dspy.context(lm=NoCallLM()), pytest.raises(ValueError, match="is not a writable directory"):
            optimizer.compile(sim.seed_program(), trainset=splits.train, valset=splits.val)


def test_program_outputs_in_gepas_saved_state_are_serialized(splits, tmp_path):
    """track_best_outputs keeps dspy.Predictions in gepa's state, which plain pickle cannot save into
    log_dir (dspy.GEPA dies there after the seed validation); BatchedGEPA switches gepa to cloudpickle."""
    log_dir = str(tmp_path / "run")
    result = run(splits, sim.metric, log_dir=log_dir, track_best_outputs=True).detailed_results
    assert os.path.getsize(os.path.join(log_dir, "gepa_state.bin")) > 0
    assert result.best_outputs_valset is not None
