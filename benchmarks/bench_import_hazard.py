"""Does an MLflow prompt optimization hang in the import machinery? Fresh processes, counted.

MLflow's evaluation autologging (``configure_autologging_for_evaluation``, entered when tracing is on) registers
post-import hooks, and MLflow's import-hook finder then takes its own lock on every import in the process
(``mlflow.utils.import_hooks``); litellm's logging thread retries a missing optional import on every call, through
the same finder. MLflow's own ``GepaPromptOptimizer`` enters the autologging once per candidate evaluation and was
seen to deadlock there. This runs one ``mlflow.genai.optimize_prompts`` call per fresh process (imports are
per process), tracing on, into a sqlite store, against the loopback latency server, for each optimizer and each
way the reflection LM is reached, into a sqlite store and behind `mlflow server`, and counts the runs that do not finish within ``--timeout`` (their threads'
stacks are printed):

    python benchmarks/bench_import_hazard.py --runs 5

Configurations: ``mlflow``: MLflow's ``GepaPromptOptimizer`` (its reflection through gepa's litellm call);
``ours-litellm``: ``BatchedGepaPromptOptimizer`` with a ``dspy.LM(engine="litellm")`` reflection model;
``ours-native``: the same with a ``dspy.LM`` on DSPy's default engine (no OPENAI_API_BASE in the environment,
which would send DSPy's calls through litellm).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

CHILD = textwrap.dedent('''
    import faulthandler, os, sys, tempfile
    faulthandler.dump_traceback_later({timeout} - 5, exit=True)  # a hang prints every thread's stack, then exits
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import dspy, mlflow
    from dspy_pxn import testing as sim
    config, seed, store = {config!r}, {seed}, {store!r}
    train, _, _ = sim.make_splits(seed=seed, train=10, val=1, test=1)
    rows = [{{"inputs": {{"question": e.question}}, "outputs": e.answer}} for e in train]
    with tempfile.TemporaryDirectory() as tmp, sim.LatencyServer(task_latency=0.02, reflection_latency=0.05) as server:
        running = None
        if store == "server":
            from dspy_pxn.testing.mlflow_server import MlflowServer
            running = MlflowServer(tmp).start()
        mlflow.set_tracking_uri(running.uri if running else f"sqlite:///{{tmp}}/mlflow.db")
        mlflow.set_experiment("import-hazard")
        if config != "ours-native":  # an OPENAI_API_BASE in the environment sends DSPy's calls through litellm
            os.environ.update(OPENAI_BASE_URL=server.base_url, OPENAI_API_BASE=server.base_url, OPENAI_API_KEY="sim")
        prompt = mlflow.genai.register_prompt(name="rule", template=sim.seed_instruction())
        loaded = mlflow.genai.load_prompt(prompt.uri)
        task_lm = server.lm("task")

        def predict_fn(question):
            with dspy.context(lm=task_lm):
                return dspy.Predict(dspy.Signature("question -> answer", loaded.format()))(question=question).answer

        if config == "mlflow":
            from mlflow.genai.optimize.optimizers import GepaPromptOptimizer
            optimizer = GepaPromptOptimizer(reflection_model="openai:/sim-reflection", max_metric_calls=60,
                                            gepa_kwargs={{"seed": seed}})
        else:
            from dspy_pxn.tracking import BatchedGepaPromptOptimizer
            model = dspy.LM("openai/sim-reflection", api_base=server.base_url, api_key="sim", cache=False,
                            **({{"engine": "litellm"}} if config == "ours-litellm" else {{}}))
            optimizer = BatchedGepaPromptOptimizer(reflection_model=model, max_metric_calls=60,
                                                   gepa_kwargs={{"seed": seed}})
        result = mlflow.genai.optimize_prompts(predict_fn=predict_fn, train_data=rows, prompt_uris=[prompt.uri],
                                               scorers=[sim.mlflow_scorer()], optimizer=optimizer)
        print("finished", result.final_eval_score, server.stats()["clients"])
        if running:
            running.kill()
''')


def run_once(config: str, seed: int, timeout: float, store: str) -> dict:
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", CHILD.format(config=config, seed=seed, timeout=timeout,
                                                                  store=store)],
                              capture_output=True, text=True, timeout=timeout)
        output = done.stdout + done.stderr
        finished = done.returncode == 0 and "finished" in done.stdout
    except subprocess.TimeoutExpired as expired:
        output, finished = f"{expired.stdout or ''}{expired.stderr or ''}", False
    hung = not finished and "Thread 0x" in output
    return {"config": config, "seed": seed, "store": store, "finished": finished, "hung": hung,
            "seconds": round(time.perf_counter() - started, 1),
            "stacks": output[-4000:] if not finished else "",
            "clients": next((line for line in output.splitlines() if line.startswith("finished")), "")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="mlflow,ours-litellm,ours-native")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--stores", default="sqlite,server", help="sqlite: a local store; server: `mlflow server`")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "import_hazard.json"))
    args = parser.parse_args()
    rows = []
    for seed in range(args.runs):
        for store in args.stores.split(","):
            for config in args.configs.split(","):
                row = run_once(config, seed, args.timeout, store)
                rows.append(row)
                print(f"{config} {store} seed {seed}: "
                      f"{'finished' if row['finished'] else 'HUNG' if row['hung'] else 'FAILED'} "
                      f"in {row['seconds']} s {row['clients']}", flush=True)
                if not row["finished"]:
                    print(row["stacks"], flush=True)
    summary = {f"{config} {store}": {
        "runs": sum(r["config"] == config and r["store"] == store for r in rows),
        "hung": sum(r["hung"] for r in rows if r["config"] == config and r["store"] == store),
        "failed": sum(not r["finished"] and not r["hung"] for r in rows if r["config"] == config and r["store"] == store)}
        for config in args.configs.split(",") for store in args.stores.split(",")}
    print(json.dumps(summary, indent=2))
    Path(args.out).write_text(json.dumps({"args": vars(args), "summary": summary, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
