"""A real BatchedGEPA run in about half a minute, with no API key and no internet.

The LM is dspy-pxn's latency-injecting server on loopback (a subprocess speaking the
OpenAI API), reached through dspy.LM on DSPy's default engine exactly like a hosted model. Its
answers depend on the instruction text, so GEPA has something real to improve.

    python examples/quickstart.py [--p 4 --n 4 --workers 16 --budget 400]

To use a real provider instead, replace the two server.lm(...) calls with e.g.
dspy.LM("openai/gpt-4.1-mini") and dspy.LM("openai/gpt-5-mini", temperature=1.0, max_tokens=16000).
"""

import argparse

import dspy

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.testing import LatencyServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--p", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--budget", type=int, default=400)
    parser.add_argument("--task-latency", type=float, default=0.2)
    args = parser.parse_args()

    train, val, test = sim.make_splits(seed=0, train=60, val=30, test=100)
    program = sim.seed_program()  # dspy.ChainOfThought("question -> answer") with a plain instruction

    with LatencyServer(task_latency=args.task_latency, reflection_latency=4 * args.task_latency) as server:
        dspy.configure(lm=server.lm("task"))
        optimizer = BatchedGEPA(
            metric=sim.metric,  # DSPy's five-argument GEPA feedback metric
            p=args.p, n=args.n, max_metric_calls=args.budget, num_threads=args.workers,
            reflection_lm=server.lm("reflection"),
        )
        optimized = optimizer.compile(program, trainset=train, valset=val)

        evaluate = dspy.Evaluate(devset=test, metric=sim.score,
                                 num_threads=args.workers, display_progress=False)
        seed_test, best_test = evaluate(program).score, evaluate(optimized).score

    results = optimized.detailed_results
    for step in results.steps:  # e.g. "step 2: 9 proposals screened (from 3 parents), 2 improved, 1 validated ..."
        print(f"step {step.step}: {step.summary()}, {step.metric_calls_total}/{step.budget} metric calls, "
              f"{step.wall_s:.1f} s")
    print(f"\nwall {results.wall_s:.1f} s, {results.total_metric_calls} metric calls of {results.budget}")
    print(f"test: seed {seed_test:.1f}% -> optimized {best_test:.1f}%")
    print(f"optimized instruction:\n{optimized.predict.signature.instructions}")
    print("\n(not tracked: pass use_mlflow=True to log the run, its program and prompts to MLflow; "
          "pip install 'dspy-pxn[mlflow]' first)")


if __name__ == "__main__":
    main()
