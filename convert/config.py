"""The model's shape, read from a Hugging Face config.json (flat or nested under text_config)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConvertError

SUPPORTED = ("clover", "qwen3_5_moe", "qwen3_5_moe_text")


@dataclass
class ModelConfig:
    model_type: str  # one of SUPPORTED
    n_embd: int  # hidden_size
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_theta: float
    partial_rotary_factor: float
    n_k_heads: int  # linear_num_key_heads (GDN)
    n_v_heads: int  # linear_num_value_heads
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int  # moe_intermediate_size
    n_ff_shexp: int  # shared_expert_intermediate_size
    vocab_size: int
    rms_norm_eps: float
    context_length: int
    layer_types: list[str]  # "linear_attention" | "full_attention" per layer
    tie_word_embeddings: bool = False
    n_mtp: int = 0  # mtp_num_hidden_layers: multi-token-prediction layers (mtp.* tensors) after the main ones
    mrope_section: list[int] = field(default_factory=lambda: [11, 11, 10, 0])
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    # diffusion (clover only)
    mask_token_id: int | None = None
    block_length: int = 32
    shift_logits: bool = False
    threshold: float = 0.95

    @property
    def arch(self) -> str:
        return "clover" if self.model_type == "clover" else "qwen35moe"

    @property
    def n_rot(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.v_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def is_recurrent(self, i: int) -> bool:
        """Whether layer i is Gated DeltaNet; the MTP layers after the main ones are attention layers."""
        return i < self.n_layer and self.layer_types[i] == "linear_attention"


def _get(cfg: dict, key: str, where: str, default=None, required: bool = True):
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if not required:
        return default
    raise ConvertError(f"{where}: missing key {key!r}")


def load_config(src: Path) -> ModelConfig:
    path = src / "config.json"
    if not path.exists():
        raise ConvertError(f"no config.json in {src}")
    try:
        top = json.loads(path.read_text())
        if not isinstance(top, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ConvertError(f"malformed config.json: {e}") from None
    model_type = top.get("model_type")
    if not isinstance(model_type, str) or model_type not in SUPPORTED:
        raise ConvertError(f"unsupported model_type {model_type!r} (supported: {', '.join(SUPPORTED)})")
    text = top.get("text_config") or {}
    if not isinstance(text, dict):
        raise ConvertError("malformed config.json: text_config is not an object")
    cfg = dict(text)
    # keys of the top level fill what the text config lacks (flat configs have everything there)
    for k, v in top.items():
        if k != "text_config":
            cfg.setdefault(k, v)
    where = "config.json"
    try:
        n_layer = int(_get(cfg, "num_hidden_layers", where))
        if not 1 <= n_layer <= 4096:
            raise ValueError(f"num_hidden_layers must be in [1, 4096], got {n_layer}")
        layer_types = cfg.get("layer_types")
        if layer_types is None:
            interval = int(cfg.get("full_attention_interval", 4))
            if interval < 1:
                raise ValueError(f"full_attention_interval must be >= 1, got {interval}")
            layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layer)]
        if len(layer_types) != n_layer or any(t not in ("linear_attention", "full_attention") for t in layer_types):
            raise ConvertError(f"{where}: layer_types must list {n_layer} of linear_attention / full_attention")
        rope = cfg.get("rope_parameters") or {}
        rope_theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        partial = float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25)))
        mrope = list(rope.get("mrope_section") or cfg.get("mrope_section") or [11, 11, 10])
        mrope = (mrope + [0, 0, 0, 0])[:4]
        hidden = int(_get(cfg, "hidden_size", where))
        n_head = int(_get(cfg, "num_attention_heads", where))
        eos = cfg.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        c = ModelConfig(
            model_type=model_type,
            n_embd=hidden,
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=int(_get(cfg, "num_key_value_heads", where)),
            head_dim=int(cfg.get("head_dim") or hidden // n_head),
            rope_theta=rope_theta,
            partial_rotary_factor=partial,
            n_k_heads=int(_get(cfg, "linear_num_key_heads", where)),
            n_v_heads=int(_get(cfg, "linear_num_value_heads", where)),
            k_head_dim=int(_get(cfg, "linear_key_head_dim", where)),
            v_head_dim=int(_get(cfg, "linear_value_head_dim", where)),
            conv_kernel=int(_get(cfg, "linear_conv_kernel_dim", where)),
            n_expert=int(_get(cfg, "num_experts", where)),
            n_expert_used=int(_get(cfg, "num_experts_per_tok", where)),
            n_ff_exp=int(_get(cfg, "moe_intermediate_size", where)),
            n_ff_shexp=int(_get(cfg, "shared_expert_intermediate_size", where)),
            vocab_size=int(_get(cfg, "vocab_size", where)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            context_length=int(cfg.get("max_position_embeddings", 131072)),
            layer_types=list(layer_types),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            n_mtp=int(cfg.get("mtp_num_hidden_layers") or 0),
            mrope_section=[int(v) for v in mrope],
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=eos,
            pad_token_id=cfg.get("pad_token_id"),
            mask_token_id=cfg.get("mask_token_id"),
            block_length=int(cfg.get("block_length", 32)),
            shift_logits=bool(cfg.get("shift_logits", False)),
            threshold=float(cfg.get("threshold", 0.95)),
        )
    except (TypeError, ValueError, AttributeError, OverflowError, KeyError, IndexError, ZeroDivisionError) as e:
        raise ConvertError(f"{where}: bad value ({type(e).__name__}: {e})") from None
    _validate(c)
    return c


def _validate(c: ModelConfig) -> None:
    positive = {
        "hidden_size": c.n_embd, "num_hidden_layers": c.n_layer, "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_head_kv, "head_dim": c.head_dim, "linear_num_key_heads": c.n_k_heads,
        "linear_num_value_heads": c.n_v_heads, "linear_key_head_dim": c.k_head_dim,
        "linear_value_head_dim": c.v_head_dim, "linear_conv_kernel_dim": c.conv_kernel, "num_experts": c.n_expert,
        "num_experts_per_tok": c.n_expert_used, "moe_intermediate_size": c.n_ff_exp, "vocab_size": c.vocab_size,
    }
    for key, v in positive.items():
        if v <= 0:
            raise ConvertError(f"config.json: {key} must be positive, got {v}")
    if not 0 <= c.n_mtp <= 16:
        raise ConvertError(f"config.json: mtp_num_hidden_layers must be in [0, 16], got {c.n_mtp}")
    if c.n_head % c.n_head_kv:
        raise ConvertError("config.json: num_attention_heads must be a multiple of num_key_value_heads")
    if c.n_v_heads % c.n_k_heads:
        raise ConvertError("config.json: linear_num_value_heads must be a multiple of linear_num_key_heads")
    if c.n_expert_used > c.n_expert:
        raise ConvertError("config.json: num_experts_per_tok exceeds num_experts")
    if c.n_rot % 2 or c.n_rot > c.head_dim:
        raise ConvertError(f"config.json: rotary dims {c.n_rot} must be even and at most head_dim")
    if c.model_type == "clover":
        if c.mask_token_id is None:
            raise ConvertError("config.json: a clover model needs mask_token_id")
        if c.block_length < 1:
            raise ConvertError("config.json: block_length must be >= 1")
        if not 0 < c.threshold <= 1:
            raise ConvertError("config.json: threshold must be in (0, 1]")
