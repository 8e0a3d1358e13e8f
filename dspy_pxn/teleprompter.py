"""BatchedGEPA: dspy.GEPA with P×N proposals per step, one worker pool, an exact budget.

The engine is gepa's; this module only wires strategies into ``gepa.optimize``:

    sampling    DistinctParentsPxN       P distinct parents × N mutations, budget-narrowed
    minibatches SequentialMinibatchSampler  fresh minibatches for every task
    reflection  PooledReflection         all P·N reflection calls at once
    adapter     BatchedAdapter           every rollout of a step on one pool of W workers
    selection   BudgetCappedSelection    all | best | top-k, never validating past the budget
    stopper     ExactBudgetStopper       stop when no useful step fits the budget
    callback    StepRecorder             one StepRecord per step (JSONL in log_dir, sinks)

Merge is off by default: a merge replaces a whole reflective step when it fires, so
with it on, a P×N run and a 1×1 run no longer spend their steps on the same kind of
work. Turn it on with ``use_merge=True``; its cost is then part of the budget guard.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import dspy
from dspy.primitives import Example, Module
from dspy.teleprompt.gepa.gepa import DspyGEPAResult
from dspy.teleprompt.gepa.gepa_utils import LoggerAdapter
from gepa import optimize
from gepa.proposer.reflective_mutation.base import CandidateSelector
from gepa.strategies.candidate_selector import (
    CurrentBestCandidateSelector,
    EpsilonGreedyCandidateSelector,
    ParetoCandidateSelector,
    TopKParetoCandidateSelector,
)
from gepa.strategies.proposal_selection import SelectionStrategy

from dspy_pxn import checks, limits, resume, tracking
from dspy_pxn.adapter import BatchedAdapter
from dspy_pxn.holdout import holdout_score
from dspy_pxn.pool import ThreadWorkerPool, WorkerPool
from dspy_pxn.reflection import PooledReflection
from dspy_pxn.steps import StepRecord, StepRecorder
from dspy_pxn.strategies import (
    BudgetCappedSelection,
    BudgetGuard,
    DistinctParentsPxN,
    ExactBudgetStopper,
    SequentialMinibatchSampler,
    selection_strategy,
    unique_minibatches,
)
from dspy_pxn.usage import UsageMeter, UsageTotals

logger = logging.getLogger(__name__)

CANDIDATE_SELECTORS: dict[str, Callable[[random.Random], CandidateSelector]] = {
    "pareto": lambda rng: ParetoCandidateSelector(rng=rng),
    "current_best": lambda rng: CurrentBestCandidateSelector(),
    "epsilon_greedy": lambda rng: EpsilonGreedyCandidateSelector(epsilon=0.1, rng=rng),
    "top_k_pareto": lambda rng: TopKParetoCandidateSelector(k=5, rng=rng),
}

# Strategies BatchedGEPA owns; passing them through gepa_kwargs would silently undo P×N or the budget.
OWNED_GEPA_KWARGS = (
    "sampling_strategy",
    "selection_strategy",
    "reflection_strategy",
    "batch_sampler",
    "max_metric_calls",
    "reflection_minibatch_size",
    "candidate_selection_strategy",
    "stop_callbacks",
    "callbacks",
)


@dataclass(frozen=True)
class BatchedGEPAResult(DspyGEPAResult):
    """dspy.GEPA's detailed results plus the per-step records and run totals."""

    steps: tuple[StepRecord, ...] = ()
    budget: int = 0
    num_workers: int = 0
    wall_s: float = 0.0  # the search; the test evaluation is not included
    test_score: float | None = None
    usage: UsageTotals = field(default_factory=UsageTotals)  # LM calls, tokens and dollars of the search
    mlflow_run_id: str | None = None
    lm_call_counts: limits.LMCallCounts = field(default_factory=limits.LMCallCounts)  # LM calls, retries, failures


class BatchedGEPA(dspy.GEPA):
    """dspy.GEPA that proposes P×N children per step and evaluates them concurrently.

    Args (beyond dspy.GEPA's, whose meaning is unchanged):
        p: parents per step, distinct when the Pareto front has that many.
        n: mutations per parent, each on its own minibatch.
        num_threads: W, the one pool shared by all rollouts and reflection calls of a
            step. Default: enough for one step's screening (P·N·minibatch), and at
            least ``dspy.settings.num_threads``.
        selection: which improving children are fully validated: 'all' (default, the
            paper's AllImprovements), 'best', an int k (top-k), or a gepa SelectionStrategy.
        callbacks: gepa callbacks, notified alongside the step recorder.
        step_sinks: callables receiving each ``StepRecord`` as it is written.
        pool: a WorkerPool to run rollouts on (default: a thread pool of num_threads,
            created and closed by each compile; a pool passed here is left open), or "ray"
            for a ``dspy_pxn.ray_pool.RayWorkerPool`` of num_threads slots on the cluster at
            ``RAY_ADDRESS`` (a local Ray when unset), created and closed by each compile.
        testset: held-out examples scored once, after the search, on the same pool
            (``detailed_results.test_score``; MLflow ``test_score``). Given here, not to
            ``compile``, so ``compile`` keeps DSPy's signature; the search never sees it.
        mlflow, tracking_uri, experiment, run_name, run_tags: track the run in MLflow
            (``dspy_pxn.tracking``). Any of the last four implies ``mlflow=True``; with
            none, runs go to MLflow's default local store in the working directory.
            Inside ``with dspy_pxn.tracking.sweep(...)`` a run is tracked as a nested
            child unless ``mlflow=False``. Tracking never stops or slows the search.
        max_concurrent_lm_calls: at most this many LM calls in progress at once, over the
            task, per-predictor and reflection LMs, whatever ``num_threads`` is (providers
            limit requests, not workers); a ``dspy_pxn.limits.LMCallLimiter`` to share one
            cap between runs. Retries and failures are counted either way
            (``StepRecord.lm_retries``/``lm_failures``, ``detailed_results.lm_call_counts``).

    With ``p=1, n=1`` the run proposes the same candidates as dspy.GEPA for the same
    seed and a deterministic LM (dspy.GEPA with ``use_merge=False``), stopping at the
    last step that fits the budget instead of overshooting it.
    """

    def __init__(
        self,
        metric: Callable[..., Any],
        *,
        p: int = 1,
        n: int = 1,
        auto: Literal["light", "medium", "heavy"] | None = None,
        max_full_evals: int | None = None,
        max_metric_calls: int | None = None,
        reflection_lm: dspy.BaseLM | None = None,
        num_threads: int | None = None,
        selection: str | int | SelectionStrategy = "all",
        reflection_minibatch_size: int = 3,
        candidate_selection_strategy: str | CandidateSelector = "pareto",
        component_selector: Any = "round_robin",
        use_merge: bool = False,
        max_merge_invocations: int = 5,
        skip_perfect_score: bool = True,
        add_format_failure_as_feedback: bool = False,
        instruction_proposer: Any = None,
        failure_score: float = 0.0,
        perfect_score: float = 1.0,
        log_dir: str | None = None,
        seed: int = 0,
        track_best_outputs: bool = False,
        warn_on_score_mismatch: bool = True,
        display_progress_bar: bool = False,
        pool: WorkerPool | str | None = None,
        callbacks: Sequence[Any] = (),
        step_sinks: Sequence[Callable[[StepRecord], None]] = (),
        gepa_kwargs: dict[str, Any] | None = None,
        testset: list[Example] | None = None,
        mlflow: bool | None = None,
        tracking_uri: str | None = None,
        experiment: str | None = None,
        run_name: str | None = None,
        run_tags: dict[str, str] | None = None,
        max_concurrent_lm_calls: int | limits.LMCallLimiter | None = None,
    ):
        self.p = checks.positive_int("p", p, "p is the number of parents sampled per step, e.g. p=8.")
        self.n = checks.positive_int("n", n, "n is the number of mutations drawn per parent, e.g. n=1.")
        checks.one_budget(auto, max_full_evals, max_metric_calls)
        checks.feedback_metric(metric)
        if num_threads is not None:
            checks.positive_int("num_threads", num_threads, "It is the number of concurrent rollouts, e.g. 16.")
        checks.positive_int("reflection_minibatch_size", reflection_minibatch_size)
        if isinstance(candidate_selection_strategy, str) and candidate_selection_strategy not in CANDIDATE_SELECTORS:
            raise ValueError(
                f"candidate_selection_strategy={candidate_selection_strategy!r} is unknown; "
                f"use one of {sorted(CANDIDATE_SELECTORS)} or a gepa CandidateSelector."
            )
        self.selection = selection_strategy(selection)
        self.testset = checks.dataset("testset", testset) if testset is not None else None
        self.mlflow = mlflow
        self.tracking = tracking.tracking_config(mlflow, tracking_uri, experiment, run_name, run_tags)
        owned = sorted(set(gepa_kwargs or {}) & set(OWNED_GEPA_KWARGS))
        if owned:
            raise ValueError(
                f"gepa_kwargs may not set {owned}: BatchedGEPA sets them itself. Use BatchedGEPA's own "
                "arguments (p, n, selection, max_metric_calls, reflection_minibatch_size, callbacks)."
            )
        reflection_lm = reflection_lm or dspy.settings.lm
        if reflection_lm is None and instruction_proposer is None:
            raise ValueError(
                "No reflection LM: pass reflection_lm=dspy.LM('openai/gpt-5-mini', ...) or configure a default "
                "with dspy.configure(lm=...) before creating BatchedGEPA."
            )
        super().__init__(
            metric,
            auto=auto,
            max_full_evals=max_full_evals,
            max_metric_calls=max_metric_calls,
            reflection_minibatch_size=reflection_minibatch_size,
            candidate_selection_strategy="pareto",
            reflection_lm=reflection_lm,
            skip_perfect_score=skip_perfect_score,
            add_format_failure_as_feedback=add_format_failure_as_feedback,
            instruction_proposer=instruction_proposer,
            component_selector=component_selector,
            use_merge=use_merge,
            max_merge_invocations=max_merge_invocations,
            num_threads=num_threads,
            failure_score=failure_score,
            perfect_score=perfect_score,
            log_dir=log_dir,
            track_stats=True,
            track_best_outputs=track_best_outputs,
            warn_on_score_mismatch=warn_on_score_mismatch,
            seed=seed,
            gepa_kwargs=gepa_kwargs,
        )
        self.candidate_selection_strategy = candidate_selection_strategy
        self.display_progress_bar = display_progress_bar
        checks.saved_state_serializable(log_dir, track_best_outputs, self.gepa_kwargs)
        if isinstance(pool, str) and pool != "ray":
            raise ValueError(f"pool={pool!r} is not understood: pass 'ray', a WorkerPool instance, or None for threads.")
        self.pool = pool
        self.callbacks = list(callbacks)
        self.step_sinks = list(step_sinks)
        self.lm_limiter = limits.limiter_for(max_concurrent_lm_calls)

    # ------------------------------------------------------------------------------
    def metric_call_budget(self, student: Module, trainset: list[Example], valset: list[Example]) -> int:
        """The budget in metric calls, computed from auto/max_full_evals exactly as dspy.GEPA does."""
        if self.auto is not None:
            from dspy.teleprompt.gepa.gepa import AUTO_RUN_SETTINGS

            return self.auto_budget(
                num_preds=len(student.named_predictors()),
                num_candidates=AUTO_RUN_SETTINGS[self.auto]["n"],
                valset_size=len(valset),
            )
        if self.max_full_evals is not None:
            return self.max_full_evals * (len(trainset) + len(valset))
        return self.max_metric_calls

    def make_pool(self) -> WorkerPool:
        """The pool this compile owns: threads, or Ray actors for ``pool="ray"`` (same W)."""
        workers = self.num_threads or self.default_num_threads()
        if self.pool == "ray":
            from dspy_pxn.ray_pool import RayWorkerPool

            return RayWorkerPool(address=os.environ.get("RAY_ADDRESS"), max_concurrency=workers)
        return ThreadWorkerPool(workers)

    def default_num_threads(self) -> int:
        return max(self.p * self.n * self.reflection_minibatch_size, dspy.settings.num_threads or 1)

    def compile(
        self,
        student: Module,
        *,
        trainset: list[Example],
        teacher: Module | None = None,
        valset: list[Example] | None = None,
    ) -> Module:
        """Optimize ``student``; returns the best program with ``.detailed_results``."""
        if teacher is not None:
            raise ValueError("teacher is not supported by GEPA; pass teacher=None.")
        checks.program(student)
        trainset = checks.dataset("trainset", trainset)
        if valset is None:
            logger.warning("No valset given: using the trainset for validation (scores will be optimistic).")
        valset = checks.dataset("valset", valset) if valset is not None else trainset
        budget = self.metric_call_budget(student, trainset, valset)
        checks.budget_covers_validation(budget, len(valset))
        checks.examples_match_program(student, trainset=trainset, valset=valset, testset=self.testset)
        checks.writable_dir("log_dir", self.log_dir)
        settings = self.run_settings(student, trainset, valset)
        saved_state = resume.load_saved_state(self.log_dir)
        if saved_state is not None:
            resume.check_resumable(saved_state, settings, self.log_dir)

        owns_pool = self.pool is None or self.pool == "ray"
        pool = self.make_pool() if owns_pool else self.pool
        meter = UsageMeter()
        tracker = None
        try:
            tracker = tracking.start_for(self, student, trainset, valset, budget, pool.num_workers, meter)
            started = time.perf_counter()
            limits.warn_if_no_timeout("task", dspy.settings.lm)
            limits.warn_if_no_timeout("reflection", self.reflection_lm)
            lm_counter = limits.LMCallLimiter()  # this run's calls, retries and failures (never blocks)
            with meter.active(), limits.installed(self.lm_limiter, lm_counter):
                program, gepa_result, adapter, recorder = self._optimize(
                    student, trainset, valset, budget, pool, meter, tracker, settings, saved_state
                )
                wall_s, usage = time.perf_counter() - started, meter.totals()
                test_score = None
                if self.testset:
                    test_score = holdout_score(program, self.testset, self.metric_fn, pool, self.failure_score)
        except BaseException as error:
            if tracker is not None:
                tracker.fail(error)
            raise
        finally:
            if owns_pool:
                pool.close()
        base = DspyGEPAResult.from_gepa_result(gepa_result, adapter)
        program.detailed_results = BatchedGEPAResult(
            **{f.name: getattr(base, f.name) for f in fields(DspyGEPAResult)},
            steps=tuple(recorder.steps),
            budget=budget,
            num_workers=pool.num_workers,
            wall_s=wall_s,
            test_score=test_score,
            usage=usage,
            mlflow_run_id=tracker.run_id if tracker is not None else None,
            lm_call_counts=lm_counter.counts(),
        )
        if tracker is not None:
            results = program.detailed_results
            tracker.finish(program, tracking.final_metrics(
                recorder.steps, max(results.val_aggregate_scores), results.total_metric_calls,
                len(results.candidates), wall_s, usage, test_score,
            ), list(recorder.steps))
        return program

    def run_settings(self, student: Module, trainset: list[Example], valset: list[Example]) -> resume.RunSettings:
        """What a resume from ``log_dir`` must keep unchanged (see dspy_pxn.resume)."""
        return resume.RunSettings.of(
            p=self.p, n=self.n, minibatch_size=self.reflection_minibatch_size, seed=self.seed,
            selection=tracking.selection_label(self.selection), use_merge=self.use_merge,
            trainset=trainset, valset=valset, seed_candidate=seed_candidate(student),
        )

    def _optimize(self, student, trainset, valset, budget, pool, meter, tracker, settings, saved_state):
        recorder = StepRecorder(
            self.p, self.n, budget, pool, log_dir=self.log_dir or (tracker.log_dir if tracker else None),
            sinks=[*self.step_sinks, *([tracker.on_step] if tracker else [])],
            minibatch_size=self.reflection_minibatch_size, val_size=len(valset), usage=meter,
            lm_counts=limits.StepLMCounts(limits.current_counter()),  # retries and failures per step
        )
        predictors = student.named_predictors()
        adapter = BatchedAdapter(
            student_module=student,
            metric_fn=self.metric_fn,
            feedback_map={name: feedback_function(self.metric_fn, name, pred) for name, pred in predictors},
            failure_score=self.failure_score,
            num_threads=pool.num_workers,
            add_format_failure_as_feedback=self.add_format_failure_as_feedback,
            rng=random.Random(self.seed),
            reflection_lm=None,  # PooledReflection sets the reflection LM per call
            custom_instruction_proposer=self.custom_instruction_proposer,
            warn_on_score_mismatch=self.warn_on_score_mismatch,
            reflection_minibatch_size=self.reflection_minibatch_size,
            pool=pool,
            on_evaluated=recorder.on_evaluated,
        )
        guard = BudgetGuard(budget, len(valset), self.reflection_minibatch_size, self.use_merge)

        def on_sampled(tasks):
            adapter.expect_parent_evaluations(unique_minibatches(tasks))
            recorder.on_tasks_sampled(tasks)

        # One RNG shared by parent selection and minibatch shuffling, as gepa.optimize does,
        # so a 1×1 run draws the same parents and minibatches as dspy.GEPA.
        rng = random.Random(self.seed)
        sampler = SequentialMinibatchSampler(self.reflection_minibatch_size, rng)
        adapter.checkpoint = resume.RunCheckpoint(settings, sampler, rng)
        if saved_state is not None:
            completed = saved_state.i + 1
            logger.info("Resuming from log_dir=%s after step %d (%d of %d metric calls spent).",
                        self.log_dir, completed, saved_state.total_num_evals, budget)
            adapter.replay_once(seed_candidate(student), valset, resume.seed_evaluation(adapter, saved_state, len(valset)))
            recorder.resume_after(completed)
        candidate_selector = self.candidate_selection_strategy
        if isinstance(candidate_selector, str):
            candidate_selector = CANDIDATE_SELECTORS[candidate_selector](rng)

        gepa_result = optimize(
            seed_candidate=seed_candidate(student),
            trainset=trainset,
            valset=valset,
            adapter=adapter,
            candidate_selection_strategy=candidate_selector,
            batch_sampler=sampler,
            sampling_strategy=DistinctParentsPxN(self.p, self.n, guard, on_sampled=on_sampled),
            selection_strategy=BudgetCappedSelection(self.selection, guard, on_selected=recorder.on_selection),
            reflection_strategy=PooledReflection(adapter, self.reflection_lm, pool, on_reflected=recorder.on_reflected),
            stop_callbacks=[ExactBudgetStopper(guard)],
            callbacks=[recorder.lm_counts, recorder, *(tracker.gepa_callbacks if tracker else []), *self.callbacks],
            skip_perfect_score=self.skip_perfect_score,
            perfect_score=self.perfect_score,
            module_selector=self.component_selector,
            use_merge=self.use_merge,
            max_merge_invocations=self.max_merge_invocations,
            logger=LoggerAdapter(logger),
            run_dir=self.log_dir,
            track_best_outputs=self.track_best_outputs,
            display_progress_bar=self.display_progress_bar,
            raise_on_exception=True,
            seed=self.seed,
            **self.gepa_kwargs,
        )
        program = adapter.build_program(gepa_result.best_candidate)
        return program, gepa_result, adapter, recorder


def seed_candidate(student: Module) -> dict[str, str]:
    """The instructions gepa optimizes, keyed by predictor name."""
    return {name: pred.signature.instructions for name, pred in student.named_predictors()}


def feedback_function(metric: Callable[..., Any], pred_name: str, predictor: Any) -> Callable[..., dict]:
    """Per-predictor feedback in the shape DspyAdapter's reflective dataset expects.

    dspy.GEPA builds the same closure inside ``compile``; it is not importable, so it
    is restated here: call the metric with the predictor's name and sub-trace, and
    fall back to a score-only message when the metric gives no feedback text.
    """

    def feedback(predictor_output, predictor_inputs, module_inputs, module_outputs, captured_trace) -> dict:
        outcome = metric(module_inputs, module_outputs, captured_trace, pred_name, [(predictor, predictor_inputs, predictor_output)])
        if hasattr(outcome, "feedback"):
            if outcome["feedback"] is None:
                outcome["feedback"] = f"This trajectory got a score of {outcome['score']}."
            return outcome
        return dict(score=outcome, feedback=f"This trajectory got a score of {outcome}.")

    return feedback
