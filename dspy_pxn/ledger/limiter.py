"""A cap on LM calls in progress at once: ``BatchedGEPA(max_concurrent_lm_calls=K)``.

Providers limit requests, not workers: W = 64 workers against a provider that allows 16 concurrent requests must
queue, not collect 429s. ``LMCallLimiter`` is a context-wide DSPy callback (it must hold for any LM, so it pays DSPy's
dispatch of every event): ``on_lm_start`` blocks until one of K slots is free, ``on_lm_end`` (in DSPy's ``finally``)
frees it. It counts nothing: the ledger does. A slot is held while DSPy sleeps before a retry (``Retry-After``, else
1, 2, 4 s), so a rate-limited run sends fewer requests meanwhile; one attempt at a time per call bounds the requests
in flight. It caps DSPy's synchronous path (the pools' threads); an ``acall`` on an event loop is not capped.
"""

from __future__ import annotations

import threading
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback

from dspy_pxn.checks import positive_int

CAP_HINT = "Set it to the concurrent requests your provider allows, e.g. 16."


class LMCallLimiter(BaseCallback):
    """At most ``max_concurrent`` LM calls at once. One limiter may be shared by several runs (e.g. a sweep against
    one provider account): pass the same instance as ``BatchedGEPA(max_concurrent_lm_calls=limiter)``."""

    def __init__(self, max_concurrent: int):
        self.max_concurrent = positive_int("max_concurrent_lm_calls", max_concurrent, CAP_HINT)
        # The cap itself, public for pools whose LM calls run where this callback cannot see them (Ray
        # actors): such a pool holds one slot per rollout in flight, shared with every other call.
        self.slots = threading.BoundedSemaphore(max_concurrent)
        self._lock = threading.Lock()
        self._holding: set[str] = set()  # calls holding a slot

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        self.slots.acquire()
        with self._lock:
            self._holding.add(call_id)

    def on_lm_end(self, call_id: str, outputs: Any, exception: BaseException | None = None) -> None:
        with self._lock:
            held = call_id in self._holding
            self._holding.discard(call_id)
        if held:  # a call whose start never reached this limiter holds no slot
            self.slots.release()

    def in_flight(self) -> int:
        with self._lock:
            return len(self._holding)

    def holding(self) -> frozenset[str]:
        """The calls holding a slot: each from this callback's start to its end. DSPy tells a call's end to the
        context's callbacks (this one) before the LM's own (a run's ledger), so a slot may be another call's before
        the ledger hears the first call end."""
        with self._lock:
            return frozenset(self._holding)


def installed(limiter: LMCallLimiter | None):
    """The limiter as a context-wide DSPy callback, after any already there (a dollar cap's gate first)."""
    callbacks = list(dspy.settings.get("callbacks", None) or [])
    if limiter is not None and limiter not in callbacks:
        callbacks.append(limiter)
    return dspy.context(callbacks=callbacks)


def active_limiters() -> list[LMCallLimiter]:
    return [c for c in dspy.settings.get("callbacks", None) or [] if isinstance(c, LMCallLimiter)]


def limiter_for(max_concurrent_lm_calls: int | LMCallLimiter | None) -> LMCallLimiter | None:
    """The cap BatchedGEPA installs: the limiter given (it may be shared), a new one for an int, None for None."""
    if isinstance(max_concurrent_lm_calls, LMCallLimiter):
        return max_concurrent_lm_calls
    positive_int("max_concurrent_lm_calls", max_concurrent_lm_calls, CAP_HINT, or_none=True)
    return LMCallLimiter(max_concurrent_lm_calls) if max_concurrent_lm_calls is not None else None
