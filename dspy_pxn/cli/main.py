"""The `dspy-pxn` parser: one subcommand per job, each a thin shell over a library function."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from dspy_pxn.cli.errors import UsageError
from dspy_pxn.cli.optimize import DEFAULT_TIMEOUT_S, DEMO_DEFAULTS, demo_command, optimize_command, sweep_command
from dspy_pxn.cli.plan import (
    ASSUMED_ACCEPTANCE,
    ASSUMED_REFLECTION_S,
    ASSUMED_TASK_S,
    compare_command,
    import_command,
    plan_command,
)
from dspy_pxn.cli.tasks import TASKS, parents_flag
from dspy_pxn.engine.width import AUTO


def _run_options(parser: argparse.ArgumentParser, demo: bool = False) -> None:
    """Options shared by optimize, sweep and demo."""
    d = DEMO_DEFAULTS if demo else {}
    parser.add_argument("--lm", default=d.get("lm"),
                        help="task LM: a litellm model string (openai/gpt-4.1-mini, ...) or local[:name] "
                             "(the sim task starts a simulated LM when omitted)")
    parser.add_argument("--reflection-lm", default=d.get("reflection_lm"), help="reflection LM, same forms as --lm")
    parser.add_argument("--cache", action="store_true",
                        help="let DSPy answer repeated LM requests from its cache (off: every call is real, so "
                             "timings and costs are a fresh run's)")
    parser.add_argument("--task-latency", type=float, default=0.5,
                        help="sim only: seconds per simulated task call (reflection takes 4x); the median with "
                             "--latency lognormal|heavy")
    parser.add_argument("--latency", choices=("fixed", "lognormal", "heavy"), default="fixed",
                        help="sim only: fixed call times, lognormal (p99/p50 = 4) or heavy (lognormal plus 3%% "
                             "stragglers at 5-20x), drawn from --seed")
    parser.add_argument("--landscape", choices=("depth", "breadth", "chain"), default="depth",
                        help="sim only: the simulated model; depth learns one rule per reflection, breadth several, "
                             "with noisy answers that let selection overfit val")
    parser.add_argument("--api-base", help="OpenAI-compatible endpoint for API-model specs (probed before the run)")
    parser.add_argument("--reflection-api-base", help="endpoint for the reflection LM (default: --api-base)")
    parser.add_argument("--engine", choices=("auto", "litellm"), default="auto",
                        help="DSPy's LM engine: auto (DSPy's default: its own client where it can, litellm otherwise) "
                             "or litellm")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per LM call")
    parser.add_argument("--workers", type=int, default=d.get("workers"),
                        help="W: concurrent rollouts (default: DSPy's num_threads, 8 unless configured)")
    parser.add_argument("--budget", type=int, default=d.get("budget"),
                        help="B: max metric calls (default: auto='light', dspy.GEPA's preset for the program and "
                             "valset)")
    parser.add_argument("--minibatch-size", type=int, default=d.get("minibatch_size"),
                        help="reflection minibatch (default: BatchedGEPA's, 3)")
    parser.add_argument("--selection", help="all | best | merge | merge+best | k (top-k): which improving children "
                                            "are validated (default: all at one proposal per step, merge above)")
    parser.add_argument("--schedule", choices=("steps", "async"),
                        help="steps (a barrier per step) or async (P*N pipelines in flight; the default above one "
                             "proposal per step)")
    parser.add_argument("--data-dir", help="folder with livebench_math/, hover/, gsm8k/ (default $DSPY_PXN_DATA_DIR)")
    parser.add_argument("--online", action="store_true",
                        help="download the data set from the Hugging Face hub instead (needs network and `datasets`)")
    for split in ("train", "val", "test"):
        parser.add_argument(f"--{split}-size", type=int, default=d.get(f"{split}_size"),
                            help=f"subsample the {split} split to this many examples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-format-feedback", action="store_true",
                        help="do not show output-format failures to the reflector (dspy.GEPA's default)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLflow's, i.e. ./mlflow.db)")
    parser.add_argument("--experiment", help="MLflow experiment (default: dspy-pxn-TASK)")
    parser.add_argument("--no-mlflow", action="store_true", help="do not track in MLflow (log_dir still has everything)")
    parser.add_argument("--register-model", metavar="NAME",
                        help="register the optimized program in the MLflow Model Registry as NAME (a sweep: its best run's)")
    parser.add_argument("--log-dir", help="run directory: step log, program.json (default: runs/TASK-PxN-TIME)")
    parser.add_argument("--max-cost-usd", type=float,
                        help="dollars the search may spend on LM calls (each run of a sweep its own); the best program "
                             "found when they run out. Needs each model's price (DSPy's or litellm's map; localhost models "
                             "cost 0) and --max-tokens")
    parser.add_argument("--max-wall-s", type=float,
                        help="a deadline in seconds for the search (each run of a sweep its own): the best program "
                             "found by then")
    parser.add_argument("--max-tokens", dest="task_max_tokens", type=int, default=d.get("task_max_tokens"),
                        help="the task LM's max_tokens (bounds a call's cost for --max-cost-usd)")
    parser.add_argument("--reflection-max-tokens", type=int, default=d.get("reflection_max_tokens"),
                        help="the reflection LM's max_tokens")


def add_run_commands(commands: Any) -> None:
    optimize = commands.add_parser("optimize", help="optimize a task program with BatchedGEPA")
    optimize.add_argument("task", help=f"one of {', '.join(TASKS)}")
    optimize.add_argument("--p", type=parents_flag, default=AUTO,
                          help="parents per step, or 'auto': as many proposals in flight as --workers, within the "
                               "budget (default: %(default)s, BatchedGEPA's)")
    optimize.add_argument("--n", type=int, default=1, help="mutations per parent (default: %(default)s, BatchedGEPA's)")
    optimize.add_argument("--corpus", help="hover: JSONL passages to search (BM25 index built beside it once)")
    _run_options(optimize)
    optimize.set_defaults(handler=optimize_command)

    sweep_parser = commands.add_parser("sweep", help="one nested MLflow run per P×N config, then the comparison table")
    sweep_parser.add_argument("task", help=f"one of {', '.join(TASKS)}")
    sweep_parser.add_argument("--configs", default="1x1,2x2,8x1", help="P×N settings, e.g. 1x1,2x2,8x1")
    sweep_parser.add_argument("--corpus", help="hover: JSONL passages to search")
    sweep_parser.add_argument("--sweep-name", help="parent run name (default: TASK-sweep)")
    _run_options(sweep_parser)
    sweep_parser.set_defaults(handler=sweep_command, p=1, n=1)

    demo = commands.add_parser("demo", help="embedded end-to-end run: local models on GSM8K, no API key")
    demo.add_argument("--p", type=int, default=DEMO_DEFAULTS["p"])
    demo.add_argument("--n", type=int, default=DEMO_DEFAULTS["n"])
    _run_options(demo, demo=True)
    demo.set_defaults(handler=demo_command)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dspy-pxn", description="DSPy's GEPA with P×N parallel proposals.")
    commands = parser.add_subparsers(dest="command", required=True)

    plan = commands.add_parser("plan", help="rank P×N settings by predicted wall-clock (the runtime model)")
    plan.add_argument("--workers", type=int, required=True, help="W: concurrent rollouts (num_threads)")
    plan.add_argument("--budget", type=int, help="B: max_metric_calls (or --max-cost-usd)")
    plan.add_argument("--max-cost-usd", type=float,
                      help="a budget in dollars: the metric calls it buys at --cost-per-call-usd (or the --from-run "
                           "run's cost per metric call, reflections included); with --budget, the smaller binds")
    plan.add_argument("--cost-per-call-usd", type=float,
                      help="dollars per metric call, reflection included, without --from-run")
    plan.add_argument("--val-size", type=int, required=True, help="|val|: validation examples")
    plan.add_argument("--minibatch-size", type=int,
                      help="reflection minibatch (default: BatchedGEPA's, 3 at one proposal at a time and a quarter "
                           "of --val-size above it)")
    plan.add_argument("--from-run", metavar="RUN",
                      help="fit latencies and acceptance from a finished run: its log_dir or MLflow run id")
    plan.add_argument("--tracking-uri", help="MLflow tracking URI for --from-run RUN_ID (default: MLflow's)")
    plan.add_argument("--task-latency", type=float, default=ASSUMED_TASK_S, help="T_e in seconds, without --from-run")
    plan.add_argument("--reflection-latency", type=float, default=ASSUMED_REFLECTION_S,
                      help="T_r in seconds, without --from-run")
    plan.add_argument("--acceptance", type=float, default=ASSUMED_ACCEPTANCE,
                      help="share of children that beat their parent, without --from-run")
    plan.add_argument("--latency-p99-ratio", type=float,
                      help="a call's p99 time over its median, without --from-run (default 1: fixed call times; "
                           "hosted APIs are often near 4): batches wait for their slowest call")
    plan.add_argument("--shapes", help="P×N settings to rank, e.g. 1x1,2x2,8x1 (default: 16 shapes up to 32 wide, "
                                       "and on a wider pool every power-of-two width up to W/m)")
    plan.add_argument("--selection", default="all,best,merge",
                      help="selections to rank, comma-separated: all | best | merge | merge+best | k (top-k)")
    plan.add_argument("--schedules", default="steps,async", help="schedules to rank: steps, async or both")
    plan.add_argument("--min-generations", type=float,
                      help="the pick needs at least this many generations (default: half of what 1×1 reaches)")
    plan.add_argument("--top", type=int, default=10, help="rows to show")
    plan.set_defaults(handler=plan_command)

    compare = commands.add_parser("compare", help="plots and a table comparing an experiment's runs (MLflow)")
    compare.add_argument("--experiment", required=True, help="MLflow experiment name")
    compare.add_argument("--out", default="comparison", help="directory for the PNGs and comparison.md")
    compare.add_argument("--tracking-uri", help="MLflow tracking URI (default: MLflow's, e.g. ./mlflow.db)")
    compare.add_argument("--sweep", metavar="PARENT_RUN_ID", help="compare only the children of this sweep run")
    compare.set_defaults(handler=compare_command)

    mlflow_import = commands.add_parser("mlflow-import", help="replay a run's log_dir into MLflow")
    mlflow_import.add_argument("log_dir", help="the run's (or sweep's) log_dir")
    mlflow_import.add_argument("--tracking-uri", help="destination (default: where the run was tracked)")
    mlflow_import.add_argument("--experiment", help="destination experiment (default: the run's)")
    mlflow_import.set_defaults(handler=import_command)
    add_run_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (UsageError, ValueError, ImportError) as error:  # an ImportError here names the extra to install
        print(f"dspy-pxn {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
