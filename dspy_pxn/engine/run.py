"""One compile, from the optimizer's arguments to the program it returns, in three moves.

    run = Run.prepare(settings, target, trainset, valset)     every check and decision that needs no LM call
    with run.resources() as live:                             the pool, ledger, caps, tracked run, step
                                                              recorder and adapter the search runs on
        gepa_result = schedule.run(run, live)                 dspy_pxn.schedules
        program = target.result(run, gepa_result, live,       the best program, its held-out score and details
                                run.ended(gepa_result, live))

The target is what is optimized (``dspy_pxn.engine.target``): a DSPy program (``ProgramTarget``) or MLflow's
prompt templates; the engine between ``prepare`` and ``result`` sees only gepa candidates and an adapter.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import dspy
from dspy.primitives import Example
from dspy.teleprompt.gepa.gepa import AUTO_RUN_SETTINGS
from gepa.core.result import GEPAResult
from gepa.core.state import GEPAState

from dspy_pxn import checks
from dspy_pxn.engine import resume
from dspy_pxn.engine.description import RunDescription, digest, lm_name, resume_settings
from dspy_pxn.engine.events import StepEvents
from dspy_pxn.engine.pooled_adapter import PooledAdapter
from dspy_pxn.engine.records import StepLog, StepRecorder
from dspy_pxn.engine.sampling import SequentialMinibatchSampler
from dspy_pxn.engine.target import Target, TargetData
from dspy_pxn.engine.tracker import TrackedRun, effective_tracker, quietly, start_tracked_run
from dspy_pxn.engine.width import AUTO, REFLECTION_EXAMPLES, auto_parents, rows_reflection_reads, screening_minibatch
from dspy_pxn.ledger import caps as caps_gate
from dspy_pxn.ledger import feed, limiter
from dspy_pxn.ledger.budget import BudgetGuard, RunShape
from dspy_pxn.ledger.caps import RunCaps
from dspy_pxn.ledger.ledger import RunLedger
from dspy_pxn.ledger.prices import Price, use_bundled_price_maps
from dspy_pxn.pools import ThreadWorkerPool, WorkerPool
from dspy_pxn.proposer import selection as selections
from dspy_pxn.settings import Settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Run:
    """One compile, prepared: what was decided before the first LM call. Built once and never changed, read
    everywhere, so no part of the search recomputes it."""

    settings: Settings  # the optimizer's arguments, as given and checked
    target: Target  # what is optimized: a DSPy program (dspy_pxn.targets.program.target), or MLflow prompts
    trainset: list[Any]
    valset: list[Any]
    testset: list[Any] | None  # scored once after the search (``holdout``), never seen by it
    task_lms: tuple[Any, ...]  # the task's LMs and what holds them, as the target said: their calls are the run's
    reflection_lm: dspy.BaseLM | None  # None: a custom proposer reflects
    shape: RunShape
    guard: BudgetGuard
    description: RunDescription
    saved_state: GEPAState | None  # the state a resumed run continues, from log_dir
    p: int  # parents per step: the optimizer's p, or what p="auto" came to for this pool, budget and valset
    minibatch_size: int  # m: each proposal's screening; the optimizer's, or what the width chose (search_width)
    reflection_examples: int  # the rows of a parent's screening its reflection reads (all of them at m <= this)
    schedule: str  # "steps" or "async": the optimizer's, or what its width chose (search_plan)
    selection: Any  # which improving children are validated: the optimizer's, or what its width chose
    prices: dict[str, Price]  # every reachable LM's price, checked when a dollar cap needs them
    earlier_usd: tuple[float, float]  # dollars (all, reflection) a resumed run had spent before this compile

    @property
    def n(self) -> int:
        return self.settings.n

    @property
    def seed_candidate(self) -> dict[str, str]:
        return self.target.seed_candidate

    @property
    def code_components(self) -> tuple[str, ...]:
        return self.target.code_components

    @classmethod
    def prepare(cls, settings: Settings, target: Target, trainset: Any, valset: Any, testset: Any = None) -> Run:
        """Every argument check, the budget, shape, guard, description and resume state."""
        data = target.prepare(settings, trainset, valset, testset)
        trainset, valset, testset = data.trainset, data.valset, data.testset
        budget = metric_call_budget(settings, target.seed_candidate, trainset, valset)
        workers = (settings.num_threads or dspy.settings.num_threads or 1) if owns_pool(settings) else (
            settings.pool.num_workers)
        p, m = search_width(settings, workers, budget, len(valset), len(trainset))
        guard = BudgetGuard(budget, len(valset), m, crossover=settings.use_merge,
                            name="auto" if settings.auto is not None else "max_metric_calls",
                            shrinks=settings.reflection_minibatch_size is None)
        checks.budget_buys_one_step(budget, len(valset), guard.fewest_rows(), guard.smallest_budget())
        checks.writable_dir("log_dir", settings.log_dir)
        reflection_lm = resolve_reflection_lm(settings)
        shape = RunShape(workers, budget, len(valset), m)
        reflection_examples = rows_reflection_reads(settings.reflection_minibatch_size)
        schedule, selection = search_plan(settings, p * settings.n)
        description = describe(settings, p, m, schedule, selection, target, data, budget, workers, reflection_lm)
        saved_state = resume.load_saved_state(settings.log_dir)
        if saved_state is not None:
            resume.check_resumable(saved_state, resume_settings(description), settings.log_dir)
        use_bundled_price_maps()  # before the first LM call: no network but the user's LMs
        prices = caps_gate.priced_for_caps(settings.max_cost_usd, settings.max_reflection_cost_usd,
                                           feed.reachable_lms(reflection_lm, *data.lms))
        return cls(settings, target, trainset, valset, testset, data.lms, reflection_lm, shape, guard, description,
                   saved_state, p, m, reflection_examples, schedule, selection, prices,
                   resume.saved_dollars(saved_state))

    # ------------------------------------------------------------------------------ resources
    @contextmanager
    def resources(self) -> Iterator[Live]:
        """What the search runs on, started now and closed after the result: a pool this compile owns is
        closed, a failed search is reported to its tracked run, and tracking never stops the search."""
        settings = self.settings
        owned = owns_pool(settings)
        pool = make_pool(settings.pool, self.shape.workers) if owned else settings.pool
        stack = ExitStack()
        tracked_run: TrackedRun | None = None
        try:
            stack.enter_context(self.target.around_search())
            ledger = RunLedger(self.prices, earlier_usd=self.earlier_usd)
            caps = (RunCaps(ledger, settings.max_cost_usd, settings.max_reflection_cost_usd, settings.max_wall_s)
                    if self.description.caps else None)
            tracker = effective_tracker(settings.tracker)
            tracked_run = start_tracked_run(tracker, self.description, log_dir=settings.log_dir, ledger=ledger)
            log_dir = settings.log_dir or (tracked_run.log_dir if tracked_run is not None else None)
            step_log = StepLog(log_dir) if log_dir is not None else None
            recorder = StepRecorder(
                self.p, self.n, self.shape, pool, ledger, schedule=self.schedule, caps=caps,
                sinks=[*([step_log] if step_log else []), *([tracked_run.on_step] if tracked_run else []),
                       *(c.on_step_record for c in settings.callbacks if callable(getattr(c, "on_step_record", None)))],
            )
            events = StepEvents([ledger, recorder], stop=ledger)
            # One generator for parents, minibatches and the crossover, as gepa.optimize's (a 1×1 run draws
            # dspy.GEPA's); the sampler's position and generator ride in gepa's state as the adapter's (engine.resume).
            sampler = SequentialMinibatchSampler(self.minibatch_size, random.Random(settings.seed))
            adapter = self.target.adapter(settings, pool, events, self.reflection_examples, resume.checkpoint(
                resume_settings(self.description), sampler, ledger.spent_usd))
            if self.saved_state is not None:
                self._resume(adapter, recorder, step_log)
            checks.warn_if_no_timeout("reflection", self.reflection_lm)
            run_lms = (self.reflection_lm, *self.task_lms)
            with caps_gate.installed(caps), limiter.installed(settings.lm_limiter), feed.feeding(ledger, run_lms):
                ledger.start(pool.num_workers)  # the run's clock: the deadline counts from now
                yield Live(pool, ledger, caps, tracked_run, recorder, events, adapter, sampler,
                           gepa_callbacks=[*(tracked_run.gepa_callbacks if tracked_run else []), *settings.callbacks])
        except BaseException as error:
            if tracked_run is not None:
                quietly("fail", lambda failure=error: tracked_run.fail(failure))
            raise
        finally:
            stack.close()
            if owned:
                pool.close()

    def _resume(self, adapter: PooledAdapter, recorder: StepRecorder, step_log: StepLog | None) -> None:
        """gepa re-evaluates the seed before it loads its saved state: the saved scores answer that, and the
        step log keeps the steps the saved state includes."""
        saved = self.saved_state
        completed = saved.i + 1
        logger.info("Resuming from log_dir=%s after step %d (%d of %d metric calls spent).",
                    self.settings.log_dir, completed, saved.total_num_evals, self.shape.budget)
        scores = resume.saved_seed_scores(saved, len(self.valset))
        adapter.replay_once(self.seed_candidate, self.valset, adapter.scores_only(scores))
        if step_log is not None:
            recorder.steps = step_log.keep_first(completed)

    # ------------------------------------------------------------------------------ result
    def ended(self, gepa_result: GEPAResult, live: Live) -> str:
        """The search is over: the ledger stops counting it (a held-out score after it passes the caps,
        uncounted) and the run says which budget ended it (returned: ``stopped_by``). The target's
        ``result`` then makes what the optimizer returns."""
        live.ledger.search_returned()
        return self.stopped_by(gepa_result, live.ledger)

    def stopped_by(self, gepa_result: GEPAResult, ledger: RunLedger) -> str:
        """Which budget ended the search (the run's one stop signal says), said in the log."""
        ended = ledger.stopped_by or self.guard.name  # a search that ran out of work ran out of its budget
        spent = getattr(gepa_result, "total_metric_calls", None)
        dollars = f" (${ledger.spent_usd()[0]:.4f} spent)" if self.prices else ""
        logger.info("%s ended the run%s, after %s of %d metric calls; the best program found is returned.", ended,
                    dollars, spent, self.shape.budget)
        return ended


@dataclass
class Live:
    """A prepared run's parts while it runs; ``Run.resources`` starts and closes them."""

    pool: WorkerPool
    ledger: RunLedger  # the run's LM calls, tokens, dollars and pace (its one clock), and its stop signal
    caps: RunCaps | None  # the dollar and time caps every LM call of the search passes
    tracked_run: TrackedRun | None
    recorder: StepRecorder  # one StepRecord per step, to the step log, the user's sinks and the tracked run
    events: StepEvents  # the step events, heard by the recorder (and whatever a schedule adds)
    adapter: PooledAdapter  # every rollout of the run, on the pool
    sampler: SequentialMinibatchSampler  # each proposal's minibatch, on the run's one generator; saved for resume
    gepa_callbacks: list[Any]  # the tracked run's and the user's gepa callbacks (the recorder is not one of them)


# ---------------------------------------------------------------------------------- decisions
def metric_call_budget(settings: Settings, seed_candidate: dict[str, str], trainset: list[Example],
                       valset: list[Example]) -> int:
    """The budget in metric calls, as dspy.GEPA computes it: ``auto``'s preset for this program and valset
    (dspy.GEPA's own formula, said in the log), ``max_full_evals`` passes over train + val, or
    ``max_metric_calls``. With no budget at all, ``auto="light"``."""
    if settings.auto is not None:
        # dspy.GEPA's own formula; it reads nothing of the optimizer it is a method of.
        calls = dspy.GEPA.auto_budget(None, num_preds=max(len(seed_candidate), 1),
                                      num_candidates=AUTO_RUN_SETTINGS[settings.auto]["n"], valset_size=len(valset))
        explained = (f"auto={settings.auto!r}: {calls} metric calls, as dspy.GEPA's auto gives for "
                     f"{len(seed_candidate)} component(s) and |val|={len(valset)}.")
        logger.info(("No budget given: " + explained + " Pass max_metric_calls=... to set one.")
                    if settings.budget_by_default else explained)
        return calls
    if settings.max_full_evals is not None:
        return settings.max_full_evals * (len(trainset) + len(valset))
    return settings.max_metric_calls


def resolve_reflection_lm(settings: Settings) -> dspy.BaseLM | None:
    """The reflection LM given, else the task LM (said once per run), else None for a custom proposer."""
    if settings.reflection_lm is not None:
        return settings.reflection_lm
    task_lm = dspy.settings.lm
    if task_lm is not None and settings.instruction_proposer is None:
        logger.info("No reflection_lm given: the task LM %s also reflects. A stronger reflection LM "
                    "(reflection_lm=dspy.LM(...)) usually finds better instructions.", lm_name(task_lm))
    return task_lm


def search_width(settings: Settings, workers: int, budget: int, val_size: int, train_size: int) -> tuple[int, int]:
    """P (the optimizer's p, or for p="auto" the parents that fill this pool within what the budget allows) and m,
    the minibatch each proposal is screened on: the optimizer's ``reflection_minibatch_size``, or, where the user
    left it, dspy.GEPA's 3 at one proposal at a time and ``width.screening_minibatch`` above it (said once)."""
    given = settings.reflection_minibatch_size
    if budget < val_size:  # buys not even the seed's validation (checks.budget_buys_one_step says so)
        return (1 if settings.p == AUTO else settings.p), given or REFLECTION_EXAMPLES
    wide_m = given or screening_minibatch(train_size, val_size)
    p = settings.p if settings.p != AUTO else auto_parents(RunShape(workers, budget, val_size, wide_m), settings.n)
    one_at_a_time = p * settings.n == 1
    m = given or (REFLECTION_EXAMPLES if one_at_a_time else wide_m)
    if settings.p == AUTO:
        logger.info("p='auto': P×N = %d×%d (%d proposals in flight) for W=%d workers, B=%d metric calls, |val|=%d.",
                    p, settings.n, p * settings.n, workers, budget, val_size)
    if given is None and m != REFLECTION_EXAMPLES:
        logger.info("reflection_minibatch_size: each proposal is screened on up to %d training examples: its "
                    "reflection reads %d, and its child is screened on the rest only if it beat its parent on those "
                    "(pass reflection_minibatch_size=... to screen on that many and read them all).", m,
                    REFLECTION_EXAMPLES)
    return p, m


def search_plan(settings: Settings, width: int) -> tuple[str, Any]:
    """The schedule and selection: the optimizer's, or what its width chooses where it left them open.

    One proposal per step is dspy.GEPA's own loop (``"steps"``, every improving child validated,
    ``"all"``). Wider, the asynchronous schedule with the sibling merge, measured to keep dspy.GEPA's
    held-out quality several times sooner (``docs/benchmarks.md``), unless an argument only gepa's
    step loop reads was given (``use_wandb``, most ``gepa_kwargs``). The run says what it chose.
    """
    loop_only = settings.use_wandb or bool(checks.loop_only_gepa_kwargs(settings.gepa_kwargs))
    schedule = settings.schedule or ("async" if width > 1 and not loop_only else "steps")
    selection = settings.selection if settings.selection is not None else ("merge" if width > 1 else "all")
    chosen = [f"{name}={value!r}" for name, value, given in (
        ("schedule", schedule, settings.schedule), ("selection", selections.label(selection), settings.selection))
        if given is None]
    if chosen and width > 1:
        logger.info("P×N = %d×%d: %s (the defaults above one proposal per step; p=1, n=1 is dspy.GEPA's search).",
                    width // settings.n, settings.n, ", ".join(chosen))
    return schedule, selection


def owns_pool(settings: Settings) -> bool:
    """A pool given as an instance is the caller's (left open); otherwise each compile makes and closes its own."""
    return settings.pool is None or settings.pool == "ray"


def make_pool(pool: str | None, workers: int) -> WorkerPool:
    """The pool a compile owns: threads, or Ray actors for ``pool="ray"`` (same W)."""
    if pool == "ray":
        from dspy_pxn.pools.ray import RayWorkerPool

        return RayWorkerPool(address=os.environ.get("RAY_ADDRESS"), max_concurrency=workers)
    return ThreadWorkerPool(workers)


def describe(settings: Settings, p: int, m: int, schedule: str, selection: Any, target: Target, data: TargetData,
             budget: int, workers: int, reflection_lm: Any) -> RunDescription:
    """This compile, described once for tracking (params) and resume (settings)."""
    selector = settings.candidate_selection_strategy
    shape, trainset, valset, testset = data.shape, data.trainset, data.valset, data.testset
    return RunDescription(
        p=p, n=settings.n, selection=selections.label(selection), schedule=schedule,
        minibatch_size=m, seed=settings.seed, crossover=settings.use_merge,
        candidate_selection=selector if isinstance(selector, str) else type(selector).__name__,
        budget=budget, num_workers=workers, program=shape.name, predictors=shape.components,
        code_components=len(target.code_components),
        dataset=getattr(trainset, "name", None) or "unnamed", trainset_size=len(trainset),
        valset_size=len(valset), testset_size=len(testset or []),
        task_lms=shape.task_lms, reflection_lm=reflection_lm,
        trainset_digest=digest(trainset), valset_digest=digest(valset),
        seed_candidate_digest=digest([f"{k}={v}" for k, v in sorted(target.seed_candidate.items())]),
        input_example=shape.input_example,
        caps={name: value for name in ("max_cost_usd", "max_reflection_cost_usd", "max_wall_s")
              if (value := getattr(settings, name)) is not None},
    )
