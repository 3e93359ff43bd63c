"""What one forward costs on this machine against the positions it computes: the cost curve `--mode auto`
chooses its windows from (clover_cpu.decode.AutoWindow).

On a CPU a forward of T positions costs more than one of a single position (more arithmetic, and through
the MoE more distinct experts to read), by how much depends on the model and the machine. The curve is
measured once per model file and machine (a few forwards over a scratch cache) and kept in a small JSON
file in the user's cache folder ($CLOVER_CACHE_DIR, else $XDG_CACHE_HOME/clover-cpu, else
~/.cache/clover-cpu); a folder that cannot be written only means measuring again next time.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

POSITIONS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # the points measured, up to twice the block
CONTEXT = 64  # committed tokens before the measured forwards (rounded up to whole blocks)
FILE_NAME = "forward-costs.json"


class CostCurve:
    """seconds of one forward: body(T positions through every layer) + head(rows of the output head),
    each linear between its measured points and beyond the last."""

    def __init__(self, body: dict, head: dict):
        self.body = {int(k): float(v) for k, v in sorted(body.items(), key=lambda kv: int(kv[0]))}
        self.head = {int(k): float(v) for k, v in sorted(head.items(), key=lambda kv: int(kv[0]))}
        if not self.body or not self.head:
            raise ValueError("a cost curve needs at least one point of each kind")
        self._points = [(np.array(list(p), np.float64), np.array(list(p.values()))) for p in (self.body, self.head)]

    @staticmethod
    def _at(xs: np.ndarray, ys: np.ndarray, x):
        x = np.asarray(x, np.float64)
        if len(xs) == 1:
            return ys[0] * x / xs[0]
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])  # beyond the last point: the last segment's slope
        return np.where(x > xs[-1], ys[-1] + (x - xs[-1]) * slope, np.interp(x, xs, ys))

    def body_at(self, positions):
        """body seconds at each of `positions` (a number or an array)"""
        return self._at(*self._points[0], positions)

    def head_at(self, rows):
        """head seconds at each of `rows` (0 rows: no head)"""
        return np.where(np.asarray(rows) > 0, self._at(*self._points[1], rows), 0.0)

    def __call__(self, positions: int, rows: int) -> float:
        return float(self.body_at(positions) + self.head_at(rows))

    def as_dict(self) -> dict:
        return {"body": {str(k): v for k, v in self.body.items()}, "head": {str(k): v for k, v in self.head.items()}}


def median_time(f, reps: int) -> float:
    """Median wall time of `reps` calls of f."""
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def measure(model, block: int, progress=None) -> CostCurve:
    """Time forwards of 1 .. 2 x block positions (speculative, nothing committed) over a context of
    CONTEXT tokens in a scratch cache, and the output head on 1 and `block` rows. Small models get the
    median of three runs per point (their forwards take milliseconds and the timer's noise matters)."""
    V = model.config.vocab_size
    ids = (np.arange(4096) * 7919 % V).tolist()  # any tokens: the cost does not depend on which
    cache = model.new_cache()
    ctx = -(-CONTEXT // block) * block
    model.run(cache, ids[:ctx], commit=True, block=block, logits=False)
    points = [T for T in POSITIONS if T <= 2 * block] or [1]

    first = median_time(lambda: model.run(cache, ids[ctx:ctx + 1], commit=False, block=block, logits=False), 1)
    reps = 3 if first < 0.05 else 1
    body = {}
    for i, T in enumerate(points):
        if progress:
            progress(i, len(points))
        body[T] = median_time(lambda: model.run(cache, ids[ctx:ctx + T], commit=False, block=block, logits=False), reps)
    h = model.run(cache, ids[ctx:ctx + block], commit=False, block=block, logits=False)
    model.logits(np.ascontiguousarray(h[:1]))  # the head's first use pages its weights in: not timed
    head = {r: median_time(lambda: model.logits(np.ascontiguousarray(h[:r])), max(2, reps)) for r in sorted({1, block})}
    # a point timed low by noise must not make more positions look cheaper than fewer
    body = dict(zip(body, np.maximum.accumulate(list(body.values())).tolist()))
    head = dict(zip(head, np.maximum.accumulate(list(head.values())).tolist()))
    return CostCurve(body, head)


def cache_dir() -> Path:
    if os.environ.get("CLOVER_CACHE_DIR"):
        return Path(os.environ["CLOVER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "clover-cpu"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "cpu model", "hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def key(model, block: int) -> str:
    """The model file (path, size, modification time), the block, the weights' layouts in memory (the file's
    or repacked: `load(repack=...)` changes what a forward costs), and the machine: CPU, kernel ISA and
    threads, and this package's version."""
    from . import __version__, system_info

    st = os.stat(model.file.path)
    info = system_info()
    layouts = sorted({w.fmt for L in model.layers for w in L.values() if hasattr(w, "fmt")} | {model.output.fmt})
    return "|".join(str(x) for x in (os.path.realpath(model.file.path), st.st_size, st.st_mtime_ns, block,
                                      "+".join(layouts), _cpu_model(), info["isa"], info["threads"], __version__))


def forward_costs(model, block: int) -> CostCurve:
    """The model's cost curve at this block length: from the cache file when it was measured on this
    machine with this file, else measured now (a progress line on stderr once it takes over a second)
    and saved."""
    k = key(model, block)
    path = cache_dir() / FILE_NAME
    try:
        saved = json.loads(path.read_text())
        if not isinstance(saved, dict):
            saved = {}
    except (OSError, ValueError):
        saved = {}
    entry = saved.get(k)
    if isinstance(entry, dict):
        try:
            return CostCurve(entry["body"], entry["head"])
        except (KeyError, TypeError, ValueError, AttributeError):
            pass  # a damaged entry: measure again
    t0 = time.perf_counter()
    shown = []

    def progress(i, n):
        if time.perf_counter() - t0 > 1.0:
            print(f"\rmode auto: measuring this model's forward costs (once per file and machine) {i}/{n}",
                  end="", file=sys.stderr, flush=True)
            shown.append(True)

    curve = measure(model, block, progress)
    if shown:
        print(file=sys.stderr)
    saved[k] = curve.as_dict()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{FILE_NAME}.{os.getpid()}")
        tmp.write_text(json.dumps(saved, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # measured again next time
    return curve
