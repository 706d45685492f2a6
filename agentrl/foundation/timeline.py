"""A run's timeline: what each step spent its time on, as a trace for Perfetto's viewer (ui.perfetto.dev)
or chrome://tracing: `timeline.json` in the run folder.

Spans are recorded where the work happens (each rollout on the track of the slot it ran in, each
group's judging, every call on the trainer's thread with the micro-batches of a step nested in it,
the checkpoint's save and the server's swap) into one recorder per process, and a step's commit appends what was recorded since the last
one to the run's file. The file is the Trace Event Format's JSON array form, one event per line and
never closed, which both viewers read as it is: a step only appends, so a crash loses at most the
spans of the step it interrupted, and a torn last line is cut off before the next append.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import os
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TIMELINE_FILE = "timeline.json"
PROCESS_ID = 1
"""Every span is on one process row; its tracks are the rows under it."""


@dataclass(frozen=True)
class Span:
    """One phase of work on one track, in wall-clock seconds (`time.time()`)."""

    name: str
    track: str
    start_s: float
    end_s: float
    args: dict[str, float | str] = field(default_factory=dict)


class Recorder:
    """The spans recorded in this process since they were last taken, the newest `max_spans` of them (a
    trainer used without a run, as in a benchmark, never has them taken); thread-safe (the trainer's
    thread records beside the caller's loop)."""

    def __init__(self, max_spans: int = 100_000) -> None:
        self._spans: deque[Span] = deque(maxlen=max_spans)
        self._lock = threading.Lock()

    def add(self, span: Span) -> None:
        with self._lock:
            self._spans.append(span)

    def take(self) -> list[Span]:
        """The spans recorded so far, which are then forgotten here."""
        with self._lock:
            spans = list(self._spans)
            self._spans.clear()
        return spans


recorder = Recorder()


class BusyClock:
    """The work open on a track, counted as each piece starts and ends, and the wall seconds during which any
    was open: the busy time the track's spans show on the timeline, known live (an open stretch included).
    With `stretch`, each busy stretch also goes on the timeline as one span of that name, with the number
    of pieces it held as `count_name`."""

    def __init__(self, track: str, stretch: str | None = None, count_name: str = "requests") -> None:
        self.track, self.stretch, self.count_name = track, stretch, count_name
        self.open = 0
        self._busy_s = 0.0
        self._since: float | None = None
        self._pieces = 0
        self._lock = threading.Lock()

    def started(self) -> None:
        with self._lock:
            if self.open == 0:
                self._since, self._pieces = time.time(), 0
            self.open += 1
            self._pieces += 1

    def finished(self) -> None:
        with self._lock:
            self.open -= 1
            if self.open == 0 and self._since is not None:
                now = time.time()
                self._busy_s += now - self._since
                if self.stretch is not None:
                    recorder.add(Span(self.stretch, self.track, self._since, now, {self.count_name: self._pieces}))
                self._since = None

    def busy_s(self) -> float:
        """Seconds busy since this clock was made, up to now."""
        with self._lock:
            return self._busy_s + (time.time() - self._since if self._since is not None else 0.0)


sampling = BusyClock("rollouts")
"""This process's rollouts: busy while any rollout runs, so `train_pipelined`'s `sampler_idle_frac` is the
time with no span on any "rollouts" track."""


@contextlib.contextmanager
def span(name: str, track: str, **args: float | str) -> Iterator[None]:
    """Record the `with` block as a span named `name` on `track` (recorded even if the block raises)."""
    started = time.time()
    try:
        yield
    finally:
        recorder.add(Span(name, track, started, time.time(), dict(args)))


class _Slots:
    """The rollout tracks: a rollout takes the lowest free one, so the spans on a track never overlap
    (the format's rule) and the number of tracks is the most rollouts that ran at once."""

    def __init__(self) -> None:
        self._free: list[int] = []
        self._next = 0
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            if self._free:
                return heapq.heappop(self._free)
            self._next += 1
            return self._next - 1

    def give_back(self, slot: int) -> None:
        with self._lock:
            heapq.heappush(self._free, slot)


_rollout_slots = _Slots()


@contextlib.contextmanager
def rollout_span(where: str) -> Iterator[None]:
    """Record a rollout as a span on the lowest free "rollouts NNN" track."""
    slot = _rollout_slots.take()
    sampling.started()
    try:
        with span("rollout", f"rollouts {slot:03d}", where=where):
            yield
    finally:
        sampling.finished()
        _rollout_slots.give_back(slot)


def track_id(track: str) -> int:
    """A track's row number: the same for the same name in every process and step, so the rows of one
    track line up across appends."""
    return zlib.crc32(track.encode()) % 1_000_000 + 1


def trace_events(spans: list[Span]) -> list[dict[str, object]]:
    """Complete ("X") events in microseconds, preceded by each track's name as metadata."""
    events: list[dict[str, object]] = []
    for track in sorted({s.track for s in spans}):
        events.append(
            {"ph": "M", "name": "thread_name", "pid": PROCESS_ID, "tid": track_id(track), "args": {"name": track}}
        )
    for s in spans:
        start_us = round(s.start_s * 1e6)  # both ends rounded alike, so a span nested in another stays inside it
        events.append(
            {
                "ph": "X",
                "name": s.name,
                "cat": s.track.split(" ", 1)[0],
                "pid": PROCESS_ID,
                "tid": track_id(s.track),
                "ts": start_us,
                "dur": round(s.end_s * 1e6) - start_us,
                "args": s.args,
            }
        )
    return events


def append_timeline(run_dir: Path, spans: list[Span]) -> None:
    """Append `spans` to the run's timeline file (created with the array's opening bracket), after cutting
    off a last line a crash left torn."""
    if not spans:
        return
    path = Path(run_dir) / TIMELINE_FILE
    lines = "".join(json.dumps(event, separators=(",", ":")) + ",\n" for event in trace_events(spans))
    with open(path, "a+b") as file:
        size = file.seek(0, os.SEEK_END)
        if size == 0:
            file.write(b"[\n")
        else:
            file.seek(max(size - 4096, 0))
            tail = file.read()
            if not tail.endswith(b"\n"):  # torn by a crash mid-write: cut back to the last whole line
                file.truncate(size - (len(tail) - tail.rfind(b"\n") - 1))
                file.seek(0, os.SEEK_END)
        file.write(lines.encode())
        file.flush()
        os.fsync(file.fileno())


def read_timeline(path: Path) -> list[dict[str, Any]]:
    """The events of a timeline file (the array closed for a strict JSON reader)."""
    text = Path(path).read_text().rstrip().rstrip(",")
    events: list[dict[str, Any]] = json.loads(text + "]")
    return events


def busy_seconds(events: list[dict[str, Any]]) -> tuple[float, dict[str, float]]:
    """The seconds from a trace's first span to its last, and for each category (a track's first word:
    rollouts, judge, trainer, server, replica) the seconds during which any of its spans was open; the
    sampler is idle where "rollouts" is not busy, the same figure `train_pipelined` takes live."""
    intervals: dict[str, list[tuple[int, int]]] = {}
    for event in events:
        if event["ph"] == "X":
            intervals.setdefault(str(event["cat"]), []).append((event["ts"], event["ts"] + event["dur"]))
    if not intervals:
        return 0.0, {}
    starts = [a for spans in intervals.values() for a, _ in spans]
    ends = [b for spans in intervals.values() for _, b in spans]
    busy: dict[str, float] = {}
    for category, spans in sorted(intervals.items()):
        total_us, reach = 0, None
        for start, end in sorted(spans):
            if reach is not None and start < reach:  # overlaps what is counted: count only what sticks out
                start = reach
            total_us += max(end - start, 0)
            reach = end if reach is None else max(reach, end)
        busy[category] = total_us / 1e6
    return (max(ends) - min(starts)) / 1e6, busy


def plot_timeline(path: Path, out: Path, *, start_s: float = 0.0, seconds: float | None = None) -> Path:
    """Draw a timeline file as a PNG, for a README or a report where a viewer is not at hand: the trainer,
    server and judge tracks as bars, and below them how many rollouts were in flight. `start_s` and
    `seconds` choose the window, in seconds from the first span (default: all of it)."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    events = read_timeline(path)
    names = {e["tid"]: str(e["args"]["name"]) for e in events if e["ph"] == "M"}
    spans = [
        (names[e["tid"]], str(e["name"]), e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in events if e["ph"] == "X"
    ]
    if not spans:
        raise ValueError(f"{path} holds no spans to draw")
    origin = min(s[2] for s in spans) + start_s
    end = max(s[3] for s in spans) if seconds is None else origin + seconds
    spans = [(t, n, a - origin, b - origin) for t, n, a, b in spans if b >= origin and a <= end]
    rows = sorted(
        {t for t, *_ in spans if not t.startswith("rollouts ")},
        key=lambda t: ("trainer", "server").index(t) if t in ("trainer", "server") else 2,
    )
    colours = {"train_step": "tab:orange", "save": "tab:green", "swap": "tab:red", "load": "tab:olive"}
    figure, (bars, flight) = plt.subplots(2, 1, sharex=True, figsize=(10, 4), height_ratios=(1, 2))
    for row, track in enumerate(rows):
        named = sorted({n for t, n, *_ in spans if t == track}, key=lambda n: "micro-batch" in n)  # nested on top
        for name in named:
            colour = colours.get(name, "tab:purple" if "micro-batch" in name else "tab:gray")
            extents = [(a, b - a) for t, n, a, b in spans if t == track and n == name]
            bars.broken_barh(
                extents, (row - 0.4, 0.8), color=colour, label=name if row == 0 or track != "trainer" else None
            )
    bars.set_yticks(range(len(rows)), rows)
    bars.invert_yaxis()
    bars.legend(fontsize="x-small", loc="upper right", ncol=3)
    changes = sorted(
        [(a, 1) for t, _, a, _ in spans if t.startswith("rollouts ")]
        + [(b, -1) for t, _, _, b in spans if t.startswith("rollouts ")]
    )
    times, counts, running = [0.0], [0], 0
    for moment, change in changes:
        running += change
        times.append(max(moment, 0.0))
        counts.append(running)
    flight.step(times, counts, where="post")
    flight.set_ylabel("rollouts in flight")
    flight.set_xlabel("seconds")
    flight.set_xlim(0, end - origin)
    bars.set_title(f"{Path(path).parent.name}: timeline", fontsize=9)
    figure.tight_layout()
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return Path(out)
