"""The training script (train/train_clover.py) end to end on a tiny shape: a few steps of each phase,
export, `clover-cpu convert`, clover_cpu.load; its PyTorch model against transformers' Qwen3.5-MoE and
against the runtime (causal, block-causal, and the two-copy diffusion objective against a speculative
block decoded from committed caches); the chunked delta rule against the recurrence; resuming."""

import copy
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sentencepiece")

from conftest import check_close

import clover_cpu

SCRIPT = Path(__file__).resolve().parent.parent / "train" / "train_clover.py"
# a tiny run: 3 next-token steps, 3 diffusion steps, a 40-file slice of the standard library
TINY = [
    "--preset",
    "tiny",
    "--max-files",
    "40",
    "--ar-steps",
    "3",
    "--diffusion-steps",
    "3",
    "--ar-batch",
    "2",
    "--ar-seq",
    "32",
    "--diff-batch",
    "2",
    "--diff-seq",
    "16",
    "--warmup",
    "2",
    "--log-every",
    "1",
    "--eval-every",
    "3",
    "--threads",
    "1",
    "--lr",
    "1e-2",
    "--diff-lr",
    "1e-2",
]


def load_script():
    spec = importlib.util.spec_from_file_location("train_clover", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tc():
    return load_script()


@pytest.fixture(scope="module")
def run(tc, tmp_path_factory):
    """One tiny training run with an f32 GGUF: (output folder, the PyTorch model as exported)."""
    out = tmp_path_factory.mktemp("train")
    assert tc.main([*TINY, "--out", str(out), "--type", "f32", "--no-eval"]) == 0
    return out, tc.load_exported(out / "hf")


def test_run_writes_everything(run):
    out, model = run
    for name in (
        "tokenizer.model",
        "ckpt.pt",
        "loss.png",
        "plan.json",
        "train.log",
        "clover-small.gguf",
        "hf/config.json",
        "hf/model.safetensors",
        "hf/tokenizer.model",
    ):
        assert (out / name).exists(), name
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cfg = json.loads((out / "hf" / "config.json").read_text())
    assert cfg["model_type"] == "clover" and cfg["shift_logits"] is False
    assert (cfg["mask_token_id"], cfg["bos_token_id"], cfg["eos_token_id"]) == (4, 1, 2)
    log = (out / "train.log").read_text()
    assert "ar 3/3" in log and "diffusion 3/3" in log and "held-out diffusion loss" in log
    m = clover_cpu.load(out / "clover-small.gguf")
    assert m.config.arch == "clover" and m.config.block_length == model.shape.block_length
    assert m.config.mask_token_id == 4 and abs(m.config.threshold - 0.9) < 1e-6


def test_tokenizer(run, tc):
    out, _ = run
    sp = tc.load_sp((out / "tokenizer.model").read_bytes())
    assert [sp.id_to_piece(i) for i in range(5)] == tc.SPECIALS
    text = "def f(x):\n    if x:\n\t\treturn  x  # ü €\n"
    ids = sp.encode(text)
    assert sp.decode(ids) == text  # whitespace and rare characters (byte fallback) survive
    assert sp.encode("x = 1") == sp.encode("\nx = 1")[1:]  # no dummy prefix: a prompt tokenizes like a line
    assert sp.get_piece_size() == 1024
    m = clover_cpu.load(out / "clover-small.gguf")
    assert m.tokenize(text) == ids and m.detokenize(ids) == text


def test_module_matches_transformers(run):
    """Our nn.Module against transformers' Qwen3_5MoeForCausalLM on the same state dict (causal)."""
    transformers = pytest.importorskip("transformers")
    model = copy.deepcopy(run[1])  # its norms are perturbed below
    s = model.shape
    keys = [
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "rms_norm_eps",
        "full_attention_interval",
    ]
    cfg = transformers.Qwen3_5MoeTextConfig(
        **{k: getattr(s, k) for k in keys},
        rope_parameters={
            "rope_type": "default",
            "rope_theta": s.rope_theta,
            "partial_rotary_factor": s.partial_rotary_factor,
        },
    )
    hf = transformers.Qwen3_5MoeForCausalLM(cfg).eval()
    hf.load_state_dict(model.state_dict(), strict=True)  # the same names and shapes: export is a plain save
    with torch.no_grad():  # non-trivial norms and gates, so a swapped layout cannot hide
        for n, p in model.named_parameters():
            if n.endswith("norm.weight") and "linear_attn" not in n:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))) * 0.2)
        hf.load_state_dict(model.state_dict())
        ids = torch.from_numpy(np.random.default_rng(0).integers(0, s.vocab_size, (2, 45)))
        ours, want = model(ids, "causal"), hf(ids).logits
        check_close(ours.numpy(), want.numpy(), 1e-4, "causal vs transformers")
        # block-causal: transformers with an explicit block mask
        T, B = ids.shape[1], s.block_length
        pos = torch.arange(T)
        mask = torch.where((pos[None] // B) <= (pos[:, None] // B), 0.0, float("-inf"))[None, None].expand(
            2, 1, T, T
        )
        check_close(
            model(ids, "block", B).numpy(),
            hf(ids, attention_mask=mask).logits.numpy(),
            1e-4,
            "block vs transformers",
        )


def test_runtime_matches_module(run, tc):
    """The converted file in the runtime (F32 weights and KV) against the PyTorch model: the block-causal
    forward, and the diffusion objective's view of a masked block (two-copy trick) against the runtime
    denoising that block from committed caches."""
    out, model = run
    B = model.shape.block_length
    m = clover_cpu.load(out / "clover-small.gguf", kv_type="f32")
    rng = np.random.default_rng(1)
    ids = rng.integers(5, model.shape.vocab_size, 6 * B)
    with torch.no_grad():
        want = model(torch.from_numpy(ids)[None], "block", B)[0].numpy()
    check_close(m.forward(ids), want, 1e-4, "block-causal forward")
    # two-copy: clean x and a noisy copy with masks in every block
    L = len(ids)
    masked = tc.diffusion_masks(rng, 1, L, B)[0]
    masked[::B] |= True
    noisy = np.where(masked, tc.MASK_ID, ids)
    with torch.no_grad():
        x = torch.from_numpy(np.concatenate([ids, noisy]))[None]
        h = model.hidden(x, tc.Plan.make("two_copy", 2 * L, B))
        two_copy = model.lm_head(h[0, L:]).numpy()
    for b in (0, 2, 5):
        cache = m.new_cache()
        if b:
            m.run(cache, ids[: b * B], commit=True, block=B)
        got = m.run(cache, noisy[b * B : (b + 1) * B], commit=False, block=B)
        check_close(got, two_copy[b * B : (b + 1) * B], 1e-4, f"noisy block {b}")


def test_chunked_delta_rule_matches_recurrence(tc):
    """delta_scan (chunks, states at chunk starts) and delta_blocks_from against the per-token recurrence."""
    g64 = torch.Generator().manual_seed(0)
    N, H, T, dk, dv, C = 2, 3, 21, 8, 5, 4
    q = tc.l2norm(torch.randn(N, H, T, dk, generator=g64, dtype=torch.float64)) * dk**-0.5
    k = tc.l2norm(torch.randn(N, H, T, dk, generator=g64, dtype=torch.float64))
    v = torch.randn(N, H, T, dv, generator=g64, dtype=torch.float64)
    g = -torch.rand(N, H, T, generator=g64, dtype=torch.float64)
    beta = torch.rand(N, H, T, generator=g64, dtype=torch.float64)
    S = torch.zeros(N, H, dk, dv, dtype=torch.float64)
    ref, states = [], []
    for t in range(T):
        if t % C == 0:
            states.append(S.reshape(N * H, dk, dv).clone())
        S = S * g[:, :, t, None, None].exp()
        delta = (v[:, :, t] - (S * k[:, :, t, :, None]).sum(-2)) * beta[:, :, t, None]
        S = S + k[:, :, t, :, None] * delta[:, :, None, :]
        ref.append((S * q[:, :, t, :, None]).sum(-2))
    ref = torch.stack(ref, 2)
    o, starts = tc.delta_scan(q, k, v, g, beta, C)
    check_close(o.numpy(), ref.numpy(), 1e-10, "delta_scan")
    check_close(starts.numpy(), torch.stack(states).numpy(), 1e-10, "chunk start states")
    # every block from its start state, in parallel (T cut to whole blocks)
    n = T // C
    blocks = tc.delta_blocks_from(
        *(tc.to_chunks(t[:, :, : n * C], C) for t in (q, k, v, g, beta)), starts[:n]
    )
    check_close(tc.from_chunks(blocks, N, H).numpy(), ref[:, :, : n * C].numpy(), 1e-10, "blocks from states")


def test_resume_is_exact(tc, tmp_path):
    """Interrupted after 2 steps (and again in the diffusion phase), then resumed: the same weights as one run."""
    import safetensors.torch

    a, b = tmp_path / "a", tmp_path / "b"
    common = [*TINY, "--type", "f32", "--no-eval"]
    assert tc.main([*common, "--out", str(a)]) == 0
    assert tc.main([*common, "--out", str(b), "--stop-after-steps", "2"]) == 0
    assert not (b / "hf").exists()
    assert tc.main([*common, "--out", str(b), "--stop-after-steps", "2"]) == 0  # into the diffusion phase
    assert tc.main([*common, "--out", str(b)]) == 0
    wa = safetensors.torch.load_file(str(a / "hf" / "model.safetensors"))
    wb = safetensors.torch.load_file(str(b / "hf" / "model.safetensors"))
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
    assert "resumed from" in (b / "train.log").read_text()


def test_eval_helpers(run, tc):
    assert tc.parses("def f(x):\n", "    return x\n    y = (1,")  # cut after the last complete line
    assert not tc.parses("def f(x):\n", "return x\n")
    assert not tc.parses("def f(x):\n", "    return (x")  # no complete line: the prompt alone
    out, _ = run
    res = tc.evaluate(
        out, out / "clover-small.gguf", tc.Recipe(diff_seq=16), lambda s: None, n_prompts=2, max_files=40
    )
    assert 0 <= res["masked_token_accuracy"] <= 1
    assert res["prompts"] <= 2 and res["threshold"] == 0.9
    saved = json.loads((out / "eval.json").read_text())
    assert {"tokens_per_forward", "parse_rate", "parse_rate_true", "samples"} <= set(saved)


def test_import_gguf_inverts_the_converter(run, tc):
    """import_gguf (used to test the shipped model) undoes every reordering and transform of the converter:
    the F32 file comes back as the exported weights, with the embedded tokenizer."""
    out, model = run
    back = tc.import_gguf(out / "clover-small.gguf")
    want = model.state_dict()
    for k, v in back.state_dict().items():
        torch.testing.assert_close(v, want[k], rtol=1e-6, atol=1e-6, msg=k)
    assert back.tokenizer_bytes == (out / "hf" / "tokenizer.model").read_bytes()


def test_reference_decoder_matches_runtime(run, tc):
    """The slow PyTorch decoder and the runtime's cached one agree on the tiny model: at 0.9 (one token per
    step, as an untrained model is never sure), at a threshold that the first step's median confidence sets,
    and at a threshold every position passes (each block decided in one step: several tokens per forward);
    a prompt tail heading the first block; a budget ending mid-block."""
    out, model = run
    m = clover_cpu.load(out / "clover-small.gguf", kv_type="f32")
    B = model.shape.block_length
    tail = list(range(7, 10))
    with torch.no_grad():
        x = torch.tensor(tail + [tc.MASK_ID] * (B - len(tail)))[None]
        conf = torch.softmax(model(x, "block", B)[0, len(tail):].double(), -1).max(-1).values
    # just under the median: the runtime's float32 confidence of the median position itself can land an ulp
    # under the float64 one, and it would then commit one token fewer in the first step
    low = float(conf.median()) - 1e-4
    for prompt, threshold, n in ((list(range(5, 5 + 2 * B)), 0.9, 3 * B), (tail, low, 2 * B + 1),
                                 (tail, 1e-9, 2 * B + 1)):
        want = tc.reference_decode(model, prompt, n, threshold)
        got = m.generate_text(prompt, max_new_tokens=n, threshold=threshold, stop_at_eos=True)
        assert got["token_ids"] == want
        if threshold == 1e-9 and len(want) == n:
            assert got["tokens_per_forward"] > 1, got


def test_no_convert_run_travels_through_gpu_pack(tc, tmp_path):
    """--no-convert stops after the export; gpu_pack.py carries runs as a split tar (float16 large tensors,
    float32 the rest) and rebuilds folders that convert and load: an exported run, a run stopped before its
    export (its last checkpoint travels, with the export's config and tokenizer) and a run that left only
    logs (it comes back as logs, the others unharmed)."""
    spec = importlib.util.spec_from_file_location("gpu_pack", SCRIPT.parent / "experiments" / "gpu_pack.py")
    gp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gp)
    data = tmp_path / "data"
    assert tc.main([*TINY, "--out", str(data), "--data-only"]) == 0
    assert sorted(p.name for p in data.iterdir()) == [
        "eval_tokens.npy", "tokenizer.model", "train.log", "train_tokens.npy"
    ]
    runs = {}
    for name, extra in (("run_tiny", ["--no-convert"]), ("run_cut", ["--stop-after-steps", "2"]), ("run_dead", None)):
        run = runs[name] = tmp_path / name
        run.mkdir()
        for f in gp.DATA_FILES:
            (run / f).write_bytes((data / f).read_bytes())
        if extra is None:
            (run / "stdout.txt").write_text("CUDA out of memory\n")
            continue
        assert tc.main([*TINY, "--out", str(run), *extra]) == 0
    assert (runs["run_tiny"] / "hf" / "model.safetensors").exists()
    assert not (runs["run_tiny"] / "clover-small.gguf").exists()
    assert (runs["run_cut"] / "ckpt.pt").exists() and not (runs["run_cut"] / "hf").exists()
    gp.PART = 100_000  # several parts even at this size
    gp.F16_MIN = 4096  # the tiny shape's matrices are below the real threshold
    gp.pack(tmp_path / "back", list(runs.values()))
    assert len(list((tmp_path / "back").glob("pack.tar.*"))) > 1
    back = gp.unpack(tmp_path / "back", tmp_path / "dest", data)
    assert [b.name for b in back] == ["cut", "tiny"]
    assert (tmp_path / "dest" / "dead" / "stdout.txt").read_text() == "CUDA out of memory\n"
    from safetensors.torch import load_file

    for b in back:
        run = runs["run_" + b.name]
        # the run's own log, not the --data-only one of train/data
        assert (b / "train.log").read_text() == (run / "train.log").read_text()
        assert (b / "train_tokens.npy").read_bytes() == (data / "train_tokens.npy").read_bytes()
        if b.name == "tiny":
            want = load_file(str(run / "hf" / "model.safetensors"))
        else:
            want = {k: v.float() for k, v in torch.load(run / "ckpt.pt", weights_only=False)["model"].items()}
            assert (b / "FROM_CHECKPOINT").exists()
        got = load_file(str(b / "hf" / "model.safetensors"))
        assert want.keys() == got.keys()
        halves = 0
        for k, t in want.items():
            assert got[k].dtype == torch.float32
            exp = t.half().float() if t.numel() >= 4096 else t
            assert torch.equal(got[k], exp), k
            halves += t.numel() >= 4096 and not torch.equal(got[k], t)
        assert halves > 10  # the float16 path rounded the large matrices
        tc.convert(b / "hf", b / "clover-small.gguf", "q8_0")
        m = clover_cpu.load(b / "clover-small.gguf")
        assert m.config.vocab_size == 1024


def test_medium_preset_converts_and_matches_the_runtime(tc, tmp_path):
    """The GPU run's `medium` shape (6 attention heads over 2 kv heads, 3 GDN key heads for 6 value heads,
    hidden 384): random weights exported, converted to f32 and loaded; the runtime's block-causal logits
    equal the PyTorch model's."""
    model = tc.Clover(tc.PRESETS["medium"])
    model.init_weights(3)
    model.eval()
    data = tmp_path / "data"
    assert tc.main(["--preset", "tiny", "--max-files", "40", "--out", str(data), "--data-only"]) == 0
    tc.export(model, (data / "tokenizer.model").read_bytes(), tmp_path / "hf")
    tc.convert(tmp_path / "hf", tmp_path / "m.gguf", "f32")
    m = clover_cpu.load(tmp_path / "m.gguf", kv_type="f32")
    B = model.shape.block_length
    ids = np.random.default_rng(2).integers(5, model.shape.vocab_size, 3 * B)
    with torch.no_grad():
        want = model(torch.from_numpy(ids)[None], "block", B)[0].numpy()
    check_close(m.forward(ids), want, 1e-4, "medium: block-causal forward")
