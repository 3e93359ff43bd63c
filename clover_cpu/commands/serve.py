"""`clover-cpu serve`: the OpenAI-compatible HTTP server (clover_cpu/server.py) on uvicorn."""

from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import sys
from pathlib import Path

from .run import shipped_model, threads_arg


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API, with a chat page",
        description="Serve a GGUF model over HTTP: POST /v1/chat/completions and /v1/completions (OpenAI's "
        "request and response format, streaming with stream=true), GET /v1/models, /health, /metrics "
        "(Prometheus) and a chat page at /. Up to --parallel requests decode together in shared forwards; "
        "more wait in a queue (429 when it is full). Clover's decoding options (threshold, block_length, "
        "window, reuse, mode: exact or auto, ...) are extra fields of a request's body.",
        epilog="examples:\n  clover-cpu serve                          # the shipped model on http://127.0.0.1:8080\n"
        "  clover-cpu serve -m model.gguf --parallel 4 --api-key secret\n"
        "  curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\\n"
        "       -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-m", "--model", help="GGUF file (default: the small Clover shipped in the package)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--parallel", type=int, default=4, help="sequences decoded together (default 4)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' (default: $CLOVER_API_KEY if set, else no key)")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests waiting for a slot before new ones get 429 (default 64)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="the largest max_tokens a request may ask for (default: what the context holds)")
    p.add_argument("--default-max-tokens", type=int, default=512,
                   help="max_tokens of a chat request that gives none (default 512; completions: 16, as OpenAI)")
    p.add_argument("--prefill-slice", type=int, default=256,
                   help="prompt tokens per forward while other requests are decoding: a long prompt is read in "
                        "slices that share forwards with their steps, so their replies keep streaming (default 256; "
                        "a prompt alone runs in chunks of 2048)")
    p.add_argument("--cache-slots", type=int, default=None,
                   help="finished conversations whose caches are kept for prompt caching, counting the ones "
                        "decoding (default: --parallel); each holds its context's attention cache and up to "
                        "three copies of the recurrent and conv states (the live ones and two checkpoints: "
                        "198 MB for Clover-35B)")
    p.add_argument("--max-body", type=int, default=4 << 20, help="largest request body in bytes (default 4 MiB)")
    p.add_argument("--alias", default=None, help="the model's name in the API (default: the file name)")
    p.add_argument("--threads", type=threads_arg, default=None,
                   help="threads, from 1 to the CPUs available (default: one per physical core)")
    p.add_argument("--ctx-len", type=int, default=None,
                   help="context length per sequence (default: the model's, at most 32768 for the server)")
    p.add_argument("--kv-type", choices=["f16", "q8_0", "f32"], default="f16", help="attention cache type")
    p.add_argument("--shutdown-timeout", type=float, default=10.0,
                   help="on SIGTERM / Ctrl-C, seconds to let requests finish before they are cancelled (default 10)")
    p.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"], default="info")


def main(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from clover_cpu.server import Settings, create_app
    except ImportError as e:
        raise ValueError(f"the server needs its dependencies ({e.name} is missing): pip install clover-cpu") from None
    path = args.model or shipped_model()
    if path is None:
        raise ValueError("no model: pass -m MODEL.gguf (this installation ships none)")
    if not Path(path).is_file():
        raise ValueError(f"{path}: no such file")
    file_ctx = check_runnable(path)
    for name in ("parallel", "max_queue", "max_body", "default_max_tokens", "prefill_slice"):
        if getattr(args, name) < (0 if name == "max_queue" else 1):
            raise ValueError(f"--{name.replace('_', '-')} must be >= {0 if name == 'max_queue' else 1}")
    if args.cache_slots is not None and args.cache_slots < args.parallel:
        raise ValueError(f"--cache-slots must be at least --parallel ({args.parallel})")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise ValueError("--max-tokens must be >= 1")
    if not 0 < args.port < 65536:
        raise ValueError("--port must be in 1..65535")
    key = args.api_key if args.api_key is not None else os.environ.get("CLOVER_API_KEY") or None
    ctx = args.ctx_len
    if ctx is None and file_ctx:
        ctx = min(file_ctx, 32768)  # each of --parallel sequences may grow to it
    settings = Settings(path, parallel=args.parallel, api_key=key, max_queue=args.max_queue,
                        max_body_bytes=args.max_body, max_tokens_limit=args.max_tokens,
                        default_max_tokens=args.default_max_tokens, threads=args.threads, ctx_len=ctx,
                        kv_type=args.kv_type, alias=args.alias, prefill_slice=args.prefill_slice,
                        cache_slots=args.cache_slots)
    sock = listen_socket(args.host, args.port)
    app = create_app(settings)
    where = f"http://{'[' + args.host + ']' if ':' in args.host else args.host}:{args.port}"
    print(f"clover-cpu serve: {Path(path).name} on {where} (chat page at {where}/, API at {where}/v1), "
          f"{args.parallel} parallel sequences{', API key required' if key else ''}", file=sys.stderr)
    # uvicorn stops gracefully on SIGINT / SIGTERM, then raises the signal again under the handlers it found:
    # with these (which do nothing) the process ends with status 0 after a clean stop, without a traceback
    got = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda n, _f: got.append(n))
    config = uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=args.shutdown_timeout,
                            access_log=args.log_level == "debug")
    server = uvicorn.Server(config)
    with sock:
        server.run(sockets=[sock])
    if not server.started and not got:
        print("clover-cpu serve: error: the server did not start (see the log above)", file=sys.stderr)
        return 1
    print("clover-cpu serve: stopped", file=sys.stderr)
    return 0


def check_runnable(path) -> int | None:
    """Refuse, in one line and before the server starts, a file that is not a GGUF or that clover-cpu
    cannot run (the model itself loads in the background while the server answers /health); the file's
    context length."""
    from clover_cpu.config import why_not_runnable
    from clover_cpu.gguf_file import GGUFFile

    with GGUFFile(path) as g:
        why = why_not_runnable(g)
        arch = g.kv.get("general.architecture")
        n = g.kv.get(f"{arch}.context_length")
    if why:
        raise ValueError(f"{Path(path).name}: clover-cpu cannot run this file: {why}")
    return int(n) if n else None


def listen_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so that a bad address or a port in use is one line (ValueError)
    before anything starts; uvicorn serves on it."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise ValueError(f"--host {host}: not an address of this machine ({getattr(e, 'strerror', None) or e})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        hint = {errno.EADDRINUSE: ": another program listens there; choose another --port",
                errno.EACCES: ": ports below 1024 need privileges; choose another --port",
                errno.EADDRNOTAVAIL: ": not an address of this machine; see --host"}.get(e.errno, "")
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}{hint}") from None
    sock.set_inheritable(True)
    return sock
