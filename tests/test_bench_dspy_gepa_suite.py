"""benchmarks/bench_dspy_gepa_suite.py on a DSPy checkout of its own making: the checkout's tests run against the
installed DSPy (never the checkout's ``dspy/``), once as written and once with the class swapped."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scripts import ROOT, load_script

BENCH = ROOT / "benchmarks" / "bench_dspy_gepa_suite.py"

# A test file at one of the suite's paths: which DSPy it imported, and which GEPA class it sees.
PROBE = '''
import dspy

def test_imports_the_installed_dspy():
    assert "{checkout}" not in dspy.__file__, dspy.__file__

def test_gepa_is_dspys():
    assert dspy.GEPA.__module__.startswith("dspy."), dspy.GEPA
'''


@pytest.mark.slow
def test_a_checkouts_tests_run_against_the_installed_dspy_with_and_without_the_swap(tmp_path: Path) -> None:
    checkout = tmp_path / "dspy-checkout"
    (checkout / "dspy").mkdir(parents=True)
    (checkout / "dspy" / "__init__.py").write_text("raise ImportError('the checkout DSPy was imported')\n")
    (checkout / "tests" / "teleprompt").mkdir(parents=True)
    (checkout / "tests" / "__init__.py").write_text("")  # a package: pytest would put the checkout root on sys.path
    (checkout / "tests" / "teleprompt" / "__init__.py").write_text("")
    (checkout / "tests" / "teleprompt" / "test_gepa.py").write_text(PROBE.format(checkout=checkout))
    bench = load_script(BENCH)

    original, swapped = bench.outcomes(checkout, swapped=False), bench.outcomes(checkout, swapped=True)

    probe = "tests/teleprompt/test_gepa.py::"
    assert original == {probe + "test_imports_the_installed_dspy": "PASSED", probe + "test_gepa_is_dspys": "PASSED"}
    assert swapped == {probe + "test_imports_the_installed_dspy": "PASSED", probe + "test_gepa_is_dspys": "FAILED"}
