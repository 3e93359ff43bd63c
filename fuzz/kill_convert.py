"""Interrupt `clover-cpu convert` at random moments, many times, and check what is left.

Each run converts the same small random checkpoint over an existing OUT file and is stopped by SIGINT,
SIGTERM or SIGKILL after a random delay: from start-up to past the end of the write in even runs, from
the moment the temporary file appears in odd runs. Afterwards OUT
must hold either its old bytes or the complete new file (byte-identical to an uninterrupted
conversion), and after a polite stop (SIGINT, SIGTERM) no temporary file may remain. Prints a table and
writes JSON.

    python fuzz/kill_convert.py --runs 200 --json bench/results/kill_convert.json
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100, help="interrupted conversions (default 100)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the delays and signals (default 0)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    from clover_cpu.convert.synthetic import write_random_checkpoint

    rnd = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="clover-kill-"))
    src = write_random_checkpoint(work / "hf", preset="small", model_type="clover", seed=4)
    cmd = [sys.executable, "-m", "clover_cpu", "convert", str(src), "--type", "q4_k_m", "--force", "--quiet",
           "--threads", "1", "-o"]
    times = []
    for _ in range(3):  # the fastest of three: the delays must not overshoot a conversion on a quiet machine
        t0 = time.perf_counter()
        subprocess.run([*cmd, str(work / "ref.gguf")], check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    full = min(times)
    ref = (work / "ref.gguf").read_bytes()
    out = work / "out" / "m.gguf"
    out.parent.mkdir()
    counts = {"old": 0, "complete": 0, "partial": 0, "leftover_tmp": 0, "stopped_mid_write": 0}
    by_signal: dict[str, dict[str, int]] = {}
    for i in range(args.runs):
        out.write_bytes(b"old contents")
        sig = rnd.choice(["SIGINT", "SIGTERM", "SIGKILL"])
        delay = rnd.uniform(0.0, full * 1.1)
        p = subprocess.Popen([*cmd, str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if i % 2:  # every other run: wait for the write to begin, then stop it somewhere inside
            deadline = time.perf_counter() + 60
            while time.perf_counter() < deadline and p.poll() is None and \
                    not [f for f in out.parent.iterdir() if ".partial" in f.name]:
                time.sleep(0.002)
            delay = rnd.uniform(0.0, full * 0.6)
        time.sleep(delay)
        if [f for f in out.parent.iterdir() if ".partial" in f.name]:
            counts["stopped_mid_write"] += 1  # the temporary file existed: the write had begun
        p.send_signal(getattr(signal, sig))
        p.wait(timeout=120)
        data = out.read_bytes()
        state = "old" if data == b"old contents" else "complete" if data == ref else "partial"
        counts[state] += 1
        by_signal.setdefault(sig, {"old": 0, "complete": 0, "partial": 0})[state] += 1
        tmp = [f for f in out.parent.iterdir() if f.name != "m.gguf"]
        if tmp and sig != "SIGKILL":
            counts["leftover_tmp"] += 1
        for f in tmp:  # a SIGKILL may leave its temporary file (never under the final name): clear it
            f.unlink()
        print(f"\r{i + 1}/{args.runs} {counts}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    print(f"one conversion: {full:.2f} s; {args.runs} interrupted at a random moment in [0, {full * 1.1:.2f}] s")
    print(f"{'signal':<8} {'old file':>9} {'complete':>9} {'partial':>8}")
    for sig, c in sorted(by_signal.items()):
        print(f"{sig:<8} {c['old']:>9} {c['complete']:>9} {c['partial']:>8}")
    print(f"stopped while the temporary file was being written: {counts['stopped_mid_write']}")
    print(f"temporary files left after a polite stop: {counts['leftover_tmp']}")
    result = {"runs": args.runs, "conversion_seconds": full, "counts": counts, "by_signal": by_signal}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 1 if counts["partial"] or counts["leftover_tmp"] else 0


if __name__ == "__main__":
    sys.exit(main())
