"""Business metrics a job reports about itself, and the incremental reader that finds them in its log.

A job reports by printing one line (anywhere in the line, so a logger's prefix is fine):

    TRAINYARD_METRIC {"step": 100, "loss": 0.42, "throughput": 812.5, "progress": 0.1, "peak_memory_mib": 9100}

or by POSTing the same JSON object to `/api/v1/monitoring/jobs/<job id>/metrics/`. Values must be numbers;
`step` is an integer; `ts` (Unix seconds) dates the report, else the time it was read. Any other numeric key
is kept and charted too (at most `MAX_KEYS`).

The reader remembers, per attempt, the next line number, the byte offset and the log file's inode. While
the writer appends (the normal case) it seeks to the offset and reads only what is new. When the log store
switched the attempt to its ring (the file is rewritten, so the inode changes), the file holds at most the
last 5000 lines: it is read once per rewrite, numbered from the store's `first_line`, and lines already
seen are skipped. `jobs.logstore.read_lines` would re-scan the log from its start on every pass, which is
why the reader seeks by offset instead.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jobs.logstore import LogMeta

TAG = "TRAINYARD_METRIC"
KNOWN_KEYS = ("loss", "throughput", "progress", "peak_memory_mib", "epoch")
MAX_KEYS = 32
KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:/-]{0,63}\Z")
MAX_READ_BYTES = 8 * 1024 * 1024
_TAG_BYTES = TAG.encode()


class MetricRejected(ValueError):
    def __init__(self, message: str, code: str, field: str | None = None):
        super().__init__(message)
        self.code = code
        self.field = field


@dataclass(frozen=True)
class MetricReport:
    step: int | None
    values: dict[str, float]
    at: datetime | None = None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def parse_report(data: Any, *, strict: bool) -> MetricReport:
    """Validate one report. Strict (the API) rejects any bad key or value; lenient (logs) skips them."""
    if not isinstance(data, dict):
        raise MetricRejected("a metric report must be a JSON object", "invalid_metric_report")
    step = data.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**63):
        if strict:
            raise MetricRejected("step must be a non-negative integer", "invalid_metric_step", "step")
        step = None
    at = None
    ts = data.get("ts")
    if ts is not None:
        seconds = _number(ts)
        try:
            at = datetime.fromtimestamp(seconds, tz=UTC) if seconds is not None and seconds > 0 else None
        except (OverflowError, OSError, ValueError):  # past year 9999, or beyond what the platform can date
            at = None
        if at is None and strict:
            raise MetricRejected("ts must be Unix seconds", "invalid_metric_ts", "ts")
    values: dict[str, float] = {}
    for key, raw in data.items():
        if key in {"step", "ts"}:
            continue
        number = _number(raw)
        if not isinstance(key, str) or not KEY.match(key) or number is None:
            if strict:
                raise MetricRejected(
                    f"'{key}' must be a metric name with a finite number as value", "invalid_metric_value", str(key)
                )
            continue
        values[key] = number
    if len(values) > MAX_KEYS:
        if strict:
            raise MetricRejected(f"at most {MAX_KEYS} metrics per report", "too_many_metrics")
        values = dict(list(values.items())[:MAX_KEYS])
    if not values and step is None:
        raise MetricRejected("the report holds no number", "empty_metric_report")
    return MetricReport(step=step, values=values, at=at)


def parse_line(text: str) -> MetricReport | None:
    """The report a log line carries, None when it carries none; raises MetricRejected for a broken one."""
    where = text.find(TAG)
    if where < 0:
        return None
    payload = text[where + len(TAG) :].strip()
    if not payload.startswith("{"):
        raise MetricRejected("the tag must be followed by a JSON object", "invalid_metric_report")
    try:
        data, _ = json.JSONDecoder().raw_decode(payload)
    except ValueError as exc:
        raise MetricRejected(f"not JSON: {exc}", "invalid_metric_report")
    return parse_report(data, strict=False)


@dataclass
class ReadPosition:
    next_line: int
    byte_offset: int
    inode: int | None


@dataclass
class ReadResult:
    lines: list[tuple[int, str]]  # (line number, text) of lines carrying the tag
    position: ReadPosition
    at_end: bool  # nothing more to read right now
    closed: bool  # the writer closed the log (the attempt is over)
    watched: list[tuple[int, str, int]] = field(default_factory=list)  # (line, text, index of the pattern it holds)
    raw: list[tuple[int, bytes]] = field(default_factory=list, repr=False)  # every new line, numbered


def read_new_tagged_lines(folder: Path, position: ReadPosition, watch: tuple[str, ...] = ()) -> ReadResult | None:
    """Tagged lines written since `position`, and the lines holding one of the `watch` texts (case folded); None
    when the log is mid-rewrite (try again next pass)."""
    path = folder / "log"
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below on every path
    except FileNotFoundError:
        return ReadResult([], position, at_end=True, closed=LogMeta.read(folder).closed)
    with f:
        inode = os.fstat(f.fileno()).st_ino
        size = os.fstat(f.fileno()).st_size
        if position.inode == inode and size >= position.byte_offset:
            result = _read_appended(f, folder, position, inode, size)
        else:
            meta = LogMeta.read(folder)
            if position.inode is None and not meta.ring and size >= position.byte_offset:
                result = _read_appended(f, folder, position, inode, size)
            else:
                result = _read_rewritten(f, folder, position, inode)
    if result is not None and watch:
        result.watched = _watched(result.raw, watch)
    return result


def _watched(raw: list[tuple[int, bytes]], watch: tuple[str, ...]) -> list[tuple[int, str, int]]:
    needles = [w.lower().encode() for w in watch]
    out = []
    for number, line in raw:
        folded = line.lower()
        for k, needle in enumerate(needles):
            if needle in folded:
                out.append((number, line.decode("utf-8", "replace"), k))
                break
    return out


def _tagged(raw_lines: list[bytes], first_number: int, skip_below: int) -> list[tuple[int, str]]:
    out = []
    for i, raw in enumerate(raw_lines):
        number = first_number + i
        if number >= skip_below and _TAG_BYTES in raw:
            out.append((number, raw.decode("utf-8", "replace")))
    return out


def _read_appended(f, folder: Path, position: ReadPosition, inode: int, size: int) -> ReadResult:
    f.seek(position.byte_offset)
    data = f.read(MAX_READ_BYTES)
    cut = data.rfind(b"\n")
    complete = data[: cut + 1] if cut >= 0 else b""  # a line still being written waits for its newline
    raw_lines = complete.split(b"\n")[:-1] if complete else []
    lines = _tagged(raw_lines, position.next_line, position.next_line)
    new = ReadPosition(
        next_line=position.next_line + len(raw_lines), byte_offset=position.byte_offset + len(complete), inode=inode
    )
    at_end = new.byte_offset >= size
    result = ReadResult(lines, new, at_end=at_end, closed=LogMeta.read(folder).closed)
    result.raw = [(position.next_line + i, raw) for i, raw in enumerate(raw_lines)]
    return result


def _read_rewritten(f, folder: Path, position: ReadPosition, inode: int) -> ReadResult | None:
    data = f.read()
    cut = data.rfind(b"\n")
    complete = data[: cut + 1] if cut >= 0 else b""
    raw_lines = complete.split(b"\n")[:-1] if complete else []
    # Read the meta after the file: the writer replaces the file first, then writes a meta that matches it.
    meta = LogMeta.read(folder)
    if raw_lines and meta.first_line + len(raw_lines) - 1 != meta.lines_seen:
        return None
    lines = _tagged(raw_lines, meta.first_line, position.next_line)
    next_line = max(position.next_line, meta.first_line + len(raw_lines))
    new = ReadPosition(next_line=next_line, byte_offset=len(complete), inode=inode)
    result = ReadResult(lines, new, at_end=True, closed=meta.closed)
    result.raw = [
        (meta.first_line + i, raw) for i, raw in enumerate(raw_lines) if meta.first_line + i >= position.next_line
    ]
    return result
