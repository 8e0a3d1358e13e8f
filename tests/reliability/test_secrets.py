"""API keys never reach MLflow params, tags, metrics or artifacts, step logs, run files or saved programs."""

from __future__ import annotations

import os
from pathlib import Path

import dspy
import pytest

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.testing import LatencyServer

ENV_KEY = "sk-env-FAKE-0123456789abcdef"
ARG_KEY = "sk-arg-FAKE-fedcba9876543210"
KEYS = (ENV_KEY, ARG_KEY)


def files_containing_a_key(root: Path) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            hits += [f"{path.relative_to(root)}: {key}" for key in KEYS if key.encode() in data]
    return hits


def test_api_keys_never_reach_tracking_logs_or_saved_programs(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    from mlflow import MlflowClient

    from dspy_pxn.tracking import MlflowTracker

    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is relative to the working directory
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    store = f"sqlite:///{tmp_path}/mlflow.db"
    log_dir = tmp_path / "run"
    train, val, _ = sim.make_splits(seed=0, train=24, val=8, test=8)
    with LatencyServer(task_latency=0.01, reflection_latency=0.02) as server:
        def lm(**kw):
            return dspy.LM("openai/sim-task", api_base=server.base_url, api_key=ARG_KEY, cache=False, num_retries=0,
                           timeout=10, **kw)

        env_lm = dspy.LM("openai/sim-env", api_base=server.base_url, cache=False, num_retries=0,
                         timeout=10)  # takes OPENAI_API_KEY from the environment
        student = sim.seed_program()
        student.predict.lm = lm(temperature=0.0)  # a per-predictor LM is part of the program's state
        optimizer = BatchedGEPA(
            metric=sim.metric, p=2, n=2, max_metric_calls=70, num_threads=8, log_dir=str(log_dir),
            reflection_lm=lm(temperature=1.0),
            tracker=MlflowTracker(tracking_uri=store, experiment="secrets", run_name="secret run"),
        )
        with dspy.context(lm=env_lm):
            program = optimizer.compile(student, trainset=train, valset=val, testset=_)
        calls = server.stats()["calls"]
    result = program.detailed_results
    assert calls["task"] > 0 and calls["reflection"] > 0 and result.mlflow_run_id  # the keys were really used
    (tmp_path / "saved").mkdir()
    program.save(str(tmp_path / "saved" / "program.json"))
    program.save(str(tmp_path / "saved" / "program.pkl"), save_program=False)

    client = MlflowClient(store)
    run = client.get_run(result.mlflow_run_id)
    logged = repr(run.data.params) + repr(run.data.tags) + repr(run.data.metrics)
    for key in KEYS:
        assert key not in logged
    downloaded = tmp_path / "downloaded"
    client.download_artifacts(run.info.run_id, "", str(downloaded))
    assert any(downloaded.rglob("*.json")) and (log_dir / "steps.jsonl").exists()
    # Every file written anywhere under tmp: log_dir, the sqlite store, MLflow's artifact root, saved programs.
    assert files_containing_a_key(tmp_path) == []
    assert os.environ["OPENAI_API_KEY"] == ENV_KEY  # nothing was scrubbed from the environment to pass this
    assert mlflow is not None
