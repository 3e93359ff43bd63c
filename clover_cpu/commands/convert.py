"""`clover-cpu convert`: a Hugging Face checkpoint folder to a (quantized) GGUF file."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> None:
    from clover_cpu.convert.hf import OUT_TYPES

    p = sub.add_parser(
        "convert",
        help="convert a Hugging Face checkpoint to GGUF",
        description="Convert a Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer.model or "
        "tokenizer.json) of a Clover or Qwen3.5-MoE model to one GGUF file. Tensors are streamed one at a "
        "time, so memory stays small whatever the model size; the output appears under its final name only "
        "when complete.",
        epilog="example: clover-cpu convert ./Clover-35B-A3B -o clover-q4_k_m.gguf",
    )
    p.add_argument("src", metavar="SRC_DIR", help="checkpoint folder")
    p.add_argument("-o", "--output", required=True, metavar="OUT.gguf", help="the GGUF file to write")
    p.add_argument("--type", default="q4_k_m", choices=OUT_TYPES,
                   help="weight format, largest first (default: q4_k_m, llama.cpp's 4-bit recipe; q5_k_m its 5-bit "
                   "one; norms and small tensors stay f32)")
    p.add_argument("--threads", type=int, default=0, help="quantization threads (default: one per physical core)")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    from clover_cpu.convert.errors import ConvertError
    from clover_cpu.convert.hf import convert

    if args.threads < 0:
        raise ValueError("--threads must be >= 0")
    try:
        convert(args.src, args.output, out_type=args.type, threads=args.threads, force=args.force,
                log=lambda s: print(s, file=sys.stderr), progress=not args.quiet)
    except ConvertError as e:
        print(f"clover-cpu convert: error: {e}", file=sys.stderr)
        return 2
    return 0
