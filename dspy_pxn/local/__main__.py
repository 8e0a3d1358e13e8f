"""``python -m dspy_pxn.local serve|weights``: the server's child process, and weights on demand."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from pathlib import Path

from dspy_pxn.local.models import DEFAULT_MODEL, MODELS, LocalLMError, ensure_weights
from dspy_pxn.local.server import record_path


def serve(args: argparse.Namespace) -> int:
    """Run llama-server in this process until SIGTERM/SIGINT (or the watched parent dies)."""
    import xllamacpp as xlc

    weights = Path(args.weights) if args.weights else ensure_weights(args.model)
    params = xlc.CommonParams()
    params.model.path = str(weights)
    params.model_alias = {args.model}
    params.hostnames = ["127.0.0.1"]
    params.port = args.port or 0
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx_per_slot * args.parallel  # llama-server splits n_ctx across slots
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.cache_prompt = False  # determinism: see notes; requests also send cache_prompt=false
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = xlc.Server(params)
    base_url = server.listening_address.rstrip("/")
    record = record_path(args.model)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"base_url": base_url, "pid": os.getpid(), "weights": str(weights)}))
    if args.ready_file:
        Path(args.ready_file).write_text(base_url)
    print(f"dspy-pxn local LM {args.model} serving at {base_url}/v1", flush=True)
    try:
        while not stop.wait(0.5):
            if args.watch_parent and os.getppid() != args.watch_parent:
                break  # parent gone: never outlive the process that started us
    finally:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(record.read_text()).get("pid") == os.getpid():
                record.unlink()
        del server
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m dspy_pxn.local serve [--model NAME]`` (a server other runs reuse)."""
    parser = argparse.ArgumentParser(prog="python -m dspy_pxn.local")
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="serve a local model on loopback until Ctrl-C")
    s.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS))
    s.add_argument("--weights", default="")
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--parallel", type=int, default=2)
    s.add_argument("--ctx-per-slot", type=int, default=4096)
    s.add_argument("--threads", type=int, default=min(os.cpu_count() or 1, 4))
    s.add_argument("--ready-file", default="")
    s.add_argument("--watch-parent", type=int, default=0)
    w = sub.add_parser("weights", help="assemble and verify a model's weights; print the path")
    w.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS))
    args = parser.parse_args(argv)
    try:
        if args.cmd == "weights":
            print(ensure_weights(args.model))
            return 0
        return serve(args)
    except LocalLMError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
