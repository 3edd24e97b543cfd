"""rftlib.train.pipeline.hold_for_other_ranks: rank 0 keeps loaded, on shared server engines, every adapter another
rank's producer may still sample, and lets one go once no rank reports it (issue 40's loop split moved it out of
the Trainer; no multi-rank test reached it before). Worked out by hand: three ranks' reports over three steps."""

from __future__ import annotations

from types import SimpleNamespace

from rftlib.train.pipeline import hold_for_other_ranks


class SharedEngine:
    shared_across_ranks = True

    def __init__(self, inflight):
        self.inflight, self.calls = inflight, []

    def hold(self, name):
        self.calls.append(("hold", name))

    def release(self, name):
        self.calls.append(("release", name))


def dist(rank: int, reports: list[list[str]]):
    """A 3-rank group whose gather hands back ``reports`` (rank 0's own first, as gather_objects does)."""
    return SimpleNamespace(distributed=True, is_main=rank == 0, gather_objects=lambda mine: [mine, *reports[1:]])


def test_rank_0_holds_what_the_others_report_and_releases_what_they_no_longer_name():
    eng = SharedEngine({"policy-3": 1, "policy-2": 0})  # rank 0's own: policy-2 has nothing in flight
    held = hold_for_other_ranks(eng, dist(0, [[], ["policy-2", "policy-3"], ["policy-3"]]), True, set())
    assert held == {"policy-2", "policy-3"} and eng.calls == [("hold", "policy-2"), ("hold", "policy-3")]
    eng.calls.clear()
    held = hold_for_other_ranks(eng, dist(0, [[], ["policy-4"], ["policy-3", "policy-4"]]), True, held)
    assert held == {"policy-3", "policy-4"} and eng.calls == [("hold", "policy-4"), ("release", "policy-2")]
    eng.calls.clear()
    held = hold_for_other_ranks(eng, dist(0, [[], ["policy-5"], ["policy-5"]]), True, held)
    assert held == {"policy-5"} and eng.calls == [("hold", "policy-5"), ("release", "policy-3"), ("release", "policy-4")]


def test_nothing_is_held_where_it_does_not_apply():
    eng = SharedEngine({"policy-1": 1})
    before = {"policy-0"}
    # another rank: it reports (the gather is a collective) and holds nothing itself
    assert hold_for_other_ranks(eng, dist(1, [[], ["policy-1"], []]), True, before) is before
    assert hold_for_other_ranks(eng, dist(0, [[], ["policy-1"], []]), False, before) is before  # k = 0
    eng.shared_across_ranks = False  # colocated engines: each rank loads its own
    assert hold_for_other_ranks(eng, dist(0, [[], ["policy-1"], []]), True, before) is before
    assert eng.calls == []
