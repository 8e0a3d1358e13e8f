"""`dspy-pxn optimize | sweep | demo` end to end on the loopback latency server, and the one-line errors.

The LM answers are the simulator's (it cannot solve GSM8K or HoVer), so these tests check the
wiring a user relies on - progress lines, the summary, the saved program, MLflow runs and
nesting - not scores. The real local-model demo is a manual command (benchmarks/results/demo.md).
"""

from __future__ import annotations

import itertools
import json
import socket

import pytest
from mlflow import MlflowClient

from dspy_pxn.cli import main as cli
from dspy_pxn.tracking import BEST_RUN_TAG, MODEL_TAG, PARENT_TAG
from tests.test_programs_helpers import require_data

TINY = ["--train-size", "4", "--val-size", "3", "--test-size", "3", "--workers", "4", "--budget", "24"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


@pytest.fixture(scope="module")
def data_dir():
    return str(require_data("gsm8k", "hover"))


def test_optimize_gsm8k_prints_progress_and_summary_and_saves_the_program(sim_lm_flags, store, data_dir, tmp_path, capsys):
    log_dir = tmp_path / "run"
    assert cli(["optimize", "gsm8k", "--p", "2", "--n", "1", *sim_lm_flags, *TINY, "--data-dir", data_dir,
                "--tracking-uri", store, "--experiment", "cli-opt", "--log-dir", str(log_dir)]) == 0
    out = capsys.readouterr().out
    assert "step   1 [" in out and "] metric calls" in out and "/24 | " in out and " screened" in out
    assert all(" validated" in line and "best val " in line for line in out.splitlines() if line.startswith("step "))
    bars = [line.split("[")[1].split("]")[0] for line in out.splitlines() if line.startswith("step ")]
    assert [bar.count("#") for bar in bars] == sorted(bar.count("#") for bar in bars), "the bar only grows"
    for needle in ("val:  seed", "test: seed", "wall-clock", "metric calls", "cost ", "[solve.predict]",
                   f"saved program: {log_dir}/program.json", "MLflow run "):
        assert needle in out, needle
    assert json.loads((log_dir / "program.json").read_text())
    run_id = out.split("MLflow run ")[1].split()[0]
    run = MlflowClient(store).get_run(run_id)
    assert run.data.params["p"] == "2" and run.info.status == "FINISHED"


@pytest.mark.parametrize(("used", "budget", "filled"), [(0, 40, 0), (20, 40, 10), (32, 40, 16), (40, 40, 20), (41, 40, 20)])
def test_budget_bar_fills_with_the_metric_calls_spent(used, budget, filled):
    from dspy_pxn.cli import BAR_WIDTH, budget_bar

    bar = budget_bar(used, budget)
    assert len(bar) == BAR_WIDTH + 2 and bar.count("#") == filled and bar.count(".") == BAR_WIDTH - filled


def test_optimize_hover_runs_on_a_small_claims_corpus(sim_lm_flags, data_dir, tmp_path, capsys):
    from dspy_pxn.programs.demo_corpus import write_claims_corpus
    from dspy_pxn.programs.hover import load_hover

    corpus = write_claims_corpus(itertools.chain(*load_hover(data_dir)), tmp_path / "claims.jsonl")
    assert cli(["optimize", "hover", "--p", "1", "--n", "1", *sim_lm_flags, "--data-dir", data_dir,
                "--corpus", str(corpus), "--train-size", "3", "--val-size", "2", "--test-size", "2",
                "--budget", "12", "--workers", "4", "--no-mlflow", "--log-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "[write_query.predict]" in out and "[take_notes.predict]" in out
    assert "test: seed" in out and (tmp_path / "run" / "program.json").is_file()


def test_sweep_nests_one_run_per_config_and_prints_the_table(sim_lm_flags, store, data_dir, tmp_path, capsys):
    assert cli(["sweep", "gsm8k", "--configs", "1x1,2x1", *sim_lm_flags, *TINY, "--data-dir", data_dir,
                "--tracking-uri", store, "--experiment", "cli-sweep", "--log-dir", str(tmp_path / "sweep"),
                "--register-model", "cli-sweep-best"]) == 0
    out = capsys.readouterr().out
    assert "| 1x1 |" in out.replace("1×1", "1x1") and "2x1" in out
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("cli-sweep").experiment_id])
    parents = [r for r in runs if PARENT_TAG not in r.data.tags]
    children = [r for r in runs if PARENT_TAG in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    assert {r.data.tags[PARENT_TAG] for r in children} == {parents[0].info.run_id}
    # Each child logged its program; the parent names the best child's, and only that one is registered.
    assert all(r.data.tags[MODEL_TAG].startswith("models:/") for r in children)
    best = next(r for r in children if r.info.run_id == parents[0].data.tags[BEST_RUN_TAG])
    assert best.data.metrics["totals/best_val"] == max(r.data.metrics["totals/best_val"] for r in children)
    [version] = client.search_model_versions("name='cli-sweep-best'")
    assert version.source == parents[0].data.tags[MODEL_TAG] == best.data.tags[MODEL_TAG]
    assert f'mlflow.dspy.load_model("{best.data.tags[MODEL_TAG]}")' in out


def test_demo_wiring_with_the_lms_overridden(sim_lm_flags, store, data_dir, tmp_path, capsys):
    """The demo path (GSM8K, sizes, MLflow, both test scores) with the local models swapped for the server."""
    assert cli(["demo", *sim_lm_flags, "--data-dir", data_dir, "--budget", "15", "--train-size", "4",
                "--val-size", "3", "--test-size", "3", "--tracking-uri", store, "--log-dir", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "dspy-pxn demo: task LM openai/sim-task" in out and "2×1" in out
    assert "test: seed" in out and "demo total" in out and "MLflow run " in out


def test_demo_defaults_are_the_embedded_models():
    from dspy_pxn.cli import build_parser

    args = build_parser().parse_args(["demo"])
    assert args.lm == "local" and args.reflection_lm.startswith("local") and args.budget <= 60


def test_optimize_runs_the_librarys_defaults_and_its_help_says_them(capsys):
    """A flag left unset is BatchedGEPA's own default (not a second one of the command line's), and --help says it."""
    import dspy

    from dspy_pxn import BatchedGEPA
    from dspy_pxn.cli import build_parser
    from dspy_pxn.cli.optimize import make_optimizer
    from dspy_pxn.cli.tasks import Task

    args = build_parser().parse_args(["optimize", "sim", "--no-mlflow"])
    task = Task("sim", None, lambda gold, pred, trace=None: 1.0, [], [], [])
    with dspy.context(lm=dspy.LM("openai/x", api_key="x")):
        ours = make_optimizer(args, task, None, args.p, args.n, "unused", None).settings
        library = BatchedGEPA(metric=task.metric).settings
    for name in ("p", "n", "reflection_minibatch_size", "num_threads", "max_metric_calls", "auto", "selection",
                 "schedule"):
        assert getattr(ours, name) == getattr(library, name), name
    with pytest.raises(SystemExit):
        build_parser().parse_args(["optimize", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"(default: {library.p}, BatchedGEPA's)" in help_text and f"(default: {library.n}, BatchedGEPA's)" in help_text
    assert "default: auto='light'" in help_text and "default: DSPy's num_threads" in help_text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["optimize", "poetry", "--lm", "local", "--reflection-lm", "local"], "unknown task 'poetry': choose one of"),
        (["optimize", "gsm8k", "--lm", "local", "--reflection-lm", "local", "--p", "0"], "--p 0 must be a positive"),
        (["optimize", "gsm8k", "--lm", "local", "--reflection-lm", "local", "--n", "-1"], "--n -1 must be a positive"),
        (["sweep", "gsm8k", "--lm", "local", "--reflection-lm", "local", "--configs", "2y2"], "write shapes like"),
        (["optimize", "hover", "--lm", "local", "--reflection-lm", "local"], "hover needs --corpus PATH"),
        (["optimize", "gsm8k", "--lm", "local", "--reflection-lm", "local", "--data-dir", "/nonexistent/data"],
         "--data-dir '/nonexistent/data' is not a directory"),
        (["optimize", "gsm8k", "--lm", "nosuchprovider-model", "--reflection-lm", "local"], "unknown LM spec"),
        (["optimize", "sim", "--lm", "local", "--reflection-lm", "local", "--landscape", "breadth"],
         "--landscape breadth shapes the simulated LM"),
        (["optimize", "gsm8k", "--lm", "local", "--reflection-lm", "local", "--latency", "heavy"],
         "--latency heavy shapes the simulated LM"),
    ],
)
def test_usage_errors_are_one_actionable_line(argv, needle, capsys):
    assert cli(argv) == 2
    assert needle in _error_line(capsys)


def test_missing_data_dir_names_the_env_var(monkeypatch, capsys):
    monkeypatch.delenv("DSPY_PXN_DATA_DIR", raising=False)
    assert cli(["optimize", "gsm8k", "--lm", "local", "--reflection-lm", "local"]) == 2
    line = _error_line(capsys)
    assert "DSPY_PXN_DATA_DIR" in line and "--data-dir PATH" in line and "--online" in line
    assert "online=True" not in line and "data_dir=PATH" not in line, "the CLI names its own flags"


def test_online_flag_loads_the_task_from_the_hub(sim_lm_flags, data_dir, tmp_path, monkeypatch, capsys):
    """`--online` reads through `datasets` (a stand-in hub serving the local rows) and runs."""
    import sys
    import types
    from pathlib import Path

    asked = []

    def load_dataset(path, split, **kwargs):
        asked.append((path, split))
        return [json.loads(line) for line in (Path(data_dir) / "gsm8k" / f"{split}.jsonl").open()]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.delenv("DSPY_PXN_DATA_DIR", raising=False)
    assert cli(["optimize", "gsm8k", "--online", "--p", "1", "--n", "1", *sim_lm_flags, *TINY,
                "--no-mlflow", "--log-dir", str(tmp_path / "run")]) == 0
    assert asked == [("openai/gsm8k", "train"), ("openai/gsm8k", "test")]
    assert "test: seed" in capsys.readouterr().out


def test_missing_api_key_names_the_variable(monkeypatch, data_dir, capsys):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert cli(["optimize", "gsm8k", "--lm", "openai/gpt-4.1-mini", "--reflection-lm", "openai/gpt-5-mini",
                "--data-dir", data_dir, *TINY]) == 2
    line = _error_line(capsys)
    assert "OPENAI_API_KEY" in line and "--lm local" in line


def test_unreachable_endpoint_is_reported_before_the_run(data_dir, capsys):
    url = f"http://127.0.0.1:{_free_port()}/v1"
    assert cli(["optimize", "gsm8k", "--lm", "openai/my-model", "--reflection-lm", "openai/my-model",
                "--api-base", url, "--data-dir", data_dir, *TINY]) == 2
    line = _error_line(capsys)
    assert f"--api-base {url} is unreachable" in line and "start the server" in line


def test_budget_below_one_step_is_refused(data_dir, capsys):
    # The seed's validation (10), one proposal on 2x1 examples (a first one the budget cannot pay for in full may
    # screen fewer than 3), its validation.
    assert cli(["optimize", "gsm8k", "--lm", "local", "--reflection-lm", "local", "--data-dir", data_dir,
                "--val-size", "10", "--budget", "21"]) == 2
    assert "--budget 21 cannot pay for one step" in (line := _error_line(capsys)) and "at least 22" in line
    assert "screened on 2x1 examples" in line
    assert cli(["optimize", "gsm8k", "--lm", "local", "--reflection-lm", "local", "--data-dir", data_dir,
                "--val-size", "10", "--budget", "25", "--minibatch-size", "3"]) == 2  # one's own minibatch: 2x3
    assert "--budget 25 cannot pay for one step" in (line := _error_line(capsys)) and "at least 26" in line
    assert "screened on 2x3 examples" in line


def test_tasks_other_than_sim_need_an_lm(data_dir, capsys):
    assert cli(["optimize", "gsm8k", "--data-dir", data_dir, *TINY]) == 2
    assert "gsm8k needs --lm" in _error_line(capsys)


# ----------------------------------------------------------------------------- sim: learning with no key
def test_optimize_sim_starts_its_own_simulated_lm_learns_and_files_its_results_where_a_user_looks(
    mlflow_server, tmp_path, monkeypatch, capsys, caplog
):
    """A tracked `optimize sim` against a real `mlflow server`: learning with no key, and what MLflow shows."""
    import urllib.request

    import mlflow

    from dspy_pxn import testing as sim
    from dspy_pxn.testing.mlflow_server import NO_PROXY

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # the sim task needs no key, and logging asks for none
    assert cli(["optimize", "sim", "--p", "2", "--n", "2", "--task-latency", "0.005", "--train-size", "30",
                "--val-size", "10", "--test-size", "20", "--budget", "160", "--workers", "8",
                "--tracking-uri", mlflow_server.uri, "--experiment", "cli-sim", "--log-dir", str(tmp_path / "run"),
                "--register-model", "cli-sim-program"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "sim: simulated LM server at http://127.0.0.1:" in out
    val = out.split("val:  seed ")[1].split()
    assert float(val[3]) > float(val[0])  # "seed 0.100 -> optimized 0.600": real learning, no key, no network
    assert "note: only" not in out  # every answer was a real call to the simulated server
    # Logging the model called no LM: no failed input-example check, no credentials warning (litellm's words, or
    # DSPy's native engine's).
    printed = out + captured.err + caplog.text
    for needle in ("Failed to validate serving input example", "Missing credentials", "no API key found"):
        assert needle not in printed, needle

    client = MlflowClient(mlflow_server.uri)
    run_id = out.split("MLflow run ")[1].split()[0]
    run = client.get_run(run_id)
    experiment_id = run.info.experiment_id
    # The browse hint is the run's page on the server (which serves the UI there), not an `mlflow ui` command.
    url = out.split("browse: open ")[1].split()[0]
    assert url == f"{mlflow_server.uri}/#/experiments/{experiment_id}/runs/{run_id}"
    with NO_PROXY.open(urllib.request.Request(url.split("#")[0]), timeout=10) as page:
        assert page.status == 200 and "<title>MLflow</title>" in page.read().decode()

    model_uri = out.split("MLflow model ")[1].split()[0]
    [version] = client.search_model_versions("name='cli-sim-program'")
    assert model_uri.startswith("models:/") and version.source == model_uri
    model = client.get_logged_model(model_uri.removeprefix("models:/"))
    assert model.name == "sim-2x2-merge-async"  # the task and the setting (2x2: merge, async by default)
    assert (model.params["p"], model.params["n"], model.params["selection"]) == ("2", "2", "merge")
    # The signature is the program's: its input fields in, its predictor's output fields out.
    program = sim.seed_program()
    mlflow.set_tracking_uri(mlflow_server.uri)
    try:
        signature = mlflow.models.get_model_info(model_uri).signature
    finally:
        mlflow.set_tracking_uri(None)
    assert signature.inputs.input_names() == list(program.predict.signature.input_fields)
    assert signature.outputs.input_names() == list(program.predict.signature.output_fields)
    # The instruction is filed under the run's experiment, where its Prompts page looks.
    [prompt] = client.search_prompts(filter_string=f"experiment_id = '{experiment_id}'")
    assert prompt.name == "cli-sim.ChainOfThought.predict"
    assert f",{experiment_id}," in prompt.tags["_mlflow_experiment_ids"]


@pytest.mark.parametrize(("uri", "hint"), [
    ("http://127.0.0.1:5055", "open http://127.0.0.1:5055/#/experiments/7/runs/abc"),
    ("https://mlflow.example.org/", "open https://mlflow.example.org/#/experiments/7/runs/abc"),
    ("sqlite:////data/mlflow.db", ("mlflow ui --backend-store-uri sqlite:////data/mlflow.db, then open "
                                   "http://127.0.0.1:5000/#/experiments/7/runs/abc")),
    ("/data/my runs", ("mlflow ui --backend-store-uri '/data/my runs', then open "
                       "http://127.0.0.1:5000/#/experiments/7/runs/abc")),
    ("databricks", "open the run in your Databricks workspace (Experiments)"),
])
def test_the_browse_hint_fits_the_kind_of_tracking_uri(uri, hint):
    from dspy_pxn.cli.output import browse_hint

    assert browse_hint(uri, "7", "abc") == hint


@pytest.mark.parametrize(("flags", "schedule"), [((), "async"), (("--schedule", "steps", "--selection", "best"), "steps")])
def test_optimize_takes_the_schedule_and_selection_or_their_defaults(tmp_path, flags, schedule):
    from dspy_pxn import read_step_log

    log_dir = tmp_path / "run"
    assert cli(["optimize", "sim", "--p", "2", "--n", "2", "--task-latency", "0.005", "--train-size", "30",
                "--val-size", "10", "--test-size", "5", "--budget", "120", "--workers", "8", "--no-mlflow",
                "--log-dir", str(log_dir), *flags]) == 0
    records = read_step_log(str(log_dir))
    assert records and {r.schedule for r in records} == {schedule}
    if schedule == "steps":  # best validates at most one child per step
        assert all(r.accepted <= 1 for r in records)


def test_optimize_sim_takes_the_landscape_and_latency_distribution(tmp_path, monkeypatch, capsys):
    from dspy_pxn import testing

    seen: list[dict] = []

    class Recorded(testing.LatencyServer):
        def close(self) -> None:
            if self._proc is not None:
                seen.append(self.stats())  # the server's own account, read before it stops
            super().close()

    monkeypatch.setattr(testing, "LatencyServer", Recorded)
    assert cli(["optimize", "sim", "--p", "1", "--n", "1", "--task-latency", "0.002", "--landscape", "breadth",
                "--latency", "lognormal", "--seed", "3", "--train-size", "30", "--val-size", "10", "--test-size", "20",
                "--budget", "120", "--workers", "8", "--no-mlflow", "--log-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "lognormal latencies around these medians, landscape breadth)" in out
    (stats,) = seen
    assert stats["config"]["landscape"]["name"] == "breadth" and stats["config"]["latency"] == "lognormal"
    assert stats["config"]["latency_seed"] == 3
    task = stats["latency"]["task"]
    assert task["count"] == stats["calls"]["task"] > 0 and task["p50"] != task["max"]


# ----------------------------------------------------------------------------- DSPy's cache
def lm_calls(out: str) -> int:
    return int(out.split(" LM calls,")[0].rsplit(" ", 1)[1])


def test_runs_are_not_answered_from_an_earlier_runs_cache(sim_lm_flags, data_dir, tmp_path, capsys):
    args = ["optimize", "gsm8k", "--p", "2", "--n", "1", *sim_lm_flags, *TINY, "--data-dir", data_dir, "--no-mlflow"]
    counts = []
    for run in ("first", "second"):
        assert cli([*args, "--log-dir", str(tmp_path / run)]) == 0
        counts.append(lm_calls(capsys.readouterr().out))
    assert counts[0] > 0 and counts[1] == counts[0]


def test_cache_is_opt_in_and_kept_per_endpoint(sim_lm_flags, data_dir, tmp_path, monkeypatch, capsys):
    import dspy
    import dspy.clients

    from dspy_pxn.testing import LatencyServer

    monkeypatch.setattr(dspy.clients, "DISK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(dspy, "cache", dspy.cache)  # restored after the test
    args = ["optimize", "gsm8k", "--p", "2", "--n", "1", *TINY, "--data-dir", data_dir, "--no-mlflow", "--cache"]
    assert cli([*args, *sim_lm_flags, "--log-dir", str(tmp_path / "a")]) == 0
    first = capsys.readouterr().out
    assert cli([*args, *sim_lm_flags, "--log-dir", str(tmp_path / "b")]) == 0
    again = capsys.readouterr().out
    assert lm_calls(first) > 0 and lm_calls(again) == 0 and "note: only 0 LM calls" in again
    with LatencyServer(task_latency=0.01, reflection_latency=0.02) as other:
        flags = [*sim_lm_flags[:4], "--api-base", other.base_url]
        assert cli([*args, *flags, "--log-dir", str(tmp_path / "c")]) == 0
        assert lm_calls(capsys.readouterr().out) > 0  # another endpoint: its own answers, not the first one's
        assert other.stats()["calls"]["total"] > 0


# ----------------------------------------------------------------------------- the demo's task (programs/gsm8k.py)
def test_gsm8k_metric_names_the_expected_and_the_parsed_number():
    import dspy
    from dspy_pxn.programs.gsm8k import metric

    gold = dspy.Example(question="q", answer="1,200").with_inputs("question")
    assert metric(gold, dspy.Prediction(answer="$1200.")).score == 1.0
    wrong = metric(gold, dspy.Prediction(answer="about 12 dollars"))
    assert wrong.score == 0.0 and "expected answer is 1200" in wrong.feedback and "is 12 " in wrong.feedback
    assert "no number" in metric(gold, dspy.Prediction(answer="")).feedback


def test_gsm8k_splits_are_fixed_by_seed_and_disjoint(data_dir):
    from dspy_pxn.programs.gsm8k import load_gsm8k

    a, b = load_gsm8k(data_dir, n_train=10, n_val=5, n_test=5), load_gsm8k(data_dir, n_train=10, n_val=5, n_test=5)
    assert [e.question for e in a.train + a.val + a.test] == [e.question for e in b.train + b.val + b.test]
    assert not {e.question for e in a.train} & {e.question for e in a.val}
    assert load_gsm8k(data_dir, n_train=10, n_val=5, n_test=5, seed=1).val != a.val


def test_optimize_takes_a_deadline_and_a_dollar_cap(tmp_path, capsys):
    """The sim server runs on localhost, so its models cost nothing: the deadline ends the run, and the
    progress line shows both budgets."""
    assert cli(["optimize", "sim", "--p", "2", "--n", "1", "--task-latency", "0.1", "--train-size", "30",
                "--val-size", "6", "--test-size", "2", "--budget", "5000", "--workers", "8", "--no-mlflow",
                "--log-dir", str(tmp_path / "run"), "--max-wall-s", "4", "--max-cost-usd", "1"]) == 0
    out = capsys.readouterr().out
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert steps and all("$0.0000 spent, $1.0000 left" in line and " s to the deadline" in line for line in steps)
    assert "left (max_wall_s)" in steps[-1]  # the deadline binds first: the models are free, the budget large
    assert "ended by max_wall_s" in out


def test_plan_prices_a_dollar_budget_in_metric_calls(capsys):
    assert cli(["plan", "--workers", "16", "--val-size", "30", "--max-cost-usd", "5", "--cost-per-call-usd",
                "0.002", "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "$5 buys 2500 metric calls at $0.002 per call" in out and "B=2500" in out
    assert cli(["plan", "--workers", "16", "--val-size", "30", "--max-cost-usd", "5", "--cost-per-call-usd",
                "0.002", "--budget", "1000"]) == 0
    assert "--budget 1000 binds first" in capsys.readouterr().out
    assert cli(["plan", "--workers", "16", "--val-size", "30", "--max-cost-usd", "5"]) == 2
    assert "--cost-per-call-usd" in capsys.readouterr().err
