"""Budgets people plan in: dollars (``max_cost_usd``, ``max_reflection_cost_usd``) and a deadline (``max_wall_s``).

A metric-call budget is exact because the schedules reserve calls before they start work. A
dollar budget cannot be planned that way: what a rollout costs is known only when its prompt
is. So every LM call of the search passes one gate, ``RunCaps``, a DSPy callback installed
first in the context (before a concurrency cap or a user's callback has seen the call):

- before the call it reserves the call's worst case: its prompt's tokens as litellm counts them
  plus its ``max_tokens`` of output, at the model's price. If that does not fit beside what is
  spent and reserved, it waits for the calls in flight to settle (they usually cost far less than
  their worst case); if it cannot fit even then, or the deadline has passed, it refuses the call by
  raising ``CapReached``, and every later call of the run is refused too;
- DSPy hands the call's billed usage to the run's usage meter while the call is in progress, and
  the meter tells the call's reservation (``usage.call_in_progress``); when the call ends its reservation is settled at
  that cost (0 for a cache hit, which DSPy does not bill; the worst case if the provider
  reported no tokens).

``CapReached`` is a ``BaseException``, as ``KeyboardInterrupt`` is: DSPy's adapters retry
failed calls with another adapter, rollouts score errors as failures and callbacks' errors are
logged, all on ``Exception``; a refused call must instead end the search, which the schedules
do by returning the best program found (``stopped_by`` says which budget ended the run).

The gate refuses late; the schedules avoid starting work the caps cannot pay for or finish in
time, from what the run has measured so far (``blocks``): dollars per rollout and
per reflection, seconds per rollout wave and per reflection, fitted live.

Work sent to another process (a Ray actor) cannot reach this gate: each unit carries a share
(``Allowance``) reserved here, runs behind a gate of its own there, and is settled here at the
usage it brings back (``remote_allowance``, ``settle_remote``).
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import dspy
from dspy.utils.callback import BaseCallback

from dspy_pxn.checks import ArgumentError
from dspy_pxn.events import Phase, StepListener, override
from dspy_pxn.usage import billed_tokens, call_in_progress, token_prices

logger = logging.getLogger(__name__)

__all__ = ["REFLECTING", "Allowance", "CapReached", "Price", "RunCaps", "ShareSpent", "active", "installed", "price_of",
           "seed_validation_paid"]

# The DSPy setting a reflection or sibling merge sets around its LM calls: the reflection LM may be
# the task LM, so the object alone does not say which budget a call is charged to.
REFLECTING = "dspy_pxn_reflecting"

# Providers that run on the user's own machine: without a price in litellm's map they cost nothing.
# A unit sent to a worker gets this much more than the largest worst case one of its kind reserved: a
# unit that needs more is refused there and ends the run; more headroom leaves more of the cap unspent.
REMOTE_HEADROOM = 1.25

LOCAL_PROVIDERS = frozenset({"ollama", "ollama_chat", "lm_studio", "llamafile"})
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0"})


class CapReached(BaseException):
    """An LM call was refused: the run's dollars or time are spent. ``budget`` names the argument."""

    def __init__(self, budget: str, message: str):
        super().__init__(message)
        self.budget = budget

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:  # it travels back from a Ray actor
        return CapReached, (self.budget, str(self))


class ShareSpent(CapReached):
    """A unit sent to a worker needed more than its share (``needed``, its worst case): the driver learns
    the larger worst case and sends the map again if the cap pays for it."""

    def __init__(self, budget: str, message: str, needed: float):
        super().__init__(budget, message)
        self.needed = needed

    def __reduce__(self) -> tuple[Any, tuple[str, str, float]]:
        return ShareSpent, (self.budget, str(self), self.needed)


@dataclass(frozen=True)
class Price:
    """Dollars per prompt token and per completion token."""

    prompt: float
    completion: float

    def of(self, prompt_tokens: float, completion_tokens: float) -> float:
        return prompt_tokens * self.prompt + completion_tokens * self.completion


FREE = Price(0.0, 0.0)


def is_local(lm: Any) -> bool:
    """An LM served on this machine: a local provider, or an ``api_base`` on the loopback interface."""
    provider = str(getattr(lm, "model", "")).partition("/")[0]
    api_base = (getattr(lm, "kwargs", None) or {}).get("api_base") or getattr(lm, "api_base", None)
    host = urlparse(api_base).hostname if isinstance(api_base, str) else None
    return provider in LOCAL_PROVIDERS or host in LOOPBACK_HOSTS or (host or "").startswith("127.")


def price_of(lm: Any) -> Price | None:
    """The LM's price: litellm's (a registered one first), else DSPy's copy of litellm's map, else free
    for a model served on this machine; None when nobody knows it."""
    table = token_prices(str(getattr(lm, "model", "")))
    if table is not None:
        return Price(*table)
    return FREE if is_local(lm) else None


def unpriced_error(model: str, argument: str) -> ArgumentError:
    return ArgumentError(
        f"{argument} needs every LM's price, and litellm has none for {model!r}. Register it before compiling: "
        f"litellm.register_model({{{model!r}: {{'input_cost_per_token': 1.5e-07, 'output_cost_per_token': 6e-07, "
        f"'litellm_provider': {model.partition('/')[0] or 'openai'!r}, 'mode': 'chat'}}}}) (the cost_per_token "
        "fields in dollars), or serve it locally (an api_base on localhost is priced at 0)."
    )


def max_output_tokens(lm: Any, call_kwargs: Mapping[str, Any] | None = None) -> int | None:
    """The most tokens one call may answer with: the call's or the LM's ``max_tokens``, else the model's limit."""
    for kwargs in (call_kwargs or {}, getattr(lm, "kwargs", None) or {}):
        for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            value = kwargs.get(key)
            if isinstance(value, int) and value > 0:
                return value
    litellm = sys.modules.get("litellm")
    entry = (getattr(litellm, "model_cost", None) or {}).get(str(getattr(lm, "model", ""))) if litellm else None
    value = entry.get("max_output_tokens") if isinstance(entry, Mapping) else None
    return value if isinstance(value, int) and value > 0 else None


@dataclass
class _Call:
    """One LM call's reservation; ``billed`` is what the usage meter tells it (``usage.call_in_progress``)."""

    gate: RunCaps
    worst: float
    reflection: bool
    actual: float | None = None  # None: no usage heard (a cache hit)

    def billed(self, model: str, usage: Mapping[str, Any]) -> None:
        self.gate._bill(self, model, usage)


class RunCaps(BaseCallback, StepListener):
    """The run's dollar and time caps: the gate every LM call passes, and what work they still allow.

    One per compile. ``prices`` maps each model the run reaches to its price, checked before the
    first call; a model met only during the run (an LM made in ``forward``) is priced on its first call.
    """

    def __init__(self, max_cost_usd: float | None, max_reflection_cost_usd: float | None, max_wall_s: float | None,
                 prices: Mapping[str, Price], *, spent_usd: float = 0.0, reflection_spent_usd: float = 0.0):
        self.max_cost_usd, self.max_reflection_cost_usd, self.max_wall_s = (
            max_cost_usd, max_reflection_cost_usd, max_wall_s)
        self.prices = dict(prices)
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)  # a call in flight settled: a waiting call may fit
        self.spent_usd, self.reflection_spent_usd = spent_usd, reflection_spent_usd  # a resumed run's, first
        self._reserved = self._reflection_reserved = 0.0
        self._open: dict[str, _Call] = {}
        self.deadline: float | None = None
        self.started = time.monotonic()
        self.workers = 1  # the pool's W, for the rounds a batch of rollouts takes
        self.stopped_by: str | None = None  # the budget that ended the run
        self._refusing = False  # every call is refused from now on
        self.lifted = False
        # What the run measured: dollars and seconds per rollout and per reflection.
        self._rollouts = self._reflections = self._batches = 0
        self._task_usd = 0.0  # dollars the task calls cost (the rest is reflection's)
        self._wave_s: list[float] = []
        self._reflection_s: list[float] = []
        self._warned_undercount = False
        self._remote_worst: dict[bool, float] = {}  # the largest worst case a unit sent elsewhere reserved, by kind
        self._probes: dict[bool, threading.Event] = {}  # set when the first map of a kind has come back
        self.worst_reserved = 0.0  # every call's worst case reserved here, summed (a unit's, on a worker)
        self.refused_worst = 0.0  # the worst case of the call this gate refused

    @classmethod
    def for_run(cls, max_cost_usd: float | None, max_reflection_cost_usd: float | None, max_wall_s: float | None,
                lms: Iterable[Any], *, spent_usd: float = 0.0, reflection_spent_usd: float = 0.0) -> RunCaps | None:
        """The caps a run was given, with every reachable LM priced and bounded; None without caps."""
        if max_cost_usd is None and max_reflection_cost_usd is None and max_wall_s is None:
            return None
        prices: dict[str, Price] = {}
        if max_cost_usd is not None or max_reflection_cost_usd is not None:
            argument = "max_cost_usd" if max_cost_usd is not None else "max_reflection_cost_usd"
            _import_litellm()  # its token counter sizes each reservation; imported now, not in the first call
            for lm in lms:
                prices[lm.model] = _priced(lm, argument)
        return cls(max_cost_usd, max_reflection_cost_usd, max_wall_s, prices,
                   spent_usd=spent_usd, reflection_spent_usd=reflection_spent_usd)

    @property
    def counts_dollars(self) -> bool:
        return self.max_cost_usd is not None or self.max_reflection_cost_usd is not None

    # -- the run's bounds ------------------------------------------------------------
    def start(self, workers: int = 1) -> None:
        """The search begins on a pool of ``workers``: the deadline counts from now."""
        self.workers = workers
        self.started = time.monotonic()
        self.deadline = self.started + self.max_wall_s if self.max_wall_s is not None else None

    def lift(self) -> None:
        """The search is over: later calls (the held-out evaluation) pass."""
        self.lifted = True

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def usd_left(self) -> float | None:
        with self._lock:
            return None if self.max_cost_usd is None else max(0.0, self.max_cost_usd - self.spent_usd)

    def refuse(self, budget: str, why: str) -> None:
        """Stop the run now: every later call is refused, naming ``budget``."""
        with self._settled:
            first = not self._refusing
            self.stopped_by, self._refusing = self.stopped_by or budget, True
            self._settled.notify_all()
        if first:
            logger.info("%s: %s; the search stops and returns the best program found.", budget, why)

    def end(self, budget: str, why: str) -> None:
        """No more work is started (what is in flight may finish): ``budget`` ends the run."""
        with self._lock:
            first = self.stopped_by is None
            self.stopped_by = self.stopped_by or budget
        if first:
            logger.info("%s: %s; no more work is started.", budget, why)

    # -- the gate: DSPy callback, first in the context's list ----------------------------
    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        if self.lifted:
            return
        reflection = bool(dspy.settings.get(REFLECTING, False))
        if self._refusing:
            raise CapReached(self.stopped_by or "max_cost_usd", f"the run was stopped by {self.stopped_by}")
        if self._past_deadline():
            self.refuse("max_wall_s", f"the deadline of {self.max_wall_s:g} s has passed")
            raise CapReached("max_wall_s", f"max_wall_s={self.max_wall_s:g} s has passed")
        worst = self._worst_case(instance, inputs) if self.counts_dollars else 0.0
        with self._settled:
            # A call that would fit once the calls in flight settle (they usually cost far less than their
            # worst case) waits for them; one that would not fit even then is refused.
            while (over := self._over(worst, reflection)) is not None and self._fits_when_settled(worst, reflection):
                if self._refusing or self._past_deadline():
                    over = self.stopped_by if self._refusing else "max_wall_s"
                    break
                self._settled.wait(timeout=self._wait_s())
            if over is None:
                self.worst_reserved += worst
                self._reserved += worst
                self._reflection_reserved += worst if reflection else 0.0
                call = _Call(self, worst, reflection)
                self._open[call_id] = call
        if over is not None:
            self.refused_worst = worst
            self.refuse(over, f"the next call's worst case (${worst:.6f}) does not fit in what is left")
            raise CapReached(over, f"{over} is spent")
        call_in_progress.call = call

    def on_lm_end(self, call_id: str, outputs: Any, exception: BaseException | None = None) -> None:
        with self._settled:
            call = self._open.pop(call_id, None)
            if call is None:
                return
            cost = call.actual if call.actual is not None else 0.0  # unheard: a cache hit, not billed
            self._reserved -= call.worst
            self.spent_usd += cost
            if call.reflection:
                self._reflection_reserved -= call.worst
                self.reflection_spent_usd += cost
            else:
                self._task_usd += cost
            self._settled.notify_all()
        if getattr(call_in_progress, "call", None) is call:
            call_in_progress.call = None

    def _fits_when_settled(self, worst: float, reflection: bool) -> bool:
        """Whether a call of this worst case fits beside what is spent once nothing is reserved (lock held)."""
        if not self._reserved:
            return False
        if self.max_cost_usd is not None and self.spent_usd + worst > self.max_cost_usd:
            return False
        return not (reflection and self.max_reflection_cost_usd is not None
                    and self.reflection_spent_usd + worst > self.max_reflection_cost_usd)

    def _wait_s(self) -> float:
        """How long a call waits for others to settle before it looks again (the deadline, at most)."""
        return max(0.001, min(1.0, self.seconds_left() if self.deadline is not None else 1.0))

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _over(self, worst: float, reflection: bool) -> str | None:
        """The budget a call of this worst case would overrun, if any (caller holds the lock)."""
        if self.max_cost_usd is not None and self.spent_usd + self._reserved + worst > self.max_cost_usd:
            return "max_cost_usd"
        if reflection and self.max_reflection_cost_usd is not None and (
                self.reflection_spent_usd + self._reflection_reserved + worst > self.max_reflection_cost_usd):
            return "max_reflection_cost_usd"
        return None

    def _bill(self, call: _Call, model: str, usage: Mapping[str, Any]) -> None:
        if not self.counts_dollars:
            return
        cost = self._cost(model, usage)
        if cost is None:  # the provider said nothing: count the worst case
            cost = call.worst
        with self._lock:
            call.actual = (call.actual or 0.0) + cost
            undercounted = call.actual > call.worst * (1 + 1e-9) and not self._warned_undercount
            self._warned_undercount = self._warned_undercount or undercounted
        if undercounted:
            logger.warning("An LM call cost $%.6f, more than its reserved worst case $%.6f: the provider counts more "
                           "prompt tokens than litellm's tokenizer does for %s, so a dollar cap may be overrun by "
                           "that difference.", call.actual, call.worst, model)

    def _cost(self, model: str, usage: Mapping[str, Any]) -> float | None:
        """What a usage entry was billed at the model's price; None when it reports no tokens."""
        prompt, completion = billed_tokens(usage)
        if prompt is None and completion is None:
            return None
        return self._price(model).of(prompt or 0, completion or 0)

    def _price(self, model: str) -> Price:
        price = self.prices.get(model)
        if price is None:
            table = token_prices(model)
            price = Price(*table) if table is not None else None
            if price is None:
                raise self._unpriced(model)
            self.prices[model] = price
        return price

    def _unpriced(self, model: str) -> CapReached:
        """A model met during the run that has no price stops the run, with the fix in the log."""
        error = unpriced_error(model, "max_cost_usd")
        self.refuse("max_cost_usd", str(error))
        logger.error("%s", error)
        return CapReached("max_cost_usd", str(error))

    def _worst_case(self, lm: Any, inputs: Mapping[str, Any]) -> float:
        model = str(getattr(lm, "model", ""))
        if model not in self.prices:  # an LM the run did not reach before it began (one made in forward)
            if (price := price_of(lm)) is None:
                raise self._unpriced(model)
            self.prices[model] = price
        if self.prices[model] == FREE:
            return 0.0
        limit = max_output_tokens(lm, inputs.get("kwargs"))
        if limit is None:
            self.refuse("max_cost_usd", f"{model!r} has no max_tokens")
            raise CapReached("max_cost_usd", str(_unbounded_error(model)))
        messages = inputs.get("messages") or [{"role": "user", "content": str(inputs.get("prompt") or "")}]
        return self.prices[model].of(_count_prompt_tokens(model, messages), limit)

    # -- what the caps still allow, from what the run measured ------------------------------
    @override
    def evaluated(self, phase: Phase, seconds: float, rollouts: int, failures: int) -> None:
        with self._lock:
            self._rollouts += rollouts
            self._batches += 1
            if rollouts and self._batches > 1:  # the first batch pays the run's one-off costs (imports, connections)
                self._wave_s.append(seconds / -(-rollouts // self.workers))  # a batch wider than the pool: waves

    @override
    def reflected(self, seconds: float, jobs: int, failed: int) -> None:
        with self._lock:
            self._reflections += jobs
        self._reflection_s.append(seconds)

    def blocks(self, rollouts: int, reflections: int, rollout_waves: int, reflections_in_series: int) -> str | None:
        """The budget that does not allow this much more work (None: all do), and says so once: its
        dollars (``_short_of``) or its time (``in_time``)."""
        if (short := self._short_of(rollouts, reflections)) is not None:
            self.end(short, "the dollars left do not pay for the next piece of work at the cost measured so far")
            return self.stopped_by
        if not self.in_time(rollout_waves, reflections_in_series):
            self.end("max_wall_s", "the next piece of work cannot finish before the deadline at the latencies "
                                   "measured so far")
            return self.stopped_by
        return None

    def _short_of(self, rollouts: int, reflections: int) -> str | None:
        """The budget whose dollars left beside what is reserved do not pay for this much more work at the
        mean cost per rollout and per reflection so far (nothing measured yet: none). Planning at the mean,
        not the worst case, spends the budget; the gate still holds every call to its worst case, so the
        run never spends more, and at worst the last pieces of work are cut short."""
        with self._lock:
            per_rollout = self._task_usd / self._rollouts if self._rollouts else 0.0
            per_reflection = self.reflection_spent_usd / self._reflections if self._reflections else 0.0
            for_reflections = reflections * per_reflection
            if self.max_cost_usd is not None and (self.spent_usd + self._reserved + rollouts * per_rollout
                                                  + for_reflections > self.max_cost_usd):
                return "max_cost_usd"
            if self.max_reflection_cost_usd is not None and (
                    self.reflection_spent_usd + self._reflection_reserved + for_reflections
                    > self.max_reflection_cost_usd):
                return "max_reflection_cost_usd"
        return None

    def in_time(self, rollout_waves: int, reflections_in_series: int) -> bool:
        """Whether work of this critical path (waves of rollouts, reflections one after another) ends
        before the deadline, at the median wave and reflection seconds so far."""
        if self.deadline is None:
            return True
        wave = _median(self._wave_s)
        reflection = _median(self._reflection_s)
        return time.monotonic() + rollout_waves * wave + reflections_in_series * reflection <= self.deadline

    # -- work sent to another process (a Ray actor): an allowance reserved here, settled when it returns --
    def remote_allowance(self, items: int, reflection: bool) -> Allowance | None:
        """Reserve what ``items`` units sent elsewhere may spend, each its own share (``Allowance``).

        What one unit of a kind (a rollout, a reflection) costs at worst is learned from the first map
        of that kind, which runs alone with half of what is left; maps of that kind wait for it. Later
        shares are the largest worst case a unit of the kind reserved, with ``REMOTE_HEADROOM``, within
        what is left.
        Refused (``CapReached``) when what is left does not cover a unit at that worst case.
        """
        if self.lifted:
            return None
        while True:
            if self._refusing:
                raise CapReached(self.stopped_by or "max_cost_usd", f"the run was stopped by {self.stopped_by}")
            seconds = self.seconds_left()
            if seconds is not None and seconds <= 0:
                self.refuse("max_wall_s", f"the deadline of {self.max_wall_s:g} s has passed")
                raise CapReached("max_wall_s", f"max_wall_s={self.max_wall_s:g} s has passed")
            if not self.counts_dollars:
                return Allowance(None, "max_cost_usd", reflection, time.time() + seconds if seconds else None,
                                 dict(self.prices), share_bound=False)
            with self._lock:
                left, budget = self._left(reflection)
                largest = self._remote_worst.get(reflection)
                learning = self._probes.get(reflection) if largest is None else None
                if learning is None:
                    if largest is None:  # this map learns what a unit of its kind costs
                        self._probes[reflection] = threading.Event()
                        per_item = left / (2 * items)
                    else:
                        per_item = min(REMOTE_HEADROOM * largest, left / items)
                    share_bound = per_item < left / items  # less than the cap would allow: it may be raised
                    affordable = per_item > 0 and (largest is None or per_item >= largest)
                    if affordable:
                        self._reserved += per_item * items
                        self._reflection_reserved += per_item * items if reflection else 0.0
            if learning is not None:  # another map is learning it: wait for its worst case
                learning.wait(timeout=1.0)
                continue
            if not affordable:
                self.refuse(budget, "what is left does not pay for the next unit of work sent to a worker")
                raise CapReached(budget, f"{budget} is spent")
            deadline = None if seconds is None else time.time() + seconds
            return Allowance(per_item, budget, reflection, deadline, dict(self.prices), share_bound)

    def needs_more(self, allowance: Allowance, needed: float) -> bool:
        """A unit outgrew its share (``ShareSpent``): its kind's worst case is at least ``needed``. Whether
        what is left pays for a unit that large: then the map is sent again."""
        with self._lock:
            kind = allowance.reflection
            self._remote_worst[kind] = max(self._remote_worst.get(kind, 0.0), needed)
            left, _ = self._left(kind)
            probe = self._probes.get(kind)
        if probe is not None:
            probe.set()
        return left >= needed

    def unit_lost(self, allowance: Allowance | None) -> None:
        """Units sent elsewhere never came back (their worker died): their reservation stays spent, as
        what they billed is unknown, and a map that learns their kind's cost may start."""
        if allowance is not None and allowance.per_item_usd is not None:
            with self._lock:
                probe = self._probes.pop(allowance.reflection, None) if (
                    allowance.reflection not in self._remote_worst) else None
            if probe is not None:
                probe.set()

    def _left(self, reflection: bool) -> tuple[float, str]:
        """Dollars neither spent nor reserved, and the budget they are of (caller holds the lock)."""
        left = {"max_cost_usd": math.inf}
        if self.max_cost_usd is not None:
            left["max_cost_usd"] = self.max_cost_usd - self.spent_usd - self._reserved
        if reflection and self.max_reflection_cost_usd is not None:
            left["max_reflection_cost_usd"] = (
                self.max_reflection_cost_usd - self.reflection_spent_usd - self._reflection_reserved)
        budget = min(left, key=left.__getitem__)
        return left[budget], budget

    def settle_remote(self, allowance: Allowance | None, items: int, usage: Mapping[str, list[Mapping[str, Any]]],
                      largest_worst: float) -> None:
        """Units sent elsewhere came back: their reservation is released and what they were billed spent."""
        if allowance is None or allowance.per_item_usd is None:
            return
        cost = sum(self._cost(model, entry) or 0.0 for model, entries in usage.items() for entry in entries)
        reserved = allowance.per_item_usd * items
        with self._lock:
            self._reserved -= reserved
            self.spent_usd += cost
            if allowance.reflection:
                self._reflection_reserved -= reserved
                self.reflection_spent_usd += cost
            else:
                self._task_usd += cost
            if largest_worst > 0:
                self._remote_worst[allowance.reflection] = max(self._remote_worst.get(allowance.reflection, 0.0),
                                                               largest_worst)
            probe = self._probes.get(allowance.reflection)
        if probe is not None and allowance.reflection in self._remote_worst:
            probe.set()
        elif probe is not None and largest_worst == 0:  # the units made no priced call: another map learns it
            self.unit_lost(allowance)


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


@dataclass(frozen=True)
class Allowance:
    """What each unit of one map sent to another process (a Ray actor) may spend, and until when.

    The driver reserved ``per_item_usd`` per unit (``RunCaps.remote_allowance``); on the worker each
    unit runs behind its own gate (``gate``) with that much to spend, the run's prices and its deadline,
    and a refusal there names the driver's budget that bounded the share.
    """

    per_item_usd: float | None  # None: no dollar cap, only a deadline
    budget: str  # the cap the share came from
    reflection: bool
    deadline_epoch: float | None
    prices: dict[str, Price]
    share_bound: bool  # the share, not what is left of the cap, bounds a unit: a larger one may be granted

    def gate(self) -> RunCaps:
        seconds = None if self.deadline_epoch is None else self.deadline_epoch - time.time()
        if seconds is not None and seconds <= 0:
            raise CapReached("max_wall_s", "the run's deadline has passed")
        dollars = self.per_item_usd
        caps = RunCaps(None if self.reflection else dollars, dollars if self.reflection else None,
                       seconds, self.prices)
        caps.start()
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


def _median(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values[-50:])
    return ordered[len(ordered) // 2]


def _priced(lm: Any, argument: str) -> Price:
    price = price_of(lm)
    if price is None:
        raise unpriced_error(str(getattr(lm, "model", lm)), argument)
    if max_output_tokens(lm) is None and price != FREE:
        raise _unbounded_error(str(lm.model))
    return price


def _unbounded_error(model: str) -> ArgumentError:
    return ArgumentError(f"A dollar cap needs a bound on each call's output, and {model!r} has none: pass "
                         f"dspy.LM({model!r}, max_tokens=...) (the worst case of a call is its prompt plus max_tokens).")


def _import_litellm() -> None:
    import litellm  # noqa: F401 - the token counter; dspy depends on litellm


def _count_prompt_tokens(model: str, messages: list[dict[str, Any]]) -> int:
    """The prompt's tokens as litellm counts them; a model its tokenizers do not know is counted as
    one token per two characters (more than any BPE tokenizer gives English text)."""
    import litellm

    try:
        return int(litellm.token_counter(model=model, messages=messages))
    except Exception:  # noqa: BLE001 - a message shape its counter does not take
        return math.ceil(sum(len(str(m.get("content", ""))) for m in messages) / 2)
