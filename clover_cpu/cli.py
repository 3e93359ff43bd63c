"""`clover-cpu`: a thin dispatcher; each command lives in clover_cpu/commands/ with its own parser.

Whatever goes wrong ends in one line on stderr: a bad flag, file or environment value exits 2, a failure
while running exits 1, Ctrl-C exits 130, and a closed stdout (`clover-cpu run ... | head -1`) ends the
command quietly. CLOVER_DEBUG=1 shows the traceback of an unexpected failure."""

from __future__ import annotations

import argparse
import os
import sys

from .commands import bench, convert, info, run, serve

COMMANDS = {"run": run, "convert": convert, "info": info, "bench": bench, "serve": serve}


class Parser(argparse.ArgumentParser):
    """argparse with its errors in one line (the usage is one `--help` away) and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = Parser(
        prog="clover-cpu",
        description="Run Clover block-diffusion MoE models (and Qwen3.5-MoE GGUF files) on the CPU.",
        epilog="Run 'clover-cpu COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"clover-cpu {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, module in COMMANDS.items():
        module.add_parser(sub)
    return parser


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush stays silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    where = f"clover-cpu {args.command}"
    try:
        import clover_cpu

        clover_cpu.check_environment()
        return COMMANDS[args.command].main(args)
    except BrokenPipeError:  # the reader of stdout went away: nothing left to say to anyone
        _quiet_stdout()
        return 141
    except KeyboardInterrupt:
        print(f"{where}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as e:  # bad input: GGUFError, ConvertError, TemplateError, a missing file...
        print(f"{where}: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a failure while running: one line unless asked for the traceback
        if os.environ.get("CLOVER_DEBUG"):
            raise
        print(f"{where}: error: {type(e).__name__}: {e} (CLOVER_DEBUG=1 shows where)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
