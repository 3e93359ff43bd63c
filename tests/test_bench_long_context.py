"""bench/bench_long_context.py: a short run prints its table and writes JSON; `max` is the longest prompt
the file's context holds; prompt lengths the context cannot hold (with the tokens decoded after them, in
whole blocks) and bad files are refused up front in one line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "bench_long_context.py"

pytestmark = pytest.mark.skipif(not SCRIPT.exists(), reason="needs the source tree (bench/)")


def run(tmp_path, *args):
    return subprocess.run([sys.executable, str(SCRIPT), "--json", str(tmp_path / "lc.json"), *map(str, args)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)


def shipped_context():
    from clover_cpu.commands.run import shipped_model
    from clover_cpu.config import Config
    from clover_cpu.gguf_file import GGUFFile

    with GGUFFile(shipped_model()) as f:
        c = Config.from_gguf(f)
    return c.context_length, c.block_length


def test_short_run_writes_its_rows(tmp_path):
    r = run(tmp_path, "--lengths", "256", "--new", "4", "--threads", "1")
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "lc.json").read_text())["rows"]
    assert [x["prompt_tokens"] for x in rows] == [256] and rows[0]["new_tokens"] == 4
    assert rows[0]["kv_bytes_per_token"] > 0 and "Clover-35B-A3B shape" in r.stdout


def test_max_is_the_longest_prompt_the_context_holds(tmp_path):
    # a clover file with a short context that is not a multiple of its block length
    from clover_cpu.convert.hf import convert
    from clover_cpu.convert.synthetic import write_random_checkpoint

    write_random_checkpoint(tmp_path / "hf", model_type="clover", seed=3, std=0.2,
                            overrides={"block_length": 8, "max_position_embeddings": 1000})
    convert(tmp_path / "hf", tmp_path / "m.gguf", out_type="q8_0", log=lambda s: None, progress=False)
    r = run(tmp_path, "-m", tmp_path / "m.gguf", "--lengths", "max", "--new", "5", "--threads", "1")
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "lc.json").read_text())["rows"]
    assert [x["prompt_tokens"] for x in rows] == [1000 // 8 * 8 - 5]  # 995 + 5 would end its block at 1000 + 8
    r = run(tmp_path, "-m", tmp_path / "m.gguf", "--lengths", "996", "--new", "5")
    assert r.returncode != 0 and "1 to 995 tokens" in r.stderr


@pytest.mark.parametrize("lengths", [lambda L: "0", lambda L: "-5", lambda L: "abc", lambda L: "²",
                                     lambda L: "8192,,max", lambda L: str(L + 1), lambda L: f"256,{L + 4}"])
def test_lengths_the_context_cannot_hold_are_refused(tmp_path, lengths):
    ctx, B = shipped_context()
    longest = ctx // B * B - 4
    r = run(tmp_path, "--lengths", lengths(longest), "--new", "4")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("error: --lengths") and len(r.stderr.strip().splitlines()) == 1
    assert f"1 to {longest} tokens" in r.stderr and not (tmp_path / "lc.json").exists()  # before any run


@pytest.mark.parametrize("args,msg", [(["--new", "0"], "--new"), (["--new", "200000"], "no room"),
                                      (["-m", "missing.gguf"], "missing.gguf")])
def test_bad_options_and_files_are_one_line(tmp_path, args, msg):
    r = run(tmp_path, "--lengths", "256", *args)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith("error:") and len(r.stderr.strip().splitlines()) == 1 and msg in r.stderr
