"""`clover-cpu info`: what a GGUF file holds (MODEL.gguf), or what this machine runs (--system)."""

from __future__ import annotations

import argparse
import json

import numpy as np
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
    info["repack"] = [f for f in kernels.R16_FORMATS if kernels.has_native_r16(f)]
    info["os"] = platform.platform()
    info["cpu_model"] = cpu_model()
    info["cpus_available"] = clover_cpu.available_cpus()
    info["packages"] = package_versions()
    if args.json:
        print(json.dumps(info))
        return 0
    feats = ", ".join(k for k, v in info["cpu_features"].items() if v) or "none"
    print(f"clover-cpu {info['version']} on {info['machine']}, Python {info['python']}")
    print(f"os:         {info['os']}")
    print(f"cpu model:  {info['cpu_model']} ({info['cpus_available']} CPUs available to this process)")
    print(f"kernels:    {info['isa']} (available: {', '.join(info['available_isas'])}; CLOVER_ISA forces one)")
    print(f"threads:    {info['threads']} (default {info['default_threads']}: one per physical core)")
    print(f"cpu:        {feats}")
    print(f"native:     {'yes (-march=native build)' if info['native_build'] else 'no (portable build)'}")
    repack = (f"{', '.join(info['repack'])} layer weights repacked at load where the file takes at most half the "
              "free memory" if info["repack"] else "none: these kernels multiply the file layout")
    print(f"repack:     {repack} (run --repack)")
    print("packages:   " + ", ".join(f"{k} {v}" for k, v in info["packages"].items()))
    return 0


def cpu_model() -> str:
    """The CPU's name as the system reports it (Linux: /proc/cpuinfo; else platform.processor())."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def package_versions() -> dict:
    """Versions of the libraries clover-cpu runs on (what a bug report needs)."""
    from importlib import metadata

    out = {}
    for name in ("numpy", "gguf", "tokenizers", "sentencepiece", "jinja2", "fastapi", "uvicorn"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


SHAPE_KEYS = ("context_length", "embedding_length", "block_count", "attention.head_count",
              "attention.head_count_kv", "attention.key_length", "rope.dimension_count", "rope.freq_base",
              "expert_count", "expert_used_count", "expert_feed_forward_length",
              "expert_shared_feed_forward_length", "ssm.group_count", "ssm.time_step_rank", "ssm.state_size",
              "ssm.conv_kernel", "full_attention_interval")


def describe(path) -> dict:
    """What any GGUF file holds (any architecture and tensor type gguf-py knows, vocabulary-only files
    too), and whether clover-cpu can run it."""
    from clover_cpu.config import why_not_runnable
    from clover_cpu.gguf_file import GGUFFile

    with GGUFFile(path) as g:
        kv = g.kv
        arch = kv.get("general.architecture")
        types: dict[str, dict] = {}
        params = nbytes = 0
        for ti in g.tensors.values():
            t = types.setdefault(ti.ggml_type, {"tensors": 0, "params": 0, "bytes": 0, "runs": ti.supported})
            t["tensors"] += 1
            t["params"] += ti.n_elements
            t["bytes"] += ti.nbytes
            params += ti.n_elements
            nbytes += ti.nbytes
        shape = {}
        if isinstance(arch, str):
            prefix = f"{arch}."
            shape = {k[len(prefix):]: _plain(v) for k, v in kv.items()
                     if k.startswith(prefix) and (not hasattr(v, "__len__") or isinstance(v, str))}
        tokens = kv.get("tokenizer.ggml.tokens")
        template = kv.get("tokenizer.chat_template")
        tok = {
            "model": kv.get("tokenizer.ggml.model"),
            "pre": kv.get("tokenizer.ggml.pre"),
            "vocab": len(tokens) if tokens is not None and not isinstance(tokens, str) else None,
            "merges": len(kv["tokenizer.ggml.merges"]) if "tokenizer.ggml.merges" in kv else None,
            "bos": _plain(kv.get("tokenizer.ggml.bos_token_id")),
            "eos": _plain(kv.get("tokenizer.ggml.eos_token_id")),
            "mask": _plain(kv.get("tokenizer.ggml.mask_token_id")),
            "chat_template": "tokenizer.chat_template" in kv,
            "supported": _tokenizer_support(kv),
        }
        diffusion = {k: _plain(v) for k, v in kv.items() if "diffusion" in k}
        nextn = _plain(kv.get(f"{arch}.nextn_predict_layers")) if isinstance(arch, str) else None
        mtp = None
        if isinstance(nextn, int) and nextn > 0 and isinstance(kv.get(f"{arch}.block_count"), (int, np.integer)):
            n_block = int(kv[f"{arch}.block_count"])
            mtp = {"layers": nextn, "blocks": list(range(n_block - nextn, n_block)),
                   "tensors": sum(1 for n in g.tensors if any(n.startswith(f"blk.{b}.") for b in
                                                                range(n_block - nextn, n_block)))}
        return {
            "path": str(path), "architecture": arch, "name": kv.get("general.name"), "gguf_version": g.version,
            "file_size": g.file_size, "tensors": len(g.tensors), "params": params,
            "bits_per_weight": 8 * nbytes / max(1, params), "types": types, "shape": shape,
            "tokenizer": tok, "chat_template": _template_summary(template, kv) if template is not None else None,
            "diffusion": diffusion, "mtp": mtp, "parts": [str(p) for p in g.paths],
            "runnable": why_not_runnable(g) is None, "why_not": why_not_runnable(g),
        }


def _tokenizer_support(kv) -> str | None:
    """None when clover-cpu tokenizes this vocabulary, else why not (without building it: that takes a
    second for a large vocabulary)."""
    from clover_cpu.tokenizer import PRE_TYPES, SPM_MODEL_KEY

    model = kv.get("tokenizer.ggml.model")
    if model is None:
        return "no tokenizer"
    if model == "gpt2":
        pre = kv.get("tokenizer.ggml.pre") or "default"
        return None if pre in PRE_TYPES else f"pre-tokenizer {pre!r} is not supported"
    if model == "llama":
        return None if SPM_MODEL_KEY in kv else "SentencePiece without the embedded model (files from clover-cpu convert have it)"
    return f"tokenizer model {model!r} is not supported"


def _template_summary(template, kv) -> dict:
    """The chat template's size, and whether it renders a one-turn conversation in the sandbox."""
    from clover_cpu.chat import ChatTemplate, ChatTemplateError

    if not isinstance(template, str):
        return {"chars": None, "renders": False, "error": "tokenizer.chat_template is not a string"}
    try:
        ChatTemplate(template, time_limit=2.0).render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
        return {"chars": len(template), "renders": True, "error": None}
    except ChatTemplateError as e:
        return {"chars": len(template), "renders": False, "error": str(e)}


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
    if len(d["parts"]) > 1:
        print(f"parts:         {len(d['parts'])} ({', '.join(p.rsplit('/', 1)[-1] for p in d['parts'][1:])} beside it)")
    print(f"architecture:  {d['architecture']}" + (f" ({d['name']})" if d["name"] else ""))
    if d["tensors"]:
        print(f"parameters:    {d['params'] / 1e9:.3f}B in {d['tensors']} tensors, {d['bits_per_weight']:.2f} bits per weight")
        for t, s in sorted(d["types"].items(), key=lambda kv: -kv[1]["bytes"]):
            runs = "" if s["runs"] else "  (clover-cpu cannot run this type)"
            print(f"  {t:<8} {s['tensors']:>5} tensors {s['params'] / 1e6:>10.1f}M params {s['bytes'] / 1e6:>10.1f} MB{runs}")
    else:
        print("parameters:    none: a vocabulary-only file")
    if d["shape"]:
        print("shape:         " + ", ".join(f"{k}={v}" for k, v in d["shape"].items()))
    tok = d["tokenizer"]
    if tok["model"] is None:
        print("tokenizer:     none")
    else:
        print(f"tokenizer:     {tok['model']}" + (f"/{tok['pre']}" if tok["pre"] else "") +
              f", {tok['vocab']} tokens" + (f", {tok['merges']} merges" if tok["merges"] is not None else "") +
              f", bos={tok['bos']} eos={tok['eos']}" + (f" mask={tok['mask']}" if tok["mask"] is not None else "") +
              ("" if tok["supported"] is None else f" (clover-cpu cannot tokenize it: {tok['supported']})"))
    ct = d["chat_template"]
    if ct is None:
        print("chat template: none")
    else:
        print(f"chat template: {ct['chars']} characters, " +
              ("renders in the sandbox" if ct["renders"] else f"does not render: {ct['error']}"))
    if d["mtp"]:
        blocks = ", ".join(f"blk.{b}" for b in d["mtp"]["blocks"])
        print(f"mtp head:      {d['mtp']['layers']} multi-token-prediction layer ({blocks}, {d['mtp']['tensors']} "
              "tensors): kept in the file; decoding runs the main layers only")
    if d["diffusion"]:
        print("diffusion:     " + ", ".join(f"{k}={v}" for k, v in d["diffusion"].items()))
    elif d["runnable"]:
        print("diffusion:     none (autoregressive model)")
    print("clover-cpu:    " + ("runs this file" if d["runnable"] else f"cannot run it: {d['why_not']}"))
    if "nonfinite_tensors" in d:
        bad = d["nonfinite_tensors"]
        if bad:
            more = f" and {len(bad) - 8} more" if len(bad) > 8 else ""
            print(f"weights:       CORRUPT: NaN or Inf in {len(bad)} tensors: {', '.join(bad[:8])}{more}")
            return 1
        print("weights:       verified: every tensor finite")
    return 0
