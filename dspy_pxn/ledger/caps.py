"""Budgets people plan in: dollars (``max_cost_usd``, gepa's ``max_reflection_cost``) and a deadline (``max_wall_s``).

A dollar budget cannot be reserved ahead like metric calls: a rollout's cost is known only once its
prompt is. So every LM call of the search passes one gate, ``RunCaps``, a DSPy callback first in the
context (before a concurrency cap or a user's callback has seen the call). It reserves the call's
worst case (its prompt's tokens at most, ``prices.PromptTokenBound``, plus its ``max_tokens``); a
call that does not fit beside what the ledger says is spent and what is reserved waits for the calls
in flight to settle, and one that would not fit even then, or comes after the deadline, is refused
(``CapReached``), with every later call. When the call ends its reservation is released: what it
cost, the ledger priced as DSPy billed it.

``CapReached`` is a ``BaseException``, as ``KeyboardInterrupt`` is: DSPy's adapters retry, rollouts
score and callbacks log on ``Exception``, and a refused call must end the search instead (the
schedules return the best program found; ``stopped_by`` names the budget). The schedules also avoid
starting work the caps cannot pay for or finish at the run's pace (``blocks``). Work sent to another
process (a Ray actor) carries a share of what is left (``remote``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback

from dspy_pxn.checks import ArgumentError
from dspy_pxn.ledger.ledger import REFLECTING, RunLedger
from dspy_pxn.ledger.prices import (
    FREE,
    Price,
    PromptTokenBound,
    max_output_tokens,
    price_of,
    prompt_size,
    unbounded_error,
    unpriced_error,
)

logger = logging.getLogger(__name__)

__all__ = ["CapReached", "RunCaps", "active", "installed", "priced_for_caps", "seed_validation_paid"]


class CapReached(BaseException):
    """An LM call was refused: the run's dollars or time are spent. ``budget`` names the argument."""

    def __init__(self, budget: str, message: str):
        super().__init__(message)
        self.budget = budget

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:  # it travels back from a Ray actor
        return CapReached, (self.budget, str(self))


def priced_for_caps(max_cost_usd: float | None, max_reflection_cost_usd: float | None,
                    lms: Iterable[Any]) -> dict[str, Price]:
    """Every LM a run with a dollar cap reaches, priced and bounded before its first call (or the
    argument to fix, named); nothing without a dollar cap."""
    if max_cost_usd is None and max_reflection_cost_usd is None:
        return {}
    argument = "max_cost_usd" if max_cost_usd is not None else "gepa_kwargs['max_reflection_cost']"
    prices = {}
    for lm in lms:
        price = price_of(lm)
        if price is None:
            raise unpriced_error(str(getattr(lm, "model", lm)), argument)
        if max_output_tokens(lm) is None and price != FREE:
            raise unbounded_error(str(lm.model))
        prices[lm.model] = price
    return prices


class RunCaps(BaseCallback):
    """The run's dollar and time caps: the gate every LM call passes, and what work they still allow.

    One per compile (and one per unit of work sent to a Ray actor, with that unit's share). Dollars
    spent are the ``ledger``'s; the gate holds what the calls in flight may still cost.
    """

    def __init__(self, ledger: RunLedger, max_cost_usd: float | None, max_reflection_cost_usd: float | None,
                 max_wall_s: float | None,
                 tokens_per_byte: Mapping[str, float] | None = None):
        self.ledger = ledger  # what is spent, and the run's stop signal
        self.max_cost_usd, self.max_reflection_cost_usd, self.max_wall_s = (
            max_cost_usd, max_reflection_cost_usd, max_wall_s)
        self.lock = threading.Lock()
        self.settled = threading.Condition(self.lock)  # work in flight settled: a waiting call or map may fit
        self.reserved = self.reflection_reserved = 0.0
        self.prompt_bound = PromptTokenBound(tokens_per_byte)
        self._open: dict[str, tuple[float, bool, str, int]] = {}  # call id -> worst case, reflection?, model, size
        self.worst_reserved = 0.0  # every call's worst case reserved here, summed (a unit's, on a worker)
        self.refused_worst = 0.0  # the worst case of the call this gate refused
        self._warned_undercount = False

    @property
    def counts_dollars(self) -> bool:
        return self.max_cost_usd is not None or self.max_reflection_cost_usd is not None

    # -- the run's bounds ------------------------------------------------------------
    def seconds_left(self) -> float | None:
        """Seconds before the deadline, on the run's one clock (the ledger's: the search began when it started)."""
        return None if self.max_wall_s is None else max(0.0, self.max_wall_s - self.ledger.elapsed())

    def usd_left(self) -> float | None:
        return None if self.max_cost_usd is None else max(0.0, self.max_cost_usd - self.ledger.spent_usd()[0])

    def refuse(self, budget: str, why: str) -> None:
        """Stop the run now: every later call is refused, naming ``budget``."""
        self.ledger.end(budget, why, refuse=True)
        with self.settled:
            self.settled.notify_all()

    def left(self, reflection: bool) -> tuple[float, str]:
        """Dollars neither spent nor reserved for work of this kind, and the budget they are of (caller holds
        ``lock``)."""
        lefts = self._lefts()
        budget = min(lefts, key=lefts.__getitem__) if reflection else "max_cost_usd"
        return lefts[budget], budget

    def _lefts(self, settled: bool = False) -> dict[str, float]:
        """Each cap's dollars neither spent nor reserved (``settled``: as if nothing were reserved)."""
        spent, reflection_spent = self.ledger.spent_usd()
        reserved, reflection_reserved = (0.0, 0.0) if settled else (self.reserved, self.reflection_reserved)
        caps = {"max_cost_usd": (self.max_cost_usd, spent + reserved),
                "max_reflection_cost": (self.max_reflection_cost_usd, reflection_spent + reflection_reserved)}
        return {name: float("inf") if cap is None else cap - used for name, (cap, used) in caps.items()}

    def _over(self, usd: float, reflection_usd: float, settled: bool = False) -> str | None:
        """The cap that ``usd`` more, ``reflection_usd`` of it the reflection LM's, would overrun, if any."""
        lefts = self._lefts(settled)
        if usd > lefts["max_cost_usd"]:
            return "max_cost_usd"
        return "max_reflection_cost" if reflection_usd > lefts["max_reflection_cost"] else None

    def reserve(self, usd: float, reflection: bool) -> None:
        """Hold ``usd`` for work under way (caller holds ``lock``); ``release`` gives it back."""
        self.reserved += usd
        self.reflection_reserved += usd if reflection else 0.0

    def release(self, usd: float, reflection: bool) -> None:
        with self.settled:
            self.reserve(-usd, reflection)
            self.settled.notify_all()

    # -- the gate: DSPy callback, first in the context's list ----------------------------
    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        if self.ledger.returned:  # the search is over: the held-out evaluation's calls pass
            return
        reflection = bool(dspy.settings.get(REFLECTING, False))
        if self.ledger.refusing:
            raise CapReached(self.ledger.stopped_by or "max_cost_usd", f"the run was stopped by {self.ledger.stopped_by}")
        if self._past_deadline():
            self.refuse("max_wall_s", f"the deadline of {self.max_wall_s:g} s has passed")
            raise CapReached("max_wall_s", f"max_wall_s={self.max_wall_s:g} s has passed")
        model, size = str(getattr(instance, "model", "")), prompt_size(inputs) if self.counts_dollars else 0
        worst = self._worst_case(instance, size, inputs) if self.counts_dollars else 0.0
        with self.settled:
            # A call that would fit once the calls in flight settle waits: they usually cost far less than reserved.
            reflection_usd = worst if reflection else 0.0
            while ((over := self._over(worst, reflection_usd)) is not None and self.reserved
                   and self._over(worst, reflection_usd, settled=True) is None):
                if self.ledger.refusing or self._past_deadline():
                    over = self.ledger.stopped_by if self.ledger.refusing else "max_wall_s"
                    break
                left_s = self.seconds_left() if self.max_wall_s is not None else 1.0
                self.settled.wait(timeout=max(0.001, min(1.0, left_s)))  # looks again in a second, or at the deadline
            if over is None:
                self.worst_reserved += worst
                self.reserve(worst, reflection)
                self._open[call_id] = (worst, reflection, model, size)
        if over is not None:
            self.refused_worst = worst
            self.refuse(over, f"the next call's worst case (${worst:.6f}) does not fit in what is left")
            raise CapReached(over, f"{over} is spent")

    def on_lm_end(self, call_id: str, outputs: Any, exception: BaseException | None = None) -> None:
        with self.lock:
            reservation = self._open.pop(call_id, None)
        if reservation is None:
            return
        worst, reflection, model, size = reservation
        call = self.ledger.call_in_progress()  # billed while it was in progress; None: not heard here
        if call is not None:
            self.prompt_bound.learn(model, size, call.prompt_tokens)
            if call.cost_usd > worst * (1 + 1e-9) and not self._warned_undercount:
                self._warned_undercount = True
                logger.warning("An LM call to %s cost $%.6f, more than its reserved worst case $%.6f: its prompt was "
                               "billed more tokens per byte than earlier ones, so a dollar cap may be overrun by that "
                               "difference.", model, call.cost_usd, worst)
        self.release(worst, reflection)

    def _past_deadline(self) -> bool:
        return self.max_wall_s is not None and self.ledger.elapsed() >= self.max_wall_s

    def _worst_case(self, lm: Any, size: int, inputs: Mapping[str, Any]) -> float:
        model = str(getattr(lm, "model", ""))
        price = self.ledger.prices.get(model)
        if price is None:  # an LM the run did not reach before it began (one made in forward)
            if (price := price_of(lm)) is None:
                error = unpriced_error(model, "max_cost_usd")
                self.refuse("max_cost_usd", str(error))
                logger.error("%s", error)
                raise CapReached("max_cost_usd", str(error))
            self.ledger.prices[model] = price
        if price == FREE:
            return 0.0
        limit = max_output_tokens(lm, inputs.get("kwargs"))
        if limit is None:
            self.refuse("max_cost_usd", f"{model!r} has no max_tokens")
            raise CapReached("max_cost_usd", str(unbounded_error(model)))
        return price.of(self.prompt_bound.tokens(model, size), limit)

    # -- what the caps still allow, at the run's pace ------------------------------------
    def metric_calls_affordable(self, metric_calls: int) -> float | None:
        """The metric calls the dollars left would buy at this run's dollars per metric call so far (every LM call of
        the search, reflections included, over the ``metric_calls`` spent), by the cap that buys the fewest; None
        where no dollar cap counts or nothing priced was spent yet."""
        if not self.counts_dollars or metric_calls <= 0:
            return None
        spent, reflection_spent = self.ledger.spent_usd()
        lefts = self._lefts(settled=True)
        affordable = [lefts[cap] / (used / metric_calls) for cap, used in
                      (("max_cost_usd", spent), ("max_reflection_cost", reflection_spent))
                      if used > 0 and lefts[cap] != float("inf")]
        return max(0.0, min(affordable)) if affordable else None

    def blocks(self, rollouts: int, reflections: int, rollout_waves: int, reflections_in_series: int) -> str | None:
        """The budget that does not allow this much more work (None: all do), and says so once: its
        dollars (``_short_of``) or its time (``in_time``)."""
        if (short := self._short_of(rollouts, reflections)) is not None:
            self.ledger.end(short, "the dollars left do not pay for the next piece of work at the cost measured so far")
            return self.ledger.stopped_by
        if not self.in_time(rollout_waves, reflections_in_series):
            self.ledger.end("max_wall_s", "the next piece of work cannot finish before the deadline at the latencies "
                                          "measured so far")
            return self.ledger.stopped_by
        return None

    def _short_of(self, rollouts: int, reflections: int) -> str | None:
        """The budget whose dollars left beside what is reserved do not pay for this much more work at the
        mean cost per rollout and per reflection so far (nothing measured yet: none). Planning at the mean,
        not the worst case, spends the budget; the gate still holds every call to its worst case, so the
        run never spends more, and at worst the last pieces of work are cut short."""
        ledger, tally = self.ledger, self.ledger.tally()
        per_rollout = tally.task_usd / ledger.rollouts if ledger.rollouts else 0.0
        for_reflections = reflections * (tally.reflection_usd / ledger.reflections if ledger.reflections else 0.0)
        with self.lock:
            return self._over(rollouts * per_rollout + for_reflections, for_reflections)

    def in_time(self, rollout_waves: int, reflections_in_series: int) -> bool:
        """Whether work of this critical path (waves of rollouts, reflections one after another) ends
        before the deadline, at the median wave and reflection seconds so far."""
        seconds_left = self.seconds_left()
        if seconds_left is None:
            return True
        return rollout_waves * self.ledger.wave_s() + reflections_in_series * self.ledger.reflection_s() <= seconds_left


@contextmanager
def seed_validation_paid() -> Iterator[None]:
    """The seed's score on the valset is where every search starts: a cap that cannot pay for it is an
    argument to change, not a result."""
    try:
        yield
    except CapReached as reached:
        raise ArgumentError(f"{reached.budget} ran out while the seed program was scored on the valset, before "
                            f"any search ({reached}): raise {reached.budget}, or use a smaller valset.") from None


def active() -> RunCaps | None:
    """The caps of the run whose context this is (a pool that sends work elsewhere reserves with them)."""
    return next((c for c in dspy.settings.get("callbacks", None) or [] if isinstance(c, RunCaps)), None)


def installed(caps: RunCaps | None) -> AbstractContextManager[Any]:
    """The gate first among the context's DSPy callbacks: a call it refuses was seen by no other callback
    (DSPy runs no end callbacks for a call whose start raised, so a later one would hold a slot or a span)."""
    if caps is None:
        return nullcontext()
    return dspy.context(callbacks=[caps, *(dspy.settings.get("callbacks", None) or [])])
