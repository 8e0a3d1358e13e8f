"""BM25 index at Wikipedia-abstracts scale: build time, peak memory, disk size, query latency on one core.

The HoVer agent searches the 5.2M 2017 Wikipedia abstracts every hop, eight LM calls
per rollout, thousands of rollouts per optimization: search must stay far below an LM
call (aim: p50 <= 50 ms) and the index must build on a developer machine (aim: peak
build memory <= 16 GiB). The real corpus is not available offline, so this generates
a corpus of the same shape: 5.2M abstract-length documents (lognormal length, mean
about 70 words), Zipf-distributed content words over a 2M-word vocabulary mixed with
common English function words (a third of all tokens), and one- to three-word titles.

    python benchmarks/bench_bm25_scale.py --docs 200000 --out /tmp/bm25_200k.json   # a quick check
    nice -n 19 python benchmarks/bench_bm25_scale.py --docs 5200000                  # the real scale, ~20 min

Each phase runs in its own process so its peak RSS is its own: generate, build
(``dspy_pxn.programs.retrieval.build_index``), query (index loaded memory-mapped, process pinned
to one core, 1000 timed ``search(query, k=7)`` after a warm-up). Writes
benchmarks/results/bm25_scale.json unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

AIM_P50_MS = 50.0
AIM_PEAK_BUILD_GIB = 16.0
GIB = 1024**3

# Common words that survive the stopword list (as in real abstracts: "he", "from", "which", ...)
# plus some it removes; about a third of all tokens, as in English prose.
FUNCTION_WORDS = (
    "the of and in a to was is for on as by with he from at his an which that it its were who also "
    "has are first after be or born known this one american she her their been new"
).split()
SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["an", "er", "in", "on", "or", "el"]


def word(i: int) -> str:
    """The i-th synthetic content word: a distinct pronounceable string (base-96 syllables)."""
    out = []
    i += len(SYLLABLES)  # at least two syllables
    while i:
        i, r = divmod(i, len(SYLLABLES))
        out.append(SYLLABLES[r])
    return "".join(out)


def generate(path: Path, docs: int, vocab: int, seed: int, queries_path: Path, n_queries: int) -> dict:
    """Write ``docs`` JSONL lines {"title", "text"} and ``n_queries`` queries drawn from random documents."""
    rng = np.random.default_rng(seed)
    words = np.array([word(i) for i in range(vocab)], dtype=object)
    # Zipf over content words, ranks offset by the ~100 function words that head real English
    # frequency lists: the commonest content word then falls in ~5% of documents, as "film" does.
    weights = 1.0 / np.arange(100, vocab + 100) ** 1.05
    cdf = np.cumsum(weights / weights.sum())
    func = np.array(FUNCTION_WORDS, dtype=object)
    query_docs = set(rng.choice(docs, size=n_queries, replace=False).tolist())
    queries = []
    chunk = 20_000
    total_words = 0
    started = time.perf_counter()
    with path.open("w", encoding="utf-8") as f:
        for start in range(0, docs, chunk):
            n = min(chunk, docs - start)
            lengths = np.clip(rng.lognormal(mean=4.05, sigma=0.55, size=n).astype(int), 5, 400)
            total = int(lengths.sum())
            content = words[np.searchsorted(cdf, rng.random(total), side="right").clip(0, vocab - 1)]
            is_func = rng.random(total) < 0.35
            tokens = np.where(is_func, func[rng.integers(0, len(func), total)], content)
            title_words = words[np.searchsorted(cdf, rng.random(3 * n), side="right").clip(0, vocab - 1)]
            bounds = np.concatenate([[0], np.cumsum(lengths)])
            lines = []
            for j in range(n):
                doc_words = tokens[bounds[j] : bounds[j + 1]]
                title = " ".join(w.capitalize() for w in title_words[3 * j : 3 * j + 1 + j % 3])
                lines.append(json.dumps({"title": title, "text": " ".join(doc_words) + "."}))
                if start + j in query_docs:
                    picked = rng.choice(doc_words, size=min(len(doc_words), int(rng.integers(3, 8))), replace=False)
                    queries.append(" ".join([title, *picked]))
            f.write("\n".join(lines) + "\n")
            total_words += total
    queries_path.write_text(json.dumps(queries))
    return {"docs": docs, "vocab": vocab, "mean_words": round(total_words / docs, 1),
            "bytes": path.stat().st_size, "generate_s": round(time.perf_counter() - started, 1)}


def phase_build(corpus: Path, index: Path) -> dict:
    from dspy_pxn.programs.retrieval import build_index

    started = time.perf_counter()
    built = build_index(corpus, index)
    return {"build_s": round(time.perf_counter() - started, 1), "num_docs": len(built)}


def phase_query(index: Path, queries_path: Path, k: int, warmup: int) -> dict:
    from dspy_pxn.programs.retrieval import BM25Index

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    queries = json.loads(queries_path.read_text())
    started = time.perf_counter()
    built = BM25Index.load(index)
    load_s = time.perf_counter() - started
    for q in queries[:warmup]:
        built.search(q, k)
    times = []
    hits = 0
    for q in queries:
        t = time.perf_counter()
        hits += len(built.search(q, k))
        times.append((time.perf_counter() - t) * 1000)
    arr = np.array(times)
    return {"load_s": round(load_s, 2), "queries": len(times), "k": k, "mean_hits": round(hits / len(times), 2),
            "p50_ms": round(float(np.percentile(arr, 50)), 2), "p99_ms": round(float(np.percentile(arr, 99)), 2),
            "mean_ms": round(float(arr.mean()), 2), "max_ms": round(float(arr.max()), 2),
            "rss_after_queries_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB, 2)}


def run_phase(args: list[str]) -> dict:
    """Run one phase in a child process (so its peak RSS is its own); returns the JSON line it printed."""
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"phase {args[:2]} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def dir_size(path: Path) -> dict[str, int]:
    sizes = {p.name: p.stat().st_size for p in path.iterdir() if p.is_file()}
    return dict(sorted(sizes.items(), key=lambda kv: -kv[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=5_200_000)
    parser.add_argument("--vocab", type=int, default=2_000_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bm25_scale"), help="corpus and index go here")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bm25_scale.json")
    parser.add_argument("--keep", action="store_true", help="keep the generated corpus and index")
    parser.add_argument("--phase", choices=["generate", "build", "query"], help=argparse.SUPPRESS)
    args = parser.parse_args()

    work = args.workdir / f"{args.docs}"
    corpus, index, queries = work / "corpus.jsonl", work / "index", work / "queries.json"
    if args.phase:  # child process: one phase, one JSON line on stdout with its own peak RSS
        if args.phase == "generate":
            result = generate(corpus, args.docs, args.vocab, args.seed, queries, args.queries)
        elif args.phase == "build":
            result = phase_build(corpus, index)
        else:
            result = phase_query(index, queries, args.k, args.warmup)
        result["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB, 2)
        print(json.dumps(result))
        return

    work.mkdir(parents=True, exist_ok=True)
    common = ["--docs", str(args.docs), "--vocab", str(args.vocab), "--queries", str(args.queries),
              "--warmup", str(args.warmup), "--k", str(args.k), "--seed", str(args.seed), "--workdir", str(args.workdir)]
    print(f"generating {args.docs} documents in {work} ...", flush=True)
    gen = run_phase(["--phase", "generate", *common])
    print(f"  {gen}", flush=True)
    print("building the index ...", flush=True)
    build = run_phase(["--phase", "build", *common])
    print(f"  {build}", flush=True)
    sizes = dir_size(index)
    print("querying on one core ...", flush=True)
    query = run_phase(["--phase", "query", *common])
    print(f"  {query}", flush=True)

    result = {
        "command": "python benchmarks/bench_bm25_scale.py " + " ".join(sys.argv[1:]),
        "corpus": gen,
        "build": {"build_s": build["build_s"], "peak_rss_gib": build["peak_rss_gib"]},
        "index_disk": {"total_gib": round(sum(sizes.values()) / GIB, 3),
                       "score_matrix_gib": round(sum(v for k, v in sizes.items() if k.endswith(".npy")
                                                     and not k.startswith("docs")) / GIB, 3),
                       "files_bytes": sizes},
        "query": query,
        "aims": {"p50_ms": AIM_P50_MS, "peak_build_gib": AIM_PEAK_BUILD_GIB},
        "meets_aims": {"p50": query["p50_ms"] <= AIM_P50_MS, "peak_build": build["peak_rss_gib"] <= AIM_PEAK_BUILD_GIB},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
                    "niceness": os.nice(0)},
    }
    try:
        import bm25s

        result["machine"]["bm25s"] = bm25s.__version__
    except (ImportError, AttributeError):
        pass
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("build", "query", "meets_aims")}, indent=2))
    print(f"index on disk: {result['index_disk']['total_gib']} GiB; written {args.out}")
    if not args.keep:
        for path in sorted(work.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        work.rmdir()


if __name__ == "__main__":
    main()
