"""LM tokens and dollars spent by one run, read where DSPy already reports them.

The paper compares optimizer settings by what they cost, so each step records its
tokens and dollars. DSPy hands every billed (non-cached) LM call's usage to
``settings.usage_tracker``, a context setting; the worker pool copies the caller's
context into every task, so a meter installed around ``compile`` sees exactly this
run's calls, from every thread, and no other run's. Prices come from litellm's
price map; a model it does not know is counted as unpriced, never as free.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import dspy
from dspy.utils.usage_tracker import UsageTracker

from dspy_pxn import abandoned

logger = logging.getLogger(__name__)

# The LM call in progress in this thread that wants to hear its billed usage: DSPy bills a call while it
# is in progress, in the calling thread, so a dollar cap (dspy_pxn.caps) settles its reservation here.
call_in_progress = threading.local()


@dataclass(frozen=True)
class UsageTotals:
    """Running totals; ``cost_usd`` is None while no call had a known price."""

    lm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    unpriced_calls: int = 0

    def since(self, earlier: UsageTotals) -> UsageTotals:
        cost = None
        if self.cost_usd is not None:
            cost = self.cost_usd - (earlier.cost_usd or 0.0)
        return UsageTotals(
            lm_calls=self.lm_calls - earlier.lm_calls,
            prompt_tokens=self.prompt_tokens - earlier.prompt_tokens,
            completion_tokens=self.completion_tokens - earlier.completion_tokens,
            cost_usd=cost,
            unpriced_calls=self.unpriced_calls - earlier.unpriced_calls,
        )


def billed_tokens(usage: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """A usage entry's prompt and completion tokens (OpenAI's or lm15's names); None where it has none."""
    return _tokens(usage, "prompt_tokens", "input_tokens"), _tokens(usage, "completion_tokens", "output_tokens")


def _tokens(usage: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        value = usage.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value)
    return None


class UsageMeter(UsageTracker):
    """A DSPy usage tracker that also keeps thread-safe running totals and dollars.

    It must survive what DSPy does with its ``usage_tracker`` setting:

    - ``dspy.Parallel``, ``Module.batch`` and ``dspy.Evaluate`` (DSPy's ``ParallelExecutor``)
      deep-copy the tracker into every worker thread so that each thread "tracks its own
      usage". A run's meter must see every call of the run, from any thread, so a copy of
      it is the meter itself (``__deepcopy__``); a real copy would fail on the lock and
      DSPy would turn each parallel item into ``None``.
    - A nested ``dspy.track_usage()`` inside a program hands its entries up by extending
      ``usage_data`` directly, without ``add_usage``; totals are therefore read from
      ``usage_data`` (new entries only, so reading stays cheap), not counted in ``add_usage``.
    """

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._totals = UsageTotals()
        self._counted: dict[str, int] = {}  # entries of each model already in the totals
        self._prices: dict[str, tuple[float, float] | None] = {}

    def __deepcopy__(self, memo: dict[int, Any]) -> UsageMeter:
        return self

    def add_usage(self, lm: str, usage_entry: dict[str, Any]) -> None:
        run_ended = abandoned.run_ended_check()
        with self._lock:  # decided under the lock: a reader sees the entry, or it is never counted
            if run_ended is None or not run_ended():
                super().add_usage(lm, usage_entry)
        call = getattr(call_in_progress, "call", None)
        if call is not None:  # a dollar cap's reservation (dspy_pxn.caps), settled at what the call was billed
            call.billed(lm, usage_entry)

    def absorb(self, other: UsageTracker) -> None:
        """Take in another tracker's entries (a rollout's own, under ``track_usage``)."""
        with self._lock:
            for lm, entries in other.usage_data.items():
                self.usage_data[lm].extend(entries)

    def _count_new_entries(self) -> None:
        """Fold entries added since the last read into the totals (caller holds the lock)."""
        total = self._totals
        cost, calls, prompt, completion, unpriced = (
            total.cost_usd, total.lm_calls, total.prompt_tokens, total.completion_tokens, total.unpriced_calls,
        )
        for lm, entries in list(self.usage_data.items()):
            start, end = self._counted.get(lm, 0), len(entries)
            if start == end:
                continue
            self._counted[lm] = end
            price = self._price(lm)
            for entry in entries[start:end]:
                entry_prompt, entry_completion = (count or 0 for count in billed_tokens(entry))
                calls += 1
                prompt += entry_prompt
                completion += entry_completion
                if price is None:
                    unpriced += 1
                else:
                    cost = (cost or 0.0) + entry_prompt * price[0] + entry_completion * price[1]
        self._totals = UsageTotals(calls, prompt, completion, cost, unpriced)

    def totals(self) -> UsageTotals:
        with self._lock:
            self._count_new_entries()
            return self._totals

    def _price(self, model: str) -> tuple[float, float] | None:
        """Dollars per prompt and per completion token, from litellm's table; None if unknown."""
        if model not in self._prices:
            self._prices[model] = token_prices(model)
        return self._prices[model]

    @contextmanager
    def active(self) -> Iterator[UsageMeter]:
        """Meter the LM calls made inside the block; hand them on to an enclosing tracker."""
        parent = dspy.settings.usage_tracker
        with dspy.context(usage_tracker=self):
            try:
                yield self
            finally:
                if parent is not None:
                    for lm, entries in self.usage_data.items():
                        parent.usage_data[lm].extend(entries)


def call_program(program: Any, inputs: Mapping[str, Any]) -> Any:
    """Call a program in a rollout the way DSPy's evaluators do, usage included.

    With ``track_usage=True`` (``dspy.configure(track_usage=True)``; ``mlflow.dspy.autolog``
    turns it on for the process) DSPy attaches each prediction's LM usage
    (``pred.get_lm_usage()``, which cost-aware metrics read) only when no usage tracker is
    active, and a run's meter is one. So the rollout gets a tracker of its own, whose
    totals are attached to the prediction as DSPy would attach them and whose entries join
    the run's meter: every call counted exactly, whatever the program returns.
    """
    meter = dspy.settings.usage_tracker
    if not (dspy.settings.track_usage and isinstance(meter, UsageMeter)):
        return program(**inputs)
    rollout = UsageMeter()
    with dspy.context(usage_tracker=rollout):
        prediction = program(**inputs)
    attach = getattr(program, "_set_lm_usage", None)  # dspy.Module's own: a Prediction, or (Prediction, trace)
    if callable(attach):
        attach(rollout.get_total_tokens(), prediction)
    meter.absorb(rollout)
    return prediction


# How many of a run's metric calls may go without an LM call before the run says the cache answered them.
CACHE_WARNING_RATIO = 0.5


def answered_from_cache(totals: UsageTotals, metric_calls: int) -> bool:
    """Far fewer LM calls than metric calls: a cache (DSPy's is on by default) answered the run."""
    return bool(metric_calls) and totals.lm_calls < CACHE_WARNING_RATIO * metric_calls


def warn_if_answered_from_cache(totals: UsageTotals, metric_calls: int) -> None:
    """Such a run's timings, token counts and costs describe the cache, not the LMs."""
    if answered_from_cache(totals, metric_calls):
        logger.warning(
            "This run made %d LM calls for %d metric calls: most answers came from DSPy's cache (or the program "
            "calls no LM), so its wall-clock, tokens and cost do not describe a fresh run. Turn the cache off "
            "for timed or compared runs: dspy.LM(..., cache=False), or dspy.configure_cache(enable_disk_cache=False, "
            "enable_memory_cache=False).", totals.lm_calls, metric_calls,
        )


def token_prices(model: str) -> tuple[float, float] | None:
    """Dollars per prompt and completion token from litellm's price map, or None if it has no price.

    The map is read through ``dspy.clients.model_metadata``, the copy of litellm's
    ``model_prices_and_context_window.json`` that DSPy ships and loads the way litellm
    does (``LITELLM_LOCAL_MODEL_COST_MAP`` keeps its meaning): importing litellm itself
    costs seconds, which would land inside the first measured step. Where litellm is imported
    already, its live map answers first: ``litellm.register_model(...)`` prices a model there.
    """
    registered = _litellm_prices(model)
    if registered is not None:
        return registered
    # DSPy refreshes the price map from the network unless told to use its bundled copy; dspy-pxn
    # makes no network call but to the user's LMs, so the bundled copy is the default here.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from dspy.clients.model_metadata import model_info, rate

    provider, _, name = model.partition("/")
    if not name:  # a bare name, as litellm takes OpenAI's models
        provider, name = "openai", model
    try:
        info = model_info(provider, name)
    except Exception:  # noqa: BLE001 - metadata is advisory; unknown is not free
        return None
    prompt, completion = rate(info, "input_cost_per_token"), rate(info, "output_cost_per_token")
    if prompt is None or completion is None:
        return None
    return prompt, completion


def _litellm_prices(model: str) -> tuple[float, float] | None:
    """litellm's own price for ``model`` (a registered one included), if litellm is already imported."""
    litellm = sys.modules.get("litellm")
    table = getattr(litellm, "model_cost", None) if litellm is not None else None
    if not isinstance(table, Mapping):
        return None
    for name in (model, model.partition("/")[2]):
        entry = table.get(name) if name else None
        if isinstance(entry, Mapping):
            prompt, completion = entry.get("input_cost_per_token"), entry.get("output_cost_per_token")
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (prompt, completion)):
                return float(prompt), float(completion)
    return None
