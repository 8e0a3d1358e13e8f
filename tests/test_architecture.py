"""The house rules of the package, checked on its source: its rooms, the core importing no tooling, no import
circles, modules that fit in a reading, and no part that hears the step events it tells.

The rooms are the folders: the core is the top level of ``dspy_pxn`` (the optimizer, its settings and checks),
``engine`` (one compile: the run, its target protocol, the pooled adapter, events, records, width, resume),
``schedules``, ``proposer`` (reflection, the sibling merge, selection), ``targets/program`` (a DSPy program as the
target), ``ledger`` and ``pools``; tooling is every other folder (``targets/mlflow_prompts`` among them: it needs
MLflow), which the core must not import, so the optimizer can be read, and used, without it. Every import counts, a
lazy one inside a function and one under ``if TYPE_CHECKING:`` too: a type named across a circle is still two
modules that need each other to be read.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOOLING = ("dspy_pxn.tracking", "dspy_pxn.cli", "dspy_pxn.local", "dspy_pxn.testing", "dspy_pxn.programs",
           "dspy_pxn.planning", "dspy_pxn.targets.mlflow_prompts")
CORE_PACKAGES = ("dspy_pxn.engine", "dspy_pxn.schedules", "dspy_pxn.proposer", "dspy_pxn.targets.program",
                 "dspy_pxn.pools", "dspy_pxn.ledger")
# Files that share a name across rooms, each pair playing one role: a target's adapter and target (the engine's
# protocol and the two targets), and tooling's own.
SAME_ROLE = {"__init__.py", "adapter.py", "target.py"}


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in (ROOT / "dspy_pxn").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imported(path: pathlib.Path, known: dict[str, pathlib.Path]) -> set[str]:
    """The dspy_pxn modules a file imports, anywhere in it, for types only too (``from a import b`` is a.b
    when that is a module)."""
    out = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dspy_pxn"):
            out |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("dspy_pxn")}
    return out


def test_the_core_imports_no_tooling():
    known = modules()
    core = {name: path for name, path in known.items()
            if (name.count(".") == 1 and path.name != "__init__.py") or name.startswith(CORE_PACKAGES)}
    assert {"dspy_pxn.teleprompter", "dspy_pxn.engine.run", "dspy_pxn.schedules.asynchronous",
            "dspy_pxn.ledger.ledger"} <= set(core)
    offending = {name: sorted(t for t in imported(path, known) if t.startswith(TOOLING)) for name, path in core.items()}
    assert not {name: t for name, t in offending.items() if t}


def test_no_module_imports_itself_round_a_circle():
    known = modules()
    # A package counts as the modules its __init__ imports: importing its re-export is importing them.
    graph = {name: imported(path, known) - {name} for name, path in known.items()}

    def reaches(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    circles = sorted(name for name in graph if name in reaches(name))
    assert not circles


def test_no_module_is_over_450_lines_and_the_teleprompter_is_at_most_350():
    lengths = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    assert not {name: n for name, n in lengths.items() if n > 450}
    assert lengths["dspy_pxn.teleprompter"] <= 350


def test_the_rooms_are_the_folders_and_the_top_holds_at_most_eight_modules():
    top = sorted(path.name for path in (ROOT / "dspy_pxn").glob("*.py"))
    assert len(top) <= 8, top
    rooms = {name.rsplit(".", 1)[0] for name, path in modules().items() if path.name != "__init__.py"}
    assert all(room.startswith((*CORE_PACKAGES, *TOOLING)) or room == "dspy_pxn" for room in rooms), rooms


def test_no_two_files_of_one_name_in_different_rooms_unless_they_play_one_role():
    by_name: dict[str, list[str]] = {}
    for name, path in modules().items():
        by_name.setdefault(path.name, []).append(name)
    shared = {file: sorted(names) for file, names in by_name.items() if len(names) > 1 and file not in SAME_ROLE}
    assert not shared, shared


def test_no_part_hears_the_step_events_it_tells():
    """A class that tells step events (``events.evaluated(...)`` and the rest) is not a step listener itself: what it
    learns of a step it is told directly, so the bus carries each event from its teller to others only."""
    import importlib
    import inspect

    from dspy_pxn.engine.events import StepListener

    event_names = {name for name in vars(StepListener) if not name.startswith("_")}
    tellers = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            tells = any(isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr in event_names and isinstance(call.func.value, ast.Attribute)
                        and call.func.value.attr == "events" for call in ast.walk(node))
            if tells:
                tellers.append(getattr(importlib.import_module(name), node.name))
    assert len(tellers) >= 5, tellers  # the adapter, the reflection, the sibling merge, two schedules' strategies
    assert not [cls for cls in tellers if inspect.isclass(cls) and issubclass(cls, StepListener)]
