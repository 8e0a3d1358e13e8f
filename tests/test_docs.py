"""Docs that cannot rot: the site builds with ``mkdocs build --strict``, and every snippet marked runnable runs.

A snippet marked ``<!-- runnable -->`` (in README.md or under docs/) is executed as written,
with what a reader brings (``program``, ``train``, ``val``, ``test``, ``metric`` and a configured
task LM) bound to the simulated task, and every ``dspy.LM(...)`` it makes answered by the
simulated model's OpenAI-compatible server on loopback, through litellm and HTTP, in place of the
provider it names: a renamed argument or a wrong name breaks this test, not the reader.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import dspy
import pytest

from dspy_pxn import testing as sim

ROOT = Path(__file__).resolve().parents[1]
RUNNABLE = re.compile(r"<!-- runnable -->\n```python\n(.*?)```", re.DOTALL)


def runnable_snippets() -> list[tuple[str, str]]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = []
    for page in pages:
        text = page.read_text()
        for match in RUNNABLE.finditer(text):
            line = text.count("\n", 0, match.start()) + 2
            found.append((f"{page.relative_to(ROOT)}:{line}", match.group(1)))
    return found


SNIPPETS = runnable_snippets()


def test_the_guides_mark_snippets_runnable():
    assert len(SNIPPETS) >= 8, [where for where, _ in SNIPPETS]


@pytest.fixture(scope="module")
def provider():
    with sim.LatencyServer(task_latency=0.0, reflection_latency=0.0) as server:
        server.warm_up()
        yield server


def loopback_lm_class(server: sim.LatencyServer) -> type:
    """``dspy.LM`` for a snippet: any model it names is the simulated server, over HTTP on DSPy's default engine.

    The class closes over the server's URL only (a string), so a snippet's LMs pickle as a user's do and a
    tracked compile can log its program as an MLflow model.
    """
    real, base_url = dspy.LM, server.base_url

    class Loopback(real):
        def __init__(self, model: str, **kwargs):
            kept = {k: v for k, v in kwargs.items() if k in ("temperature", "max_tokens", "timeout", "num_retries")}
            super().__init__("openai/sim-" + model.rsplit("/", 1)[-1], api_base=base_url, api_key="sim",
                             cache=False, **kept)

    return Loopback


@pytest.mark.parametrize(("where", "code"), SNIPPETS, ids=[where for where, _ in SNIPPETS])
def test_a_runnable_snippet_runs_as_written(where, code, provider, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # log_dir="runs/..." and MLflow's ./mlflow.db land here
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr(dspy, "LM", loopback_lm_class(provider))
    train, val, test = sim.make_splits(seed=0, train=24, val=8, test=8)
    names = {"program": sim.seed_program(), "train": train, "val": val, "test": test, "metric": sim.metric,
             "__name__": "__snippet__"}
    configured = dspy.settings.lm
    dspy.configure(lm=dspy.LM("openai/gpt-4.1-mini"))  # the reader's task LM, configured before the snippet
    try:
        exec(compile(code, where, "exec"), names)  # noqa: S102 - the docs' own code, run as a reader would
    finally:
        dspy.configure(lm=configured)


def test_the_site_builds_strictly_with_the_api_and_cli_reference(tmp_path):
    site = tmp_path / "site"
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    api = (site / "reference" / "api" / "index.html").read_text()
    assert 'id="dspy_pxn.BatchedGEPA.compile"' in api and "max_concurrent_lm_calls" in api
    cli = (site / "reference" / "cli" / "index.html").read_text()
    for command in ("optimize", "sweep", "demo", "plan", "compare", "mlflow-import"):
        assert f"dspy-pxn {command}" in cli, command
    assert (site / "reference" / "architecture" / "index.html").read_text().count("Run.prepare") >= 1
