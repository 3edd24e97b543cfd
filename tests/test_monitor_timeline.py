"""logs/timeline.jsonl (rftlib.monitor.timeline): the busy shares a step row reports, worked out by hand on
made-up intervals; the report's bottleneck with evals left out and scoring counted; the eval's and every engine's
lines; the file's round trip, resume truncation and its error on a bad line."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from rftlib.monitor.timeline import (Timeline, TimelineLog, covered, eval_windows, intersect, read_timeline, shares,
                                     subtract, union)


def _it(lane, phase, t0, t1, **kw):
    return {"lane": lane, "phase": phase, "t0": t0, "t1": t1, **kw}


def test_union_and_intersection_by_hand():
    assert union([(3, 5), (0, 1), (0.5, 2), (5, 6), (7, 7)]) == [(0, 2), (3, 6)]  # touching merge, empty dropped
    assert covered([(0, 2), (1, 3), (10, 20)], 1, 12) == 2 + 2  # [1,3] and [10,12]
    assert intersect([(0, 2), (3, 6)], [(1, 4)]) == [(1, 2), (3, 4)]


def test_step_shares_by_hand():
    """A 10 s step: the trainer works 0-2 (advantages) and 2-6 (update), waits 6-10; the engine generates
    1-7 and 8-9; the producer scores 7-8; the trainer's rollout phase (a synchronous step's wait on the engine) is
    not trainer work. Trainer busy 6/10, engine busy 7/10, scoring 1/10, the rollout side (generate or score)
    over [1, 9] = 8/10, trainer and engine both busy over [1, 6] = 5 s."""
    items = [_it("trainer", "advantages", 0, 2), _it("trainer", "update", 2, 6), _it("trainer", "wait", 6, 10),
             _it("trainer", "rollout", 0, 10), _it("engine", "generate", 1, 7, engine=0),
             _it("engine", "generate", 8, 9, engine=1), _it("producer", "reward", 7, 8)]
    got = shares(items, 0, 10)
    assert got == pytest.approx({"trainer_busy": 0.6, "engine_busy": 0.7, "reward_busy": 0.1, "rollout_busy": 0.8,
                                 "overlap": 5.0})
    assert shares(items, 0, 5) == pytest.approx({"trainer_busy": 1.0, "engine_busy": 0.8, "reward_busy": 0.0,
                                                 "rollout_busy": 0.8, "overlap": 4.0})


def test_scoring_outside_the_step_gives_a_share_within_one():
    """max_staleness 1: the producer scored step 5's batch during step 4 (3 s, 1-4) and scores batch 6 during step
    5 (the window 4-6, 1 s of it, 5-6). The old share, the batch's scoring seconds over the step's, was 3 / 2 = 1.5;
    the share of the step's 2 s some batch was being scored is 1/2."""
    from rftlib.train.step_metrics import reward_share

    items = [_it("producer", "reward", 1, 4, batch=5), _it("producer", "reward", 5, 6, batch=6),
             _it("trainer", "update", 4, 5.5)]
    timing = {"reward": 3.0, "step": 2.0, **shares(items, 4, 6)}
    assert timing["reward_busy"] == pytest.approx(0.5) and reward_share(timing) == pytest.approx(0.5)
    assert reward_share({"reward": 0.5, "step": 2.0}) == 0.25  # a row without a timeline: seconds over seconds


def test_evals_are_left_out_of_the_shares():
    """Trainer: update 0-2, eval 2-8 (the engines generate it, 2.5-7.5 on engines 0 and 1), update 9-10; engine 0
    generates a batch 8-9. Without the eval window [2, 8] the training time is [0, 2] + [8, 10] = 4 s: trainer busy
    3/4, engines generating 1/4. Counting the eval as the trainer's work made the trainer 9/10 busy."""
    items = [_it("trainer", "update", 0, 2), _it("trainer", "eval", 2, 8), _it("engine", "eval", 2.5, 7.5, engine=0),
             _it("engine", "eval", 2.5, 7.5, engine=1), _it("engine", "generate", 8, 9, engine=0),
             _it("trainer", "update", 9, 10)]
    assert eval_windows(items) == [(2, 8)]
    assert subtract([(0, 10)], [(2, 8)]) == [(0, 2), (8, 10)] and subtract([(0, 3)], [(-1, 1), (2, 5)]) == [(1, 2)]
    got = shares(items, 0, 10, exclude=eval_windows(items))
    assert got == pytest.approx({"trainer_busy": 0.75, "engine_busy": 0.25, "reward_busy": 0.0, "rollout_busy": 0.25,
                                 "overlap": 0.0})


def _attempt(items):
    return SimpleNamespace(timeline=items, attempt_id="attempt-01-t", train_rows=[], config={"max_staleness": 1})


def test_the_bottleneck_leaves_evals_out_and_counts_scoring():
    """The report's verdict. (a) The trainer updates 0-1 and waits 1-4 for a batch the engine generates 0-4, then
    evaluates 4-10 (the engine generating the eval): over the training time the rollouts are the bottleneck
    (trainer 1/4 busy, rollouts 4/4); counted as trainer work, the eval made it "training" (trainer 7/10 busy,
    engines 4/10). (b) The engine generates 0-1, the producer scores 1-5, the trainer waits 0-5 and updates 5-6:
    the scoring is what the trainer waits for (rollouts 5/6 busy, trainer 1/6); generation alone (1/6) tied with
    the trainer and the verdict said "training"."""
    from rftlib.report import plots

    a = [_it("trainer", "update", 0, 1), _it("trainer", "wait", 1, 4), _it("engine", "generate", 0, 4, engine=0),
         _it("trainer", "eval", 4, 10, step=1), _it("engine", "eval", 4, 10, engine=0, step=1)]
    title = plots.timeline(_attempt(a)).fig.axes[0].get_title()
    assert "trainer busy 25%" in title and "rollouts 100%" in title and "bottleneck: rollouts (the trainer waits)" \
        in title and "evals left out" in title, title
    b = [_it("engine", "generate", 0, 1, engine=0), _it("producer", "reward", 1, 5), _it("trainer", "wait", 0, 5),
         _it("trainer", "update", 5, 6)]
    title = plots.timeline(_attempt(b)).fig.axes[0].get_title()
    assert "rollouts 83% (generate 17%, score 67%)" in title and "bottleneck: rollouts" in title, title


def test_eval_generation_is_on_every_engine_it_used(tmp_path):
    """An eval's generate calls are ``eval`` lines on the engine lane (they were on no lane), one per engine that got
    a share of the call: server engines take prompt i on engine i % N, so 2 prompts on 3 engines use engines 0 and 1,
    5 prompts all three; an engine without servers is engine 0 (every generate was engine 0 before)."""
    from rftlib.train.timeline_hook import TrainerTimeline

    class Servers:
        servers = [object(), object(), object()]
        precision = "float32"

        def generate(self, prompts, **kw):
            return len(prompts)

    hook = TrainerTimeline(tmp_path, rank=0, is_main=True, engine=Servers(), step=lambda: 4)
    timed = hook.eval_engine(hook.engine)
    assert timed.precision == "float32" and timed.generate(["a", "b"], group_size=1) == 2
    timed.generate(["p"] * 5, group_size=1)
    got = [(it["lane"], it["phase"], it["engine"], it["step"]) for it in hook.timeline.drain()]
    assert got == [("engine", "eval", 0, 4), ("engine", "eval", 1, 4)] + [("engine", "eval", k, 4) for k in range(3)]
    single = TrainerTimeline(tmp_path, rank=0, is_main=False, engine=object(), step=lambda: 0)
    assert single.engine_lanes(8) == [{"engine": 0}]


def test_an_open_span_counts_until_now():
    """A span still running (a batch generating at the step's end) is in ``peek(now)``, ending at now; it is
    recorded as ended once the block exits, one line per ``each``."""
    tl = Timeline()
    with tl.span("engine", "generate", each=[{"engine": 0}, {"engine": 1}], batch=3):
        assert tl.peek() == []
        now = time.time()
        (item,) = tl.peek(now=now)
        assert item["lane"] == "engine" and item["batch"] == 3 and item["t1"] == pytest.approx(now - tl.origin)
    done = tl.drain()
    assert [it["engine"] for it in done] == [0, 1] and tl.peek(now=time.time()) == []


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
