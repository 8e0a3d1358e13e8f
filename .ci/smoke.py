"""CI's smoke job for one corner of the tested version range: what a user runs after `pip install dspy-pxn`.

    python .ci/smoke.py core     the core install: the quickstart and `dspy-pxn optimize sim` exit 0, untracked
    python .ci/smoke.py mlflow   with the mlflow extra: one tracked compile on each DSPy engine, its model loaded

Run by `.ci/run` in a fresh venv holding the built wheel (not the checkout: every step runs outside it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# One tracked compile in a fresh process (so the native engine's run can show litellm was never imported),
# then its MLflow model loaded back and asked a question.
COMPILE = '''
import json, os, sys
import dspy, mlflow
from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.testing import LatencyServer
from dspy_pxn.tracking import MlflowTracker

engine, uri = {} if sys.argv[1] == "native" else {"engine": sys.argv[1]}, sys.argv[2]
train, val, test = sim.make_splits(seed=0, train=30, val=8, test=4)
with LatencyServer(task_latency=0.01, reflection_latency=0.02) as server:
    dspy.configure(lm=server.lm("task", num_retries=3, **engine))
    optimizer = BatchedGEPA(metric=sim.metric, p=2, n=2, max_metric_calls=120, num_threads=8,
                            reflection_lm=server.lm("reflection", num_retries=3, **engine),
                            tracker=MlflowTracker(tracking_uri=uri, experiment="smoke"))
    optimized = optimizer.compile(sim.seed_program(), trainset=train, valset=val)
    results = optimized.detailed_results
    litellm_imported = "litellm" in sys.modules
    model_uri = mlflow.MlflowClient(uri).get_run(results.mlflow_run_id).data.tags["dspy_pxn.model_uri"]
    mlflow.set_tracking_uri(uri)
    os.environ["OPENAI_API_KEY"] = "sim"  # a logged model keeps no key: it reads the provider's, as users deploy it
    loaded = mlflow.dspy.load_model(model_uri)
    question = test[0].question
    same = loaded(question=question).answer == optimized(question=question).answer
print(json.dumps({"calls": results.lm_call_counts.calls, "attempts": results.lm_call_counts.attempts,
                  "metric_calls": results.total_metric_calls, "litellm_imported": litellm_imported,
                  "loaded_answers_alike": same, "instructions_alike": loaded.predict.signature.instructions
                  == optimized.predict.signature.instructions}))
'''


def run(command: list[str], cwd: str, exit_code: int = 0) -> str:
    """The command's standard output (its standard error too, for a command expected to fail)."""
    print("$", " ".join(command if "-c" not in command else [*command[:2], "<script>", *command[3:]]), flush=True)
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=900)
    if done.returncode != exit_code:
        sys.exit(f"exit code {done.returncode}, not {exit_code}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout + (done.stderr if exit_code else "")


def core(tmp: str) -> None:
    out = run([sys.executable, str(REPO / "examples" / "quickstart.py"), "--budget", "200", "--task-latency", "0.02"],
              tmp)
    assert "test: seed" in out and "use_mlflow=True" in out, out
    cli = str(Path(sys.executable).with_name("dspy-pxn"))
    out = run([cli, "optimize", "sim", "--p", "2", "--n", "2", "--budget", "200", "--task-latency", "0.02"], tmp)
    assert "MLflow tracking is off: mlflow is not installed" in out, out
    assert "floor B*T_e/W" in run([cli, "plan", "--workers", "16", "--budget", "600", "--val-size", "30"], tmp)
    refused = run([cli, "compare", "--experiment", "x"], tmp, exit_code=2)
    assert "pip install 'dspy-pxn[mlflow]'" in refused, refused
    print("core install: quickstart, `dspy-pxn optimize sim` (untracked, saying how to track) and `plan` ran; "
          "`compare` was refused naming the mlflow extra")


def mlflow(tmp: str) -> None:
    uri = f"sqlite:///{tmp}/mlflow.db"
    for engine in ("native", "litellm"):
        seen = json.loads(run([sys.executable, "-c", COMPILE, engine, uri], tmp).strip().splitlines()[-1])
        assert seen["calls"] > seen["metric_calls"] > 0 and seen["attempts"] == seen["calls"], seen
        assert seen["litellm_imported"] == (engine == "litellm"), seen
        assert seen["loaded_answers_alike"] and seen["instructions_alike"], seen
        print(f"{engine} engine: compiled ({seen['calls']} LM calls), tracked, model logged and loaded back")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as directory:
        {"core": core, "mlflow": mlflow}[sys.argv[1]](directory)
