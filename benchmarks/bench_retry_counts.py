"""LM calls, attempts and retries as a run counts them, against what the server saw, on each DSPy engine.

The latency server answers a share of requests with a 429 or a 500 (``Faults``) and counts every request
it got; DSPy retries them. For each engine (DSPy's default first, then litellm) and seed, one line: the
run's calls, attempts and retries, the server's requests and faults, the step records' retries summed,
and whether litellm was imported (it should be only when an LM of the run uses the litellm engine).

    python benchmarks/bench_retry_counts.py                   # 2 engines x 1 seed, ~20 s
    python benchmarks/bench_retry_counts.py --seeds 3 --rate-429 0.2 --rate-500 0.05
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests.faults

import dspy  # noqa: E402

from dspy_pxn import BatchedGEPA  # noqa: E402
from dspy_pxn import testing as sim  # noqa: E402
from dspy_pxn.testing import LatencyServer  # noqa: E402
from tests.faults import Faults  # noqa: E402

ENGINES = {"native": {}, "litellm": {"engine": "litellm"}}  # native: no engine= argument, as users write it


def measure(engine: str, seed: int, rate_429: float, rate_500: float) -> dict:
    faults = Faults(rate_limit_429=rate_429, error_500=rate_500, retry_after_s=0.01, seed=seed)
    with LatencyServer(task_latency=0.01, reflection_latency=0.02, faults=faults) as server:
        train, val, _ = sim.make_splits(seed=seed, train=30, val=8, test=1)
        optimizer = BatchedGEPA(
            metric=sim.metric, p=2, n=2, max_metric_calls=160, num_threads=12, seed=seed,
            reflection_lm=server.lm("reflection", num_retries=6, temperature=1.0, **ENGINES[engine]))
        with dspy.context(lm=server.lm("task", num_retries=6, **ENGINES[engine])):
            result = optimizer.compile(sim.seed_program(), trainset=train, valset=val).detailed_results
        stats = server.stats()
    counts = result.lm_call_counts
    return {"engine": engine, "seed": seed, "calls": counts.calls, "attempts": counts.attempts,
            "retries": counts.retries, "failures": counts.failures,
            "server_requests": stats["requests"]["calls"]["total"], "server_faults": stats["faults"]["total"],
            "step_records_retries": sum(step.lm_retries or 0 for step in result.steps),
            "litellm_imported": "litellm" in sys.modules}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--rate-429", type=float, default=0.12)
    parser.add_argument("--rate-500", type=float, default=0.04)
    args = parser.parse_args()
    for engine in ENGINES:  # native first: litellm, once imported, stays in sys.modules
        for seed in range(args.seeds):
            print(json.dumps(measure(engine, seed, args.rate_429, args.rate_500)), flush=True)


if __name__ == "__main__":
    main()
