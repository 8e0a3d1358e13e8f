"""DSPy's own GEPA tests, run as they are and with ``dspy.GEPA`` replaced by ``BatchedGEPA``, side by side.

A drop-in runs what the original runs: this runs DSPy's GEPA test files from a DSPy checkout (they
are not in DSPy's wheel or sdist) against the installed DSPy, once as written and once with the
class swapped (``swap_dspy_gepa.py``), and prints each test that the two runs score differently.

    git clone https://github.com/stanfordnlp/dspy /tmp/dspy
    python benchmarks/bench_dspy_gepa_suite.py --dspy-checkout /tmp/dspy

A checkout of another DSPy version than the installed one has tests that fail under dspy.GEPA too
(recorded LM replies of another version); only the tests that pass under dspy.GEPA and fail under
BatchedGEPA say something about BatchedGEPA.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TEST_FILES = ("tests/teleprompt/test_gepa.py", "tests/teleprompt/test_gepa_instruction_proposer.py",
              "tests/flex/test_flex_gepa.py", "tests/flex/test_flex_gepa_seed.py")
OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR) (tests/\S+::\S+)", re.MULTILINE)  # pytest -rA's summary


def outcomes(checkout: Path, swapped: bool) -> dict[str, str]:
    """Each test's outcome, from one pytest run of the checkout's tests (its conftest, its data files).

    They run from a copy of ``tests/`` (and ``pyproject.toml``, its pytest settings) in a directory of their own:
    in the checkout, pytest would put the checkout's root on ``sys.path`` (``tests/`` is a package) and the tests
    would import the checkout's ``dspy/`` instead of the installed DSPy."""
    files = [name for name in TEST_FILES if (checkout / name).exists()]
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True",
               PYTHONPATH=os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")])))
    plugin = ["-p", "swap_dspy_gepa"] if swapped else []
    with tempfile.TemporaryDirectory(prefix="dspy-gepa-tests-") as copy:
        shutil.copytree(checkout / "tests", Path(copy) / "tests")
        if (checkout / "pyproject.toml").exists():
            shutil.copy(checkout / "pyproject.toml", copy)
        run = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-q", "-p", "no:cacheprovider", *plugin, *files],
                             cwd=copy, env=env, capture_output=True, text=True, check=False)
    return {test: outcome for outcome, test in OUTCOME.findall(run.stdout)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dspy-checkout", type=Path, required=True, help="a clone of DSPy's repository")
    args = parser.parse_args()
    original, swapped = outcomes(args.dspy_checkout, False), outcomes(args.dspy_checkout, True)
    for name, run in (("dspy.GEPA", original), ("BatchedGEPA", swapped)):
        counts = {kind: sum(outcome == kind for outcome in run.values()) for kind in ("PASSED", "FAILED", "ERROR")}
        print(f"{name}: {counts['PASSED']} passed, {counts['FAILED']} failed, {counts['ERROR']} errors")
    print("\n| test | dspy.GEPA | BatchedGEPA |\n|---|---|---|")
    for test in sorted(set(original) | set(swapped)):
        if original.get(test) != swapped.get(test):
            print(f"| {test} | {original.get(test, '-')} | {swapped.get(test, '-')} |")


if __name__ == "__main__":
    main()
