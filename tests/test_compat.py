"""The version ranges dspy-pxn declares are the ones CI runs, said the same in pyproject, the code and the docs."""

from __future__ import annotations

import logging
import pathlib
import re
import sys

import pytest

from dspy_pxn import compat

ROOT = pathlib.Path(__file__).resolve().parents[1]


def pyproject() -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - the 3.10 corner runs the smoke job, not this suite
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirement(name: str, requirements: list[str]) -> str:
    return next(r for r in requirements if re.match(rf"{name}\b(?!-)", r) and not r.startswith(f"{name}-"))


def test_no_dependency_is_pinned_and_each_minimum_is_the_tested_minimum():
    project = pyproject()["project"]
    for name in ("dspy", "gepa"):
        spec = requirement(name, project["dependencies"])
        assert "==" not in spec, spec
        assert f">={compat.TESTED[name][0]}" in spec, (spec, compat.TESTED[name])
    for extra in ("mlflow", "test"):
        spec = requirement("mlflow", project["optional-dependencies"][extra])
        assert "==" not in spec and spec.startswith("mlflow>=") and "<4" in spec, spec
        assert compat.release(spec.split(">=")[1].split(",")[0]) == compat.release(compat.TESTED["mlflow"][0])
    assert project["requires-python"] == ">=3.10"
    classifiers = [c.rsplit(" :: ", 1)[1] for c in project["classifiers"] if c.startswith("Programming Language :: Python :: 3.")]
    assert classifiers == ["3.10", "3.11", "3.12", "3.13"]


def test_ci_runs_each_corner_of_the_declared_range():
    ci = (ROOT / ".ci" / "run").read_text()
    dspy_min, mlflow_min = compat.TESTED["dspy"][0], compat.TESTED["mlflow"][0]
    assert f".ci/corner 3.10 dspy=={dspy_min} mlflow=={mlflow_min}" in ci
    assert '.ci/corner 3.13 "" ""' in ci  # the newest of each
    assert "python -m pytest" in ci and "python -m build" in ci


def test_the_compatibility_page_prints_the_tested_range_and_the_declared_one():
    page = (ROOT / "docs" / "guides" / "compatibility.md").read_text()
    project = pyproject()["project"]
    for name in ("dspy", "gepa", "mlflow"):
        oldest, newest = compat.TESTED[name]
        row = next(line for line in page.splitlines() if line.startswith(f"| {name}"))
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[1:3] == [oldest, newest], row
        requirements = project["dependencies"] + project["optional-dependencies"]["mlflow"]
        declared = requirement(name, requirements)[len(name):]
        assert cells[3] == f"`{','.join(sorted(declared.split(','), key=lambda p: not p.startswith('>')))}`", row
    extras = set(project["optional-dependencies"])
    listed = {m.group(1) for m in re.finditer(r"^\| `(\w+)` \|", page, re.MULTILINE)}
    assert listed == extras


@pytest.mark.parametrize(("installed", "warned"), [("3.4.1", False), ("3.4.0", False), ("3.4.2", True), ("3.3.1", True)])
def test_a_version_outside_the_tested_range_is_named_once_never_refused(monkeypatch, caplog, installed, warned):
    monkeypatch.setattr(compat.importlib.metadata, "version", lambda package: installed)
    monkeypatch.setattr(compat, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="dspy_pxn.compat"):
        compat.warn_if_untested("dspy")
        compat.warn_if_untested("dspy")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == int(warned)
    if warned:
        assert messages[0].startswith(f"dspy-pxn was tested with dspy 3.4.0 to 3.4.1; dspy {installed} is installed")


def test_the_compatibility_page_names_what_the_test_extra_installs():
    page = (ROOT / "docs" / "guides" / "compatibility.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| `test` |")).split("|")[2]
    for spec in pyproject()["project"]["optional-dependencies"]["test"]:
        name = re.match(r"[A-Za-z0-9_.-]+", spec).group()
        named = "the `docs` extra" if name == "dspy-pxn" else name
        assert named.lower() in row.lower(), (spec, row)
    assert "but datasets" in row  # the programs' online loaders are not needed offline
