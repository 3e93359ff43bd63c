"""`clover-cpu info --system`: which kernel path and how many threads run here."""

from __future__ import annotations

import argparse
import json
import platform


def add_parser(sub) -> None:
    p = sub.add_parser(
        "info",
        help="show what this machine runs (--system)",
        description="Show the kernel path (ISA), threads and CPU features clover-cpu uses on this machine.",
    )
    p.add_argument("--system", action="store_true", help="describe this machine and the kernels chosen for it")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    import clover_cpu

    if not args.system:
        raise ValueError("nothing to show: pass --system")
    info = clover_cpu.system_info()
    info["machine"] = platform.machine()
    info["python"] = platform.python_version()
    info["version"] = clover_cpu.__version__
    if args.json:
        print(json.dumps(info))
        return 0
    feats = ", ".join(k for k, v in info["cpu_features"].items() if v) or "none"
    print(f"clover-cpu {info['version']} on {info['machine']}, Python {info['python']}")
    print(f"kernels:    {info['isa']} (available: {', '.join(info['available_isas'])}; CLOVER_ISA forces one)")
    print(f"threads:    {info['threads']} (default {info['default_threads']}: one per physical core)")
    print(f"cpu:        {feats}")
    print(f"native:     {'yes (-march=native build)' if info['native_build'] else 'no (portable build)'}")
    return 0
