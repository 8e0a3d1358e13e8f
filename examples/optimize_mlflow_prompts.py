"""Optimize a prompt in MLflow's Prompt Registry with mlflow.genai.optimize_prompts, P×N wide.

The only change from MLflow's own GEPA optimizer is the ``optimizer=`` line. The LMs are dspy-pxn's
latency-injecting server on loopback (an OpenAI-compatible subprocess), so this runs with no API key
and no internet; the tracking store is a sqlite file in a temporary directory unless ``--tracking-uri``
names one.

    python examples/optimize_mlflow_prompts.py [--budget 300 --rows 30 --p 10 --compare]

``--compare`` runs MLflow's GepaPromptOptimizer on the same data and budget afterwards. With a real
provider, predict_fn calls your model (e.g. ``openai.OpenAI().chat.completions.create``) and
``reflection_model`` names one as MLflow does: ``"openai:/gpt-5-mini"``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import dspy

from dspy_pxn import testing as sim


def make_predict_fn(prompt: Any, task_lm: dspy.BaseLM):
    """predict_fn as MLflow's docs write it: the prompt loaded once, formatted in the calling thread per row."""
    signature = dspy.Signature("question -> answer")

    def predict_fn(question: str) -> str:
        instructions = prompt.format()  # in this thread: the optimizer's candidate for this row
        with dspy.context(lm=task_lm):
            return dspy.Predict(signature.with_instructions(instructions))(question=question).answer

    return predict_fn


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=300, help="max_metric_calls: rows evaluated, never exceeded")
    parser.add_argument("--rows", type=int, default=30, help="training rows (also what candidates are validated on)")
    parser.add_argument("--p", default=None, help="parents per step, or 'auto' (default: one per row in flight)")
    parser.add_argument("--n", type=int, default=1, help="mutations per parent")
    parser.add_argument("--task-latency", type=float, default=0.2)
    parser.add_argument("--tracking-uri", default=None, help="default: a sqlite file in a temporary directory")
    parser.add_argument("--compare", action="store_true", help="also run MLflow's GepaPromptOptimizer")
    args = parser.parse_args(argv)

    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    import mlflow
    from mlflow.genai.optimize import GepaPromptOptimizer

    from dspy_pxn.tracking import BatchedGepaPromptOptimizer

    train, _, _ = sim.make_splits(seed=0, train=args.rows, val=1, test=1)
    train_data = [{"inputs": {"question": e.question}, "expectations": {"expected_response": e.answer}}
                  for e in train]
    p = args.p if args.p in (None, "auto") else int(args.p)
    with tempfile.TemporaryDirectory() as tmp, sim.LatencyServer(
            task_latency=args.task_latency, reflection_latency=4 * args.task_latency) as server:
        # The reflection model is named as MLflow names models; litellm finds the server through these.
        os.environ.update(OPENAI_BASE_URL=server.base_url, OPENAI_API_BASE=server.base_url, OPENAI_API_KEY="sim")
        mlflow.set_tracking_uri(args.tracking_uri or f"sqlite:///{tmp}/mlflow.db")
        mlflow.set_registry_uri(args.tracking_uri or f"sqlite:///{tmp}/mlflow.db")
        mlflow.set_experiment("optimize-mlflow-prompts")
        registered = mlflow.genai.register_prompt(name="rule_arithmetic", template=sim.seed_instruction())
        predict_fn = make_predict_fn(mlflow.genai.load_prompt(registered.uri), server.lm("task"))

        optimizers = {"BatchedGepaPromptOptimizer": BatchedGepaPromptOptimizer(
            reflection_model="openai:/sim-reflection", max_metric_calls=args.budget, p=p, n=args.n)}
        if args.compare:
            optimizers["mlflow GepaPromptOptimizer"] = GepaPromptOptimizer(
                reflection_model="openai:/sim-reflection", max_metric_calls=args.budget)
        report = {}
        for name, optimizer in optimizers.items():
            start = time.perf_counter()
            result = mlflow.genai.optimize_prompts(predict_fn=predict_fn, train_data=train_data,
                                                   prompt_uris=[registered.uri], scorers=[sim.mlflow_scorer()],
                                                   optimizer=optimizer)
            wall = time.perf_counter() - start
            (version,) = result.optimized_prompts
            calls = getattr(optimizer, "last_run", {}).get("metric_calls")
            print(f"{name}: {wall:.1f} s, score {result.initial_eval_score:.3f} -> {result.final_eval_score:.3f}"
                  + (f", {calls} of {args.budget} metric calls" if calls is not None else "")
                  + f", registered {version.uri}")
            report[name] = {"wall_s": wall, "initial": result.initial_eval_score, "final": result.final_eval_score,
                            "uri": version.uri, "metric_calls": calls, "template": version.template}
        print("optimized prompt:\n" + report["BatchedGepaPromptOptimizer"]["template"])
    return report


if __name__ == "__main__":
    main()
