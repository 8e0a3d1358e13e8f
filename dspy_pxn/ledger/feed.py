"""How a run's LM calls reach its ledger: one callback at the LMs it reaches, and DSPy's retry loop.

The callback, ``FEED``, sits on each LM the run reaches (``reachable_lms``) and tells the ledgers active in the
caller's context (a DSPy setting, which reaches the pools' threads and ``dspy.Parallel``'s) when a call starts and
ends. Only LM calls dispatch to it: a context-wide callback would make DSPy dispatch every module and adapter event of
every rollout, a third of the driver's CPU per call on a light task. A call from outside the run reaches no ledger of
the run; an LM the program does not hold (a module-level LM) is not heard, but its billed usage reaches the ledger,
which reports it (``unheld``).

Attempts. DSPy 3.4 retries failed requests itself on every engine (native lm15, litellm, custom):
``dspy.clients.execution.execute`` makes one ``_attempt`` per request and no engine retries under it (measured: one HTTP
request per attempt). DSPy exposes no count of them, so they and their async twins are wrapped once per process,
unchanged, and tell the calls in progress in the caller's context. A call that never reached them (a DSPy without them,
an LM that bypasses DSPy's execution) has unknown attempts, which the run reports as None, never as 0.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback

from dspy_pxn.ledger.ledger import RunLedger, calls_in_progress

__all__ = ["FEED", "active_ledgers", "feeding", "hearing_replies", "leave_unfed", "reachable_lms"]

# The DSPy setting that holds the ledgers a run made active (``feeding``). A setting, not a context
# variable of ours: dspy.Parallel inside a program runs its items in threads that get DSPy's settings only.
LEDGERS_SETTING = "dspy_pxn_ledgers"
# The DSPy setting that holds a reflection job's list of the raw replies its LM calls returned (``hearing``).
REPLIES_SETTING = "dspy_pxn_replies"


def active_ledgers() -> tuple[RunLedger, ...]:
    """The ledgers that hear this context's LM calls."""
    return dspy.settings.get(LEDGERS_SETTING, None) or ()


class _Feed(BaseCallback):
    """An LM's instance-level callback: its calls go to the ledgers active in the caller's context. Stateless and one
    per process, so an LM copied during a run (a candidate program's deep copy, a Ray actor's unpickled LM) carries the
    same object, which does nothing where no run counts."""

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        for ledger in active_ledgers():
            ledger.call_started(call_id, str(getattr(instance, "model", "")))

    def on_lm_end(self, call_id: str, outputs: Any, exception: BaseException | None = None) -> None:
        for ledger in active_ledgers():
            ledger.call_ended(call_id, exception)
        replies = dspy.settings.get(REPLIES_SETTING, None)
        if replies is not None and exception is None and outputs:
            first = outputs[0] if isinstance(outputs, list) else outputs
            replies.append(str(first.get("text", first) if isinstance(first, dict) else first))

    def __reduce__(self) -> str:
        return "FEED"  # pickled by name, and copy.copy/deepcopy return the object itself


FEED = _Feed()


_lock = threading.Lock()
_feeding: Counter[int] = Counter()  # id(lm) -> runs feeding on its calls (each holds the LM while it does)


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
            _feeding[id(lm)] += 1
            _carry(lm)
    enclosing = dspy.settings.usage_tracker
    ledger.parent = enclosing if enclosing is not ledger else None  # it hears the run's usage, as under dspy.GEPA
    try:
        with dspy.context(usage_tracker=ledger, **{LEDGERS_SETTING: (*active_ledgers(), ledger)}):
            yield
    finally:
        with _lock:
            for lm in lms:
                _feeding[id(lm)] -= 1
                if not _feeding[id(lm)]:
                    del _feeding[id(lm)]
                    _drop(lm)


@contextmanager
def hearing_replies() -> Iterator[list[str]]:
    """The raw replies of the LM calls made in this context, as they return: what a reflection job's LM said
    (DSPy's proposer keeps only what it parsed). Heard at the run's LMs by ``FEED``, so the job's context
    keeps DSPy's callbacks as they are."""
    replies: list[str] = []
    with dspy.context(**{REPLIES_SETTING: replies}):
        yield replies


def leave_unfed(program: Any) -> None:
    """Take the callback off the LMs a program holds that no run feeds on (copies made during a run),
    so a returned program costs nothing per call and pickles without dspy_pxn."""
    with _lock:
        for lm in reachable_lms(program):
            if id(lm) not in _feeding:
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
_seam_installed = False
# DSPy's execution path, and what each function tells the calls in progress in the caller's context.
_SEAM = {"execute": "executed", "aexecute": "executed", "_attempt": "attempt", "_aattempt": "attempt"}


def _install_attempt_seam() -> None:
    """Wrap DSPy's execution and attempt functions once per process, where this DSPy has them."""
    global _seam_installed
    with _seam_lock:
        if _seam_installed:
            return
        _seam_installed = True
        try:
            from dspy.clients import execution
        except ImportError:  # a DSPy before its one execution path: attempts stay unknown
            return
        if all(callable(getattr(execution, name, None)) for name in _SEAM):
            for name, told in _SEAM.items():
                setattr(execution, name, _telling(getattr(execution, name), told == "attempt"))


def _telling(function: Callable[..., Any], attempt: bool) -> Callable[..., Any]:
    """``function`` unchanged, but the calls in progress hear that it ran: their execution began (their
    attempts are counted from now), or one attempt was made, and whether it raised."""

    @contextmanager
    def telling() -> Iterator[None]:
        calls = [call for _, call in calls_in_progress()]
        for call in calls:
            call.attempts += attempt
            call.executed = True
        failed = True
        try:
            yield
            failed = False
        finally:
            for call in calls if attempt else ():
                call.failed_attempts += failed
                call.last_attempt_failed = failed

    if inspect.iscoroutinefunction(function):
        @functools.wraps(function)
        async def told_async(*args: Any, **kwargs: Any) -> Any:
            with telling():
                return await function(*args, **kwargs)

        return told_async

    @functools.wraps(function)
    def told(*args: Any, **kwargs: Any) -> Any:
        with telling():
            return function(*args, **kwargs)

    return told
