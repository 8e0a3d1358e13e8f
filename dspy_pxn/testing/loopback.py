"""``LatencyServer``: the latency server started as a subprocess on loopback, and ``dspy.LM``s aimed at it.

A subprocess, not a thread: the simulated provider must not steal GIL time from the
optimizer being measured (nor be slowed by it). The handle reads the server's stats
(calls, peak concurrency, injected faults) over HTTP, so tests measure parallelism at
the server, where a provider would see it.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from dspy_pxn.testing.landscape import DEPTH, LANDSCAPES, Landscape, resolve_landscape
from dspy_pxn.testing.latency import check_distribution
from dspy_pxn.testing.latency_server import FaultInjector

# urllib must not route loopback stats calls through any configured HTTP proxy.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class LatencyServer:
    """Start the server CLI as a subprocess and hand out `dspy.LM`s pointed at it.

    A subprocess, not a thread: the simulated provider must not steal GIL time
    from the optimiser being benchmarked (nor be slowed by it). ``task_latency`` and
    ``reflection_latency`` are medians when ``latency`` is "lognormal" or "heavy" (drawn
    from ``seed``); ``landscape`` is the model's character (``DEPTH`` unless told).
    """

    def __init__(
        self,
        *,
        task_latency: float = 0.0,
        reflection_latency: float = 0.0,
        reflection_error_rate: float | None = None,
        faults: FaultInjector | None = None,
        port: int = 0,
        startup_timeout: float = 30.0,
        landscape: Landscape | str | None = None,
        latency: str = "fixed",
        seed: int = 0,
    ) -> None:
        self.task_latency = task_latency
        self.reflection_latency = reflection_latency
        self.reflection_error_rate = reflection_error_rate
        self.landscape = resolve_landscape(landscape)
        self.latency = check_distribution(latency)
        self.seed = seed
        self.faults = faults
        self.port = port
        self.startup_timeout = startup_timeout
        self.base_url: str | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: Any = None

    # ---- lifecycle ------------------------------------------------------ #

    def start(self) -> LatencyServer:
        if self._proc is not None:
            return self
        cmd = [
            sys.executable, "-m", "dspy_pxn.testing.latency_server",
            "--port", str(self.port),
            "--task-latency", str(self.task_latency),
            "--reflection-latency", str(self.reflection_latency),
        ]
        if self.reflection_error_rate is not None:
            cmd += ["--reflection-error-rate", str(self.reflection_error_rate)]
        if self.latency != "fixed":
            cmd += ["--latency", self.latency, "--latency-seed", str(self.seed)]
        if self.landscape != DEPTH:
            preset = LANDSCAPES.get(self.landscape.name)
            cmd += ["--landscape", preset.name if preset == self.landscape else self.landscape.to_json()]
        # Make `dspy_pxn` (and the fault injector's package) importable in the child however the parent found them.
        roots = [str(Path(__file__).resolve().parents[2])]
        if self.faults is not None:
            injector = type(self.faults)
            cmd += ["--fault-injector", f"{injector.__module__}:{injector.__qualname__}", "--faults", self.faults.to_json()]
            package = sys.modules[injector.__module__.partition(".")[0]]
            roots.append(str(Path(package.__file__).resolve().parents[1 if package.__file__.endswith("__init__.py") else 0]))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (*roots, env.get("PYTHONPATH", "")) if p)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # stderr to a file, not a pipe: nobody drains it while the server runs.
        self._stderr = tempfile.TemporaryFile(mode="w+", prefix="latency_server_", suffix=".err")
        # Started from the root it imports from: the caller's working directory (`python -m` puts it first on
        # sys.path) may be a source checkout that shadows the installed package.
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr, text=True, env=env,
            cwd=roots[0],
        )
        try:
            self.base_url = self._await_ready()
        except BaseException:
            self.close()
            raise
        return self

    def _await_ready(self) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(
                    f"latency server did not print READY within {self.startup_timeout:.0f}s; stderr:\n{self._stderr_text()}"
                )
            ready, _, _ = select.select([self._proc.stdout], [], [], min(remaining, 0.5))
            if ready:
                line = self._proc.stdout.readline()
                if line.startswith("READY "):
                    return line.split(" ", 1)[1].strip()
                if line:
                    continue
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"latency server exited with code {self._proc.returncode} before READY; stderr:\n{self._stderr_text()}"
                )

    def _stderr_text(self) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.flush()
            self._stderr.seek(0)
            return self._stderr.read()[-4000:]
        except (OSError, ValueError):
            return "<stderr unavailable>"

    def close(self) -> None:
        """Terminate the subprocess (kill if it lingers); safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
            if proc.stdout is not None:
                proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> LatencyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ---- stats ---------------------------------------------------------- #

    @property
    def root_url(self) -> str:
        if self.base_url is None:
            raise RuntimeError("LatencyServer is not started")
        return self.base_url.rsplit("/v1", 1)[0]

    def _request(self, method: str, path: str) -> dict[str, Any]:
        req = urllib.request.Request(self.root_url + path, method=method, data=b"" if method == "POST" else None)
        with _OPENER.open(req, timeout=10) as resp:
            return json.loads(resp.read())

    def stats(self) -> dict[str, Any]:
        """Server-side counters: calls, in_flight and max_in_flight by kind and total, clients.

        ``calls``/``max_in_flight`` count answered completions during their latency;
        ``requests`` counts every chat request (faulty ones too) for as long as it is
        open, which is what a provider's concurrency limit sees; ``faults`` counts
        injected faults by kind.
        """
        return self._request("GET", "/stats")

    def reset_stats(self) -> None:
        self._request("POST", "/stats/reset")

    def timeline(self) -> list[tuple[str, float, float]]:
        """(kind, start, end) of each answered completion's latency since the last reset, by start, in epoch
        seconds: where a run's LM calls fell in time, for a benchmark that splits its wall."""
        return [tuple(call) for call in self._request("GET", "/timeline")["calls"]]

    # ---- clients -------------------------------------------------------- #

    def warm_up(self, **kw: Any) -> None:
        """One call through dspy.LM (``kw``: e.g. ``engine="litellm"``), so the engine's one-time initialisation
        (about 2.5 s per process for litellm's import here) is not billed to the first run a benchmark times."""
        self.lm("task", **kw)("Apply rule zorp to 1.")

    def lm(self, kind_hint: str = "task", **kw: Any):
        """A `dspy.LM`, uncached, aimed at this server, on DSPy's default engine (its native lm15 client
        for an `openai/` model with an `api_base`) unless ``engine=`` says otherwise (``engine="litellm"``).

        `kind_hint` only names the model (sim-task / sim-reflection) for
        readable histories; the server classifies calls by prompt content.
        """
        import dspy

        # DSPy and litellm otherwise try to download their model-cost map on first use.
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        params: dict[str, Any] = dict(
            api_base=self.base_url, api_key="sim", cache=False, temperature=0.0, num_retries=0, timeout=60,
        )
        params.update(kw)
        return dspy.LM(f"openai/sim-{kind_hint}", **params)
