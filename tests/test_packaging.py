"""What `pip install dspy-pxn` puts on the import path: one top-level package, nothing else."""

import subprocess
import sys


def test_the_task_programs_install_under_dspy_pxn_and_claim_no_top_level_name(tmp_path):
    # A fresh interpreter outside the checkout, so only what the installation provides is importable.
    script = (
        "import importlib.util as u\n"
        "import dspy_pxn.programs.math_solver, dspy_pxn.programs.hover, dspy_pxn.programs.retrieval\n"
        "print(u.find_spec('programs') is None)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_every_subpackage_is_in_the_wheel():
    import pathlib

    import tomllib

    root = pathlib.Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(path.parent.relative_to(root).parts) for path in (root / "dspy_pxn").rglob("__init__.py")
    } | {"dspy_pxn.programs"}
    assert listed == on_disk
