"""llama.cpp's OpenAI-compatible server (via xllamacpp) for an embedded model, on loopback.

Why this shape:
- The server runs in a child process (``python -m dspy_pxn.local serve ...``), not in-process:
  llama.cpp's threads then never compete with the optimizer for the GIL, its log goes to a file
  we can quote when start-up fails, and stopping it is a signal, not a C++ destructor racing
  interpreter shutdown. A child started by ``LocalLMServer`` watches its parent's pid and exits
  within 0.5 s of the parent's death, so no orphan survives a crash (not PR_SET_PDEATHSIG: it
  fires when the forking *thread* exits, which would kill a server started from a worker thread).
- A server another process started for the same model is found and reused.
- DSPy talks to it through ``dspy.LM("openai/<name>", api_base=...)`` on DSPy's default engine - exactly the
  path an API model takes.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata as md
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from dspy_pxn.local.grammar import marker_lm_class, plain_lm_class
from dspy_pxn.local.models import INSTALL_HINT, LocalLMError, cache_dir, ensure_weights, get_model


def _get_json(url: str, timeout: float = 2.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def probe(base_url: str, alias: str, timeout: float = 2.0) -> bool:
    """True when ``base_url`` (``http://127.0.0.1:PORT``) is healthy and serves model ``alias``."""
    try:
        if _get_json(f"{base_url}/health", timeout).get("status") != "ok":
            return False
        ids = {m.get("id") for m in _get_json(f"{base_url}/v1/models", timeout).get("data", [])}
        return alias in ids
    except (OSError, ValueError, urllib.error.URLError):
        return False


def record_path(alias: str) -> Path:
    return cache_dir() / "servers" / f"{alias}.json"


def _find_running(alias: str) -> str | None:
    """Base URL of an already-running server for ``alias`` (from its record), if it answers."""
    rec_path = record_path(alias)
    try:
        rec = json.loads(rec_path.read_text())
    except (OSError, ValueError):
        return None
    url = rec.get("base_url", "")
    return url if url.startswith("http://127.0.0.1:") and probe(url, alias) else None


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no server log)"


class LocalLMServer:
    """llama.cpp's OpenAI-compatible server for one local model, on loopback.

    ``start()`` reuses a running server that serves the same model (found via its record in the
    cache dir and a health + /v1/models check) or starts one in a child process on a free port.
    Only a server this object started is stopped by ``stop()`` / the context manager / atexit.

    Args:
        model: catalogue name (see ``MODELS``); None = the default task model.
        parallel: llama-server slots (``n_parallel``). 2 slots give more tokens/s in aggregate
            on 2 cores than 1; each slot gets ``ctx_per_slot`` tokens of context.
        threads: llama.cpp compute threads (default: all cores, at most 2 here).
        reuse: look for a running server for this model first.
        startup_timeout: seconds to wait for /health before failing with the server log's tail.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        parallel: int = 2,
        ctx_per_slot: int = 4096,
        threads: int | None = None,
        reuse: bool = True,
        startup_timeout: float = 120.0,
    ) -> None:
        if not isinstance(parallel, int) or parallel < 1:
            raise LocalLMError(f"parallel={parallel!r}: pass a positive int (llama-server slots)")
        if not isinstance(ctx_per_slot, int) or ctx_per_slot < 256:
            raise LocalLMError(f"ctx_per_slot={ctx_per_slot!r}: pass an int >= 256 (tokens of context per slot)")
        self.model = get_model(model)
        self.parallel = parallel
        self.ctx_per_slot = ctx_per_slot
        self.threads = threads or min(os.cpu_count() or 1, 4)
        self.reuse = reuse
        self.startup_timeout = startup_timeout
        self.base_url: str | None = None
        self.reused = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """The model id the server answers to (``/v1/models``) and the LM's ``openai/<name>``."""
        return self.model.name

    @property
    def api_base(self) -> str:
        """The OpenAI-compatible base URL, ``http://127.0.0.1:PORT/v1``."""
        if self.base_url is None:
            raise LocalLMError(
                f"local server for {self.name} is not running: call .start() or use it as a context manager"
            )
        return f"{self.base_url}/v1"

    @property
    def pid(self) -> int | None:
        """The child's pid when this object started the server (None when reused or stopped)."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> LocalLMServer:
        """Reuse or start the server and wait until it answers; idempotent."""
        with self._lock:
            if self.base_url is not None:
                return self
            if self.reuse and (url := _find_running(self.name)):
                self.base_url, self.reused = url, True
                return self
            self._spawn()
            return self

    def _spawn(self) -> None:
        weights = ensure_weights(self.name)
        _require_xllamacpp()
        run_dir = cache_dir() / "servers"
        run_dir.mkdir(parents=True, exist_ok=True)
        self._log_path = run_dir / f"{self.name}.{os.getpid()}.log"
        ready_file = run_dir / f"{self.name}.{os.getpid()}.{id(self)}.ready"
        ready_file.unlink(missing_ok=True)
        cmd = [
            sys.executable, "-m", "dspy_pxn.local", "serve", "--model", self.name, "--weights", str(weights),
            "--parallel", str(self.parallel), "--ctx-per-slot", str(self.ctx_per_slot),
            "--threads", str(self.threads), "--ready-file", str(ready_file), "--watch-parent", str(os.getpid()),
        ]  # fmt: skip
        env = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
        with open(self._log_path, "wb") as log:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        atexit.register(self.stop)
        try:
            self.base_url = self._wait_ready(ready_file)
        except BaseException:
            self.stop()
            raise
        finally:
            ready_file.unlink(missing_ok=True)

    def _wait_ready(self, ready_file: Path) -> str:
        """Poll until the child wrote its address and /health is ok; fail with the log's tail."""
        assert self._proc is not None and self._log_path is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if (code := self._proc.poll()) is not None:
                raise LocalLMError(
                    f"local server for {self.name} exited with code {code} while starting; log tail: {_tail(self._log_path)}"
                )
            if ready_file.is_file() and (url := ready_file.read_text().strip()) and probe(url, self.name):
                return url
            time.sleep(0.1)
        raise LocalLMError(
            f"local server for {self.name} not ready after {self.startup_timeout:.0f} s (raise startup_timeout=); "
            f"log tail: {_tail(self._log_path)}"
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the child this object started (SIGTERM, then SIGKILL); a reused server is left alone."""
        with self._lock:
            proc, self._proc = self._proc, None
            self.base_url = None
            if proc is None:
                return
            with contextlib.suppress(Exception):
                atexit.unregister(self.stop)
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout)
            if self._log_path is not None and proc.returncode == 0:
                self._log_path.unlink(missing_ok=True)  # keep a log only when something went wrong

    def __enter__(self) -> LocalLMServer:  # noqa: PYI034 - py3.11 target, no typing.Self needed
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def lm(self, *, grammar: bool = True, **kwargs: Any):  # -> dspy.LM
        """A ``dspy.LM`` aimed at this server, like any API model (DSPy's default engine picks litellm for it:
        the native engine does not carry ``extra_body``).

        Defaults (override with kwargs): temperature 0, ``cache=False`` (so measured wall-clock is
        real: the server is deterministic anyway with the prompt cache off), ``num_retries=1``,
        ``max_tokens=1024``. ``cache_prompt: false`` goes in every request's ``extra_body`` because
        llama-server's prompt cache makes temperature-0 output depend on what ran before.
        ``grammar=True`` adds the ``[[ ## field ## ]]`` grammar to calls made by DSPy's ChatAdapter.
        """
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        settings: dict[str, Any] = {"temperature": 0.0, "cache": False, "num_retries": 1, "max_tokens": 1024}
        settings.update(kwargs)
        extra_body = dict(settings.pop("extra_body", None) or {})
        extra_body.setdefault("cache_prompt", False)
        cls = marker_lm_class() if grammar else plain_lm_class()
        return cls(
            f"openai/{self.name}", api_base=self.api_base, api_key="local", extra_body=extra_body, **settings,
        )  # fmt: skip

    def __repr__(self) -> str:
        state = f"reused {self.base_url}" if self.reused else (self.base_url or "stopped")
        return f"LocalLMServer({self.name!r}, parallel={self.parallel}, {state})"


def _require_xllamacpp() -> None:
    try:
        md.distribution("xllamacpp")
    except md.PackageNotFoundError:
        raise LocalLMError(
            f"the local LM server needs package 'xllamacpp', which is not installed: run {INSTALL_HINT}"
        ) from None
