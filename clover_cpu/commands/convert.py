"""`clover-cpu convert`: a Hugging Face checkpoint folder to a (quantized) GGUF file."""

from __future__ import annotations

import argparse
import sys

from .run import threads_arg


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
                   "one; iq4_xs, iq4_nl, q3_k_m, q3_k_s and q2_k llama-quantize's recipes for small machines (the "
                   "35B model in 16.8 GB at q3_k_m, ~15 GB at q3_k_s); norms and small tensors stay f32)")
    p.add_argument("--threads", type=threads_arg, default=None,
                   help="quantization threads, from 1 to the CPUs available (default: one per physical core)")
    p.add_argument("--imatrix", metavar="FILE", default=None,
                   help="llama.cpp's importance matrix (from llama-imatrix: GGUF or legacy .dat): every tensor of a "
                   "k-quant, q4_0, q4_1, q5_0, q5_1 or iq4 type is quantized to keep the columns it weighs most, as "
                   "llama-quantize does")
    p.add_argument("--no-mtp", action="store_true",
                   help="leave out a multi-token-prediction head (mtp.* tensors of Qwen3.5 checkpoints); by default it "
                   "is kept as llama.cpp's converter keeps it (an extra block that decoding does not run)")
    p.add_argument("--split-max-size", default=None, metavar="SIZE",
                   help="write parts of at most SIZE of tensor data (e.g. 4G, 500M), named as llama-gguf-split names "
                   "them: OUT-00001-of-0000K.gguf; -m takes the first part")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no log lines (errors still print)")


def parse_size(text: str) -> int:
    """'4G', '500M', '1.5G', '123456' (bytes) -> bytes, as llama-gguf-split reads --split-max-size."""
    t = text.strip().upper()
    mult = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}.get(t[-1:], 1)
    try:
        n = float(t[:-1] if t[-1:] in "KMGT" else t) * mult
    except ValueError:
        raise ValueError(f"--split-max-size {text!r}: give a size such as 4G, 500M or a number of bytes") from None
    if not n >= 1:
        raise ValueError(f"--split-max-size {text!r} must be at least one byte")
    return int(n)


def main(args: argparse.Namespace) -> int:
    from clover_cpu.convert.errors import ConvertError
    from clover_cpu.convert.hf import convert

    split = parse_size(args.split_max_size) if args.split_max_size is not None else 0
    log = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr))
    try:
        convert(args.src, args.output, out_type=args.type, threads=args.threads or 0, force=args.force,
                log=log, progress=not args.quiet, mtp=not args.no_mtp, split_max_size=split, imatrix=args.imatrix)
    except ConvertError as e:
        print(f"clover-cpu convert: error: {e}", file=sys.stderr)
        return 2
    return 0
