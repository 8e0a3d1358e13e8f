"""dspy-pxn's BatchedGepaPromptOptimizer against MLflow's own GEPA prompt optimizer, side by side, on a loopback LM.

What it measures, per config and seed: the wall of one ``mlflow.genai.optimize_prompts(predict_fn=...,
train_data=..., prompt_uris=[...], scorers=[...], optimizer=GepaPromptOptimizer(reflection_model=...,
max_metric_calls=B))`` call, as a user writes it, against the latency server of ``dspy_pxn.testing``
(a subprocess on loopback answering the synthetic rule-arithmetic task and gepa's reflection prompt,
with fixed latencies: ``--task-latency`` per predict_fn call, ``--reflection-latency`` per reflection).

- The registered prompt's template is the task's seed instruction (no variables: the question goes in as
  the predictor's input). predict_fn holds the prompt loaded once at setup (``mlflow.genai.load_prompt``)
  and per call formats it in its own thread and answers with a ``dspy.Predict("question -> answer")``
  whose instructions are the formatted text, on an uncached ``dspy.LM`` aimed at the server: the
  answer is right iff the rule's definition is in the instruction (``dspy_pxn.testing.responder``).
- The scorer is the task's own metric (``dspy_pxn.testing.metric``) as an ``mlflow.genai.scorers.scorer``:
  its score, and its feedback (which names a missed rule's definition) as the rationale gepa reflects on.
- The reflection model is a litellm model string, ``openai:/sim-reflection``, aimed at the same server
  by ``OPENAI_BASE_URL``/``OPENAI_API_BASE`` (and a dummy key): the server counts its calls.
- Tracking as by default (``enable_tracking=True``): an MLflow run in a sqlite store in a temp directory
  (created and migrated before the clock starts), every evaluated row traced into it (MLflow's eval
  turns DSPy autologging on); ``--no-tracing`` calls ``mlflow.tracing.disable()`` first, to see what the
  trace store costs. Tracing off also changes the search: the rows' spans are no longer in the examples
  gepa's reflection reads, so its prompts differ and the simulated reflection's copy errors fall elsewhere.

Recorded per run: wall (the ``optimize_prompts`` call), this process's CPU seconds over it (every thread; the
latency server is another process: a run whose CPU is near its wall is bound by its own CPU, such as a traced run's
trace export, not by its schedule), the optimizer's own part of the wall and the part spent in candidate evaluations
(MLflow's eval_fn), the latency floor (the run's waits alone, one after another: each evaluation in waves of
``MLFLOW_GENAI_EVAL_MAX_WORKERS`` rows at T_e, each reflection T_r), predict_fn calls (counted in predict_fn under a
lock; MLflow's one pre-flight trace check is counted apart) against the budget, the server's task and reflection
calls and peak concurrency, MLflow's initial and final eval score (gepa's val aggregate on the train rows), held-out
accuracy of the seed and final templates (``--test`` questions, answered instantly by the in-process simulated LM),
the final template, and the store's size.
Where the optimizer's own part of the wall went (``wall_split``, printed per config): its rows (predict_fn calls,
client side, timed in epoch seconds) spread over the row pool (busy / W, the wall of a pool that never idles at
the rows' own times), and the pool's idle time split, as ``bench_pool_idle.py`` splits a DSPy run's, at the end
of the seed's validation and at the start of the last reflection (the server's timeline of its calls).
A second optimizer is one more entry in ``CONFIGS`` (name -> factory of the optimizer object).

    python benchmarks/bench_mlflow_prompts.py                        # both, 30 rows, T_e 0.2 s, T_r 0.8 s, B 300, 1 seed
    python benchmarks/bench_mlflow_prompts.py --no-tracing --seeds 10 --out benchmarks/results/mlflow_prompts_notrace.json
    python benchmarks/bench_mlflow_prompts.py --store server --seeds 3 --out benchmarks/results/mlflow_prompts_server.json
    python benchmarks/bench_mlflow_prompts.py --rows 6 --budget 20 --task-latency 0 --reflection-latency 0   # smoke
    python benchmarks/bench_mlflow_prompts.py --no-tracing --seeds 3 --rows-alone   # and the rows with no optimizer

Each optimizer runs at its defaults (only the class differs), both with MLflow's evaluation width
(``MLFLOW_GENAI_EVAL_MAX_WORKERS``, 10) as the rows in flight. Results go to
benchmarks/results/mlflow_prompts.json unless ``--out`` says otherwise.
"""

from __future__ import annotations

import os

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm must not fetch its cost map mid-run

import argparse
import functools
import json
import logging
import math
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any

import dspy

from dspy_pxn import testing as sim
from dspy_pxn.testing.bill import PRICE_PAIR, dollars, from_server

RESULTS = Path(__file__).parent / "results"
PROMPT_NAME = "rule_arithmetic"
REFLECTION_MODEL = "openai:/sim-reflection"  # MLflow's "<provider>:/<model>"; litellm's openai/sim-reflection
SIGNATURE = dspy.Signature("question -> answer")

# (budget, reflection model, seed) -> an mlflow.genai.optimize BasePromptOptimizer.
OptimizerFactory = Callable[[int, str, int], Any]


def _mlflow_gepa(budget: int, reflection_model: str, seed: int) -> Any:
    """MLflow's GepaPromptOptimizer at its defaults, with gepa's own seed (a documented gepa_kwargs entry)."""
    from mlflow.genai.optimize import GepaPromptOptimizer

    return GepaPromptOptimizer(reflection_model=reflection_model, max_metric_calls=budget, gepa_kwargs={"seed": seed})


def _batched(budget: int, reflection_model: str, seed: int, **settings: Any) -> Any:
    """dspy-pxn's BatchedGepaPromptOptimizer at its defaults (only the class changed), or with ``settings``."""
    from dspy_pxn.tracking import BatchedGepaPromptOptimizer

    gepa_kwargs = {"seed": seed, **settings.pop("gepa_kwargs", {})}
    return BatchedGepaPromptOptimizer(reflection_model=reflection_model, max_metric_calls=budget,
                                      gepa_kwargs=gepa_kwargs, **settings)


def split_configs(text: str) -> list[str]:
    """The comma-separated configs, a comma inside a config's ``{...}`` settings kept."""
    configs, depth, current = [], 0, ""
    for char in text:
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            configs.append(current.strip())
            current = ""
        else:
            current += char
    return [*configs, current.strip()] if current.strip() else configs


def optimizer_for(config: str, budget: int, reflection_model: str, seed: int) -> Any:
    """A config's optimizer: a ``CONFIGS`` name, or ``BatchedGepaPromptOptimizer{...}`` with its settings as JSON
    (e.g. ``BatchedGepaPromptOptimizer{"p": 3}``), to measure a setting a user would pass."""
    name, _, settings = config.partition("{")
    return CONFIGS[name](budget, reflection_model, seed, **(json.loads("{" + settings) if settings else {}))


CONFIGS: dict[str, OptimizerFactory] = {
    "mlflow.GepaPromptOptimizer": _mlflow_gepa,
    "BatchedGepaPromptOptimizer": _batched,
}


class CallCounter:
    """predict_fn's calls, counted and timed (epoch seconds, as the server's timeline) from MLflow's row threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rows: list[tuple[float, float]] = []

    @property
    def calls(self) -> int:
        """Calls finished so far (a row is logged as it ends, raised or not)."""
        with self._lock:
            return len(self.rows)

    @contextmanager
    def row(self) -> Iterator[None]:
        started = time.time()
        try:
            yield
        finally:
            with self._lock:
                self.rows.append((started, time.time()))


def make_predict_fn(prompt: Any, task_lm: dspy.BaseLM, counter: CallCounter) -> Callable[[str], str]:
    """predict_fn as MLflow's docs write it: the prompt loaded once outside, ``format()`` per call (in the calling
    thread, where MLflow installs the candidate), the formatted text as the predictor's instructions."""

    def predict_fn(question: str) -> str:
        with counter.row():
            instructions = prompt.format()
            predictor = dspy.Predict(SIGNATURE.with_instructions(instructions))
            with dspy.context(lm=task_lm):
                return predictor(question=question).answer

    return predict_fn


@contextmanager
def environment(**values: str) -> Iterator[None]:
    """Set environment variables for the block, then put back what was there."""
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def tracking_store(directory: Path, tracing: bool, server: bool = False) -> Iterator[str]:
    """A fresh sqlite tracking and registry store with its artifacts in ``directory`` and an experiment set
    (migrations run here, before the clock); tracing disabled for the block unless ``tracing``. ``server``: the
    same sqlite store behind a real ``mlflow server`` on loopback (one worker), reached over HTTP. MLflow's
    URIs, experiment and tracing state are put back afterwards (``mlflow_state_restored``)."""
    import mlflow

    from dspy_pxn.testing.mlflow_server import MlflowServer
    from dspy_pxn.testing.mlflow_state import mlflow_state_restored

    with mlflow_state_restored():
        running = MlflowServer(str(directory)).start() if server else None
        uri = running.uri if running is not None else f"sqlite:///{directory / 'mlflow.db'}"
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
        artifacts = None if running is not None else (directory / "artifacts").as_uri()
        experiment_id = mlflow.create_experiment("bench-mlflow-prompts", artifact_location=artifacts)
        mlflow.set_experiment(experiment_id=experiment_id)
        if not tracing:
            mlflow.tracing.disable()
        try:
            yield uri
        finally:
            if running is not None:
                running.kill()
            if not tracing:
                mlflow.tracing.enable()


def instrument(optimizer: Any, counter: CallCounter, marks: dict[str, float]) -> list[tuple[int, float]]:
    """Clock the optimizer's own part of the call (``marks``: start, end, the start in epoch seconds, predict_fn
    calls before it) and each candidate evaluation it asks for: the returned list fills with (rows, seconds) per
    eval_fn call. The eval_fn the optimizer gets is MLflow's, wrapped (``functools.wraps``: MLflow's own is its
    ``__wrapped__``)."""
    optimize, evaluations = optimizer.optimize, []

    def timed_optimize(eval_fn: Callable[..., Any] | None, *rest: Any, **kw: Any) -> Any:
        @functools.wraps(eval_fn)
        def timed_eval_fn(candidate: dict[str, str], dataset: list[dict[str, Any]]) -> Any:
            started = time.perf_counter()
            try:
                return eval_fn(candidate, dataset)
            finally:
                evaluations.append((len(dataset), time.perf_counter() - started))

        marks["calls_before"], marks["start"], marks["start_epoch"] = counter.calls, time.perf_counter(), time.time()
        try:
            return optimize(timed_eval_fn if eval_fn is not None else None, *rest, **kw)
        finally:
            marks["end"] = time.perf_counter()

    optimizer.optimize = timed_optimize
    return evaluations


def latency_floor_s(evaluations: list[tuple[int, float]], reflections: int, workers: int,
                    args: argparse.Namespace) -> float:
    """The run's waits alone, one after another as MLflow's GEPA makes them: each evaluation in waves of
    ``workers`` rows (MLflow's row pool) at T_e, each reflection T_r. What is left is everything else."""
    return sum(math.ceil(rows / workers) for rows, _ in evaluations) * args.task_latency \
        + reflections * args.reflection_latency


def store_size(directory: Path) -> dict[str, int]:
    """Bytes on disk (the sqlite file and artifacts) and traces stored."""
    size = sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())
    try:
        with sqlite3.connect(directory / "mlflow.db") as db:
            traces = db.execute("SELECT COUNT(*) FROM trace_info").fetchone()[0]
    except sqlite3.Error:
        traces = -1
    return {"store_bytes": size, "traces": traces}


def held_out(template: str, test: list[dspy.Example], landscape: str) -> float:
    """Accuracy of a template on held-out questions, answered instantly by the in-process simulated LM."""
    predictor = dspy.Predict(SIGNATURE.with_instructions(template))
    with dspy.context(lm=sim.SimulatedLM(landscape=landscape)):
        return statistics.mean(sim.score(example, predictor(question=example.question)) for example in test)


def run_one(config: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One optimize_prompts call: a fresh server and store, the clock around the call only."""
    import litellm  # noqa: F401 - imported now so its start-up (seconds) is not billed to the first reflection
    import mlflow
    from mlflow.environment_variables import MLFLOW_GENAI_EVAL_MAX_WORKERS

    train, _, test = sim.make_splits(seed=seed, train=args.rows, val=1, test=args.test)
    train_data = [{"inputs": {"question": example.question}, "outputs": example.answer} for example in train]
    counter, marks = CallCounter(), {}
    with (tempfile.TemporaryDirectory(prefix="bench_mlflow_prompts_") as tmp,
          sim.LatencyServer(task_latency=args.task_latency, reflection_latency=args.reflection_latency,
                            landscape=args.landscape, latency="fixed", seed=seed) as server,
          environment(OPENAI_BASE_URL=server.base_url, OPENAI_API_BASE=server.base_url, OPENAI_API_KEY="sim"),
          tracking_store(Path(tmp), tracing=not args.no_tracing, server=args.store == "server")):
        server.warm_up()
        registered = mlflow.genai.register_prompt(name=PROMPT_NAME, template=sim.seed_instruction())
        prompt = mlflow.genai.load_prompt(registered.uri)  # once, at setup, as MLflow's docs show
        predict_fn = make_predict_fn(prompt, server.lm("task"), counter)
        optimizer = optimizer_for(config, args.budget, REFLECTION_MODEL, seed)
        evaluations = instrument(optimizer, counter, marks)
        server.reset_stats()
        start, cpu_start = time.perf_counter(), time.process_time()
        result = mlflow.genai.optimize_prompts(predict_fn=predict_fn, train_data=train_data,
                                               prompt_uris=[registered.uri], scorers=[sim.mlflow_scorer()],
                                               optimizer=optimizer)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        stats, timeline = server.stats(), server.timeline()
        stored = store_size(Path(tmp))
    final = result.optimized_prompts[0].template
    optimize_s = marks["end"] - marks["start"]
    workers = MLFLOW_GENAI_EVAL_MAX_WORKERS.get()
    where = wall_split(counter.rows, timeline, marks["start_epoch"], optimize_s, args.rows, workers)
    # MLflow's optimizer: its waits one after another. One that never calls eval_fn (it evaluates rows itself, on
    # a pool of the same width): the runtime model's floor, its rows' waits spread over the pool, B*T_e/W.
    floor = (latency_floor_s(evaluations, stats["calls"]["reflection"], workers, args) if evaluations
             else (counter.calls - marks["calls_before"]) * args.task_latency / workers)
    return {
        "config": config, "seed": seed, "tracing": not args.no_tracing, "store": args.store, "wall_s": wall,
        "cpu_s": cpu,
        "optimize_s": optimize_s, "eval_s": sum(seconds for _, seconds in evaluations), "floor_s": floor,
        "x_floor": optimize_s / floor if floor > 0 else None, "evaluations": len(evaluations),
        "full_evaluations": sum(rows == args.rows for rows, _ in evaluations), "budget": args.budget,
        "predict_calls": counter.calls - marks["calls_before"], "predict_calls_setup": marks["calls_before"],
        "server_task_calls": stats["calls"]["task"], "reflection_calls": stats["calls"]["reflection"],
        "bill": from_server(stats), "usd": dollars(from_server(stats)),
        "max_in_flight": stats["max_in_flight"], "clients": stats["clients"],
        "initial_score": result.initial_eval_score, "final_score": result.final_eval_score,
        "held_out_seed": held_out(sim.seed_instruction(), test, args.landscape),
        "held_out_final": held_out(final, test, args.landscape), "final_template": final, **stored, **where,
    }


def wall_split(rows: list[tuple[float, float]], timeline: list[tuple[str, float, float]], start: float,
               optimize_s: float, seed_rows: int, workers: int) -> dict[str, float]:
    """Where the optimizer's own part of the wall went: its rows' time (predict_fn, client side, CPU included)
    spread over the row pool, and the pool's idle time split at the seed's validation's end (its first
    ``seed_rows`` rows) and the last reflection's start (the server's timeline). One rule for both optimizers:
    ``bench_pool_idle.idle_split``."""
    from bench_pool_idle import idle_split  # benchmarks/ is the script's own directory

    end = start + optimize_s
    inside = [(s - start, e - start) for s, e in rows if start <= s < end]  # not MLflow's pre-flight row
    reflections = [s - start for kind, s, _ in timeline if kind == "reflection" and start <= s < end]
    return {**idle_split(inside, reflections, seed_rows, optimize_s, workers),
            "reflection_s": sum(e - s for kind, s, e in timeline if kind == "reflection")}


def rows_alone(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The run's rows with no optimizer: ``--budget`` predict_fn calls and scorings of the seed template, on
    MLflow's evaluation width of threads, against a fresh server. The floor any optimizer of that budget and
    width has on this machine, CPU included (``B·T_e/W`` counts the waits only)."""
    from concurrent.futures import ThreadPoolExecutor

    from mlflow.environment_variables import MLFLOW_GENAI_EVAL_MAX_WORKERS

    train, _, _ = sim.make_splits(seed=seed, train=args.rows, val=1, test=1)
    scorer, counter = sim.mlflow_scorer(), CallCounter()

    class SeedPrompt:
        @staticmethod
        def format() -> str:
            return sim.seed_instruction()

    with sim.LatencyServer(task_latency=args.task_latency, reflection_latency=args.reflection_latency,
                           landscape=args.landscape, latency="fixed", seed=seed) as server:
        server.warm_up()
        predict_fn = make_predict_fn(SeedPrompt(), server.lm("task"), counter)

        def row(index: int) -> Any:
            example = train[index % len(train)]
            return scorer(inputs={"question": example.question}, outputs=predict_fn(example.question),
                          expectations={"expected_response": example.answer})

        workers = MLFLOW_GENAI_EVAL_MAX_WORKERS.get()
        with ThreadPoolExecutor(workers) as threads:
            start = time.perf_counter()
            list(threads.map(row, range(args.budget)))
            wall = time.perf_counter() - start
    return {"config": "rows alone", "seed": seed, "wall_s": wall, "rows": args.budget, "workers": workers,
            "floor_s": args.budget * args.task_latency / workers}


def summarise(rows: list[dict[str, Any]], configs: list[str]) -> list[dict[str, Any]]:
    """Means over seeds per config (max for the calls, so an overshoot of the budget shows)."""
    table = []
    for config in configs:
        mine = [r for r in rows if r["config"] == config]
        means = {key: statistics.mean(r[key] for r in mine) for key in (
            "wall_s", "optimize_s", "eval_s", "floor_s", "reflection_calls", "initial_score", "final_score",
            "held_out_final", "busy_over_w_s", "x_busy", "mean_call_s", "idle_seed_s", "idle_search_s",
            "idle_end_s")}
        cpus = [r["cpu_s"] for r in mine if r.get("cpu_s") is not None]  # files written before it was measured lack it
        means["cpu_s"] = statistics.mean(cpus) if cpus else None
        table.append({"config": config, "seeds": len(mine), **means,
                      "predict_calls_max": max(r["predict_calls"] for r in mine)})
    return table


def print_rows(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\n### mlflow.genai.optimize_prompts on the latency server (T_e {args.task_latency:g} s, "
          f"T_r {args.reflection_latency:g} s, B {args.budget}, {args.rows} rows, landscape {args.landscape}, "
          f"tracing {'off' if args.no_tracing else 'on'})\n")
    print("| config | seed | wall s | optimizer s | in evaluations s | latency floor s (x) | predict_fn calls / B | "
          "reflection calls | server task calls | peak in flight | initial → final score | held-out seed → final | "
          "traces | store MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        x_floor = f"{r['x_floor']:.2f}" if r["x_floor"] else "—"
        print(f"| {r['config']} | {r['seed']} | {r['wall_s']:.1f} | {r['optimize_s']:.1f} | {r['eval_s']:.1f} | "
              f"{r['floor_s']:.1f} ({x_floor}) | {r['predict_calls']} "
              f"(+{r['predict_calls_setup']}) / {r['budget']} | {r['reflection_calls']} | {r['server_task_calls']} | "
              f"{r['max_in_flight']['total']} | {r['initial_score']:.3f} → {r['final_score']:.3f} | "
              f"{r['held_out_seed']:.2f} → {r['held_out_final']:.2f} | {r['traces']} | {r['store_bytes'] / 1e6:.1f} |")
    for r in rows:
        print(f"\nfinal template, {r['config']} seed {r['seed']}:\n{r['final_template']}")


def print_wall_split(table: list[dict[str, Any]]) -> None:
    """Where each optimizer's own wall went, means over seeds (``wall_split``)."""
    print("\n### where the optimizer's wall went (seconds of the whole row pool, means over seeds)\n")
    print("| config | optimizer s | this process's CPU s | rows busy / W s | × busy | mean row s | idle: seed | search "
          "| end |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t in table:
        cpu = "—" if t["cpu_s"] is None else f"{t['cpu_s']:.2f}"
        print(f"| {t['config']} | {t['optimize_s']:.2f} | {cpu} | {t['busy_over_w_s']:.2f} | {t['x_busy']:.2f} | "
              f"{t['mean_call_s']:.3f} | {t['idle_seed_s']:.2f} | {t['idle_search_s']:.2f} | {t['idle_end_s']:.2f} |")


def compared(rows: list[dict[str, Any]], configs: list[str], against: str = "mlflow.GepaPromptOptimizer"
             ) -> list[dict[str, Any]]:
    """Each config against MLflow's optimizer, paired by seed (seeds are independent runs): speedup (their mean
    wall over ours, and per seed), the mean difference of the final and held-out scores with its standard error,
    and the bill (reflection calls, reflection tokens in, dollars at ``bill.PRICE_PAIR``) as ratios of means."""
    theirs = {r["seed"]: r for r in rows if r["config"] == against}
    out = []
    for config in configs:
        pairs = [(r, theirs[r["seed"]]) for r in rows if r["config"] == config and r["seed"] in theirs]
        if config == against or not pairs:
            continue

        def paired(key: str) -> tuple[float, float]:
            differences = [mine[key] - other[key] for mine, other in pairs]
            spread = statistics.stdev(differences) / math.sqrt(len(differences)) if len(differences) > 1 else 0.0
            return statistics.mean(differences), spread

        def ratio(read: Callable[[dict[str, Any]], float]) -> float:
            return statistics.mean(read(m) for m, _ in pairs) / max(statistics.mean(read(o) for _, o in pairs), 1e-12)

        out.append({
            "config": config, "seeds": len(pairs),
            "speedup": statistics.mean(o["wall_s"] for _, o in pairs) / statistics.mean(m["wall_s"] for m, _ in pairs),
            "speedup_per_seed": [o["wall_s"] / m["wall_s"] for m, o in pairs],
            "final": paired("final_score"), "held_out": paired("held_out_final"),
            "reflection_calls": ratio(lambda r: r["bill"]["reflection"]["calls"]),
            "reflection_in": ratio(lambda r: r["bill"]["reflection"]["prompt"]),
            "usd": ratio(lambda r: r["usd"]), "calls_max": max(m["predict_calls"] for m, _ in pairs),
        })
    return out


def print_compared(table: list[dict[str, Any]]) -> None:
    print("\n### against MLflow's GepaPromptOptimizer, paired by seed (dollars at "
          f"{PRICE_PAIR['task']} task / {PRICE_PAIR['reflection']} reflection)\n")
    print("| config | seeds | sooner (per seed) | final − MLflow's (se) | held-out − MLflow's (se) | "
          "reflection calls × | reflection in × | $ × |")
    print("|---|---|---|---|---|---|---|---|")
    for t in table:
        low, high = min(t["speedup_per_seed"]), max(t["speedup_per_seed"])
        print(f"| {t['config']} | {t['seeds']} | {t['speedup']:.2f}× ({low:.2f}-{high:.2f}) | "
              f"{t['final'][0]:+.3f} ({t['final'][1]:.3f}) | {t['held_out'][0]:+.3f} ({t['held_out'][1]:.3f}) | "
              f"{t['reflection_calls']:.2f} | {t['reflection_in']:.2f} | {t['usd']:.2f} |")


def import_autolog_integrations() -> None:
    """MLflow imports its autolog integrations lazily under a lock of its own, which a background thread of its
    prompt registry (``link_prompt_to_experiment``) can take in the other order: with a tracking server the two
    deadlocked here at the start of an ``optimize_prompts`` call (MLflow 3.17.2). Imported once, up front, on one
    thread, before any clock starts."""
    import mlflow.utils.databricks_utils  # noqa: F401
    from mlflow.models.evaluation.utils.trace import configure_autologging_for_evaluation

    with configure_autologging_for_evaluation(enable_tracing=True):
        pass


def main(argv: list[str] | None = None) -> dict[str, Any]:
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("mlflow", "gepa", "dspy", "litellm", "LiteLLM", "alembic", "httpx"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="BatchedGepaPromptOptimizer,mlflow.GepaPromptOptimizer",
                        help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--seeds", type=int, default=1, help="seeds 0 .. seeds-1 (data, gepa's seed)")
    parser.add_argument("--budget", type=int, default=300, help="max_metric_calls")
    parser.add_argument("--rows", type=int, default=30, help="train rows (gepa's valset too)")
    parser.add_argument("--test", type=int, default=100, help="held-out questions (instant, in process)")
    parser.add_argument("--task-latency", type=float, default=0.2, help="seconds per task LM call (one per predict_fn)")
    parser.add_argument("--reflection-latency", type=float, default=0.8, help="seconds per reflection call")
    parser.add_argument("--landscape", default="depth",
                        help="the simulated model's character: depth | breadth | chain, or a dspy_pxn.testing.Landscape's "
                             "fields as JSON (with a \"name\")")
    parser.add_argument("--no-tracing", action="store_true", help="mlflow.tracing.disable() for the run")
    parser.add_argument("--store", choices=["sqlite", "server"], default="sqlite",
                        help="where runs and traces go: a sqlite file, or that file behind `mlflow server` (HTTP)")
    parser.add_argument("--rows-alone", action="store_true",
                        help="also time the budget's rows with no optimizer (predict_fn + scorer on W threads)")
    parser.add_argument("--mlflow-rows-from", metavar="FILE",
                        help="take mlflow.GepaPromptOptimizer's rows for these seeds from an earlier results file (its "
                             "scores and calls are the same for a seed on every run) instead of running it again; "
                             "the configs are compared with them even when --configs leaves it out")
    parser.add_argument("--out", default=str(RESULTS / "mlflow_prompts.json"))
    args = parser.parse_args(argv)
    configs = split_configs(args.configs)
    if unknown := [c for c in configs if c.partition("{")[0] not in CONFIGS]:
        parser.error(f"unknown config(s) {unknown}: known {list(CONFIGS)}")

    from mlflow.environment_variables import MLFLOW_GENAI_EVAL_MAX_WORKERS

    import_autolog_integrations()
    earlier = json.loads(Path(args.mlflow_rows_from).read_text())["rows"] if args.mlflow_rows_from else []
    if earlier and "mlflow.GepaPromptOptimizer" not in configs:  # the reused runs are what the others are compared to
        configs.append("mlflow.GepaPromptOptimizer")
    reused = {r["seed"]: r for r in earlier if r["config"] == "mlflow.GepaPromptOptimizer"}
    rows = [reused[seed] if config == "mlflow.GepaPromptOptimizer" and seed in reused else run_one(config, args, seed)
            for seed in range(args.seeds) for config in configs]
    print_rows(rows, args)
    table = summarise(rows, configs)
    print_wall_split(table)
    comparison = compared(rows, configs)
    print_compared(comparison)
    alone = [rows_alone(args, seed) for seed in range(args.seeds)] if args.rows_alone else []
    for r in alone:
        print(f"\nrows alone, seed {r['seed']}: {r['rows']} rows on {r['workers']} threads in {r['wall_s']:.2f} s "
              f"(B·T_e/W {r['floor_s']:.1f} s)")
    report = {
        "args": vars(args),
        "environment": {"mlflow": version("mlflow"), "gepa": version("gepa"), "dspy": version("dspy"),
                        "litellm": version("litellm"),
                        "MLFLOW_GENAI_EVAL_MAX_WORKERS": MLFLOW_GENAI_EVAL_MAX_WORKERS.get(),
                        "reflection_model": REFLECTION_MODEL, "lm_cache": False, "cpus": os.cpu_count()},
        "table": table, "compared": comparison, "price_pair": PRICE_PAIR, "rows": rows, "rows_alone": alone,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
