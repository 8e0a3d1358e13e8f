"""What GEPA optimizes in a DSPy program: the same components dspy.GEPA optimizes.

dspy.GEPA (3.4.1) builds its seed candidate inside ``compile`` and does not expose it: the instruction of every
predictor that is not inside a ``dspy.Flex``, plus the whole source (``module_src``) of every ``dspy.Flex``
submodule, keyed by its parameter path. A Flex's own predictors are written by that source, so they are never
components of their own. This module restates that one rule.
"""

from __future__ import annotations

from dspy.primitives import Module
from dspy.teleprompt.gepa.gepa_flex_utils import enumerate_flex_submodules


def seed_candidate(student: Module) -> dict[str, str]:
    """Component name -> text: predictor instructions, then each Flex submodule's source."""
    instructions = {name: predictor.signature.instructions for name, predictor in student.named_predictors()}
    return instructions | {path: flex.module_src for path, flex in enumerate_flex_submodules(student).items()}


def code_components(student: Module) -> list[str]:
    """The components that are program source (``dspy.Flex``), not instructions."""
    return list(enumerate_flex_submodules(student))
