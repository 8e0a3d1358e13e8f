"""What happens inside a step, told by the parts that know it to the listeners that need it.

gepa's own callbacks say when an iteration starts and ends and which candidates were
accepted; they do not say how many children were screened and improved, how long the
rollouts and reflections took, or which evaluations are the parents' (whose traces
reflection reads). The parts that know report it to one ``StepEvents`` (the events are
``StepListener``'s methods).

A listener subclasses ``StepListener`` and overrides the events it needs, each marked
``@override``: a misspelt name then fails when the class is defined, not silently never
hears its event.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from gepa.strategies.proposal_sampling import ProposalTask
from typing_extensions import override

__all__ = ["Phase", "StepEvents", "StepListener", "override"]

# Screening: parents and children on their minibatches. Validation: candidates on the whole valset
# (the seed's validation included).
Phase = Literal["screening", "validation"]


class StepListener:
    """Hears a run's step events; every event is a no-op here."""

    def tasks_sampled(self, tasks: Sequence[ProposalTask]) -> None:
        """Proposal tasks (a parent and a minibatch each) were drawn."""

    def children_screened(self, children: int, improved: int) -> None:
        """``children`` children were scored on their minibatches; ``improved`` beat their parents there."""

    def evaluated(self, phase: Phase, seconds: float, rollouts: int, failures: int) -> None:
        """A batch of ``rollouts`` metric calls finished (``failures`` of them scored as failures)."""

    def reflected(self, seconds: float, jobs: int, failed: int) -> None:
        """``jobs`` reflection calls finished; ``failed`` of them proposed nothing."""

    def sibling_merged(self, seconds: float, children: int) -> None:
        """``children`` improving children were merged into one candidate (``dspy_pxn.proposer.sibling_merge``)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, member in vars(cls).items():
            if getattr(member, "__override__", False) and not any(hasattr(base, name) for base in cls.__mro__[1:]):
                events = [event for event in vars(StepListener) if not event.startswith("_")]
                raise TypeError(f"{cls.__name__}.{name} is marked @override, but there is no step event {name!r}: "
                                f"the events are {events}.")


class SearchReturned(Protocol):
    """What the events read of the run's stop signal (the ledger's): whether the search has returned."""

    returned: bool


class StepEvents(StepListener):
    """Tells each listener, in the order they were added, every event; each under ``lock``.

    The lock is re-entrant and public: a schedule whose bookkeeping must land in the same
    step record as an event (the asynchronous one counts a screening's metric calls where
    its rollouts are reported) does that bookkeeping under the same lock. Once the run's
    ``stop`` says the search has returned, what work still in flight tells is not part of the
    run, and no listener hears it.
    """

    def __init__(self, listeners: Sequence[StepListener] = (), stop: SearchReturned | None = None):
        self.lock = threading.RLock()
        self.listeners: list[StepListener] = []
        self.stop = stop
        for listener in listeners:
            self.add(listener)

    def add(self, listener: StepListener, *, first: bool = False) -> None:
        """Tell ``listener`` every event from now on: after the listeners already added, or before them (``first``)."""
        if not isinstance(listener, StepListener):
            raise TypeError(f"{listener!r} is not a dspy_pxn.engine.events.StepListener: subclass it and override "
                            "the events it hears.")
        with self.lock:
            self.listeners.insert(0 if first else len(self.listeners), listener)

    def _tell(self, event: str, *args: Any) -> None:
        with self.lock:
            if self.stop is not None and self.stop.returned:
                return
            for listener in self.listeners:
                getattr(listener, event)(*args)

    @override
    def tasks_sampled(self, tasks: Sequence[ProposalTask]) -> None:
        self._tell("tasks_sampled", tasks)

    @override
    def children_screened(self, children: int, improved: int) -> None:
        self._tell("children_screened", children, improved)

    @override
    def evaluated(self, phase: Phase, seconds: float, rollouts: int, failures: int) -> None:
        self._tell("evaluated", phase, seconds, rollouts, failures)

    @override
    def reflected(self, seconds: float, jobs: int, failed: int) -> None:
        self._tell("reflected", seconds, jobs, failed)

    @override
    def sibling_merged(self, seconds: float, children: int) -> None:
        self._tell("sibling_merged", seconds, children)
