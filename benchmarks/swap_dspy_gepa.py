"""A pytest plugin: every test sees ``dspy.GEPA`` replaced by ``BatchedGEPA``, the class name only.

Loaded by ``bench_dspy_gepa_suite.py`` (``pytest -p swap_dspy_gepa``) to run DSPy's own GEPA tests
against BatchedGEPA as a user who swaps the class would.
"""

import dspy
import dspy.teleprompt
import pytest

from dspy_pxn import BatchedGEPA


@pytest.fixture(autouse=True)
def _dspy_gepa_is_batched_gepa(monkeypatch):
    monkeypatch.setattr(dspy, "GEPA", BatchedGEPA)
    monkeypatch.setattr(dspy.teleprompt, "GEPA", BatchedGEPA)
