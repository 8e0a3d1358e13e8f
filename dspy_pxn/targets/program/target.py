"""A DSPy program as what a run optimizes: ``BatchedGEPA.compile``'s target (``dspy_pxn.engine.target``).

Everything of a compile that knows it is a DSPy program lives here: the seed candidate read from the program's
predictors, the checks of its examples, the ``BatchedAdapter`` its rollouts run on (dspy.GEPA's own adapter, pooled),
and the program returned with its held-out score and ``detailed_results``, as dspy.GEPA returns it.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import dspy
from dspy.primitives import Module
from dspy.teleprompt.gepa.gepa import DspyGEPAResult

from dspy_pxn import checks
from dspy_pxn.engine.events import StepEvents
from dspy_pxn.engine.result import BatchedGEPAResult
from dspy_pxn.engine.resume import Checkpoint
from dspy_pxn.engine.target import TargetData, TargetShape
from dspy_pxn.engine.tracker import around_compile, quietly
from dspy_pxn.ledger import feed
from dspy_pxn.ledger.ledger import warn_if_answered_from_cache
from dspy_pxn.pools import WorkerPool
from dspy_pxn.targets.program import components, metrics
from dspy_pxn.targets.program.adapter import BatchedAdapter
from dspy_pxn.targets.program.holdout import holdout_score

if TYPE_CHECKING:  # types only: the run imports targets, never the other way round
    from gepa.core.result import GEPAResult

    from dspy_pxn.engine.run import Live, Run
    from dspy_pxn.settings import Settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProgramTarget:
    """A DSPy program and the metric it is scored with."""

    student: Module
    metric: Callable[..., Any]  # the run's GEPA feedback metric (dspy_pxn.targets.program.metrics.resolve)
    seed_candidate: dict[str, str]
    code_components: tuple[str, ...]

    @classmethod
    def of(cls, settings: Settings, student: Module) -> ProgramTarget:
        """The program checked, its seed candidate and its metric (the optimizer's, or ``program.metric``)."""
        seed = components.seed_candidate(student) if isinstance(student, Module) else {}
        checks.program(student, list(seed))
        metric = metrics.resolve(settings.metric, student)
        return cls(student, metric, seed, tuple(components.code_components(student)))

    def prepare(self, settings: Settings, trainset: Any, valset: Any, testset: Any) -> TargetData:
        trainset = checks.dataset("trainset", trainset)
        if valset is None:
            logger.warning("No valset given: using the trainset for validation (scores will be optimistic).")
        valset = checks.dataset("valset", valset) if valset is not None else trainset
        checks.examples_match_program(self.student, trainset=trainset, valset=valset, testset=testset)
        predictor_lms = [predictor.lm for _, predictor in self.student.named_predictors()
                         if getattr(predictor, "lm", None) is not None]
        shape = TargetShape(name=type(self.student).__name__, components=len(self.student.named_predictors()),
                            task_lms=tuple(predictor_lms or [dspy.settings.lm]),
                            input_example=dict(valset[0].inputs().items()))
        return TargetData(trainset, valset, testset, shape, lms=(dspy.settings.lm, self.student))

    def around_search(self) -> AbstractContextManager[Any]:
        return around_compile()

    def adapter(self, settings: Settings, pool: WorkerPool, events: StepEvents, reflection_examples: int,
                checkpoint: Checkpoint) -> BatchedAdapter:
        checks.warn_if_no_timeout("task", dspy.settings.lm)
        return BatchedAdapter(
            student_module=self.student, metric_fn=self.metric,
            feedback_map={name: metrics.feedback_function(self.metric, name, predictor)
                          for name, predictor in self.student.named_predictors()},
            failure_score=settings.failure_score, num_threads=pool.num_workers,
            add_format_failure_as_feedback=settings.add_format_failure_as_feedback,
            rng=random.Random(settings.seed),  # which of a predictor's calls reflection reads, seeded as in dspy.GEPA
            reflection_lm=None,  # PooledReflection sets the reflection LM per call
            custom_instruction_proposer=settings.instruction_proposer, custom_code_proposer=settings.code_proposer,
            warn_on_score_mismatch=settings.warn_on_score_mismatch, reflection_minibatch_size=reflection_examples,
            pool=pool, events=events, reflection_examples=reflection_examples, checkpoint=checkpoint,
        )

    def result(self, run: Run, gepa_result: GEPAResult, live: Live, stopped_by: str) -> Module:
        """The best program, as dspy.GEPA returns it, with ``detailed_results`` when ``track_stats``."""
        settings = run.settings
        wall_s, tally = live.ledger.elapsed(), live.ledger.tally()
        program = live.adapter.build_program(gepa_result.best_candidate)
        feed.leave_unfed(program)
        if tally.unheld:  # their dollars count; their calls and retries cannot be heard
            logger.warning("%d LM calls came from an LM the program does not hold (a module-level LM or one made in "
                           "forward): their tokens and dollars are in the usage totals, but they are not in "
                           "lm_call_counts. Hold that LM on the program (predictor.set_lm(lm), or an attribute of a "
                           "module) to count them.", tally.unheld)
        test_score = (holdout_score(program, run.testset, self.metric, live.pool, settings.failure_score)
                      if run.testset else None)
        metric_calls = getattr(gepa_result, "total_metric_calls", None)
        if isinstance(metric_calls, int):
            warn_if_answered_from_cache(tally.usage, metric_calls)
        run_id = getattr(live.tracked_run, "run_id", None)  # the tracked run's id, if it is one a user can look up
        details = None
        try:
            base = DspyGEPAResult.from_gepa_result(gepa_result, live.adapter)
        except AttributeError as missing:  # a stand-in for gepa.optimize, as in tests, may return less
            logger.warning("gepa's result has no %s: the optimized program is returned without detailed_results.",
                           missing.name)
        else:
            details = BatchedGEPAResult(
                **{f.name: getattr(base, f.name) for f in fields(DspyGEPAResult)},
                steps=tuple(live.recorder.steps), budget=run.shape.budget, num_workers=live.pool.num_workers,
                wall_s=wall_s, test_score=test_score, usage=tally.usage, lm_call_counts=tally.counts,
                mlflow_run_id=run_id if isinstance(run_id, str) else None, stopped_by=stopped_by,
            )
            if settings.track_stats:
                program.detailed_results = details
        if live.tracked_run is not None:
            quietly("finish", lambda: live.tracked_run.finish(program, details))
        return program
