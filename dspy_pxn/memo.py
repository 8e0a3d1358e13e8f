"""A bounded, thread-safe memo, for work a run repeats with the same key.

Built programs per candidate, objects stored in Ray once, references an actor has resolved:
each is made once per key and kept while recently used, so memory stays bounded over a long run.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class LruMemo(Generic[V]):
    """``get(key, make)``: the value made for ``key``, made once even when two threads ask at once.

    ``make`` runs under the memo's lock, so concurrent first requests for one key wait for a
    single value instead of making two (an actor resolving one reference twice would hold two
    copies of a function and split its caches).
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._values: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], V]) -> V:
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key]
            value = self._values[key] = make()
            while len(self._values) > self.capacity:
                self._values.popitem(last=False)
            return value
