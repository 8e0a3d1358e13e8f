"""A DSPy program as a run's target: the program and its metric (``target``), its rollouts (``rollout``), dspy's
adapter on the pool (``adapter``), what GEPA rewrites in it (``components``), its metric (``metrics``) and the
held-out score after the search (``holdout``)."""
