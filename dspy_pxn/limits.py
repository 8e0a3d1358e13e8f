"""LM-call limits for a run: a cap on concurrent LM requests, and retry/failure counts.

Providers limit *requests*, not our workers: a run with W = 64 workers against a
provider that allows 16 concurrent requests must queue its calls, not collect 429s.
``LMCallCounter`` is a DSPy callback that counts LM calls, retries and failures.
``LMCallLimiter`` is a counter that also caps (BatchedGEPA installs one when given
``max_concurrent_lm_calls``): ``on_lm_start`` blocks until one of K slots is free;
``on_lm_end`` (DSPy calls it in a ``finally``) frees it. Two ways to install them:

- ``installed(...)``: a context-wide DSPy callback (``dspy.context(callbacks=[...])``). It sees
  every LM call of the context's threads, because the worker pool copies the caller's context
  into each task. The cap is installed so: it must hold for any LM. Its price is DSPy's: with
  any context-wide callback, every module, adapter and LM call of every rollout pays DSPy's
  dispatch (``inspect.getcallargs``, a uuid, handler lookups), measured at 0.2-0.45 ms per
  rollout of a bare ``dspy.Predict``, a third of the driver's CPU per metric call.
- ``counting(counter, lms)``: how a run counts its own calls. The counter is active in this
  context (a DSPy setting, so it reaches every thread the context's work runs in: our pools copy
  the context, and DSPy's own ``dspy.Parallel`` copies DSPy's settings), and the LMs the run
  reaches (``reachable_lms``: the context's LM, the reflection LM, every LM a program holds)
  carry one instance-level callback, ``COUNT_AT_THE_LM``, that hands their calls to the counters
  active in the caller's context. Only LM calls dispatch, and a call from outside the run (another
  run, another thread of the user's) reaches no counter of this run. An LM the program does not
  hold (a module-level LM, one made in ``forward``) is not seen: its billed calls still reach the
  run's usage meter, and ``uncounted_calls_warning`` names the fix at the end.

What DSPy and litellm already do, and what is added here (dspy 3.4.1, litellm 1.110):

- **Retries are DSPy's**: ``dspy.LM(num_retries=3)`` (the default) retries rate
  limits, 5xx, timeouts and transport errors; litellm is called with
  ``num_retries=0`` and the openai SDK does not retry on top (measured: one HTTP
  request per attempt). The wait between attempts is the server's ``Retry-After``
  when it sends one (measured: honoured to the millisecond), else 1, 2, 4, ... s.
- **Retry-After is honoured as is**: nothing to add, except that a slot is held
  while a call sleeps before its retry, so a rate-limited run also sends fewer
  requests meanwhile. The cap counts *calls in progress*, which bounds the HTTP
  requests in flight (one attempt at a time per call).
- **Timeouts are not set by default**: a ``dspy.LM`` without ``timeout=`` waits up
  to litellm's ``request_timeout`` (6000 s) per attempt, so one hung connection can
  hold a worker for hours. Pass ``dspy.LM(..., timeout=60)`` (task calls; 300-600
  for a reasoning reflection LM with large ``max_tokens``). A timed-out attempt is
  retried like a 5xx. BatchedGEPA warns when its LMs have no timeout
  (``warn_if_no_timeout``) instead of copying them with one, which would change
  their DSPy cache keys.
- **Retries are counted** (``attempts``/``retries``): litellm's pre-call hook runs in
  the calling thread once per HTTP attempt, so attempts are attributed to the DSPy
  call in progress in that thread; retries = attempts beyond the first of each call.
  Only litellm-engine LMs are counted (the native lm15 engine bypasses litellm).

The blocking slot is for DSPy's synchronous path (BatchedGEPA's thread pool); an
``acall`` from an event loop would block the loop and is not capped.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback

from dspy_pxn import abandoned
from dspy_pxn.checks import positive_int

logger = logging.getLogger(__name__)

__all__ = ["COUNT_AT_THE_LM", "LMCallCounter", "LMCallCounts", "LMCallLimiter", "active_counters", "counting",
           "installed", "limiter_for", "reachable_lms", "uncounted_calls_warning", "warn_if_no_timeout"]

# The counters' calls in progress in this thread/context: ((counter, call_id), ...).
_CURRENT: contextvars.ContextVar[tuple[tuple[LMCallCounter, str], ...]] = contextvars.ContextVar(
    "dspy_pxn_lm_call", default=()
)


@dataclass(frozen=True)
class LMCallCounts:
    """Totals so far. ``failures`` are calls that raised after their last retry. ``abandoned`` are calls
    the run returned without (``dspy_pxn.abandoned``): in flight when it ended, or ended after it; they are
    in no other count, so ``calls + abandoned`` are all the calls it started."""

    calls: int = 0
    attempts: int = 0
    retries: int = 0
    failures: int = 0
    peak_in_flight: int = 0
    abandoned: int = 0

    def since(self, earlier: LMCallCounts) -> LMCallCounts:
        return LMCallCounts(
            calls=self.calls - earlier.calls,
            attempts=self.attempts - earlier.attempts,
            retries=self.retries - earlier.retries,
            failures=self.failures - earlier.failures,
            peak_in_flight=self.peak_in_flight,
            abandoned=self.abandoned - earlier.abandoned,
        )


class LMCallCounter(BaseCallback):
    """DSPy callback: counts the LM calls made in its context, their retries and their failures."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}  # call_id -> attempts so far
        self._abandonable: dict[str, Callable[[], bool]] = {}  # open calls a run may return without
        self._calls = self._attempts = self._retries = self._failures = self._abandoned = 0
        self._peak = 0

    # -- DSPy callback ---------------------------------------------------------------
    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        if not _hook_installed and isinstance(instance, dspy.LM):
            _install_litellm_hook()  # only now: importing litellm costs seconds, and the call needs it anyway
        run_ended = abandoned.run_ended_check()
        with self._lock:
            self._open[call_id] = 0
            self._calls += 1
            if run_ended is not None:
                self._abandonable[call_id] = run_ended
            self._peak = max(self._peak, len(self._open))
        _CURRENT.set((*_CURRENT.get(), (self, call_id)))

    def on_lm_end(self, call_id: str, outputs: Any, exception: BaseException | None = None) -> bool:
        """Count the call's end; False when its start was never counted here."""
        with self._lock:
            attempts = self._open.pop(call_id, None)
            if attempts is None:
                return False
            run_ended = self._abandonable.pop(call_id, None)
            if run_ended is not None and run_ended():  # it ended after its run did: not the run's
                self._abandoned += 1
            else:
                self._attempts += attempts
                self._retries += max(0, attempts - 1)
                self._failures += exception is not None
        _CURRENT.set(tuple(entry for entry in _CURRENT.get() if entry != (self, call_id)))
        return True

    def _count_attempt(self, call_id: str) -> None:
        with self._lock:
            if call_id in self._open:
                self._open[call_id] += 1

    def absorb(self, counts: LMCallCounts) -> None:
        """Add calls made where this counter could not see them (a Ray actor's rollout)."""
        with self._lock:
            self._calls += counts.calls
            self._attempts += counts.attempts
            self._retries += counts.retries
            self._failures += counts.failures

    # -- reading -----------------------------------------------------------------------
    def counts(self) -> LMCallCounts:
        """Calls that ended or are in progress; those the run returned without apart, as ``abandoned``."""
        with self._lock:
            abandoned = self._abandoned + sum(run_ended() for run_ended in self._abandonable.values())
            return LMCallCounts(self._calls - abandoned, self._attempts, self._retries, self._failures, self._peak,
                                abandoned)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._open)

    def installed(self):
        """``with counter.installed():`` every LM call in this context (and pool tasks it submits) goes through it."""
        return installed(self)


CAP_HINT = "Set it to the concurrent requests your provider allows, e.g. 16."


class LMCallLimiter(LMCallCounter):
    """At most ``max_concurrent`` LM calls at once (it counts them too, as any ``LMCallCounter``).

    One limiter may be shared by several runs (e.g. a sweep against one provider account):
    pass the same instance as ``BatchedGEPA(max_concurrent_lm_calls=limiter)``.
    """

    def __init__(self, max_concurrent: int):
        super().__init__()
        self.max_concurrent = positive_int("max_concurrent_lm_calls", max_concurrent, CAP_HINT)
        self._slots = threading.BoundedSemaphore(max_concurrent)

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self._slots.acquire()  # before counting: waiting for a slot is not a call in progress
        super().on_lm_start(call_id, instance, inputs)

    def on_lm_end(self, call_id: str, outputs: Any, exception: BaseException | None = None) -> bool:
        counted = super().on_lm_end(call_id, outputs, exception)
        if counted:  # a call whose start was never recorded here holds no slot
            self._slots.release()
        return counted

    @property
    def slots(self) -> threading.BoundedSemaphore:
        """The cap itself, for pools whose LM calls run where this callback cannot see them (Ray
        actors): such a pool holds one slot per rollout in flight, shared with every other call."""
        return self._slots


def installed(*counters: LMCallCounter | None):
    """Install counters (and limiters) as DSPy callbacks for this context; a cap before a counter, so
    waiting for a slot is not counted as a call in progress."""
    callbacks = list(dspy.settings.get("callbacks", None) or [])
    added = [counter for counter in counters if counter is not None and counter not in callbacks]
    return dspy.context(callbacks=[*callbacks, *added])


# ----------------------------------------------------------------------------- counting at the LM
# The DSPy setting that holds the counters a run made active (``counting``). A setting, not a context
# variable of ours: dspy.Parallel inside a program runs its items in threads that get DSPy's settings only.
COUNTERS_SETTING = "dspy_pxn_lm_counters"


def _counting_here() -> tuple[LMCallCounter, ...]:
    return dspy.settings.get(COUNTERS_SETTING, None) or ()


class _CountAtTheLM(BaseCallback):
    """An LM's instance-level callback: its calls go to the counters active in the caller's context.

    It is stateless and one per process, so an LM copied during a run (a candidate program's
    deep copy, a Ray actor's unpickled LM) carries the same object, which does nothing where no
    run counts."""

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        for counter in _counting_here():
            counter.on_lm_start(call_id, instance, inputs)

    def on_lm_end(self, call_id: str, outputs: Any, exception: BaseException | None = None) -> None:
        for counter in _counting_here():
            counter.on_lm_end(call_id, outputs, exception)

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _count_at_the_lm, ()

    def __copy__(self) -> _CountAtTheLM:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _CountAtTheLM:
        return self


COUNT_AT_THE_LM = _CountAtTheLM()


def _count_at_the_lm() -> _CountAtTheLM:
    return COUNT_AT_THE_LM


_counting_lock = threading.Lock()
_counted_lms: dict[int, list[Any]] = {}  # id(lm) -> [lm, runs counting its calls]


def reachable_lms(*roots: Any) -> list[dspy.BaseLM]:
    """The LMs among ``roots`` and held by them (a program's predictors' LMs, LM attributes of its
    modules, in lists and dicts too), each once."""
    found: dict[int, dspy.BaseLM] = {}
    for root in roots:
        if isinstance(root, dspy.BaseLM):
            found.setdefault(id(root), root)
        elif isinstance(root, dspy.Module):
            for _, lm in root.named_sub_modules(type_=dspy.BaseLM):
                found.setdefault(id(lm), lm)
    return list(found.values())


@contextmanager
def counting(counter: LMCallCounter, lms: Iterable[Any]) -> Iterator[None]:
    """Count the calls ``lms`` make in this context (and the pool tasks it submits) with ``counter``.

    Several runs may count the same LM at once; the callback leaves an LM when the last one ends."""
    lms = reachable_lms(*lms)
    with _counting_lock:
        for lm in lms:
            entry = _counted_lms.setdefault(id(lm), [lm, 0])
            entry[1] += 1
            _carry(lm)
    try:
        with dspy.context(**{COUNTERS_SETTING: (*_counting_here(), counter)}):
            yield
    finally:
        with _counting_lock:
            for lm in lms:
                entry = _counted_lms[id(lm)]
                entry[1] -= 1
                if entry[1] == 0:
                    del _counted_lms[id(lm)]
                    _drop(lm)


def leave_uncounted(program: Any) -> None:
    """Take the callback off the LMs a program holds that no run counts (copies made during a run),
    so a returned program costs nothing per call and pickles without dspy_pxn."""
    with _counting_lock:
        for lm in reachable_lms(program):
            if id(lm) not in _counted_lms:
                _drop(lm)


def active_counters() -> list[LMCallCounter]:
    """Every counter that sees this context's LM calls: context-wide callbacks and ``counting``'s."""
    callbacks = [c for c in dspy.settings.get("callbacks", None) or [] if isinstance(c, LMCallCounter)]
    return [*callbacks, *(c for c in _counting_here() if c not in callbacks)]


def _carry(lm: Any) -> None:
    callbacks = getattr(lm, "callbacks", None)
    if not isinstance(callbacks, list):  # an LM class that skipped BaseLM.__init__
        lm.callbacks = callbacks = [*(callbacks or [])]
    if not any(c is COUNT_AT_THE_LM for c in callbacks):
        callbacks.append(COUNT_AT_THE_LM)


def _drop(lm: Any) -> None:
    callbacks = getattr(lm, "callbacks", None)
    if isinstance(callbacks, list):
        callbacks[:] = [c for c in callbacks if c is not COUNT_AT_THE_LM]


def uncounted_calls_warning(billed_calls: int, counted_calls: int) -> str | None:
    """What to tell the user when the usage meter saw more billed calls than the counter saw calls:
    some LM the run does not reach made them (counted calls include cache hits, so never fewer)."""
    if billed_calls <= counted_calls:
        return None
    return (f"{billed_calls - counted_calls} LM calls came from an LM the program does not hold (a module-level "
            "LM or one made in forward): their tokens and dollars are in the usage totals, but they are not in "
            "lm_call_counts. Hold that LM on the program (predictor.set_lm(lm), or an attribute of a module) "
            "to count them.")


def limiter_for(max_concurrent_lm_calls: int | LMCallLimiter | None) -> LMCallLimiter | None:
    """The cap BatchedGEPA installs: the limiter given (it may be shared), a new one for an int, None for None."""
    if isinstance(max_concurrent_lm_calls, LMCallCounter) and not isinstance(max_concurrent_lm_calls, LMCallLimiter):
        raise TypeError("max_concurrent_lm_calls takes an int or an LMCallLimiter; an LMCallCounter only counts.")
    if isinstance(max_concurrent_lm_calls, LMCallLimiter):
        return max_concurrent_lm_calls
    positive_int("max_concurrent_lm_calls", max_concurrent_lm_calls, CAP_HINT, or_none=True)
    return LMCallLimiter(max_concurrent_lm_calls) if max_concurrent_lm_calls is not None else None


# ----------------------------------------------------------------------------- litellm attempts
_hook_lock = threading.Lock()
_hook_installed = False


def _install_litellm_hook() -> None:
    """Register (once per process) a litellm input callback that counts HTTP attempts.

    It does nothing outside a counter's LM call, so other litellm users are unaffected.
    """
    global _hook_installed
    with _hook_lock:
        if _hook_installed:
            return
        try:
            import litellm
            from litellm.integrations.custom_logger import CustomLogger
        except ImportError:  # pragma: no cover - litellm is a dspy dependency
            return

        class _AttemptCounter(CustomLogger):
            def log_pre_api_call(self, model, messages, kwargs):
                for counter, call_id in _CURRENT.get():
                    counter._count_attempt(call_id)

        litellm.input_callback = [*litellm.input_callback, _AttemptCounter()]
        _hook_installed = True


# ----------------------------------------------------------------------------- timeouts
_warned: set[int] = set()


def warn_if_no_timeout(role: str, lm: Any) -> None:
    """Warn once per LM object when a dspy.LM has no ``timeout`` (litellm then waits up to 6000 s)."""
    if not isinstance(lm, dspy.LM) or lm.kwargs.get("timeout") is not None or id(lm) in _warned:
        return
    _warned.add(id(lm))
    logger.warning(
        "The %s LM %s has no timeout: a hung request holds a worker for up to litellm's 6000 s per attempt. "
        "Pass dspy.LM(..., timeout=60) (300-600 s for a slow reflection model).",
        role, lm.model,
    )
