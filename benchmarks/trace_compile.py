"""What a maintainer meets in one compile: dspy-pxn's classes with methods called, modules, and the paths between them.

Traces one default 2×2 compile on the in-process simulated LM with ``sys.setprofile`` (every Python call
of every thread), and counts, among dspy-pxn's own core modules (``dspy_pxn`` but ``testing``,
``planning``, ``tracking``, ``local`` and ``cli``): the classes whose methods ran, the modules whose code
ran, and the distinct module-to-module paths a call crossed (and how many calls crossed them). A class
counts when a method written in it ran, on its own objects or a subclass's (a dataclass's generated ``__init__``
alone does not).

    python benchmarks/trace_compile.py            # 2×2, B 120, |val| 12
    python benchmarks/trace_compile.py --list     # the classes and paths themselves
"""

from __future__ import annotations

import argparse
import collections
import logging
import sys
import threading

import dspy

from dspy_pxn import BatchedGEPA
from dspy_pxn import testing as sim

TOOLING = ("dspy_pxn.testing", "dspy_pxn.planning", "dspy_pxn.tracking", "dspy_pxn.local", "dspy_pxn.cli")


def core(module: str | None) -> bool:
    return bool(module) and module.startswith("dspy_pxn") and not module.startswith(TOOLING)


def writer(kind: type, code: object) -> type | None:
    """The class whose body holds the method running ``code``: a base class's method called on a subclass's
    object counts as the base class (a maintainer reads it there), not as the subclass nor as nothing."""
    for cls in kind.__mro__:
        member = vars(cls).get(code.co_name)
        if member is None:
            continue
        function = getattr(member, "fget", None) or getattr(member, "__func__", member)
        while function is not None:
            if getattr(function, "__code__", None) is code:
                return cls
            function = getattr(function, "__wrapped__", None)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the classes and the paths")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    classes: set[str] = set()
    modules: set[str] = set()
    paths: collections.Counter[tuple[str, str]] = collections.Counter()

    def profile(frame, event, arg):  # noqa: ANN001 - sys.setprofile's signature
        if event != "call":
            return
        module = frame.f_globals.get("__name__")
        if not core(module):
            return
        modules.add(module)
        owner = frame.f_locals.get("self", frame.f_locals.get("cls"))
        if owner is not None and not frame.f_code.co_filename.startswith("<"):  # not a dataclass's generated __eq__
            kind = writer(owner if isinstance(owner, type) else type(owner), frame.f_code)
            if kind is not None and core(kind.__module__):
                classes.add(f"{kind.__module__}.{kind.__qualname__}")
        caller = frame.f_back.f_globals.get("__name__") if frame.f_back is not None else None
        if core(caller) and caller != module:
            paths[(caller, module)] += 1

    train, val, _ = sim.make_splits(seed=0, train=30, val=12, test=1)
    optimizer = BatchedGEPA(metric=sim.metric, p=2, n=2, max_metric_calls=120, num_threads=8,
                            reflection_lm=sim.SimulatedLM())
    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        with dspy.context(lm=sim.SimulatedLM()):
            result = optimizer.compile(sim.seed_program(), trainset=train, valset=val).detailed_results
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    print(f"one default 2×2 compile ({result.total_metric_calls} metric calls): {len(classes)} classes with methods "
          f"called, {len(modules)} core modules, {len(paths)} module-to-module paths, {sum(paths.values())} crossings")
    if args.list:
        print("\n".join(sorted(classes)))
        for (caller, callee), count in sorted(paths.items()):
            print(f"{caller} -> {callee}: {count}")


if __name__ == "__main__":
    main()
