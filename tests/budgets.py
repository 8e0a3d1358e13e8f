"""What a run may leave of its budget unspent: less than its smallest step."""

from dspy_pxn.ledger.budget import CROSSOVER_SUBSAMPLE_CALLS


def smallest_step(minibatch: int, val_size: int, crossover: bool = True) -> int:
    """The calls of the smallest useful step: a proposal screened and validated, or, with gepa's crossover
    (``use_merge``, on by default) due, a crossover screened on its val examples and validated. A run stops
    once what is left cannot pay for the step it would take next."""
    return max(2 * minibatch, CROSSOVER_SUBSAMPLE_CALLS if crossover else 0) + val_size
