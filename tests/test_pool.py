"""The thread pool every rollout of a run shares: order, real concurrency, context, nesting.

Concurrency is shown by tasks that can only finish together (a barrier of W parties) and
by the pool's peak in-flight count, never by elapsed time.
"""

import threading
import time

import dspy
import pytest

from dspy_pxn import testing as sim
from dspy_pxn.pools import ThreadWorkerPool, WorkerPool


def test_w_tasks_run_at_once_and_results_keep_their_order():
    together = threading.Barrier(4, timeout=30)  # breaks (and the map raises) unless 4 tasks wait at once

    def square(x):
        together.wait()
        return x * x

    with ThreadWorkerPool(4) as pool:
        assert isinstance(pool, WorkerPool)
        assert pool.map(square, range(8)) == [x * x for x in range(8)]
        assert pool.peak_in_flight == 4


def test_no_more_than_w_tasks_run_at_once():
    lock, running, peak = threading.Lock(), [0], [0]
    rounds = threading.Barrier(3, timeout=30)  # 3 at once, round after round: a 4th would be counted running

    def task(_):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        rounds.wait()
        with lock:
            running[0] -= 1

    with ThreadWorkerPool(3) as pool:
        pool.map(task, range(12))
    assert peak[0] == 3 == pool.peak_in_flight


def test_a_map_from_inside_a_pool_task_runs_inline_instead_of_deadlocking():
    with ThreadWorkerPool(1) as pool:  # one worker: a nested map that waited for the pool would wait forever
        assert pool.map(lambda x: pool.map(lambda y: y + x, [1, 2]), [10, 20]) == [[11, 12], [21, 22]]


def test_pool_tasks_see_the_submitters_dspy_context():
    lm = sim.SimulatedLM()
    with ThreadWorkerPool(2) as pool, dspy.context(lm=lm):
        assert pool.map(lambda _: dspy.settings.lm is lm, range(4)) == [True] * 4


def test_a_task_that_raises_fails_the_map_and_the_pool_stays_usable():
    def fragile(x):
        if x == 2:
            time.sleep(0.05)
            raise RuntimeError("boom")
        return x

    with ThreadWorkerPool(2) as pool:
        with pytest.raises(RuntimeError, match="boom"):
            pool.map(fragile, range(4))
        assert pool.busy_seconds() >= 0.05  # the failed task's time counts too (it ran, and raised)
        assert pool.map(lambda x: x + 1, [1, 2]) == [2, 3]


def test_busy_seconds_is_the_time_tasks_ran_at_most_w_per_second_of_wall_clock():
    """busy/(W * wall) is the pool's utilisation: at least the tasks' own time, never above 1."""
    with ThreadWorkerPool(2) as pool:
        assert pool.busy_seconds() == 0.0
        started = time.perf_counter()
        pool.map(lambda _: time.sleep(0.05), range(6))
        wall = time.perf_counter() - started
        busy = pool.busy_seconds()
    assert 6 * 0.05 <= busy <= 2 * wall


def test_the_pool_size_is_checked():
    with pytest.raises(ValueError, match="num_workers must be an int >= 1"):
        ThreadWorkerPool(0)
