"""What the simulated LM sends back and how its calls are counted, shared by the HTTP server and SimulatedLM."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any


def message_text(content: Any) -> str:
    """Message content as text; OpenAI allows a list of typed parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                parts.append(str(part.get("text", "")))
            else:
                parts.append(str(part))
        return "".join(parts)
    return str(content)


def estimate_tokens(text: str) -> int:
    return len(text) // 4


def cut_to_max_tokens(content: str, limit: Any) -> str | None:
    """The reply cut to ``limit`` tokens as a provider cuts it off (finish reason "length"); None if it fits."""
    if isinstance(limit, int) and limit > 0 and estimate_tokens(content) > limit:
        return content[: limit * 4]
    return None


def chat_completion_body(messages: Sequence[Mapping[str, Any]], content: str, model: str) -> dict[str, Any]:
    """An OpenAI chat.completion JSON object; shared by the HTTP server and SimulatedLM.forward."""
    prompt_tokens = sum(estimate_tokens(message_text(m.get("content"))) for m in messages)
    completion_tokens = estimate_tokens(content)
    return {
        "id": f"chatcmpl-sim-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop", "logprobs": None}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


# --------------------------------------------------------------------------- #
# Call accounting
# --------------------------------------------------------------------------- #


class CallStats:
    """Thread-safe call counts and peak concurrency by kind.

    Peak in-flight is the number a parallel optimiser is judged by, so it is
    measured at the point the simulated latency is spent, not inferred.
    """

    KINDS = ("task", "reflection")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight: dict[str, int] = {k: 0 for k in self.KINDS}
        self.reset()

    def __getstate__(self) -> dict:
        """Picklable (a program logged as an MLflow model carries its LM): the copy gets its own lock, and
        starts its own timeline (a logged model does not carry the calls of the run that logged it)."""
        return {key: value for key, value in self.__dict__.items() if key not in ("_lock", "_timeline")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._timeline = []

    def reset(self) -> None:
        """Zero counters; peaks restart from what is in flight now, so they stay truthful."""
        with self._lock:
            self._calls = {k: 0 for k in self.KINDS}
            self._max = dict(self._in_flight)
            self._max_total = sum(self._in_flight.values())
            self._tokens = {"prompt": 0, "completion": 0}
            self._timeline: list[tuple[str, float, float]] = []

    @contextmanager
    def track(self, kind: str) -> Iterator[None]:
        with self._lock:
            self._calls[kind] = self._calls.get(kind, 0) + 1
            self._in_flight[kind] = self._in_flight.get(kind, 0) + 1
            self._max[kind] = max(self._max.get(kind, 0), self._in_flight[kind])
            self._max_total = max(self._max_total, sum(self._in_flight.values()))
        started = time.time()
        try:
            yield
        finally:
            with self._lock:
                self._in_flight[kind] -= 1
                self._timeline.append((kind, started, time.time()))

    def timeline(self) -> list[tuple[str, float, float]]:
        """(kind, start, end) of every tracked call since the last reset, by its start; epoch seconds
        (``time.time``), so a client in another process can place them among its own events."""
        with self._lock:
            return sorted(self._timeline, key=lambda call: call[1])

    def bill(self, prompt_tokens: int, completion_tokens: int) -> None:
        """Tokens of an answered call, as a provider bills them."""
        with self._lock:
            self._tokens["prompt"] += prompt_tokens
            self._tokens["completion"] += completion_tokens

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            in_flight = dict(self._in_flight)
            return {
                "calls": {**self._calls, "total": sum(self._calls.values())},
                "in_flight": {**in_flight, "total": sum(in_flight.values())},
                "max_in_flight": {**self._max, "total": self._max_total},
                "tokens": dict(self._tokens),
            }
