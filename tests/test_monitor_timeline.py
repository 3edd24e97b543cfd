"""logs/timeline.jsonl (rftlib.monitor.timeline): the busy shares a step row reports, worked out by hand on
made-up intervals; the file's round trip, resume truncation and its error on a bad line."""

from __future__ import annotations

import json

import pytest

from rftlib.monitor.timeline import Timeline, TimelineLog, covered, intersect, read_timeline, shares, union


def _it(lane, phase, t0, t1, **kw):
    return {"lane": lane, "phase": phase, "t0": t0, "t1": t1, **kw}


def test_union_and_intersection_by_hand():
    assert union([(3, 5), (0, 1), (0.5, 2), (5, 6), (7, 7)]) == [(0, 2), (3, 6)]  # touching merge, empty dropped
    assert covered([(0, 2), (1, 3), (10, 20)], 1, 12) == 2 + 2  # [1,3] and [10,12]
    assert intersect([(0, 2), (3, 6)], [(1, 4)]) == [(1, 2), (3, 4)]


def test_step_shares_by_hand():
    """A 10 s step: the trainer works 0-2 (advantages) and 2-6 (update), waits 6-10; the engine generates
    1-7 and 8-9; the trainer's rollout phase (a synchronous step's wait on the engine) is not trainer work.
    Trainer busy 6/10, engine busy 7/10, both busy over [1, 6] = 5 s."""
    items = [_it("trainer", "advantages", 0, 2), _it("trainer", "update", 2, 6), _it("trainer", "wait", 6, 10),
             _it("trainer", "rollout", 0, 10), _it("engine", "generate", 1, 7, engine=0),
             _it("engine", "generate", 8, 9, engine=1), _it("producer", "reward", 7, 8)]
    got = shares(items, 0, 10)
    assert got == pytest.approx({"trainer_busy": 0.6, "engine_busy": 0.7, "overlap": 5.0})
    assert shares(items, 0, 5) == pytest.approx({"trainer_busy": 1.0, "engine_busy": 0.8, "overlap": 4.0})


def test_round_trip_truncate_and_resume_offset(tmp_path):
    tl = Timeline(origin=100.0)
    tl.add("trainer", "update", 101.0, 103.5, step=1)
    log = TimelineLog(tmp_path)
    log.append(tl.drain())
    now = Timeline()  # a span on the real clock, its seconds since its own origin
    with now.span("engine", "generate", batch=2, step=2):
        pass
    log.append(now.drain())
    assert tl.drain() == []
    log.append([_it("trainer", "update", 5.0, 9.0, step=3)])
    items = read_timeline(tmp_path)
    assert [i["step"] for i in items] == [1, 2, 3] and items[0]["t0"] == 1.0 and items[0]["t1"] == 3.5
    assert log.offset() == 9.0
    log.truncate_after(2)
    assert [i["step"] for i in read_timeline(tmp_path)] == [1, 2]


def test_a_bad_line_names_the_file_and_line(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "timeline.jsonl").write_text(json.dumps(_it("trainer", "update", 0, 1)) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"timeline.jsonl:2: not JSON"):
        read_timeline(tmp_path)
    (tmp_path / "logs" / "timeline.jsonl").write_text('{"lane": "trainer"}\n')
    with pytest.raises(ValueError, match=r"timeline.jsonl:1: an interval needs lane, phase, t0 and t1"):
        read_timeline(tmp_path)
    assert read_timeline(tmp_path / "nothing") == []


def test_a_torn_last_line_is_ignored_and_cut_on_resume(tmp_path):
    """A process killed mid-append leaves half a line without a newline: reading ignores it (the resume must not
    crash), and truncate_after removes it so the next append starts on a line of its own."""
    log = TimelineLog(tmp_path)
    log.append([_it("trainer", "update", 0, 1, step=1), _it("trainer", "update", 1, 2, step=2)])
    with open(log.path, "a") as f:
        f.write('{"lane": "trainer", "pha')
    assert [i["step"] for i in read_timeline(tmp_path)] == [1, 2]
    log.truncate_after(2)
    log.append([_it("trainer", "update", 2, 3, step=3)])
    assert [i["step"] for i in read_timeline(tmp_path)] == [1, 2, 3]
