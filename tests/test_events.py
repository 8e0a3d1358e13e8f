"""Step events are typed: a listener overrides what it hears, and a misspelt event fails when it is written."""

import pytest

from dspy_pxn.engine.events import StepEvents, StepListener, override
from dspy_pxn.ledger.ledger import RunLedger


class Heard(StepListener):
    def __init__(self, name, log):
        self.name, self.log = name, log

    @override
    def evaluated(self, phase, seconds, rollouts, failures):
        self.log.append((self.name, phase, rollouts, failures))


def test_every_listener_hears_an_event_in_order_and_the_others_are_no_ops():
    log = []
    first, second = Heard("first", log), Heard("second", log)
    events = StepEvents([first])
    events.add(second)
    events.add(Heard("zeroth", log), first=True)
    events.evaluated("screening", 0.1, 6, 1)
    events.tasks_sampled([])  # nobody overrides it: heard by nobody, fails nowhere
    assert log == [("zeroth", "screening", 6, 1), ("first", "screening", 6, 1), ("second", "screening", 6, 1)]


def test_events_after_the_search_returned_are_heard_by_no_one():
    log, ledger = [], RunLedger()
    events = StepEvents([Heard("first", log)], stop=ledger)
    events.evaluated("screening", 0.1, 6, 0)
    ledger.search_returned()  # a schedule returned with work in flight: what that work tells is not part of the run
    events.evaluated("validation", 0.1, 10, 0)
    assert log == [("first", "screening", 6, 0)]


def test_a_misspelt_event_fails_when_its_listener_is_defined():
    with pytest.raises(TypeError, match="no step event 'evaluate'"):
        class Misspelt(StepListener):  # noqa: F841
            @override
            def evaluate(self, phase, seconds, rollouts, failures):
                pass


def test_only_step_listeners_are_told():
    class NotAListener:
        def evaluated(self, phase, seconds, rollouts, failures):
            pass

    with pytest.raises(TypeError, match="not a dspy_pxn.engine.events.StepListener"):
        StepEvents([NotAListener()])
