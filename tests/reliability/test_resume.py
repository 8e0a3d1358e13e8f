"""Crash and resume: kill -9 a run mid-way, resume it from its log_dir, lose nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import dspy
import pytest

from dspy_pxn import BatchedGEPA, read_step_log
from dspy_pxn import testing as sim
from dspy_pxn.engine.resume import load_saved_state
from dspy_pxn.testing import LatencyServer
from dspy_pxn.tracking import MODEL_TAG, MlflowTracker
from tests.compiling import compile_sim
from tests.conftest import seed_program

# The step loop: deterministic, so a resumed run can be compared candidate by candidate with an
# uninterrupted one (the async schedule's resume is in test_async.py).
# gepa saves no schedule of its crossover (use_merge: which are owed), so a resumed run with it owes none until a
# new candidate joins, as a resumed dspy.GEPA does; "as if never interrupted" is checked without it.
SETTINGS = dict(p=2, n=2, max_metric_calls=150, num_threads=8, seed=5, schedule="steps", selection="all",
                use_merge=False)
SPLITS = dict(seed=0, train=24, val=8, test=1)

RUN_SCRIPT = textwrap.dedent('''
    import sys, dspy
    from dspy_pxn import BatchedGEPA, testing as sim
    url, log_dir = sys.argv[1], sys.argv[2]
    def lm(kind):
        return dspy.LM(f"openai/sim-{kind}", api_base=url, api_key="sim", cache=False, temperature=0.0,
                       num_retries=0, **%(engine)r)
    train, val, _ = sim.make_splits(**%(splits)r)
    pool = %(pool)s
    with dspy.context(lm=lm("task")):
        BatchedGEPA(metric=sim.metric, reflection_lm=lm("reflection"), log_dir=log_dir, pool=pool, **%(settings)r).compile(
            sim.seed_program(), trainset=train, valset=val)
''')


@pytest.fixture(scope="module")
def server():
    with LatencyServer(task_latency=0.05, reflection_latency=0.2) as running:
        yield running


def compile_on(server, log_dir, engine=None, **overrides):
    """The run of ``SETTINGS`` (with ``overrides``) on the server's LMs, in ``log_dir``: the program it returns."""
    engine = engine or {}
    return compile_sim(splits=sim.make_splits(**SPLITS), lm=server.lm("task", **engine),
                       reflection_lm=server.lm("reflection", **engine), log_dir=str(log_dir),
                       **{**SETTINGS, **overrides}).program


def instructions(results) -> list[str]:
    return [c.predict.signature.instructions for c in results.candidates]


def task_calls(server) -> int:
    return server.stats()["calls"]["task"]


def kill_mid_run(server, log_dir, after_steps: int = 2, timeout_s: float = 60.0, pool: str = "None",
                 engine: dict | None = None) -> None:
    """Start the run in a subprocess and SIGKILL it once `after_steps` steps are logged.

    ``pool`` is the Python expression the run's ``pool`` argument is built from."""
    script = log_dir.parent / "run.py"
    script.write_text(RUN_SCRIPT % {"splits": SPLITS, "settings": SETTINGS, "pool": pool, "engine": engine or {}})
    env = dict(os.environ, PYTHONPATH=os.getcwd(), LITELLM_LOCAL_MODEL_COST_MAP="True")
    process = subprocess.Popen([sys.executable, str(script), server.base_url, str(log_dir)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout_s
    try:
        while len(read_step_log(str(log_dir))) < after_steps:
            assert process.poll() is None, f"run ended before the kill: {process.stderr.read().decode()[-2000:]}"
            assert time.monotonic() < deadline, "run made no progress"
            time.sleep(0.02)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)


def test_a_killed_run_resumes_from_its_last_step_and_ends_as_if_never_interrupted(server, tmp_path, engine):
    reference = compile_on(server, tmp_path / "reference", engine).detailed_results

    log_dir = tmp_path / "crashed"
    kill_mid_run(server, log_dir, engine=engine)
    saved = load_saved_state(str(log_dir))
    assert saved is not None, "gepa saves its state at the top of every step"
    completed = saved.i + 1
    assert completed >= 1 and saved.total_num_evals < SETTINGS["max_metric_calls"]

    calls_before = task_calls(server)
    resumed = compile_on(server, log_dir, engine).detailed_results
    resumed_calls = task_calls(server) - calls_before

    # The seed is not re-validated: every task call of the resumed process is a metric call
    # the saved state had not counted yet, and the budget accounting is exact.
    assert resumed_calls == resumed.total_metric_calls - saved.total_num_evals
    assert resumed.total_metric_calls == reference.total_metric_calls <= SETTINGS["max_metric_calls"]
    # Same parents, minibatches and RNG draws as the uninterrupted run: the same candidates.
    assert instructions(resumed) == instructions(reference)
    assert resumed.parents == reference.parents
    assert resumed.val_aggregate_scores == reference.val_aggregate_scores
    # One record per step, numbered without gaps or repeats; the in-flight step was redone once.
    steps = [s.step for s in resumed.steps]
    assert steps == list(range(1, len(reference.steps) + 1))
    assert read_step_log(str(log_dir)) == list(resumed.steps)
    assert [s.metric_calls for s in resumed.steps] == [s.metric_calls for s in reference.steps]


def test_resuming_a_finished_run_makes_no_lm_call(server, tmp_path, engine):
    first = compile_on(server, tmp_path / "done", engine).detailed_results
    calls_before = server.stats()["calls"]["total"]
    again = compile_on(server, tmp_path / "done", engine).detailed_results
    assert server.stats()["calls"]["total"] == calls_before
    assert again.total_metric_calls == first.total_metric_calls
    assert again.val_aggregate_scores == first.val_aggregate_scores


@pytest.mark.parametrize(
    ("change", "named"),
    [(dict(p=4), "p: saved 2, now 4"), (dict(n=1), "n: saved 2, now 1"), (dict(seed=6), "seed"),
     (dict(selection="best"), "selection: saved 'all', now 'best'")],
)
def test_resuming_with_other_settings_is_refused_before_any_lm_call(server, tmp_path, change, named):
    log_dir = tmp_path / "run"
    compile_on(server, log_dir, max_metric_calls=60)
    calls_before = server.stats()["calls"]["total"]
    with pytest.raises(ValueError, match="cannot be resumed") as error:
        compile_on(server, log_dir, max_metric_calls=60, **change)
    assert named in str(error.value) and "new log_dir" in str(error.value)
    assert server.stats()["calls"]["total"] == calls_before


@pytest.mark.parametrize("change", ["task model", "task endpoint", "reflection model"])
def test_resuming_with_other_lms_is_refused_before_any_lm_call(server, tmp_path, change):
    log_dir = tmp_path / "run"
    compile_on(server, log_dir, max_metric_calls=60)
    train, val, _ = sim.make_splits(**SPLITS)
    with LatencyServer(task_latency=0.01, reflection_latency=0.01) as other:
        task_lm, reflection_lm = server.lm("task"), server.lm("reflection")
        if change == "task model":
            task_lm = server.lm("other")
        elif change == "task endpoint":
            task_lm = other.lm("task", api_key="sk-secret-key")
        else:
            reflection_lm = server.lm("other")
        calls_before = server.stats()["calls"]["total"]
        with dspy.context(lm=task_lm), pytest.raises(ValueError, match="cannot be resumed") as error:
            BatchedGEPA(metric=sim.metric, reflection_lm=reflection_lm, log_dir=str(log_dir),
                        **{**SETTINGS, "max_metric_calls": 60}).compile(seed_program(), trainset=train, valset=val)
        assert server.stats()["calls"]["total"] == calls_before and other.stats()["calls"]["total"] == 0
    message = str(error.value)
    saved = f"'openai/sim-task @ {server.base_url}'"
    expected = {
        "task model": f"task_lm: saved {saved}, now 'openai/sim-other @ {server.base_url}'",
        "task endpoint": f"task_lm: saved {saved}, now 'openai/sim-task @ {other.base_url}'",
        "reflection model": f"reflection_lm: saved 'openai/sim-reflection @ {server.base_url}', now 'openai/sim-other",
    }[change]
    assert expected in message
    assert "sk-secret-key" not in message


def test_resuming_on_another_valset_is_refused(server, tmp_path):
    log_dir = tmp_path / "run"
    compile_on(server, log_dir, max_metric_calls=60)
    train, _, _ = sim.make_splits(**SPLITS)
    other_val = sim.make_splits(seed=9, train=1, val=8, test=1).val
    with dspy.context(lm=server.lm("task")), pytest.raises(ValueError, match="valset: saved"):
        BatchedGEPA(metric=sim.metric, reflection_lm=server.lm("reflection"), log_dir=str(log_dir),
                    **{**SETTINGS, "max_metric_calls": 60}).compile(seed_program(), trainset=train, valset=other_val)


def test_a_larger_budget_extends_a_finished_run(server, tmp_path):
    log_dir = tmp_path / "run"
    short = compile_on(server, log_dir, max_metric_calls=60).detailed_results
    longer = compile_on(server, log_dir, max_metric_calls=150).detailed_results
    assert longer.total_metric_calls > short.total_metric_calls
    assert instructions(longer)[: len(short.candidates)] == instructions(short)
    assert [s.step for s in longer.steps] == list(range(1, len(longer.steps) + 1))


def test_an_unreadable_state_file_is_an_error_not_a_fresh_start(server, tmp_path):
    log_dir = tmp_path / "run"
    log_dir.mkdir()
    (log_dir / "gepa_state.bin").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="cannot be loaded"):
        compile_on(server, log_dir)


def test_a_resumed_tracked_run_continues_its_mlflow_run(server, tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    log_dir = tmp_path / "run"
    tracker = MlflowTracker(tracking_uri=uri, experiment="resume")
    first = compile_on(server, log_dir, max_metric_calls=60, tracker=tracker).detailed_results
    extended = compile_on(server, log_dir, max_metric_calls=150, tracker=tracker).detailed_results
    assert extended.mlflow_run_id == first.mlflow_run_id
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("resume").experiment_id])
    assert [r.info.run_id for r in runs] == [first.mlflow_run_id]
    assert runs[0].info.status == "FINISHED"
    logged = sorted(m.step for m in client.get_metric_history(first.mlflow_run_id, "search/metric_calls_total"))
    assert logged[-1] == len(extended.steps)
    # Each finish logged the program it returned: the extended run's model is the run's model now.
    outputs = [o.model_id for o in runs[0].outputs.model_outputs]
    assert len(outputs) == 2 and runs[0].data.tags[MODEL_TAG].removeprefix("models:/") in outputs
    assert set(range(1, len(extended.steps) + 1)) <= set(logged)


# A tracked run killed at the worst moment for its proposals log: right after a step's rows are written,
# before the next step saves gepa's state, so the saved state does not include a step whose rows are on file.
DIE_AFTER_STEP_SCRIPT = textwrap.dedent('''
    import os, signal, sys, dspy
    from dspy_pxn import BatchedGEPA, testing as sim
    from dspy_pxn.tracking import MlflowTracker
    url, log_dir = sys.argv[1], sys.argv[2]

    class DieAfterStep:
        """A gepa callback told after the tracker's lineage: kill -9 as step %(step)d ends."""

        def on_iteration_end(self, event):
            if event["iteration"] == %(step)d:
                os.kill(os.getpid(), signal.SIGKILL)

    def lm(kind):
        return dspy.LM(f"openai/sim-{kind}", api_base=url, api_key="sim", cache=False, temperature=0.0,
                       num_retries=0)
    train, val, _ = sim.make_splits(**%(splits)r)
    with dspy.context(lm=lm("task")):
        BatchedGEPA(metric=sim.metric, reflection_lm=lm("reflection"), log_dir=log_dir,
                    gepa_kwargs={"callbacks": [DieAfterStep()]}, tracker=%(tracker)s,
                    **%(settings)r).compile(sim.seed_program(), trainset=train, valset=val)
''')


def die_after_step(server, log_dir, settings: dict, step: int, tracker: str = "None", timeout_s: float = 120.0) -> None:
    """Run ``settings`` in a subprocess that SIGKILLs itself as step ``step`` ends (``DIE_AFTER_STEP_SCRIPT``).

    ``tracker`` is the Python expression the run's ``tracker`` argument is built from."""
    script = log_dir.parent / "die.py"
    script.write_text(DIE_AFTER_STEP_SCRIPT % {"splits": SPLITS, "settings": settings, "step": step,
                                               "tracker": tracker})
    env = dict(os.environ, PYTHONPATH=os.getcwd(), LITELLM_LOCAL_MODEL_COST_MAP="True")
    process = subprocess.run([sys.executable, str(script), server.base_url, str(log_dir)], env=env, check=False,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout_s)
    assert process.returncode == -signal.SIGKILL, f"run was not killed: {process.stderr.decode()[-2000:]}"


@pytest.mark.parametrize("schedule", ["steps", "async"])
def test_a_resumed_tracked_run_continues_its_proposals_log(server, tmp_path, schedule):
    import csv

    from dspy_pxn.tracking.lineage import VALIDATED, read_proposals

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    log_dir = tmp_path / "run"
    die_after_step(server, log_dir, {**SETTINGS, "schedule": schedule}, step=2,
                                  tracker=f"MlflowTracker(tracking_uri={uri!r}, experiment='lineage')")
    before = read_proposals(str(log_dir))
    completed = load_saved_state(str(log_dir)).i + 1
    assert max(row.step for row in before) == 2 > completed, "the killed step's rows are on file, not in the state"

    resumed = compile_on(server, log_dir, schedule=schedule,
                         tracker=MlflowTracker(tracking_uri=uri, experiment="lineage")).detailed_results
    rows = read_proposals(str(log_dir))
    steps = [row.step for row in rows]
    assert steps == sorted(steps) and max(steps) > max(row.step for row in before)
    assert set(steps) <= {record.step for record in resumed.steps}
    # The rows of the steps the saved state includes are kept as written; the killed step's are written once.
    kept = [row for row in before if row.step <= completed]
    assert kept and rows[: len(kept)] == kept
    pairs = [(row.step, row.task) for row in rows]
    assert len(pairs) == len(set(pairs))
    ids = [row.proposal_id for row in rows if row.proposal_id]
    assert len(ids) == len(set(ids))
    validated = sorted(row.candidate for row in rows if row.outcome == VALIDATED)
    assert validated == list(range(1, len(resumed.candidates)))
    # The run's proposals table has the rows of both processes.
    with open(log_dir / "proposals.csv", newline="") as handle:
        assert [(int(row["step"]), int(row["task"])) for row in csv.DictReader(handle)] == pairs
