"""BatchedGEPA: dspy.GEPA with P×N proposals per step, one worker pool, an exact budget.

The engine is gepa's; this module only wires strategies into ``gepa.optimize``:

    sampling    DistinctParentsPxN          P distinct parents × N mutations, budget-narrowed
    minibatches SequentialMinibatchSampler  fresh minibatches for every task
    reflection  PooledReflection            all P·N reflection calls at once
    adapter     BatchedAdapter              every rollout of a step on one pool of W workers
    selection   BudgetCappedSelection       all | best | top-k, never validating past the budget
    stopper     ExactBudgetStopper          stop when no useful step fits the budget

The strategies, the adapter and the reflection report what happens inside a step to one
``StepEvents`` seam; the ``StepRecorder`` listens and emits one ``StepRecord`` per step to
its sinks (the step log, progress lines, a tracker). Tracking is a ``Tracker`` handed in
(``dspy_pxn.tracker``): this module does not know MLflow.

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
from dataclasses import fields
from typing import Any, Literal

import dspy
import gepa
from dspy.primitives import Example, Module
from dspy.teleprompt.gepa.gepa import AUTO_RUN_SETTINGS, DspyGEPAResult
from dspy.teleprompt.gepa.gepa_utils import LoggerAdapter
from gepa.core.data_loader import ensure_loader
from gepa.core.result import GEPAResult
from gepa.proposer.reflective_mutation.base import CandidateSelector
from gepa.strategies.proposal_selection import SelectionStrategy

from dspy_pxn import checks, components, limits, metrics, resume
from dspy_pxn import selection as selections
from dspy_pxn import tracker as trackers
from dspy_pxn.adapter import BatchedAdapter
from dspy_pxn.asynchronous import AsyncSchedule
from dspy_pxn.budget import BudgetGuard, RunShape
from dspy_pxn.description import RunDescription, digest, lm_name
from dspy_pxn.events import StepEvents
from dspy_pxn.holdout import holdout_score
from dspy_pxn.merge import SiblingMerge, SiblingMerger
from dspy_pxn.pools import ThreadWorkerPool, WorkerPool
from dspy_pxn.reflection import PooledReflection
from dspy_pxn.result import BatchedGEPAResult
from dspy_pxn.steps import StepLog, StepRecord, StepRecorder
from dspy_pxn.strategies import (
    CANDIDATE_SELECTORS,
    BudgetCappedSelection,
    DistinctParentsPxN,
    ExactBudgetStopper,
    SequentialMinibatchSampler,
    component_selector,
)
from dspy_pxn.usage import UsageMeter, warn_if_answered_from_cache

logger = logging.getLogger(__name__)

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


# The gepa_kwargs the async schedule honours too (it drives GEPAState itself, not gepa's engine).
ASYNC_GEPA_KWARGS = frozenset({"use_cloudpickle"})


class BatchedGEPA(dspy.GEPA):
    """dspy.GEPA that proposes P×N children per step and evaluates them concurrently.

    Every argument of ``dspy.GEPA.__init__`` is accepted with its meaning; the defaults
    differ only for ``metric`` (optional), ``use_merge`` (off) and ``track_stats`` (on).
    Beyond dspy.GEPA:

        metric: optional: without it the program's own ``program.metric`` is used. A plain
            DSPy metric ``(gold, pred, trace=None)`` is accepted too (score-only feedback).
        auto / max_full_evals / max_metric_calls: at most one; with none, ``auto="light"``.
        reflection_lm: optional: without it the task LM (``dspy.settings.lm`` at compile)
            reflects, and the run says so once.
        p: parents per step, distinct when the Pareto front has that many.
        n: mutations per parent, each on its own minibatch.
        num_threads: W, the one pool shared by all rollouts and reflection calls of a
            step. Default: enough for one step's screening (P·N·minibatch), and at
            least ``dspy.settings.num_threads``. Under ``schedule='async'`` W bounds the
            rollouts and the P·N pipelines reflect in their own threads beside them; cap all
            LM calls at once with ``max_concurrent_lm_calls``.
        selection: which improving children are fully validated: 'all' (the paper's
            AllImprovements), 'best', an int k (top-k), 'merge' (the improving children
            merged into one candidate by one reflection call: ``dspy_pxn.merge``), 'merge+best'
            (that merge and the best child), or a gepa SelectionStrategy. Default: 'all' at
            P·N = 1 (dspy.GEPA's behaviour), 'merge' above it (README "Performance": validating
            sixteen siblings one by one buys speed and loses held-out score; merging keeps both).
        schedule: 'steps' (gepa's step loop: a barrier after each step's screening and after
            its validation) or 'async' (``dspy_pxn.asynchronous``: P·N proposal pipelines always
            in flight, no barrier). Default: 'async' at P·N > 1 unless ``use_merge``,
            ``use_wandb`` or ``gepa_kwargs`` that only gepa's step loop reads (e.g.
            ``cache_evaluation``) are given, else 'steps'.
        callbacks: gepa callbacks, notified alongside the step recorder.
        step_sinks: callables receiving each ``StepRecord`` as it is written.
        pool: a WorkerPool to run rollouts on (default: a thread pool of num_threads,
            created and closed by each compile; a pool passed here is left open), or "ray"
            for a ``dspy_pxn.pools.ray.RayWorkerPool`` of num_threads slots on the cluster at
            ``RAY_ADDRESS`` (a local Ray when unset), created and closed by each compile.
        testset: held-out examples scored once, after the search, on the same pool
            (``detailed_results.test_score``; MLflow ``test_score``). Given here, not to
            ``compile``, so ``compile`` keeps DSPy's signature; the search never sees it.
        tracker: a ``dspy_pxn.tracker.Tracker`` that follows each compile, e.g.
            ``dspy_pxn.tracking.MlflowTracker(experiment="hover")``.
        use_mlflow / mlflow, tracking_uri, experiment, run_name, run_tags: shorthands for an
            MLflow tracker. Any of the last four implies tracking; with none, runs go to
            MLflow's default local store in the working directory. Inside ``with
            dspy_pxn.tracking.sweep(...)`` a run is tracked as a nested child unless
            ``mlflow=False``. Tracking never stops or slows the search.
        use_wandb, wandb_api_key, wandb_init_kwargs: passed on to gepa's own Weights &
            Biases logging, as dspy.GEPA does.
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
        metric: Callable[..., Any] | None = None,
        *,
        p: int = 1,
        n: int = 1,
        auto: Literal["light", "medium", "heavy"] | None = None,
        max_full_evals: int | None = None,
        max_metric_calls: int | None = None,
        reflection_lm: dspy.BaseLM | None = None,
        num_threads: int | None = None,
        selection: str | int | SelectionStrategy | None = None,
        reflection_minibatch_size: int = 3,
        candidate_selection_strategy: str | CandidateSelector = "pareto",
        component_selector: Any = "round_robin",
        use_merge: bool = False,
        max_merge_invocations: int | None = 5,
        skip_perfect_score: bool = True,
        add_format_failure_as_feedback: bool = False,
        instruction_proposer: Any = None,
        code_proposer: Any = None,
        failure_score: float = 0.0,
        perfect_score: float = 1.0,
        log_dir: str | None = None,
        track_stats: bool = True,
        use_wandb: bool = False,
        wandb_api_key: str | None = None,
        wandb_init_kwargs: dict[str, Any] | None = None,
        track_best_outputs: bool = False,
        warn_on_score_mismatch: bool = True,
        use_mlflow: bool = False,
        seed: int | None = 0,
        gepa_kwargs: dict[str, Any] | None = None,
        display_progress_bar: bool = False,
        pool: WorkerPool | str | None = None,
        callbacks: Sequence[Any] = (),
        step_sinks: Sequence[Callable[[StepRecord], None]] = (),
        testset: list[Example] | None = None,
        tracker: trackers.Tracker | None = None,
        mlflow: bool | None = None,
        tracking_uri: str | None = None,
        experiment: str | None = None,
        run_name: str | None = None,
        run_tags: dict[str, str] | None = None,
        max_concurrent_lm_calls: int | limits.LMCallLimiter | None = None,
        schedule: Literal["steps", "async"] | None = None,
    ):
        self.p = checks.positive_int("p", p, "p is the number of parents sampled per step, e.g. p=8.")
        self.n = checks.positive_int("n", n, "n is the number of mutations drawn per parent, e.g. n=1.")
        checks.at_most_one_budget(auto, max_full_evals, max_metric_calls)
        if metric is not None:
            metrics.arity(metric)  # a wrong signature fails here, before any data or LM
        checks.positive_int("num_threads", num_threads, "It is the number of concurrent rollouts, e.g. 16.",
                            or_none=True)
        checks.positive_int("reflection_minibatch_size", reflection_minibatch_size)
        if isinstance(candidate_selection_strategy, str) and candidate_selection_strategy not in CANDIDATE_SELECTORS:
            raise ValueError(
                f"candidate_selection_strategy={candidate_selection_strategy!r} is unknown; "
                f"use one of {sorted(CANDIDATE_SELECTORS)} or a gepa CandidateSelector."
            )
        if track_best_outputs and not track_stats:
            raise checks.ArgumentError("track_best_outputs=True needs track_stats=True (the outputs are part of the stats).")
        wide = self.p * self.n > 1
        self.selection = selections.checked(selection if selection is not None else ("merge" if wide else "all"))
        self.testset = checks.dataset("testset", testset) if testset is not None else None
        self.tracker, self.mlflow = tracker_for(tracker, use_mlflow, mlflow, tracking_uri, experiment, run_name, run_tags)
        if use_wandb:
            checks.wandb_installed()
        owned = sorted(set(gepa_kwargs or {}) & set(OWNED_GEPA_KWARGS))
        if owned:
            raise ValueError(
                f"gepa_kwargs may not set {owned}: BatchedGEPA sets them itself. Use BatchedGEPA's own "
                "arguments (p, n, selection, max_metric_calls, reflection_minibatch_size, callbacks, use_mlflow)."
            )
        if reflection_lm is None and instruction_proposer is None and dspy.settings.lm is None:
            raise checks.ArgumentError(
                "No reflection LM: pass reflection_lm=dspy.LM('openai/gpt-5-mini', ...) or configure a default "
                "with dspy.configure(lm=...) before creating BatchedGEPA."
            )
        no_budget = auto is None and max_full_evals is None and max_metric_calls is None
        super().__init__(
            _resolved_in_compile,  # dspy.GEPA accepts only 5-argument metrics; ours is resolved in compile
            auto="light" if no_budget else auto,
            max_full_evals=max_full_evals,
            max_metric_calls=max_metric_calls,
            reflection_minibatch_size=reflection_minibatch_size,
            candidate_selection_strategy="pareto",
            reflection_lm=reflection_lm or dspy.settings.lm,
            skip_perfect_score=skip_perfect_score,
            add_format_failure_as_feedback=add_format_failure_as_feedback,
            instruction_proposer=instruction_proposer,
            code_proposer=code_proposer,
            component_selector=component_selector,
            use_merge=use_merge,
            max_merge_invocations=max_merge_invocations,
            num_threads=num_threads,
            failure_score=failure_score,
            perfect_score=perfect_score,
            log_dir=log_dir,
            track_stats=track_stats,
            use_wandb=use_wandb,
            wandb_api_key=wandb_api_key,
            wandb_init_kwargs=wandb_init_kwargs,
            track_best_outputs=track_best_outputs,
            warn_on_score_mismatch=warn_on_score_mismatch,
            use_mlflow=False,  # gepa's own MLflow logging stays off: use_mlflow means dspy-pxn's tracking
            seed=seed,
            gepa_kwargs=gepa_kwargs,
        )
        self.metric_fn = metric  # None: the program's own metric, resolved at compile
        self.reflection_lm = reflection_lm  # None: the task LM at compile time
        self.budget_by_default = no_budget  # auto="light" was chosen for the user, which the run says
        self.use_mlflow = bool(use_mlflow)
        self.candidate_selection_strategy = candidate_selection_strategy
        self.display_progress_bar = display_progress_bar
        checks.saved_state_serializable(log_dir, track_best_outputs, self.gepa_kwargs)
        if isinstance(pool, str) and pool != "ray":
            raise ValueError(f"pool={pool!r} is not understood: pass 'ray', a WorkerPool instance, or None for threads.")
        self.pool = pool
        self.callbacks = list(callbacks)
        self.step_sinks = list(step_sinks)
        self.lm_limiter = limits.limiter_for(max_concurrent_lm_calls)
        # Above 1×1, what the user left open is chosen from README "Performance"; the run says so once.
        self.chosen_for_user = [name for name, value in (("schedule", schedule), ("selection", selection))
                                if value is None and wide]
        loop_only = sorted(set(self.gepa_kwargs) - ASYNC_GEPA_KWARGS)  # read by gepa's step loop only
        if schedule is None:
            schedule = "async" if wide and not (use_merge or use_wandb or loop_only) else "steps"
        self.schedule = check_schedule(schedule, use_merge=use_merge, use_wandb=use_wandb, loop_only=loop_only)

    # ------------------------------------------------------------------------------
    def metric_call_budget(self, student: Module, trainset: list[Example], valset: list[Example]) -> int:
        """The budget in metric calls, computed from auto/max_full_evals exactly as dspy.GEPA does.

        With no budget at all, ``auto="light"``: the run says so, with the number it comes to.
        """
        if self.auto is not None:
            budget = self.auto_budget(
                num_preds=max(len(components.seed_candidate(student)), 1),
                num_candidates=AUTO_RUN_SETTINGS[self.auto]["n"],
                valset_size=len(valset),
            )
            if self.budget_by_default:
                logger.info("No budget given: using auto='light', %d metric calls for this program and valset "
                            "(pass max_metric_calls=... to set it).", budget)
            return budget
        if self.max_full_evals is not None:
            return self.max_full_evals * (len(trainset) + len(valset))
        return self.max_metric_calls

    def make_pool(self) -> WorkerPool:
        """The pool this compile owns: threads, or Ray actors for ``pool="ray"`` (same W)."""
        workers = self.num_threads or self.default_num_threads()
        if self.pool == "ray":
            from dspy_pxn.pools.ray import RayWorkerPool

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
        """Optimize ``student``; returns the best program (with ``.detailed_results`` when ``track_stats``)."""
        if teacher is not None:
            raise checks.ArgumentError("teacher is not supported by GEPA; pass teacher=None.")
        checks.program(student, list(components.seed_candidate(student)) if isinstance(student, Module) else [])
        metric = metrics.resolve(self.metric_fn, student)
        trainset = checks.dataset("trainset", trainset)
        if valset is None:
            logger.warning("No valset given: using the trainset for validation (scores will be optimistic).")
        valset = checks.dataset("valset", valset) if valset is not None else trainset
        budget = self.metric_call_budget(student, trainset, valset)
        guard = BudgetGuard(budget, len(valset), self.reflection_minibatch_size, self.use_merge)
        checks.budget_buys_one_step(budget, len(valset), self.reflection_minibatch_size, guard.smallest_budget())
        checks.examples_match_program(student, trainset=trainset, valset=valset, testset=self.testset)
        checks.writable_dir("log_dir", self.log_dir)
        reflection_lm = self.resolve_reflection_lm()
        if self.chosen_for_user:
            logger.info("P×N = %d×%d: schedule=%r, selection=%r (the defaults above 1×1; pass schedule='steps', "
                        "selection='all' for the paper's step loop).", self.p, self.n, self.schedule,
                        selections.label(self.selection))
        owns_pool = self.pool is None or self.pool == "ray"
        workers = self.pool.num_workers if not owns_pool else self.num_threads or self.default_num_threads()
        description = self.describe(student, trainset, valset, budget, workers, reflection_lm)
        saved_state = resume.load_saved_state(self.log_dir)
        if saved_state is not None:
            resume.check_resumable(saved_state, description.resume_settings(), self.log_dir)

        pool = self.make_pool() if owns_pool else self.pool
        meter = UsageMeter()
        run_tracker = self.tracker or (trackers.ambient() if self.mlflow is not False else None)
        tracked = None
        try:
            if run_tracker is not None:
                tracked = run_tracker.start(description, log_dir=self.log_dir, usage=meter)
            started = time.perf_counter()
            limits.warn_if_no_timeout("task", dspy.settings.lm)
            limits.warn_if_no_timeout("reflection", reflection_lm)
            lm_counter = limits.LMCallLimiter()  # this run's calls, retries and failures (never blocks)
            with meter.active(), limits.installed(self.lm_limiter, lm_counter):
                shape = RunShape(pool.num_workers, budget, len(valset), self.reflection_minibatch_size)
                program, gepa_result, adapter, recorder = self._optimize(
                    student, metric, trainset, valset, shape, pool, meter, lm_counter, tracked, description,
                    saved_state, reflection_lm,
                )
                wall_s, usage = time.perf_counter() - started, meter.totals()
                test_score = None
                if self.testset:
                    test_score = holdout_score(program, self.testset, metric, pool, self.failure_score)
        except BaseException as error:
            if tracked is not None:
                tracked.fail(error)
            raise
        finally:
            if owns_pool:
                pool.close()
        warn_if_answered_from_cache(usage, gepa_result.total_metric_calls)
        base = DspyGEPAResult.from_gepa_result(gepa_result, adapter)
        results = BatchedGEPAResult(
            **{f.name: getattr(base, f.name) for f in fields(DspyGEPAResult)},
            steps=tuple(recorder.steps),
            budget=budget,
            num_workers=pool.num_workers,
            wall_s=wall_s,
            test_score=test_score,
            usage=usage,
            mlflow_run_id=tracked.run_id if tracked is not None else None,
            lm_call_counts=lm_counter.counts(),
        )
        if self.track_stats:
            program.detailed_results = results
        if tracked is not None:
            tracked.finish(program, results)
        return program

    def resolve_reflection_lm(self) -> dspy.BaseLM | None:
        """The reflection LM given, else the task LM (said once per run), else None for a custom proposer."""
        if self.reflection_lm is not None:
            return self.reflection_lm
        task_lm = dspy.settings.lm
        if task_lm is not None and self.custom_instruction_proposer is None:
            logger.info("No reflection_lm given: the task LM %s also reflects. A stronger reflection LM "
                        "(reflection_lm=dspy.LM(...)) usually finds better instructions.", lm_name(task_lm))
        return task_lm

    def describe(
        self, student: Module, trainset: list[Example], valset: list[Example], budget: int, num_workers: int,
        reflection_lm: Any,
    ) -> RunDescription:
        """This compile, described once for tracking (params) and resume (settings)."""
        selector = self.candidate_selection_strategy
        predictor_lms = [p.lm for _, p in student.named_predictors() if getattr(p, "lm", None) is not None]
        return RunDescription(
            p=self.p, n=self.n, selection=selections.label(self.selection), schedule=self.schedule,
            minibatch_size=self.reflection_minibatch_size, seed=self.seed, use_merge=self.use_merge,
            candidate_selection=selector if isinstance(selector, str) else type(selector).__name__,
            budget=budget, num_workers=num_workers, program=type(student).__name__,
            predictors=len(student.named_predictors()), code_components=len(components.code_components(student)),
            dataset=getattr(trainset, "name", None) or "unnamed", trainset_size=len(trainset),
            valset_size=len(valset), testset_size=len(self.testset or []),
            task_lms=tuple(predictor_lms or [dspy.settings.lm]), reflection_lm=reflection_lm,
            trainset_digest=digest(trainset), valset_digest=digest(valset),
            seed_candidate_digest=digest([f"{k}={v}" for k, v in sorted(components.seed_candidate(student).items())]),
        )

    def most_validated(self, improvers: int) -> int:
        """How many of ``improvers`` improving children the run's selection may validate."""
        if self.selection in selections.NAMED or isinstance(self.selection, int):
            return selections.kept(self.selection, improvers)
        return improvers  # a custom strategy: at most all of them

    def selection_strategy(self, adapter: BatchedAdapter, reflection_lm: Any, pool: WorkerPool,
                           events: StepEvents) -> Any:
        """The gepa selection strategy for this run; the merges need the run's reflection LM and pool."""
        if self.selection in selections.MERGES:
            merger = SiblingMerger(reflection_lm, pool, code_components=sorted(adapter._flex_paths))
            return SiblingMerge(merger, keep_best=self.selection == "merge+best", events=events)
        return selections.strategy(self.selection)

    def _optimize(self, student, metric, trainset, valset, shape, pool, meter, lm_counter, tracked, description,
                  saved_state, reflection_lm):
        log_dir = self.log_dir or (tracked.log_dir if tracked is not None else None)
        step_log = StepLog(log_dir) if log_dir is not None else None
        recorder = StepRecorder(
            self.p, self.n, shape, pool, meter, lm_counter,
            sinks=[*([step_log] if step_log else []), *self.step_sinks, *([tracked.on_step] if tracked else [])],
            schedule=self.schedule,
        )
        events = StepEvents([recorder])
        seed = components.seed_candidate(student)
        adapter = BatchedAdapter(
            student_module=student,
            metric_fn=metric,
            feedback_map={name: metrics.feedback_function(metric, name, pred) for name, pred in student.named_predictors()},
            failure_score=self.failure_score,
            num_threads=pool.num_workers,
            add_format_failure_as_feedback=self.add_format_failure_as_feedback,
            rng=random.Random(self.seed),
            reflection_lm=None,  # PooledReflection sets the reflection LM per call
            custom_instruction_proposer=self.custom_instruction_proposer,
            custom_code_proposer=self.custom_code_proposer,
            warn_on_score_mismatch=self.warn_on_score_mismatch,
            reflection_minibatch_size=self.reflection_minibatch_size,
            pool=pool,
            events=events,
        )
        if self.schedule == "steps":
            events.add(adapter)  # the sampled parents' minibatches are the evaluations to trace
        guard = BudgetGuard.of(shape, self.use_merge)

        # One RNG shared by parent selection and minibatch shuffling, as gepa.optimize does,
        # so a 1×1 run draws the same parents and minibatches as dspy.GEPA.
        rng = random.Random(self.seed)
        sampler = SequentialMinibatchSampler(self.reflection_minibatch_size, rng)
        adapter.checkpoint = resume.RunCheckpoint(description.resume_settings(), sampler, rng)
        if saved_state is not None:
            completed = saved_state.i + 1
            logger.info("Resuming from log_dir=%s after step %d (%d of %d metric calls spent).",
                        self.log_dir, completed, saved_state.total_num_evals, shape.budget)
            adapter.replay_once(seed, valset, resume.seed_evaluation(adapter, saved_state, len(valset)))
            if step_log is not None:
                recorder.steps = step_log.keep_first(completed)
        candidate_selector = self.candidate_selection_strategy
        if isinstance(candidate_selector, str):
            candidate_selector = CANDIDATE_SELECTORS[candidate_selector](rng)
        reflection = PooledReflection(adapter, reflection_lm, pool, events)
        selection = BudgetCappedSelection(self.selection_strategy(adapter, reflection_lm, pool, events), guard, events)

        if self.schedule == "async":
            state = AsyncSchedule(
                adapter=adapter, reflection=reflection, selection=selection, guard=guard, sampler=sampler,
                candidate_selector=candidate_selector, component_selector=component_selector(self.component_selector),
                trainset=ensure_loader(trainset), valset=ensure_loader(valset), width=self.p * self.n, events=events,
                recorder=recorder, most_validated=self.most_validated, callbacks=[*(tracked.gepa_callbacks if tracked
                                                                                     else []), *self.callbacks],
                run_dir=self.log_dir, skip_perfect_score=self.skip_perfect_score, perfect_score=self.perfect_score,
                track_best_outputs=self.track_best_outputs, use_cloudpickle=bool(self.gepa_kwargs.get("use_cloudpickle")),
            ).run(seed)
            gepa_result = GEPAResult.from_state(state, run_dir=self.log_dir, seed=self.seed)
            return adapter.build_program(gepa_result.best_candidate), gepa_result, adapter, recorder

        gepa_result = gepa.optimize(
            seed_candidate=seed,
            trainset=trainset,
            valset=valset,
            adapter=adapter,
            candidate_selection_strategy=candidate_selector,
            batch_sampler=sampler,
            sampling_strategy=DistinctParentsPxN(self.p, self.n, guard, events),
            selection_strategy=selection,
            reflection_strategy=reflection,
            stop_callbacks=[ExactBudgetStopper(guard)],
            callbacks=[recorder, *(tracked.gepa_callbacks if tracked else []), *self.callbacks],
            skip_perfect_score=self.skip_perfect_score,
            perfect_score=self.perfect_score,
            module_selector=self.component_selector,
            use_merge=self.use_merge,
            max_merge_invocations=self.max_merge_invocations,
            logger=LoggerAdapter(logger),
            run_dir=self.log_dir,
            use_wandb=self.use_wandb,
            wandb_api_key=self.wandb_api_key,
            wandb_init_kwargs=self.wandb_init_kwargs,
            track_best_outputs=self.track_best_outputs,
            display_progress_bar=self.display_progress_bar,
            raise_on_exception=True,
            seed=self.seed,
            **self.gepa_kwargs,
        )
        program = adapter.build_program(gepa_result.best_candidate)
        return program, gepa_result, adapter, recorder


def tracker_for(
    given: trackers.Tracker | None, use_mlflow: bool, mlflow: bool | None, tracking_uri: str | None,
    experiment: str | None, run_name: str | None, run_tags: dict[str, str] | None,
) -> tuple[trackers.Tracker | None, bool | None]:
    """The tracker a BatchedGEPA asked for, and its ``mlflow`` setting (False: not even a sweep's)."""
    if use_mlflow and mlflow is False:
        raise ValueError("use_mlflow=True contradicts mlflow=False: pass one of them.")
    mlflow = True if use_mlflow else mlflow
    arguments = trackers.TrackingArguments(mlflow, tracking_uri, experiment, run_name, run_tags)
    if given is not None:
        if not isinstance(given, trackers.Tracker):
            raise TypeError(f"tracker={given!r} has no start(description, log_dir=..., usage=...): pass a "
                            "dspy_pxn.tracker.Tracker such as dspy_pxn.tracking.MlflowTracker().")
        if arguments.given:
            raise ValueError("tracker= and the MLflow shorthands (use_mlflow, mlflow, tracking_uri, experiment, "
                             "run_name, run_tags) are two trackers: pass one of them.")
        return given, True
    return trackers.from_arguments(arguments), mlflow


def check_schedule(schedule: str, *, use_merge: bool, use_wandb: bool, loop_only: Sequence[str] = ()) -> str:
    """'steps' (gepa's loop, one P×N step at a time) or 'async' (P·N proposals always in flight)."""
    if schedule not in ("steps", "async"):
        raise ValueError(f"schedule={schedule!r} is not understood: use 'steps' (gepa's step loop) or 'async' "
                         "(P·N proposals always in flight, no step barrier).")
    if schedule == "async" and use_merge:
        raise ValueError("use_merge=True (gepa's crossover merge) runs inside gepa's step loop: with schedule='async' "
                         "use selection='merge' (the improving children merged into one candidate) instead.")
    if schedule == "async" and loop_only:
        raise ValueError(f"gepa_kwargs {list(loop_only)} are read by gepa's step loop, which schedule='async' does "
                         "not run: use schedule='steps' with them, or drop them.")
    if schedule == "async" and use_wandb:
        raise ValueError("use_wandb=True logs from inside gepa's step loop, which schedule='async' does not run: "
                         "use use_mlflow=True, or schedule='steps'.")
    return schedule


def _resolved_in_compile(gold, pred, trace=None, pred_name=None, pred_trace=None):  # pragma: no cover
    """Stands in for dspy.GEPA's metric argument: compile resolves the run's metric (dspy_pxn.metrics)."""
    raise AssertionError("BatchedGEPA resolves its metric in compile()")
