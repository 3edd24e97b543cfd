"""A resume that changes the config (the train notebook's ``resume`` with ``overrides``, ``rft resume``): the
attempt's config.yaml follows it, so a later resume without overrides keeps the change, and its ``resumes`` list
says from which step what changed; the notebook's description names the change against the attempt's value, not
the default's. Found resuming a max_staleness 3 attempt at 1: config.yaml kept 3 and the notebook said "0 -> 1"."""

from __future__ import annotations

import yaml

from rftlib.train.loop import Trainer
from rftlib.workbench import describe, start


def test_a_resumes_changes_are_recorded_and_kept(tiny_cfg):
    cfg = tiny_cfg(num_steps=3, save_steps=1)
    tr = Trainer(cfg, progress=False)
    try:
        tr.step()
        tr.save()
    finally:
        tr.close()
    run_dir = tr.run_dir
    before = cfg.lr

    run = start({"resume": str(run_dir), "overrides": {"lr": 2 * before}})
    assert run.cfg.lr == 2 * before and run.changed == {"lr": (before, 2 * before)}
    doc = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert doc["config"]["lr"] == 2 * before
    assert doc["resumes"] == [{"at_step": 1, "changed": {"lr": [before, 2 * before]}}]
    text = describe(run)
    assert "changed at this resume" in text and f"lr: {before!r} -> {2 * before!r}" in text

    again = start({"resume": str(run_dir)})  # no overrides: the attempt goes on as it was last resumed
    assert again.cfg.lr == 2 * before and again.changed == {} and "changed at this resume" not in describe(again)
    more = start({"resume": str(run_dir), "additional_steps": 4})
    assert more.cfg.num_steps == 5 and more.changed == {"num_steps": (3, 5)}
    doc = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert doc["resumes"][-1] == {"at_step": 1, "changed": {"num_steps": [3, 5]}, "from_num_steps": 3,
                                  "to_num_steps": 5}
    assert doc["config"]["num_steps"] == 5 and len(doc["resumes"]) == 2
    # the report's header says what changed from which step (the config it shows is the last resume's)
    from rftlib.report.analysis import header
    from rftlib.report.attempt import load_attempt

    html = str(header(load_attempt(run_dir)))
    assert "resumed with changes" in html and f"from step 1: lr {before!r} \u2192 {2 * before!r}" in html
    assert "from step 1: num_steps 3 \u2192 5" in html
