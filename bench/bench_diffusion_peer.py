"""llama.cpp's own diffusion decoding as a peer: `llama-diffusion-cli` (llama.cpp b11434) on a block-diffusion
MoE of the architecture it supports nearest Clover's (RND1: Qwen3-MoE with bidirectional attention), at the
bench model's shape (hidden 2048, 40 layers, top-8 of 32 experts of 512, 16 query heads of 256, 2 KV heads),
random weights, Q4_K_M by llama.cpp's own converter and llama-quantize.

    python bench/bench_diffusion_peer.py make --llama-bin DIR --llama-src DIR --work DIR
    python bench/bench_diffusion_peer.py run --llama-bin DIR --work DIR [--steps 112,28,16] [--json F]

`make` writes the checkpoint (bf16 safetensors, the Qwen vocabulary of llama.cpp's ggml-vocab-qwen35.gguf,
~11 GB), converts it with convert_hf_to_gguf.py to Q8_0, deletes the checkpoint, and requantizes to Q4_K_M
(~3 GB; peak disk ~17 GB). `run` times llama-diffusion-cli on a 16-token prompt and 128 positions (blocks
of 32, greedy) at each step count: its forwards take every position of the sequence (no cache), so a
step costs the same whatever it finalizes, and its tokens per second at T tokens per forward is T over
that cost. Compare with `bench_diffusion.py synth` / `replay` on clover-cpu's bench model at the same
tokens per forward (bench/NOTES.md has both). By hand, not a test: minutes of CPU and gigabytes of disk.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHAPE = dict(hidden_size=2048, num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
             num_experts=32, num_experts_per_tok=8, moe_intermediate_size=512, intermediate_size=512)
MASK_ID = 151662  # <|fim_pad|>: a Qwen special token the prompt never holds


def write_checkpoint(out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(HERE.parent / "tests"))
    import qwen_fixtures

    out.mkdir(parents=True, exist_ok=True)
    V = qwen_fixtures.VOCAB_SIZE
    c = SHAPE
    cfg = dict(c, architectures=["RND1"], model_type="qwen3_moe", vocab_size=V, rms_norm_eps=1e-6,
               rope_theta=1000000.0, max_position_embeddings=4096, tie_word_embeddings=False,
               norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], torch_dtype="bfloat16",
               mask_token_id=MASK_ID, bos_token_id=None, eos_token_id=151645)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "tokenizer.json").write_text(json.dumps(qwen_fixtures.tokenizer_json(), ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False, "eos_token": "<|im_end|>",
                                                           "tokenizer_class": "Qwen2Tokenizer"}))
    g = torch.Generator().manual_seed(0)
    H, L, E, I, D = c["hidden_size"], c["num_hidden_layers"], c["num_experts"], c["moe_intermediate_size"], c["head_dim"]
    nq, nkv = c["num_attention_heads"] * D, c["num_key_value_heads"] * D

    def rnd(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    index, shard = {}, 0

    def save(ts: dict) -> None:
        nonlocal shard
        name = f"model-{shard:05d}.safetensors"
        save_file(ts, str(out / name), metadata={"format": "pt"})
        index.update({k: name for k in ts})
        shard += 1

    save({"model.embed_tokens.weight": rnd(V, H), "lm_head.weight": rnd(V, H), "model.norm.weight": ones(H)})
    for i in range(L):
        p = f"model.layers.{i}."
        save({p + "input_layernorm.weight": ones(H), p + "post_attention_layernorm.weight": ones(H),
              p + "self_attn.q_proj.weight": rnd(nq, H), p + "self_attn.k_proj.weight": rnd(nkv, H),
              p + "self_attn.v_proj.weight": rnd(nkv, H), p + "self_attn.o_proj.weight": rnd(H, nq),
              p + "self_attn.q_norm.weight": ones(D), p + "self_attn.k_norm.weight": ones(D),
              p + "mlp.gate.weight": rnd(E, H), p + "mlp.experts.gate_up_proj": rnd(E, 2 * I, H),
              p + "mlp.experts.down_proj": rnd(E, H, I)})
        print(f"\rcheckpoint: layer {i + 1}/{L}", end="", flush=True)
    print()
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))


def make(a) -> int:
    work = Path(a.work)
    for need in (Path(a.llama_src) / "convert_hf_to_gguf.py", Path(a.llama_bin) / "llama-quantize"):
        if not need.exists():
            print(f"bench_diffusion_peer.py: {need} is missing (bench/setup_peers.sh builds llama.cpp b11434)",
                  file=sys.stderr)
            return 2
    ckpt, q8, q4 = work / "rnd1-ckpt", work / "rnd1-q8_0.gguf", work / "rnd1-q4_k_m.gguf"
    if not q4.exists():
        if not q8.exists():
            t = time.perf_counter()
            write_checkpoint(ckpt)
            print(f"checkpoint written in {time.perf_counter() - t:.0f} s")
            t = time.perf_counter()
            subprocess.run([sys.executable, str(Path(a.llama_src) / "convert_hf_to_gguf.py"), str(ckpt),
                            "--outtype", "q8_0", "--outfile", str(q8)], check=True)
            print(f"convert_hf_to_gguf.py -> Q8_0 in {time.perf_counter() - t:.0f} s")
            subprocess.run(["rm", "-rf", str(ckpt)], check=True)
        t = time.perf_counter()
        subprocess.run([str(Path(a.llama_bin) / "llama-quantize"), "--allow-requantize", str(q8), str(q4), "Q4_K_M",
                        str(a.threads)], check=True, stdout=subprocess.DEVNULL)
        print(f"llama-quantize -> Q4_K_M in {time.perf_counter() - t:.0f} s")
        q8.unlink()
    print(f"{q4}: {q4.stat().st_size / 1e9:.2f} GB")
    return 0


PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


def run(a) -> int:
    model = Path(a.work) / "rnd1-q4_k_m.gguf"
    cli = Path(a.llama_bin) / "llama-diffusion-cli"
    for need, how in ((model, "run `make` first"), (cli, "bench/setup_peers.sh builds it")):
        if not need.exists():
            print(f"bench_diffusion_peer.py: {need} is missing ({how})", file=sys.stderr)
            return 2
    try:
        steps_list = [int(x) for x in a.steps.split(",")]
    except ValueError:
        print(f"bench_diffusion_peer.py: --steps takes step counts separated by commas, not {a.steps!r}",
              file=sys.stderr)
        return 2
    rows = []
    for steps in steps_list:
        cmd = [str(cli), "-m", str(model), "-p", PROMPT, "-ub", str(a.length), "-b", str(a.length), "-c", str(a.length),
               "--diffusion-block-length", "32", "--diffusion-steps", str(steps), "--temp", "0", "-t", str(a.threads),
               "--seed", "1"]
        t = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t
        log = p.stdout + p.stderr
        m = re.search(r"total time: ([\d.]+)ms, time per step: ([\d.]+)ms", log)
        if p.returncode or not m:
            print(log[-3000:])
            print(f"llama-diffusion-cli failed (exit {p.returncode})")
            return 1
        total_ms, step_ms = float(m.group(1)), float(m.group(2))
        rows.append({"steps": steps, "total_ms": total_ms, "step_ms": step_ms, "wall_s": wall})
        print(f"steps {steps:>4}: {total_ms / 1e3:7.1f} s, {step_ms:7.1f} ms per step (forward of {a.length} positions)",
              flush=True)
    # the prompt's tokens as llama-diffusion-cli counts them (the file has no chat template, so the raw prompt;
    # Qwen's vocabulary adds no BOS): the rest of the positions are generated
    from clover_cpu.gguf_file import GGUFFile
    from clover_cpu.tokenizer import Tokenizer

    with GGUFFile(model) as g:
        n_prompt = len(Tokenizer.from_gguf(g.kv).encode(PROMPT))
    gen = a.length - n_prompt
    print(f"\nprompt {n_prompt} tokens, {gen} generated\n{'steps':>6} {'tokens/forward':>15} {'tok/s':>8}")
    for r in rows:
        r["tokens_per_forward"] = gen / r["steps"]
        r["tokens_per_second"] = gen / (r["total_ms"] / 1e3)
        print(f"{r['steps']:>6} {r['tokens_per_forward']:>15.2f} {r['tokens_per_second']:>8.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps({"model": str(model), "length": a.length, "threads": a.threads,
                                            "prompt_tokens": n_prompt, "generated": gen, "runs": rows}, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("make", "run"):
        s = sub.add_parser(name)
        s.add_argument("--llama-bin", required=True, help="llama.cpp b11434's build/bin")
        s.add_argument("--work", required=True, help="where the model files go")
        s.add_argument("--threads", type=int, default=2)
    sub.choices["make"].add_argument("--llama-src", required=True, help="llama.cpp b11434's source tree")
    sub.choices["run"].add_argument("--steps", default="112,28,16")
    sub.choices["run"].add_argument("--length", type=int, default=128, help="positions (prompt + generated)")
    sub.choices["run"].add_argument("--json")
    a = ap.parse_args()
    return make(a) if a.cmd == "make" else run(a)


if __name__ == "__main__":
    sys.exit(main())
