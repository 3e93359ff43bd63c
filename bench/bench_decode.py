"""Block-diffusion decoding speed: tokens per forward (TPF) and tokens/s across thresholds and block
lengths, on the Clover models given (default: the model shipped in the package, if any).

    python bench/bench_decode.py --model clover.gguf --prompts-file prompts.txt

Writes one table and JSON (bench/results/decode.json).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_PROMPTS = [
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main(",
    "class Stack:\n    def __init__(self):\n",
    "for i in range(10):\n",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", help="GGUF file (repeatable; default: the shipped model)")
    ap.add_argument("--thresholds", default="1.0,0.95,0.9,0.8,0.7,0.5")
    ap.add_argument("--block-lengths", default="", help="comma list (default: the file's)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompts-file", help="prompts separated by lines with only '---'")
    ap.add_argument("--out", default=str(HERE / "results" / "decode.json"))
    a = ap.parse_args()

    import clover_cpu
    from clover_cpu.commands.run import shipped_model

    models = a.model or ([str(shipped_model())] if shipped_model() else [])
    if not models:
        raise SystemExit("no model: pass --model FILE.gguf")
    prompts = Path(a.prompts_file).read_text().split("\n---\n") if a.prompts_file else DEFAULT_PROMPTS
    rows = []
    print(f"{'model':<28}{'B':>4}{'thresh':>8}{'TPF':>7}{'tok/s':>9}{'ms/fwd':>9}{'tokens':>8}")
    for path in models:
        m = clover_cpu.load(path)
        blocks = [int(b) for b in a.block_lengths.split(",") if b] or [m.config.block_length]
        for B in blocks:
            for thr in [float(t) for t in a.thresholds.split(",")]:
                gen = fwd = 0
                secs = 0.0
                for p in prompts:
                    t = time.perf_counter()
                    r = m.generate_text(p, max_new_tokens=a.max_new_tokens, threshold=thr, block_length=B)
                    secs += time.perf_counter() - t
                    gen += r["generated_tokens"]
                    fwd += r["forwards"]
                row = {"model": str(path), "block_length": B, "threshold": thr, "generated_tokens": gen,
                       "forwards": fwd, "tokens_per_forward": gen / max(fwd, 1), "tokens_per_second": gen / secs,
                       "ms_per_forward": 1e3 * secs / max(fwd, 1)}
                rows.append(row)
                print(f"{Path(path).name[:27]:<28}{B:>4}{thr:>8.2f}{row['tokens_per_forward']:>7.2f}"
                      f"{row['tokens_per_second']:>9.2f}{row['ms_per_forward']:>9.1f}{gen:>8}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"isa": clover_cpu.system_info()["isa"], "rows": rows}, indent=2))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
