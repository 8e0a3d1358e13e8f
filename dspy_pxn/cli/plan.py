"""`dspy-pxn plan`, `compare` and `mlflow-import`: the runtime model's ranking, and MLflow's runs read back."""

from __future__ import annotations

import argparse
import math
import os
import re
import tempfile
from dataclasses import replace

from dspy_pxn.cli.errors import UsageError
from dspy_pxn.cli.output import duration
from dspy_pxn.engine.records import STEP_LOG_NAME, StepRecord, read_step_log
from dspy_pxn.engine.width import REFLECTION_EXAMPLES, auto_width, rows_reflection_reads, screening_minibatch
from dspy_pxn.ledger.budget import RunShape
from dspy_pxn.planning import RuntimeModel, parse_shapes, shapes_for
from dspy_pxn.planning.measured import KEEPS_HELD_OUT, measured
from dspy_pxn.proposer.selection import parse as parse_selection

# Without a finished run to fit, the planner assumes the paper's regime: reflection 4x a
# task call, and LiveBench-Math's 1×1 acceptance (17% of iterations validated).
ASSUMED_TASK_S = 1.0
ASSUMED_REFLECTION_S = 4.0
ASSUMED_ACCEPTANCE = 0.17


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
        raise UsageError("reading an MLflow run needs mlflow: pip install 'dspy-pxn[mlflow]'") from None
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
    return (f"fit check on that run ({first.p}×{first.n}): its {len(steps)} steps took {duration(measured)}; "
            f"the model predicts {predicted.iterations} steps in {duration(model_steps)} "
            f"({(model_steps - measured) / measured:+.0%})")



def cost_per_call(steps: list[StepRecord]) -> float | None:
    """Dollars per metric call in a finished run, its reflections and merges included; None if unpriced."""
    calls = sum(step.metric_calls for step in steps)
    costs = [step.cost_usd for step in steps if step.cost_usd is not None]
    return sum(costs) / calls if costs and calls else None


def budget_bought(args: argparse.Namespace, steps: list[StepRecord] | None) -> tuple[int, str]:
    """The metric-call budget to plan for, and how a dollar budget came to it."""
    if args.max_cost_usd is None:
        if args.budget is None:
            raise UsageError("plan needs a budget: --budget METRIC_CALLS or --max-cost-usd DOLLARS.")
        return args.budget, ""
    if args.max_cost_usd <= 0:
        raise UsageError(f"--max-cost-usd must be above 0, got {args.max_cost_usd}.")
    per_call = args.cost_per_call_usd if args.cost_per_call_usd is not None else (
        cost_per_call(steps) if steps else None)
    if per_call is None or per_call <= 0:
        raise UsageError("--max-cost-usd needs what a metric call costs: --cost-per-call-usd DOLLARS (a rollout's LM "
                         "calls plus its share of reflection), or --from-run a finished run with priced models.")
    bought = int(args.max_cost_usd / per_call)
    budget = min(bought, args.budget) if args.budget is not None else bought
    return budget, (f"${args.max_cost_usd:g} buys {bought} metric calls at ${per_call:.3g} per call (reflection "
                    f"included)" + (f"; --budget {args.budget} binds first" if budget < bought else ""))


def plan_command(args: argparse.Namespace) -> int:
    if args.latency_p99_ratio is not None and not args.latency_p99_ratio >= 1:
        raise UsageError(f"--latency-p99-ratio must be at least 1 (a call's p99 time over its median), got "
                         f"{args.latency_p99_ratio:g}; use 1 for fixed call times.")
    if args.from_run and args.latency_p99_ratio is not None:
        raise UsageError("--latency-p99-ratio describes assumed call times; a run given with --from-run was fitted "
                         "from its measured times, which already include their spread: pass one or the other.")
    steps = steps_from_run(args.from_run, args.tracking_uri) if args.from_run else None
    budget, bought = budget_bought(args, steps)
    shape = RunShape(workers=args.workers, budget=budget, val_size=args.val_size,
                     minibatch_size=args.minibatch_size or screening_minibatch(budget, args.val_size))

    def at_width(width: int) -> RunShape:
        """The shape a setting of this width runs: BatchedGEPA's minibatch for it unless --minibatch-size."""
        m = args.minibatch_size or (REFLECTION_EXAMPLES if width == 1 else shape.minibatch_size)
        return replace(shape, minibatch_size=m)

    fit_check = ""
    if steps:
        model = RuntimeModel.fit(steps)
        source = f"fitted from {args.from_run}"
        fit_check = describe_fit(model, steps)
    else:
        model = RuntimeModel(task_s=args.task_latency, reflection_s=args.reflection_latency,
                             acceptance=args.acceptance, latency_p99_ratio=args.latency_p99_ratio or 1.0)
        source = "assumed (pass --from-run LOG_DIR to fit a finished run)"
    shapes = parse_shapes(args.shapes) if args.shapes else shapes_for(shape)
    settings = [(schedule.strip(), parse_selection(selection))
                for schedule in args.schedules.split(",") for selection in args.selection.split(",")]
    staged = rows_reflection_reads(args.minibatch_size)  # fewer than m where the minibatch is left to the optimizer
    predictions = [model.predict(p, n, at_width(p * n), selection, schedule, staged)
                   for schedule, selection in settings for p, n in shapes]
    front = model.front(predictions)
    ranked = (front + sorted((pr for pr in predictions if pr not in front), key=lambda pr: pr.wall_s))[: args.top]
    reference = model.predict(1, 1, at_width(1), "all")
    wide = auto_width(shape)  # BatchedGEPA() with no p, n, ...: its width, at its minibatch
    defaults = (model.predict(wide, 1, shape, "merge", "async", staged) if wide > 1
                else model.predict(1, 1, at_width(1), "all", "steps"))
    if not any(same_setting(pr, defaults) for pr in ranked):
        ranked.append(defaults)
    target = args.min_generations if args.min_generations is not None else reference.generations / 2
    # Only a setting measured to keep dspy.GEPA's held-out score is picked over the defaults.
    eligible = [pr for pr in predictions if pr.generations >= target and keeps_held_out(pr, shape.workers)]
    pick = min([*eligible, defaults], key=lambda pr: pr.wall_s)
    if not any(same_setting(pr, pick) for pr in ranked):
        ranked.append(pick)

    spread = f", p99/p50 {model.latency_p99_ratio:g} (T_e and T_r are medians)" if model.latency_p99_ratio > 1 else ""
    print(f"model {source}: T_e={model.task_s:.3g} s, T_r={model.reflection_s:.3g} s, "
          f"acceptance a={model.acceptance:.3f}, step overhead {model.step_overhead_s:.3g} s{spread}")
    print(f"W={shape.workers}, B={shape.budget}, |val|={shape.val_size}, m={shape.minibatch_size}; "
          f"floor B*T_e/W = {duration(model.floor(shape))}; 1×1 reaches {reference.generations:.1f} generations")
    if bought:
        print(bought)
    if fit_check:
        print(fit_check)
    print("\nSettings on the front (no other is both faster and deeper) first, fastest first, and BatchedGEPA's\n"
          "defaults; generations are the times the pool grows, the depth a search can reach at this budget; chain\n"
          "depth is what is left of it where each improvement builds on the last (proposals in flight when the\n"
          "next improvement is found were started before it: on such a task they are lost).\n"
          "The model predicts time, not quality: 'held-out' is the setting's held-out score minus dspy.GEPA's as the\n"
          "benchmarks measured it (paired by seed, pooled over landscapes; docs/benchmarks.md), 'at W k' where\n"
          "measured on another pool (not picked here), or 'never measured'.\n")
    print("| rank | schedule | P×N | selection | predicted wall | x floor | generations | chain depth | iterations "
          "| binds | front | held-out |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for rank, pr in enumerate(ranked, 1):
        label = "defaults" if same_setting(pr, defaults) else str(rank)
        print(f"| {label} | {pr.schedule} | {pr.p}×{pr.n} | {pr.selection} | {duration(pr.wall_s)} | {pr.x_floor:.2f} "
              f"| {pr.generations:.1f} | {pr.chain_depth:.1f} | {pr.iterations} | {pr.binding} "
              f"| {'yes' if pr in front else ''} "
              f"| {held_out_cell(pr, same_setting(pr, defaults), shape.workers)} |")
    print(f"\ndefaults: p='auto' runs {pr_name(defaults)} here (one proposal per worker, within the budget): "
          f"{duration(defaults.wall_s)}, {defaults.x_floor:.2f}x the floor, {defaults.generations:.1f} generations "
          f"({defaults.chain_depth:.1f} where each improvement builds on the last; 1×1: {reference.chain_depth:.1f}).")
    print(f"pick {pr_name(pick)}: " + (
        f"the fastest of the defaults and the settings measured to keep dspy.GEPA's held-out score (within "
        f"{-KEEPS_HELD_OUT:g}) with at least {target:.1f} generations (--min-generations; default half of 1×1's): "
        f"{duration(pick.wall_s)}, {pick.generations:.1f} generations, bound by {pick.binding}"
        + (" (the defaults)." if same_setting(pick, defaults) else ".")))
    return 0


def same_setting(prediction, other) -> bool:
    return (prediction.schedule, prediction.p, prediction.n, prediction.selection) == (
        other.schedule, other.p, other.n, other.selection)


def keeps_held_out(prediction, workers: int) -> bool:
    found = measured(prediction.schedule, prediction.p, prediction.n, prediction.selection)
    return found is not None and found.keeps_held_out and found.measured_on(workers)


def held_out_cell(prediction, is_defaults: bool, workers: int) -> str:
    """What the benchmarks measured of the setting's held-out score against dspy.GEPA's, and on which pool where it
    was not this one; for the defaults' row, ``p="auto"``'s (the width it comes to may have been measured on its
    own too)."""
    found = (measured(prediction.schedule, "auto", 1, prediction.selection) if is_defaults else None) or measured(
        prediction.schedule, prediction.p, prediction.n, prediction.selection)
    if found is None:
        return "never measured"
    elsewhere = "" if found.measured_on(workers) else " at W " + "/".join(map(str, found.pools or ()))
    return f"measured {found.held_out:+.3f}{elsewhere}"


def pr_name(prediction) -> str:
    return f"{prediction.p}×{prediction.n} {prediction.selection} ({prediction.schedule})"


def compare_command(args: argparse.Namespace) -> int:
    from dspy_pxn.tracking.compare import compare_experiment
    from dspy_pxn.tracking.config import require_mlflow

    require_mlflow("dspy-pxn compare")
    comparison = compare_experiment(args.experiment, args.out, args.tracking_uri, parent_run_id=args.sweep)
    print(comparison.table)
    print(f"\nwrote {comparison.table_path} and {', '.join(comparison.plots)}")
    return 0


def import_command(args: argparse.Namespace) -> int:
    from dspy_pxn.tracking import import_step_log
    from dspy_pxn.tracking.config import require_mlflow

    require_mlflow("dspy-pxn mlflow-import")
    try:
        imported = import_step_log(args.log_dir, args.tracking_uri, args.experiment)
    except FileNotFoundError as error:
        raise UsageError(str(error)) from None
    for run in imported:
        action = "completed" if run.resumed else "created"
        print(f"{run.log_dir}: {action} MLflow run {run.run_id} ({run.steps_logged} steps logged)")
    return 0
