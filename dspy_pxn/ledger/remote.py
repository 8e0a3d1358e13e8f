"""A dollar and time cap for work sent to another process (a Ray actor), which the run's gate cannot see.

Each unit of a map sent elsewhere carries a share (``Allowance``) reserved from the run's caps here;
there it runs behind a gate of its own with that much to spend, the run's prices and its deadline, and
its calls are priced by a ledger of its own. When the units come back, the run's ledger absorbs
what they spent and the share is released here (``RemoteShares.settle``).

What one unit of a kind (a rollout, a reflection) costs at worst is learned from the first map of
that kind, which runs alone with half of what is left; maps of that kind wait for it. Later shares
are the largest worst case a unit of the kind reserved in its latest maps (``RECENT_MAPS``: the bound
on a prompt's tokens tightens as the provider's bills come in), with ``REMOTE_HEADROOM``, within what
is left. A map whose share does not fit beside what work in flight holds waits for that work to settle,
as a call at the run's gate does; one that would not fit even then ends the run.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from dspy_pxn.ledger.caps import CapReached, RunCaps
from dspy_pxn.ledger.ledger import RunLedger
from dspy_pxn.ledger.prices import Price

# A unit sent to a worker gets this much more than the largest worst case one of its kind reserved: a
# unit that needs more is refused there and ends the run; more headroom leaves more of the cap unspent.
REMOTE_HEADROOM = 1.25
# A unit's share is sized from the largest worst case among its kind's latest maps.
RECENT_MAPS = 4


class ShareSpent(CapReached):
    """A unit sent to a worker needed more than its share (``needed``, its worst case): the driver learns
    the larger worst case and sends the map again if the cap pays for it."""

    def __init__(self, budget: str, message: str, needed: float):
        super().__init__(budget, message)
        self.needed = needed

    def __reduce__(self) -> tuple[Any, tuple[str, str, float]]:
        return ShareSpent, (self.budget, str(self), self.needed)


@dataclass(frozen=True)
class Allowance:
    """What each unit of one map sent to another process may spend (``per_item_usd``, reserved by the
    driver), and until when; a refusal on the worker names the driver's budget that bounded the share."""

    per_item_usd: float | None  # None: no dollar cap, only a deadline
    budget: str  # the cap the share came from
    reflection: bool
    deadline_epoch: float | None
    prices: dict[str, Price | None]
    share_bound: bool  # the share, not what is left of the cap, bounds a unit: a larger one may be granted
    tokens_per_byte: dict[str, float] = field(default_factory=dict)  # what the run's gate learned of prompts
    units: int = 1  # how many of the map's units this allowance pays for: the map sends them first

    def gate(self, ledger: RunLedger) -> RunCaps:
        """One unit's gate on the worker, over the ledger that prices the unit's calls."""
        seconds = None if self.deadline_epoch is None else self.deadline_epoch - time.time()
        if seconds is not None and seconds <= 0:
            raise CapReached("max_wall_s", "the run's deadline has passed")
        dollars = self.per_item_usd
        caps = RunCaps(ledger, None if self.reflection else dollars, dollars if self.reflection else None, seconds,
                       tokens_per_byte=self.tokens_per_byte)
        return caps

    def named(self, reached: CapReached, gate: RunCaps | None) -> CapReached:
        """A unit's refusal under the name of the run's budget it was a share of; ``ShareSpent`` when the
        unit outgrew a share that the run's cap could still enlarge."""
        if reached.budget == "max_wall_s" or gate is None:
            return reached
        if self.share_bound:
            return ShareSpent(self.budget, f"a unit outgrew its share of {self.budget}",
                              gate.worst_reserved + gate.refused_worst)
        return CapReached(self.budget, f"{self.budget}: {reached}")


class RemoteShares:
    """The run's shares of its caps out on other processes, reserved with the run's gate (under its lock,
    and waiting on its ``settled`` condition, which every release notifies)."""

    def __init__(self, caps: RunCaps):
        self.caps = caps
        self._recent: dict[bool, deque[float]] = {}  # by kind: the largest worst case a unit reserved, latest maps
        self._learning: set[bool] = set()  # kinds whose first map is out, learning what a unit costs

    def allowance(self, items: int, reflection: bool) -> Allowance | None:
        """Reserve what up to ``items`` units sent elsewhere may spend, each its own share: as many units as
        what is left pays for at the kind's worst case (``Allowance.units``; the map sends the rest after
        them). Refused (``CapReached``) when what is left does not pay for one unit, even once the work in
        flight settles."""
        caps, stop = self.caps, self.caps.ledger
        if stop.returned:
            return None
        while True:
            if stop.refusing:
                raise CapReached(stop.stopped_by or "max_cost_usd", f"the run was stopped by {stop.stopped_by}")
            seconds = caps.seconds_left()
            if seconds is not None and seconds <= 0:
                caps.refuse("max_wall_s", f"the deadline of {caps.max_wall_s:g} s has passed")
                raise CapReached("max_wall_s", f"max_wall_s={caps.max_wall_s:g} s has passed")
            deadline = None if seconds is None else time.time() + seconds
            prices, ratios = dict(caps.ledger.prices), caps.prompt_bound.tokens_per_byte()
            if not caps.counts_dollars:
                return Allowance(None, "max_cost_usd", reflection, deadline, prices, False, ratios, items)
            with caps.settled:
                left, budget = caps.left(reflection)
                largest = self._largest(reflection)
                if largest is None and reflection in self._learning:  # wait for the map learning its kind's cost
                    caps.settled.wait(timeout=1.0)
                    continue
                if largest is None:  # this map learns what a unit of its kind costs, with half of what is left
                    self._learning.add(reflection)
                    units, per_item = items, left / (2 * items)
                else:  # as many units as what is left pays for at the kind's worst case
                    units = min(items, int(left // largest)) if left > 0 and largest > 0 else items
                    per_item = min(REMOTE_HEADROOM * largest, left / max(units, 1))
                share_bound = per_item < left / max(units, 1)  # less than the cap would allow: it may be raised
                if units > 0 and per_item > 0 and (largest is None or per_item >= largest):
                    caps.reserve(per_item * units, reflection)
                    return Allowance(per_item, budget, reflection, deadline, prices, share_bound, ratios, units)
                if caps.reserved > 0 and left + caps.reserved >= largest:
                    caps.settled.wait(timeout=1.0)  # a unit fits once the work in flight settles
                    continue
            caps.refuse(budget, "what is left does not pay for the next unit of work sent to a worker")
            raise CapReached(budget, f"{budget} is spent")

    def needs_more(self, allowance: Allowance, needed: float) -> bool:
        """A unit outgrew its share (``ShareSpent``): its kind's worst case is at least ``needed``. Whether
        what is left pays for a unit that large, once the work in flight settles: then the map is sent again."""
        with self.caps.settled:
            self._learned(allowance.reflection, needed)
            left, _ = self.caps.left(allowance.reflection)
            return left + self.caps.reserved >= needed

    def lost(self, allowance: Allowance | None) -> None:
        """Units sent elsewhere never came back (their worker died): their reservation stays held, as what
        they billed is unknown, and another map may learn their kind's cost."""
        if allowance is not None and allowance.per_item_usd is not None:
            with self.caps.settled:
                self._learned(allowance.reflection, 0.0)

    def settle(self, allowance: Allowance | None, items: int, largest_worst: float) -> None:
        """Units sent elsewhere came back, and the run's ledger has absorbed what they spent: their share is
        released, and the largest worst case one of them reserved is learned (none, if they made no priced
        call: another map learns it)."""
        if allowance is None or allowance.per_item_usd is None:
            return
        self.caps.release(allowance.per_item_usd * items, allowance.reflection)
        with self.caps.settled:
            self._learned(allowance.reflection, largest_worst)

    def _learned(self, kind: bool, worst: float) -> None:
        """A map of ``kind`` came back having reserved ``worst`` at most per unit (caller holds the lock)."""
        if worst > 0:
            self._recent.setdefault(kind, deque(maxlen=RECENT_MAPS)).append(worst)
        self._learning.discard(kind)
        self.caps.settled.notify_all()

    def _largest(self, kind: bool) -> float | None:
        recent = self._recent.get(kind)
        return max(recent) if recent else None


_shares: weakref.WeakKeyDictionary[RunCaps, RemoteShares] = weakref.WeakKeyDictionary()
_shares_lock = threading.Lock()


def shares_of(caps: RunCaps) -> RemoteShares:
    """The run's shares out on other processes: one keeper per run's caps."""
    with _shares_lock:
        return _shares.setdefault(caps, RemoteShares(caps))
