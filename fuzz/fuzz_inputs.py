"""Fuzz everything clover-cpu reads from a file, with atheris (libFuzzer for Python).

Targets (the first argument):
    gguf         clover_cpu.load (header, metadata, tensor table, tokenizer data, model checks), then
                 tokenize / detokenize and a one-token forward when the file loads
    safetensors  the converter's safetensors header reader
    config       the converter's config.json reader
    checkpoint   a whole checkpoint folder (config.json + model.safetensors + tokenizer.model) converted
    template     a chat template (tokenizer.chat_template) compiled and rendered in the sandbox over a
                 conversation with tools, tool calls and reasoning; seeded with real templates

An input passes when it is accepted or refused with the project's own error (a ValueError such as
GGUFError, or ConvertError); any other exception is a finding, and a crash of the C++ extension
(AddressSanitizer / UBSan report, or a signal) too. Seeds are valid tiny files made on first use.

    python fuzz/fuzz_inputs.py gguf -max_total_time=1800                 # 30 minutes
    python fuzz/fuzz_inputs.py gguf --regress tests/fuzz_regressions     # replay saved findings

With the sanitizer build (CLOVER_SANITIZE=ON) preload the runtime: see fuzz/README.md.
Findings are saved by libFuzzer as crash-* files in the working folder; copy them to
tests/fuzz_regressions/TARGET/ so the normal test suite replays them.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEEDS = Path(os.environ.get("CLOVER_FUZZ_SEEDS", Path(tempfile.gettempdir()) / "clover-fuzz-seeds"))
SCRATCH = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
TARGETS = ("gguf", "safetensors", "config", "checkpoint", "template")
# seeds of the template target beside the real templates: small ones that reach the sandbox's limits
TEMPLATE_SEEDS = {
    "loop.jinja": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "tools.jinja": "{% for t in tools %}{{ t | tojson(indent=2) }}{% endfor %}{{ messages | map(attribute='role') "
                   "| join(',') }}{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                   "{% endfor %}{{ ns.n }}{{ raise_exception('x') if ns.n > 99 }}",
    "escape.jinja": "{{ cycler.__init__.__globals__ }}{{ ''.__class__ }}{{ 'x' * 9 }}{{ 'x' | center(9) }}",
    "macro.jinja": "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{% endif %}.{% endmacro %}{{ f(5) }}{{ '%5s' % 'a' }}",
}
FUZZ_MESSAGES = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi <|im_end|>"},
                 {"role": "assistant", "content": "<think>r</think>ok", "tool_calls": [
                     {"type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": [1, {"c": "d"}]}}}]},
                 {"role": "tool", "content": "42"}, {"role": "user", "content": "again"}]
FUZZ_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "a": {"type": "integer"}}}}}]


def make_seeds(target: str) -> Path:
    """Valid tiny inputs for a target, made once (a random tiny checkpoint and its GGUF conversions)."""
    out = SEEDS / target
    if out.exists() and any(out.iterdir()):
        return out
    from clover_cpu.convert.hf import convert
    from clover_cpu.convert.synthetic import write_random_checkpoint

    out.mkdir(parents=True, exist_ok=True)
    if target == "template":
        cache = Path(os.environ.get("CLOVER_TEST_CACHE") or Path.home() / ".cache" / "clover-cpu-tests")
        for f in sorted(cache.glob("llama.cpp-*/models/templates/*.jinja")):  # real templates, where fetched
            (out / f.name).write_bytes(f.read_bytes())
        for name, text in TEMPLATE_SEEDS.items():
            (out / name).write_text(text)
        return out
    work = SEEDS / "work"
    overrides = dict(hidden_size=32, head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16,
                     moe_intermediate_size=32, shared_expert_intermediate_size=32, vocab_size=512, num_experts=4)
    for name, kw in (("clover", dict(model_type="clover")),
                     ("qwen", dict(model_type="qwen3_5_moe", tokenizer="bpe", dtype="f32"))):
        ck = work / name
        if not (ck / "config.json").exists():
            write_random_checkpoint(ck, preset="tiny", seed=1, overrides=overrides, **kw)
        if target == "gguf":
            for t in ("q8_0", "f16") if name == "clover" else ("q4_k_m",):
                convert(ck, out / f"{name}-{t}.gguf", out_type=t, log=lambda s: None, progress=False, force=True)
        elif target == "safetensors":
            (out / f"{name}.safetensors").write_bytes((ck / "model.safetensors").read_bytes())
        elif target == "config":
            (out / f"{name}.json").write_bytes((ck / "config.json").read_bytes())
        elif target == "checkpoint":
            (out / f"{name}.bin").write_bytes(pack_folder(ck))
    return out


# ---- a checkpoint folder as one input: [u32 length][bytes] for config.json, model.safetensors, tokenizer ----

FOLDER_FILES = ("config.json", "model.safetensors", "tokenizer.model", "tokenizer.json")


def pack_folder(d: Path) -> bytes:
    out = b""
    for name in FOLDER_FILES:
        b = (d / name).read_bytes() if (d / name).exists() else b""
        out += len(b).to_bytes(4, "little") + b
    return out


def unpack_folder(data: bytes, d: Path) -> None:
    i = 0
    for name in FOLDER_FILES:
        n = int.from_bytes(data[i : i + 4].ljust(4, b"\0"), "little")
        b = data[i + 4 : i + 4 + n]
        i += 4 + n
        if b:
            (d / name).write_bytes(b)


# ---- a structure-aware mutator for GGUF: overwrite one header field with a hostile value ----

_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_fields(data: bytes) -> list[tuple[int, int]]:
    """(offset, size) of every integer field of a GGUF header (counts, lengths, types, dims, offsets),
    walking as far as the bytes allow."""
    fields, i = [], 4

    def u(n):
        nonlocal i
        if i + n > len(data):
            raise IndexError
        fields.append((i, n))
        v = int.from_bytes(data[i : i + n], "little")
        i += n
        return v

    def skip(n):
        nonlocal i
        if n > len(data) - i:
            raise IndexError
        i += n

    try:
        u(4)
        n_tensors, n_kv = u(8), u(8)
        for _ in range(min(n_kv, 1 << 16)):
            skip(u(8))  # key
            t = u(4)
            if t == 8:
                skip(u(8))
            elif t == 9:
                at, n = u(4), u(8)
                for _ in range(min(n, 1 << 20)):
                    if at == 8:
                        skip(u(8)) if len(fields) < 4096 else skip(int.from_bytes(data[i : i + 8], "little") + 8)
                    else:
                        skip(_SIZES.get(at, 0))
            else:
                fields.append((i, _SIZES.get(t, 1)))
                skip(_SIZES.get(t, 0))
        for _ in range(min(n_tensors, 1 << 16)):
            skip(u(8))
            for _ in range(min(u(4), 8)):
                u(8)
            u(4)
            u(8)
    except IndexError:
        pass
    return fields


HOSTILE = [0, 1, 2, 3, 31, 32, 33, 255, 256, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 32,
           (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


def gguf_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    import random

    import atheris

    rng = random.Random(seed)
    fields = gguf_fields(data) if data[:4] == b"GGUF" and rng.random() < 0.6 else []
    if not fields:
        return atheris.Mutate(data, max_size)
    off, n = rng.choice(fields)
    v = rng.choice(HOSTILE + [len(data), len(data) - off, int.from_bytes(data[off : off + n], "little") + rng.choice((-1, 1))])
    b = (v % (1 << (8 * n))).to_bytes(n, "little")
    return data[:off] + b + data[off + n :]


# ---- the targets: bytes in, the project's own error or success out ----


def run_gguf(data: bytes) -> None:
    import clover_cpu

    path = SCRATCH / f"clover-fuzz-{os.getpid()}.gguf"
    path.write_bytes(data)
    try:
        m = clover_cpu.load(path, threads=1, ctx_len=64)
    except ValueError:
        return
    try:
        ids = m.tokenize("def f(x):\n    return x  # \u00e9\u4e2d")
        m.detokenize(ids + [0, m.config.vocab_size - 1])
        m.forward(ids[:2] or [0])
    except ValueError:
        pass
    finally:
        m.close()


def run_safetensors(data: bytes) -> None:
    from clover_cpu.convert.errors import ConvertError
    from clover_cpu.convert.safetensors_lazy import close_files, read_header

    path = SCRATCH / f"clover-fuzz-{os.getpid()}.safetensors"
    path.write_bytes(data)
    try:
        tensors = read_header(path)
        for t in list(tensors.values())[:4]:  # read what the header promises: bounds were checked
            if t.dtype in ("BF16", "F16", "F32") and t.numel < 1 << 16:
                t.full()
    except ConvertError:
        pass
    finally:
        close_files()


def run_config(data: bytes) -> None:
    from clover_cpu.convert.config import load_config
    from clover_cpu.convert.errors import ConvertError

    d = SCRATCH / f"clover-fuzz-{os.getpid()}-cfg"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_bytes(data)
    try:
        load_config(d)
    except ConvertError:
        pass


def run_checkpoint(data: bytes) -> None:
    import shutil

    from clover_cpu.convert.errors import ConvertError
    from clover_cpu.convert.hf import convert
    from clover_cpu.convert.safetensors_lazy import close_files

    d = SCRATCH / f"clover-fuzz-{os.getpid()}-ckpt"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    unpack_folder(data, d)
    try:
        convert(d, d / "out.gguf", out_type="q8_0", log=lambda s: None, progress=False, threads=1)
        run_gguf((d / "out.gguf").read_bytes())
    except ConvertError:
        pass
    finally:
        close_files()


def run_template(data: bytes) -> None:
    from clover_cpu.chat import ChatTemplate, ChatTemplateError

    try:
        # in this process, so that the fuzzer sees the sandbox's code (run --chat renders in a process of its own)
        tpl = ChatTemplate(data.decode("utf-8", errors="replace"), time_limit=0.2, isolate=False)
        tpl.render(FUZZ_MESSAGES, tools=FUZZ_TOOLS, add_generation_prompt=True, mark=True, enable_thinking=False)
    except ChatTemplateError:
        pass


RUN = {"gguf": run_gguf, "safetensors": run_safetensors, "config": run_config, "checkpoint": run_checkpoint,
       "template": run_template}


def regress(target: str, folder: Path) -> int:
    """Replay saved inputs (folder/TARGET/*); returns how many there were."""
    files = sorted((folder / target).glob("*")) if (folder / target).is_dir() else []
    for f in files:
        RUN[target](f.read_bytes())
    return len(files)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        print(f"usage: python fuzz/fuzz_inputs.py {{{','.join(TARGETS)}}} [--regress DIR | libFuzzer flags] [CORPUS]",
              file=sys.stderr)
        return 2
    target = sys.argv[1]
    if len(sys.argv) > 2 and sys.argv[2] == "--regress":
        n = regress(target, Path(sys.argv[3]))
        print(f"{target}: {n} saved inputs replayed, no finding")
        return 0
    import atheris

    with atheris.instrument_imports(include=["clover_cpu"]):  # coverage feedback from the project's Python
        import clover_cpu  # noqa: F401
        import clover_cpu.convert.config  # noqa: F401
        import clover_cpu.convert.hf  # noqa: F401
        import clover_cpu.convert.safetensors_lazy  # noqa: F401
        import clover_cpu.gguf_file  # noqa: F401
        import clover_cpu.model  # noqa: F401
        import clover_cpu.chat  # noqa: F401
        import clover_cpu.tokenizer  # noqa: F401
    seeds = make_seeds(target)
    corpus = Path(os.environ.get("CLOVER_FUZZ_CORPUS", SEEDS / f"corpus-{target}"))
    corpus.mkdir(parents=True, exist_ok=True)
    for f in seeds.iterdir():  # the corpus starts from the seeds and keeps what libFuzzer finds interesting
        if not (corpus / f.name).exists():
            (corpus / f.name).write_bytes(f.read_bytes())
    args = [sys.argv[0], *[a for a in sys.argv[2:]], str(corpus)]
    if not any(a.startswith("-max_len") for a in args):
        args.insert(1, f"-max_len={max(f.stat().st_size for f in corpus.iterdir()) + 64}")
    if not any(a.startswith("-rss_limit_mb") for a in args):
        args.insert(1, "-rss_limit_mb=4096")
    fn = RUN[target]

    def one_input(data: bytes) -> None:
        fn(data)

    atheris.Setup(args, one_input, custom_mutator=gguf_mutator if target == "gguf" else None)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
