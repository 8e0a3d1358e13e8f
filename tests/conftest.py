import os

import dspy
import pytest

from dspy_pxn import testing as sim
from dspy_pxn.testing import LatencyServer
from dspy_pxn.testing.mlflow_server import running_mlflow_server

# The slow tests, which `python -m pytest --full` runs too (CI does) and the README's `python -m pytest` leaves out:
# real servers (MLflow's, Ray's), killed subprocesses, the docs build, local LMs, each LM test's second engine
# (litellm: DSPy's default engine runs in the fast set), MLflow's GenAI optimization and evaluation end to end (each
# test a real optimize_prompts or evaluate run, 5-20 s; the fast set keeps the example that runs one), and long
# property runs. Mark one with @pytest.mark.slow. A test file named on the command line runs whole.
SLOW_MODULES = {"test_ray_pool.py", "test_concurrency.py", "test_lms.py", "test_docs.py", "test_mlflow_model.py",
                "test_bench_mlflow_prompts.py", "test_packaging.py", "test_resume.py", "test_tracking_failures.py",
                "test_mlflow_prompt_optimizer.py", "test_mlflow_prompt_evaluation.py"}
SLOW_FIXTURES = {"mlflow_server"}


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="also run the slow tests: servers, Ray, killed subprocesses, the docs build, local LMs, "
                          "the litellm engine variants, long property runs (CI runs them)")


def slow(item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return (item.path.name in SLOW_MODULES or bool(SLOW_FIXTURES & set(getattr(item, "fixturenames", ())))
            or any("litellm" in str(value) for value in params.values())
            or item.get_closest_marker("slow") is not None)


def named_files(config) -> set[str]:
    """The test files named on the command line (``pytest tests/test_x.py`` or ``tests/test_x.py::test_y``): asked
    for by name, so their slow tests run without ``--full``."""
    named = set()
    for arg in config.args:
        path = (config.invocation_params.dir / arg.split("::")[0]).resolve()
        if path.is_file():
            named.add(str(path))
    return named


def pytest_collection_modifyitems(config, items):
    if config.getoption("--full"):
        return
    named = named_files(config)
    kept, left_out = [], []
    for item in items:
        (left_out if slow(item) and str(item.path.resolve()) not in named else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (the project's addopts): every core, at most 4. The slow tests start servers and subprocesses of
    their own, so more workers than that buy contention, not speed."""
    return max(1, min(os.cpu_count() or 1, 4))


@pytest.fixture
def splits():
    return sim.make_splits(seed=0, train=30, val=12, test=30)


seed_program = sim.seed_program


@pytest.fixture
def program():
    return seed_program()


@pytest.fixture
def task_lm():
    lm = sim.SimulatedLM()
    with dspy.context(lm=lm):
        yield lm


@pytest.fixture(scope="module")
def sim_lm_flags():
    """`--lm/--reflection-lm/--api-base` for the CLI and the examples, aimed at a loopback latency server."""
    with LatencyServer(task_latency=0.01, reflection_latency=0.02) as server:
        yield ["--lm", "openai/sim-task", "--reflection-lm", "openai/sim-reflection", "--api-base", server.base_url]


@pytest.fixture(scope="module")
def mlflow_server():
    """A real `mlflow server` on loopback for the module's tests (sqlite store, local artifacts)."""
    with running_mlflow_server() as server:
        yield server


# DSPy's engines an LM call can take. Native first: a plain dspy.LM("openai/...", api_base=...) with no
# engine= argument goes through DSPy's own lm15 client, which is what users run.
ENGINES = {"native": {}, "litellm": {"engine": "litellm"}}


@pytest.fixture(params=list(ENGINES))
def engine(request) -> dict[str, str]:
    """The ``dspy.LM`` keyword that picks the engine, for a test about LM calls to run on each:
    ``server.lm("task", **engine)``."""
    return ENGINES[request.param]
