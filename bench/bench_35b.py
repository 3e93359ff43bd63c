#!/usr/bin/env python3
"""The full Clover-35B-A3B shape (256 experts, 40 layers, vocab 248320), by hand: convert, load, decode.

A bf16 checkpoint of this shape is 70 GB, more than this machine's free disk. So the converter reads a
virtual checkpoint instead: the same tensor names, shapes and dtype (BF16) as
`python -m clover_cpu.convert.synthetic --preset clover-35b`, whose rows are produced on demand from a
pool of random normals when the converter asks for them (its real config.json and tokenizer are on
disk). Everything after the reading is the real `clover-cpu convert` path: the planner, llama.cpp's
transforms, the q4_k_m recipe, multi-threaded quantization, the atomic streaming write. Then, in a
fresh process, the file is loaded by mmap and decodes autoregressively (qwen35moe).

    python bench/bench_35b.py --workdir /data/c35 [--keep]
    python bench/bench_35b.py --type q3_k_m --mem-limit 16 --llama-bin DIR --keep   # a 16 GB machine
    python bench/bench_35b.py --generate-only      # the generator itself at this shape, streamed to /dev/null

--mem-limit GB runs the decoding (and llama.cpp's llama-bench, given --llama-bin) in a memory cgroup with
that limit, page cache included, after dropping the file from the page cache (root, cgroup v1 or v2).

Prints a table and writes bench/results/clover35b.json. Needs ~20 GB of free disk for the GGUF.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


class VirtualTensor:
    """A checkpoint tensor (the converter's LazyTensor interface) whose bf16 rows are made on demand."""

    POOL = np.random.default_rng(0).standard_normal(1 << 23).astype(np.float32) * 0.02

    def __init__(self, name: str, shape: tuple[int, ...], init: str, seed: int):
        self.name, self.shape, self.init, self.dtype = name, tuple(shape), init, "BF16"
        self.rng = np.random.default_rng(seed)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return 2 * self.numel

    def _values(self, count: int) -> np.ndarray:
        if self.init == "normal":
            out = np.empty(count, np.float32)
            n = len(self.POOL) // 2
            for i in range(0, count, n):
                k = min(n, count - i)
                o = int(self.rng.integers(0, n))
                out[i : i + k] = self.POOL[o : o + k]
            return out
        from clover_cpu.convert.synthetic import _values

        return _values(self.init, self.shape, self.rng, None, 0.02, 0, count)

    def take_raw_rows(self, row_len: int, index) -> np.ndarray:
        x = self._values(len(index) * row_len).reshape(len(index), row_len)
        return (x.view(np.uint32) >> 16).astype(np.uint16)  # bf16 bits

    def take_rows(self, row_len: int, index) -> np.ndarray:
        return (self.take_raw_rows(row_len, index).astype(np.uint32) << 16).view(np.float32)

    def rows(self, row_len: int, start: int, stop: int) -> np.ndarray:
        return self.take_rows(row_len, np.arange(start, stop))

    def full(self) -> np.ndarray:
        n = self.shape[-1]
        return self.rows(n, 0, self.numel // n).reshape(self.shape)


def convert_virtual(ckpt: Path, out: Path, preset: str, out_type: str = "q4_k_m") -> dict:
    from clover_cpu.convert import hf
    from clover_cpu.convert.synthetic import make_config, tensor_specs, train_spm

    cfg = make_config(preset, "qwen3_5_moe")
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "config.json").write_text(json.dumps(cfg, indent=2))
    (ckpt / "tokenizer.model").write_bytes(train_spm(1024))
    specs = tensor_specs(cfg)
    virtual = {name: VirtualTensor(name, shape, init, i) for i, (name, shape, init) in enumerate(specs)}
    n_params = sum(t.numel for t in virtual.values())
    hf.open_checkpoint = lambda src: virtual  # the only change to the converter: where rows come from
    t = time.perf_counter()
    summary = hf.convert(ckpt, out, out_type=out_type, force=True, progress=sys.stderr.isatty(),
                         log=lambda s: print(s, file=sys.stderr))
    dt = time.perf_counter() - t
    return {"params": n_params, "bf16_bytes": 2 * n_params, "seconds": dt, "file_bytes": out.stat().st_size,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, "summary": summary}


def generate_to_null(workdir: Path, preset: str) -> dict:
    """Run the synthetic checkpoint generator at this shape with its safetensors file pointing at
    /dev/null (its temporary name is a symlink there): every tensor is produced and written, nothing
    kept. Shows the generator streams the 35B shape in bounded memory where the disk cannot hold it."""
    from clover_cpu.convert.synthetic import make_config, tensor_specs, write_random_checkpoint

    d = workdir / "generated"
    d.mkdir(parents=True, exist_ok=True)
    for name in ("model.safetensors", "model.safetensors.partial"):
        (d / name).unlink(missing_ok=True)
    (d / "model.safetensors.partial").symlink_to(os.devnull)
    params = sum(int(np.prod(s)) for _, s, _ in tensor_specs(make_config(preset, "qwen3_5_moe")))
    t = time.perf_counter()
    write_random_checkpoint(d, preset=preset, model_type="qwen3_5_moe")
    dt = time.perf_counter() - t
    return {"preset": preset, "params": params, "bytes_written": 2 * params, "seconds": dt,
            "mb_per_s": 2 * params / dt / 1e6, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}


def decode(path: str, prompt: int, new: int) -> dict:
    import clover_cpu

    def rss_gb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 1e9

    t = time.perf_counter()
    m = clover_cpu.load(path, ctx_len=4096)
    load_s = time.perf_counter() - t
    rss_load = rss_gb()
    ids = list(np.random.default_rng(1).integers(5, 1000, prompt))
    cache = m.new_cache()
    t = time.perf_counter()
    logits = m.run(cache, ids, commit=True)
    prefill_s = time.perf_counter() - t
    tok = int(logits[-1].argmax())
    times = []
    for _ in range(new):
        t = time.perf_counter()
        tok = int(m.run(cache, [tok], commit=True)[-1].argmax())
        times.append(time.perf_counter() - t)
    steady = sorted(times[len(times) // 2 :])  # the second half: weights of the hot experts are paged in
    return {"load_seconds": load_s, "rss_after_load_gb": rss_load, "prefill_tokens": prompt,
            "prefill_seconds": prefill_s, "new_tokens": new, "tg_tokens_per_second": new / sum(times),
            "tg_second_half_tokens_per_second": len(steady) / sum(steady), "rss_after_decode_gb": rss_gb(),
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
            "isa": clover_cpu.system_info()["isa"], "threads": clover_cpu.system_info()["threads"]}


class MemoryCgroup:
    """A memory cgroup with a limit (v2 memory.max, else v1 memory.limit_in_bytes) that child processes
    join before they exec; its peak usage afterwards. Needs root."""

    def __init__(self, name: str, limit_bytes: int):
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        if v2.exists() and "memory" in v2.read_text().split():
            self.dir = Path("/sys/fs/cgroup") / name
            self.dir.mkdir(exist_ok=True)
            (self.dir / "memory.max").write_text(str(limit_bytes))
            if (self.dir / "memory.swap.max").exists():
                (self.dir / "memory.swap.max").write_text("0")
            self.peak_file = self.dir / "memory.peak"
        else:
            self.dir = Path("/sys/fs/cgroup/memory") / name
            self.dir.mkdir(exist_ok=True)
            (self.dir / "memory.limit_in_bytes").write_text(str(limit_bytes))
            self.peak_file = self.dir / "memory.max_usage_in_bytes"
        self.limit = limit_bytes
        self.reset_peak()

    def reset_peak(self) -> None:
        try:
            self.peak_file.write_text("0")  # (v1 resets its peak so; v2's memory.peak takes no write before 6.12)
        except OSError:
            pass

    def join(self) -> None:  # (preexec_fn: runs in the child)
        (self.dir / "cgroup.procs").write_text(str(os.getpid()))

    def peak_gb(self) -> float | None:
        try:
            return int(self.peak_file.read_text()) / 1e9
        except (OSError, ValueError):
            return None


def drop_from_page_cache(path: Path) -> None:
    """The file's clean pages out of the page cache, so that a limited run reads (and is charged for) them."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def llama_tg(llama_bin: Path, model: Path, threads: int, new: int, cg: MemoryCgroup | None) -> dict:
    t = time.perf_counter()
    r = subprocess.run([str(llama_bin / "llama-bench"), "-m", str(model), "-p", "0", "-n", str(new), "-t", str(threads),
                        "-r", "1", "-o", "json"], capture_output=True, text=True, timeout=3600,
                       preexec_fn=cg.join if cg else None)
    if r.returncode:
        return {"error": (r.stderr or r.stdout)[-500:], "exit": r.returncode, "seconds": time.perf_counter() - t}
    row = json.loads(r.stdout)[0]
    return {"tg_tokens_per_second": row["avg_ts"], "seconds": time.perf_counter() - t}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/clover-35b"))
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--keep", action="store_true", help="keep the GGUF (about 20 GB)")
    ap.add_argument("--type", default="q4_k_m", help="the converter's --type (q4_k_m, q3_k_m, q2_k, iq4_xs, ...)")
    ap.add_argument("--mem-limit", type=float, help="decode in a memory cgroup of this many GB (page cache included)")
    ap.add_argument("--llama-bin", type=Path, help="also run llama.cpp's llama-bench (tg) on the file, same limit")
    ap.add_argument("--preset", default="clover-35b", help="a smaller shape for a quick check (small, bench)")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "clover35b.json")
    ap.add_argument("--generate-only", action="store_true",
                    help="only run the checkpoint generator at this shape, writing to /dev/null")
    ap.add_argument("--decode-only", help=argparse.SUPPRESS)  # worker: decode this file, JSON on stdout
    a = ap.parse_args()
    if a.generate_only:
        g = generate_to_null(a.workdir, a.preset)
        print(f"generate: {g['params'] / 1e9:.2f}B parameters, {g['bytes_written'] / 1e9:.1f} GB of bf16 written "
              f"(to /dev/null) in {g['seconds'] / 60:.1f} min ({g['mb_per_s']:.0f} MB/s), peak RSS {g['peak_rss_gb']:.2f} GB")
        out = a.json.with_name(a.json.stem + "-generate.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(g, indent=1))
        return 0
    if a.decode_only:
        print(json.dumps(decode(a.decode_only, a.prompt, a.new)))
        return 0
    out = a.workdir / f"{a.preset}-{a.type}.gguf"
    if a.keep and out.exists():
        conv = {"reused": str(out), "file_bytes": out.stat().st_size}
        print(f"convert: reusing {out} ({out.stat().st_size / 1e9:.2f} GB)")
    else:
        conv = convert_virtual(a.workdir / "ckpt", out, a.preset, a.type)
        print(f"convert: {conv['params'] / 1e9:.2f}B parameters ({conv['bf16_bytes'] / 1e9:.1f} GB as bf16) -> "
              f"{conv['file_bytes'] / 1e9:.2f} GB {a.type} in {conv['seconds'] / 60:.1f} min, peak RSS "
              f"{conv['peak_rss_gb']:.2f} GB")
    cg = MemoryCgroup(f"clover-bench-{os.getpid()}", int(a.mem_limit * 1e9)) if a.mem_limit else None
    if cg:
        drop_from_page_cache(out)
    r = subprocess.run([sys.executable, __file__, "--decode-only", str(out), "--prompt", str(a.prompt), "--new",
                        str(a.new)], capture_output=True, text=True, preexec_fn=cg.join if cg else None)
    if r.returncode:
        print(r.stderr[-3000:], file=sys.stderr)
        return 1
    dec = json.loads(r.stdout)
    if cg:
        dec["mem_limit_gb"] = a.mem_limit
        dec["cgroup_peak_gb"] = cg.peak_gb()
    print(f"load {dec['load_seconds']:.2f} s (RSS {dec['rss_after_load_gb']:.2f} GB); prefill {dec['prefill_tokens']} "
          f"tokens {dec['prefill_seconds']:.1f} s; tg {dec['tg_tokens_per_second']:.2f} t/s over {dec['new_tokens']} "
          f"tokens ({dec['tg_second_half_tokens_per_second']:.2f} t/s in the second half); RSS after decoding "
          f"{dec['rss_after_decode_gb']:.2f} GB, peak {dec['peak_rss_gb']:.2f} GB; {dec['isa']} x {dec['threads']}")
    if cg:
        print(f"  under a {a.mem_limit:g} GB memory cgroup (page cache included): peak {dec['cgroup_peak_gb']} GB")
    llama = None
    if a.llama_bin:
        if cg:
            drop_from_page_cache(out)
            cg.reset_peak()
        llama = llama_tg(a.llama_bin, out, dec["threads"], a.new, cg)
        if cg:
            llama["cgroup_peak_gb"] = cg.peak_gb()
        print(f"llama.cpp llama-bench tg{a.new} on the same file{' and limit' if cg else ''}: "
              + (f"{llama['tg_tokens_per_second']:.2f} t/s" if "error" not in llama else f"failed: {llama['error']}"))
    a.json.parent.mkdir(parents=True, exist_ok=True)
    conv.pop("summary", None)
    a.json.write_text(json.dumps({"type": a.type, "convert": conv, "decode": dec, "llama_cpp": llama}, indent=1))
    if not a.keep:
        out.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
