"""`dspy-pxn optimize`, `sweep` and `demo`: thin shells over BatchedGEPA and the task programs.

Order of work: every check, then data, then LMs (the slow or billable part) last.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from typing import Any, TextIO

from dspy_pxn.cli.errors import UsageError
from dspy_pxn.cli.output import ProgressPrinter, RunOutcome, duration, score, summary
from dspy_pxn.cli.tasks import Task, check_shape, load_task
from dspy_pxn.engine.width import REFLECTION_EXAMPLES
from dspy_pxn.planning import parse_shapes
from dspy_pxn.proposer.selection import parse as parse_selection

SIM_REFLECTION_FACTOR = 4.0  # a reflection call takes this many task calls' time, as in the paper's regime
DEFAULT_TIMEOUT_S = 600.0  # per LM call: a slow local reflector needs minutes; a hung request must not hold a worker forever


def default_log_dir(task: str, p: int, n: int) -> str:
    return os.path.join("runs", f"{task}-{p}x{n}-{time.strftime('%Y%m%d-%H%M%S')}")


def make_optimizer(args: argparse.Namespace, task: Task, reflection_lm: Any, p: int, n: int, log_dir: str,
                   out: TextIO, run_name: str | None = None, registered_model_name: str | None = None):
    from dspy_pxn import BatchedGEPA
    from dspy_pxn.tracking import MlflowTracker

    tracker = MlflowTracker(args.tracking_uri, args.experiment or f"dspy-pxn-{task.name}",
                            run_name or f"{task.name}-{p}x{n}", (("task", task.name),),
                            registered_model_name=registered_model_name) if tracked(args) else False
    given = {"reflection_minibatch_size": args.minibatch_size}  # BatchedGEPA's own default where the flag is unset
    return BatchedGEPA(
        metric=task.metric, p=p, n=n, max_metric_calls=args.budget, num_threads=args.workers,
        reflection_lm=reflection_lm, seed=args.seed, **{name: value for name, value in given.items() if value is not None},
        selection=parse_selection(args.selection) if args.selection else None, schedule=args.schedule,
        log_dir=log_dir,
        # Small models often break DSPy's output format; the reflector must see that to fix it.
        add_format_failure_as_feedback=not args.no_format_feedback, gepa_kwargs={"callbacks": [ProgressPrinter(out)]},
        max_cost_usd=args.max_cost_usd, max_wall_s=args.max_wall_s, tracker=tracker,
    )


def seed_test_score(task: Task, workers: int) -> float | None:
    """The unoptimized program on the same held-out set, so the summary compares like with like."""
    from dspy_pxn.pools import ThreadWorkerPool
    from dspy_pxn.targets.program.holdout import holdout_score

    if not task.test:
        return None
    pool = ThreadWorkerPool(workers)
    try:
        return holdout_score(task.program, task.test, task.metric, pool)
    finally:
        pool.close()


def run_one(args: argparse.Namespace, task: Task, reflection_lm: Any, p: int, n: int, log_dir: str,
            out: TextIO, run_name: str | None = None, registered_model_name: str | None = None) -> RunOutcome:
    optimizer = make_optimizer(args, task, reflection_lm, p, n, log_dir, out, run_name, registered_model_name)
    budget = f"budget {args.budget} metric calls" if args.budget else "budget auto='light'"
    print(f"{task.name} {p}×{n}: W={workers(args)}, {budget}, |train|={len(task.train)}, "
          f"|val|={len(task.val)}, |test|={len(task.test)}; validating the seed program ...", file=out, flush=True)
    best = optimizer.compile(task.program, trainset=task.train, valset=task.val, testset=task.test or None)
    results = best.detailed_results
    # No candidate beat the seed: the returned program is the seed, so one test score serves both
    # (a second evaluation would only measure the LM's nondeterminism, and cost the time again).
    seed_test = results.test_score if results.best_idx == 0 else seed_test_score(task, workers(args))
    program_path = os.path.join(log_dir, "program.json")
    best.save(program_path)
    uri = (args.tracking_uri or _default_uri()) if tracked(args) else None
    experiment = getattr(optimizer.settings.tracker, "experiment", None)
    return RunOutcome(best, seed_test, program_path, uri, experiment, *logged_run(uri, results.mlflow_run_id))


def workers(args: argparse.Namespace) -> int:
    """W: ``--workers``, else DSPy's ``num_threads``, as BatchedGEPA reads it."""
    import dspy

    return args.workers or dspy.settings.num_threads or 1


def tracked(args: argparse.Namespace) -> bool:
    """Whether a run is tracked in MLflow: unless --no-mlflow, and MLflow is installed (a core install runs
    untracked, and says once how to track)."""
    from dspy_pxn.tracking.config import INSTALL_HINT, mlflow_installed

    if args.no_mlflow:
        return False
    if not mlflow_installed():
        if not getattr(args, "said_untracked", False):
            print(f"MLflow tracking is off: mlflow is not installed ({INSTALL_HINT} to track runs).", flush=True)
            args.said_untracked = True
        return False
    return True


def logged_run(tracking_uri: str | None, run_id: str | None) -> tuple[str | None, str | None]:
    """The run's optimized program as an MLflow model URI and the run's experiment id (None: not logged, or MLflow
    is not reachable)."""
    if tracking_uri is None or run_id is None:
        return None, None
    from mlflow import MlflowClient

    from dspy_pxn.tracking import MODEL_TAG

    try:
        run = MlflowClient(tracking_uri).get_run(run_id)
    except Exception:  # noqa: BLE001 - the summary says where the run is either way
        return None, None
    return run.data.tags.get(MODEL_TAG), run.info.experiment_id


def _default_uri() -> str:
    import mlflow

    return mlflow.get_tracking_uri()


def build_role_lm(spec: str, role: str, api_base: str | None, args: argparse.Namespace, flag: str = "--api-base",
                  **kw: Any):
    """``build_lm`` plus the CLI's endpoint handling: ``api_base`` is probed before any model starts."""
    from dspy_pxn.local import LocalLMError, build_lm, parse_spec, probe_endpoint

    settings: dict[str, Any] = {"timeout": args.timeout, "cache": args.cache, **kw}
    if args.engine != "auto":  # DSPy's default engine is what a user's own dspy.LM(...) gets
        settings["engine"] = args.engine
    if api_base and not parse_spec(spec).local:
        probe_endpoint(api_base, flag)
        settings["api_base"] = api_base
    try:
        return build_lm(spec, role=role, **settings)  # type: ignore[arg-type]
    except LocalLMError as error:
        raise UsageError(f"--{'reflection-' if role == 'reflection' else ''}lm {spec}: {error}") from None


def build_lms(args: argparse.Namespace) -> tuple[Any, Any]:
    """The task and reflection LMs; a local spec named twice shares one server (see lms.local_server)."""
    task_kw = {"max_tokens": args.task_max_tokens} if getattr(args, "task_max_tokens", None) else {}
    refl_kw = {"max_tokens": args.reflection_max_tokens} if getattr(args, "reflection_max_tokens", None) else {}
    task_lm = build_role_lm(args.lm, "task", args.api_base, args, **task_kw)
    reflection_flag = "--reflection-api-base" if args.reflection_api_base else "--api-base"
    reflection_lm = build_role_lm(args.reflection_lm, "reflection", args.reflection_api_base or args.api_base, args,
                                  reflection_flag, **refl_kw)
    return task_lm, reflection_lm


def _prepare(args: argparse.Namespace, resources: contextlib.ExitStack) -> tuple[Task, Any]:
    """Every check, then data, then LMs (the slow or billable part) last.

    ``resources`` owns what the run needs until it ends: the simulated LM server of ``sim``.
    """
    from dspy_pxn.local import cache_per_endpoint, parse_spec

    check_shape(args)
    if args.lm is None and args.task != "sim":
        raise UsageError(f"{args.task} needs --lm (a litellm model string, or local) and --reflection-lm; only "
                         "the sim task starts its own simulated LM.")
    _check_simulated_only(args)
    if args.lm is None or args.reflection_lm is None:
        if args.lm is not None or args.reflection_lm is not None:
            raise UsageError("pass both --lm and --reflection-lm, or neither (sim only: the simulated LM).")
    else:
        for spec in (args.lm, args.reflection_lm):
            parse_spec(spec)  # a typo in a model name fails before data or models load
    task = load_task(args)
    from dspy_pxn.ledger.budget import BudgetGuard

    # As the library's guard: a first proposal the budget cannot pay for in full may screen fewer examples.
    guard = BudgetGuard(args.budget or 1, len(task.val), args.minibatch_size or REFLECTION_EXAMPLES,
                        shrinks=args.minibatch_size is None)
    rows, smallest = guard.fewest_rows(), guard.smallest_budget()
    if args.budget is not None and args.budget < smallest:
        raise UsageError(f"--budget {args.budget} cannot pay for one step: the seed's validation ({len(task.val)}) "
                         f"plus one proposal screened on 2x{rows} examples and validated "
                         f"({len(task.val)}) needs {smallest}; raise --budget to at least {smallest} or lower "
                         "--val-size.")
    if args.lm is None:
        _start_simulated_lm(args, resources)
    if args.cache:
        cache_per_endpoint(args.api_base)
    task_lm, reflection_lm = build_lms(args)
    import dspy

    dspy.configure(lm=task_lm)
    return task, reflection_lm


def _check_simulated_only(args: argparse.Namespace) -> None:
    """--landscape and --latency shape the simulated LM; with a real --lm they would be silently ignored."""
    simulated_settings = {"--landscape": (args.landscape, "depth"), "--latency": (args.latency, "fixed")}
    for flag, (value, default) in simulated_settings.items():
        if args.lm is not None and value != default:
            raise UsageError(f"{flag} {value} shapes the simulated LM of the sim task; drop it, or drop --lm and "
                             "--reflection-lm to use the simulated LM.")


def _start_simulated_lm(args: argparse.Namespace, resources: contextlib.ExitStack) -> None:
    """The sim task's LMs: dspy-pxn's latency server on loopback, reached through dspy.LM like any API."""
    from dspy_pxn.testing import LatencyServer

    if args.task_latency < 0:
        raise UsageError(f"--task-latency {args.task_latency} must be >= 0 seconds.")
    server = resources.enter_context(LatencyServer(task_latency=args.task_latency,
                                                   reflection_latency=SIM_REFLECTION_FACTOR * args.task_latency,
                                                   landscape=args.landscape, latency=args.latency, seed=args.seed))
    args.lm, args.reflection_lm, args.api_base = "openai/sim-task", "openai/sim-reflection", server.base_url
    # The default run prints what it always printed; other settings are named after it.
    extras = f", {args.latency} latencies around these medians" if args.latency != "fixed" else ""
    extras += f", landscape {args.landscape}" if args.landscape != "depth" else ""
    print(f"sim: simulated LM server at {server.base_url} (task call {args.task_latency:g} s, reflection "
          f"{SIM_REFLECTION_FACTOR * args.task_latency:g} s{extras})", flush=True)


def optimize_command(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as resources:
        task, reflection_lm = _prepare(args, resources)
        log_dir = args.log_dir or default_log_dir(task.name, args.p, args.n)
        outcome = run_one(args, task, reflection_lm, args.p, args.n, log_dir, sys.stdout,
                          registered_model_name=args.register_model)
    print(summary(outcome), flush=True)
    return 0


def sweep_command(args: argparse.Namespace) -> int:
    from dspy_pxn.tracking import sweep
    from dspy_pxn.tracking.compare import compare_experiment

    if args.no_mlflow:
        raise UsageError("sweep records its runs as nested MLflow runs: drop --no-mlflow.")
    from dspy_pxn.tracking.config import INSTALL_HINT, mlflow_installed

    if not mlflow_installed():
        raise UsageError(f"sweep records its runs as nested MLflow runs, and mlflow is not installed: {INSTALL_HINT}.")
    shapes = parse_shapes(args.configs)
    for p, n in shapes:
        args.p, args.n = p, n
        check_shape(args)
    resources = contextlib.ExitStack()
    task, reflection_lm = _prepare(args, resources)
    experiment = args.experiment or f"dspy-pxn-{task.name}"
    log_dir = args.log_dir or os.path.join("runs", f"{task.name}-sweep-{time.strftime('%Y%m%d-%H%M%S')}")
    # The sweep registers its best child's program once, at the end, rather than every child's.
    with resources, sweep(args.sweep_name or f"{task.name}-sweep", experiment=experiment, tracking_uri=args.tracking_uri,
               log_dir=log_dir, registered_model_name=args.register_model) as current:
        for p, n in shapes:
            child = current.child_log_dir(f"{p}x{n}")
            outcome = run_one(args, task, reflection_lm, p, n, child, sys.stdout, run_name=f"{p}x{n}")
            results = outcome.program.detailed_results
            print(f"{p}x{n}: best val {score(results.val_aggregate_scores[results.best_idx])}, "
                  f"test {score(results.test_score)} (seed {score(outcome.seed_test)}), "
                  f"{duration(results.wall_s)}, program {outcome.program_path}\n", flush=True)
    if current.run_id is None:
        print(f"MLflow was unreachable; the runs are in {log_dir} (dspy-pxn mlflow-import {log_dir}).")
        return 0
    comparison = compare_experiment(experiment, os.path.join(log_dir, "comparison"), args.tracking_uri,
                                     parent_run_id=current.run_id)
    print(comparison.table)
    print(f"\nsweep run {current.run_id} in experiment {experiment!r}; wrote {comparison.table_path}")
    return 0


# The embedded demo: sized so it finishes in <= 15 min on a 2-core machine (benchmarks/results/demo.md).
DEMO_DEFAULTS: dict[str, Any] = {
    "lm": "local", "reflection_lm": "local:qwen2.5-coder-1.5b", "p": 2, "n": 1, "workers": 4, "budget": 40,
    "train_size": 24, "val_size": 8, "test_size": 20, "minibatch_size": 3, "task_max_tokens": 512,
    "reflection_max_tokens": 768,
}


def demo_command(args: argparse.Namespace) -> int:
    """GSM8K with the embedded local models: ``optimize gsm8k`` with sizes that fit 15 minutes."""
    args.task, args.corpus = "gsm8k", None
    started = time.perf_counter()
    print(f"dspy-pxn demo: task LM {args.lm}, reflection LM {args.reflection_lm}, GSM8K "
          f"{args.train_size}/{args.val_size}/{args.test_size}, {args.p}×{args.n}, budget {args.budget}", flush=True)
    code = optimize_command(args)
    print(f"demo total (models, search, both test scores): {duration(time.perf_counter() - started)}")
    return code
