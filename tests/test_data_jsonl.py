"""jsonl.py: a malformed row is an error naming its file and line; nothing is skipped silently."""

from __future__ import annotations

import gzip
import json

import pytest

from rftlib.data.jsonl import DataError, read_json, read_jsonl, read_table, write_jsonl


def write(tmp_path, name: str, text: str):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_reads_rows_in_order(tmp_path):
    p = write(tmp_path, "a.jsonl", '{"x": 1}\n{"x": 2}\n')
    assert read_jsonl(p, required=["x"]) == [{"x": 1}, {"x": 2}]


def test_invalid_json_names_file_and_line(tmp_path):
    p = write(tmp_path, "bad.jsonl", '{"x": 1}\n{"x": 2}\n{"x": \n')
    with pytest.raises(DataError, match=rf"^{p}:3: invalid JSON"):
        read_jsonl(p)


def test_missing_column_names_the_column_and_line(tmp_path):
    p = write(tmp_path, "m.jsonl", '{"problem": "a", "answer": "1"}\n{"problem": "b"}\n')
    with pytest.raises(DataError, match=rf"^{p}:2: missing column 'answer'"):
        read_jsonl(p, required=["problem", "answer"])


def test_blank_line_and_non_object_are_errors(tmp_path):
    p = write(tmp_path, "b.jsonl", '{"x": 1}\n\n{"x": 2}\n')
    with pytest.raises(DataError, match=rf"^{p}:2: blank line"):
        read_jsonl(p)
    q = write(tmp_path, "l.jsonl", '{"x": 1}\n[1, 2]\n')
    with pytest.raises(DataError, match=rf"^{q}:2: expected a JSON object, got list"):
        read_jsonl(q)


def test_missing_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        read_jsonl(tmp_path / "nope.jsonl")


def test_gzip_and_write_roundtrip(tmp_path):
    rows = [{"input": "é", "label": "1"}, {"input": "b", "label": "2"}]
    assert write_jsonl(tmp_path / "out.jsonl", rows) == 2
    assert read_jsonl(tmp_path / "out.jsonl") == rows
    gz = tmp_path / "g.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write(json.dumps(rows[0]) + "\n{oops\n")
    with pytest.raises(DataError, match=rf"^{gz}:2: invalid JSON"):
        read_table(gz)


def test_read_json_reports_line(tmp_path):
    p = write(tmp_path, "d.json", '[\n  {"a": 1},\n  {"a": }\n]\n')
    with pytest.raises(DataError, match=rf"^{p}:3: invalid JSON"):
        read_json(p)


def test_unsupported_suffix_and_parquet_without_pyarrow(tmp_path):
    with pytest.raises(DataError, match="unsupported file type"):
        read_table(write(tmp_path, "x.csv", "a,b\n"))
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(DataError, match="pyarrow"):
            read_table(write(tmp_path, "x.parquet", ""))


def test_parquet_rows_are_checked_like_lines(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is optional (not a dependency)")
    import pyarrow as pa

    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"problem": ["a", "b"], "answer": ["1", "2"]}), p)
    assert read_table(p, required=["problem", "answer"])[1] == {"problem": "b", "answer": "2"}
    with pytest.raises(DataError, match=rf"^{p}:1: missing column 'solution'"):
        read_table(p, required=["problem", "solution"])
