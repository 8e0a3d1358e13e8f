"""BM25 search over a corpus of ``{"title", "text"}`` JSONL lines: build once, persist, load memory-mapped.

Built with **bm25s** (sparse precomputed scores: a query costs the postings of its terms,
where rank-bm25 rescans every document — about 190 ms at 200k documents, seconds at the
5.2M Wikipedia abstracts). The index directory holds bm25s's own files plus a document
store (``docs.jsonl`` + ``docs.offsets.npy``) read by offset through ``mmap``, so a
loaded index costs little resident memory and any number of threads can search it (GEPA
runs rollouts concurrently; bm25s's own JSONL reader seeks a shared handle, ours does not).

Scoring is Okapi BM25 as rank-bm25's ``BM25Okapi`` computes it (bm25s ``method="robertson"``;
negative idf floored at 0, i.e. rank-bm25 with ``epsilon=0``), so rank-bm25 serves as the
test oracle. Ties are broken by document order, so results are reproducible.

CLI::

    python -m dspy_pxn.programs.retrieval build --corpus wiki.abstracts.2017.jsonl --index wiki17.bm25
    python -m dspy_pxn.programs.retrieval search --index wiki17.bm25 --k 7 "Skagen painters naturalism"
    python -m dspy_pxn.programs.retrieval download --dest data/   # the 2017 Wikipedia abstracts (~500 MB, network)
"""

from __future__ import annotations

import argparse
import itertools
import json
import mmap
import os
import re
import sys
import tarfile
import threading
import time
import urllib.request
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import bm25s
import numpy as np

__all__ = [
    "Passage",
    "Retriever",
    "Tokenizer",
    "BM25Index",
    "DocStore",
    "CorpusNotFoundError",
    "IndexNotFoundError",
    "iter_corpus",
    "build_index",
    "open_index",
    "download_wiki_abstracts",
    "WIKI_ABSTRACTS_URL",
]

WIKI_ABSTRACTS_URL = "https://huggingface.co/dspy/cache/resolve/main/wiki.abstracts.2017.tar.gz"
WIKI_ABSTRACTS_FILE = "wiki.abstracts.2017.jsonl"
INDEX_META = "pxn_index.json"  # written last: its presence marks a complete index
DOCS_FILE = "docs.jsonl"
OFFSETS_FILE = "docs.offsets.npy"
FORMAT_VERSION = 1


class CorpusNotFoundError(FileNotFoundError):
    """The corpus JSONL given as ``--corpus PATH`` / ``corpus=`` is not there."""


class IndexNotFoundError(FileNotFoundError):
    """No complete index in the given directory."""


@dataclass(frozen=True)
class Passage:
    """One search hit: the document's title and text, its BM25 score and its position in the corpus."""

    title: str
    text: str
    score: float
    doc_id: int


class Retriever(Protocol):
    """What the HoVer agent needs from search: the top ``k`` passages for a query, best first."""

    def search(self, query: str, k: int) -> list[Passage]: ...


# --------------------------------------------------------------------------- #
# Tokenization
# --------------------------------------------------------------------------- #

# bm25s's English stopword list, inlined so the tokenizer (which must match between
# index and query, and between us and the oracle) cannot change under a bm25s upgrade.
STOPWORDS_EN = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
    "they this to was will with".split()
)
_WORD = re.compile(r"(?u)\b\w\w+\b")


@dataclass(frozen=True)
class Tokenizer:
    """Lowercase words of two or more characters, English stopwords dropped, optionally Snowball-stemmed.

    A value object persisted with the index: queries must be tokenized exactly like the
    documents were. Stemming (PyStemmer) helps recall on Wikipedia; the stemmer is
    per-thread because PyStemmer objects are not thread-safe.
    """

    stem: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "_local", threading.local())

    def _stemmer(self) -> Any:
        local = self._local  # type: ignore[attr-defined]
        stemmer = getattr(local, "stemmer", None)
        if stemmer is None:
            try:
                import Stemmer
            except ImportError as exc:  # pragma: no cover - depends on the environment
                raise ImportError(
                    "Tokenizer(stem=True) needs PyStemmer: `pip install PyStemmer` "
                    "(or `pip install 'dspy-pxn[programs]'`), or use Tokenizer(stem=False)."
                ) from exc
            stemmer = local.stemmer = Stemmer.Stemmer("english")
        return stemmer

    def __call__(self, text: str) -> list[str]:
        words = [w for w in _WORD.findall(text.lower()) if w not in STOPWORDS_EN]
        return self._stemmer().stemWords(words) if self.stem and words else words

    def to_json(self) -> dict[str, Any]:
        return {"stem": self.stem}


# --------------------------------------------------------------------------- #
# Corpus
# --------------------------------------------------------------------------- #


def _corpus_error(path: Path) -> CorpusNotFoundError:
    return CorpusNotFoundError(
        f"corpus not found: no file at {path} (the --corpus PATH / corpus= argument). Fix: pass a JSONL file with "
        f'one {{"title": ..., "text": ...}} object per line, e.g. the 2017 Wikipedia abstracts ({WIKI_ABSTRACTS_FILE}); '
        "`python -m dspy_pxn.programs.retrieval download --dest DIR` fetches it (~500 MB)."
    )


def iter_corpus(path: str | os.PathLike[str]) -> Iterator[tuple[str, str]]:
    """``(title, text)`` per JSONL line; ``text`` may be a string or a list of sentences (the 2017 abstracts)."""
    path = Path(path)
    if not path.is_file():
        raise _corpus_error(path)
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                title, text = row["title"], row["text"]
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(
                    f'{path}:{lineno}: expected a JSON object with "title" and "text", got {line[:120]!r}'
                ) from exc
            if isinstance(text, list):
                text = " ".join(map(str, text))
            yield str(title), str(text)


class DocStore:
    """Titles and texts by document id, read through ``mmap`` by byte offset (thread-safe, little resident memory)."""

    def __init__(self, directory: Path) -> None:
        self._offsets = np.load(directory / OFFSETS_FILE, mmap_mode="r")
        self._file = (directory / DOCS_FILE).open("rb")
        size = os.fstat(self._file.fileno()).st_size
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, doc_id: int) -> tuple[str, str]:
        start, end = int(self._offsets[doc_id]), int(self._offsets[doc_id + 1])
        title, text = json.loads(self._map[start:end])
        return title, text

    @staticmethod
    def writer(directory: Path) -> _DocStoreWriter:
        return _DocStoreWriter(directory)


class _DocStoreWriter:
    """Appends documents to ``docs.jsonl`` and records their offsets."""

    def __init__(self, directory: Path) -> None:
        self._path = directory
        self._f = (directory / DOCS_FILE).open("wb")
        self._offsets = array("q", [0])

    def add(self, title: str, text: str) -> None:
        self._f.write(json.dumps([title, text], ensure_ascii=False).encode("utf-8") + b"\n")
        self._offsets.append(self._f.tell())

    def close(self) -> int:
        self._f.close()
        np.save(self._path / OFFSETS_FILE, np.frombuffer(self._offsets, dtype=np.int64))
        return len(self._offsets) - 1


# --------------------------------------------------------------------------- #
# Index
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class IndexMeta:
    """What a query needs to know about how the index was built (persisted as pxn_index.json)."""

    format_version: int
    num_docs: int
    k1: float
    b: float
    method: str
    tokenizer: dict[str, Any]
    source: str
    build_s: float


def _csc_by_column_blocks(
    data: np.ndarray, rows: np.ndarray, cols: np.ndarray, shape: tuple[int, int], blocks: int = 16
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (doc, term, score) triples as CSC arrays (data, row indices, indptr), sorted one column block at a time.

    Same result as bm25s's builder, which packs (col, row) into int64 keys and argsorts all of
    them at once (~32 extra bytes per entry; 273M entries at 5.2M abstracts). Sorting
    ``blocks`` column ranges in turn needs a few bytes per entry instead. Rows arrive in
    document order, and a stable sort keeps them ascending within each column.
    """
    n_cols = shape[1]
    indptr = np.zeros(n_cols + 1, dtype=np.int64)
    np.cumsum(np.bincount(cols, minlength=n_cols), out=indptr[1:])
    out_data = np.empty_like(data)
    out_rows = np.empty_like(rows)
    edges = np.unique(np.searchsorted(indptr, np.linspace(0, len(cols), blocks + 1)).clip(0, n_cols))
    edges = np.unique(np.concatenate([[0], edges, [n_cols]]))
    for c0, c1 in itertools.pairwise(edges):
        lo, hi = indptr[c0], indptr[c1]
        if lo == hi:
            continue
        sel = np.flatnonzero((cols >= c0) & (cols < c1))
        sel = sel[np.argsort(cols[sel], kind="stable")]
        out_data[lo:hi] = data[sel]
        out_rows[lo:hi] = rows[sel]
    return out_data, out_rows, indptr


class _LeanCSCBM25(bm25s.BM25):
    """bm25s.BM25 with a lower-memory CSC assembly (bm25s's documented ``_np_csc`` hook); same index files."""

    _np_csc = staticmethod(_csc_by_column_blocks)


def build_index(
    corpus: str | os.PathLike[str] | Iterable[tuple[str, str]],
    index_dir: str | os.PathLike[str],
    *,
    k1: float = 1.5,
    b: float = 0.75,
    tokenizer: Tokenizer = Tokenizer(),
) -> BM25Index:
    """Build and persist an index of ``corpus`` (a JSONL path or ``(title, text)`` pairs) in ``index_dir``.

    One streaming pass: each document is tokenized (title and text together), its token ids
    kept as a compact ``array('i')`` and the document written to the store; then bm25s
    computes the score matrix. Peak memory is the token ids plus bm25s's matrix build.
    """
    index_dir = Path(index_dir)
    index_dir.mkdir(parents=True, exist_ok=True)
    (index_dir / INDEX_META).unlink(missing_ok=True)  # a half-rebuilt index must not look complete
    source = str(corpus) if isinstance(corpus, (str, os.PathLike)) else "<iterable>"
    pairs = iter_corpus(corpus) if isinstance(corpus, (str, os.PathLike)) else corpus
    started = time.perf_counter()

    vocab: dict[str, int] = {}
    doc_ids: list[array] = []
    store = DocStore.writer(index_dir)
    for title, text in pairs:
        tokens = tokenizer(f"{title} {text}")
        doc_ids.append(array("i", [vocab.setdefault(t, len(vocab)) for t in tokens]))
        store.add(title, text)
    num_docs = store.close()
    if num_docs == 0:
        raise ValueError(f"corpus {source} has no documents")
    if not vocab:
        raise ValueError(f"corpus {source} has no indexable words (all documents empty or stopwords)")

    model = _LeanCSCBM25(k1=k1, b=b, method="robertson")
    model.index((doc_ids, vocab), create_empty_token=False, show_progress=False)
    del doc_ids
    model.save(index_dir, show_progress=False)
    meta = IndexMeta(FORMAT_VERSION, num_docs, k1, b, "robertson", tokenizer.to_json(), source,
                     round(time.perf_counter() - started, 3))
    (index_dir / INDEX_META).write_text(json.dumps(asdict(meta), indent=2))
    return BM25Index.load(index_dir)


class BM25Index:
    """A loaded index: ``search(query, k)`` returns the top-k :class:`Passage` s, best first, ties by doc order."""

    def __init__(self, model: Any, docs: DocStore, meta: IndexMeta, directory: Path) -> None:
        self._model = model
        self.directory = directory
        self._vocab: dict[str, int] = model.vocab_dict
        self.docs = docs
        self.meta = meta
        self.tokenizer = Tokenizer(**meta.tokenizer)

    build = staticmethod(build_index)

    @classmethod
    def load(cls, index_dir: str | os.PathLike[str], *, mmap: bool = True) -> BM25Index:
        """Open an index built by :func:`build_index`; score arrays memory-mapped unless ``mmap=False``."""
        index_dir = Path(index_dir)
        meta_path = index_dir / INDEX_META
        if not meta_path.is_file():
            raise IndexNotFoundError(
                f"no BM25 index at {index_dir} ({INDEX_META} missing). Fix: build one with "
                f"`python -m dspy_pxn.programs.retrieval build --corpus PATH --index {index_dir}` "
                "or dspy_pxn.programs.retrieval.build_index(corpus_path, index_dir)."
            )
        meta = IndexMeta(**json.loads(meta_path.read_text()))
        if meta.format_version != FORMAT_VERSION:
            raise IndexNotFoundError(f"index at {index_dir} has format {meta.format_version}, expected "
                                     f"{FORMAT_VERSION}: rebuild it with `python -m dspy_pxn.programs.retrieval build`.")
        model = bm25s.BM25.load(index_dir, mmap=mmap, load_corpus=False, show_progress=False)
        return cls(model, DocStore(index_dir), meta, index_dir)

    def __len__(self) -> int:
        return self.meta.num_docs

    def _term_ids(self, query: str) -> list[int]:
        return [self._vocab[t] for t in self.tokenizer(query) if t in self._vocab]

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every document for ``query`` (float32, length = number of documents)."""
        ids = self._term_ids(query)
        if not ids:
            return np.zeros(self.meta.num_docs, dtype=np.float32)
        return self._model.get_scores_from_ids(ids)

    def top_ids(self, query: str, k: int) -> list[tuple[int, float]]:
        """``(doc_id, score)`` of the ``k`` best documents with a positive score; equal scores in doc order."""
        if not (isinstance(k, int) and k > 0):
            raise ValueError(f"k must be a positive int, got {k!r}")
        ids = self._term_ids(query)
        if not ids:
            return []
        scores = self._model.get_scores_from_ids(ids)
        candidates = self._candidates(scores, ids, k)
        order = np.lexsort((candidates, -scores[candidates]))[:k]
        return [(int(candidates[i]), float(scores[candidates[i]])) for i in order]

    def _candidates(self, scores: np.ndarray, ids: Sequence[int], k: int) -> np.ndarray:
        """Every document that can be in the top k (ties included), without a selection over all N scores.

        A partial sort of 5.2M scores, most of them equal zeros, costs tens of ms. Instead:
        the k-th best score among the documents holding the rarest query terms is a lower
        bound on the overall k-th best, so the documents scoring at least that much are a
        superset of the top k, found by one vectorized comparison.
        """
        indptr = self._model.scores["indptr"]
        indices = self._model.scores["indices"]
        pool = np.empty(0, dtype=np.int64)
        for term in sorted(set(ids), key=lambda t: int(indptr[t + 1] - indptr[t])):
            postings = np.asarray(indices[indptr[term] : indptr[term + 1]])
            pool = postings if pool.size == 0 else np.union1d(pool, postings)
            if pool.size >= k:
                break
        pool_scores = scores[pool]
        pool_scores = pool_scores[pool_scores > 0]
        if pool_scores.size >= k:
            floor = -np.partition(-pool_scores, k - 1)[k - 1]
        else:  # fewer than k matching documents in the pool: every positive score qualifies
            floor = np.finfo(np.float32).tiny
        candidates = np.flatnonzero(scores >= floor)
        if candidates.size > 64 * k:  # a weak bound (only common terms): tighten it on the candidates
            exact = -np.partition(-scores[candidates], k - 1)[k - 1]
            candidates = candidates[scores[candidates] >= exact]
        return candidates

    def search(self, query: str, k: int) -> list[Passage]:
        return [Passage(*self.docs[doc_id], score=score, doc_id=doc_id) for doc_id, score in self.top_ids(query, k)]

    # Read-only and possibly gigabytes: GEPA deep-copies programs for every candidate, and a
    # program holding this index must share it, not copy it (nor fail on the open mmap).
    def __copy__(self) -> BM25Index:
        return self

    def __deepcopy__(self, memo: dict) -> BM25Index:
        return self


def open_index(
    index_dir: str | os.PathLike[str] | None = None, corpus: str | os.PathLike[str] | None = None
) -> BM25Index:
    """Load the index in ``index_dir``, building it from ``corpus`` first if it is not there yet.

    With only ``corpus``, the index goes to ``<corpus>.bm25/`` beside it. Built once, reused after.
    """
    if index_dir is None and corpus is None:
        raise IndexNotFoundError(
            "no corpus and no index given. Fix: pass corpus=PATH (--corpus PATH) to a JSONL file of "
            '{"title", "text"} lines, e.g. the 2017 Wikipedia abstracts (`python -m dspy_pxn.programs.retrieval download '
            "--dest DIR`), and/or index_dir=DIR (--index DIR) of an index built from it."
        )
    target = Path(index_dir) if index_dir is not None else Path(f"{corpus}.bm25")
    if (target / INDEX_META).is_file():
        return BM25Index.load(target)
    if corpus is None:
        return BM25Index.load(target)  # raises IndexNotFoundError naming the build command
    return build_index(corpus, target)


# --------------------------------------------------------------------------- #
# Download (network; only when asked)
# --------------------------------------------------------------------------- #


def download_wiki_abstracts(dest: str | os.PathLike[str], *, url: str = WIKI_ABSTRACTS_URL) -> Path:
    """Fetch and unpack the 2017 Wikipedia abstracts (5.2M ``{"title", "text"}`` lines); returns the JSONL path.

    The corpus HoVer was built on (HotpotQA's processed Wikipedia, CC BY-SA). Skips the
    download when the JSONL is already in ``dest``.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / WIKI_ABSTRACTS_FILE
    if target.is_file():
        return target
    archive = dest / url.rsplit("/", 1)[-1]
    if not archive.is_file():
        partial = archive.with_suffix(archive.suffix + ".part")
        urllib.request.urlretrieve(url, partial)
        partial.rename(archive)
    with tarfile.open(archive, "r:gz") as tar:
        member = next((m for m in tar.getmembers() if m.name.endswith(WIKI_ABSTRACTS_FILE)), None)
        if member is None:
            raise ValueError(f"{archive} does not contain {WIKI_ABSTRACTS_FILE}")
        with tar.extractfile(member) as src, target.open("wb") as out:  # type: ignore[union-attr]
            while chunk := src.read(1 << 20):
                out.write(chunk)
    return target


# --------------------------------------------------------------------------- #
# CLI
# --------------------------------------------------------------------------- #


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dspy_pxn.programs.retrieval", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="build and persist an index from a JSONL corpus")
    p_build.add_argument("--corpus", required=True, type=Path, help='JSONL of {"title", "text"} lines')
    p_build.add_argument("--index", required=True, type=Path, help="directory to write the index to")
    p_build.add_argument("--k1", type=float, default=1.5)
    p_build.add_argument("--b", type=float, default=0.75)
    p_build.add_argument("--no-stem", action="store_true", help="do not stem words")
    p_search = sub.add_parser("search", help="query a built index")
    p_search.add_argument("--index", required=True, type=Path)
    p_search.add_argument("--k", type=int, default=7)
    p_search.add_argument("query")
    p_down = sub.add_parser("download", help="download the 2017 Wikipedia abstracts (network)")
    p_down.add_argument("--dest", required=True, type=Path)
    args = parser.parse_args(argv)

    try:
        if args.command == "build":
            index = build_index(args.corpus, args.index, k1=args.k1, b=args.b, tokenizer=Tokenizer(stem=not args.no_stem))
            print(f"indexed {len(index)} documents into {args.index} in {index.meta.build_s:.1f}s")
        elif args.command == "search":
            for hit in BM25Index.load(args.index).search(args.query, args.k):
                print(f"{hit.score:8.3f}  {hit.title} | {hit.text[:100]}")
        else:
            print(download_wiki_abstracts(args.dest))
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
