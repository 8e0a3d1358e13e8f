"""A small stand-in for the Wikipedia abstracts, built from HoVer claims, for offline tests and demos.

The 5.2M-abstract corpus cannot be shipped or fetched offline, and HoVer's release files
carry titles but no passage text. Each supporting title becomes one document whose text is
the claims that cite it, so BM25 over it behaves like the real thing in miniature: a query
naming an entity from a claim finds that claim's articles. Generated on demand, never
committed (the claims are CC BY-SA data).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import dspy

__all__ = ["claims_corpus", "write_claims_corpus"]


def claims_corpus(examples: Iterable[dspy.Example]) -> list[dict[str, str]]:
    """One ``{"title", "text"}`` document per distinct gold title, in first-seen order; text = title + citing claims."""
    texts: dict[str, list[str]] = {}
    for example in examples:
        for title in example.titles:
            texts.setdefault(title, []).append(example.claim)
    return [{"title": title, "text": f"{title}. " + " ".join(claims)} for title, claims in texts.items()]


def write_claims_corpus(examples: Iterable[dspy.Example], path: str | os.PathLike[str]) -> Path:
    """Write :func:`claims_corpus` as JSONL (the format ``dspy_pxn.programs.retrieval`` indexes); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for doc in claims_corpus(examples):
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
    return path
