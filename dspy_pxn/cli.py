"""`dspy-pxn` command line: one subcommand per job, each a thin shell over a library function."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from dspy_pxn.runtime_model import DEFAULT_SHAPES, RunShape, RuntimeModel, parse_shapes
from dspy_pxn.steps import STEP_LOG_NAME, StepRecord, read_step_log

# Without a finished run to fit, the planner assumes the paper's regime: reflection 4x a
# task call, and LiveBench-Math's 1×1 acceptance (17% of iterations validated).
ASSUMED_TASK_S = 1.0
ASSUMED_REFLECTION_S = 4.0
ASSUMED_ACCEPTANCE = 0.17


class UsageError(Exception):
    """A mistake the user can fix from the message alone; printed as one line, exit code 2."""


def steps_from_run(run: str) -> list[StepRecord]:
    """Step records of a finished run: a log_dir, or its steps.jsonl."""
    path = run[: -len(STEP_LOG_NAME)] if run.endswith(STEP_LOG_NAME) else run
    if not os.path.isdir(path or "."):
        raise UsageError(f"--from-run {run!r} is not a directory; pass the log_dir of a finished BatchedGEPA run.")
    steps = read_step_log(path or ".")
    if not steps:
        raise UsageError(f"--from-run {run!r} has no {STEP_LOG_NAME}; run BatchedGEPA(..., log_dir=...) first.")
    return steps


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes = seconds / 60
    return f"{minutes:.1f} min" if minutes < 120 else f"{minutes / 60:.2f} h"


def plan_command(args: argparse.Namespace) -> int:
    shape = RunShape(workers=args.workers, budget=args.budget, val_size=args.val_size,
                     minibatch_size=args.minibatch_size)
    if args.from_run:
        model = RuntimeModel.fit(steps_from_run(args.from_run))
        source = f"fitted from {args.from_run}"
    else:
        model = RuntimeModel(task_s=args.task_latency, reflection_s=args.reflection_latency,
                             acceptance=args.acceptance)
        source = "assumed (pass --from-run LOG_DIR to fit a finished run)"
    shapes = parse_shapes(args.shapes) if args.shapes else list(DEFAULT_SHAPES)
    selection = int(args.selection) if args.selection.isdigit() else args.selection
    ranked = model.plan(shape, shapes, selection)[: args.top]

    print(f"model {source}: T_e={model.task_s:.3g} s, T_r={model.reflection_s:.3g} s, "
          f"acceptance a={model.acceptance:.3f}, step overhead {model.step_overhead_s:.3g} s")
    print(f"W={shape.workers}, B={shape.budget}, |val|={shape.val_size}, m={shape.minibatch_size}, "
          f"selection={ranked[0].selection}; floor B*T_e/W = {_duration(model.floor(shape))}\n")
    print("| rank | P×N | predicted wall | x floor | iterations | validation-trigger | metric calls | binds |")
    print("|---|---|---|---|---|---|---|---|")
    for rank, p in enumerate(ranked, 1):
        print(f"| {rank} | {p.p}×{p.n} | {_duration(p.wall_s)} | {p.x_floor:.2f} | {p.iterations} "
              f"| {p.validation_trigger_fraction:.2f} | {p.metric_calls:.0f} | {p.binding} |")
    best = ranked[0]
    print(f"\npick {best.p}×{best.n}: {_duration(best.wall_s)}, {best.iterations} iterations; "
          f"bound by {best.binding}.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dspy-pxn", description="DSPy's GEPA with P×N parallel proposals.")
    commands = parser.add_subparsers(dest="command", required=True)

    plan = commands.add_parser("plan", help="rank P×N settings by predicted wall-clock (the runtime model)")
    plan.add_argument("--workers", type=int, required=True, help="W: concurrent rollouts (num_threads)")
    plan.add_argument("--budget", type=int, required=True, help="B: max_metric_calls")
    plan.add_argument("--val-size", type=int, required=True, help="|val|: validation examples")
    plan.add_argument("--minibatch-size", type=int, default=3, help="reflection minibatch (default 3)")
    plan.add_argument("--from-run", metavar="LOG_DIR", help="fit latencies and acceptance from a finished run")
    plan.add_argument("--task-latency", type=float, default=ASSUMED_TASK_S, help="T_e in seconds, without --from-run")
    plan.add_argument("--reflection-latency", type=float, default=ASSUMED_REFLECTION_S,
                      help="T_r in seconds, without --from-run")
    plan.add_argument("--acceptance", type=float, default=ASSUMED_ACCEPTANCE,
                      help="share of children that beat their parent, without --from-run")
    plan.add_argument("--shapes", help="P×N settings to rank, e.g. 1x1,2x2,8x1 (default: 16 shapes up to 32 wide)")
    plan.add_argument("--selection", default="all", help="all | best | k (top-k)")
    plan.add_argument("--top", type=int, default=10, help="rows to show")
    plan.set_defaults(handler=plan_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (UsageError, ValueError) as error:
        print(f"dspy-pxn {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
