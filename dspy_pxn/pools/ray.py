"""Rollouts on a Ray cluster, behind the same WorkerPool interface as the thread pool.

When one machine's threads are not enough (an agent in a sandbox, a local model per GPU
node), rollouts run on Ray while the optimizer's loop, reflection included, stays on the
driver. Rollouts are I/O-bound LM calls, so a Ray task per rollout would waste a worker
process (and its dspy import) on each one; instead a few long-lived *threaded actors*
each run many rollouts at once, and ``max_concurrency`` caps the total like W caps the
thread pool. Rollouts travel in batches, one actor call per batch of consecutive items
(at most what one actor runs at once), because the driver pays per Ray call. A killed
actor is restarted by Ray and its in-flight calls are retried (``max_task_retries``); a
call that still fails raises ``WorkerLostError`` instead of hanging the step.

A rollout's LM accounting comes back with its result: the actor meters each call's
usage (tokens, for dollars) and counts its LM calls, retries and failures, and the driver
replays them into the run's usage meter and LM-call counters, so a step's tokens, cost
and retries read the same as with threads. The run's ``max_concurrent_lm_calls`` cap is a
semaphore in the driver's process, which actors cannot share; rollouts make their LM calls
one at a time, so the driver caps *rollouts* in flight at that number instead.

Ray is an optional extra (``pip install 'dspy-pxn[ray]'``): importing dspy_pxn never
imports ray; constructing a ``RayWorkerPool`` does.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import dspy

from dspy_pxn.checks import positive_int
from dspy_pxn.limits import LMCallCounts, LMCallLimiter
from dspy_pxn.pools import ThreadWorkerPool
from dspy_pxn.usage import UsageMeter

T = TypeVar("T")
R = TypeVar("R")

# The dspy settings a rollout reads; they travel with every batch of calls.
SHIPPED_SETTINGS = ("lm", "adapter")


class WorkerLostError(RuntimeError):
    """A rollout's Ray worker died more often than ``max_task_retries`` allows."""


def _require_ray():
    try:
        import ray
    except ImportError:
        raise ImportError(
            "pool='ray' needs Ray: pip install 'dspy-pxn[ray]' (or pip install ray), then start or join a "
            "cluster with `ray start --head`."
        ) from None
    return ray


class RolloutActor:
    """Runs the driver's functions under the driver's dspy settings, many at once (threads).

    Rollouts arrive in batches, one actor call each, because the driver's cost is per Ray call
    (submission, completion, result transfer), not per rollout; the batch runs concurrently on
    the actor's own threads and comes back with its usage and call counts summed once.
    """

    def __init__(self, threads: int = 1):
        self._threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def run_batch(
        self, fn: Callable[[Any], Any], items: Sequence[Any], settings: dict[str, Any]
    ) -> tuple[list[Any], float, dict[str, list[dict[str, Any]]], LMCallCounts]:
        """Every item's result in order, their summed seconds, and the LM usage and call counts the batch
        spent (for the driver's meters; priced on the driver, which owns the run's meter)."""
        meter, counter = UsageMeter(), LMCallLimiter()  # thread-safe: one of each serves the whole batch

        def one(item: Any) -> tuple[Any, float]:
            start = time.perf_counter()
            with dspy.context(**settings, usage_tracker=meter, callbacks=[counter]):
                return fn(item), time.perf_counter() - start

        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=self._threads, thread_name_prefix="dspy-pxn-actor")
        outcomes = list(self._executor.map(one, items))
        return [result for result, _ in outcomes], sum(s for _, s in outcomes), dict(meter.usage_data), counter.counts()

    def pid(self) -> int:
        return os.getpid()


class RayWorkerPool:
    """A WorkerPool whose ``map`` runs on Ray actors; ``map_local`` stays on the driver.

    Args:
        address: Ray cluster address ("auto" joins `ray start --head`); None starts a local
            Ray on first use (and shuts it down on ``close``) unless Ray is already initialised.
        max_concurrency: rollouts in flight at once over the whole cluster (the pool's W);
            size it to the provider's request limit, not to the cluster's CPUs.
        actors: how many actor processes share ``max_concurrency`` (default: the cluster's
            CPU count, at most ``max_concurrency``).
        max_task_retries: times Ray retries a call whose actor died (the actor restarts).
        init_kwargs: passed to ``ray.init`` when this pool starts Ray (e.g. num_cpus=2).
    """

    def __init__(
        self,
        address: str | None = None,
        max_concurrency: int = 64,
        actors: int | None = None,
        max_task_retries: int = 2,
        init_kwargs: dict[str, Any] | None = None,
    ):
        positive_int("max_concurrency", max_concurrency)
        if isinstance(max_task_retries, bool) or not isinstance(max_task_retries, int) or max_task_retries < 0:
            raise ValueError(f"max_task_retries must be an int >= 0, got {max_task_retries!r}.")
        positive_int("actors", actors, "None: one actor per CPU of the cluster.", or_none=True)
        ray = _require_ray()
        self._ray = ray
        self._owns_ray = False
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False, **(init_kwargs or {}))
            self._owns_ray = address is None
        cpus = int(ray.cluster_resources().get("CPU", 1)) or 1
        count = min(actors or cpus, max_concurrency)
        per_actor = -(-max_concurrency // count)
        actor_class = ray.remote(RolloutActor).options(
            num_cpus=0, max_concurrency=per_actor, max_restarts=-1, max_task_retries=max_task_retries
        )
        self._actors = [actor_class.remote(per_actor) for _ in range(count)]
        self._batch_limit = per_actor  # one actor call never holds more than its actor runs at once
        self._next = itertools.cycle(range(count))
        self.num_workers = max_concurrency
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._acquiring = threading.Lock()
        self._local = ThreadWorkerPool(max_concurrency)
        self._lock = threading.Lock()
        self._busy = 0.0

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """Run ``fn`` over ``items`` on the actors, results in input order.

        ``fn`` and the items must be picklable (module-level functions, partials, lambdas
        over picklable values); the calling context's dspy LM and adapter go along.
        """
        if not items:
            return []
        settings = {name: getattr(dspy.settings, name) for name in SHIPPED_SETTINGS if getattr(dspy.settings, name)}
        settings_ref = self._ray.put(settings)
        fn_ref = self._ray.put(fn)
        tracker = dspy.settings.usage_tracker
        counters = [c for c in dspy.settings.get("callbacks", None) or [] if isinstance(c, LMCallLimiter)]
        # The run's max_concurrent_lm_calls, as rollouts in flight: the limiters' own slots, so the cap
        # holds across concurrent maps (the async schedule's pipelines) and the driver's reflections.
        caps = sorted((c.slots for c in counters if c.slots is not None), key=id)
        # Consecutive items in batches, one actor call each; a batch holds one slot per rollout, so it
        # is never larger than a cap could grant at once (or acquiring its slots would wait forever).
        size = max(1, min([self._batch_limit, -(-len(items) // len(self._actors))]
                          + [c.max_concurrent for c in counters if c.max_concurrent]))
        refs = []
        for begin in range(0, len(items), size):
            batch = list(items[begin:begin + size])
            # A batch takes its slots all at once: two maps each holding part of what they need (the
            # async schedule's pipelines map concurrently) would wait for each other forever.
            with self._acquiring:
                for _ in batch:
                    for cap in caps:
                        cap.acquire()
                    self._slots.acquire()  # never more than max_concurrency rollouts in flight
            ref = self._actors[next(self._next)].run_batch.remote(fn_ref, batch, settings_ref)
            refs.append(ref)
            self._release_when_done(ref, caps, len(batch))
        results: list[R] = []
        for ref in refs:
            try:
                batch_results, seconds, usage, counts = self._ray.get(ref)
            except self._ray.exceptions.RayActorError as error:
                raise WorkerLostError(f"a rollout's Ray worker died and its retries ran out: {error}") from error
            with self._lock:
                self._busy += seconds
            if tracker is not None:
                for lm, entries in usage.items():
                    for entry in entries:
                        tracker.add_usage(lm, entry)
            for counter in counters:
                counter.absorb(counts)
            results.extend(batch_results)
        return results

    def _release_when_done(self, ref: Any, caps: Sequence[threading.BoundedSemaphore], rollouts: int) -> None:
        def release(_: Any) -> None:
            for _ in range(rollouts):
                self._slots.release()
                for cap in caps:
                    cap.release()

        ref.future().add_done_callback(release)

    def map_local(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """Work that must stay on the driver (reflection: it reads the optimizer's state)."""
        return self._local.map(fn, items)

    def actor_pids(self) -> list[int]:
        return self._ray.get([actor.pid.remote() for actor in self._actors])

    def busy_seconds(self) -> float:
        with self._lock:
            return self._busy + self._local.busy_seconds()

    def close(self) -> None:
        self._local.close()
        for actor in self._actors:
            self._ray.kill(actor)
        self._actors = []
        if self._owns_ray:
            self._ray.shutdown()

    def __enter__(self) -> RayWorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
