"""One rollout: run a program on one example and score it, every failure turned into a score.

A rollout is the unit the worker pool runs (picklable, so a remote pool can ship it) and the unit the budget counts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import pickle
import sysconfig
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import dspy
from dspy.primitives import Example, Prediction
from dspy.teleprompt.bootstrap_trace import FailedPrediction

# Private in dspy: how dspy.GEPA hands a dspy.Flex program's execution trace to the metric; no public way.
from dspy.teleprompt.gepa.gepa_flex_utils import _metric_scoring_kwargs
from dspy.utils.exceptions import AdapterParseError

from dspy_pxn import checks
from dspy_pxn.ledger.ledger import RUNNING_PROGRAM, BilledTracker, RunLedger

logger = logging.getLogger(__name__)


@dataclass
class RolloutResult:
    """One example's outcome. ``trace`` is None when traces were not requested or the program raised; ``error`` says
    what failed (the program, or the metric: it then starts with ``METRIC_PROBLEM``); ``raised`` is the program's own
    exception and ``where`` the line it was raised at, for a run whose seed program raises nearly everywhere
    (``check_seed_validation``). A result from a remote pool leaves behind an exception that would not survive the
    trip (its ``where`` stays)."""

    prediction: Any
    score: Any
    trace: list | None
    error: str | None = None
    raised: BaseException | None = None
    where: str | None = None  # set only when the program itself raised (not the metric, nor an unparsed reply)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if state["raised"] is not None:
            try:  # a user's exception class may not unpickle (an __init__ with other arguments)
                pickle.loads(pickle.dumps(state["raised"]))
            except Exception:  # noqa: BLE001 - then only its description travels
                state["raised"] = None
        return state


def run_rollout(program: dspy.Module, example: Example, metric: Callable[..., Any], capture_trace: bool,
                failure_score: float, code_components: bool = False) -> RolloutResult:
    """Run the program on one example and score it, as under ``dspy.Evaluate`` and dspy.GEPA.

    The trace is a list (``dspy.BestOfN`` and ``dspy.Refine`` extend it), a fresh one per rollout, kept only when
    reflection reads it. The metric's ``trace`` is None, as dspy.GEPA's evaluators call it, traced or not
    (``Evaluate`` passes none, ``bootstrap_trace_data`` none of its own); reflection's feedback calls get the trace
    (``metrics.feedback_function``). A parse failure becomes a ``FailedPrediction`` in the trace (reflection shows the
    raw completion), any other exception scores ``failure_score`` and leaves no trajectory. Every score is a float.

    A program with ``dspy.Flex`` code is scored as dspy.GEPA scores it (``gepa_flex_utils.evaluate_with_trace``): the
    execution trace always goes to a metric that declares ``program_trace``, its ``trace`` stays None, and a crash
    becomes a trajectory, for the code proposer to read.
    """
    keep_trace = capture_trace or code_components
    with dspy.context(trace=[]):
        try:
            prediction = call_program(program, example.inputs())
        except AdapterParseError as error:
            described = f"{type(error).__name__}: {error}"
            if not keep_trace:
                return RolloutResult(Prediction(), failure_score, None, described)
            trace = list(dspy.settings.trace)
            predictor = next((p for p in program.predictors() if p.signature == error.signature), None)
            failed = FailedPrediction(completion_text=error.lm_response, format_reward=failure_score)
            if predictor is not None:
                trace.append((predictor, example.inputs().toDict(), failed))
            return RolloutResult(failed, failure_score, trace if capture_trace else None, described)
        except Exception as error:  # noqa: BLE001 - a rollout failure is a score, not a crash
            logger.warning("Program raised on an example (%s); scoring it %s: %s: %s",
                           checks.describe_example(example), failure_score, type(error).__name__, error)
            described, where = f"{type(error).__name__}: {error}", raised_at(error)
            if code_components and capture_trace:
                return RolloutResult(FailedPrediction(completion_text=described), failure_score,
                                     list(dspy.settings.trace), described, error, where)
            return RolloutResult(None if capture_trace else Prediction(), failure_score, None, described, error, where)
        trace = list(dspy.settings.trace) if keep_trace else None
    try:
        if code_components:
            outcome = metric(example, prediction, **_metric_scoring_kwargs(metric, trace))
        else:
            outcome = metric(example, prediction, None)  # as dspy.GEPA's evaluators call it, traced or not
    except Exception as error:  # noqa: BLE001
        checks.warn_once_per_metric(metric, "raised", "Metric raised on an example (%s); scoring it %s: %s: %s",
                                    checks.describe_example(example), failure_score, type(error).__name__, error)
        # No trajectory: reflection would call the metric on it again, for feedback.
        return RolloutResult(prediction, failure_score, None, f"{METRIC_PROBLEM}{type(error).__name__}: {error}")
    score, problem = checks.scored(outcome, metric)
    if problem is not None:
        checks.warn_once_per_metric(metric, "score", "Metric %s on an example (%s); scoring it %s.",
                                    problem, checks.describe_example(example), failure_score)
        return RolloutResult(prediction, failure_score, None, f"{METRIC_PROBLEM}{problem}")
    return RolloutResult(prediction, score, trace if capture_trace else None)


def raised_at(error: BaseException) -> str:
    """Where an exception was raised: the innermost line of the user's own code on its way (a library raises
    on behalf of the line that called it), and the line that raised it when that is a library's."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "an unknown place"
    own = next((frame for frame in reversed(frames) if not _library(frame.filename)), None)
    last = frames[-1]
    where = f"{last.filename}:{last.lineno} in {last.name}"
    if own is None or own is last:
        return where
    return f"{own.filename}:{own.lineno} in {own.name} (raised in {where})"


_LIBRARIES = tuple({os.path.dirname(os.path.abspath(__file__)), *(
    sysconfig.get_paths()[name] for name in ("stdlib", "platstdlib", "purelib", "platlib"))})


def _library(filename: str) -> bool:
    """Python's, an installed package's or dspy-pxn's own file: not the code of the program being optimized."""
    return os.path.abspath(filename).startswith(_LIBRARIES) or filename.startswith("<")


def candidate_key(candidate: dict[str, str]) -> str:
    """A candidate's identity: the same texts under the same names, whatever their order."""
    return hashlib.sha256(json.dumps(sorted(candidate.items())).encode()).hexdigest()


# RolloutResult.error starts with this when the metric, not the program, failed.
METRIC_PROBLEM = "metric "
# Built programs a rollout function keeps, per process (the evaluations in flight, and recent ones).
PROGRAMS_KEPT = 128

# One rollout task: (candidate, example, capture the trace, the evaluation it belongs to).
RolloutTask = tuple[dict[str, str], Example, bool, int]


# The seed's validation rollouts that must raise (at least this share) for the run to stop with the
# program's exception: a program that raises nearly everywhere is broken, and no prompt can fix it.
BROKEN_PROGRAM_SHARE = 0.9


def check_seed_validation(results: Sequence[RolloutResult], examples: Sequence[Example],
                          metric: Callable[..., Any]) -> None:
    """Stop a run whose seed validation shows the program or the metric broken, rather than search on.

    Both would score every candidate ``failure_score``, optimize nothing while looking busy, and return the seed as
    the best program, with only per-rollout warnings scrolling past. Occasional failures are dspy.GEPA's behaviour
    and stay so: scored as failures, logged.
    """
    if not results:
        return
    raised = [(r, e) for r, e in zip(results, examples, strict=True) if r.where is not None]  # the program itself raised
    if len(raised) >= max(1, math.ceil(BROKEN_PROGRAM_SHARE * len(results))):
        first, example = raised[0]
        note = (f"The seed program raised on {len(raised)} of the {len(results)} validation examples, so the "
                f"program is broken, not its prompt: the compile stops here instead of returning the seed as its "
                f"best. The first: on the example ({checks.describe_example(example)}), {first.error}, raised at "
                f"{first.where}. Fix the program (run it on one example: program(**example.inputs())), then run "
                "again.")
        error = first.raised if first.raised is not None else RuntimeError(first.error)
        if hasattr(error, "add_note"):
            error.add_note(note)
        else:  # Python 3.10: no exception notes
            logger.error(note)
        raise error
    if all((r.error or "").startswith(METRIC_PROBLEM) for r in results):
        name = getattr(metric, "__name__", type(metric).__name__)
        raise ValueError(f"The metric {name} gave no usable score on any of the seed program's {len(results)} "
                         f"validation examples: {results[0].error.removeprefix(METRIC_PROBLEM)}. Fix the metric so it "
                         "returns a number (or dspy.Prediction(score=<number>, feedback=<text>)) and does not raise, "
                         "then run again.")


def call_program(program: Any, inputs: dict[str, Any]) -> Any:
    """Call a program in a rollout the way DSPy's evaluators do, usage included.

    With ``track_usage=True`` (``mlflow.dspy.autolog`` turns it on for the process) DSPy attaches each prediction's
    LM usage (``pred.get_lm_usage()``, which cost-aware metrics read) only when no usage tracker is active, and a
    run's ledger is one. So the rollout gets a tracker of its own, whose totals are attached to the prediction as DSPy
    would attach them and whose entries the run's ledger bills as they come, whatever the program returns.
    """
    ledger = dspy.settings.usage_tracker
    if not (dspy.settings.track_usage and isinstance(ledger, RunLedger)):
        with dspy.context(**{RUNNING_PROGRAM: True}):
            return program(**inputs)
    rollout = BilledTracker(ledger)
    with dspy.context(usage_tracker=rollout, **{RUNNING_PROGRAM: True}):
        prediction = program(**inputs)
    attach = getattr(program, "_set_lm_usage", None)  # dspy.Module's own: a Prediction, or (Prediction, trace)
    if callable(attach):
        attach(rollout.get_total_tokens(), prediction)
    return prediction
