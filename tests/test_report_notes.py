"""rft note: a dated conclusion appended to an attempt, shown beside its launch hypothesis in the
report header and the index (seed 003's research log: lessons learned, next steps)."""

from __future__ import annotations

import json

import pytest

from rftlib.attempts import create_attempt
from rftlib.cli import main
from rftlib.config import make_config
from rftlib.report import analysis
from rftlib.report.attempt import add_note, load_attempt, read_notes
from rftlib.report.index import build_index


@pytest.fixture
def attempt(tmp_path):
    cfg = make_config("tiny", {"runs_root": str(tmp_path / "runs"), "notes": "eps_clip 0.1 cuts the grad spikes"})
    return create_attempt(cfg)


def test_add_note_appends_dated_conclusions_in_order(attempt):
    add_note(attempt, "spikes gone, accuracy flat", date="2026-11-25T09:00:00")
    add_note(attempt, "  next: try clip-higher 0.28  ", date="2026-11-25T10:30:00")
    assert read_notes(attempt) == [{"date": "2026-11-25T09:00:00", "text": "spikes gone, accuracy flat"},
                                   {"date": "2026-11-25T10:30:00", "text": "next: try clip-higher 0.28"}]
    a = load_attempt(attempt)
    assert a.hypothesis == "eps_clip 0.1 cuts the grad spikes" and len(a.conclusions) == 2


def test_add_note_refuses_an_empty_note_and_a_directory_that_is_no_attempt(attempt, tmp_path):
    with pytest.raises(ValueError, match="the note is empty"):
        add_note(attempt, "   ")
    with pytest.raises(FileNotFoundError, match="not an attempt directory"):
        add_note(tmp_path, "x")
    assert read_notes(attempt) == []


def test_rft_note_shows_in_the_index_and_the_report_beside_the_hypothesis(attempt, tmp_path, capsys):
    out = tmp_path / "reports"
    assert main(["note", str(attempt), "lesson: 0.1 halves the spikes", "--out", str(out)]) == 0
    assert "notes.jsonl" in capsys.readouterr().out
    (note,) = [json.loads(x) for x in (attempt / "notes.jsonl").read_text().splitlines()]
    assert note["text"] == "lesson: 0.1 halves the spikes" and note["date"][:4].isdigit()
    index = (out / "index.html").read_text()
    hyp, concl = index.index("<b>Hypothesis.</b> eps_clip 0.1 cuts"), index.index("lesson: 0.1 halves the spikes")
    assert hyp < concl and "rft-conclusion" in index  # same cell, hypothesis first
    header = str(analysis.header(load_attempt(attempt)))
    assert "<b>Hypothesis.</b> eps_clip 0.1 cuts" in header and "lesson: 0.1 halves the spikes" in header
    assert "Conclusion " + note["date"][:10] in header
    assert main(["note", str(tmp_path), "x"]) == 2  # not an attempt: a clear error, not a traceback
    assert "not an attempt directory" in capsys.readouterr().err


def test_index_without_conclusion_says_how_to_write_one(attempt, tmp_path):
    html = str(build_index(attempt.parent, tmp_path / "reports"))
    assert f"rft note {attempt.name}" in html
