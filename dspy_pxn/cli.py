"""`dspy-pxn` command line: one subcommand per job, each a thin shell over a library function."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
import tempfile
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


def steps_from_run(run: str, tracking_uri: str | None = None) -> list[StepRecord]:
    """Step records of a finished run: a log_dir, its steps.jsonl, or an MLflow run id."""
    path = run[: -len(STEP_LOG_NAME)] if run.endswith(STEP_LOG_NAME) else run
    if not os.path.isdir(path or "."):
        if re.fullmatch(r"[0-9a-f]{32}", run):
            return steps_from_mlflow(run, tracking_uri)
        raise UsageError(
            f"--from-run {run!r} is neither a directory nor an MLflow run id; pass the log_dir of a finished "
            "BatchedGEPA run or the run id MLflow shows."
        )
    steps = read_step_log(path or ".")
    if not steps:
        raise UsageError(f"--from-run {run!r} has no {STEP_LOG_NAME}; run BatchedGEPA(..., log_dir=...) first.")
    return steps


def steps_from_mlflow(run_id: str, tracking_uri: str | None) -> list[StepRecord]:
    """The step log a tracked run stored as an artifact (every tracked run has one)."""
    try:
        import mlflow
    except ImportError:
        raise UsageError("reading an MLflow run needs mlflow: pip install -e '.[mlflow]'") from None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            local = mlflow.artifacts.download_artifacts(
                run_id=run_id, artifact_path=STEP_LOG_NAME, dst_path=tmp, tracking_uri=tracking_uri
            )
        except Exception as error:  # noqa: BLE001 - any MLflow failure is the same user mistake
            raise UsageError(
                f"--from-run {run_id}: cannot read {STEP_LOG_NAME} from MLflow ({type(error).__name__}); "
                "check --tracking-uri and the run id."
            ) from None
        steps = read_step_log(os.path.dirname(local))
    if not steps:
        raise UsageError(f"--from-run {run_id}: the run's {STEP_LOG_NAME} is empty; did it finish a step?")
    return steps


def describe_fit(model: RuntimeModel, steps: list[StepRecord]) -> str:
    """Predicted vs measured for the fitted run itself, so the user sees how far to trust the plan."""
    first, last = steps[0], steps[-1]
    if not (first.num_workers and first.val_size and first.minibatch_size and first.started_at):
        return ""
    shape = RunShape(workers=first.num_workers, budget=first.budget, val_size=first.val_size,
                     minibatch_size=first.minibatch_size)
    predicted = model.predict(first.p, first.n, shape)
    seed_validation = math.ceil(shape.val_size / shape.workers) * model.task_s
    measured = last.started_at + last.wall_s - first.started_at
    model_steps = predicted.wall_s - seed_validation
    return (f"fit check on that run ({first.p}×{first.n}): its {len(steps)} steps took {_duration(measured)}; "
            f"the model predicts {predicted.iterations} steps in {_duration(model_steps)} "
            f"({(model_steps - measured) / measured:+.0%})")


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes = seconds / 60
    return f"{minutes:.1f} min" if minutes < 120 else f"{minutes / 60:.2f} h"


def plan_command(args: argparse.Namespace) -> int:
    shape = RunShape(workers=args.workers, budget=args.budget, val_size=args.val_size,
                     minibatch_size=args.minibatch_size)
    fit_check = ""
    if args.from_run:
        steps = steps_from_run(args.from_run, args.tracking_uri)
        model = RuntimeModel.fit(steps)
        source = f"fitted from {args.from_run}"
        fit_check = describe_fit(model, steps)
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
          f"selection={ranked[0].selection}; floor B*T_e/W = {_duration(model.floor(shape))}")
    if fit_check:
        print(fit_check)
    print()
    print("| rank | P×N | predicted wall | x floor | iterations | validation-trigger | metric calls | binds |")
    print("|---|---|---|---|---|---|---|---|")
    for rank, p in enumerate(ranked, 1):
        print(f"| {rank} | {p.p}×{p.n} | {_duration(p.wall_s)} | {p.x_floor:.2f} | {p.iterations} "
              f"| {p.validation_trigger_fraction:.2f} | {p.metric_calls:.0f} | {p.binding} |")
    best = ranked[0]
    print(f"\npick {best.p}×{best.n}: {_duration(best.wall_s)}, {best.iterations} iterations; "
          f"bound by {best.binding}.")
    return 0


def compare_command(args: argparse.Namespace) -> int:
    from dspy_pxn.compare import compare_experiment

    comparison = compare_experiment(args.experiment, args.out, args.tracking_uri, parent_run_id=args.sweep)
    print(comparison.table)
    print(f"\nwrote {comparison.table_path} and {', '.join(comparison.plots)}")
    return 0


def import_command(args: argparse.Namespace) -> int:
    from dspy_pxn.tracking import import_step_log

    try:
        imported = import_step_log(args.log_dir, args.tracking_uri, args.experiment)
    except FileNotFoundError as error:
        raise UsageError(str(error)) from None
    for run in imported:
        action = "completed" if run.resumed else "created"
        print(f"{run.log_dir}: {action} MLflow run {run.run_id} ({run.steps_logged} steps logged)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dspy-pxn", description="DSPy's GEPA with P×N parallel proposals.")
    commands = parser.add_subparsers(dest="command", required=True)

    plan = commands.add_parser("plan", help="rank P×N settings by predicted wall-clock (the runtime model)")
    plan.add_argument("--workers", type=int, required=True, help="W: concurrent rollouts (num_threads)")
    plan.add_argument("--budget", type=int, required=True, help="B: max_metric_calls")
    plan.add_argument("--val-size", type=int, required=True, help="|val|: validation examples")
    plan.add_argument("--minibatch-size", type=int, default=3, help="reflection minibatch (default 3)")
    plan.add_argument("--from-run", metavar="RUN",
                      help="fit latencies and acceptance from a finished run: its log_dir or MLflow run id")
    plan.add_argument("--tracking-uri", help="MLflow tracking URI for --from-run RUN_ID (default: MLflow's)")
    plan.add_argument("--task-latency", type=float, default=ASSUMED_TASK_S, help="T_e in seconds, without --from-run")
    plan.add_argument("--reflection-latency", type=float, default=ASSUMED_REFLECTION_S,
                      help="T_r in seconds, without --from-run")
    plan.add_argument("--acceptance", type=float, default=ASSUMED_ACCEPTANCE,
                      help="share of children that beat their parent, without --from-run")
    plan.add_argument("--shapes", help="P×N settings to rank, e.g. 1x1,2x2,8x1 (default: 16 shapes up to 32 wide)")
    plan.add_argument("--selection", default="all", help="all | best | k (top-k)")
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
