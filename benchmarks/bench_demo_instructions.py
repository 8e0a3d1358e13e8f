"""Does a hand-written instruction beat the demo's seed with the 0.5B local task model?

Why: the demo (`dspy-pxn demo`) shows no held-out gain. Before blaming the reflector, check
whether any plausible instruction helps this task model at all: score the seed and a "be
brief" instruction (about a fifth of the seed's answers run into max_tokens) on the demo's
own val + test questions, counting truncated answers (benchmarks/results/demo.md).

    DSPY_PXN_DATA_DIR=/path/to/data nice python benchmarks/bench_demo_instructions.py
"""

from __future__ import annotations

import functools
import logging
import os
import time

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dspy
from dspy_pxn.programs.gsm8k import SEED_INSTRUCTION, GSM8KSolver, load_gsm8k, metric

from dspy_pxn.cli import DEMO_DEFAULTS
from dspy_pxn.local import build_lm, stop_local_servers
from dspy_pxn.pools import ThreadWorkerPool

INSTRUCTIONS = {
    "seed": SEED_INSTRUCTION,
    "brief": "Solve the math word problem. Reason in at most 5 short sentences, doing each calculation once. "
    "Then give the final answer as a single number with no units.",
}


class TruncationCounter(logging.Handler):
    """DSPy logs a warning per answer cut off at max_tokens; count them."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += "truncated" in record.getMessage()


def score_one(program: GSM8KSolver, lm: dspy.LM, example: dspy.Example) -> float:
    try:
        with dspy.context(lm=lm):
            return metric(example, program(question=example.question)).score
    except Exception:  # noqa: BLE001 - an unparseable answer scores 0, as in the optimizer
        return 0.0


def main() -> None:
    d = DEMO_DEFAULTS
    lm = build_lm(d["lm"], "task", max_tokens=d["task_max_tokens"])
    split = load_gsm8k(n_train=d["train_size"], n_val=d["val_size"], n_test=d["test_size"], seed=0)
    counter = TruncationCounter()
    logging.getLogger("dspy.clients.lm").addHandler(counter)
    print("| instruction | val | test | truncated | seconds |\n|---|---|---|---|---|")
    try:
        with ThreadWorkerPool(2) as pool:
            for name, text in INSTRUCTIONS.items():
                program, counter.count, started = GSM8KSolver(text), 0, time.perf_counter()
                score = functools.partial(score_one, program, lm)
                val, test = pool.map(score, split.val), pool.map(score, split.test)
                print(f"| {name} | {sum(val):.0f}/{len(val)} | {sum(test):.0f}/{len(test)} | {counter.count} | "
                      f"{time.perf_counter() - started:.0f} |", flush=True)
    finally:
        stop_local_servers()


if __name__ == "__main__":
    main()
