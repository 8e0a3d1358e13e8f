"""A tracking backend that fails in any way never aborts a search, and never changes what the search finds.

The MLflow stand-in is DSPy's own (``tests/teleprompt/test_gepa.py`` runs dspy.GEPA with
``use_mlflow=True`` against a ``MagicMock`` in ``sys.modules["mlflow"]``). It is installed with
``monkeypatch.setitem``, which restores that one entry: ``mock.patch.dict`` would restore the
whole of ``sys.modules`` and drop every module first imported during the test, and a C
extension imported twice in one process can crash it later.
"""

import logging
import sys
from unittest import mock

import pytest

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.engine.tracker import TrackingArgumentError
from tests.compiling import compile_sim
from tests.conftest import seed_program

# One deterministic search (the step loop), on the task_lm fixture's LM, tracked in one way or another.
SEARCH = {"p": 2, "n": 2, "max_metric_calls": 120, "schedule": "steps"}


def instructions(program):
    return [c.predict.signature.instructions for c in program.detailed_results.candidates]


@pytest.fixture
def untracked(task_lm, splits):
    return instructions(compile_sim(splits=splits, tracker=False, **SEARCH).program)


@pytest.fixture
def mock_mlflow(monkeypatch):
    stand_in = mock.MagicMock()
    stand_in.active_run.return_value = None
    monkeypatch.setitem(sys.modules, "mlflow", stand_in)
    return stand_in


def test_a_mocked_mlflow_module_leaves_the_search_untouched(untracked, splits, mock_mlflow, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        program = compile_sim(splits=splits, use_mlflow=True, log_dir=str(tmp_path), **SEARCH).program
    assert instructions(program) == untracked
    assert program.detailed_results.mlflow_run_id is None
    assert "MLflow tracking stopped" in caplog.text
    assert (tmp_path / "steps.jsonl").is_file()  # the log directory still keeps the run


class Broken:
    """A tracker, or its run, failing at one chosen moment."""

    def __init__(self, fails_at):
        self.fails_at = fails_at
        self.run_id, self.log_dir = "r1", None

    def _maybe_fail(self, moment):
        if moment == self.fails_at:
            raise RuntimeError(f"tracking backend down at {moment}")

    def start(self, description, *, log_dir, usage):
        self._maybe_fail("start")
        return self

    @property
    def gepa_callbacks(self):
        return [self]

    def on_iteration_end(self, event):
        self._maybe_fail("gepa callback")

    def on_step(self, record):
        self._maybe_fail("step")

    def finish(self, program, results):
        self._maybe_fail("finish")

    def fail(self, error):
        self._maybe_fail("fail")


@pytest.mark.parametrize("fails_at", ["start", "gepa callback", "step", "finish"])
def test_a_tracker_that_raises_is_a_warning_not_a_failed_compile(untracked, splits, fails_at, caplog):
    with caplog.at_level(logging.WARNING):
        program = compile_sim(splits=splits, tracker=Broken(fails_at), **SEARCH).program
    assert instructions(program) == untracked
    assert f"tracking backend down at {fails_at}" in caplog.text


def test_a_tracker_that_returns_no_tracked_run_is_ignored(untracked, splits, caplog):
    class ReturnsNothing(Broken):
        def start(self, description, *, log_dir, usage):
            return None

    with caplog.at_level(logging.WARNING):
        program = compile_sim(splits=splits, tracker=ReturnsNothing(None), **SEARCH).program
    assert instructions(program) == untracked and program.detailed_results.mlflow_run_id is None
    assert "not a TrackedRun" in caplog.text


def test_a_failed_search_is_still_reported_when_the_tracker_fails_too(task_lm, splits):
    class MetricBug(Exception):
        pass

    def broken_metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        raise MetricBug("the metric itself is broken")

    train, val, _ = splits
    with pytest.raises(ValueError, match="gave no usable score"):
        BatchedGEPA(metric=broken_metric, max_metric_calls=100, reflection_lm=sim.SimulatedLM(),
                    tracker=Broken("fail")).compile(seed_program(), trainset=train, valset=val)


def test_contradictory_tracking_arguments_still_fail_before_the_search(task_lm, splits, tmp_path):
    from dspy_pxn.tracking import MlflowTracker, sweep

    with sweep("grid", tracking_uri=f"sqlite:///{tmp_path}/a.db", log_dir=str(tmp_path / "sweep")):
        with pytest.raises(TrackingArgumentError, match="differs from the enclosing sweep"):
            compile_sim(splits=splits, tracker=MlflowTracker(tracking_uri=f"sqlite:///{tmp_path}/b.db"), **SEARCH)
