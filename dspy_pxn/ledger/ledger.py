"""One run's LM calls and what they cost, in one place: the ``RunLedger``.

It hears each call from two places DSPy already has: its start, attempts and end from the run's
one LM callback (``feed``), and its billed usage as DSPy's ``usage_tracker``, which DSPy hands every
billed call's usage while the call is in progress. It is the only place a call is priced, then, so
a dollar cap reading it is never late. It also keeps the run's pace and its one clock (the step
events' rollouts and reflections, how long they took): the deadline, the caps' plans and each step
record's time left read the same numbers, so none can disagree. The caps, step records, progress
line, tracking, result and resume all read it; a step's share is ``tally().since(previous)``. It
holds the run's one signal that it is over (``end``, ``stopped_by``, ``refusing``, ``returned``), read by
every schedule, pool and callback; once the search has returned, the ledger is frozen (``search_returned``).
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, fields, replace
from typing import Any

import dspy
from dspy.utils.usage_tracker import UsageTracker

from dspy_pxn.engine.events import Phase, StepListener, override
from dspy_pxn.ledger.limiter import active_limiters
from dspy_pxn.ledger.prices import Price, billed_tokens, token_prices

logger = logging.getLogger(__name__)

# The DSPy setting a reflection or sibling merge sets around its LM calls: the reflection LM may be
# the task LM, so the object alone does not say which budget a call is charged to.
REFLECTING = "dspy_pxn_reflecting"
# The DSPy setting a rollout sets around the program's own call (``rollout.call_program``): a billed call the run did
# not hear start is the program's unheld LM only there, not a metric's judge or a custom proposer's own LM. A DSPy
# setting, not a context variable, so it reaches the threads a program's ``dspy.Parallel`` starts.
RUNNING_PROGRAM = "dspy_pxn_running_program"
RECENT = 50  # the pace's medians read the latest this many measurements: a run's latency drifts


@dataclass(frozen=True)
class UsageTotals:
    """Billed LM calls, their tokens and dollars; ``cost_usd`` is None while no call had a known price.

    A run's totals split by who made the calls: ``task`` (the program's LMs, a metric's judge, anything a
    rollout calls) and ``reflection`` (the reflection LM's proposals and sibling merges, or a custom proposer's
    calls), each a ``UsageTotals`` of its own. Reflection is usually the dearer model: its share is the bill
    that width can buy more of.
    """

    lm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    unpriced_calls: int = 0
    task: UsageTotals | None = None
    reflection: UsageTotals | None = None


@dataclass(frozen=True)
class LMCallCounts:
    """LM calls of the run's LMs (cache hits included). ``attempts`` are requests sent to a provider and
    ``retries`` those beyond a call's first (None where DSPy does not tell them, see ``feed``);
    ``failures`` are calls that raised after their last retry. ``abandoned`` are calls the run returned
    without (in flight when it ended, or started after): in no other count, so ``calls + abandoned`` are
    all the calls it started."""

    calls: int = 0
    attempts: int | None = 0
    retries: int | None = 0
    failures: int = 0
    peak_in_flight: int = 0
    abandoned: int = 0


@dataclass(frozen=True)
class Tally:
    """What the ledger holds at one moment. ``since`` an earlier tally is what happened in between."""

    calls: int = 0  # calls of the run's LMs that ended, cache hits included
    attempts: int = 0
    retries: int = 0
    failures: int = 0
    billed: int = 0  # calls whose usage was billed (a cache hit is not), whatever LM made them
    unheld: int = 0  # billed calls the program made with LMs the run does not hold: no start or end was heard
    prompt_tokens: int = 0
    completion_tokens: int = 0
    task_usd: float = 0.0
    reflection_usd: float = 0.0
    unpriced: int = 0  # billed calls whose model has no price
    # The reflection's share of ``billed``, the tokens and ``unpriced`` (the task's is the rest).
    reflection_billed: int = 0
    reflection_prompt_tokens: int = 0
    reflection_completion_tokens: int = 0
    reflection_unpriced: int = 0
    attempts_unknown: int = 0  # ended calls whose attempts DSPy did not tell
    peak_in_flight: int = 0
    abandoned: int = 0

    @property
    def cost_usd(self) -> float | None:
        return self.task_usd + self.reflection_usd if self.billed > self.unpriced else None

    @property
    def usage(self) -> UsageTotals:
        reflection = UsageTotals(
            self.reflection_billed, self.reflection_prompt_tokens, self.reflection_completion_tokens,
            self.reflection_usd if self.reflection_billed > self.reflection_unpriced else None, self.reflection_unpriced)
        task_billed, task_unpriced = self.billed - self.reflection_billed, self.unpriced - self.reflection_unpriced
        task = UsageTotals(task_billed, self.prompt_tokens - self.reflection_prompt_tokens,
                           self.completion_tokens - self.reflection_completion_tokens,
                           self.task_usd if task_billed > task_unpriced else None, task_unpriced)
        return UsageTotals(self.billed, self.prompt_tokens, self.completion_tokens, self.cost_usd, self.unpriced,
                           task=task, reflection=reflection)

    @property
    def counts(self) -> LMCallCounts:
        known = not self.attempts_unknown
        return LMCallCounts(self.calls, self.attempts if known else None, self.retries if known else None,
                            self.failures, self.peak_in_flight, self.abandoned)

    def since(self, earlier: Tally) -> Tally:
        """What happened after ``earlier`` (the peak in flight is this tally's)."""
        return self._with(earlier, -1)

    def plus(self, other: Tally) -> Tally:
        """Both tallies' counts (``other``: calls made where this ledger could not hear them, a Ray actor)."""
        return self._with(other, 1)

    def _with(self, other: Tally, sign: int) -> Tally:  # counts add up; the peak is this moment's
        return Tally(**{f.name: getattr(self, f.name) + (0 if f.name == "peak_in_flight" else
                                                         sign * getattr(other, f.name)) for f in fields(self)})


@dataclass
class Call:
    """One LM call in progress: what the ledger heard of it so far."""

    call_id: str
    model: str
    reflection: bool
    executed: bool = False  # it reached DSPy's execution, which counts its attempts
    attempts: int = 0
    failed_attempts: int = 0
    last_attempt_failed: bool = False
    cost_usd: float = 0.0
    prompt_tokens: int = 0
    billed: bool = False
    abandoned: bool = False
    # Its usage goes to a tracker of the program's own (a ``dspy.track_usage()`` inside ``forward``), which
    # hands it to the ledger when its block ends: a bill with no call in progress that is not an unheld LM's.
    usage_elsewhere: bool = False


# The calls in progress in this context, one per ledger hearing them: where an attempt or a billed usage
# lands. A context variable: DSPy makes a call's attempts and bills it in the thread (or task) it began in.
_IN_PROGRESS: contextvars.ContextVar[tuple[tuple[RunLedger, Call], ...]] = contextvars.ContextVar(
    "dspy_pxn_lm_calls", default=())


def calls_in_progress() -> tuple[tuple[RunLedger, Call], ...]:
    return _IN_PROGRESS.get()


class _BilledEntries(defaultdict):
    """A tracker's ``usage_data`` that bills each entry to a ledger as it is added (a program's own
    ``dspy.track_usage()`` hands its entries up by extending these lists, not through ``add_usage``)."""

    ledger: RunLedger  # set by the tracker that holds them (``billed_entries``)

    def __missing__(self, model: str) -> _Bill:
        return self.setdefault(model, _Bill(self.ledger, model))  # two threads' first bills: one list


class _Bill(list):
    def __init__(self, ledger: RunLedger, model: str):
        super().__init__()
        self.ledger, self.model = ledger, model

    def append(self, entry: Any) -> None:
        self.ledger.bill(self.model, entry)
        super().append(entry)

    def extend(self, entries: Any) -> None:
        for entry in entries:
            self.append(entry)


class BilledTracker(UsageTracker):
    """A usage tracker whose entries the run's ledger bills as they come (a rollout's own: ``call_program``).
    ``dspy.Parallel`` deep-copies it into its threads (in a program, or DSPy's evaluators): the copy is itself."""

    def __init__(self, ledger: RunLedger):
        super().__init__()
        self.usage_data = _BilledEntries(list)
        self.usage_data.ledger = ledger

    def __deepcopy__(self, memo: dict[int, Any]) -> BilledTracker:
        return self


class RunLedger(BilledTracker, StepListener):
    """The run's LM calls, dollars and pace; DSPy's usage tracker for the run, fed once per call by ``feed``,
    and a listener of its step events (every batch of rollouts, every reflection).

    ``prices``: models priced before the run (a dollar cap checks them all); others are looked up on
    their first billed call. ``earlier_usd``: dollars (all, reflection) a resumed run had spent before.
    The clock runs from construction until ``start`` restarts it when the search begins.

    The run's stop signal: ``stopped_by`` names the budget that ended the search (no more work is started,
    what is in flight may finish); ``refusing``: every LM call of the search is refused from now on (a cap
    refused one); ``returned``: the search has returned, and nothing that happens now is the run's.
    """

    def __init__(self, prices: dict[str, Price | None] | None = None, *, earlier_usd: tuple[float, float] = (0.0, 0.0)):
        super().__init__(self)
        self.parent: UsageTracker | None = None  # an enclosing tracker (``dspy.track_usage()`` around compile)
        self.prices: dict[str, Price | None] = dict(prices or {})
        self.earlier_usd, self.earlier_reflection_usd = earlier_usd
        self.stopped_by: str | None = None
        self.refusing = self.returned = False
        self._lock = threading.Lock()
        self._open: dict[str, Call] = {}
        self._tally = Tally()
        self._handed_up_later = 0  # ended calls whose usage a program's own tracker will hand up (``Call``)
        self.workers = 1  # the pool's W, for the rounds a batch of rollouts takes
        self.started, self.started_epoch = time.perf_counter(), time.time()
        self.rollouts = self.reflections = 0
        self._batches = 0
        self._wave_s: list[float] = []
        self._reflection_s: list[float] = []
        self._metric_calls0: int | None = None  # spent when the search began (the seed, or a resumed run's)
        self._usd0 = 0.0

    # -- a call's life, told by the feed ------------------------------------------------------------
    def call_started(self, call_id: str, model: str) -> None:
        call = Call(call_id, model, reflection=bool(dspy.settings.get(REFLECTING, False)),
                    usage_elsewhere=not isinstance(dspy.settings.usage_tracker, BilledTracker))
        with self._lock:
            if self.returned:  # a call the search returned without: never the run's
                call.abandoned = True
                self._tally = replace(self._tally, abandoned=self._tally.abandoned + 1)
            else:
                self._open[call_id] = call
                self._tally = replace(self._tally, peak_in_flight=max(self._tally.peak_in_flight, self._running()))
        _IN_PROGRESS.set((*_IN_PROGRESS.get(), (self, call)))

    def _running(self) -> int:
        """The calls open now (caller holds ``_lock``); under a cap on concurrent calls, those holding a slot: one
        whose slot was released has ended at the provider, though its end reaches the ledger a moment later."""
        limiters = active_limiters()
        if not limiters:
            return len(self._open)
        holding = frozenset().union(*(limiter.holding() for limiter in limiters))
        return sum(call_id in holding for call_id in self._open)

    def call_ended(self, call_id: str, exception: BaseException | None) -> None:
        _IN_PROGRESS.set(tuple(entry for entry in _IN_PROGRESS.get()
                               if entry[0] is not self or entry[1].call_id != call_id))
        with self._lock:
            call = self._open.pop(call_id, None)
            if call is None:  # abandoned: the search returned while it was in flight
                return
            t = self._tally
            self._handed_up_later += call.usage_elsewhere and not call.billed
            retries = call.failed_attempts - (exception is not None and call.last_attempt_failed)
            self._tally = replace(t, calls=t.calls + 1, attempts=t.attempts + call.attempts,
                                  retries=t.retries + retries, failures=t.failures + (exception is not None),
                                  attempts_unknown=t.attempts_unknown + (not call.executed))

    def call_in_progress(self) -> Call | None:
        """This context's call in progress, as heard so far (its cost, its billed prompt tokens)."""
        return next((call for ledger, call in reversed(_IN_PROGRESS.get()) if ledger is self), None)

    # -- billing: DSPy's usage tracker ----------------------------------------------------------------
    def add_usage(self, lm: str, usage_entry: dict[str, Any]) -> None:
        """DSPy reports a billed call: priced and counted now (the ledger keeps totals, not every entry; a nested
        tracker's entries come through ``usage_data``, which bills them as they are handed up)."""
        if usage_entry:
            self.bill(lm, self._flatten_usage_entry(usage_entry))

    def bill(self, model: str, entry: Any) -> None:
        """Price one billed call and count it, for the call in progress in this context if there is one."""
        call = self.call_in_progress()
        if call is not None and call.abandoned:
            return
        reflection = call.reflection if call is not None else bool(dspy.settings.get(REFLECTING, False))
        prompt, completion = (count or 0 for count in billed_tokens(entry))
        if model not in self.prices:
            self.prices[model] = token_prices(model)
        price = self.prices[model]
        cost = price.of(prompt, completion) if price is not None else 0.0
        with self._lock:
            if self.returned:
                return
            handed_up = call is None and self._handed_up_later > 0
            self._handed_up_later -= handed_up
            unheld = call is None and not handed_up and bool(dspy.settings.get(RUNNING_PROGRAM, False))
            t = self._tally
            self._tally = replace(
                t, billed=t.billed + 1, unheld=t.unheld + unheld,
                prompt_tokens=t.prompt_tokens + prompt, completion_tokens=t.completion_tokens + completion,
                unpriced=t.unpriced + (price is None),
                task_usd=t.task_usd + (0.0 if reflection else cost),
                reflection_usd=t.reflection_usd + (cost if reflection else 0.0),
                reflection_billed=t.reflection_billed + reflection,
                reflection_prompt_tokens=t.reflection_prompt_tokens + (prompt if reflection else 0),
                reflection_completion_tokens=t.reflection_completion_tokens + (completion if reflection else 0),
                reflection_unpriced=t.reflection_unpriced + (reflection and price is None))
            if call is not None:
                call.cost_usd += cost
                call.prompt_tokens += prompt
                call.billed = True
        if self.parent is not None:  # as DSPy hands a nested tracker's usage up
            self.parent.add_usage(model, entry)

    # -- the stop signal --------------------------------------------------------------------------------
    def end(self, budget: str, why: str, refuse: bool = False) -> None:
        """No more work is started (and with ``refuse``, every later LM call is refused): ``budget`` ended the
        run, the first to say so is kept."""
        with self._lock:
            first = not self.refusing if refuse else self.stopped_by is None
            self.stopped_by, self.refusing = self.stopped_by or budget, self.refusing or refuse
        if first:
            logger.info("%s: %s; %s.", budget, why, "the search stops and returns the best program found" if refuse
                        else "no more work is started")

    # -- reading ----------------------------------------------------------------------------------------
    def tally(self) -> Tally:
        with self._lock:
            return self._tally

    def spent_usd(self) -> tuple[float, float]:
        """Dollars spent in all and on reflection, a resumed run's earlier dollars included."""
        tally = self.tally()
        return (self.earlier_usd + tally.task_usd + tally.reflection_usd,
                self.earlier_reflection_usd + tally.reflection_usd)

    def absorb(self, remote: Tally) -> None:
        """Calls made where the feed could not hear them (a Ray actor's rollouts), counted and priced there."""
        with self._lock:
            if not self.returned:
                self._tally = self._tally.plus(remote)

    def search_returned(self) -> None:
        """The search is over: calls in flight now are abandoned, and nothing later changes the tally."""
        with self._lock:
            self.returned = True
            for call in self._open.values():
                call.abandoned = True
            self._tally = replace(self._tally, abandoned=self._tally.abandoned + len(self._open))
            self._open.clear()


    # -- the pace: rollouts and reflections, how long they took, the time left -------------------------
    def start(self, workers: int) -> None:
        """The search begins on a pool of ``workers``: its clock starts now (what it spent before, a resumed
        run's dollars, is not its pace)."""
        self.workers, self._usd0 = workers, self.spent_usd()[0]
        self.started, self.started_epoch = time.perf_counter(), time.time()

    def elapsed(self) -> float:
        """Seconds since the search began: the run's one clock."""
        return time.perf_counter() - self.started

    def now_epoch(self) -> float:
        """The run's clock as a Unix time (what a step record's ``started_at`` says)."""
        return self.started_epoch + self.elapsed()

    def steps_begin(self, metric_calls: int) -> None:
        """The first step begins with this many metric calls spent (the seed's validation, a resumed run's)."""
        if self._metric_calls0 is None:
            self._metric_calls0 = metric_calls

    @override
    def evaluated(self, phase: Phase, seconds: float, rollouts: int, failures: int) -> None:
        with self._lock:
            self.rollouts += rollouts
            self._batches += 1
            if rollouts and self._batches > 1:  # the first batch pays the run's one-off costs (imports, connections)
                self._wave_s.append(seconds / -(-rollouts // self.workers))  # a batch wider than the pool: waves

    @override
    def reflected(self, seconds: float, jobs: int, failed: int) -> None:
        with self._lock:
            self.reflections += jobs
            self._reflection_s.append(seconds)

    def wave_s(self) -> float:
        """The median seconds one wave of rollouts (one per worker) takes; 0 before any was measured."""
        return _median(self._wave_s)

    def reflection_s(self) -> float:
        return _median(self._reflection_s)

    def time_left(self, metric_calls: int, budget: int, usd_left: float | None,
                  seconds_left: float | None) -> tuple[float | None, str | None]:
        """Seconds until the first budget binds at the pace this compile has kept, and that budget's name: the
        metric calls left at the calls a second so far, the dollars left (``usd_left``, None: no cap) at the
        dollars a second so far, the deadline's own ``seconds_left``."""
        elapsed = self.elapsed()
        if elapsed <= 0:
            return None, None
        estimates: dict[str, float] = {}
        if (calls := metric_calls - (self._metric_calls0 or 0)) > 0:
            estimates["max_metric_calls"] = max(0, budget - metric_calls) * elapsed / calls
        spent = self.spent_usd()[0] - self._usd0
        if usd_left is not None and spent > 0:
            estimates["max_cost_usd"] = usd_left * elapsed / spent
        if seconds_left is not None:
            estimates["max_wall_s"] = seconds_left
        if not estimates:
            return None, None
        first = min(estimates, key=estimates.__getitem__)
        return estimates[first], first


def _median(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values[-RECENT:])
    return ordered[len(ordered) // 2]


# How many of a run's metric calls may go without an LM call before the run says the cache answered them.
CACHE_WARNING_RATIO = 0.5


def answered_from_cache(usage: UsageTotals, metric_calls: int) -> bool:
    """Far fewer billed LM calls than metric calls: a cache (DSPy's is on by default) answered the run."""
    return bool(metric_calls) and usage.lm_calls < CACHE_WARNING_RATIO * metric_calls


def warn_if_answered_from_cache(usage: UsageTotals, metric_calls: int) -> None:
    """Such a run's timings, token counts and costs describe the cache, not the LMs."""
    if answered_from_cache(usage, metric_calls):
        logger.warning(
            "This run made %d LM calls for %d metric calls: most answers came from DSPy's cache (or the program "
            "calls no LM), so its wall-clock, tokens and cost do not describe a fresh run. Turn the cache off "
            "for timed or compared runs: dspy.LM(..., cache=False), or dspy.configure_cache(enable_disk_cache=False, "
            "enable_memory_cache=False).", usage.lm_calls, metric_calls,
        )
