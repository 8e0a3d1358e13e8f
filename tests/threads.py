"""The library's threads a run leaves behind, for the tests that check it leaves none."""

from __future__ import annotations

import threading
import time

# An async run may return with reflections in flight that could no longer count (dspy_pxn.abandoned):
# their pipeline threads end when their LM call returns, bounded by its timeout and retries.
ABANDONABLE = "dspy-pxn-proposal"


def library_threads(prefix: str = "dspy-pxn") -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]


def threads_left_behind(wait_s: float = 30.0) -> list[str]:
    """The library's threads alive after a run: at once, any but the abandonable pipelines; after at most
    ``wait_s`` for those to return, any at all."""
    others = [name for name in library_threads() if not name.startswith(ABANDONABLE)]
    if others:
        return others
    deadline = time.perf_counter() + wait_s
    while library_threads(ABANDONABLE) and time.perf_counter() < deadline:
        time.sleep(0.02)
    return library_threads()
