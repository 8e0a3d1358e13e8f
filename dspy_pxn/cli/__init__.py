"""The `dspy-pxn` command line (entry point: ``dspy_pxn.cli:main``)."""

from dspy_pxn.cli.main import build_parser, main
from dspy_pxn.cli.output import BAR_WIDTH, budget_bar
from dspy_pxn.cli.run import DEMO_DEFAULTS

__all__ = ["BAR_WIDTH", "DEMO_DEFAULTS", "budget_bar", "build_parser", "main"]
