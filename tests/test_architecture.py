"""The house rules of the package, checked on its source: the core imports no tooling, and no import circles.

The core is the top level of ``dspy_pxn`` (the optimizer, its strategies, adapter,
reflection, events, records, checks), ``dspy_pxn.schedules`` and ``dspy_pxn.pools``;
tooling lives in subpackages it must not import, so the optimizer can be read, and used,
without them. Imports inside functions count: a lazy import is still a dependency. An
import under ``if TYPE_CHECKING:`` does not: it never runs, it only names a type.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOOLING = ("dspy_pxn.tracking", "dspy_pxn.cli", "dspy_pxn.local", "dspy_pxn.testing", "dspy_pxn.programs",
           "dspy_pxn.planning")
CORE_PACKAGES = ("dspy_pxn.schedules", "dspy_pxn.pools")


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in (ROOT / "dspy_pxn").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def type_checking_blocks(tree: ast.AST) -> set[ast.AST]:
    """The nodes inside ``if TYPE_CHECKING:`` blocks."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            inside |= {child for statement in node.body for child in ast.walk(statement)}
    return inside


def imported(path: pathlib.Path, known: dict[str, pathlib.Path]) -> set[str]:
    """The dspy_pxn modules a file imports at run time, anywhere in it (``from a import b`` is a.b when that
    is a module)."""
    out = set()
    tree = ast.parse(path.read_text())
    types_only = type_checking_blocks(tree)
    for node in ast.walk(tree):
        if node in types_only:
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dspy_pxn"):
            out |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("dspy_pxn")}
    return out


def test_the_core_imports_no_tooling():
    known = modules()
    core = {name: path for name, path in known.items()
            if (name.count(".") == 1 and path.name != "__init__.py") or name.startswith(CORE_PACKAGES)}
    assert {"dspy_pxn.teleprompter", "dspy_pxn.run", "dspy_pxn.schedules.asynchronous"} <= set(core)
    offending = {name: sorted(t for t in imported(path, known) if t.startswith(TOOLING)) for name, path in core.items()}
    assert not {name: t for name, t in offending.items() if t}


def test_no_module_imports_itself_round_a_circle():
    known = modules()
    packages = {name for name, path in known.items() if path.name == "__init__.py"}  # re-exports, not dependencies
    graph = {name: imported(path, known) - packages - {name} for name, path in known.items() if name not in packages}

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
