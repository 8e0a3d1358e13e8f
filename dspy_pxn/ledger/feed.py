"""How a run's LM calls reach its ledger: one callback at the LMs it reaches, and DSPy's retry loop.

The callback. The run's ledger is active in its context (a DSPy setting, so it reaches every thread
the context's work runs in: the pools copy the context, and ``dspy.Parallel`` copies DSPy's
settings), and the LMs the run reaches (``reachable_lms``: the context's LM, the reflection LM,
every LM a program holds) carry one instance-level callback, ``FEED``, that tells the ledgers active
in the caller's context when a call starts and ends. Only LM calls dispatch to it: a context-wide
callback would make DSPy dispatch every module and adapter event of every rollout (a third of the
driver's CPU per call on a light task). A call from outside the run (another run, a thread of the
user's) reaches no ledger of this run. An LM the program does not hold (a module-level LM, one made
in ``forward``) is not heard: its billed usage still reaches the ledger, which reports it (``unheld``).

Attempts. DSPy 3.4 retries a failed request itself, on every engine (its native lm15 engine,
litellm, a custom one): ``dspy.clients.execution.execute`` makes one ``_attempt`` per request, up to
``num_retries`` more after a retryable failure, and no engine retries underneath (measured: one
HTTP request per attempt). DSPy exposes no count of them, so the seam here wraps those two functions
(and their async twins) once per process, leaving what they do unchanged, and tells the calls in
progress in the caller's context. Where a DSPy version lacks them, ``attempts_known`` is False and
a run reports its attempts and retries as None, never as 0.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback

from dspy_pxn.ledger.ledger import RunLedger, calls_in_progress

__all__ = ["FEED", "active_ledgers", "attempts_known", "feeding", "leave_unfed", "reachable_lms"]

# The DSPy setting that holds the ledgers a run made active (``feeding``). A setting, not a context
# variable of ours: dspy.Parallel inside a program runs its items in threads that get DSPy's settings only.
LEDGERS_SETTING = "dspy_pxn_ledgers"


def active_ledgers() -> tuple[RunLedger, ...]:
    """The ledgers that hear this context's LM calls."""
    return dspy.settings.get(LEDGERS_SETTING, None) or ()


class _Feed(BaseCallback):
    """An LM's instance-level callback: its calls go to the ledgers active in the caller's context.

    Stateless and one per process, so an LM copied during a run (a candidate program's deep copy,
    a Ray actor's unpickled LM) carries the same object, which does nothing where no run counts."""

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        for ledger in active_ledgers():
            ledger.call_started(call_id, str(getattr(instance, "model", "")))

    def on_lm_end(self, call_id: str, outputs: Any, exception: BaseException | None = None) -> None:
        for ledger in active_ledgers():
            ledger.call_ended(call_id, exception)

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _feed, ()

    def __copy__(self) -> _Feed:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _Feed:
        return self


FEED = _Feed()


def _feed() -> _Feed:
    return FEED


_lock = threading.Lock()
_fed_lms: dict[int, list[Any]] = {}  # id(lm) -> [lm, runs feeding on its calls]


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
def feeding(ledger: RunLedger, lms: Iterable[Any]) -> Iterator[None]:
    """The calls ``lms`` make in this context (and the pool tasks it submits) reach ``ledger``.

    Several runs may feed on the same LM at once; the callback leaves an LM when the last one ends."""
    _install_attempt_seam()
    lms = reachable_lms(*lms)
    with _lock:
        for lm in lms:
            entry = _fed_lms.setdefault(id(lm), [lm, 0])
            entry[1] += 1
            _carry(lm)
    enclosing = dspy.settings.usage_tracker
    ledger.parent = enclosing if enclosing is not ledger else None  # it hears the run's usage, as under dspy.GEPA
    try:
        with dspy.context(usage_tracker=ledger, **{LEDGERS_SETTING: (*active_ledgers(), ledger)}):
            yield
    finally:
        with _lock:
            for lm in lms:
                entry = _fed_lms[id(lm)]
                entry[1] -= 1
                if entry[1] == 0:
                    del _fed_lms[id(lm)]
                    _drop(lm)


def leave_unfed(program: Any) -> None:
    """Take the callback off the LMs a program holds that no run feeds on (copies made during a run),
    so a returned program costs nothing per call and pickles without dspy_pxn."""
    with _lock:
        for lm in reachable_lms(program):
            if id(lm) not in _fed_lms:
                _drop(lm)


def _carry(lm: Any) -> None:
    callbacks = getattr(lm, "callbacks", None)
    if not isinstance(callbacks, list):  # an LM class that skipped BaseLM.__init__
        lm.callbacks = callbacks = [*(callbacks or [])]
    if not any(c is FEED for c in callbacks):
        callbacks.append(FEED)


def _drop(lm: Any) -> None:
    callbacks = getattr(lm, "callbacks", None)
    if isinstance(callbacks, list):
        callbacks[:] = [c for c in callbacks if c is not FEED]


# ----------------------------------------------------------------------------- attempts, in DSPy's retry loop
_seam_lock = threading.Lock()
_seam: bool | None = None  # None: not tried yet; True: installed; False: this DSPy has no such loop


def attempts_known() -> bool:
    """Whether this DSPy's retry loop tells the ledger each attempt (False: attempts are reported as None)."""
    _install_attempt_seam()
    return bool(_seam)


def _install_attempt_seam() -> None:
    global _seam
    if _seam is not None:
        return
    with _seam_lock:
        if _seam is not None:
            return
        try:
            from dspy.clients import execution
        except ImportError:  # a DSPy before its one execution path: no attempts to count
            _seam = False
            return
        names = ("execute", "aexecute", "_attempt", "_aattempt")
        if not all(callable(getattr(execution, name, None)) for name in names):
            _seam = False
            return
        execution.execute = _told(execution.execute, _executing)
        execution.aexecute = _told_async(execution.aexecute, _executing)
        execution._attempt = _told(execution._attempt, _attempting)
        execution._aattempt = _told_async(execution._aattempt, _attempting)
        _seam = True


def _executing() -> Callable[[bool], None]:
    """The calls in progress here reached DSPy's execution: their attempts are counted from now."""
    for _, call in calls_in_progress():
        call.executed = True
    return _nothing


def _attempting() -> Callable[[bool], None]:
    """One request to the provider begins; the returned function hears whether it raised."""
    calls = [call for _, call in calls_in_progress()]
    for call in calls:
        call.attempts += 1

    def ended(failed: bool) -> None:
        for call in calls:
            call.failed_attempts += failed
            call.last_attempt_failed = failed

    return ended


def _nothing(failed: bool) -> None:
    return None


def _told(function: Callable[..., Any], begins: Callable[[], Callable[[bool], None]]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ended = begins() if calls_in_progress() else _nothing
        try:
            result = function(*args, **kwargs)
        except BaseException:
            ended(True)
            raise
        ended(False)
        return result

    return wrapper


def _told_async(function: Callable[..., Any], begins: Callable[[], Callable[[bool], None]]) -> Callable[..., Any]:
    @functools.wraps(function)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        ended = begins() if calls_in_progress() else _nothing
        try:
            result = await function(*args, **kwargs)
        except BaseException:
            ended(True)
            raise
        ended(False)
        return result

    return wrapper
