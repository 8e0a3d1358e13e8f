"""Rollouts on a Ray cluster, behind the same WorkerPool interface as the thread pool.

For when one machine's threads are not enough (an agent in a sandbox, a local model per GPU node); the
optimizer's loop stays on the driver. Rollouts are I/O-bound LM calls, so a Ray task per rollout would
waste a worker process (and its dspy import) on each; instead a few long-lived *threaded actors* each
run many rollouts at once, and ``max_concurrency`` caps the total as W caps the thread pool.

One driver process feeds every actor, so its CPU per Ray call bounds the W a run can use: rollouts
travel in batches (at most what one actor runs at once), and maps that wait together (the async
schedule's pipelines, a few rollouts each) share batches, built by one dispatcher thread. A killed
actor is restarted by Ray and its in-flight calls retried (``max_task_retries``); a call that still
fails raises ``WorkerLostError`` instead of hanging the step.

Each unit runs under a ledger of its own on the actor (priced at the run's prices) whose tally the
driver's run ledger absorbs, so a step's tokens, cost and retries read the same as with threads. The
``max_concurrent_lm_calls`` semaphore lives in the driver's process, which actors cannot share;
rollouts make their LM calls one at a time, so the driver caps *rollouts* in flight at that number.

Ray is an optional extra (``pip install 'dspy-pxn[ray]'``): importing dspy_pxn never imports ray.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import dspy

from dspy_pxn.checks import positive_int
from dspy_pxn.ledger import caps, feed
from dspy_pxn.ledger.caps import CapReached, RunCaps
from dspy_pxn.ledger.ledger import RunLedger, Tally
from dspy_pxn.ledger.limiter import active_limiters
from dspy_pxn.ledger.prices import Price, PromptTokenBound
from dspy_pxn.ledger.remote import Allowance, ShareSpent, shares_of
from dspy_pxn.pools.memo import lru_memo
from dspy_pxn.pools.threads import R, T, ThreadWorkerPool

# The dspy settings a rollout reads; they travel with every batch of calls.
SHIPPED_SETTINGS = ("lm", "adapter")
# Functions and settings stored in Ray's object store and kept resolved by each actor: a run
# ships a handful (its rollout function, its reflection call, the task LM's settings).
SHIPPED_KEPT = 16


class WorkerLostError(RuntimeError):
    """A rollout's Ray worker died more often than ``max_task_retries`` allows."""


class RolloutActor:
    """Runs the driver's functions under the driver's dspy settings, many at once (threads).

    A batch may serve several of the driver's maps, one group each. The function and the settings arrive boxed
    (so Ray does not resolve them per call); the actor resolves each once and keeps it, so a function that caches
    work (built programs) keeps its cache from batch to batch.
    """

    def __init__(self, threads: int = 1):
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dspy-pxn-actor")
        self._resolved = lru_memo(SHIPPED_KEPT)

    def run_batch(
        self, groups: Sequence[tuple[list[Any], list[Any], Sequence[Any], Allowance | None, dict[str, Price | None]]]
    ) -> list[tuple[list[Any], float, Tally, BaseException | None, float, dict[str, float]]]:
        """Per group (boxed function, boxed settings, items, what each item may spend, the run's prices): every
        item's result in order, their summed seconds, the group's LM calls' tally (for the driver's ledger), what
        the function raised, the largest worst case one item reserved and the prompt tokens per byte its gates
        learned (``dspy_pxn.ledger.remote``)."""
        runs = [[self._executor.submit(self._one, self._resolve(fn[0]), self._resolve(settings[0]), item, allowance,
                                       prices) for item in items]
                for fn, settings, items, allowance, prices in groups]
        outputs = []
        for futures in runs:
            units = [future.result() for future in futures]  # every item ends before the group reports
            error = next((unit.error for unit in units if unit.error is not None), None)
            tally, learned = Tally(), PromptTokenBound()
            for unit in units:
                tally = tally.plus(unit.tally)
                learned.merge(unit.tokens_per_byte)
            outputs.append(([] if error is not None else [unit.result for unit in units],
                            sum(unit.seconds for unit in units), tally, error,
                            max((unit.worst for unit in units), default=0.0), learned.tokens_per_byte()))
        return outputs

    @staticmethod
    def _one(fn: Callable[[Any], Any], settings: dict[str, Any], item: Any, allowance: Allowance | None,
             prices: dict[str, Price | None]) -> _Unit:
        """One item under a ledger of its own (and its own share of the run's caps, first in line)."""
        start, ledger, gate, error, result = time.perf_counter(), RunLedger(prices), None, None, None
        try:
            gate = allowance.gate(ledger) if allowance is not None else None
            with dspy.context(**settings, callbacks=[gate] if gate else []), feed.feeding(ledger, [settings.get("lm")]):
                result = fn(item)
        except CapReached as reached:
            error = allowance.named(reached, gate) if allowance is not None else reached
        except Exception as failure:  # noqa: BLE001 - fails its own map only
            error = failure
        return _Unit(result, error, time.perf_counter() - start, gate.worst_reserved if gate else 0.0, ledger.tally(),
                     gate.prompt_bound.tokens_per_byte() if gate else {})

    def _resolve(self, ref: Any) -> Any:
        import ray

        return self._resolved(ref, lambda: ray.get(ref))

    def pid(self) -> int:
        return os.getpid()


@dataclass(frozen=True)
class _Unit:  # one item's outcome on an actor
    result: Any
    error: BaseException | None
    seconds: float
    worst: float
    tally: Tally
    tokens_per_byte: dict[str, float]


@dataclass(eq=False)
class _MapRequest:  # one ``map`` call: what to run, whose ledgers to credit, and where its results go
    fn_box: list[Any]
    settings_box: list[Any]
    items: list[Any]
    ledgers: tuple[RunLedger, ...]  # the run's ledgers (``feed.active_ledgers``): each absorbs what the map spent
    caps: list[threading.BoundedSemaphore]
    cap_size: int | None
    prices: dict[str, Price | None] = field(default_factory=dict)  # the run's: a unit's ledger prices with them
    run_caps: RunCaps | None = None  # the run's dollar and time caps: each item carries its share
    allowance: Allowance | None = None
    results: list[Any] = field(default_factory=list)
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    _missing: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.results = [None] * len(self.items)
        self._missing = len(self.items)

    def deliver(self, indices: list[int], results: list[Any], error: BaseException | None = None) -> None:
        """A failed map raises its first error only once all its items are back, so their LM usage is in the
        run's ledger before its caller goes on."""
        with self._lock:
            if error is None:
                for index, result in zip(indices, results, strict=True):
                    self.results[index] = result
            elif self.error is None:
                self.error = error
            self._missing -= len(indices)
            if self._missing == 0:
                self.done.set()


class RayWorkerPool:
    """A WorkerPool whose ``map`` runs on Ray actors; ``map_local`` stays on the driver.

    A function or settings object mapped again is not shipped again: each is stored in Ray's
    object store once (while the pool keeps it alive) and the actors keep it resolved.

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

    remote = True  # map runs elsewhere: what it maps must pickle, and driver CPU is saved by mapping

    def __init__(self, address: str | None = None, max_concurrency: int = 64, actors: int | None = None,
                 max_task_retries: int = 2, init_kwargs: dict[str, Any] | None = None):
        positive_int("max_concurrency", max_concurrency)
        if isinstance(max_task_retries, bool) or not isinstance(max_task_retries, int) or max_task_retries < 0:
            raise ValueError(f"max_task_retries must be an int >= 0, got {max_task_retries!r}.")
        positive_int("actors", actors, "None: one actor per CPU of the cluster.", or_none=True)
        try:
            import ray
        except ImportError:
            raise ImportError("pool='ray' needs Ray: pip install 'dspy-pxn[ray]' (or pip install ray), then start or "
                              "join a cluster with `ray start --head`.") from None
        self._ray = ray
        self._owns_ray = address is None and not ray.is_initialized()  # this pool starts a local Ray
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False, **(init_kwargs or {}))
        cpus = int(ray.cluster_resources().get("CPU", 1)) or 1
        count = min(actors or cpus, max_concurrency)
        per_actor = -(-max_concurrency // count)
        actor_class = ray.remote(RolloutActor).options(num_cpus=0, max_concurrency=per_actor, max_restarts=-1,
                                                       max_task_retries=max_task_retries)
        self._actors = [actor_class.remote(per_actor) for _ in range(count)]
        self._batch_limit = per_actor  # one actor call never holds more than its actor runs at once
        self._next = itertools.cycle(range(count))
        self.num_workers = max_concurrency
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._requests: queue.SimpleQueue[_MapRequest | None] = queue.SimpleQueue()
        self.actor_calls = 0  # Ray calls made so far: what the driver pays for, rather than per rollout
        self._dispatcher = threading.Thread(target=self._dispatch, name="dspy-pxn-ray-dispatch", daemon=True)
        self._dispatcher.start()
        self._local = ThreadWorkerPool(max_concurrency)
        self._lock = threading.Lock()
        self._busy = 0.0
        # Each shipped value is kept with its reference: its ids stay its own while it is memoized.
        self._shipped = lru_memo(SHIPPED_KEPT)

    def _ship(self, value: Any, identity: tuple[int, ...]) -> Any:
        """``value`` in Ray's object store, stored once per identity (the ids of what it is made of)."""
        return self._shipped(identity, lambda: (value, self._ray.put(value)))[1]

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """Run ``fn`` over ``items`` on the actors, results in input order. ``fn`` and the items must be picklable
        (module-level functions, partials, lambdas over picklable values); the caller's dspy LM and adapter go along.
        """
        run_caps = caps.active()
        shares = shares_of(run_caps) if run_caps is not None else None
        results: list[R] = []
        while len(results) < len(items):
            left = items[len(results):]
            allowance = None if shares is None else shares.allowance(len(left), bool(getattr(fn, "reflects", False)))
            part = left[:allowance.units] if allowance is not None else left  # what a dollar cap pays for now
            request = self._request(fn, part, run_caps, allowance)
            self._requests.put(request)
            request.done.wait()
            outgrown = request.error if isinstance(request.error, ShareSpent) else None
            if outgrown is not None and allowance is not None and shares.needs_more(allowance, outgrown.needed):
                continue  # a unit outgrew its share and the cap pays for a larger one: send the part again
            if isinstance(request.error, CapReached) and run_caps is not None:
                run_caps.refuse(request.error.budget, str(request.error))
            if request.error is not None:
                raise request.error
            results += request.results
        return results

    def _request(self, fn: Callable[[T], R], items: Sequence[T], run_caps: RunCaps | None,
                 allowance: Allowance | None) -> _MapRequest:
        settings = {name: getattr(dspy.settings, name) for name in SHIPPED_SETTINGS if getattr(dspy.settings, name)}
        limiters, ledgers = active_limiters(), feed.active_ledgers()
        return _MapRequest(
            fn_box=[self._ship(fn, (id(fn),))],
            settings_box=[self._ship(settings, tuple(id(value) for value in settings.values()) + (0,))],
            items=list(items), ledgers=ledgers, prices=dict(ledgers[-1].prices) if ledgers else {},
            # max_concurrent_lm_calls as rollouts in flight, on the limiters' own slots: one cap for all maps.
            caps=sorted((c.slots for c in limiters), key=id),
            cap_size=min((c.max_concurrent for c in limiters), default=None), run_caps=run_caps, allowance=allowance,
        )

    def _dispatch(self) -> None:
        """Turn the maps waiting now into shared actor calls (fifty 3-rollout maps cost what a few large
        ones do); runs in one thread, so the W and LM-cap slots are only ever acquired here, in order, and
        concurrent maps cannot deadlock on them."""
        while True:
            first = self._requests.get()
            if first is None:
                return
            waiting = [first]
            while not self._requests.empty():  # this thread is the queue's only reader
                request = self._requests.get_nowait()
                if request is None:
                    self._requests.put(None)
                    break
                waiting.append(request)
            work = [(request, index) for request in waiting for index in range(len(request.items))]
            # A batch holds one slot per rollout, so it is never larger than a cap could grant at once
            # (or acquiring its slots would wait forever), nor than one actor runs at once.
            size = max(1, min([self._batch_limit, -(-len(work) // len(self._actors))]
                              + [r.cap_size for r in waiting if r.cap_size]))
            for begin in range(0, len(work), size):
                self._send(work[begin:begin + size])

    def _send(self, batch: list[tuple[_MapRequest, int]]) -> None:
        for request, _ in batch:
            for cap in request.caps:
                cap.acquire()
            self._slots.acquire()  # never more than max_concurrency rollouts in flight
        groups: dict[int, tuple[_MapRequest, list[int]]] = {}
        for request, index in batch:
            groups.setdefault(id(request), (request, []))[1].append(index)
        served = list(groups.values())
        payload = [(request.fn_box, request.settings_box, [request.items[i] for i in indices], request.allowance,
                     request.prices) for request, indices in served]
        try:
            ref = self._actors[next(self._next)].run_batch.remote(payload)
            self.actor_calls += 1
        except Exception as error:  # noqa: BLE001 - a submission that fails fails its maps, never the dispatcher
            self._release(batch)
            self._lost(served, error)
            return
        ref.future().add_done_callback(lambda future: self._finish(future, batch, served))

    def _finish(self, future: Any, batch: list[tuple[_MapRequest, int]],
                served: list[tuple[_MapRequest, list[int]]]) -> None:
        self._release(batch)
        try:
            outputs = future.result()
        except self._ray.exceptions.RayActorError as error:
            lost = WorkerLostError(f"a rollout's Ray worker died and its retries ran out: {error}")
            lost.__cause__ = error
            self._lost(served, lost)
            return
        except BaseException as error:  # noqa: BLE001 - the map raises it in its caller's thread
            self._lost(served, error)
            return
        for (request, indices), (results, seconds, tally, error, largest, learned) in zip(served, outputs, strict=True):
            with self._lock:
                self._busy += seconds
            for ledger in request.ledgers:  # what the units spent, in the run's ledger before their share is released
                ledger.absorb(tally)
            if request.run_caps is not None:
                request.run_caps.prompt_bound.merge(learned)
                shares_of(request.run_caps).settle(request.allowance, len(indices), largest)
            request.deliver(indices, results, error)

    @staticmethod
    def _lost(served: list[tuple[_MapRequest, list[int]]], error: BaseException) -> None:
        """The actor call failed as a whole: each map it served fails, its units' shares held (``shares.lost``)."""
        for request, indices in served:
            if request.run_caps is not None:
                shares_of(request.run_caps).lost(request.allowance)
            request.deliver(indices, [], error)

    def _release(self, batch: list[tuple[_MapRequest, int]]) -> None:
        for request, _ in batch:
            self._slots.release()
            for cap in request.caps:
                cap.release()

    def map_local(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """Work that must stay on the driver (a custom proposer's reflection, the sibling merge)."""
        return self._local.map(fn, items)

    def actor_pids(self) -> list[int]:
        return self._ray.get([actor.pid.remote() for actor in self._actors])

    def busy_seconds(self) -> float:
        with self._lock:
            return self._busy + self._local.busy_seconds()

    def close(self) -> None:
        self._requests.put(None)
        self._dispatcher.join()
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
