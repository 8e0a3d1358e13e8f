"""LM calls a run returns without.

An async run ends as soon as all that is in flight is reflections whose children no budget is left
to validate (``schedules.asynchronous``): it does not wait for them, and their LM calls finish in the
background. What such a call does after the run ended is not the run's: neither its usage
(``usage.UsageMeter``) nor its call counts (``limits.LMCallCounter``) take it in, so the result tells
what its last step record tells, however late the calls return. The thread that may be left behind
says so (``abandonable``); a meter asks (``run_ended_check``) when it would count, under its own lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_thread = threading.local()


@contextmanager
def abandonable(run_ended: Callable[[], bool]) -> Iterator[None]:
    """The LM calls this thread makes in the block stop counting for the run once ``run_ended()``."""
    _thread.run_ended = run_ended
    try:
        yield
    finally:
        _thread.run_ended = None


def run_ended_check() -> Callable[[], bool] | None:
    """This thread's ``abandonable`` condition, or None when its calls always count."""
    return getattr(_thread, "run_ended", None)
