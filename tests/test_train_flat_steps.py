"""Nothing accumulates over a run: a step leaves no tensors or Python memory behind,
and the metrics row carries the memory a step leaves, not only the run's high-water mark.

The tiny model with B x G = 8 x 8 rows and a reward that varies with the completion (non-zero advantages,
so the update runs rows, keeps entropy / ratio accumulators, steps Adam), evals and checkpoints every 4
steps: the loop ``rft train`` runs. Counts are taken at steps 16, 20, 24 and 28, each an eval step (taken when
its row is emitted, before its checkpoint), so every kind of work has run before the first count: Adam's
state from step 1, the first checkpoint's lazy imports at step 4, the first pruned checkpoint
(max_ckpt_num 1) at step 8. Tensors alive: the same count at each (a kept tensor of any size shows).
Python memory (tracemalloc, which also sees the dicts and strings the collector does not track): what may
grow is the run's own record, mainly the metrics row the loop keeps for the health verdicts
(ALLOWANCE_BYTES_PER_STEP), in the median of the three 4-step intervals: a step that keeps something keeps it in
every interval, while a one-time allocation of the process shows in one. tracemalloc sees every thread of the
process, and under xdist the process has run other tests' files first: in CI's run of 2645741 a module import
(pydantic models, 9.0 MB) landed between steps 16 and 20 of this test, from no code of this test's trainer.
No timings are asserted (bench/long_run_flat.py measures them).
"""

from __future__ import annotations

import collections.abc
import gc
import mmap
import tracemalloc

import torch

from rftlib.train.loop import Trainer

ALLOWANCE_BYTES_PER_STEP = 12288
"""Python memory a step may keep: the metrics row the loop holds for the health verdicts (~2.5 KB: 60 floats
under their keys) and small caches still filling (names jinja interns while compiling peft's model card at
each checkpoint, transformers' output-capture keys): tracemalloc measured 7.2, 5.3 and 4.6 KB a step over
steps 16-24, 24-32 and 32-40 of this run. One small object kept per completion (a dict holding its text, 64
per step) measured 25.7 KB a step."""

CENSUS_STEPS = (16, 20, 24, 28)

NOT_A_STEPS_KEEP = [tracemalloc.Filter(False, "<frozen abc>")]
"""Left out of the census: the ABC machinery's subclass-check caches (``_abc_subclasscheck``, abc.py's line
123). They hold weak references to the classes an ``isinstance`` against an ABC has met, so they are bounded by
the classes in the process, not by steps; and an ``ABCMeta.register`` anywhere in the process (a lazy import,
another test's in the same xdist worker) empties every negative cache, which then refills. One ``issubclass``
of a new class against an ABC adds a weak reference to the negative cache of every subclass of that ABC loaded
in the process, so the size depends on what else the worker imported. Stop 48's CI counted 43.6 KiB of it
(591 weak references of 76 B, abc.py:123) between steps 20 and 24 of this test, in an xdist worker that had run
other files first. 600 new classes checked against ``Mapping`` at step 22 (a planted break) add 5.4 MB here,
and fail the census when it does not leave them out."""


def varied_reward(text, ex, trunc):
    """Rewards that vary with the completion, so advantages are non-zero and the update runs rows."""
    return float(len(text) % 2), {"correctness": 0.0}


def _abc_caches(snap: tracemalloc.Snapshot) -> int:
    """Bytes the snapshot attributes to the ABC caches (NOT_A_STEPS_KEEP's complement), counted on a filtered
    copy that is dropped at once (a kept filtered snapshot would itself be traced)."""
    return sum(t.size for t in snap.filter_traces([tracemalloc.Filter(True, "<frozen abc>")]).traces)


def _tensors_alive() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


def _train(cfg, task, callback) -> Trainer:
    tr = Trainer(cfg, progress=False, task=task, callbacks=[callback])
    try:
        tr.train()
    finally:
        tr.close()
    return tr


def test_steps_leave_no_tensors_or_python_memory_behind(tiny_cfg, task_with):
    cfg = tiny_cfg(num_steps=28, eval_steps=4, save_steps=4, max_ckpt_num=1, rollout_batch_size=8,
                   n_samples_per_prompt=8, report_to=["tensorboard"])
    census: dict[int, tuple[int, int, tracemalloc.Snapshot]] = {}
    ran: list[float] = []  # floats only: the test keeps nothing of its own per step (a row carries the live
    # view's sample group)

    def count(row):
        if "reward_mean" not in row:
            return
        ran.append(1.0 - row.get("update/skipped_row_frac", 1.0))
        if row["step"] == 12:
            tracemalloc.start()
        if row["step"] in CENSUS_STEPS:  # eval + checkpoint steps: the same work each time
            gc.collect()
            traced, snap = tracemalloc.get_traced_memory()[0], tracemalloc.take_snapshot()
            census[row["step"]] = (_tensors_alive(), traced - _abc_caches(snap), snap)

    try:
        _train(cfg, task_with(cfg, varied_reward), count)
    finally:
        tracemalloc.stop()
    assert max(ran) > 0, "the update never ran a row"
    tensors = {s: c[0] for s, c in census.items()}
    assert len(set(tensors.values())) == 1, f"tensors alive at steps {CENSUS_STEPS}: {tensors}: a step keeps tensors"
    per_step = {}  # (a, b) -> bytes a step, and what grew most
    for a, b in zip(CENSUS_STEPS, CENSUS_STEPS[1:]):
        (_, ba, sa), (_, bb, sb) = census[a], census[b]
        grown = [st for st in sb.filter_traces(NOT_A_STEPS_KEEP).compare_to(sa.filter_traces(NOT_A_STEPS_KEEP), "lineno")
                 if st.size_diff > 0][:5]
        per_step[(a, b)] = ((bb - ba) / (b - a), grown)
    median = sorted(v for v, _ in per_step.values())[len(per_step) // 2]
    assert median <= ALLOWANCE_BYTES_PER_STEP, (
        f"{median:.0f} bytes of Python objects more per step in the median interval: a step keeps more than its "
        "metrics row; per interval, with what grew most:\n" + "\n".join(
            f"steps {a}-{b}: {v:.0f} B/step\n  " + "\n  ".join(str(st) for st in grown)
            for (a, b), (v, grown) in per_step.items()))


def test_the_census_finds_the_abc_caches_it_leaves_out():
    """_abc_caches finds what isinstance/issubclass against an ABC caches, under the name this Python gives
    abc's frames (if a Python renames them, this fails rather than the census silently counting them)."""
    fresh = [type(f"Fresh{i}", (), {}) for i in range(200)]
    tracemalloc.start()
    try:
        before = _abc_caches(tracemalloc.take_snapshot())
        for c in fresh:
            issubclass(c, collections.abc.Mapping)
        after = _abc_caches(tracemalloc.take_snapshot())
    finally:
        tracemalloc.stop()
    assert after - before >= 200 * 48, f"{after - before} bytes: 200 new negative-cache entries not found"  # a
    # weak reference is at least 48 bytes


def test_rss_after_the_step_follows_what_the_process_holds(tiny_cfg, task_with):
    """memory/rss_gib is the resident size when the row is taken: 256 MiB held from step 2's row to step
    3's shows in step 3's value and is gone from step 4's, while memory/peak_rss_gib (ru_maxrss, the run's
    high-water mark) cannot come down: only the first tells a run that keeps memory from one that once
    reached a higher peak."""
    cfg = tiny_cfg(num_steps=4, save_steps=0)
    held: list[mmap.mmap] = []
    rss: dict[int, float] = {}  # MiB
    peak: dict[int, float] = {}  # GiB
    mib = 256

    def hold(row):
        if "reward_mean" not in row:
            return
        rss[row["step"]] = row["memory/rss_gib"] * 1024
        peak[row["step"]] = row["memory/peak_rss_gib"]
        if row["step"] == 2:
            # an anonymous mapping of its own, one byte written per page (every page resident), not a numpy
            # array: whether malloc returns a freed block to the kernel depends on the allocator's state in the
            # process (in CI's whole-suite process a freed 256 MiB array stayed resident), and the allocator is
            # not what this test is about
            m = mmap.mmap(-1, mib * 2**20)
            for off in range(0, mib * 2**20, mmap.PAGESIZE):
                m[off] = 1
            held.append(m)
        elif row["step"] == 3:
            held.pop().close()  # munmap: the pages leave the process at once

    _train(cfg, task_with(cfg, varied_reward), hold)
    assert rss[3] - rss[2] > 0.8 * mib, rss
    assert rss[3] - rss[4] > 0.8 * mib, rss
    assert peak[4] >= peak[3] >= peak[2], peak
    assert rss[4] <= peak[4] * 1024 + 1, (rss, peak)
