"""`dspy-pxn` command line: one subcommand per job, each a thin shell over a library function."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from dspy_pxn.runtime_model import DEFAULT_SHAPES, RunShape, RuntimeModel, parse_shapes
from dspy_pxn.steps import STEP_LOG_NAME, StepRecord, read_step_log
from dspy_pxn.teleprompter import CACHE_WARNING_RATIO

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


# ============================================================================ optimize / sweep / demo
# Why these live here: each is a thin shell over BatchedGEPA + programs/, and every check below
# runs before any LM call, so a mistake costs the user a second, not a started model or a bill.

TASKS = ("math", "hover", "gsm8k", "sim")
# `sim` needs no key and no network: dspy-pxn's latency server answers the synthetic rule task on loopback.
SIM_REFLECTION_FACTOR = 4.0  # a reflection call takes this many task calls' time, as in the paper's regime
DEFAULT_TIMEOUT_S = 600.0  # per LM call: a slow local reflector needs minutes; a hung request must not hold a worker forever


@dataclass
class Task:
    """A task's program, GEPA feedback metric and (train, val, test) examples, ready to compile."""

    name: str
    program: Any
    metric: Callable[..., Any]
    train: list[Any]
    val: list[Any]
    test: list[Any]


@dataclass(frozen=True)
class RunOutcome:
    """What the summary prints: the optimized program, its results, and the seed's held-out score."""

    program: Any
    seed_test: float | None
    program_path: str
    tracking_uri: str | None
    experiment: str | None


def _subsample(examples: list[Any], size: int | None, seed: int) -> list[Any]:
    """The first-drawn ``size`` examples of a fixed seeded shuffle, in their original order."""
    if size is None or size >= len(examples):
        return list(examples)
    keep = sorted(random.Random(seed).sample(range(len(examples)), size))
    return [examples[i] for i in keep]


def _check_data_dir(data_dir: str | None) -> None:
    if data_dir is not None and not os.path.isdir(data_dir):
        raise UsageError(f"--data-dir {data_dir!r} is not a directory; point it at the folder holding "
                         "livebench_math/, hover/ and gsm8k/ (or set DSPY_PXN_DATA_DIR).")


def _data_error(task: str, error: Exception) -> UsageError:
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    for library_words, flag in (("data_dir=PATH", "--data-dir PATH"), ("online=True", "--online")):
        first = first.replace(library_words, flag)  # the loaders speak Python; this user typed flags
    return UsageError(f"{task}: {first}")


def load_task(args: argparse.Namespace) -> Task:
    """Build the task's program and data, turning missing files into one-line usage errors."""
    if args.task not in TASKS:
        raise UsageError(f"unknown task {args.task!r}: choose one of {', '.join(TASKS)}.")
    if args.task == "hover" and not args.corpus:
        raise UsageError("hover needs --corpus PATH: a JSONL file of {\"title\", \"text\"} passages, e.g. the "
                         "2017 Wikipedia abstracts (python -m dspy_pxn.programs.retrieval download --dest DIR).")
    _check_data_dir(args.data_dir)
    try:
        program, metric, (train, val, test) = _TASK_LOADERS[args.task](args)
    except (FileNotFoundError, ImportError) as error:
        raise _data_error(args.task, error) from None
    sizes = (args.train_size, args.val_size, args.test_size)
    train, val, test = (_subsample(part, size, args.seed) for part, size in zip((train, val, test), sizes))
    return Task(args.task, program, metric, train, val, test)


def _load_math(args: argparse.Namespace):
    from dspy_pxn.programs.math_solver import MathSolver, load_livebench_math, metric

    return MathSolver(), metric, load_livebench_math(args.data_dir, online=args.online)


def _load_hover(args: argparse.Namespace):
    from dspy_pxn.programs.hover import HoverAgent, load_hover, metric
    from dspy_pxn.programs.retrieval import open_index

    if not os.path.isfile(args.corpus):
        raise UsageError(f"--corpus {args.corpus!r} is not a file; pass a JSONL file of {{\"title\", \"text\"}} lines.")
    return HoverAgent(open_index(corpus=args.corpus)), metric, load_hover(args.data_dir, online=args.online)


def _load_gsm8k(args: argparse.Namespace):
    from dspy_pxn.programs.gsm8k import GSM8KSolver, load_gsm8k, metric

    sizes = {"n_train": args.train_size or 200, "n_val": args.val_size or 50, "n_test": args.test_size or 200}
    return GSM8KSolver(), metric, load_gsm8k(args.data_dir, online=args.online, seed=args.seed, **sizes)


def _load_sim(args: argparse.Namespace):
    from dspy_pxn import simulation as sim

    sizes = {"train": args.train_size or 60, "val": args.val_size or 30, "test": args.test_size or 100}
    return sim.seed_program(), sim.metric, sim.make_splits(seed=args.seed, **sizes)


_TASK_LOADERS: dict[str, Callable[[argparse.Namespace], tuple]] = {
    "math": _load_math, "hover": _load_hover, "gsm8k": _load_gsm8k, "sim": _load_sim,
}


def probe_endpoint(url: str, flag: str = "--api-base", timeout: float = 5.0) -> None:
    """Fail now, in one line, when nothing answers at ``url``: otherwise every rollout would fail later.

    Any HTTP answer (even 401/404) means a server is there; only a refused or timed-out
    connection is an error. Loopback is probed without any configured proxy.
    """
    import urllib.error
    import urllib.parse
    import urllib.request

    host = urllib.parse.urlparse(url).hostname or ""
    if not host:
        raise UsageError(f"{flag} {url!r} is not a URL; write it like http://127.0.0.1:8000/v1.")
    loopback = host in ("127.0.0.1", "localhost", "::1")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({})) if loopback else urllib.request.build_opener()
    try:
        opener.open(url.rstrip("/") + "/models", timeout=timeout).close()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise UsageError(f"{flag} {url} is unreachable ({reason}); start the server or fix the URL.") from None


def build_role_lm(spec: str, role: str, api_base: str | None, args: argparse.Namespace, flag: str = "--api-base",
                  **kw: Any):
    """``build_lm`` plus the CLI's endpoint handling: ``api_base`` is probed before any model starts."""
    from dspy_pxn.lms import build_lm, parse_spec
    from dspy_pxn.local_lm import LocalLMError

    settings: dict[str, Any] = {"timeout": args.timeout, "cache": args.cache, **kw}
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


def check_shape(args: argparse.Namespace) -> None:
    """Bad P, N, W or budget: say which and how, before data or models load."""
    for flag, value in (("--p", args.p), ("--n", args.n), ("--workers", args.workers), ("--budget", args.budget)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} {value} must be a positive integer (P×N = parents × mutations per step, "
                             "e.g. --p 2 --n 2).")


BAR_WIDTH = 20


def budget_bar(used: int, budget: int) -> str:
    """The budget spent so far as a bar: a run ends when its metric calls do, not after N steps."""
    filled = min(BAR_WIDTH, round(BAR_WIDTH * used / budget)) if budget > 0 else 0
    return "[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]"


def progress_line(record: StepRecord) -> str:
    """One line per step: where the budget is, how good the best program is, what this step kept."""
    return (f"step {record.step:>3} {budget_bar(record.metric_calls_total, record.budget)} "
            f"metric calls {record.metric_calls_total:>5}/{record.budget} | "
            f"best val {record.best_val:.3f} | accepted {record.accepted}/{record.proposals} | "
            f"{record.wall_s:.1f} s")


def _printer(out: TextIO) -> Callable[[StepRecord], None]:
    def sink(record: StepRecord) -> None:
        print(progress_line(record), file=out, flush=True)

    return sink


def default_log_dir(task: str, p: int, n: int) -> str:
    return os.path.join("runs", f"{task}-{p}x{n}-{time.strftime('%Y%m%d-%H%M%S')}")


def make_optimizer(args: argparse.Namespace, task: Task, reflection_lm: Any, p: int, n: int, log_dir: str,
                   out: TextIO, run_name: str | None = None):
    from dspy_pxn import BatchedGEPA

    tracking: dict[str, Any] = {"mlflow": False}
    if not args.no_mlflow:
        tracking = {"mlflow": True, "tracking_uri": args.mlflow_uri, "experiment": args.experiment or f"dspy-pxn-{task.name}",
                    "run_name": run_name or f"{task.name}-{p}x{n}", "run_tags": {"task": task.name}}
    return BatchedGEPA(
        metric=task.metric, p=p, n=n, max_metric_calls=args.budget, num_threads=args.workers,
        reflection_lm=reflection_lm, reflection_minibatch_size=args.minibatch_size, seed=args.seed,
        selection=_selection(args.selection), log_dir=log_dir, testset=task.test or None,
        # Small models often break DSPy's output format; the reflector must see that to fix it.
        add_format_failure_as_feedback=not args.no_format_feedback,
        step_sinks=[_printer(out)], **tracking,
    )


def _selection(text: str) -> str | int:
    return int(text) if text.isdigit() else text


def seed_test_score(task: Task, workers: int) -> float | None:
    """The unoptimized program on the same held-out set, so the summary compares like with like."""
    from dspy_pxn.holdout import holdout_score
    from dspy_pxn.pool import ThreadWorkerPool

    if not task.test:
        return None
    pool = ThreadWorkerPool(workers)
    try:
        return holdout_score(task.program, task.test, task.metric, pool)
    finally:
        pool.close()


def run_one(args: argparse.Namespace, task: Task, reflection_lm: Any, p: int, n: int, log_dir: str,
            out: TextIO, run_name: str | None = None) -> RunOutcome:
    optimizer = make_optimizer(args, task, reflection_lm, p, n, log_dir, out, run_name)
    print(f"{task.name} {p}×{n}: W={args.workers}, budget {args.budget} metric calls, |train|={len(task.train)}, "
          f"|val|={len(task.val)}, |test|={len(task.test)}; validating the seed program ...", file=out, flush=True)
    best = optimizer.compile(task.program, trainset=task.train, valset=task.val)
    results = best.detailed_results
    # No candidate beat the seed: the returned program is the seed, so one test score serves both
    # (a second evaluation would only measure the LM's nondeterminism, and cost the time again).
    seed_test = results.test_score if results.best_idx == 0 else seed_test_score(task, args.workers)
    program_path = os.path.join(log_dir, "program.json")
    best.save(program_path)
    uri = None if args.no_mlflow else (args.mlflow_uri or _default_uri())
    return RunOutcome(best, seed_test, program_path, uri, optimizer.tracking.experiment if optimizer.tracking else None)


def _default_uri() -> str:
    import mlflow

    return mlflow.get_tracking_uri()


def _score(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def summary(outcome: RunOutcome) -> str:
    """Seed vs optimized on val and test, time, calls, cost, instructions, and where everything went."""
    results = outcome.program.detailed_results
    seed_val, best_val = results.val_aggregate_scores[0], results.val_aggregate_scores[results.best_idx]
    usage = results.usage
    cost = (f"${usage.cost_usd:.4f}" if usage.cost_usd is not None
            else "n/a (no price for these models in litellm's map; local models are free)")
    lines = [
        "",
        "== summary ==",
        f"val:  seed {_score(seed_val)} -> optimized {_score(best_val)}",
        f"test: seed {_score(outcome.seed_test)} -> optimized {_score(results.test_score)}",
        (f"wall-clock {_duration(results.wall_s)} (search), {len(results.steps)} steps, "
         f"{results.total_metric_calls}/{results.budget} metric calls, {len(results.candidates)} candidates"),
        f"cost {cost}; {usage.lm_calls} LM calls, {usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens",
        *([f"note: only {usage.lm_calls} LM calls for {results.total_metric_calls} metric calls: most answers came "
           "from DSPy's cache (--cache), so the wall-clock and cost above are not a fresh run's."]
          if usage.lm_calls < CACHE_WARNING_RATIO * results.total_metric_calls else []),
        "optimized instructions:",
    ]
    for name, predictor in outcome.program.named_predictors():
        text = predictor.signature.instructions.strip().replace("\n", "\n    ")
        lines.append(f"  [{name}]\n    {text}")
    if results.best_idx == 0:
        lines.append("  (no proposal beat the seed: the optimized program is the seed program)")
    lines.append(f"saved program: {outcome.program_path} (load with program.load(path))")
    if results.mlflow_run_id:
        lines.append(f"MLflow run {results.mlflow_run_id} in experiment {outcome.experiment!r} at {outcome.tracking_uri} "
                     f"(browse: mlflow ui --backend-store-uri {outcome.tracking_uri})")
    elif outcome.tracking_uri:
        lines.append(f"MLflow tracking did not reach {outcome.tracking_uri}; import later with "
                     f"dspy-pxn mlflow-import {os.path.dirname(outcome.program_path)}")
    return "\n".join(lines)


def _prepare(args: argparse.Namespace, resources: contextlib.ExitStack) -> tuple[Task, Any]:
    """Every check, then data, then LMs (the slow or billable part) last.

    ``resources`` owns what the run needs until it ends: the simulated LM server of ``sim``.
    """
    from dspy_pxn.lms import parse_spec

    check_shape(args)
    if args.lm is None and args.task != "sim":
        raise UsageError(f"{args.task} needs --lm (a litellm model string, or local) and --reflection-lm; only "
                         "the sim task starts its own simulated LM.")
    if args.lm is None or args.reflection_lm is None:
        if args.lm is not None or args.reflection_lm is not None:
            raise UsageError("pass both --lm and --reflection-lm, or neither (sim only: the simulated LM).")
    else:
        for spec in (args.lm, args.reflection_lm):
            parse_spec(spec)  # a typo in a model name fails before data or models load
    task = load_task(args)
    from dspy_pxn.strategies import BudgetGuard

    smallest = BudgetGuard(args.budget, len(task.val), args.minibatch_size).smallest_budget()
    if args.budget < smallest:
        raise UsageError(f"--budget {args.budget} cannot pay for one step: the seed's validation ({len(task.val)}) "
                         f"plus one proposal screened on 2x{args.minibatch_size} examples and validated "
                         f"({len(task.val)}) needs {smallest}; raise --budget to at least {smallest} or lower "
                         "--val-size.")
    if args.lm is None:
        _start_simulated_lm(args, resources)
    if args.cache:
        _cache_per_endpoint(args.api_base)
    task_lm, reflection_lm = build_lms(args)
    import dspy

    dspy.configure(lm=task_lm)
    return task, reflection_lm


def _start_simulated_lm(args: argparse.Namespace, resources: contextlib.ExitStack) -> None:
    """The sim task's LMs: dspy-pxn's latency server on loopback, reached through litellm like any API."""
    from dspy_pxn.latency_server import LatencyServer

    if args.task_latency < 0:
        raise UsageError(f"--task-latency {args.task_latency} must be >= 0 seconds.")
    server = resources.enter_context(LatencyServer(task_latency=args.task_latency,
                                                   reflection_latency=SIM_REFLECTION_FACTOR * args.task_latency))
    args.lm, args.reflection_lm, args.api_base = "openai/sim-task", "openai/sim-reflection", server.base_url
    print(f"sim: simulated LM server at {server.base_url} (task call {args.task_latency:g} s, reflection "
          f"{SIM_REFLECTION_FACTOR * args.task_latency:g} s)", flush=True)


def _cache_per_endpoint(api_base: str | None) -> None:
    """--cache: DSPy's cache keys leave out the endpoint, so each endpoint gets its own disk cache;
    otherwise a run against one server would be answered with another server's replies."""
    if not api_base:
        return
    import hashlib

    import dspy
    from dspy.clients import DISK_CACHE_DIR

    folder = os.path.join(DISK_CACHE_DIR, "endpoints", hashlib.sha256(api_base.encode()).hexdigest()[:16])
    dspy.configure_cache(disk_cache_dir=folder)


def optimize_command(args: argparse.Namespace) -> int:
    with contextlib.ExitStack() as resources:
        task, reflection_lm = _prepare(args, resources)
        log_dir = args.log_dir or default_log_dir(task.name, args.p, args.n)
        outcome = run_one(args, task, reflection_lm, args.p, args.n, log_dir, sys.stdout)
    print(summary(outcome), flush=True)
    return 0


def sweep_command(args: argparse.Namespace) -> int:
    from dspy_pxn.compare import compare_experiment
    from dspy_pxn.tracking import sweep

    if args.no_mlflow:
        raise UsageError("sweep records its runs as nested MLflow runs: drop --no-mlflow.")
    shapes = parse_shapes(args.configs)
    for p, n in shapes:
        args.p, args.n = p, n
        check_shape(args)
    resources = contextlib.ExitStack()
    task, reflection_lm = _prepare(args, resources)
    experiment = args.experiment or f"dspy-pxn-{task.name}"
    log_dir = args.log_dir or os.path.join("runs", f"{task.name}-sweep-{time.strftime('%Y%m%d-%H%M%S')}")
    with resources, sweep(args.sweep_name or f"{task.name}-sweep", experiment=experiment, tracking_uri=args.mlflow_uri,
               log_dir=log_dir) as current:
        for p, n in shapes:
            child = current.child_log_dir(f"{p}x{n}")
            outcome = run_one(args, task, reflection_lm, p, n, child, sys.stdout, run_name=f"{p}x{n}")
            results = outcome.program.detailed_results
            print(f"{p}x{n}: best val {_score(results.val_aggregate_scores[results.best_idx])}, "
                  f"test {_score(results.test_score)} (seed {_score(outcome.seed_test)}), "
                  f"{_duration(results.wall_s)}, program {outcome.program_path}\n", flush=True)
    if current.run_id is None:
        print(f"MLflow was unreachable; the runs are in {log_dir} (dspy-pxn mlflow-import {log_dir}).")
        return 0
    comparison = compare_experiment(experiment, os.path.join(log_dir, "comparison"), args.mlflow_uri,
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
    print(f"demo total (models, search, both test scores): {_duration(time.perf_counter() - started)}")
    return code


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
                        help="sim only: seconds per simulated task call (reflection takes 4x)")
    parser.add_argument("--api-base", help="OpenAI-compatible endpoint for API-model specs (probed before the run)")
    parser.add_argument("--reflection-api-base", help="endpoint for the reflection LM (default: --api-base)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per LM call")
    parser.add_argument("--workers", type=int, default=d.get("workers", 16), help="W: concurrent rollouts")
    parser.add_argument("--budget", type=int, default=d.get("budget", 300), help="B: max metric calls")
    parser.add_argument("--minibatch-size", type=int, default=d.get("minibatch_size", 3), help="reflection minibatch")
    parser.add_argument("--selection", default="all", help="all | best | k (top-k children validated per step)")
    parser.add_argument("--data-dir", help="folder with livebench_math/, hover/, gsm8k/ (default $DSPY_PXN_DATA_DIR)")
    parser.add_argument("--online", action="store_true",
                        help="download the data set from the Hugging Face hub instead (needs network and `datasets`)")
    for split in ("train", "val", "test"):
        parser.add_argument(f"--{split}-size", type=int, default=d.get(f"{split}_size"),
                            help=f"subsample the {split} split to this many examples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-format-feedback", action="store_true",
                        help="do not show output-format failures to the reflector (dspy.GEPA's default)")
    parser.add_argument("--mlflow-uri", help="MLflow tracking URI (default: MLflow's, i.e. ./mlflow.db)")
    parser.add_argument("--experiment", help="MLflow experiment (default: dspy-pxn-TASK)")
    parser.add_argument("--no-mlflow", action="store_true", help="do not track in MLflow (log_dir still has everything)")
    parser.add_argument("--log-dir", help="run directory: step log, program.json (default: runs/TASK-PxN-TIME)")
    parser.set_defaults(task_max_tokens=d.get("task_max_tokens"), reflection_max_tokens=d.get("reflection_max_tokens"))


def add_run_commands(commands: Any) -> None:
    optimize = commands.add_parser("optimize", help="optimize a task program with BatchedGEPA")
    optimize.add_argument("task", help=f"one of {', '.join(TASKS)}")
    optimize.add_argument("--p", type=int, default=2, help="parents per step")
    optimize.add_argument("--n", type=int, default=2, help="mutations per parent")
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
    add_run_commands(commands)
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
