"""LM tokens and dollars spent by one run, read where DSPy already reports them.

The paper compares optimizer settings by what they cost, so each step records its
tokens and dollars. DSPy hands every billed (non-cached) LM call's usage to
``settings.usage_tracker``, a context setting; the worker pool copies the caller's
context into every task, so a meter installed around ``compile`` sees exactly this
run's calls, from every thread, and no other run's. Prices come from litellm's
price map; a model it does not know is counted as unpriced, never as free.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import dspy
from dspy.utils.usage_tracker import UsageTracker


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


def _tokens(usage: Mapping[str, Any], *names: str) -> int:
    for name in names:
        value = usage.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value)
    return 0


class UsageMeter(UsageTracker):
    """A DSPy usage tracker that also keeps thread-safe running totals and dollars."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._totals = UsageTotals()
        self._prices: dict[str, tuple[float, float] | None] = {}

    def add_usage(self, lm: str, usage_entry: dict[str, Any]) -> None:
        with self._lock:
            super().add_usage(lm, usage_entry)
            if not usage_entry:
                return
            prompt = _tokens(usage_entry, "prompt_tokens", "input_tokens")
            completion = _tokens(usage_entry, "completion_tokens", "output_tokens")
            price = self._price(lm)
            total = self._totals
            cost = total.cost_usd
            if price is not None:
                cost = (cost or 0.0) + prompt * price[0] + completion * price[1]
            self._totals = UsageTotals(
                lm_calls=total.lm_calls + 1,
                prompt_tokens=total.prompt_tokens + prompt,
                completion_tokens=total.completion_tokens + completion,
                cost_usd=cost,
                unpriced_calls=total.unpriced_calls + (price is None),
            )

    def totals(self) -> UsageTotals:
        with self._lock:
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


def token_prices(model: str) -> tuple[float, float] | None:
    """Dollars per prompt and completion token from litellm's price map, or None if it has no price.

    The map is read through ``dspy.clients.model_metadata``, the copy of litellm's
    ``model_prices_and_context_window.json`` that DSPy ships and loads the way litellm
    does (``LITELLM_LOCAL_MODEL_COST_MAP`` keeps its meaning): importing litellm itself
    costs seconds, which would land inside the first measured step.
    """
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
