"""SimulatedLM: the simulated model in-process, as a ``dspy.BaseLM`` (with optional latencies)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import dspy

from dspy_pxn.testing.landscape import Landscape, resolve_landscape
from dspy_pxn.testing.latency import LatencySampler
from dspy_pxn.testing.responder import respond
from dspy_pxn.testing.wire import CallStats, chat_completion_body, cut_to_max_tokens, estimate_tokens

# --------------------------------------------------------------------------- #
# In-process LM
# --------------------------------------------------------------------------- #


def _request_messages(request: Any) -> list[dict[str, str]]:
    """Flatten a dspy.lm15.Request back to role/content dicts, which is what `respond` reads."""
    messages = []
    if request.system is not None:
        system = request.system if isinstance(request.system, str) else "".join(
            getattr(p, "text", "") or "" for p in request.system
        )
        messages.append({"role": "system", "content": system})
    messages.extend({"role": m.role, "content": m.text or ""} for m in request.messages)
    return messages


class _SimEngine:
    """DSPy 3.4 canonical engine (complete(Request) -> Response); avoids the deprecated forward() path."""

    def __init__(self, owner: "SimulatedLM") -> None:
        self.owner = owner

    def _run(self, request: Any) -> tuple[str, str, list[dict[str, str]]]:
        messages = _request_messages(request)
        kind, content = self.owner.respond(messages)
        return kind, content, messages

    def _response(self, content: str, messages: list[dict[str, str]]) -> Any:
        from dspy.lm15 import Message, Response, TextPart, Usage

        content = cut_to_max_tokens(content, self.owner.kwargs.get("max_tokens")) or content
        prompt_tokens = sum(estimate_tokens(m["content"]) for m in messages)
        completion_tokens = estimate_tokens(content)
        self.owner.call_stats.bill(prompt_tokens, completion_tokens)
        return Response(
            id=f"sim-{uuid.uuid4().hex[:16]}",
            model=self.owner.model,
            message=Message.assistant([TextPart(content)]),
            finish_reason="stop",
            usage=Usage(input_tokens=prompt_tokens, output_tokens=completion_tokens,
                        total_tokens=prompt_tokens + completion_tokens),
        )

    def _overridden_forward(self) -> bool:
        return type(self.owner).forward is not SimulatedLM.forward

    def _via_forward(self, request: Any) -> Any:
        """Honour a subclass's forward() override (e.g. a test spy), as a legacy BaseLM would."""
        from dspy.clients.lm15_boundary import response_value

        return response_value(self.owner.forward(messages=_request_messages(request)), "chat", request)

    def complete(self, request: Any) -> Any:
        if self._overridden_forward():
            return self._via_forward(request)
        kind, content, messages = self._run(request)
        with self.owner.call_stats.track(kind):
            delay = self.owner.latency(kind)
            if delay > 0:
                time.sleep(delay)
        return self._response(content, messages)

    def stream(self, request: Any) -> Any:
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass


class _AsyncSimEngine:
    def __init__(self, sync: _SimEngine) -> None:
        self.sync = sync

    async def complete(self, request: Any) -> Any:
        if self.sync._overridden_forward():
            return await asyncio.to_thread(self.sync._via_forward, request)
        kind, content, messages = self.sync._run(request)
        with self.sync.owner.call_stats.track(kind):
            delay = self.sync.owner.latency(kind)
            if delay > 0:
                await asyncio.sleep(delay)
        return self.sync._response(content, messages)

    async def stream(self, request: Any) -> Any:
        from dspy.lm15 import response_to_events

        for event in response_to_events(await self.complete(request)):
            yield event

    async def aclose(self) -> None:
        pass


class SimulatedLM(dspy.BaseLM):
    """In-process twin of the latency server: same `respond` logic, optional sleeps, call stats.

    ``landscape`` is the model's character (``DEPTH``, ``BREADTH``, a preset's name, or a
    ``Landscape``); ``latency`` how call times vary around ``task_latency`` and
    ``reflection_latency`` (their medians): "fixed", "lognormal" or "heavy", drawn from
    ``seed``. Caching is off: a cached reply would hide calls from the stats and skip
    the latency that benchmarks measure. Copies share `call_stats` and the latency draws.
    """

    def __init__(
        self,
        model: str = "sim",
        *,
        task_latency: float = 0.0,
        reflection_latency: float = 0.0,
        reflection_error_rate: float | None = None,
        call_stats: CallStats | None = None,
        landscape: Landscape | str | None = None,
        latency: str = "fixed",
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("temperature", 0.0)
        kwargs.setdefault("max_tokens", 1000)
        super().__init__(model=model, model_type="chat", cache=False, **kwargs)
        self.task_latency = task_latency
        self.reflection_latency = reflection_latency
        self.reflection_error_rate = reflection_error_rate
        self.landscape = resolve_landscape(landscape)
        self.latencies = LatencySampler(latency, seed)
        self.call_stats = call_stats or CallStats()
        self._bind_engine()

    def _bind_engine(self) -> None:
        # DSPy treats an LM with `_engine_spec` as managed and routes calls to the engine.
        self._engine_spec = _SimEngine(self)
        self._async_engine_spec = _AsyncSimEngine(self._engine_spec)

    def respond(self, messages: list[dict[str, Any]]) -> tuple[str, str]:
        """This model's (kind, reply) to a prompt: `respond` with its landscape and error rate."""
        return respond(messages, reflection_error_rate=self.reflection_error_rate, landscape=self.landscape)

    def latency(self, kind: str) -> float:
        """The next ``kind`` call's latency, drawn around the configured one and recorded as slept."""
        median = self.reflection_latency if kind == "reflection" else self.task_latency
        return self.latencies.draw(kind, median)

    def stats(self) -> dict[str, Any]:
        """Calls and peak concurrency by kind (``CallStats``), and the latencies slept."""
        return {**self.call_stats.snapshot(), "latency": self.latencies.summary()}

    def reset_stats(self) -> None:
        self.call_stats.reset()
        self.latencies.reset()

    def forward(self, prompt: str | None = None, messages: list[dict] | None = None, **kwargs: Any) -> dict[str, Any]:
        """OpenAI-shaped response dict, for callers that use the legacy forward() contract directly."""
        messages = messages or [{"role": "user", "content": prompt or ""}]
        kind, content = self.respond(messages)
        with self.call_stats.track(kind):
            delay = self.latency(kind)
            if delay > 0:
                time.sleep(delay)
        return chat_completion_body(messages, content, self.model)

    def copy(self, **kwargs: Any) -> "SimulatedLM":
        copied = super().copy(**kwargs)
        copied._bind_engine()
        return copied

    def __deepcopy__(self, memo: dict) -> "SimulatedLM":
        # Locks cannot be deep-copied; a copy sharing stats is what callers want anyway.
        return self.copy()
