"""The engine every target runs on: one compile prepared (``run``), its target's protocol (``target``), the
scheduling half of an adapter (``pooled_adapter``), what happens in a step (``events``, ``records``), how a compile
describes itself (``description``) and resumes (``resume``), how wide it runs (``width``), how it draws parents and
minibatches (``sampling``), the pool's best candidates (``candidates``), what it returns (``result``) and who follows
it (``tracker``)."""
