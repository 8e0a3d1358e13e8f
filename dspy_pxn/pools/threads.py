"""The default worker pool: W threads in this process, shared by every rollout and reflection.

Upstream splits ``num_threads`` statically across the candidates of a batch, so a 30-example validation gets the
same share as a 3-example minibatch and straggles. Here every unit of work of a step (one rollout, or one
reflection call) is a task in a single pool, so W workers stay busy until the step's work runs out.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

from dspy_pxn.checks import positive_int

T = TypeVar("T")
R = TypeVar("R")


class ThreadWorkerPool:
    """A fixed set of threads; each task runs in a copy of the submitter's context.

    DSPy keeps per-call settings (``dspy.context(lm=...)``, traces) in context variables, so a task must
    see the submitter's context, each in its own copy: one ``Context`` cannot be entered by two threads.
    """

    remote = False  # map runs in this process: reflections stay on the caller's thread in async runs

    def __init__(self, num_workers: int):
        self.num_workers = positive_int("num_workers", num_workers)
        self._executor = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="dspy-pxn")
        self._lock = threading.Lock()
        self._busy = 0.0
        self._in_flight = 0
        self.peak_in_flight = 0
        self._local = threading.local()

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``fn`` over ``items``, results in input order. Called from inside a pool task (a program that fans out
        itself), the work runs inline: waiting on the pool from one of its own workers could deadlock it."""
        if getattr(self._local, "inside", False):
            return [fn(item) for item in items]
        futures = [self._executor.submit(contextvars.copy_context().run, self._timed, fn, item) for item in items]
        try:
            return [future.result() for future in futures]
        except BaseException:  # the caller hears of it once its other tasks are over: none outlives the map
            for future in futures:
                future.cancel()
            wait(futures)
            raise

    def map_local(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """The workers are local threads already."""
        return self.map(fn, items)

    def _timed(self, fn: Callable[[T], R], item: T) -> R:
        self._local.inside = True
        with self._lock:
            self._in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self._in_flight)
        start = time.perf_counter()
        try:
            return fn(item)
        finally:
            elapsed = time.perf_counter() - start
            with self._lock:
                self._in_flight -= 1
                self._busy += elapsed
            self._local.inside = False

    def busy_seconds(self) -> float:
        """Total task time so far; busy/(W * wall) is the pool's utilisation."""
        with self._lock:
            return self._busy

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ThreadWorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
