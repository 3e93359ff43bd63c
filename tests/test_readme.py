"""Every code block of README.md runs as written, in order, in a fresh folder.

What the blocks need and a user would have made or downloaded is made here: `./Clover-35B-A3B` is a tiny
random Clover checkpoint in the Hugging Face layout (convert/synthetic.py), in place of a real download. The
set-up commands (`pip install ...`, `pytest tests`) are what made this environment and what CI runs: they
are checked against .ci/run, and what follows `&&` after an install is run. A block that starts
`clover-cpu serve` leaves the server running (on a free port in place of 8080) for the blocks after it;
a `--chat` block gets one message on stdin."""

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from clover_cpu.convert.synthetic import write_random_checkpoint

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in re.finditer(r"```(\w+)\n(.*?)```", README.read_text(), re.S)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(r, what):
    assert r.returncode == 0, f"README block failed ({what}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


def setup_commands(code: str, run) -> None:
    ci = (REPO / ".ci" / "run").read_text()
    for line in code.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        for part in (p.strip() for p in line.split("&&")):
            if part.startswith("pip install"):
                spec = shlex.split(part)[2:]
                assert spec in (["."], [".[test]"]), part
                if spec == [".[test]"]:
                    assert 'pip install ".[test]"' in ci
            elif part == "pytest tests":
                assert re.search(r"^pytest tests$", ci, re.M), "CI must run the README's test command"
            else:
                run(part)


@pytest.mark.skipif("asan" in os.environ.get("LD_PRELOAD", ""),
                    reason="under the sanitizer build bash and curl would inherit the preloaded ASan runtime (they "
                    "hang); the plain run of the suite runs this test")
def test_every_readme_block_runs(tmp_path):
    all_blocks = blocks()
    assert len(all_blocks) >= 10 and {lang for lang, _ in all_blocks} <= {"bash", "python"}
    write_random_checkpoint(tmp_path / "Clover-35B-A3B", model_type="clover", seed=3, std=0.2)
    port = str(free_port())
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    env.pop("CLOVER_THREADS", None)
    env.pop("CLOVER_ISA", None)

    def bash(code, **kw):
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=kw.pop("timeout", 600), **kw)
        check(r, code)
        return r

    server = None
    try:
        for i, (lang, code) in enumerate(all_blocks):
            code = code.replace("8080", port)
            if lang == "python":
                r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                                   text=True, timeout=600)
                check(r, f"block {i}, python")
                assert r.stdout.strip(), f"block {i} printed nothing"
            elif "pip install" in code:
                setup_commands(code, bash)
            elif "clover-cpu serve" in code:
                log = open(tmp_path / "serve.log", "w")
                server = subprocess.Popen(["bash", "-c", "exec " + code.strip()], cwd=tmp_path, env=env,
                                          stdout=log, stderr=subprocess.STDOUT)
                deadline = time.monotonic() + 180
                while True:
                    assert server.poll() is None, (tmp_path / "serve.log").read_text()
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
                            if resp.status == 200:
                                break
                    except OSError:
                        pass
                    assert time.monotonic() < deadline, "the README's server did not become healthy"
                    time.sleep(0.5)
            elif "--chat" in code:
                r = bash(code, input="Hello\n")
                assert r.stdout.strip()
            else:
                r = bash(code)
                assert r.stdout.strip() or r.stderr.strip(), f"block {i} printed nothing"
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    assert server is not None and server.returncode == 0, "the README's serve block must run"
    assert (tmp_path / "clover-q4_k_m.gguf").exists()
