"""One rollout: run a program on one example and score it, every failure turned into a score.

A rollout is the unit the worker pool runs (a module-level function with picklable
arguments, so a remote pool can ship it) and the unit the budget counts: one metric call.
"""

from __future__ import annotations

import hashlib
import json
import logging
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
from dspy_pxn.ledger.ledger import BilledTracker, RunLedger
from dspy_pxn.memo import LruMemo

logger = logging.getLogger(__name__)


@dataclass
class RolloutResult:
    """One example's outcome. ``trace`` is None when traces were not requested or the program raised."""

    prediction: Any
    score: Any
    trace: list | None
    error: str | None = None


def run_rollout(
    program: dspy.Module,
    example: Example,
    metric: Callable[..., Any],
    capture_trace: bool,
    failure_score: float,
    code_components: bool = False,
) -> RolloutResult:
    """Run the program on one example and score it, turning every failure into a score.

    Mirrors what dspy's ``Evaluate``/``bootstrap_trace_data`` make of a failure so
    that gepa sees the same numbers as under dspy.GEPA: a parse failure becomes a
    ``FailedPrediction`` in the trace (reflection shows the raw completion), any
    other exception scores ``failure_score`` and leaves no trajectory.

    A program with ``dspy.Flex`` code components (``code_components``) is scored as
    dspy.GEPA scores it (``gepa_flex_utils.evaluate_with_trace``): the execution trace is
    always captured and handed to a metric that declares ``program_trace``, its ``trace``
    stays None, and a crash becomes a trajectory, so the code proposer reads what broke.
    """
    trace_wanted = capture_trace or code_components
    with dspy.context(trace=[] if trace_wanted else None):
        try:
            prediction = call_program(program, example.inputs())
        except AdapterParseError as error:
            if not trace_wanted:
                return RolloutResult(Prediction(), failure_score, None, f"{type(error).__name__}: {error}")
            trace = list(dspy.settings.trace)
            predictor = next((p for p in program.predictors() if p.signature == error.signature), None)
            failed = FailedPrediction(completion_text=error.lm_response, format_reward=failure_score)
            if predictor is not None:
                trace.append((predictor, example.inputs().toDict(), failed))
            return RolloutResult(failed, failure_score, trace if capture_trace else None, f"{type(error).__name__}: {error}")
        except Exception as error:  # noqa: BLE001 - a rollout failure is a score, not a crash
            logger.warning("Program raised on an example (%s); scoring it %s: %s: %s",
                           checks.describe_example(example), failure_score, type(error).__name__, error)
            described = f"{type(error).__name__}: {error}"
            if code_components and capture_trace:
                return RolloutResult(FailedPrediction(completion_text=described), failure_score,
                                     list(dspy.settings.trace), described)
            return RolloutResult(None if capture_trace else Prediction(), failure_score, None, described)
        trace = list(dspy.settings.trace) if trace_wanted else None
    try:
        if code_components:
            score = metric(example, prediction, **_metric_scoring_kwargs(metric, trace))
        else:
            score = metric(example, prediction, trace)
    except Exception as error:  # noqa: BLE001
        checks.warn_once_per_metric(metric, "raised", "Metric raised on an example (%s); scoring it %s: %s: %s",
                                    checks.describe_example(example), failure_score, type(error).__name__, error)
        # No trajectory: reflection would call the metric on it again, for feedback.
        return RolloutResult(prediction, failure_score, None, f"{METRIC_PROBLEM}{type(error).__name__}: {error}")
    problem = checks.metric_score_problem(score, metric)
    if problem is not None:
        checks.warn_once_per_metric(metric, "score", "Metric %s on an example (%s); scoring it %s.",
                                    problem, checks.describe_example(example), failure_score)
        return RolloutResult(prediction, failure_score, None, f"{METRIC_PROBLEM}{problem}")
    return RolloutResult(prediction, score, trace if capture_trace else None)


def candidate_key(candidate: dict[str, str]) -> str:
    """A candidate's identity: the same texts under the same names, whatever their order."""
    return hashlib.sha256(json.dumps(sorted(candidate.items())).encode()).hexdigest()


# RolloutResult.error starts with this when the metric, not the program, failed.
METRIC_PROBLEM = "metric "
# Built programs a rollout function keeps, per process (the candidates a run's recent steps evaluate).
PROGRAMS_KEPT = 128


class CandidateRollouts:
    """The pool's rollout function: a (candidate, example, capture-trace) task, run and scored.

    A task names its candidate (a few strings), not a built program: a remote pool then ships
    this object once per run rather than a program per batch, and every process builds each
    candidate once rather than once per evaluation (building deep-copies the student and makes
    a new signature class per predictor). Built programs are shared by the rollouts of their
    candidate, as dspy's ``Evaluate`` shares one program across its threads.
    """

    def __init__(
        self,
        build: Callable[[dict[str, str]], dspy.Module],
        metric: Callable[..., Any],
        failure_score: float,
        code_components: bool = False,
    ):
        self.build = build
        self.metric = metric
        self.failure_score = failure_score
        self.code_components = code_components
        self._programs: LruMemo[dspy.Module] = LruMemo(PROGRAMS_KEPT)

    def program(self, candidate: dict[str, str]) -> dspy.Module:
        """The candidate's program, built on first use; a candidate that cannot be built raises."""
        return self._programs.get(candidate_key(candidate), lambda: self.build(candidate))

    def __call__(self, task: tuple[dict[str, str], Example, bool]) -> RolloutResult:
        candidate, example, capture = task
        return run_rollout(self.program(candidate), example, self.metric, capture, self.failure_score,
                           self.code_components)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_programs"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _programs=LruMemo(PROGRAMS_KEPT))


def metric_fails_everywhere(results: Sequence[RolloutResult], metric: Callable[..., Any]) -> None:
    """Refuse a metric that gave no usable score on any rollout of the seed's validation.

    Such a run would score every candidate ``failure_score`` and optimize nothing while
    looking busy; the per-rollout warnings would scroll past. The first evaluation of a
    run is the seed on the whole valset, so this runs once, right after it.
    """
    if not results or not all((r.error or "").startswith(METRIC_PROBLEM) for r in results):
        return
    name = getattr(metric, "__name__", type(metric).__name__)
    raise ValueError(
        f"The metric {name} gave no usable score on any of the seed program's {len(results)} validation "
        f"examples: {results[0].error.removeprefix(METRIC_PROBLEM)}. Fix the metric so it returns a number "
        "(or dspy.Prediction(score=<number>, feedback=<text>)) and does not raise, then run again."
    )


def call_program(program: Any, inputs: dict[str, Any]) -> Any:
    """Call a program in a rollout the way DSPy's evaluators do, usage included.

    With ``track_usage=True`` (``dspy.configure(track_usage=True)``; ``mlflow.dspy.autolog``
    turns it on for the process) DSPy attaches each prediction's LM usage
    (``pred.get_lm_usage()``, which cost-aware metrics read) only when no usage tracker is
    active, and a run's ledger is one. So the rollout gets a tracker of its own, whose
    totals are attached to the prediction as DSPy would attach them and whose entries the
    run's ledger bills as they come: every call counted exactly, whatever the program returns.
    """
    ledger = dspy.settings.usage_tracker
    if not (dspy.settings.track_usage and isinstance(ledger, RunLedger)):
        return program(**inputs)
    rollout = BilledTracker(ledger)
    with dspy.context(usage_tracker=rollout):
        prediction = program(**inputs)
    attach = getattr(program, "_set_lm_usage", None)  # dspy.Module's own: a Prediction, or (Prediction, trace)
    if callable(attach):
        attach(rollout.get_total_tokens(), prediction)
    return prediction
