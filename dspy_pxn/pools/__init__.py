"""Where rollouts run: a ``WorkerPool`` of W workers shared by every rollout of a run.

``ThreadWorkerPool`` (threads in this process) is the default; ``dspy_pxn.pools.ray``
runs rollouts on Ray actors (the optional ``ray`` extra, imported only when used).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from dspy_pxn.pools.threads import R, T, ThreadWorkerPool


@runtime_checkable
class WorkerPool(Protocol):
    """What the optimizer needs from a pool: ordered map, size, usage counters, close.

    ``map`` runs rollouts wherever the pool's workers are (for a remote pool, ``fn`` and the items must
    be picklable); ``map_local`` runs work that must stay in this process, such as a custom proposer's
    reflection, which may keep state here. A pool whose ``map`` runs in other processes says ``remote =
    True``: dspy's built-in reflection calls then go there too, since each costs the driver an LM call's CPU.
    """

    num_workers: int

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]: ...

    def map_local(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]: ...

    def busy_seconds(self) -> float: ...

    def close(self) -> None: ...


__all__ = ["ThreadWorkerPool", "WorkerPool"]
