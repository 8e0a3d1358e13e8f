"""Loopback OpenAI-compatible server that answers like ``responder.respond``, slowly on purpose.

A parallel optimiser's speed-up only shows when LM calls take wall-clock time
and the real client stack (dspy.LM -> DSPy's native lm15 client, or litellm -> openai SDK -> HTTP) is in the
loop; an in-process fake would hide both. The server runs in its own process
(`LatencyServer`) so its threads never compete with the optimiser for a GIL,
and it counts calls and peak concurrency so tests can *measure* parallelism.

What it can answer (``responder.respond``): the synthetic rule task ("Apply rule zorp
to 7.") through any DSPy program whose predictors take the question, the reflection
prompts GEPA sends about it (an instruction rewrite, its shortening, a dspy.Flex code
revision, and a sibling merge of several rewrites into one ``merged_instruction``), in
DSPy's ChatAdapter or JSONAdapter format, and gepa's own plain-text reflection prompt (as
``gepa.optimize`` and MLflow's ``GepaPromptOptimizer`` send it), on either landscape (``--landscape depth``,
today's model, or ``breadth``: several definitions per reflection and noisy answers).
Latencies are fixed or drawn around the configured ones (``--latency lognormal|heavy``,
``--latency-seed``); ``/stats`` reports the latencies slept, ``/timeline`` when each call slept. What it cannot answer:
anything else. A GSM8K, LiveBench-Math or HoVer question gets a well-formed but
meaningless reply (answer "0"), so those tasks score 0 against it: it exercises their
wiring, not their learning. ``dspy-pxn optimize sim`` runs the synthetic task on it.

CLI::

    python -m dspy_pxn.testing.latency_server --port 0 --task-latency 0.5 --reflection-latency 2.0 \
        [--latency fixed|lognormal|heavy --latency-seed 0] [--landscape depth|breadth]

prints exactly one line ``READY http://127.0.0.1:<port>/v1`` once listening.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import select
import socket
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from dspy_pxn.testing import responder
from dspy_pxn.testing.landscape import DEPTH, LANDSCAPES, Landscape, resolve_landscape
from dspy_pxn.testing.latency import DISTRIBUTIONS, LatencySampler
from dspy_pxn.testing.responder import respond
from dspy_pxn.testing.wire import CallStats, chat_completion_body, cut_to_max_tokens

__all__ = ["INJECTED_REPLIES", "FaultInjector", "SimServer", "main", "serve"]

HOST = "127.0.0.1"

# The faulty replies the server can send when a FaultInjector asks for one.
INJECTED_REPLIES = ("error_500", "rate_limit_429", "hang", "malformed", "truncated", "empty", "persistent_500")


class FaultInjector(Protocol):
    """Decides which requests get an injected fault (tests' ``tests/faults.py`` has one).

    ``draw`` names the reply for the ``attempt``-th request with messages ``key`` (None:
    answer normally): one of ``INJECTED_REPLIES``. The server knows how to send each; the
    injector, which runs in the server's process, is rebuilt there from ``to_json()``.
    """

    active: bool
    retry_after_s: float  # the Retry-After of a rate_limit_429
    hang_s: float  # how long a hang holds the request

    def draw(self, kind: str, key: str, attempt: int) -> str | None: ...

    def to_json(self) -> str: ...


def _load_injector(path: str, config: str) -> FaultInjector:
    """``module:Class`` and its JSON settings, as the parent process described its injector."""
    module_name, _, class_name = path.partition(":")
    return getattr(importlib.import_module(module_name), class_name).from_json(config)


class SimServer(ThreadingHTTPServer):
    """ThreadingHTTPServer carrying the simulation settings and shared stats."""

    daemon_threads = True
    # The default backlog of 5 drops SYNs under a burst of parallel clients,
    # which turns into ~1 s client retries and fake "latency".
    request_queue_size = 256
    allow_reuse_address = True

    def __init__(
        self,
        port: int = 0,
        *,
        task_latency: float = 0.0,
        reflection_latency: float = 0.0,
        reflection_error_rate: float | None = None,
        faults: FaultInjector | None = None,
        landscape: Landscape = DEPTH,
        latency: str = "fixed",
        seed: int = 0,
    ) -> None:
        super().__init__((HOST, port), _Handler)
        self.task_latency = task_latency
        self.reflection_latency = reflection_latency
        self.reflection_error_rate = reflection_error_rate
        self.landscape = landscape
        self.latencies = LatencySampler(latency, seed)
        self.faults = faults
        self.call_stats = CallStats()
        self._meta_lock = threading.Lock()
        # Every chat request, faulty or not: what a provider's concurrency limit counts.
        self.requests = CallStats()
        self.fault_counts: Counter[str] = Counter()
        self._seen: Counter[str] = Counter()  # attempts per distinct request, for the fault draw
        # Which client stack called (openai SDK via litellm vs dspy's native lm15), for verification.
        self.clients: Counter[str] = Counter()
        self.streamed = 0
        self.tokens: dict[str, dict[str, int]] = {}  # billed tokens and calls by model

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.server_address[1]}/v1"

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return  # a client that timed out and hung up: expected under fault injection
        super().handle_error(request, client_address)

    def stats(self) -> dict[str, Any]:
        snap = self.call_stats.snapshot()
        with self._meta_lock:
            snap["clients"] = dict(self.clients)
            snap["streamed"] = self.streamed
            snap["tokens"] = {model: dict(billed) for model, billed in self.tokens.items()}
            snap["faults"] = {k: self.fault_counts.get(k, 0) for k in INJECTED_REPLIES}
            snap["faults"]["total"] = sum(self.fault_counts.values())
        snap["requests"] = self.requests.snapshot()
        snap["latency"] = self.latencies.summary()  # what the answered calls slept, by kind
        snap["config"] = {
            "task_latency": self.task_latency,
            "reflection_latency": self.reflection_latency,
            "latency": self.latencies.distribution,
            "latency_seed": self.latencies.seed,
            "reflection_error_rate": responder.copy_error_rate(self.reflection_error_rate, self.landscape),
            "landscape": json.loads(self.landscape.to_json()),
            "faults": json.loads(self.faults.to_json()) if self.faults is not None else {},
        }
        return snap

    def reset_stats(self) -> None:
        self.call_stats.reset()
        self.requests.reset()
        self.latencies.reset()
        with self._meta_lock:
            self.clients.clear()
            self.streamed = 0
            self.tokens.clear()
            self.fault_counts.clear()
            self._seen.clear()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: clients pool connections, as against a real provider
    # Headers and body go out as two writes; with Nagle on, a keep-alive connection then waits
    # for the client's delayed ACK, adding ~40 ms to every call (measured: 62 ms -> 10 ms per
    # zero-latency call through dspy.LM and litellm).
    disable_nagle_algorithm = True
    server: SimServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # stdout carries only the READY line; per-request logs would just be noise

    # ---- helpers -------------------------------------------------------- #

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode())

    def _error(self, status: int, message: str, type_: str = "invalid_request_error") -> None:
        self._json(status, {"error": {"message": message, "type": type_, "param": None, "code": None}})

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _path(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/") or "/"

    # ---- routes --------------------------------------------------------- #

    def do_GET(self) -> None:
        path = self._path()
        if path == "/health":
            self._json(200, {"status": "ok"})
        elif path in ("/v1/models", "/models"):
            now = int(time.time())
            self._json(200, {"object": "list", "data": [
                {"id": m, "object": "model", "created": now, "owned_by": "dspy_pxn"}
                for m in ("sim-task", "sim-reflection")
            ]})
        elif path == "/stats":
            self._json(200, self.server.stats())
        elif path == "/timeline":
            self._json(200, {"calls": self.server.call_stats.timeline()})
        else:
            self._error(404, f"no route for GET {path}")

    def do_POST(self) -> None:
        path = self._path()
        body = self._read_body()  # always drain, or the next keep-alive request is corrupted
        if path == "/stats/reset":
            self.server.reset_stats()
            self._json(200, {"status": "reset"})
        elif path in ("/v1/chat/completions", "/chat/completions"):
            self._chat(body)
        else:
            self._error(404, f"no route for POST {path}")

    def _chat(self, raw: bytes) -> None:
        try:
            payload = json.loads(raw or b"{}")
            messages = payload["messages"]
            if not isinstance(messages, list):
                raise TypeError("messages must be a list")
        except (ValueError, KeyError, TypeError) as exc:
            self._error(400, f"bad request body: {exc}")
            return
        srv = self.server
        with srv._meta_lock:
            srv.clients[_client_id(self.headers)] += 1
        kind, content = respond(messages, reflection_error_rate=srv.reflection_error_rate, landscape=srv.landscape)
        with srv.requests.track(kind):
            fault = None
            if srv.faults is not None and srv.faults.active:
                key = json.dumps(messages, sort_keys=True)
                with srv._meta_lock:
                    attempt = srv._seen[key]
                    srv._seen[key] += 1
                fault = srv.faults.draw(kind, key, attempt)
                if fault is not None:
                    with srv._meta_lock:
                        srv.fault_counts[fault] += 1
            if fault in ("error_500", "persistent_500"):
                self._error(500, "injected server error", "server_error")
                return
            if fault == "rate_limit_429":
                body = json.dumps({"error": {"message": "injected rate limit", "type": "rate_limit_error",
                                             "param": None, "code": "rate_limit_exceeded"}}).encode()
                self.send_response(429)
                self.send_header("Content-Type", "application/json")
                self.send_header("Retry-After", f"{srv.faults.retry_after_s:g}")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if fault == "hang":
                self._hang(srv.faults.hang_s)
                return
            with srv.call_stats.track(kind):
                delay = srv.latencies.draw(kind, srv.reflection_latency if kind == "reflection" else srv.task_latency)
                if delay > 0:
                    time.sleep(delay)
        finish_reason = "stop"
        if fault == "malformed":
            content = "Sure! Here is my answer: " + " ".join(content.replace("[[ ##", "").replace("## ]]", "").split())
        elif fault == "truncated":
            content, finish_reason = content[: max(1, len(content) // 3)], "length"
        elif fault == "empty":
            content = ""
        cut = cut_to_max_tokens(content, payload.get("max_completion_tokens") or payload.get("max_tokens"))
        if cut is not None:
            content, finish_reason = cut, "length"
        model = str(payload.get("model") or "sim")
        completion = chat_completion_body(messages, content, model)
        completion["choices"][0]["finish_reason"] = finish_reason
        with srv._meta_lock:  # what a provider bills: the tokens of every answered call, by model
            billed = srv.tokens.setdefault(model, {"prompt": 0, "completion": 0, "calls": 0})
            billed["prompt"] += completion["usage"]["prompt_tokens"]
            billed["completion"] += completion["usage"]["completion_tokens"]
            billed["calls"] += 1
        if payload.get("stream"):
            with srv._meta_lock:
                srv.streamed += 1
            include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
            self._send(200, _sse(completion, include_usage), "text/event-stream")
        else:
            self._json(200, completion)


    def _hang(self, seconds: float) -> None:
        """Hold the request for ``seconds``, or until the client gives up and closes the socket."""
        self.close_connection = True
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([self.connection], [], [], min(remaining, 0.05))
            if readable:
                try:
                    if not self.connection.recv(1, socket.MSG_PEEK):
                        return  # client closed: it timed out
                except OSError:
                    return
        try:
            self._error(504, "injected hang")
        except OSError:
            pass


def _client_id(headers: Any) -> str:
    """"openai-python/<ver> (<UA>)" when the openai SDK (litellm's transport) sent it, else the User-Agent."""
    ua = headers.get("User-Agent", "") or "unknown"
    sdk = headers.get("X-Stainless-Package-Version")
    return f"openai-python/{sdk} ({ua})" if sdk else ua


def _sse(completion: dict[str, Any], include_usage: bool) -> bytes:
    """Minimal SSE rendering of a finished completion (role+content chunk, stop chunk, [usage], [DONE]).

    Sent with a Content-Length: the whole reply is known, so no chunked encoding is needed.
    """
    base = {k: completion[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    content = completion["choices"][0]["message"]["content"]
    chunks = [
        base | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": content}, "finish_reason": None}]},
        base | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    if include_usage:
        chunks.append(base | {"choices": [], "usage": completion["usage"]})
    out = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return out.encode()


def serve(
    port: int = 0,
    *,
    task_latency: float = 0.0,
    reflection_latency: float = 0.0,
    reflection_error_rate: float | None = None,
    faults: FaultInjector | None = None,
    landscape: Landscape = DEPTH,
    latency: str = "fixed",
    seed: int = 0,
) -> None:
    """Run until killed, announcing the URL on stdout only once the socket is listening."""
    server = SimServer(
        port,
        task_latency=task_latency,
        reflection_latency=reflection_latency,
        reflection_error_rate=reflection_error_rate,
        faults=faults,
        landscape=landscape,
        latency=latency,
        seed=seed,
    )
    print(f"READY {server.base_url}", flush=True)
    threading.Thread(target=_stop_once_orphaned, args=(server, os.getppid()), daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _stop_once_orphaned(server: SimServer, parent: int) -> None:
    """Stop serving once the process that started the server is gone. A parent killed outright (SIGTERM, SIGKILL)
    never runs the ``finally`` that closes its server, which would otherwise hold its port and threads until someone
    kills it; the orphan is handed to another parent, so its parent id changes."""
    while os.getppid() == parent:
        time.sleep(0.5)
    server.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--task-latency", type=float, default=0.0, help="seconds per task call (the median)")
    parser.add_argument("--reflection-latency", type=float, default=0.0,
                        help="seconds per reflection call (the median)")
    parser.add_argument("--latency", choices=DISTRIBUTIONS, default="fixed",
                        help="fixed: exactly those seconds; lognormal: p99/p50 = 4; heavy: lognormal plus 3%% "
                             "stragglers at 5-20x")
    parser.add_argument("--latency-seed", type=int, default=0, help="seed of the latency draws")
    parser.add_argument("--landscape", type=resolve_landscape, default=DEPTH,
                        help=f"the simulated model's character: {'|'.join(LANDSCAPES)} (or a Landscape's JSON)")
    parser.add_argument(
        "--reflection-error-rate", type=float, default=None,
        help=f"probability a reflection garbles its new definition (default {responder.DEFAULT_REFLECTION_ERROR_RATE})",
    )
    parser.add_argument("--fault-injector", default=None, help="module:Class of a FaultInjector (with --faults)")
    parser.add_argument("--faults", default=None, help="the injector's settings as JSON (its to_json())")
    args = parser.parse_args(argv)
    serve(
        args.port,
        task_latency=args.task_latency,
        reflection_latency=args.reflection_latency,
        reflection_error_rate=args.reflection_error_rate,
        faults=_load_injector(args.fault_injector, args.faults or "{}") if args.fault_injector else None,
        landscape=args.landscape,
        latency=args.latency,
        seed=args.latency_seed,
    )

if __name__ == "__main__":
    main()
