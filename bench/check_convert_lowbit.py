"""clover-cpu convert's low-bit recipes (q3_k_m, q3_k_s, q2_k, iq4_xs, iq4_nl) against llama.cpp's llama-quantize on
the same input.

Random checkpoints of three shapes (the tiny one, whose 64-wide rows make every 256-block type fall back;
one 256 wide with 8 experts, where llama-quantize has rules of its own for 8-expert models; one 256 wide
with 16 experts and an MTP head) are converted by clover-cpu to F16 and to each recipe, with and without an
importance matrix (llama-imatrix on the F16 file, over real text). llama-quantize turns the same F16 file
into each recipe. Per tensor: the type each tool chose, and whether the bytes are equal. Writes the types
llama-quantize chose to tests/data/llama_quantize_recipes.json (--write-fixture), which
tests/test_convert_lowbit.py checks the converter's choices against without llama.cpp.

    python bench/check_convert_lowbit.py --llama-bin DIR [--work DIR] [--write-fixture]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
import realfiles  # noqa: E402

RECIPES = {"q3_k_m": "Q3_K_M", "q3_k_s": "Q3_K_S", "q2_k": "Q2_K", "iq4_xs": "IQ4_XS", "iq4_nl": "IQ4_NL"}
FIXTURE = REPO / "tests" / "data" / "llama_quantize_recipes.json"
# name -> (preset, overrides, mtp): the checkpoints tests/test_convert_lowbit.py rebuilds by these arguments
SHAPES = {
    "tiny": ("tiny", {}, False),
    "w256_e8": ("tiny", dict(hidden_size=256, moe_intermediate_size=256, shared_expert_intermediate_size=256,
                             head_dim=64, linear_key_head_dim=64, linear_value_head_dim=64, num_hidden_layers=8), False),
    "w256_e16_mtp": ("tiny", dict(hidden_size=256, moe_intermediate_size=256, shared_expert_intermediate_size=256,
                                  head_dim=64, linear_key_head_dim=64, linear_value_head_dim=64, num_experts=16,
                                  num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2), True),
}


def checkpoint(dst: Path, shape: str) -> Path:
    """The random checkpoint of one SHAPES entry (seeded: the same bytes on every machine)."""
    from clover_cpu.convert.synthetic import write_random_checkpoint

    preset, overrides, mtp = SHAPES[shape]
    write_random_checkpoint(dst, preset=preset, model_type="qwen3_5_moe", seed=11, dtype="bf16", overrides=overrides)
    if mtp:
        import qwen_fixtures

        qwen_fixtures.add_mtp_head(dst)
    return dst


def tensors(path: Path) -> dict[str, tuple[str, bytes]]:
    from clover_cpu.gguf_file import GGUFFile

    with GGUFFile(path) as g:
        return {n: (ti.type_name, g.data(n).tobytes()) for n, ti in g.tensors.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-bin", type=Path, required=True, help="folder with llama-quantize and llama-imatrix")
    ap.add_argument("--work", type=Path, default=Path("/tmp/clover-convert-lowbit"))
    ap.add_argument("--write-fixture", action="store_true")
    ap.add_argument("--scalar-search", action="store_true",
                    help="the k-quants' scalar search (ggml's own), not the converter's AVX2 twin, which differs in "
                    "rare near-ties: then the q4_K..q6_K tensors are byte-equal too")
    a = ap.parse_args(argv)
    from clover_cpu import _core
    from clover_cpu.convert.hf import convert

    if a.scalar_search:
        _core.set_fast_quant_search(False)
    a.work.mkdir(parents=True, exist_ok=True)
    text = a.work / "calib.txt"
    text.write_text("\n".join(p.read_text(encoding="utf-8") for p in sorted(realfiles.llama_cpp().glob(
        "gguf-py/gguf/*.py"))))
    fixture, ok = {}, True
    print(f"{'shape':14s} {'recipe':8s} {'imatrix':7s} {'tensors':>7s} {'same type':>9s} {'same bytes':>10s}  types (ours)")
    for shape in SHAPES:
        d = a.work / shape
        if not (d / "hf" / "config.json").exists():
            checkpoint(d / "hf", shape)
        f16 = d / "f16.gguf"
        convert(d / "hf", f16, out_type="f16", log=lambda s: None, progress=False, force=True)
        imatrix = d / "imatrix.gguf"
        r = subprocess.run([str(a.llama_bin / "llama-imatrix"), "-m", str(f16), "-f", str(text), "-o", str(imatrix),
                            "-c", "128", "--chunks", "8", "-t", "2"], capture_output=True, text=True, timeout=3600)
        if r.returncode:
            print(r.stderr[-2000:])
            return 2
        fixture[shape] = {}
        for recipe, ltype in RECIPES.items():
            for use_im in (False, True):
                ours_path = d / f"ours-{recipe}{'-im' if use_im else ''}.gguf"
                info = convert(d / "hf", ours_path, out_type=recipe, log=lambda s: None, progress=False, force=True,
                               imatrix=imatrix if use_im else None)
                theirs_path = d / f"llama-{recipe}{'-im' if use_im else ''}.gguf"
                cmd = [str(a.llama_bin / "llama-quantize")] + (["--imatrix", str(imatrix)] if use_im else []) + [
                    str(f16), str(theirs_path), ltype, "2"]
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
                if r.returncode:
                    print(r.stderr[-2000:])
                    return 2
                ours, theirs = tensors(ours_path), tensors(theirs_path)
                same_type = sum(ours[n][0] == theirs[n][0] for n in theirs)
                same_bytes = sum(ours[n] == theirs[n] for n in theirs)
                quantized = [n for n in theirs if theirs[n][0] not in ("f32", "f16")]
                counts = {}
                for n in ours:
                    counts[ours[n][0]] = counts.get(ours[n][0], 0) + 1
                print(f"{shape:14s} {recipe:8s} {str(use_im):7s} {len(theirs):7d} {same_type:9d} {same_bytes:10d}  "
                      + ",".join(f"{k}:{v}" for k, v in sorted(counts.items())))
                for n in theirs:
                    if ours[n][0] != theirs[n][0]:
                        print(f"    {n}: ours {ours[n][0]}, llama-quantize {theirs[n][0]}")
                ok &= same_type == len(theirs)
                fixture[shape][f"{recipe}{'+imatrix' if use_im else ''}"] = {n: theirs[n][0] for n in quantized}
                assert info["types"] is not None
    if a.write_fixture:
        FIXTURE.write_text(json.dumps({"llama.cpp": "b11434", "shapes": {k: [v[0], v[1], v[2]] for k, v in SHAPES.items()},
                                       "types": fixture}, indent=1) + "\n")
        print(f"wrote {FIXTURE}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
