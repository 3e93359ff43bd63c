"""The command line against hostile and careless input: every bad flag, file or environment value ends in
one line on stderr and exit 2 (never a traceback); bytes that are not UTF-8 in a prompt, a closed stdout,
--show-steps on a terminal, the package imported from the source folder, --version."""

import json
import os
import pty
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import clover_cpu
from clover_cpu.convert.hf import convert
from clover_cpu.convert.synthetic import write_random_checkpoint
from clover_cpu.gguf_file import GGUFFile

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "clover_cpu"]


def cli(*args, env=None, stdin=None, cwd=None, timeout=120):
    e = {**os.environ, **(env or {})}
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, env=e, input=stdin, cwd=cwd,
                          timeout=timeout)


def assert_one_line_error(r, code=2):
    err = r.stderr.decode("utf-8", "replace")
    assert r.returncode == code, (r.returncode, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    assert err.strip() and err.strip().count("\n") == 0, err
    assert "error" in err
    return err


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    write_random_checkpoint(d / "ar", model_type="qwen3_5_moe", seed=5)
    convert(d / "ar", d / "ar.gguf", out_type="q8_0", log=lambda s: None, progress=False)
    write_random_checkpoint(d / "ck", model_type="clover", seed=6)
    (d / "ck" / "tokenizer_config.json").write_text("{}")  # a base model: no chat template
    convert(d / "ck", d / "clover.gguf", out_type="q8_0", log=lambda s: None, progress=False)
    return {"ar": d / "ar.gguf", "clover": d / "clover.gguf", "ckpt": d / "ck", "dir": d}


HOSTILE_RUN = [
    ["-n", "-1"], ["-n", "abc"], ["--temperature", "nan"], ["--temperature", "inf"], ["--temperature", "-1"],
    ["--top-p", "0"], ["--top-p", "nan"], ["--top-k", "-3"], ["--threshold", "2"], ["--threshold", "nan"],
    ["--threshold", "0"], ["--block-length", "0"], ["--block-length", "100000"], ["--max-steps", "0"],
    ["--window", "-1"], ["--ctx-len", "0"], ["--ctx-len", "-5"], ["--seed", "x"], ["--seed", "-1"],
    ["--kv-type", "bogus"], ["--prefetch", "bogus"], ["--threads", "0"], ["--threads", "-2"],
    ["--threads", "100000"], ["--threads", "x"], ["--window", "2", "--max-steps", "3"], ["--bogus"],
    ["-m", "/nonexistent.gguf"], ["-m", "/dev/null"], ["-m", "/"], ["-m", "/etc/passwd"],
    ["--logit-bias", "x=1"], ["--logit-bias", "5"], ["--logit-bias", "5=101"], ["--logit-bias", "5=nan"],
    ["--logit-bias", "5=1e999"], ["--logit-bias", "99999999=1"], ["--logit-bias", "-3=1"],
    ["--presence-penalty", "3"], ["--presence-penalty", "nan"], ["--frequency-penalty", "-2.5"],
]


@pytest.mark.parametrize("extra", HOSTILE_RUN, ids=lambda a: " ".join(a))
def test_run_refuses_bad_flags_in_one_line(extra):
    assert_one_line_error(cli("run", "-p", "def f():", "-n", "4", *extra))


@pytest.mark.parametrize("args", [
    ["run"], ["run", "-p", "a", "-f", "x"], ["run", "-f", "/nonexistent"], ["run", "-f", "/"],
    ["run", "-f", "/dev/zero"], ["run", "-m", "/dev/zero", "-p", "x"],
    ["info", "/nonexistent"], ["info", "/"], ["info", "/etc/passwd"], ["info"], ["bogus"], ["--bogus"],
    ["convert", "/nonexistent", "-o", "x.gguf"], ["convert", "/", "-o", "x.gguf"],
    ["bench", "--tests", "bogus", "--no-llama"], ["bench", "--threads", "0", "--no-llama"],
    ["serve", "--port", "99999"], ["serve", "--port", "-1"], ["serve", "--host", "999.1.1.1"],
    ["serve", "--host", "name.invalid"], ["serve", "--threads", "0"], ["serve", "--parallel", "0"],
    ["serve", "--prefill-slice", "0"], ["serve", "--parallel", "4", "--cache-slots", "2"],
    ["serve", "-m", "/nonexistent"], ["serve", "-m", "/etc/passwd"],
], ids=lambda a: " ".join(a))
def test_every_command_refuses_in_one_line(args, tmp_path):
    assert_one_line_error(cli(*args, cwd=tmp_path, timeout=60))


def test_convert_refusals(files, tmp_path):
    ck = files["ckpt"]
    for extra in (["--type", "bogus"], ["--threads", "0"], ["--threads", "100000"], ["--split-max-size", "bogus"],
                  ["--imatrix", "/nonexistent"]):
        assert_one_line_error(cli("convert", ck, "-o", tmp_path / "x.gguf", *extra))
    assert_one_line_error(cli("convert", ck, "-o", tmp_path / "no" / "such" / "dir" / "x.gguf"))
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("env", [
    {"CLOVER_ISA": "bogus"}, {"CLOVER_ISA": "neon" if os.uname().machine == "x86_64" else "avx512"},
    {"CLOVER_THREADS": "x"}, {"CLOVER_THREADS": "0"}, {"CLOVER_THREADS": "-3"}, {"CLOVER_THREADS": "100000"},
    {"CLOVER_THREADS": "1e3"},
], ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
@pytest.mark.parametrize("args", [["run", "-p", "x", "-n", "2"], ["info", "--system"]], ids=lambda a: a[0])
def test_bad_environment_is_one_line(env, args):
    err = assert_one_line_error(cli(*args, env=env))
    assert next(iter(env)) in err


def test_version():
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.decode().strip() == f"clover-cpu {clover_cpu.__version__}"


def test_threads_within_the_cpus_run():
    r = cli("run", "-p", "x", "-n", "2", "--threads", str(clover_cpu.available_cpus()), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["threads"] == clover_cpu.available_cpus()


def test_prompt_bytes_that_are_not_utf8():
    """Invalid UTF-8 (from argv, stdin or a Python string with lone surrogates) is replaced, never a crash."""
    bad = b"abc\xff\xfe def"
    r = subprocess.run([*CLI, "run", "-p", os.fsdecode(bad), "-n", "4", "--json"], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    via_argv = json.loads(r.stdout)
    r = cli("run", "-f", "-", "-n", "4", "--json", stdin=bad)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["token_ids"] == via_argv["token_ids"]
    r = subprocess.run([*CLI, "run", "-p", os.fsdecode(bad), "-n", "4"], capture_output=True, timeout=120)
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr
    m = clover_cpu.load(clover_cpu.shipped_model())
    out = m.generate_text("abc\udcff\udcfe def", max_new_tokens=4)
    assert out["token_ids"] == via_argv["token_ids"]


def test_closed_stdout_ends_quietly():
    """`clover-cpu run ... | head -1`: no 'Broken pipe' message, no traceback."""
    p = subprocess.Popen([*CLI, "run", "-p", "def f(x):\n", "-n", "200", "--ignore-eos"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.read(1)
    p.stdout.close()
    _, err = p.communicate(timeout=120)
    assert p.returncode in (0, 141), err
    assert b"Broken pipe" not in err and b"Traceback" not in err, err


def test_import_from_the_source_folder(tmp_path):
    """From the repository root (where the set-up commands leave a user) `import clover_cpu` works: the
    source folder holds no compiled extension, so the installed copy takes over."""
    r = subprocess.run([sys.executable, "-c", "import clover_cpu, clover_cpu.convert.hf; "
                        "print(clover_cpu.system_info()['isa'])"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "convert/synthetic.py", "--preset", "tiny", str(tmp_path / "ck")], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "ck" / "config.json").exists()


def test_chat_without_a_template_says_what_to_do(files):
    err = assert_one_line_error(cli("run", "--chat", stdin=b"hello\n"))
    assert "code-completion model" in err and "-p" in err
    with GGUFFile(files["clover"]) as g:
        assert "tokenizer.chat_template" not in g.kv
    err = assert_one_line_error(cli("run", "-m", files["clover"], "--chat", stdin=b"hello\n"))
    assert "has no chat template" in err and "-p" in err


def test_endless_input_is_refused(files):
    """An endless stdin (a prompt or a chat message from /dev/zero) is refused in one line, before it fills
    the memory."""
    with open("/dev/zero", "rb") as zero:
        r = subprocess.run([*CLI, "run", "-f", "-"], stdin=zero, capture_output=True, timeout=120)
        assert "longer than" in assert_one_line_error(r)
    with open("/dev/zero", "rb") as zero:
        r = subprocess.run([*CLI, "run", "-m", str(files["ar"]), "--chat"], stdin=zero, capture_output=True,
                           timeout=120)
    err = r.stderr.decode()
    assert r.returncode == 2 and "longer than" in err and "Traceback" not in err, err


def test_diffusion_flags_on_an_ar_file_are_noted(files):
    r = cli("run", "-m", files["ar"], "-p", "x", "-n", "2", "--threshold", "0.5", "--block-length", "4")
    assert r.returncode == 0, r.stderr
    err = r.stderr.decode()
    assert "decodes autoregressively" in err and "--threshold" in err and "--block-length" in err
    r = cli("run", "-m", files["ar"], "-p", "x", "-n", "2")
    assert r.returncode == 0 and b"autoregressively" not in r.stderr


def test_stats_of_a_prompt_shorter_than_a_block():
    r = cli("run", "-p", "def f", "-n", "8", "--stats")
    assert r.returncode == 0, r.stderr
    line = r.stderr.decode().strip().splitlines()[-1]
    assert "decoded with the first block" in line and "prefill" not in line, line
    long_prompt = "x = 1\n" * 40
    r = cli("run", "-p", long_prompt, "-n", "8", "--stats")
    assert "prefilled at" in r.stderr.decode(), r.stderr


def test_help_states_the_shipped_threshold():
    with GGUFFile(clover_cpu.shipped_model()) as g:
        value = g.kv["clover.diffusion.threshold"]
    text = " ".join(cli("run", "--help").stdout.decode().split())
    assert f"{value:g} in the shipped model" in text


def test_port_in_use_is_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        err = assert_one_line_error(cli("serve", "--port", port, cwd=tmp_path, timeout=60))
    assert "in use" in err and "--port" in err


def _run_in_terminal(args, cols=100, rows=40, timeout=120.0) -> bytes:
    """Run a command with stdout and stderr on one pseudo-terminal of the given size; all it wrote."""
    import fcntl
    import struct
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdin, stdout and stderr are the terminal
        try:
            os.execv(args[0], args)
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    data, end = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                data += chunk
    finally:
        if time.monotonic() >= end:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)
    return data


def test_show_steps_on_a_terminal_keeps_the_text():
    """--show-steps where stdout and stderr share a terminal: after the run the screen holds the whole
    generated text (as --json gives it), not just the last block's redraw."""
    pyte = pytest.importorskip("pyte")
    args = ["-p", "def fibonacci(n):", "-n", "48", "--threshold", "0.5"]
    want = json.loads(cli("run", *args, "--json").stdout)["text"]
    assert want.count("\n") >= 2  # the check is about text over several lines
    data = _run_in_terminal([*CLI, "run", *args, "--show-steps"], cols=120, rows=60)
    screen = pyte.Screen(120, 60)
    pyte.ByteStream(screen).feed(data)
    shown = "\n".join(line.rstrip() for line in screen.display).strip("\n")
    assert "\u2591" not in shown  # no block left on the screen
    assert [ln.rstrip() for ln in want.strip("\n").splitlines()] == shown.splitlines()[: len(want.strip("\n").splitlines())]


@pytest.mark.skipif(shutil.which("head") is None or "asan" in os.environ.get("LD_PRELOAD", ""),
                    reason="no head, or the sanitizer build (the shell would inherit the preloaded ASan runtime)")
def test_pipe_into_head_in_a_shell():
    r = subprocess.run(f"{sys.executable} -m clover_cpu run -p 'def f(x):' -n 64 --ignore-eos | head -c 1",
                       shell=True, capture_output=True, timeout=120)
    assert b"Traceback" not in r.stderr and b"Broken pipe" not in r.stderr, r.stderr
