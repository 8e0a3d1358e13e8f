import dspy
import pytest

from dspy_pxn import simulation as sim


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
