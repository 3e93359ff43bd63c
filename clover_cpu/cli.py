"""`clover-cpu`: a thin dispatcher; each command lives in clover_cpu/commands/ with its own parser."""

from __future__ import annotations

import argparse
import sys

from .commands import bench, convert, info, run, serve

COMMANDS = {"run": run, "convert": convert, "info": info, "bench": bench, "serve": serve}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clover-cpu",
        description="Run Clover block-diffusion MoE models on the CPU.",
        epilog="Run 'clover-cpu COMMAND --help' for the options of a command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command].main(args)
    except (ValueError, OSError) as e:  # GGUFError and ConvertError are ValueErrors or handled inside
        print(f"clover-cpu {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"clover-cpu {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
