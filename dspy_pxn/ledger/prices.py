"""What an LM call costs: prices per token, and the most one call can cost before it is made.

Prices come from litellm's own map where litellm is imported already (so ``litellm.register_model(...)`` prices a
model litellm does not know), else from the copy DSPy ships (``dspy.clients.model_metadata``). Nothing here imports
litellm: on DSPy's native engine a run never loads it.

The worst case of a call (what a dollar cap reserves before it, settled at the billed cost when it ends) is its
prompt's tokens, bounded without a tokenizer (``PromptTokenBound``), plus its ``max_tokens`` of output.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from dspy_pxn.checks import ArgumentError

# Providers that run on the user's own machine: without a price in the map they cost nothing.
LOCAL_PROVIDERS = frozenset({"ollama", "ollama_chat", "lm_studio", "llamafile"})
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0"})
# Tokens a chat format adds around each message (role markers, separators), and to prime the reply.
MESSAGE_OVERHEAD_TOKENS = 8


@dataclass(frozen=True)
class Price:
    """Dollars per prompt token and per completion token."""

    prompt: float
    completion: float

    def of(self, prompt_tokens: float, completion_tokens: float) -> float:
        return prompt_tokens * self.prompt + completion_tokens * self.completion


FREE = Price(0.0, 0.0)


def use_bundled_price_maps() -> None:
    """No network but the user's LMs: DSPy (on its first priced call) and litellm (on import) fetch their price map
    from GitHub unless ``LITELLM_LOCAL_MODEL_COST_MAP`` says to use their copy; said before a run's first LM call."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def token_prices(model: str) -> Price | None:
    """The model's dollars per token; None when no map prices it (unknown is not free)."""
    entry = _entry(model)
    prompt, completion = entry.get("input_cost_per_token"), entry.get("output_cost_per_token")
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in (prompt, completion)):
        return Price(float(prompt), float(completion))
    return None


def price_of(lm: Any) -> Price | None:
    """The LM's price; free for a model served on this machine (a local provider, or an ``api_base`` on the
    loopback interface) that no map prices; None when unknown."""
    model = str(getattr(lm, "model", ""))
    if (price := token_prices(model)) is not None:
        return price
    api_base = (getattr(lm, "kwargs", None) or {}).get("api_base") or getattr(lm, "api_base", None)
    host = urlparse(api_base).hostname if isinstance(api_base, str) else None
    local = model.partition("/")[0] in LOCAL_PROVIDERS or host in LOOPBACK_HOSTS or (host or "").startswith("127.")
    return FREE if local else None


def max_output_tokens(lm: Any, call_kwargs: Mapping[str, Any] | None = None) -> int | None:
    """The most tokens one call may answer with: the call's or the LM's ``max_tokens``, else the model's limit."""
    for kwargs in (call_kwargs or {}, getattr(lm, "kwargs", None) or {}):
        for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            value = kwargs.get(key)
            if isinstance(value, int) and value > 0:
                return value
    value = _entry(str(getattr(lm, "model", ""))).get("max_output_tokens")
    return value if isinstance(value, int) and value > 0 else None


def _entry(model: str) -> Mapping[str, Any]:
    """The model's entry in litellm's map where litellm is imported and knows it (a registered model), else
    in the copy DSPy ships; empty when neither knows it."""
    table = getattr(sys.modules.get("litellm"), "model_cost", None)
    for name in (model, model.partition("/")[2]) if isinstance(table, Mapping) else ():
        if name and isinstance(table.get(name), Mapping):
            return table[name]
    use_bundled_price_maps()
    from dspy.clients.model_metadata import model_info

    provider, _, name = model.partition("/")
    try:
        return model_info(provider, name) if name else model_info("openai", model)  # a bare name: OpenAI's
    except Exception:  # noqa: BLE001 - metadata is advisory; unknown is not free
        return {}


def prompt_size(inputs: Mapping[str, Any]) -> int:
    """An LM call's prompt in UTF-8 bytes, its chat format's overhead included (``inputs``: DSPy's
    ``on_lm_start`` arguments)."""
    messages = inputs.get("messages") or [{"content": inputs.get("prompt") or ""}]
    if not isinstance(messages, list):  # a dspy.lm15.Request: its text is in its repr
        return len(str(messages).encode("utf-8", "replace")) + MESSAGE_OVERHEAD_TOKENS
    size = sum(len(str(message.get("content", "") if isinstance(message, Mapping) else message).encode(
        "utf-8", "replace")) for message in messages)
    return size + MESSAGE_OVERHEAD_TOKENS * (len(messages) + 1)


class PromptTokenBound:
    """The most tokens a prompt of a given size may be billed as, per model, learned from the provider's bills.

    Before the provider billed a call of the model: one token per byte (a byte-level BPE tokenizer never makes more).
    Then: the most tokens per byte billed so far, ``MARGIN`` more, never above one per byte. A run's prompts come from
    one program's templates, so their ratio varies little; the gate that reserved a call billed above it warns."""

    MARGIN = 1.25

    def __init__(self, tokens_per_byte: Mapping[str, float] | None = None):
        self._lock = threading.Lock()
        self._ratio: dict[str, float] = dict(tokens_per_byte or {})

    def tokens(self, model: str, size: int) -> int:
        ratio = self._ratio.get(model)
        return size if ratio is None else math.ceil(size * min(1.0, ratio * self.MARGIN))

    def learn(self, model: str, size: int, billed_prompt_tokens: int) -> None:
        if size > 0 and billed_prompt_tokens > 0:
            self.merge({model: billed_prompt_tokens / size})

    def merge(self, tokens_per_byte: Mapping[str, float]) -> None:
        """Take in what was billed (or what another gate learned: a Ray actor's, of its calls for this run)."""
        with self._lock:
            for model, ratio in tokens_per_byte.items():
                self._ratio[model] = max(self._ratio.get(model, 0.0), ratio)

    def tokens_per_byte(self) -> dict[str, float]:
        """What was learned, for a gate in another process (a Ray actor's) to start from."""
        with self._lock:
            return dict(self._ratio)


def billed_tokens(usage: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """A usage entry's prompt and completion tokens (OpenAI's or lm15's names); None where it has none."""
    return _tokens(usage, "prompt_tokens", "input_tokens"), _tokens(usage, "completion_tokens", "output_tokens")


def unpriced_error(model: str, argument: str) -> ArgumentError:
    return ArgumentError(
        f"{argument} needs every LM's price, and neither DSPy's nor litellm's price map has one for {model!r}. "
        f"Register it before compiling: litellm.register_model({{{model!r}: {{'input_cost_per_token': 1.5e-07, "
        f"'output_cost_per_token': 6e-07, 'litellm_provider': {model.partition('/')[0] or 'openai'!r}, "
        "'mode': 'chat'}}) (the cost_per_token fields in dollars), or serve it locally (an api_base on "
        "localhost is priced at 0)."
    )


def unbounded_error(model: str) -> ArgumentError:
    return ArgumentError(f"A dollar cap needs a bound on each call's output, and {model!r} has none: pass "
                         f"dspy.LM({model!r}, max_tokens=...) (the worst case of a call is its prompt plus max_tokens).")


def _tokens(usage: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        value = usage.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(value)
    return None

