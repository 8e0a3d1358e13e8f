"""A bounded, thread-safe memo, for work a run repeats with the same key.

Built programs per evaluation, objects stored in Ray once, references an actor has resolved:
each is made once per key and kept while recently used, so memory stays bounded over a long run.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

V = TypeVar("V")

Memo = Callable[[Hashable, Callable[[], V]], V]


def lru_memo(capacity: int) -> Memo:
    """``memo(key, make)``: the value made for ``key``, made once even when two threads ask at once.

    ``make`` runs under the memo's lock, so concurrent first requests for one key wait for a
    single value instead of making two (an actor resolving one reference twice would hold two
    copies of a function and split its caches; two rollouts of one evaluation, two programs).
    """
    values: OrderedDict[Hashable, V] = OrderedDict()
    lock = threading.Lock()

    def memo(key: Hashable, make: Callable[[], V]) -> V:
        with lock:
            if key in values:
                values.move_to_end(key)
                return values[key]
            value = values[key] = make()
            while len(values) > capacity:
                values.popitem(last=False)
            return value

    return memo
