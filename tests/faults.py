"""A fault injector for the latency server: deterministic, seeded faults for the reliability tests.

It runs inside the server's process (``LatencyServer(faults=Faults(...))`` rebuilds it there
from ``to_json``); the server knows how to send each fault it names.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field, fields
from typing import Any

from dspy_pxn.testing.latency_server import INJECTED_REPLIES


@dataclass(frozen=True)
class Faults:
    """Deterministic-by-seed fault injection, one draw per HTTP request.

    Each rate is the probability that a request gets that fault (they are disjoint:
    their sum is the faulty fraction). The draw hashes ``seed``, the request's
    messages and how many times this server has seen those exact messages, so the
    same run against the same server gets the same faults whatever the thread
    interleaving, and a retry of a request gets a fresh, independent draw:

    - ``error_500``: HTTP 500 at once (retryable; no Retry-After).
    - ``rate_limit_429``: HTTP 429 with ``Retry-After: retry_after_s`` (retryable).
    - ``hang``: the reply is held for ``hang_s`` (set it past the client timeout).
    - ``malformed``: a 200 whose content has none of DSPy's ``[[ ## field ## ]]`` markers.
    - ``truncated``: a 200 cut mid-way with ``finish_reason="length"``.
    - ``empty``: a 200 with empty content.
    - ``persistent_500``: a fraction of *distinct requests* that get 500 on every
      attempt, so a client's retries run out and the call finally fails.

    ``kinds`` limits injection to task and/or reflection calls. With ``cover_each_kind`` the first
    new requests get each fault kind with a rate above zero once, in arrival order (the one given the
    persistent 500 keeps it on every attempt), before the draws above: a test that asserts it met every
    kind then does not depend on which requests a run happens to send.
    """

    error_500: float = 0.0
    rate_limit_429: float = 0.0
    hang: float = 0.0
    malformed: float = 0.0
    truncated: float = 0.0
    empty: float = 0.0
    persistent_500: float = 0.0
    retry_after_s: float = 0.05
    hang_s: float = 30.0
    seed: int = 0
    kinds: tuple[str, ...] = ("task", "reflection")
    cover_each_kind: bool = False
    _covered: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)  # fault -> key
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rates = [getattr(self, k) for k in INJECTED_REPLIES]
        if any(not 0.0 <= r <= 1.0 for r in rates) or sum(rates[:-1]) > 1.0:
            raise ValueError(f"fault rates must be in [0, 1] and the per-attempt ones sum to <= 1, got {self}")
        object.__setattr__(self, "kinds", tuple(self.kinds))

    @classmethod
    def uniform(cls, fraction: float, **kw: Any) -> Faults:
        """``fraction`` of requests faulty, split evenly over the six per-attempt fault kinds."""
        share = fraction / 6
        return cls(error_500=share, rate_limit_429=share, hang=share, malformed=share, truncated=share,
                   empty=share, **kw)

    def to_json(self) -> str:
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self) if f.init})

    @classmethod
    def from_json(cls, text: str) -> Faults:
        data = json.loads(text)
        unknown = set(data) - {f.name for f in fields(cls) if f.init}
        if unknown:
            raise ValueError(f"unknown fault settings {sorted(unknown)}")
        return cls(**data)

    @property
    def active(self) -> bool:
        return any(getattr(self, k) > 0 for k in INJECTED_REPLIES)

    def draw(self, kind: str, key: str, attempt: int) -> str | None:
        """The fault for the ``attempt``-th request with messages ``key`` (None: answer normally)."""
        if kind not in self.kinds or not self.active:
            return None
        if self.cover_each_kind and (covered := self._cover(key)) is not None:
            return covered
        if self.persistent_500 and _unit(f"{self.seed}|persistent|{key}") < self.persistent_500:
            return "persistent_500"
        u = _unit(f"{self.seed}|{attempt}|{key}")
        for name in INJECTED_REPLIES[:-1]:
            rate = getattr(self, name)
            if u < rate:
                return name
            u -= rate
        return None

    def _cover(self, key: str) -> str | None:
        """The fault a new request gets while some kind has not been sent yet (None once all have)."""
        with self._lock:
            if self._covered.get("persistent_500") == key:
                return "persistent_500"
            if key in self._covered.values():  # a retry of a covered request is drawn like any other
                return None
            for name in INJECTED_REPLIES:
                if getattr(self, name) > 0 and name not in self._covered:
                    self._covered[name] = key
                    return name
        return None


def _unit(text: str) -> float:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8", "replace")).digest()[:8], "big") / 2.0**64
