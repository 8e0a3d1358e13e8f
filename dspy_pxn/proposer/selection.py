"""Which improving children of a step are fully validated: the one vocabulary for it.

Users say ``"all"`` (every improving child, the paper's AllImprovements), ``"best"`` (the single best), an int *k*
(top-k), ``"merge"`` (the improving children merged into one candidate, ``dspy_pxn.proposer.sibling_merge``),
``"merge+best"`` (that merge and the best child), or hand over a gepa ``SelectionStrategy``. The optimizer, the
run's description (tracking params, resume settings), the runtime model and the command line all parse and name a
selection here, so "top-2" means one thing.
"""

from __future__ import annotations

from typing import Any

from gepa.strategies.proposal_selection import AllImprovements, BestImprovement, SelectionStrategy, TopKImprovements

Selection = str | int  # "all", "best", "merge", "merge+best" or k; what the runtime model and the CLI reason about

NAMED = ("all", "best", "merge", "merge+best")
MERGES = ("merge", "merge+best")  # built by the optimizer (they need its reflection LM and pool)
HINT = "use 'all', 'best', 'merge', 'merge+best', a positive int k (top-k), or a gepa SelectionStrategy instance"


def spec(selection: Any) -> Selection:
    """A named selection or k, checked; a gepa strategy of one of those kinds gives its spec."""
    if isinstance(selection, str) and selection in NAMED:
        return selection
    if isinstance(selection, int) and not isinstance(selection, bool) and selection >= 1:
        return selection
    if isinstance(selection, AllImprovements):
        return "all"
    if isinstance(selection, BestImprovement):
        return "best"
    if isinstance(selection, TopKImprovements):
        return selection.k
    raise ValueError(f"selection={selection!r} is not understood: {HINT}.")


def checked(selection: Any) -> str | int | SelectionStrategy:
    """The selection as given, once it is known to be one (a custom strategy has ``select``)."""
    if hasattr(selection, "select") and not isinstance(selection, (str, int)):
        return selection
    return spec(selection)


def strategy(selection: str | int | SelectionStrategy) -> SelectionStrategy:
    """The gepa strategy for a selection (a strategy passed in is used as it is); not for the merges."""
    chosen = checked(selection)
    if not isinstance(chosen, (str, int)):
        return chosen
    if chosen in MERGES:
        raise ValueError(f"selection={chosen!r} is built by the optimizer with its reflection LM (dspy_pxn.proposer.sibling_merge).")
    if isinstance(chosen, int):
        return TopKImprovements(chosen)
    return AllImprovements() if chosen == "all" else BestImprovement()


def label(selection: Any) -> str:
    """'all', 'best', 'merge', 'merge+best', 'top-2', or the class name of a custom strategy."""
    try:
        chosen = spec(selection)
    except ValueError:
        return type(selection).__name__
    return f"top-{chosen}" if isinstance(chosen, int) else chosen


def parse(text: str) -> Selection:
    """A command-line value: a named selection or a number k."""
    return spec(int(text) if text.strip().isdigit() else text.strip())


def kept(selection: Selection | SelectionStrategy, improvers: int) -> int:
    """How many of ``improvers`` improving children the selection may validate (a custom strategy: all)."""
    try:
        chosen = spec(selection)
    except ValueError:
        return improvers
    return min(improvers, {"all": improvers, "best": 1, "merge": 1, "merge+best": 2}.get(chosen, chosen))
