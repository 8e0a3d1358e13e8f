"""Loaders and split recipes for the task programs' data sets.

Two sources, chosen explicitly by the caller:

* **local** (the default): a directory shaped like the project's shared data folder —
  ``livebench_math/{AMPS_Hard,math_comp,olympiad}_question.jsonl`` and
  ``hover/hover_dev_release_v1.1.json`` — given as ``data_dir=`` or by the
  ``DSPY_PXN_DATA_DIR`` environment variable. Works offline.
* **online** (``online=True``): the Hugging Face hub through ``datasets``. Never the
  default, so nothing here touches the network unless the user asks.

The data files themselves are never part of this repository (their licences are
named where each loader reads them). The split recipes are deterministic functions
of the rows, so a local copy and the hub give the same split of the same rows.
"""

from __future__ import annotations

import html
import json
import os
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import dspy
from dspy_pxn.programs.split import Split

__all__ = [
    "DATA_DIR_ENV",
    "DataNotFoundError",
    "Split",
    "resolve_data_dir",
    "largest_remainder",
    "stratified_split",
    "load_livebench_math",
    "livebench_math_rows",
    "livebench_math_example",
    "load_hover",
    "hover_rows",
    "hover_split",
    "hover_example",
    "supporting_titles",
]

DATA_DIR_ENV = "DSPY_PXN_DATA_DIR"

LIVEBENCH_MATH_FILES = ("AMPS_Hard_question.jsonl", "math_comp_question.jsonl", "olympiad_question.jsonl")
LIVEBENCH_MATH_HF = "livebench/math"  # one "test" split of 368 questions; Apache-2.0 (LiveBench datasheet)
HOVER_DEV_FILE = "hover_dev_release_v1.1.json"
HOVER_HF = "hover-nlp/hover"  # CC BY-SA 4.0 data


class DataNotFoundError(FileNotFoundError):
    """Neither a usable local directory nor the online source could provide a data set."""


# --------------------------------------------------------------------------- #
# Sources
# --------------------------------------------------------------------------- #


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The local data directory: the argument if given, else ``$DSPY_PXN_DATA_DIR``, else None."""
    if data_dir is not None:
        return Path(data_dir)
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env) if env else None


def _not_found(what: str, needed: str, data_dir: Path | None, hub: str) -> DataNotFoundError:
    where = (
        f"the local directory {data_dir} has no {needed}"
        if data_dir is not None
        else f"no data_dir argument was given and ${DATA_DIR_ENV} is not set"
    )
    return DataNotFoundError(
        f"{what} data not found: {where}. Fix: pass data_dir=PATH (or set {DATA_DIR_ENV}=PATH) to a directory "
        f"containing {needed}, or pass online=True to download {hub!r} from the Hugging Face hub "
        "(needs `pip install datasets` and network access)."
    )


def _load_hub(path: str, split: str, what: str, **hf_kwargs: Any) -> Iterable[Mapping[str, Any]]:
    """Rows of one split of a hub data set, with errors that name the offline alternative."""
    try:
        from datasets import load_dataset
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise DataNotFoundError(
            f"online=True needs the `datasets` package for {what}: `pip install datasets` "
            f"(or `pip install 'dspy-pxn[programs]'`), or use a local copy with data_dir=PATH / {DATA_DIR_ENV}."
        ) from exc
    try:
        return load_dataset(path, split=split, **hf_kwargs)
    except Exception as exc:  # network, auth, or a hub-side format change
        raise DataNotFoundError(
            f"could not load {path!r} (split {split!r}) from the Hugging Face hub for {what}: {exc}. "
            f"Fix: check network access, or use a local copy with data_dir=PATH / {DATA_DIR_ENV}."
        ) from exc


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# --------------------------------------------------------------------------- #
# Split recipes
# --------------------------------------------------------------------------- #


def largest_remainder(target: int, sizes: Mapping[str, int]) -> dict[str, int]:
    """Allot ``target`` items to groups in proportion to ``sizes``, summing to exactly ``target``.

    Floors first, then one more to the groups with the largest fractional parts; ties go
    to the group that comes first in ``sizes``' order (a stable sort), so the result is
    a pure function of the mapping.
    """
    total = sum(sizes.values())
    if total <= 0:
        raise ValueError(f"largest_remainder: sizes must have a positive total, got {dict(sizes)}")
    raw = {group: target * n / total for group, n in sizes.items()}
    alloc = {group: int(share) for group, share in raw.items()}
    deficit = target - sum(alloc.values())
    for group in sorted(sizes, key=lambda g: raw[g] - alloc[g], reverse=True)[:deficit]:
        alloc[group] += 1
    return alloc


def stratified_split(
    items: Sequence[Any],
    *,
    group_of: Callable[[Any], str],
    id_of: Callable[[Any], str],
    n_val: int,
    n_train: int,
    seed: int = 0,
) -> tuple[list[Any], list[Any], list[Any]]:
    """Stratified (train, val, test): the Terrarium recipe for LiveBench-Math.

    Groups in sorted name order; inside a group, items sorted by ``str(id)`` then shuffled
    with ``random.Random(seed)`` (a fresh generator per group, so one group's size never
    shifts another's order). Val takes the first ``alloc_val`` of each group, train the
    next ``alloc_train``, test the rest; allotments by :func:`largest_remainder`.
    Sorting before shuffling makes the split independent of the source's row order.
    """
    groups: dict[str, list[Any]] = defaultdict(list)
    for item in items:
        groups[group_of(item)].append(item)
    ordered = sorted(groups)
    sizes = {g: len(groups[g]) for g in ordered}
    val_alloc = largest_remainder(n_val, sizes)
    train_alloc = largest_remainder(n_train, sizes)
    train: list[Any] = []
    val: list[Any] = []
    test: list[Any] = []
    for g in ordered:
        members = sorted(groups[g], key=lambda item: str(id_of(item)))
        random.Random(seed).shuffle(members)
        nv, nt = val_alloc[g], train_alloc[g]
        if nv + nt > len(members):
            raise ValueError(f"stratified_split: group {g!r} has {len(members)} items, fewer than val+train={nv + nt}")
        val += members[:nv]
        train += members[nv : nv + nt]
        test += members[nv + nt :]
    return train, val, test


# --------------------------------------------------------------------------- #
# LiveBench-Math
# --------------------------------------------------------------------------- #


def livebench_math_rows(
    data_dir: str | os.PathLike[str] | None = None, *, online: bool = False, **hf_kwargs: Any
) -> list[dict[str, Any]]:
    """The 368 LiveBench-Math questions as dicts (question_id, task, subtask, turns, ground_truth, ...)."""
    if online:
        return [dict(row) for row in _load_hub(LIVEBENCH_MATH_HF, "test", "LiveBench-Math", **hf_kwargs)]
    root = resolve_data_dir(data_dir)
    folder = root / "livebench_math" if root is not None else None
    if folder is None or not all((folder / name).is_file() for name in LIVEBENCH_MATH_FILES):
        raise _not_found("LiveBench-Math", "livebench_math/" + "{" + ",".join(LIVEBENCH_MATH_FILES) + "}",
                         root, LIVEBENCH_MATH_HF)
    rows: list[dict[str, Any]] = []
    for name in LIVEBENCH_MATH_FILES:
        rows += _read_jsonl(folder / name)
    return rows


def livebench_math_example(row: Mapping[str, Any]) -> dspy.Example:
    """One question as a dspy.Example: input ``question`` (the full prompt, with its own format rules)."""
    turns = row["turns"]
    question = turns[0] if isinstance(turns, (list, tuple)) else str(turns)
    return dspy.Example(
        question=question,
        answer=str(row["ground_truth"]),
        subtask=str(row["subtask"]),
        task=str(row.get("task", "")),
        question_id=str(row["question_id"]),
    ).with_inputs("question")


def load_livebench_math(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    online: bool = False,
    n_train: int = 100,
    n_val: int = 100,
    seed: int = 0,
    **hf_kwargs: Any,
) -> Split:
    """The Terrarium split of LiveBench-Math: 100 train / 100 val / 168 test, stratified by subtask.

    The recipe of gepa-ai/terrarium (group by ``subtask``, sort by ``question_id``, shuffle each
    group with ``random.Random(0)``, largest-remainder allotment of val then train, rest test),
    so results compare with runs that used it.
    """
    rows = livebench_math_rows(data_dir, online=online, **hf_kwargs)
    train, val, test = stratified_split(
        rows, group_of=lambda r: str(r["subtask"]), id_of=lambda r: str(r["question_id"]),
        n_val=n_val, n_train=n_train, seed=seed,
    )
    return Split(*([livebench_math_example(r) for r in part] for part in (train, val, test)))


# --------------------------------------------------------------------------- #
# HoVer
# --------------------------------------------------------------------------- #


def supporting_titles(supporting_facts: Iterable[Any]) -> list[str]:
    """Distinct supporting-fact titles in first-seen order (no set(): the order must be reproducible).

    Accepts the release files' ``[title, sentence]`` pairs and the hub's ``{"key", "value"}``
    records; titles are HTML-unescaped (the release writes ``R&amp;B``).
    """
    seen: dict[str, None] = {}
    for fact in supporting_facts:
        title = fact["key"] if isinstance(fact, Mapping) else fact[0]
        seen.setdefault(html.unescape(str(title)), None)
    return list(seen)


def hover_rows(
    data_dir: str | os.PathLike[str] | None = None, *, online: bool = False, **hf_kwargs: Any
) -> list[dict[str, Any]]:
    """Labelled HoVer claims: the hub's train split online, else the local dev release.

    The offline source is the dev release (the train release is not in the local folder),
    so offline numbers are not comparable to the paper's, which drew from train.
    """
    if online:
        return [dict(row) for row in _load_hub(HOVER_HF, "train", "HoVer", **hf_kwargs)]
    root = resolve_data_dir(data_dir)
    path = root / "hover" / HOVER_DEV_FILE if root is not None else None
    if path is None or not path.is_file():
        raise _not_found("HoVer", f"hover/{HOVER_DEV_FILE}", root, HOVER_HF)
    with path.open(encoding="utf-8") as f:
        return json.load(f)


def hover_split(
    rows: Sequence[Mapping[str, Any]], *, n_train: int = 200, n_val: int = 150, n_test: int = 200, seed: int = 0
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """Three-hop claims, first claim per HotpotQA source question, shuffled by ``random.Random(seed)``, sliced.

    Deduplicating by ``hpqa_id`` keeps near-identical claims (rewrites of one question) out of
    different splits.
    """
    seen: set[str] = set()
    pool = []
    for row in rows:
        if int(row["num_hops"]) != 3 or row["hpqa_id"] in seen:
            continue
        seen.add(row["hpqa_id"])
        pool.append(row)
    random.Random(seed).shuffle(pool)
    if n_train + n_val + n_test > len(pool):
        raise ValueError(
            f"hover_split: only {len(pool)} distinct three-hop claims, fewer than "
            f"n_train+n_val+n_test={n_train + n_val + n_test}; lower the sizes."
        )
    return pool[:n_train], pool[n_train : n_train + n_val], pool[n_train + n_val : n_train + n_val + n_test]


def hover_example(row: Mapping[str, Any]) -> dspy.Example:
    """One claim as a dspy.Example: input ``claim``; gold ``titles`` (supporting documents, ordered)."""
    return dspy.Example(
        claim=str(row["claim"]),
        titles=supporting_titles(row["supporting_facts"]),
        uid=str(row["uid"]),
        hpqa_id=str(row["hpqa_id"]),
    ).with_inputs("claim")


def load_hover(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    online: bool = False,
    n_train: int = 200,
    n_val: int = 150,
    n_test: int = 200,
    seed: int = 0,
    **hf_kwargs: Any,
) -> Split:
    """HoVer three-hop claims, 200 train / 150 val / 200 test (see :func:`hover_split`)."""
    rows = hover_rows(data_dir, online=online, **hf_kwargs)
    parts = hover_split(rows, n_train=n_train, n_val=n_val, n_test=n_test, seed=seed)
    return Split(*([hover_example(r) for r in part] for part in parts))
