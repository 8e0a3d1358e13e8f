"""HoVer multi-hop retrieval agent and its recall metric with per-predictor feedback.

The agent gathers the Wikipedia articles needed to verify a claim in four hops. Each
hop a **query writer** (claim + notes -> query) searches BM25 for the top ``k``
passages and a **note taker** (claim + notes + passages -> new notes, relevant titles)
condenses them, so the next query can follow the chain (the "bridge" entity a
three-hop claim hides). Eight LM calls per rollout; GEPA optimizes both instructions.

The score is the fraction of the gold supporting articles among the titles retrieved in
any hop. GEPA reflects on one predictor at a time, so the feedback tells each predictor
where *it* lost the trail: the query writer which hop's query stopped finding new
supporting articles, the note taker which hop's notes dropped an article it was shown.

    from dspy_pxn.programs.hover import HoverAgent, metric, load_hover
    from dspy_pxn.programs.retrieval import open_index
    agent = HoverAgent(open_index(index_dir="wiki17.bm25", corpus="wiki.abstracts.2017.jsonl"))
    train, val, test = load_hover()   # offline: the dev release (not comparable to the paper's numbers)
"""

from __future__ import annotations

import html
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import dspy
from dspy_pxn.programs.data import load_hover
from dspy_pxn.programs.retrieval import Retriever, open_index

__all__ = [
    "WriteQuery",
    "TakeNotes",
    "HopRecord",
    "HoverAgent",
    "normalize_title",
    "unique_titles",
    "Recall",
    "recall",
    "metric",
    "score",
    "load_hover",
    "open_index",
]


class WriteQuery(dspy.Signature):
    """Write a search query for a Wikipedia article that is still needed to verify the claim, given the notes so far."""

    claim: str = dspy.InputField()
    notes: list[str] = dspy.InputField(desc="facts gathered in earlier hops (empty at the first hop)")
    query: str = dspy.OutputField(desc="a short keyword query for a BM25 search over Wikipedia abstracts")


class TakeNotes(dspy.Signature):
    """Read the retrieved passages and note the facts that help verify the claim, including entities still to look up."""

    claim: str = dspy.InputField()
    notes: list[str] = dspy.InputField(desc="facts gathered in earlier hops")
    passages: list[str] = dspy.InputField(desc="retrieved passages, each 'Title | text'")
    # Plain text, one item per line, rather than list[str]: a model that writes prose instead of a
    # JSON list still yields notes, where a typed list would fail the whole rollout on a parse error.
    new_notes: str = dspy.OutputField(desc="new facts from these passages that bear on the claim, one per line")
    titles: str = dspy.OutputField(desc="titles of the passages relevant to the claim, one per line")


@dataclass(frozen=True)
class HopRecord:
    """What one hop did: its query, the titles it retrieved, and what the note taker kept."""

    query: str
    retrieved: tuple[str, ...]
    noted_titles: tuple[str, ...]
    new_notes: tuple[str, ...]
    notes_before: tuple[str, ...]


def _as_list(value: Any) -> list[str]:
    """A one-item-per-line text output (or an actual list) as a list of non-empty items, bullets stripped."""
    if value is None:
        return []
    if isinstance(value, str):
        return [line.strip(" -*\t") for line in value.splitlines() if line.strip(" -*\t")]
    return [str(v) for v in value]


class HoverAgent(dspy.Module):
    """Four hops of query writer -> BM25 top-k -> note taker; returns every retrieved title, deduplicated in order."""

    def __init__(self, retriever: Retriever, *, k: int = 7, hops: int = 4) -> None:
        super().__init__()
        if not (isinstance(k, int) and k > 0):
            raise ValueError(f"HoverAgent(k=...) must be a positive int, got {k!r}")
        if not (isinstance(hops, int) and hops > 0):
            raise ValueError(f"HoverAgent(hops=...) must be a positive int, got {hops!r}")
        self.retriever = retriever
        self.k = k
        self.hops = hops
        self.write_query = dspy.ChainOfThought(WriteQuery)
        self.take_notes = dspy.ChainOfThought(TakeNotes)
        self.metric = metric  # its GEPA feedback metric: BatchedGEPA uses it when given none

    def forward(self, claim: str) -> dspy.Prediction:
        notes: list[str] = []
        records: list[HopRecord] = []
        for _ in range(self.hops):
            query = str(self.write_query(claim=claim, notes=notes).query or "").strip()
            passages = self.retriever.search(query, self.k) if query else []
            taken = self.take_notes(claim=claim, notes=notes, passages=[f"{p.title} | {p.text}" for p in passages])
            new_notes = _as_list(taken.new_notes)
            records.append(HopRecord(query, tuple(p.title for p in passages), tuple(_as_list(taken.titles)),
                                     tuple(new_notes), tuple(notes)))
            notes = notes + new_notes
        retrieved = unique_titles(title for hop in records for title in hop.retrieved)
        return dspy.Prediction(titles=retrieved, notes=notes, hops=records)


# --------------------------------------------------------------------------- #
# Metric
# --------------------------------------------------------------------------- #


def normalize_title(title: str) -> str:
    """Comparable form of a Wikipedia title: HTML entities decoded, NFC, case-folded, '_' as space, single spaces."""
    text = unicodedata.normalize("NFC", html.unescape(str(title))).replace("_", " ")
    return " ".join(text.split()).casefold()


def unique_titles(titles: Iterable[str]) -> list[str]:
    """Titles with duplicates (after normalization) removed, first occurrence kept, order preserved."""
    seen: dict[str, str] = {}
    for title in titles:
        seen.setdefault(normalize_title(title), str(title))
    return list(seen.values())


@dataclass(frozen=True)
class Recall:
    """Gold titles found and missing, both in gold order, and the score ``len(found) / len(gold)``."""

    found: tuple[str, ...]
    missing: tuple[str, ...]

    @property
    def score(self) -> float:
        total = len(self.found) + len(self.missing)
        return len(self.found) / total if total else 0.0


def recall(gold_titles: Sequence[str], retrieved: Iterable[str]) -> Recall:
    """Which gold titles are among the retrieved ones (compared after :func:`normalize_title`)."""
    got = {normalize_title(t) for t in retrieved}
    gold = unique_titles(gold_titles)
    return Recall(tuple(t for t in gold if normalize_title(t) in got),
                  tuple(t for t in gold if normalize_title(t) not in got))


def _gold_titles(gold: Any) -> list[str]:
    titles = gold.get("titles") if hasattr(gold, "get") else getattr(gold, "titles", None)
    if not titles:
        raise ValueError(
            "HoVer gold example has no `titles`; build examples with dspy_pxn.programs.data.hover_example(row) or load_hover()."
        )
    return list(titles)


def _quote(titles: Iterable[str]) -> str:
    return ", ".join(f'"{t}"' for t in titles) or "none"


def _query_feedback(hops: Sequence[HopRecord], gold: Sequence[str]) -> str:
    """Per hop: the query and the supporting articles it newly found; where the search stopped making progress."""
    lines, found_so_far = [], set()
    last_progress = -1
    for i, hop in enumerate(hops):
        new = [t for t in gold if normalize_title(t) not in found_so_far
               and normalize_title(t) in {normalize_title(r) for r in hop.retrieved}]
        found_so_far |= {normalize_title(t) for t in new}
        if new:
            last_progress = i
        lines.append(f'Hop {i + 1} query "{hop.query}" found {_quote(new) if new else "no new supporting article"}.')
    missing = [t for t in gold if normalize_title(t) not in found_so_far]
    if not missing:
        lines.append(f"All supporting articles were found by hop {last_progress + 1}.")
    elif last_progress + 1 < len(hops):
        lines.append(f"The trail was lost at hop {last_progress + 2}: from there on no query found {_quote(missing)}. "
                     "Queries should target the entity the notes say is still unknown, not repeat earlier searches.")
    else:
        lines.append(f"Every hop found something, but {_quote(missing)} was never retrieved.")
    return " ".join(lines)


def _notes_feedback(hops: Sequence[HopRecord], gold: Sequence[str]) -> str:
    """Per hop: supporting articles the note taker was shown but neither listed nor mentioned in its notes."""
    lines, lost_at = [], None
    for i, hop in enumerate(hops):
        shown = [t for t in gold if normalize_title(t) in {normalize_title(r) for r in hop.retrieved}]
        if not shown:
            continue
        kept_titles = {normalize_title(t) for t in hop.noted_titles}
        notes_text = normalize_title(" ".join(hop.new_notes))
        dropped = [t for t in shown if normalize_title(t) not in kept_titles and normalize_title(t) not in notes_text]
        if dropped:
            lost_at = i if lost_at is None else lost_at
            lines.append(f"Hop {i + 1} notes dropped {_quote(dropped)}, which the passages contained.")
        else:
            lines.append(f"Hop {i + 1} notes kept {_quote(shown)}.")
    if lost_at is not None:
        lines.append(f"The notes lost the trail at hop {lost_at + 1}.")
    elif not lines:
        lines.append("No supporting article was retrieved, so the notes had nothing relevant to keep; "
                     "notes should name the entities the claim still needs so the next query can find them.")
    return " ".join(lines)


def _which_hop(hops: Sequence[HopRecord], pred_trace: Any) -> int | None:
    """The hop a reflective example shows, recognised by the notes it was given (first match)."""
    try:
        inputs = pred_trace[0][1]
        notes = tuple(_as_list(inputs.get("notes")))
    except (TypeError, IndexError, AttributeError, KeyError):
        return None
    return next((i for i, hop in enumerate(hops) if hop.notes_before == notes), None)


def metric(gold, pred, trace=None, pred_name=None, pred_trace=None) -> dspy.Prediction:
    """DSPy GEPA feedback metric: recall of the gold supporting articles among all retrieved titles.

    The feedback names the found and the missing articles; for ``write_query`` it says which
    hop's query lost the trail, for ``take_notes`` which hop's notes dropped an article it saw;
    without ``pred_name`` it gives both.
    """
    gold_titles = unique_titles(_gold_titles(gold))
    retrieved = getattr(pred, "titles", None) or []
    result = recall(gold_titles, retrieved)
    head = (f"Retrieved {len(result.found)} of {len(gold_titles)} supporting articles (score {result.score:.2f}). "
            f"Found: {_quote(result.found)}. Missing: {_quote(result.missing)}.")
    hops: Sequence[HopRecord] = getattr(pred, "hops", None) or []
    if not hops:
        return dspy.Prediction(score=result.score, feedback=head + " The program recorded no hops.")
    parts = [head]
    hop = _which_hop(hops, pred_trace) if pred_trace else None
    if hop is not None:
        parts.append(f"(This example is hop {hop + 1}.)")
    name = str(pred_name or "")
    if not name.startswith("take_notes"):
        parts.append(_query_feedback(hops, gold_titles))
    if not name.startswith("write_query"):
        parts.append(_notes_feedback(hops, gold_titles))
    return dspy.Prediction(score=result.score, feedback=" ".join(parts))


def score(gold, pred, trace=None) -> float:
    """The metric's score alone, for ``dspy.Evaluate``."""
    return recall(_gold_titles(gold), getattr(pred, "titles", None) or []).score
