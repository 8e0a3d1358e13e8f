"""Planning a run before paying for it: the paper's runtime model, fitted from step records, ranking P×N.

Tooling, not the optimizer: the command line (``dspy-pxn plan``), the run plots and the
benchmarks use it; ``BatchedGEPA`` never does. It reasons with the optimizer's own budget
arithmetic (``dspy_pxn.ledger.budget``), so a plan and a run cannot disagree about what fits.
"""

from dspy_pxn.planning.runtime_model import (
    DEFAULT_SHAPES,
    Prediction,
    RunShape,
    RuntimeModel,
    floor_seconds,
    parse_shapes,
    shapes_for,
)

__all__ = ["DEFAULT_SHAPES", "Prediction", "RunShape", "RuntimeModel", "floor_seconds", "parse_shapes", "shapes_for"]
