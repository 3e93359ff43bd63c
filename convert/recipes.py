"""llama-quantize's choice of a type for each tensor (llama.cpp b11434, src/llama-quant.cpp
llama_tensor_get_type_impl and tensor_type_fallback), for the low-bit recipes the converter writes: Q3_K_M,
Q3_K_S, Q2_K, IQ4_XS and IQ4_NL. The choice depends on the tensor's category (from its name), on counters over the
tensors in file order (the attn_v-like tensors seen so far), on the layer (parsed from the name) and on
whether an importance matrix is given; a tensor whose rows are not whole blocks falls back to a smaller
block. tests/test_convert_lowbit.py checks the choices against llama-quantize's on the same F16 files.
"""

from __future__ import annotations

import re

# llama.cpp's llama_ftype numbers (general.file_type) and each recipe's base type
FTYPES = {"q2_k": 10, "q3_k_s": 11, "q3_k_m": 12, "iq4_nl": 25, "iq4_xs": 30}
BASE = {"q2_k": "q2_k", "q3_k_s": "q3_k", "q3_k_m": "q3_k", "iq4_nl": "iq4_nl", "iq4_xs": "iq4_xs"}
BLOCK_SIZE = {"f16": 1, "f32": 1, "q8_0": 32, "q4_0": 32, "q5_0": 32, "q5_1": 32, "q4_1": 32, "iq4_nl": 32,
              "q2_k": 256, "q3_k": 256, "q4_k": 256, "q5_k": 256, "q6_k": 256, "iq4_xs": 256}
# tensor_type_fallback: where a 256-block type does not fit the rows
FALLBACK = {"iq4_xs": "iq4_nl", "q2_k": "q4_0", "q3_k": "q4_0", "q4_k": "q5_0", "q5_k": "q5_1", "q6_k": "q8_0"}
_LAYER = re.compile(r"blk\.(\d+)\.")


def category(name: str) -> str:
    """tensor_get_category: output, token_embd, attn_qkv, attn_v, attn_k, attn_q, attn_output, ffn_up,
    ffn_gate, ffn_down or other."""
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for cat in ("attn_qkv", "attn_kv_b", "attn_v", "attn_k", "attn_q", "attn_output"):
        if f"{cat}.weight" in name:
            return cat
    for cat in ("ffn_up", "ffn_gate", "ffn_down"):
        if cat in name:
            return cat
    return "other"


def quantizable(name: str, n_dims: int) -> bool:
    """tensor_allows_quantization, for the tensors a Qwen3.5-MoE or Clover file holds: 2-D and 3-D weights,
    not norms, routers or the conv kernel."""
    return (n_dims >= 2 and name.endswith("weight") and "_norm.weight" not in name
            and "ffn_gate_inp.weight" not in name and "ssm_conv1d" not in name)


def _is_attn_v(cat: str) -> bool:
    return cat in ("attn_v", "attn_qkv", "attn_kv_b")


class LlamaRecipe:
    """Types in llama-quantize's order: call type_of for every tensor of the file, in file order."""

    def __init__(self, recipe: str, names: list[str], n_layer_all: int, n_expert: int, n_gqa: int,
                 has_imatrix: bool):
        if recipe not in FTYPES:
            raise ValueError(f"no llama-quantize recipe for {recipe!r}")
        self.recipe, self.n_layer, self.n_expert, self.n_gqa = recipe, n_layer_all, max(1, n_expert), n_gqa
        self.has_imatrix = has_imatrix
        self.n_attention_wv = sum(_is_attn_v(category(n)) for n in names)
        self.i_attention_wv = 0

    def type_of(self, name: str, n_dims: int, n_cols: int, current: str) -> str:
        """The type llama-quantize gives this tensor (`current`: its type in the input, kept where it is not
        quantized)."""
        if not quantizable(name, n_dims):  # (n_dims as ggml counts them: trailing 1s left out)
            return current
        new = self._choose(name, BASE[self.recipe], n_cols)
        return self._fallback(new, n_cols)

    def _choose(self, name: str, new: str, n_cols: int) -> str:
        r, cat = self.recipe, category(name)
        if cat == "output":
            return "q8_0" if n_cols % BLOCK_SIZE[new] else "q6_k"
        if cat == "token_embd":
            return new
        layer = int(m.group(1)) if (m := _LAYER.search(name)) else 0
        if _is_attn_v(cat):
            if r == "q2_k":
                new = "q4_k" if self.n_gqa >= 4 else "q3_k"
            elif r == "q3_k_m":
                new = "q5_k" if self.i_attention_wv < 2 else "q4_k"
            elif r in ("iq4_nl", "iq4_xs") and self.n_gqa >= 4:
                new = "q5_k"
            if self.n_expert == 8:
                new = "q8_0"
            self.i_attention_wv += 1
        elif cat == "attn_k":
            if self.n_expert == 8:
                new = "q8_0"
        elif cat == "ffn_down":
            n = self.n_layer
            if r == "q2_k":
                new = "q3_k"
            elif r == "q3_k_m":
                new = "q5_k" if layer < n // 16 else "q4_k"  # (use_more_bits only matters for Falcon)
            elif layer < n // 8 and r in ("iq4_nl", "iq4_xs") and not self.has_imatrix:
                new = "q5_k"
        elif cat == "attn_output":
            if self.n_expert == 8:
                if r in ("q2_k", "q3_k_s", "q3_k_m", "iq4_nl", "iq4_xs"):
                    new = "q5_k"
            elif r == "q2_k":
                new = "q3_k"
            elif r == "q3_k_m":
                new = "q4_k"
        return new

    @staticmethod
    def _fallback(new: str, n_cols: int) -> str:
        if n_cols % BLOCK_SIZE[new] == 0:
            return new
        out = FALLBACK.get(new, new)
        return out if n_cols % BLOCK_SIZE[out] == 0 else "f16"

