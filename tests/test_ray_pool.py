"""The Ray worker pool on a real local Ray cluster: parity with threads, a killed worker, errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest

ray = pytest.importorskip("ray", reason="the Ray pool needs the ray extra: pip install -e '.[ray]'")

from dspy_pxn import BatchedGEPA  # noqa: E402
from dspy_pxn import testing as sim  # noqa: E402
from dspy_pxn.pools import ThreadWorkerPool  # noqa: E402
from dspy_pxn.pools.ray import RayWorkerPool, WorkerLostError  # noqa: E402
from dspy_pxn.testing import LatencyServer  # noqa: E402
from tests.compiling import compile_sim  # noqa: E402

SETTINGS = dict(p=2, n=2, max_metric_calls=120, seed=3, schedule="steps", selection="all")  # deterministic
SPLITS = {"seed": 0, "train": 24, "val": 8, "test": 1}


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def server():
    with LatencyServer(task_latency=0.02, reflection_latency=0.05) as running:
        yield running


def compile_with(server, pool, lm_kwargs=None, **overrides):
    """The deterministic run of ``SETTINGS`` (with ``overrides``) on the server's LMs, its rollouts on ``pool``."""
    lm_kwargs = lm_kwargs or {}
    return compile_sim(splits=sim.make_splits(**SPLITS), lm=server.lm("task", **lm_kwargs),
                       reflection_lm=server.lm("reflection", **lm_kwargs), pool=pool,
                       **{**SETTINGS, **overrides}).program


def instructions(result) -> list[str]:
    return [c.predict.signature.instructions for c in result.candidates]


def test_ray_pool_proposes_what_the_thread_pool_proposes(cluster, server):
    with ThreadWorkerPool(8) as threads:
        expected = compile_with(server, threads).detailed_results
    with RayWorkerPool(max_concurrency=8) as pool:
        calls_before = server.stats()["calls"]["task"]
        got = compile_with(server, pool).detailed_results
        assert server.stats()["calls"]["task"] - calls_before == got.total_metric_calls
        assert pool.busy_seconds() > 0
    assert instructions(got) == instructions(expected) and len(got.candidates) >= 2
    assert got.parents == expected.parents
    assert got.val_aggregate_scores == expected.val_aggregate_scores
    assert got.total_metric_calls == expected.total_metric_calls <= SETTINGS["max_metric_calls"]


def test_rollouts_on_ray_are_metered_like_rollouts_on_threads(cluster, server):
    """Tokens, LM calls and the per-step LM counts come back from the actors to the run's meters."""
    with ThreadWorkerPool(8) as threads:
        expected = compile_with(server, threads).detailed_results
    with RayWorkerPool(max_concurrency=8) as pool:
        got = compile_with(server, pool).detailed_results
    assert expected.usage.lm_calls > expected.total_metric_calls  # rollouts and reflections are both metered
    assert got.usage == expected.usage
    assert got.lm_call_counts.calls == expected.lm_call_counts.calls == expected.usage.lm_calls
    assert [(s.lm_calls, s.prompt_tokens, s.completion_tokens) for s in got.steps] == [
        (s.lm_calls, s.prompt_tokens, s.completion_tokens) for s in expected.steps]


def test_the_async_schedule_runs_its_rollouts_on_ray(cluster, server):
    with RayWorkerPool(max_concurrency=8) as pool:
        calls_before = server.stats()["calls"]["task"]
        got = compile_with(server, pool, schedule="async").detailed_results
        assert server.stats()["calls"]["task"] - calls_before == got.total_metric_calls <= SETTINGS["max_metric_calls"]
    assert sum(s.rollouts for s in got.steps) + 8 == got.total_metric_calls
    assert got.usage.lm_calls > got.total_metric_calls  # rollouts and reflections on the actors, metered here


class CountedOnTheDriver:
    """Wraps dspy's propose_new_texts in this process only: calls made on an actor are not seen."""

    def __init__(self, monkeypatch):
        from dspy.teleprompt.gepa.gepa_utils import DspyAdapter

        self.calls, original = 0, DspyAdapter.propose_new_texts

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(DspyAdapter, "propose_new_texts", counted)


def keep_the_instruction(candidate, reflective_dataset, components_to_update):
    """A custom instruction proposer (no LM call), which may keep state in the driver's process."""
    return {name: candidate[name] + " Check the arithmetic." for name in components_to_update}


@pytest.mark.parametrize("schedule", ["steps", "async"])
def test_reflection_calls_run_on_the_actors_unless_the_proposer_is_custom(cluster, server, monkeypatch, schedule):
    with RayWorkerPool(max_concurrency=8) as pool:
        on_driver = CountedOnTheDriver(monkeypatch)
        server.reset_stats()
        builtin = compile_with(server, pool, schedule=schedule).detailed_results
        reflections = server.stats()["calls"]["reflection"]
        assert reflections >= len(builtin.candidates) - 1 >= 1 and on_driver.calls == 0, "dspy's proposer ran remotely"

        custom = compile_with(server, pool, schedule=schedule, instruction_proposer=keep_the_instruction).detailed_results
        assert server.stats()["calls"]["reflection"] == reflections, "the custom proposer makes no LM call"
    assert on_driver.calls >= 1 and on_driver.calls == sum(s.width for s in custom.steps), \
        "every proposal of a custom proposer was made on the driver"


class WhereAmI:
    """A mapped function that says which process and which unpickled copy of it ran each item."""

    def __call__(self, item):
        return os.getpid(), id(self)


def test_a_function_mapped_again_is_not_shipped_again(cluster):
    with RayWorkerPool(max_concurrency=4, actors=2) as pool:
        where = WhereAmI()
        first = set(pool.map(where, list(range(8))))
        again = set(pool.map(where, list(range(8))))
        other = set(pool.map(WhereAmI(), list(range(8))))
    assert len({pid for pid, _ in first}) == 2, "both actors ran items"
    assert again == first, "each actor kept the copy it resolved the first time"
    assert not other & first, "another function is another copy"


class Slow:
    """Sleeps, then returns ten times its item (or raises on a negative one)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __call__(self, item):
        time.sleep(self.seconds)
        if item < 0:
            raise ValueError(f"negative item {item}")
        return item * 10


def test_maps_waiting_together_share_actor_calls_and_keep_their_own_results_and_errors(cluster):
    import threading

    with RayWorkerPool(max_concurrency=8, actors=1) as pool:
        holder = threading.Thread(target=pool.map, args=(Slow(1.0), list(range(8))))  # takes every slot for 1 s
        holder.start()
        while pool.actor_calls == 0:
            time.sleep(0.01)
        outcomes = {}

        def run(name, items):
            try:
                outcomes[name] = pool.map(Slow(0.01), items)
            except ValueError as error:
                outcomes[name] = error

        maps = {f"map{i}": [i, i + 100] for i in range(6)} | {"fails": [-1, 5]}
        threads = [threading.Thread(target=run, args=item) for item in maps.items()]
        for thread in threads:
            thread.start()
        for thread in [holder, *threads]:
            thread.join()
        calls = pool.actor_calls
    for name, items in maps.items():
        if name == "fails":
            assert isinstance(outcomes[name], ValueError) and "negative item -1" in str(outcomes[name])
        else:
            assert outcomes[name] == [10 * item for item in items]
    assert calls <= 4 < 1 + len(maps), "the maps that waited for slots went out together, not one call each"


@pytest.mark.parametrize("schedule", ["steps", "async"])  # async: one pool map per pipeline, all under one cap
def test_max_concurrent_lm_calls_caps_ray_rollouts_at_the_server(cluster, server, schedule):
    with RayWorkerPool(max_concurrency=8, actors=2) as pool:
        server.reset_stats()
        compile_with(server, pool, max_metric_calls=60, max_concurrent_lm_calls=2, schedule=schedule)
        stats = server.stats()
    assert stats["max_in_flight"]["task"] == 2, "the cap is reached and never exceeded"


def test_concurrency_cap_holds_at_the_server(cluster, server):
    with RayWorkerPool(max_concurrency=3, actors=2) as pool:
        server.reset_stats()
        compile_with(server, pool, max_metric_calls=60)
        assert server.stats()["max_in_flight"]["task"] <= 3


def test_lm_retries_on_ray_are_counted_per_step_as_on_threads(cluster, engine):
    """The same seeded 429s (drawn per request content) against two servers: the same retries, step by step."""
    from tests.faults import Faults

    def run_on(pool):
        faults = Faults(rate_limit_429=0.2, retry_after_s=0.05, seed=4)
        with LatencyServer(task_latency=0.02, reflection_latency=0.05, faults=faults) as faulty:
            result = compile_with(faulty, pool, lm_kwargs={"num_retries": 3, "timeout": 10.0, **engine})
            return result.detailed_results, faulty.stats()

    with ThreadWorkerPool(8) as threads:
        expected, _ = run_on(threads)
    with RayWorkerPool(max_concurrency=8) as pool:
        got, stats = run_on(pool)
    counts = got.lm_call_counts
    assert stats["faults"]["rate_limit_429"] > 5
    assert counts.retries == stats["faults"]["rate_limit_429"] - counts.failures == counts.attempts - counts.calls
    assert counts.attempts == stats["requests"]["calls"]["total"] and sum(s.lm_retries for s in got.steps) == counts.retries
    assert replace(counts, peak_in_flight=0) == replace(expected.lm_call_counts, peak_in_flight=0)  # peaks differ
    assert [(s.lm_calls, s.lm_retries, s.lm_failures) for s in got.steps] == [
        (s.lm_calls, s.lm_retries, s.lm_failures) for s in expected.steps]
    assert instructions(got) == instructions(expected)


def test_a_killed_ray_worker_is_retried_and_the_run_finishes(cluster, server):
    with RayWorkerPool(max_concurrency=8, actors=2) as pool:
        victims = pool.actor_pids()

        def kill_one_worker(record):
            if record.step == 1:
                os.kill(victims[0], signal.SIGKILL)

        result = compile_with(server, pool, gepa_kwargs={"callbacks": [SimpleNamespace(on_step_record=kill_one_worker)]}
                              ).detailed_results
        assert len(result.steps) >= 2, "the run went on after the kill"
        assert victims[0] not in pool.actor_pids(), "Ray restarted the killed actor"
        assert result.total_metric_calls <= SETTINGS["max_metric_calls"]


def test_a_run_on_ray_killed_mid_way_resumes_as_if_never_interrupted(cluster, server, tmp_path):
    """kill -9 of the driver (its actors die with it); the resumed run on a new pool ends as an uninterrupted one."""
    from dspy_pxn.engine.resume import load_saved_state
    from tests.reliability import test_resume as resume

    with ThreadWorkerPool(8) as threads:  # Ray proposes what threads propose (tested above)
        reference = resume.compile_on(server, tmp_path / "reference", pool=threads).detailed_results
    log_dir = tmp_path / "crashed"
    address = ray.get_runtime_context().gcs_address  # this test's cluster, whatever else runs on the machine
    resume.kill_mid_run(server, log_dir, timeout_s=120,
                        pool=f"__import__('dspy_pxn.pools.ray').pools.ray.RayWorkerPool(address={address!r}, max_concurrency=8)")
    saved = load_saved_state(str(log_dir))
    assert saved is not None and saved.total_num_evals < resume.SETTINGS["max_metric_calls"]
    with RayWorkerPool(max_concurrency=8) as pool:
        resumed = resume.compile_on(server, log_dir, pool=pool).detailed_results
    assert resume.instructions(resumed) == resume.instructions(reference)
    assert resumed.parents == reference.parents
    assert resumed.total_metric_calls == reference.total_metric_calls <= resume.SETTINGS["max_metric_calls"]
    assert [s.step for s in resumed.steps] == list(range(1, len(reference.steps) + 1))


def metric_that_kills_its_worker_once(marker: str):
    """A metric that SIGKILLs the Ray worker running it the first time any rollout is scored."""

    def metric(gold, pred, trace=None, pred_name=None, pred_trace=None):
        try:
            with open(marker, "x"):
                pass
        except FileExistsError:
            return sim.metric(gold, pred, trace, pred_name, pred_trace)
        os.kill(os.getpid(), signal.SIGKILL)

    return metric


def test_a_worker_killed_mid_rollout_is_retried_transparently(cluster, server, tmp_path):
    with ThreadWorkerPool(8) as threads:
        expected = compile_with(server, threads).detailed_results
    with RayWorkerPool(max_concurrency=8, actors=2) as pool:
        got = compile_with(server, pool, metric=metric_that_kills_its_worker_once(str(tmp_path / "killed"))
                           ).detailed_results
    assert (tmp_path / "killed").exists(), "a worker was killed mid-rollout"
    assert instructions(got) == instructions(expected)
    assert got.total_metric_calls == expected.total_metric_calls


def test_a_worker_lost_beyond_its_retries_is_an_error_not_a_hang(cluster, server, tmp_path):
    with RayWorkerPool(max_concurrency=4, actors=1, max_task_retries=0) as pool, \
            pytest.raises(WorkerLostError, match="retries"):
        compile_with(server, pool, metric=metric_that_kills_its_worker_once(str(tmp_path / "killed")))


def test_pool_ray_string_builds_and_closes_a_ray_pool(cluster, server):
    result = compile_with(server, "ray", num_threads=4, max_metric_calls=60).detailed_results
    assert result.num_workers == 4 and result.total_metric_calls <= 60


def test_importing_dspy_pxn_does_not_import_ray():
    code = "import sys, dspy_pxn; assert 'ray' not in sys.modules, 'ray was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))


def test_bad_pool_arguments_name_the_fix():
    with pytest.raises(ValueError, match="pool='spark'"):
        BatchedGEPA(metric=sim.metric, p=1, n=1, max_metric_calls=10, reflection_lm=sim.SimulatedLM(), pool="spark")
    with pytest.raises(ValueError, match="max_concurrency"):
        RayWorkerPool(max_concurrency=0)


@pytest.mark.parametrize("schedule", ["async", "steps"])
def test_a_dollar_cap_and_a_deadline_hold_for_rollouts_and_reflections_on_ray(cluster, schedule, engine):
    """Each unit sent to an actor carries its share of what is left; the server's bill stays within the cap,
    the run's meter matches it, and a deadline ends the run within a call of it."""
    from tests.prices import priced_models
    from tests.test_caps import billed, compile_priced

    with priced_models(), RayWorkerPool(max_concurrency=8, actors=2) as pool:
        with LatencyServer(task_latency=0.02, reflection_latency=0.04) as priced:
            result, stats = compile_priced(priced, engine, schedule=schedule, pool=pool, max_cost_usd=0.03)
        assert billed(stats) <= 0.03 and result.stopped_by == "max_cost_usd"
        assert result.usage.cost_usd == pytest.approx(billed(stats), rel=1e-9)
        assert billed(stats, "sim-priced-reflection") > 0  # reflections ran on the actors, within the cap
        # The same (now warm) actors: a cold actor's first call may import litellm, seconds on this machine.
        with LatencyServer(task_latency=0.25, reflection_latency=0.5) as slow:
            result, _ = compile_priced(slow, engine, schedule=schedule, pool=pool, budget=5000, max_wall_s=4.0)
        assert result.stopped_by == "max_wall_s" and result.wall_s <= 4.0 + 0.5 + 1.0
