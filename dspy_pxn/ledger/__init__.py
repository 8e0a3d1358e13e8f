"""A run's accounting, in one place: its LM calls and dollars, and every budget that bounds it.

    ledger.RunLedger     the run's LM calls, attempts, retries, failures, tokens and dollars; its pace and clock
                         (rollouts and reflections so far, how long they took, the time left); the run's stop signal
    feed                 how each LM call reaches the ledger (one callback at the run's LMs, DSPy's retry loop)
    prices               what a call costs, and the most it can cost before it is made
    budget.BudgetGuard   the metric-call budget: exact, reserved before work starts
    caps.RunCaps         the dollar and deadline budgets: the gate every LM call passes
    remote               a share of those caps for work sent to another process (a Ray actor)
    limiter              at most K LM calls in progress at once
"""

from dspy_pxn.ledger.ledger import LMCallCounts, RunLedger, Tally, UsageTotals

__all__ = ["LMCallCounts", "RunLedger", "Tally", "UsageTotals"]
