"""`clover-cpu info`: what a GGUF file holds (MODEL.gguf), or what this machine runs (--system)."""

from __future__ import annotations

import argparse
import json
import platform


def add_parser(sub) -> None:
    p = sub.add_parser(
        "info",
        help="describe a GGUF model file, or this machine (--system)",
        description="Describe a GGUF model file (architecture, shape, tensor types and bits per weight, "
        "tokenizer, diffusion settings, size), or with --system the kernel path (ISA), threads and CPU "
        "features clover-cpu uses on this machine.",
        epilog="examples: clover-cpu info model.gguf | clover-cpu info --system",
    )
    p.add_argument("model", nargs="?", metavar="MODEL.gguf", help="the file to describe")
    p.add_argument("--system", action="store_true", help="describe this machine and the kernels chosen for it")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--verify", action="store_true",
                   help="also read every weight and report tensors holding NaN or Inf (exit 1 if any); "
                   "reads the whole file")


def main(args: argparse.Namespace) -> int:
    if args.system:
        return system(args)
    if not args.model:
        raise ValueError("nothing to show: give MODEL.gguf or --system")
    return model(args)


def system(args) -> int:
    import clover_cpu
    from clover_cpu import kernels

    info = clover_cpu.system_info()
    info["machine"] = platform.machine()
    info["python"] = platform.python_version()
    info["version"] = clover_cpu.__version__
    info["q4_k_repack"] = kernels.has_native_q4_k_r16()
    if args.json:
        print(json.dumps(info))
        return 0
    feats = ", ".join(k for k, v in info["cpu_features"].items() if v) or "none"
    print(f"clover-cpu {info['version']} on {info['machine']}, Python {info['python']}")
    print(f"kernels:    {info['isa']} (available: {', '.join(info['available_isas'])}; CLOVER_ISA forces one)")
    print(f"threads:    {info['threads']} (default {info['default_threads']}: one per physical core)")
    print(f"cpu:        {feats}")
    print(f"native:     {'yes (-march=native build)' if info['native_build'] else 'no (portable build)'}")
    repack = ("q4_k layer weights repacked at load where the file takes at most half the free memory"
              if info["q4_k_repack"] else "none: these kernels multiply the file layout")
    print(f"repack:     {repack} (run --repack)")
    return 0


SHAPE_KEYS = ("context_length", "embedding_length", "block_count", "attention.head_count",
              "attention.head_count_kv", "attention.key_length", "rope.dimension_count", "rope.freq_base",
              "expert_count", "expert_used_count", "expert_feed_forward_length",
              "expert_shared_feed_forward_length", "ssm.group_count", "ssm.time_step_rank", "ssm.state_size",
              "ssm.conv_kernel", "full_attention_interval")


def describe(path) -> dict:
    from clover_cpu.gguf_file import GGUFFile

    with GGUFFile(path) as g:
        arch = g.arch
        types: dict[str, dict] = {}
        params = nbytes = 0
        for ti in g.tensors.values():
            t = types.setdefault(ti.type_name, {"tensors": 0, "params": 0, "bytes": 0})
            t["tensors"] += 1
            t["params"] += ti.n_elements
            t["bytes"] += ti.nbytes
            params += ti.n_elements
            nbytes += ti.nbytes
        kv = g.kv
        shape = {k: _plain(kv[f"{arch}.{k}"]) for k in SHAPE_KEYS if f"{arch}.{k}" in kv}
        tokens = kv.get("tokenizer.ggml.tokens")
        tok = {
            "model": kv.get("tokenizer.ggml.model"),
            "pre": kv.get("tokenizer.ggml.pre"),
            "vocab": len(tokens) if tokens is not None and not isinstance(tokens, str) else None,
            "bos": _plain(kv.get("tokenizer.ggml.bos_token_id")),
            "eos": _plain(kv.get("tokenizer.ggml.eos_token_id")),
            "mask": _plain(kv.get("tokenizer.ggml.mask_token_id")),
            "chat_template": "tokenizer.chat_template" in kv,
        }
        diffusion = {k: _plain(v) for k, v in kv.items() if "diffusion" in k}
        return {
            "path": str(path), "architecture": arch, "name": kv.get("general.name"), "gguf_version": g.version,
            "file_size": g.file_size, "tensors": len(g.tensors), "params": params,
            "bits_per_weight": 8 * nbytes / max(1, params), "types": types, "shape": shape,
            "tokenizer": tok, "diffusion": diffusion,
        }


def _plain(v):
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, float):
        return float(f"{v:.6g}")  # f32 metadata: 0.95 rather than 0.949999988
    return v


def verify(path, show_progress: bool) -> list[str]:
    import sys

    from clover_cpu.gguf_file import GGUFFile

    def progress(done, total):
        if show_progress:
            print(f"\rverifying weights: {100 * done / max(1, total):5.1f}%", end="", file=sys.stderr, flush=True)

    with GGUFFile(path) as g:
        bad = g.verify(progress)
    if show_progress:
        print(file=sys.stderr)
    return bad


def model(args) -> int:
    d = describe(args.model)
    if args.verify:
        import sys

        d["nonfinite_tensors"] = verify(args.model, not args.json and sys.stderr.isatty())
    if args.json:
        print(json.dumps(d))
        return 1 if d.get("nonfinite_tensors") else 0
    print(f"file:          {d['path']} ({d['file_size'] / 1e9:.2f} GB, GGUF v{d['gguf_version']})")
    print(f"architecture:  {d['architecture']}" + (f" ({d['name']})" if d["name"] else ""))
    print(f"parameters:    {d['params'] / 1e9:.3f}B in {d['tensors']} tensors, {d['bits_per_weight']:.2f} bits per weight")
    for t, s in sorted(d["types"].items(), key=lambda kv: -kv[1]["bytes"]):
        print(f"  {t:<6} {s['tensors']:>5} tensors {s['params'] / 1e6:>10.1f}M params {s['bytes'] / 1e6:>10.1f} MB")
    print("shape:         " + ", ".join(f"{k}={v}" for k, v in d["shape"].items()))
    tok = d["tokenizer"]
    print(f"tokenizer:     {tok['model']}" + (f"/{tok['pre']}" if tok["pre"] else "") +
          f", {tok['vocab']} tokens, bos={tok['bos']} eos={tok['eos']}" +
          (f" mask={tok['mask']}" if tok["mask"] is not None else "") +
          (", chat template" if tok["chat_template"] else ", no chat template"))
    if d["diffusion"]:
        print("diffusion:     " + ", ".join(f"{k}={v}" for k, v in d["diffusion"].items()))
    else:
        print("diffusion:     none (autoregressive model)")
    if "nonfinite_tensors" in d:
        bad = d["nonfinite_tensors"]
        if bad:
            more = f" and {len(bad) - 8} more" if len(bad) > 8 else ""
            print(f"weights:       CORRUPT: NaN or Inf in {len(bad)} tensors: {', '.join(bad[:8])}{more}")
            return 1
        print("weights:       verified: every tensor finite")
    return 0
