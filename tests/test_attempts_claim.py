"""Attempt numbers are claimed atomically: two attempts started at once get two
directories, each holding its own config.

Two ``create_attempt`` calls at once once both got ``attempt-01-arm`` and one config.yaml held the
other's lr: both had picked the next number before either made its directory, and ``mkdir(exist_ok=True)``
let both in.
"""

from __future__ import annotations

import threading

import pytest
import yaml

from rftlib import attempts
from rftlib.config import make_config


def test_two_create_attempt_at_once_get_two_directories_each_with_its_own_config(tmp_path, monkeypatch):
    real = attempts.next_attempt_id
    both_picked = threading.Barrier(2, timeout=60)
    first_pick: set[int] = set()

    def racing(root, name):
        """Each caller's first pick of a number waits until the other has picked too: both see the same
        free number, the race as it happens between two processes."""
        out = real(root, name)
        if threading.get_ident() not in first_pick:
            first_pick.add(threading.get_ident())
            both_picked.wait()
        return out

    monkeypatch.setattr(attempts, "next_attempt_id", racing)
    runs = tmp_path / "runs"
    made: dict[float, object] = {}

    def create(lr: float) -> None:
        try:
            made[lr] = attempts.create_attempt(make_config("tiny", {"name": "arm", "lr": lr, "runs_root": str(runs)}))
        except BaseException as e:  # noqa: BLE001 -- the assertion below names it
            made[lr] = e

    threads = [threading.Thread(target=create, args=(lr,)) for lr in (1e-3, 2e-3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(not isinstance(v, BaseException) for v in made.values()), made
    assert {p.name for p in made.values()} == {"attempt-01-arm", "attempt-02-arm"}
    for lr, run_dir in made.items():
        doc = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert doc["config"]["lr"] == lr and doc["attempt_id"] == run_dir.name


def test_a_named_attempt_that_exists_is_refused_and_its_config_kept(tmp_path):
    runs = tmp_path / "runs"
    first = attempts.create_attempt(make_config("tiny", {"lr": 1e-3, "runs_root": str(runs)}), "attempt-07-x")
    with pytest.raises(FileExistsError, match="already holds an attempt") as e:
        attempts.create_attempt(make_config("tiny", {"lr": 2e-3, "runs_root": str(runs)}), "attempt-07-x")
    assert "rft resume" in str(e.value)  # the remedy names a command that exists
    assert yaml.safe_load((first / "config.yaml").read_text())["config"]["lr"] == 1e-3


def test_claim_takes_the_next_number_past_one_taken_meanwhile(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    runs.mkdir()
    real = attempts.next_attempt_id
    calls = []

    def stale(root, name):  # the first listing misses a directory another process makes at that moment
        calls.append(name)
        out = real(root, name)
        if len(calls) == 1:
            (runs / out).mkdir()
        return out

    monkeypatch.setattr(attempts, "next_attempt_id", stale)
    assert attempts.claim_attempt_dir(runs, "x").name == "attempt-02-x"
