import os

import dspy
import pytest

from dspy_pxn import testing as sim
from dspy_pxn.testing import LatencyServer
from dspy_pxn.testing.mlflow_server import running_mlflow_server


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
