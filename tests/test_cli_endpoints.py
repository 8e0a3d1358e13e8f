"""`dspy-pxn optimize` against self-hosted OpenAI-compatible endpoints, as a user with a provider key runs it.

A user whose shell exports ``OPENAI_API_KEY`` and who points ``--api-base`` at their own server must reach it
on both of DSPy's engines; so must one without the key. Each case runs a real optimization against real
loopback servers and checks that every call arrived where it was sent, through the engine asked for.
"""

from __future__ import annotations

import pytest

from dspy_pxn.cli import main as cli
from dspy_pxn.testing import LatencyServer
from tests.test_programs_helpers import require_data

TINY = ["--train-size", "4", "--val-size", "3", "--test-size", "3", "--workers", "4", "--budget", "24",
        "--p", "1", "--n", "1"]
# The client each engine's requests name (the server counts them by User-Agent): DSPy's own and litellm's.
CLIENT_OF = {"auto": "lm15", "litellm": "openai-python"}


@pytest.fixture(scope="module")
def data_dir():
    return str(require_data("gsm8k"))


def _calls(server: LatencyServer) -> tuple[int, int, set[str]]:
    stats = server.stats()
    return stats["calls"]["task"], stats["calls"]["reflection"], {client.split("/")[0] for client in stats["clients"]}


@pytest.mark.parametrize("endpoints", ["--api-base", "--reflection-api-base"])
@pytest.mark.parametrize("key", ["key set", "key unset"])
@pytest.mark.parametrize("engine", ["auto", "litellm"])
def test_the_command_line_reaches_a_self_hosted_endpoint(engine, key, endpoints, data_dir, tmp_path, monkeypatch,
                                                         capsys):
    if key == "key set":
        monkeypatch.setenv("OPENAI_API_KEY", "sk-the-users-provider-key")
    else:
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with LatencyServer(task_latency=0.0, reflection_latency=0.0) as task_server, \
            LatencyServer(task_latency=0.0, reflection_latency=0.0) as reflection_server:
        flags = ["--lm", "openai/sim-task", "--reflection-lm", "openai/sim-reflection", "--api-base",
                 task_server.base_url, "--engine", engine]
        if endpoints == "--reflection-api-base":
            flags += ["--reflection-api-base", reflection_server.base_url]
        code = cli(["optimize", "gsm8k", *flags, *TINY, "--data-dir", data_dir, "--no-mlflow",
                    "--log-dir", str(tmp_path / "run")])
        out, err = capsys.readouterr()
        assert code == 0, err
        task_calls, reflections_here, clients = _calls(task_server)
        _, reflections_there, reflection_clients = _calls(reflection_server)
    assert "raised on" not in out + err and "LMNotConfigured" not in out + err
    assert task_calls >= 3 + 3, "the seed's validation and at least one screening reached the task endpoint"
    assert clients == {CLIENT_OF[engine]}
    if endpoints == "--reflection-api-base":
        assert reflections_there >= 1 and reflections_here == 0 and reflection_clients == {CLIENT_OF[engine]}
    else:
        assert reflections_here >= 1 and reflections_there == 0
