"""The log store: one folder per attempt under `TRAINYARD_LOG_ROOT`, written by the local runner or the
Kubernetes log collector, read by the API, the classifier and the WebSocket stream.

Layout of `<root>/<job_id>/attempt-<n>/`:
- `log`: the kept lines, UTF-8, one per line (over-long lines are cut at `MAX_LINE_BYTES`);
- `stderr`: the lines the command wrote to stderr, each as `<its number in log>\t<text>` (local jobs: stdout and
  stderr are read from two pipes; `log` has both in the order they were read). Capped at `STDERR_MAX_BYTES` per
  attempt, past which stderr lines go to `log` only (`stderr_dropped` counts them);
- `meta.json`: counts, and `first_line`: the number of the first kept line (1 until lines were dropped).
  A lazy flush (the runner's, after each read) rewrites it at most every `RING_FLUSH_S`; `close` always does.

Each job has a daily budget (bytes and lines, settings), counted per job per UTC day across its attempts in
`<root>/<job_id>/budget.json` (attempts of a job never write at once). Past it the writer switches to a ring: it
keeps only the last `RING_LINES` lines (in memory, bounded) and rewrites `log` with them now and then and on
close, recording how many lines and bytes were dropped. Memory stays bounded however much a job prints.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings

RING_LINES = 5000
MAX_LINE_BYTES = 16 * 1024
RING_FLUSH_S = 0.5
STDERR_MAX_BYTES = 8 * 1024 * 1024


def attempt_dir(job_id: str, attempt_number: int, root: Path | None = None) -> Path:
    return Path(root or settings.TRAINYARD_LOG_ROOT) / str(job_id) / f"attempt-{attempt_number}"


WATCHED_FILE = ".watched"


def mark_watched(job_id: str, root: Path | None = None) -> None:
    """Someone reads this job's log now (a log page or socket, the API, `trainyard logs -f`): a collector that
    copies logs on a slow schedule (the Kubernetes one) copies this job's every pass for a while."""
    path = Path(root or settings.TRAINYARD_LOG_ROOT) / str(job_id) / WATCHED_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:
        pass  # a read-only or full log store: the collector keeps its slow schedule


def watched_within(job_id: str, seconds: float, root: Path | None = None) -> bool:
    try:
        stamp = (Path(root or settings.TRAINYARD_LOG_ROOT) / str(job_id) / WATCHED_FILE).stat().st_mtime
    except OSError:
        return False
    return time.time() - stamp <= seconds


@dataclass
class LogMeta:
    lines_seen: int = 0
    bytes_seen: int = 0
    dropped_lines: int = 0
    dropped_bytes: int = 0
    first_line: int = 1
    ring: bool = False
    day: str = ""
    day_lines: int = 0
    day_bytes: int = 0
    closed: bool = False
    stderr_lines: int = 0
    stderr_bytes: int = 0
    stderr_dropped: int = 0

    @classmethod
    def read(cls, folder: Path) -> LogMeta:
        try:
            data = json.loads((folder / "meta.json").read_text())
        except (OSError, ValueError):
            return cls()
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class LogWriter:
    """Appends lines to one attempt's log, enforcing the daily budget; not thread-safe (one writer)."""

    def __init__(self, folder: Path, *, budget_bytes: int | None = None, budget_lines: int | None = None):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.budget_bytes = budget_bytes if budget_bytes is not None else settings.TRAINYARD_LOG_DAILY_BYTES
        self.budget_lines = budget_lines if budget_lines is not None else settings.TRAINYARD_LOG_DAILY_LINES
        self.meta = LogMeta.read(folder)
        self.meta.closed = False
        # In the store's layout (<job>/attempt-<n>) the day's counts are the job's, shared by its attempts.
        self._job_budget = folder.parent / "budget.json" if folder.name.startswith("attempt-") else None
        self._load_job_budget()
        self._file = open(folder / "log", "ab")  # noqa: SIM115 - lives as long as the writer
        self._stderr = None
        self._ring: deque[bytes] | None = None
        self._last_flush = 0.0
        self._last_meta = 0.0
        if self.meta.ring:
            self._enter_ring()
        self._write_meta()

    def _today(self) -> str:
        return datetime.now(UTC).strftime("%Y-%m-%d")

    def _load_job_budget(self) -> None:
        """Start today's counts from what earlier attempts of the job used today."""
        if self._job_budget is None:
            return
        try:
            used = json.loads(self._job_budget.read_text())
        except (OSError, ValueError):
            return
        day = used.get("day")
        if day == self._today():
            same = self.meta.day == day
            self.meta.day_lines = max(self.meta.day_lines if same else 0, int(used.get("lines", 0)))
            self.meta.day_bytes = max(self.meta.day_bytes if same else 0, int(used.get("bytes", 0)))
            self.meta.day = day

    def write_line(self, line: bytes | str, *, stream: str = "stdout") -> None:
        data = line.encode("utf-8", "replace") if isinstance(line, str) else line
        data = data.rstrip(b"\r\n")
        if len(data) > MAX_LINE_BYTES:
            data = data[:MAX_LINE_BYTES] + " …[line cut]".encode()
        data += b"\n"
        day = self._today()
        if day != self.meta.day:
            self.meta.day, self.meta.day_lines, self.meta.day_bytes = day, 0, 0
        self.meta.lines_seen += 1
        if stream == "stderr":
            self._write_stderr(data)
        self.meta.bytes_seen += len(data)
        self.meta.day_lines += 1
        self.meta.day_bytes += len(data)
        if self._ring is None and (self.meta.day_lines > self.budget_lines or self.meta.day_bytes > self.budget_bytes):
            self._enter_ring()
        if self._ring is not None:
            if len(self._ring) == RING_LINES:
                dropped = self._ring.popleft()
                self.meta.dropped_lines += 1
                self.meta.dropped_bytes += len(dropped)
            self._ring.append(data)
            now = time.monotonic()
            if now - self._last_flush >= RING_FLUSH_S:
                self._flush_ring()
        else:
            self._file.write(data)

    def _write_stderr(self, data: bytes) -> None:
        entry = b"%d\t" % self.meta.lines_seen + data
        if self.meta.stderr_bytes + len(entry) > STDERR_MAX_BYTES:
            self.meta.stderr_dropped += 1
            return
        if self._stderr is None:
            self._stderr = open(self.folder / "stderr", "ab")  # noqa: SIM115 - lives as long as the writer
        self._stderr.write(entry)
        self.meta.stderr_lines += 1
        self.meta.stderr_bytes += len(entry)

    def write_many(self, lines) -> None:
        for line in lines:
            self.write_line(line)

    def flush(self, *, lazy: bool = False) -> None:
        if self._stderr is not None:
            self._stderr.flush()
        if self._ring is not None:
            # Rewriting the ring costs the whole kept tail: a lazy flush does it at most every RING_FLUSH_S.
            if not lazy or time.monotonic() - self._last_flush >= RING_FLUSH_S:
                self._flush_ring()
        else:
            self._file.flush()
            # The log file itself is what readers follow; the counts in meta.json may lag by RING_FLUSH_S.
            if not lazy or time.monotonic() - self._last_meta >= RING_FLUSH_S:
                self._write_meta()

    def _enter_ring(self) -> None:
        self._file.flush()
        kept = deque(maxlen=RING_LINES)
        with open(self.folder / "log", "rb") as f:
            for line in f:
                if len(kept) == RING_LINES:
                    self.meta.dropped_lines += 1
                    self.meta.dropped_bytes += len(kept[0])
                kept.append(line)
        self._ring = deque(kept, maxlen=None)
        self.meta.ring = True

    def _flush_ring(self) -> None:
        assert self._ring is not None
        self._file.close()
        _atomic_write(self.folder / "log", b"".join(self._ring))
        self._file = open(self.folder / "log", "ab")  # noqa: SIM115
        self.meta.first_line = self.meta.lines_seen - len(self._ring) + 1
        self._last_flush = time.monotonic()
        self._write_meta()

    def _write_meta(self) -> None:
        if self._ring is None:
            self.meta.first_line = 1
        self._last_meta = time.monotonic()
        _atomic_write(self.folder / "meta.json", json.dumps(asdict(self.meta)).encode())
        if self.meta.day and self._job_budget is not None:
            used = {"day": self.meta.day, "lines": self.meta.day_lines, "bytes": self.meta.day_bytes}
            _atomic_write(self._job_budget, json.dumps(used).encode())

    def abandon(self) -> None:
        """Drop the open file after a write failed (a full disk): nothing more is flushed."""
        for f in (self._file, self._stderr):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass

    def close(self) -> None:
        if self._file.closed:
            return
        self.meta.closed = True
        self.flush()
        self._file.close()
        if self._stderr is not None:
            self._stderr.close()


@dataclass(frozen=True)
class LogLine:
    number: int
    text: str


def read_lines(folder: Path, *, start: int = 1, limit: int = 1000) -> tuple[list[LogLine], LogMeta]:
    """Kept lines numbered from `start` (1-based, in the job's own numbering), at most `limit`."""
    meta = LogMeta.read(folder)
    out: list[LogLine] = []
    number = meta.first_line
    try:
        with open(folder / "log", "rb") as f:
            for raw in f:
                if not raw.endswith(b"\n"):
                    break  # a line still being written
                if number >= start:
                    out.append(LogLine(number, raw[:-1].decode("utf-8", "replace")))
                    if len(out) >= limit:
                        break
                number += 1
    except FileNotFoundError:
        pass
    return out, meta


def tail_lines(folder: Path, count: int) -> tuple[list[LogLine], LogMeta]:
    """The last `count` kept lines, read from the end of the file (never the whole log)."""
    meta = LogMeta.read(folder)
    path = folder / "log"
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return [], meta
    block = 64 * 1024
    data = b""
    with open(path, "rb") as f:
        pos = size
        while pos > 0 and data.count(b"\n") <= count:
            step = min(block, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
    if not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
    lines = data.split(b"\n")[:-1]
    # Count lines before the block to number them: only cheap when we read from the start.
    total_kept = _count_lines(path) if pos > 0 else len(lines)
    lines = lines[-count:] if count else []
    first = meta.first_line + total_kept - len(lines)
    return [LogLine(first + i, raw.decode("utf-8", "replace")) for i, raw in enumerate(lines)], meta


@dataclass
class Follower:
    """Follows one attempt's log from a line number on, reading only what was appended since last time.

    Survives the ring's rewrites: when the file is replaced it finds its place again by line number.
    """

    folder: Path
    next_line: int = 1
    _offset: int = 0
    _inode: int | None = None
    _first_line: int = 1

    @classmethod
    def at_tail(cls, folder: Path, count: int) -> tuple[Follower, list[LogLine]]:
        lines, meta = tail_lines(folder, count)
        start = lines[0].number if lines else None
        follower = cls(folder=folder)
        if start is None:
            follower._resync(meta.first_line + _kept_count(folder / "log"))
            return follower, []
        follower._resync(start)
        return follower, follower.poll()

    @classmethod
    def after(cls, folder: Path, line: int) -> Follower:
        follower = cls(folder=folder)
        follower._resync(line + 1)
        return follower

    def _resync(self, next_line: int) -> None:
        """Position the byte offset at `next_line` by scanning the (kept, so bounded or plain) file."""
        meta = LogMeta.read(self.folder)
        path = self.folder / "log"
        self.next_line = max(next_line, meta.first_line)
        self._first_line = meta.first_line
        number, offset = meta.first_line, 0
        try:
            stat = path.stat()
            self._inode = stat.st_ino
            with open(path, "rb") as f:
                while number < self.next_line:
                    raw = f.readline()
                    if not raw.endswith(b"\n"):
                        break
                    offset += len(raw)
                    number += 1
        except FileNotFoundError:
            self._inode = None
        self._offset = offset
        self.next_line = number

    def poll(self, max_lines: int = 5000) -> list[LogLine]:
        path = self.folder / "log"
        try:
            stat = path.stat()
        except FileNotFoundError:
            return []
        if stat.st_ino != self._inode or stat.st_size < self._offset:
            self._resync(self.next_line)  # the ring rewrote the file
        out: list[LogLine] = []
        with open(path, "rb") as f:
            f.seek(self._offset)
            while len(out) < max_lines:
                raw = f.readline()
                if not raw.endswith(b"\n"):
                    break
                self._offset += len(raw)
                out.append(LogLine(self.next_line, raw[:-1].decode("utf-8", "replace")))
                self.next_line += 1
        return out


def _kept_count(path: Path) -> int:
    try:
        return _count_lines(path)
    except FileNotFoundError:
        return 0


def _count_lines(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            n += chunk.count(b"\n")
    return n


def search(folder: Path, pattern: str, *, context: int = 2, limit: int = 200) -> Iterator[dict]:
    """Case-insensitive keyword search with line numbers and context, streaming through the file."""
    needle = pattern.lower()
    meta = LogMeta.read(folder)
    before: deque[LogLine] = deque(maxlen=context)
    pending: list[dict] = []
    found = 0
    number = meta.first_line
    try:
        f = open(folder / "log", "rb")  # noqa: SIM115
    except FileNotFoundError:
        return
    with f:
        for raw in f:
            line = LogLine(number, raw.rstrip(b"\n").decode("utf-8", "replace"))
            for hit in pending:
                if len(hit["after"]) < context:
                    hit["after"].append(asdict(line))
            while pending and len(pending[0]["after"]) >= context:
                yield pending.pop(0)
            if found < limit and needle in line.text.lower():
                found += 1
                pending.append({"line": asdict(line), "before": [asdict(b) for b in before], "after": []})
            before.append(line)
            number += 1
    yield from pending


def stderr_lines(folder: Path, *, tail: int | None = None, start: int = 1, limit: int = 1000) -> list[LogLine]:
    """The attempt's stderr lines, numbered as in its merged log: the last `tail`, else from line `start` on."""
    try:
        raw = (folder / "stderr").read_bytes()
    except OSError:
        return []
    out: list[LogLine] = []
    for entry in raw.splitlines():
        number, _, text = entry.partition(b"\t")
        if number.isdigit():
            out.append(LogLine(int(number), text.decode("utf-8", "replace")))
    if tail is not None:
        return out[-tail:] if tail > 0 else []
    return [x for x in out if x.number >= start][:limit]


def tail_text(folder: Path, max_bytes: int = 65536) -> str:
    path = folder / "log"
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - max_bytes))
            return f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
