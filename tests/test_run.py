"""One compile's story: what Run.prepare decides is decided once, and compile survives a gepa that returns less."""

import logging

import gepa
import pytest

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim
from dspy_pxn.engine import description
from dspy_pxn.ledger import budget
from dspy_pxn.targets.program import components
from tests.conftest import seed_program


def counting(monkeypatch, owner, name):
    """Count the calls of ``owner.name`` during the test (the original still runs)."""
    calls = []
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


@pytest.mark.parametrize("schedule", ["steps", "async"])
def test_the_seed_candidate_guard_and_description_are_built_once_per_compile(task_lm, splits, monkeypatch, schedule):
    seeds = counting(monkeypatch, components, "seed_candidate")
    guards = counting(monkeypatch, budget.BudgetGuard, "__init__")
    descriptions = counting(monkeypatch, description.RunDescription, "__init__")
    train, val, _ = splits
    result = BatchedGEPA(metric=sim.metric, p=2, n=2, max_metric_calls=120, num_threads=8, schedule=schedule,
                         reflection_lm=sim.SimulatedLM()).compile(seed_program(), trainset=train, valset=val)
    assert len(result.detailed_results.candidates) > 1  # a real search happened in between
    assert (len(seeds), len(guards), len(descriptions)) == (1, 1, 1)


class StandInResult:
    """What DSPy's own GEPA tests return from a monkeypatched gepa.optimize: a best candidate, little else."""

    def __init__(self, best_candidate):
        self.best_candidate = best_candidate
        self.val_aggregate_scores = []


def test_a_gepa_result_without_metric_calls_still_returns_the_program(task_lm, splits, monkeypatch, caplog):
    seen = {}

    def stand_in_optimize(**kwargs):
        seen.update(kwargs)
        return StandInResult({**kwargs["seed_candidate"], "predict": "Answer with the rule applied."})

    monkeypatch.setattr(gepa, "optimize", stand_in_optimize)
    train, val, _ = splits
    with caplog.at_level(logging.WARNING):
        program = BatchedGEPA(metric=sim.metric, max_metric_calls=100, reflection_lm=sim.SimulatedLM()).compile(
            seed_program(), trainset=train, valset=val)
    assert program.predict.signature.instructions == "Answer with the rule applied."
    assert seen["seed_candidate"] == components.seed_candidate(seed_program())
    assert not hasattr(program, "detailed_results")
    assert "without detailed_results" in caplog.text


def test_the_adapter_is_seeded_as_dspy_gepa_seeds_it_and_its_state_is_saved(task_lm, splits, monkeypatch, tmp_path):
    """dspy's adapter picks which of a predictor's calls reflection reads with its own generator: dspy.GEPA
    seeds it with ``seed``, and a resumed run must continue it, so it rides in gepa's saved state."""
    import random

    from dspy_pxn.engine.resume import load_saved_state
    from dspy_pxn.targets.program import target as targets

    made = []
    original = targets.BatchedAdapter

    def recording(*args, **kwargs):
        made.append(kwargs["rng"].getstate())
        return original(*args, **kwargs)

    monkeypatch.setattr(targets, "BatchedAdapter", recording)
    train, val, _ = splits
    BatchedGEPA(metric=sim.metric, max_metric_calls=60, seed=7, log_dir=str(tmp_path), schedule="steps",
                reflection_lm=sim.SimulatedLM()).compile(seed_program(), trainset=train, valset=val)
    assert made == [random.Random(7).getstate()]
    saved = load_saved_state(str(tmp_path)).adapter_state
    assert "rng_state" in saved and "dspy_pxn" in saved
