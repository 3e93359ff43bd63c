"""The model's shape and decoding defaults, read once from a GGUF file's metadata."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .gguf_file import GGUFError, GGUFFile, StringArray

ARCHS = ("clover", "qwen35moe")


def why_not_runnable(g: GGUFFile) -> str | None:
    """Why clover-cpu cannot run this file (one line naming what it holds and what clover-cpu runs), or
    None when its architecture and every tensor type are ones it runs."""
    from .kernels import FORMATS

    arch = g.kv.get("general.architecture")
    name = g.path.name
    if not g.tensors:
        return (f"{name} holds no tensors (a vocabulary-only file): it cannot generate; clover_cpu.load_tokenizer() "
                "reads its tokenizer")
    if arch not in ARCHS:
        what = f"a {arch!r} model" if isinstance(arch, str) else "a model without general.architecture"
        return f"{name} is {what}; clover-cpu runs the architectures {', '.join(ARCHS)}"
    bad: dict[str, list[str]] = {}
    # the MTP blocks after the main ones are not run: their types do not matter
    n_block, n_nextn = g.kv.get(f"{arch}.block_count"), g.kv.get(f"{arch}.nextn_predict_layers")
    unused = ()
    if isinstance(n_block, (int, np.integer)) and isinstance(n_nextn, (int, np.integer)) and 0 < n_nextn < n_block:
        unused = tuple(f"blk.{b}." for b in range(int(n_block - n_nextn), int(n_block)))
    for ti in g.tensors.values():
        if not ti.supported and not ti.name.startswith(unused or ("\0",)):
            bad.setdefault(ti.ggml_type, []).append(ti.name)
    if bad:
        kinds = ", ".join(f"{t} ({len(v)} tensors, e.g. {v[0]})" for t, v in sorted(bad.items()))
        return (f"{name} has tensors of types clover-cpu cannot run yet: {kinds}; it runs "
                f"{', '.join(sorted(t.upper() for t in FORMATS if '_r' not in t))}")
    return None


@dataclass(frozen=True)
class Config:
    arch: str  # "clover" (block diffusion) or "qwen35moe" (autoregressive)
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int  # rotary dims per head (partial NeoX RoPE)
    rope_theta: float
    eps: float
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int
    conv_kernel: int
    n_k_heads: int  # Gated DeltaNet key heads
    n_v_heads: int  # Gated DeltaNet value heads (value head h uses key head h % n_k_heads)
    k_head_dim: int
    v_head_dim: int
    recurrent: tuple[bool, ...]  # per layer: Gated DeltaNet (True) or gated attention (False)
    vocab_size: int
    context_length: int
    bos_token_id: int | None
    eos_token_id: int | None
    mask_token_id: int | None  # clover only
    block_length: int  # clover: diffusion block; qwen35moe: 1
    shift_logits: bool  # position i predicts token i+1 (True) or token i (False)
    threshold: float  # clover's default confidence threshold
    n_nextn: int = 0  # multi-token-prediction (NextN) blocks after the n_layer main ones; decoding does not run them

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.v_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def is_diffusion(self) -> bool:
        return self.arch == "clover"

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> "Config":
        try:
            return cls._from_gguf(g)
        except GGUFError:
            raise
        except (TypeError, ValueError, ZeroDivisionError, OverflowError, AttributeError) as e:
            raise GGUFError(f"bad model metadata ({type(e).__name__}: {e})") from None

    @classmethod
    def _from_gguf(cls, g: GGUFFile) -> "Config":
        arch = g.arch
        if arch not in ARCHS:
            raise GGUFError(f"architecture {arch!r} is not supported (supported: {', '.join(ARCHS)})")
        kv = g.kv

        def get(key, default=None, kind=int):
            full = f"{arch}.{key}"
            if full not in kv:
                if default is None:
                    raise GGUFError(f"missing metadata key {full}")
                return default
            v = kv[full]
            if hasattr(v, "tolist") and not isinstance(v, (int, float)):
                v = v.tolist()
            try:
                return kind(v)
            except (TypeError, ValueError):
                raise GGUFError(f"metadata key {full} has a bad value {v!r}") from None

        n_block = get("block_count")
        if not 1 <= n_block <= 4096:
            raise GGUFError(f"{arch}.block_count must be in [1, 4096], got {n_block}")
        # llama.cpp's converter keeps a Qwen3.5 MTP head as the last block(s): the main forward stops before
        # them, as llama.cpp's does (block_count - nextn_predict_layers)
        n_nextn = get("nextn_predict_layers", 0)
        if not 0 <= n_nextn < n_block:
            raise GGUFError(f"{arch}.nextn_predict_layers = {n_nextn} must be below {arch}.block_count = {n_block}")
        n_layer = n_block - n_nextn
        n_head = get("attention.head_count")
        recurrent = kv.get(f"{arch}.attention.recurrent_layers")
        if recurrent is not None:
            recurrent = tuple(bool(b) for b in list(recurrent))[:n_layer]
        else:
            interval = get("full_attention_interval", 4)
            if interval < 1:
                raise GGUFError(f"{arch}.full_attention_interval must be >= 1, got {interval}")
            recurrent = tuple((i + 1) % interval != 0 for i in range(n_layer))
        if len(recurrent) != n_layer:
            raise GGUFError(f"{arch}.attention.recurrent_layers has {len(recurrent)} entries for {n_layer} layers")
        tokens = kv.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, (list, StringArray)) or not len(tokens):
            raise GGUFError("missing tokenizer.ggml.tokens")

        def token_id(key):
            v = kv.get(key)
            return int(v) if v is not None else None

        k_head_dim = get("ssm.state_size")
        n_v_heads = get("ssm.time_step_rank")
        if n_v_heads <= 0:
            raise GGUFError(f"bad model shape: {arch}.ssm.time_step_rank = {n_v_heads}")
        c = cls(
            arch=arch,
            n_embd=get("embedding_length"),
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=get("attention.head_count_kv", n_head),
            head_dim=get("attention.key_length"),
            n_rot=get("rope.dimension_count"),
            rope_theta=get("rope.freq_base", 10000.0, float),
            eps=get("attention.layer_norm_rms_epsilon", kind=float),
            n_expert=get("expert_count"),
            n_expert_used=get("expert_used_count"),
            n_ff_exp=get("expert_feed_forward_length"),
            n_ff_shexp=get("expert_shared_feed_forward_length"),
            conv_kernel=get("ssm.conv_kernel"),
            n_k_heads=get("ssm.group_count"),
            n_v_heads=n_v_heads,
            k_head_dim=k_head_dim,
            v_head_dim=get("ssm.value_head_dim", get("ssm.inner_size") // n_v_heads),
            recurrent=recurrent,
            vocab_size=len(tokens),
            context_length=get("context_length"),
            bos_token_id=token_id("tokenizer.ggml.bos_token_id"),
            eos_token_id=token_id("tokenizer.ggml.eos_token_id"),
            mask_token_id=token_id("tokenizer.ggml.mask_token_id"),
            block_length=int(kv.get("clover.diffusion.block_length", 32)) if arch == "clover" else 1,
            shift_logits=bool(kv.get("diffusion.shift_logits", arch != "clover")),
            threshold=float(kv.get("clover.diffusion.threshold", 0.95)),
            n_nextn=n_nextn,
        )
        c.validate()
        return c

    def validate(self) -> None:
        for name in ("n_embd", "n_layer", "n_head", "n_head_kv", "head_dim", "n_expert", "n_expert_used", "n_ff_exp",
                     "conv_kernel", "n_k_heads", "n_v_heads", "k_head_dim", "v_head_dim", "block_length"):
            if getattr(self, name) <= 0:
                raise GGUFError(f"bad model shape: {name} = {getattr(self, name)}")
        if self.n_head % self.n_head_kv or self.n_v_heads % self.n_k_heads:
            raise GGUFError("bad model shape: head counts do not divide")
        if self.n_rot % 2 or self.n_rot > self.head_dim:
            raise GGUFError(f"bad model shape: rope.dimension_count {self.n_rot}")
        if self.n_expert_used > self.n_expert:
            raise GGUFError("bad model shape: expert_used_count > expert_count")
        if self.context_length <= 0:
            raise GGUFError(f"bad model shape: context_length = {self.context_length}")
        if not 0 < self.threshold <= 1:
            raise GGUFError(f"bad diffusion threshold {self.threshold} (must be in (0, 1])")
        for name in ("bos_token_id", "eos_token_id"):
            v = getattr(self, name)
            if v is not None and not 0 <= v < self.vocab_size:
                raise GGUFError(f"tokenizer.ggml.{name} = {v} is outside the vocabulary of {self.vocab_size}")
        if self.arch == "clover" and (self.mask_token_id is None or not 0 <= self.mask_token_id < self.vocab_size):
            raise GGUFError("a clover file needs tokenizer.ggml.mask_token_id inside the vocabulary")
