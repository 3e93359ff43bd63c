"""The low-bit types on files llama.cpp's own tools make, held against transformers and llama.cpp.

The shipped Clover's trained weights, as an F32 qwen35moe file (or, with --model random, a random
transformers Qwen3.5-MoE through llama.cpp b11434's converter), get an importance matrix from
`llama-imatrix` on real text, and `llama-quantize` writes each type people download (Q2_K, Q3_K_M, IQ4_XS,
IQ4_NL, IQ3_S, IQ3_XXS, IQ2_M, IQ2_S, IQ2_XS, IQ2_XXS, IQ1_M, IQ1_S, MXFP4_MOE, Q4_1, Q5_0, Q5_1; Q4_K_M for
reference). On each
file, the logits of a 96-token sequence from clover-cpu and from llama.cpp (bench/native/llama_logits.cpp
on libllama) are compared with the unquantized network's (the F32 file; transformers for the random
model): relative RMS and max error, argmax agreement. PASS for a type: clover-cpu's RMS error at most 1.1x
llama.cpp's + 1e-3.

    python bench/check_lowbit_parity.py --llama-bin DIR [--work DIR] [--json out.json] [--types Q2_K,IQ4_XS]

DIR holds llama-quantize, llama-imatrix and llama_logits (bench/setup_peers.sh builds them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
import qwen_fixtures  # noqa: E402
import realfiles  # noqa: E402

# llama-quantize's file types; its IQ2_S writes IQ2_XS for the bulk of the weights, and IQ2_M is the one whose
# bulk is IQ2_S (the table's "file types" column says which ggml types each file holds)
TYPES = ["Q4_K_M", "Q2_K", "Q3_K_M", "IQ4_XS", "IQ4_NL", "IQ3_S", "IQ3_XXS", "IQ2_M", "IQ2_S", "IQ2_XS", "IQ2_XXS",
         "IQ1_M", "IQ1_S", "MXFP4_MOE", "Q4_1", "Q5_0", "Q5_1"]


def build_checkpoint(dst: Path, seed: int = 0):
    import torch
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    cfg = Qwen3_5MoeTextConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
        shared_expert_intermediate_size=256, vocab_size=qwen_fixtures.VOCAB_SIZE, rms_norm_eps=1e-6,
        max_position_embeddings=4096, full_attention_interval=4, tie_word_embeddings=False, eos_token_id=151645,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})
    torch.manual_seed(seed)
    model = Qwen3_5MoeForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():  # non-trivial norms, as tests/test_model.py
            if n.endswith("norm.weight") and "linear_attn" not in n:
                p.normal_(0, 0.2)
    model.save_pretrained(dst, safe_serialization=True)
    (dst / "tokenizer.json").write_text(json.dumps(qwen_fixtures.tokenizer_json(), ensure_ascii=False))
    (dst / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}))
    return model


def shipped_as_qwen35moe(dst: Path) -> Path:
    """The shipped Clover (trained weights: well-conditioned, unlike a random model, where a 4-bit rounding of
    the embedding already moves the logits by 20%) relabelled as a qwen35moe file with F32 weights, which both
    engines run as the same causal network. Its F32 logits are the reference."""
    import gguf

    import clover_cpu
    from clover_cpu import kernels
    from clover_cpu.gguf_file import GGUFFile

    r = gguf.GGUFReader(str(clover_cpu.shipped_model()))
    w = gguf.GGUFWriter(str(dst), "qwen35moe")
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment", "general.file_type"):
            continue
        if "diffusion" in name or name == "tokenizer.ggml.mask_token_id":
            continue
        key = "qwen35moe." + name[len("clover."):] if name.startswith("clover.") else name
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), vtype, sub_type=sub)
    if "tokenizer.ggml.add_space_prefix" not in r.fields:  # (the shipped file predates the converter writing it)
        from clover_cpu.convert.tokenizer import _spm_add_dummy_prefix

        w.add_add_space_prefix(_spm_add_dummy_prefix(bytes(r.fields["tokenizer.clover.spm_model"].contents())))
    with GGUFFile(clover_cpu.shipped_model()) as g:
        for name, ti in g.tensors.items():
            x = kernels.dequantize(np.ascontiguousarray(g.data(name)), ti.type_name).reshape(ti.shape)
            w.add_tensor(name, np.ascontiguousarray(x, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if r.returncode:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed:\n{(r.stderr or r.stdout)[-3000:]}")
    return r


def rel_err(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def rms_err(a, b) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b**2)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bin", type=Path, required=True, help="folder with llama-quantize, llama-imatrix, llama_logits")
    ap.add_argument("--work", type=Path, default=Path("/tmp/clover-lowbit-parity"),
                    help="where the files are made and kept for the next run, in a folder per --model")
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", choices=["shipped", "random"], default="shipped",
                    help="shipped: the shipped Clover's trained weights as a qwen35moe F32 file (default); random: a "
                    "random transformers Qwen3.5-MoE (every width a multiple of 256; chaotic under rounding)")
    a = ap.parse_args(argv)
    import torch

    import clover_cpu
    from clover_cpu.gguf_file import GGUFFile

    a.work = a.work / a.model  # (each model's files apart: a file kept from the other would be reused)
    a.work.mkdir(parents=True, exist_ok=True)
    text = a.work / "calib.txt"
    text.write_text("\n".join(p.read_text(encoding="utf-8") for p in sorted(realfiles.llama_cpp().glob(
        "gguf-py/gguf/*.py"))))
    if a.model == "random":
        src = a.work / "hf"
        model = build_checkpoint(src)
        base = a.work / "f16.gguf"
        if not base.exists():
            qwen_fixtures.llama_cpp_convert(src, base, "--no-mtp", outtype="f16")
        ids = np.random.default_rng(5).integers(0, 151000, 32)
        with torch.no_grad():
            want = model(torch.tensor(ids)[None]).logits[0].float().numpy()
    else:
        base = a.work / "shipped-f32.gguf"
        if not base.exists():
            shipped_as_qwen35moe(base)
        tok = clover_cpu.load_tokenizer(clover_cpu.shipped_model())
        code = (realfiles.llama_cpp() / "gguf-py" / "gguf" / "gguf_writer.py").read_text()
        ids = np.array(tok.encode(code)[:96])
        want = clover_cpu.load(base).forward(ids)
    imatrix = a.work / "imatrix.gguf"
    if not imatrix.exists():
        run([a.llama_bin / "llama-imatrix", "-m", base, "-f", text, "-o", imatrix, "-c", "128", "--chunks", "24",
             "-t", a.threads], timeout=3600)
    rows = []
    print(f"{'type':10s} {'file types':44s} {'clover rms':>10s} {'llama rms':>10s} {'clover max':>10s} "
          f"{'llama max':>10s} {'clover argmax':>13s} {'llama argmax':>12s} {'clover vs llama':>15s}  verdict")
    for t in a.types.split(","):
        out = a.work / f"{t.lower()}.gguf"
        if not out.exists():
            run([a.llama_bin / "llama-quantize", "--imatrix", imatrix, base, out, t, str(a.threads)], timeout=3600)
        with GGUFFile(out) as g:
            kinds = {}
            for ti in g.tensors.values():
                if len(ti.ne) > 1:
                    kinds[ti.ggml_type] = kinds.get(ti.ggml_type, 0) + 1
        ours = clover_cpu.load(out).forward(ids)
        lf = a.work / f"{t.lower()}.logits"
        run([a.llama_bin / "llama_logits", out, lf, a.threads, *ids.tolist()], timeout=600)
        theirs = np.fromfile(lf, dtype=np.float32).reshape(len(ids), -1)
        e_ours, e_theirs = rms_err(ours, want), rms_err(theirs, want)
        m_ours, m_theirs = rel_err(ours, want), rel_err(theirs, want)
        am_ours = float((ours.argmax(-1) == want.argmax(-1)).mean())
        am_theirs = float((theirs.argmax(-1) == want.argmax(-1)).mean())
        ok = e_ours <= 1.1 * e_theirs + 1e-3
        row = {"type": t, "tensor_types": kinds, "clover_err": e_ours, "llama_err": e_theirs, "clover_max_err": m_ours,
               "llama_max_err": m_theirs, "clover_argmax": am_ours,
               "llama_argmax": am_theirs, "clover_vs_llama": rel_err(ours, theirs), "pass": ok}
        rows.append(row)
        kind_text = ",".join(f"{k}:{v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
        print(f"{t:10s} {kind_text[:44]:44s} {e_ours:10.4f} {e_theirs:10.4f} {m_ours:10.4f} {m_theirs:10.4f} "
              f"{am_ours:13.2f} {am_theirs:12.2f} {row['clover_vs_llama']:15.4f}  {'PASS' if ok else 'FAIL'}")
    if a.json:
        a.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1))
    return 0 if all(r["pass"] for r in rows) else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
