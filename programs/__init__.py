"""Ready-made DSPy programs for BatchedGEPA: the paper's two tasks, with metrics, data and retrieval.

| module                  | one job                                                                   |
|-------------------------|---------------------------------------------------------------------------|
| ``math_solver``         | LiveBench-Math chain-of-thought solver and its GEPA feedback metric       |
| ``math_scoring``        | LiveBench-Math verdicts: LiveBench's grading rules, subtask by subtask    |
| ``hover``               | HoVer four-hop agent (query writer + note taker) and its recall metric    |
| ``retrieval``           | BM25 index over ``{"title", "text"}`` JSONL: build, persist, load mmap    |
| ``data``                | loaders and split recipes: a local directory offline, the HF hub online   |
| ``demo_corpus``         | a tiny HoVer-derived corpus for offline tests and demos                   |
| ``split``               | the train/val/test triple every loader returns (and ``dspy_pxn.testing``) |

Needs the ``programs`` extra: ``pip install -e '.[programs]'``. Submodules are not imported
here, so importing one program does not pull in the other's dependencies.
"""
