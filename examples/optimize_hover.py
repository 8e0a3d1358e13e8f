"""Optimize the HoVer multi-hop agent (query writer + note taker) with BatchedGEPA.

    export OPENAI_API_KEY=...   DSPY_PXN_DATA_DIR=/path/to/shared/data
    python examples/optimize_hover.py --corpus wiki.abstracts.2017.jsonl --p 2 --n 2 --budget 300

Without --corpus, a stand-in corpus is built from the HoVer claims themselves
(dspy_pxn.programs.demo_corpus): fine for trying the pipeline, not for numbers. --api-base points
both LMs at an OpenAI-compatible server; the tests run this script that way, with tiny sizes.
"""

import argparse
import os
import tempfile
import time

import dspy
from dspy_pxn.programs.demo_corpus import write_claims_corpus
from dspy_pxn.programs.hover import HoverAgent, load_hover, metric
from dspy_pxn.programs.retrieval import open_index

from dspy_pxn import BatchedGEPA
from dspy_pxn.local import build_lm


class PrintSteps:
    """A gepa callback; one with ``on_step_record(record)`` also hears each step's StepRecord."""

    def on_step_record(self, s) -> None:
        print(f"step {s.step}: {s.metric_calls_total}/{s.budget} calls, "
              f"best val {s.best_val:.3f}, {s.accepted} accepted")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lm", default="openai/gpt-4.1-mini")
    parser.add_argument("--reflection-lm", default="openai/gpt-5-mini")
    parser.add_argument("--api-base", help="OpenAI-compatible endpoint for both LMs")
    parser.add_argument("--data-dir", help="default: $DSPY_PXN_DATA_DIR")
    parser.add_argument("--corpus", help='JSONL of {"title", "text"}; the BM25 index is built beside it once')
    parser.add_argument("--p", type=int, default=2)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--budget", type=int, default=300)
    parser.add_argument("--train-size", type=int, default=200)  # offline split: 200 / 150 / 200
    parser.add_argument("--val-size", type=int, default=150)
    parser.add_argument("--test-size", type=int, default=200)
    parser.add_argument("--log-dir", default=time.strftime("runs/hover-%Y%m%d-%H%M%S"),
                        help="a new directory per run; pass an earlier run's to resume it")
    args = parser.parse_args(argv)

    train, val, test = load_hover(args.data_dir)
    train, val, test = train[: args.train_size], val[: args.val_size], test[: args.test_size]
    corpus = args.corpus or str(write_claims_corpus(train + val + test,
                                                    os.path.join(tempfile.mkdtemp(), "claims.jsonl")))
    agent = HoverAgent(open_index(corpus=corpus))  # 4 hops of (write query -> BM25 top-7 -> take notes)
    dspy.configure(lm=build_lm(args.lm, "task", api_base=args.api_base, timeout=600))

    optimizer = BatchedGEPA(
        metric=metric,  # recall of the gold articles, feedback per predictor (query writer / note taker)
        p=args.p, n=args.n, max_metric_calls=args.budget, num_threads=args.workers,
        reflection_lm=build_lm(args.reflection_lm, "reflection", api_base=args.api_base, timeout=600),
        log_dir=args.log_dir,
        gepa_kwargs={"callbacks": [PrintSteps()]},  # gepa callbacks, as under dspy.GEPA
    )
    # testset: scored once after the search, never seen by it (detailed_results.test_score)
    best = optimizer.compile(agent, trainset=train, valset=val, testset=test)

    results = best.detailed_results
    print(f"val {results.val_aggregate_scores[0]:.3f} -> {max(results.val_aggregate_scores):.3f}, "
          f"test {results.test_score:.3f}, {results.total_metric_calls} calls in {results.wall_s:.1f} s")
    for name, predictor in best.named_predictors():
        print(f"[{name}] {predictor.signature.instructions}")
    best.save(os.path.join(args.log_dir, "program.json"))


if __name__ == "__main__":
    main()
