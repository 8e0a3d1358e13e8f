"""The BM25 index: same scores and top-k as rank-bm25 (the oracle), persisted, memory-mapped, thread-safe."""

import copy
import json
import random
import tarfile
from concurrent.futures import ThreadPoolExecutor

import bm25s
import numpy as np
import pytest
from dspy_pxn.programs.retrieval import (
    BM25Index,
    CorpusNotFoundError,
    IndexNotFoundError,
    Tokenizer,
    _LeanCSCBM25,
    build_index,
    download_wiki_abstracts,
    iter_corpus,
    main,
    open_index,
)
from rank_bm25 import BM25Okapi

K1, B = 1.2, 0.7  # not the defaults, so a parameter that is not passed through shows up


def make_corpus(n_docs=400, seed=0):
    """Zipf-ish words so that some terms are in more than half of the documents (idf floor exercised)."""
    rng = random.Random(seed)
    vocab = [f"term{i}" for i in range(600)]
    docs = []
    for i in range(n_docs):
        words = ["common"] * (i % 3 != 0) + [vocab[min(int(rng.paretovariate(0.8)), 599)] for _ in range(rng.randint(0, 40))]
        text = " ".join(words) + (" and the running painters" if i % 7 == 0 else "")
        docs.append({"title": f"Doc {i}", "text": text if i % 5 else text.split()})  # some as sentence lists
    return docs


@pytest.fixture(scope="module")
def corpus_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in make_corpus()))
    return path


@pytest.fixture(scope="module")
def index(corpus_path, tmp_path_factory):
    return build_index(corpus_path, tmp_path_factory.mktemp("index") / "idx", k1=K1, b=B)


@pytest.fixture(scope="module")
def oracle(corpus_path):
    tokenizer = Tokenizer()
    # epsilon=0: rank-bm25 floors negative idf at epsilon * mean idf, bm25s's robertson at 0.
    return BM25Okapi([tokenizer(f"{t} {x}") for t, x in iter_corpus(corpus_path)], k1=K1, b=B, epsilon=0)


QUERIES = ["term1 term2", "term7 common", "term3 term3 term40", "running painter", "common", "term599 term0 term5 term9",
           "nothing-matches-this", "The Painters RUNNING and term12"]


@pytest.mark.parametrize("query", QUERIES)
def test_scores_equal_rank_bm25_up_to_its_constant_factor(index, oracle, query):
    expected = oracle.get_scores(Tokenizer()(query))
    # rank-bm25 multiplies every term by (k1 + 1); bm25s does not: same ranking.
    np.testing.assert_allclose(index.scores(query) * (K1 + 1), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k", [1, 5, 20])
@pytest.mark.parametrize("query", QUERIES)
def test_top_k_equals_rank_bm25_top_k(index, oracle, query, k):
    scores = oracle.get_scores(Tokenizer()(query))
    ranked = sorted((i for i in range(len(scores)) if scores[i] > 0), key=lambda i: (-round(scores[i], 4), i))
    assert [doc_id for doc_id, _ in index.top_ids(query, k)] == ranked[:k]
    assert [p.title for p in index.search(query, k)] == [f"Doc {i}" for i in ranked[:k]]


def test_a_query_matching_few_documents_returns_fewer_than_k(index):
    hits = index.search("term599", 50)
    assert 0 < len(hits) < 50 and all(h.score > 0 for h in hits)
    assert index.search("nothing-matches-this", 5) == []


def test_tokenizer_lowercases_drops_stopwords_and_stems():
    assert Tokenizer()("The Painters were RUNNING in a film") == ["painter", "were", "run", "film"]
    assert Tokenizer(stem=False)("The Painters were RUNNING") == ["painters", "were", "running"]


def test_loaded_index_is_memory_mapped_and_finds_the_same(index, corpus_path):
    loaded = BM25Index.load(index.directory)
    assert isinstance(loaded._model.scores["data"], np.memmap)
    assert loaded.meta.k1 == K1 and loaded.meta.b == B and loaded.meta.num_docs == 400
    assert loaded.search("term7 common", 10) == index.search("term7 common", 10)
    title, text = loaded.docs[5]
    assert title == "Doc 5" and isinstance(text, str)  # sentence lists are joined
    assert [t for t, _ in iter_corpus(corpus_path)][:3] == ["Doc 0", "Doc 1", "Doc 2"]


def test_searches_from_many_threads_agree(index):
    queries = QUERIES * 20
    expected = [index.search(q, 5) for q in queries]
    with ThreadPoolExecutor(max_workers=8) as pool:
        assert list(pool.map(lambda q: index.search(q, 5), queries)) == expected


def test_copies_share_the_index():
    # GEPA deep-copies programs per candidate; the index must be shared, not duplicated.
    sentinel = object.__new__(BM25Index)
    assert copy.deepcopy(sentinel) is sentinel and copy.copy(sentinel) is sentinel


def test_lean_csc_builder_matches_bm25s():
    rng = random.Random(1)
    docs = [[f"w{int(rng.paretovariate(1.0)) % 3000}" for _ in range(rng.randint(0, 50))] for _ in range(3000)]
    reference, lean = bm25s.BM25(method="robertson"), _LeanCSCBM25(method="robertson")
    reference.index(docs, show_progress=False)
    lean.index(docs, show_progress=False)
    for key in ("data", "indices", "indptr"):
        np.testing.assert_array_equal(lean.scores[key], reference.scores[key])


def test_missing_corpus_and_index_are_clear_errors(tmp_path):
    with pytest.raises(CorpusNotFoundError, match=r"no file at .*nope\.jsonl.*--corpus PATH.*download"):
        build_index(tmp_path / "nope.jsonl", tmp_path / "idx")
    with pytest.raises(IndexNotFoundError, match=r"no BM25 index at .*programs\.retrieval build --corpus PATH"):
        BM25Index.load(tmp_path / "idx")
    with pytest.raises(IndexNotFoundError, match=r"corpus=PATH \(--corpus PATH\).*index_dir=DIR \(--index DIR\)"):
        open_index()
    with pytest.raises(IndexNotFoundError, match="no BM25 index"):
        open_index(index_dir=tmp_path / "empty")


def test_malformed_corpus_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"title": "A", "text": "x"}\n{"name": "B"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: expected a JSON object with \"title\" and \"text\""):
        build_index(path, tmp_path / "idx")


def test_open_index_builds_once_beside_the_corpus_then_reuses(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in make_corpus(30)))
    first = open_index(corpus=corpus)
    assert (tmp_path / "c.jsonl.bm25" / "pxn_index.json").is_file()
    stamp = (tmp_path / "c.jsonl.bm25" / "pxn_index.json").stat().st_mtime_ns
    again = open_index(corpus=corpus)
    assert (tmp_path / "c.jsonl.bm25" / "pxn_index.json").stat().st_mtime_ns == stamp
    assert again.search("term1", 3) == first.search("term1", 3)


def test_cli_builds_and_searches(tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in make_corpus(30)))
    assert main(["build", "--corpus", str(corpus), "--index", str(tmp_path / "i")]) == 0
    assert "indexed 30 documents" in capsys.readouterr().out
    assert main(["search", "--index", str(tmp_path / "i"), "--k", "2", "running painters"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2
    assert main(["build", "--corpus", str(tmp_path / "missing.jsonl"), "--index", str(tmp_path / "j")]) == 2
    assert "--corpus PATH" in capsys.readouterr().err


def test_build_from_pairs_and_reject_empty_corpora(tmp_path):
    built = build_index([("Alpha", "kestrel falcon"), ("Beta", "falcon heron"), ("Gamma", "owl")], tmp_path / "p")
    assert [p.title for p in built.search("kestrel", 3)] == ["Alpha"] and built.meta.source == "<iterable>"
    with pytest.raises(ValueError, match="has no documents"):
        build_index([], tmp_path / "none")
    with pytest.raises(ValueError, match="no indexable words"):
        build_index([("a", "the of and")], tmp_path / "stop")
    assert not (tmp_path / "stop" / "pxn_index.json").exists()  # a failed build never looks complete


def test_download_unpacks_the_abstracts_archive(tmp_path):
    # A local file:// archive stands in for the hub (no network in tests); same layout as the real one.
    source = tmp_path / "src" / "wiki.abstracts.2017.jsonl"
    source.parent.mkdir()
    source.write_text(json.dumps({"title": "Skagen", "text": ["A town.", "In Denmark."]}) + "\n")
    archive = tmp_path / "wiki.abstracts.2017.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(source, arcname="wiki.abstracts.2017.jsonl")
    path = download_wiki_abstracts(tmp_path / "dest", url=archive.as_uri())
    assert path == tmp_path / "dest" / "wiki.abstracts.2017.jsonl"
    assert list(iter_corpus(path)) == [("Skagen", "A town. In Denmark.")]
    assert download_wiki_abstracts(tmp_path / "dest", url="file:///does/not/exist") == path  # already there
