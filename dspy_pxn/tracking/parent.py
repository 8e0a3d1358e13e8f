"""The sweep a run is compiled in, if any: its parent MLflow run and its log directory.

Kept apart from ``sweep()`` itself because both sides read it: the sweep sets it, and a
tracked run started inside the block nests under it.
"""

from __future__ import annotations

import contextvars
import os
from dataclasses import dataclass, field

from dspy_pxn.tracking.config import slug
from dspy_pxn.tracking.runlog import RunManifest


@dataclass
class Sweep:
    """A parent run whose children are the BatchedGEPA runs compiled inside ``with sweep(...)``."""

    manifest: RunManifest
    log_dir: str
    online: bool
    children: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str | None:
        return self.manifest.run_id

    def child_log_dir(self, run_name: str) -> str:
        return os.path.join(self.log_dir, f"{len(self.children) + 1:02d}-{slug(run_name)}")


CURRENT_SWEEP: contextvars.ContextVar[Sweep | None] = contextvars.ContextVar("dspy_pxn_sweep", default=None)


def current_sweep() -> Sweep | None:
    return CURRENT_SWEEP.get()
