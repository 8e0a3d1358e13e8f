"""The `dspy-pxn` command line (entry point: ``dspy_pxn.cli:main``)."""

from dspy_pxn.cli.main import build_parser, main
from dspy_pxn.cli.optimize import DEMO_DEFAULTS
from dspy_pxn.cli.output import BAR_WIDTH, budget_bar

__all__ = ["BAR_WIDTH", "DEMO_DEFAULTS", "budget_bar", "build_parser", "main"]
