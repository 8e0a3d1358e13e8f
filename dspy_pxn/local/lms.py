"""The one place that turns an LM spec into a ``dspy.LM``.

Specs: any litellm model string (``openai/gpt-4.1-mini``, ``anthropic/claude-sonnet-4-5``, ...), or
``local`` / ``local:<model>`` for the embedded llama.cpp server (see ``dspy_pxn.local.server``).

Why one place: the CLI, examples and benchmarks must agree on role defaults (DSPy's own default
engine, as a user's ``dspy.LM(...)`` gets it; ``engine="litellm"`` passes through), and on failing early - a missing key or an unknown spec is reported before any LM call, in one
line that names the fix. Nothing here logs kwargs, so an ``api_key=`` never reaches a log.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Literal

# Before litellm is first imported: use the bundled cost map instead of fetching it (no network).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from dspy_pxn.local.models import DEFAULT_MODEL, MODELS, LocalLMError, get_model
from dspy_pxn.local.server import LocalLMServer, probe

__all__ = [
    "ROLE_DEFAULTS", "LMSpec", "LMSpecError", "build_lm", "cache_per_endpoint", "local_server", "parse_spec",
    "probe_endpoint", "stop_local_servers",
]

log = logging.getLogger(__name__)
Role = Literal["task", "reflection"]

# Defaults per role; caller kwargs win. Reflection follows DSPy's GEPA advice for API models
# (temperature 1, room for long rewrites); a local reflector gets a budget its speed can afford.
ROLE_DEFAULTS: dict[tuple[str, bool], dict[str, Any]] = {
    ("task", False): {},
    ("reflection", False): {"temperature": 1.0, "max_tokens": 16000},
    ("task", True): {"temperature": 0.0, "max_tokens": 1024},
    ("reflection", True): {"temperature": 0.0, "max_tokens": 1024},
}


class LMSpecError(ValueError):
    """An LM spec the user must fix; the message is one line and says how."""


@dataclass(frozen=True)
class LMSpec:
    """A parsed spec: ``local`` with a catalogue model name, or a litellm model + provider."""

    raw: str
    local: bool
    model: str  # catalogue name for local, the litellm model string otherwise
    provider: str | None = None


def _litellm_provider(model: str) -> str | None:
    """litellm's provider for ``model`` without any network call, or None when it knows none."""
    import litellm

    with contextlib.redirect_stdout(io.StringIO()):  # litellm prints a provider list on failure
        try:
            return litellm.get_llm_provider(model)[1]
        except Exception:  # noqa: BLE001 - litellm raises BadRequestError and friends
            return None


def parse_spec(spec: str) -> LMSpec:
    """Parse ``spec`` or raise LMSpecError naming the accepted forms."""
    if not isinstance(spec, str) or not spec.strip():
        raise LMSpecError(
            f"LM spec {spec!r}: pass 'local', 'local:<model>' or a litellm model like 'openai/gpt-4.1-mini'"
        )
    s = spec.strip()
    if s == "local" or s.startswith("local:"):
        name = s.partition(":")[2] or DEFAULT_MODEL
        try:
            return LMSpec(raw=s, local=True, model=get_model(name).name)
        except LocalLMError as e:
            raise LMSpecError(f"LM spec {spec!r}: {e}") from None
    provider = _litellm_provider(s)
    if provider is None:
        raise LMSpecError(
            f"unknown LM spec {spec!r}: use 'local', 'local:<{'|'.join(sorted(MODELS))}>' or a litellm "
            "model string 'provider/model' (e.g. 'openai/gpt-4.1-mini', 'anthropic/claude-sonnet-4-5')"
        )
    return LMSpec(raw=s, local=False, model=s, provider=provider)


def check_api_key(spec: LMSpec, kwargs: dict[str, Any]) -> None:
    """Raise LMSpecError when litellm would find no credentials for the provider (no network).

    Skipped when the caller passes ``api_key=`` or ``api_base=`` (a self-hosted endpoint decides
    its own auth). The message names the env vars, never a value.
    """
    if spec.local or kwargs.get("api_key") or kwargs.get("api_base"):
        return
    import litellm

    with contextlib.redirect_stdout(io.StringIO()):
        env = litellm.validate_environment(model=spec.model)
    if env.get("keys_in_environment", True):
        return
    missing = env.get("missing_keys") or []
    names = " or ".join(missing) if len(missing) > 1 and spec.provider == "gemini" else " and ".join(missing)
    raise LMSpecError(
        f"LM {spec.model!r} needs {names} in the environment (provider {spec.provider}): export it, "
        "pass api_key=..., or use --lm local for the embedded model"
    )


_SERVERS: dict[str, LocalLMServer] = {}
_SERVERS_LOCK = threading.Lock()


def local_server(model: str | None = None, **server_kw: Any) -> LocalLMServer:
    """The started ``LocalLMServer`` for ``model``, shared by every LM built in this process.

    Why shared: ``--lm local --reflection-lm local`` must not load the same weights twice on a
    2-core machine. ``server_kw`` (parallel=, threads=, ...) apply only when it is first started.
    """
    name = get_model(model).name
    with _SERVERS_LOCK:
        server = _SERVERS.get(name)
        stale = server is not None and server.reused and not probe(server.base_url or "", name)
        if server is None or server.base_url is None or stale:
            server = _SERVERS[name] = LocalLMServer(name, **server_kw)
        return server.start()


def stop_local_servers() -> None:
    """Stop every local server this process started through ``build_lm`` (atexit does it too)."""
    with _SERVERS_LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for server in servers:
        server.stop()


_SERVER_KEYS = ("parallel", "ctx_per_slot", "threads", "reuse", "startup_timeout")


def _needs_placeholder_key(parsed: LMSpec) -> bool:
    """Whether an explicit ``api_base`` needs a placeholder key: when the environment has none for the provider.
    A self-hosted OpenAI-compatible server usually needs none, but litellm's OpenAI client refuses to start
    without one. When the environment has one, no ``api_key`` is passed at all: each engine then reads the
    environment itself (DSPy's native engine takes an explicit ``api_key=None`` as "no credential")."""
    try:
        check_api_key(parsed, {})
    except LMSpecError:
        return True
    return False


def build_lm(spec: str, role: Role = "task", **kw: Any):  # -> dspy.LM
    """A ``dspy.LM`` for ``spec`` in ``role`` ("task" or "reflection").

    API specs: ``dspy.LM(spec, cache=False, **role defaults, **kw)`` after checking
    the provider's key is set. DSPy's cache is off unless ``cache=True``: an optimization run answered
    from an earlier run's cache reports the cache's speed and no cost (and DSPy's cache keys leave out
    ``api_base``, so another endpoint's answers could come back). Local specs: start (or reuse) the embedded server - ``parallel=``,
    ``ctx_per_slot=``, ``threads=``, ``reuse=``, ``startup_timeout=`` configure it, ``grammar=``
    toggles the DSPy-marker grammar - and return its LM.
    """
    if role not in ("task", "reflection"):
        raise LMSpecError(f"role={role!r}: pass 'task' or 'reflection'")
    parsed = parse_spec(spec)
    settings = {**ROLE_DEFAULTS[(role, parsed.local)], **{k: v for k, v in kw.items() if not (k == "api_base" and v is None)}}
    if parsed.local:
        server_kw = {k: settings.pop(k) for k in _SERVER_KEYS if k in settings}
        lm = local_server(parsed.model, **server_kw).lm(**settings)
    else:
        for k in _SERVER_KEYS + ("grammar",):
            if k in settings:
                raise LMSpecError(f"{k}= applies only to local LMs, not to {parsed.model!r}: drop it")
        if settings.get("api_key", "") is None:
            del settings["api_key"]  # None means "from the environment", which each engine reads only if unset
        if settings.get("api_base") and not settings.get("api_key") and _needs_placeholder_key(parsed):
            settings["api_key"] = "not-needed"
        check_api_key(parsed, settings)
        import dspy

        settings.setdefault("cache", False)  # a run's timings and costs must be its own calls', not a cache's
        lm = dspy.LM(parsed.model, **settings)
    log.info("built %s LM %s", role, lm.model)  # model name only: kwargs may hold an api_key
    return lm


def probe_endpoint(url: str, flag: str = "--api-base", timeout: float = 5.0) -> None:
    """Fail now, in one line, when nothing answers at ``url``: otherwise every rollout would fail later.

    Any HTTP answer (even 401/404) means a server is there; only a refused or timed-out
    connection is an error. Loopback is probed without any configured proxy.
    """
    import urllib.error
    import urllib.parse
    import urllib.request

    host = urllib.parse.urlparse(url).hostname or ""
    if not host:
        raise LMSpecError(f"{flag} {url!r} is not a URL; write it like http://127.0.0.1:8000/v1.")
    loopback = host in ("127.0.0.1", "localhost", "::1")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({})) if loopback else urllib.request.build_opener()
    try:
        opener.open(url.rstrip("/") + "/models", timeout=timeout).close()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise LMSpecError(f"{flag} {url} is unreachable ({reason}); start the server or fix the URL.") from None


def cache_per_endpoint(api_base: str | None) -> None:
    """With DSPy's cache on: DSPy's cache keys leave out the endpoint, so each endpoint gets its own disk cache;
    otherwise a run against one server would be answered with another server's replies."""
    if not api_base:
        return
    import hashlib

    import dspy
    from dspy.clients import DISK_CACHE_DIR

    folder = os.path.join(DISK_CACHE_DIR, "endpoints", hashlib.sha256(api_base.encode()).hexdigest()[:16])
    dspy.configure_cache(disk_cache_dir=folder)
