"""The hybrid MoE forward pass (Qwen3.5-MoE backbone, Clover's block-causal attention) over a
memory-mapped GGUF, with exact caches: attention KV and Gated DeltaNet recurrent + conv state.

    x = embed[ids]
    for each layer: x += mixer(rmsnorm(x)); x += moe(rmsnorm(x))     # mixer: GDN or gated attention
    logits = lm_head(rmsnorm(x))

Spans run either speculatively (read the committed caches, write nothing) or committed (write
them), so a block-diffusion decoder can denoise a block many times and commit it once.
"""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass, field

try:
    import resource  # major page faults (POSIX)
except ImportError:
    resource = None

import numpy as np

from . import kernels, ops
from .config import Config, why_not_runnable
from .gguf_file import GGUFError, GGUFFile
from .tokenizer import Tokenizer

# ---- the math: every operator runs in C++ (clover_cpu.ops, clover_cpu.kernels) ----


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last axis (w already holds 1 + w for zero-centred norms)."""
    return ops.rms_norm(np.ascontiguousarray(x, dtype=np.float32), w, eps)


# ---- weights and caches ----


@dataclass
class Matrix:
    """A 2-D weight in GGUF layout: rows of `fmt` blocks, multiplied by the C++ kernels."""

    data: np.ndarray  # uint8 [rows, row_bytes] (a view of the mapped file)
    fmt: str

    def __matmul__(self, x: np.ndarray) -> np.ndarray:  # W @ x^T, written x @ W^T
        raise TypeError("use mat(x, W)")


def mat(x: np.ndarray, w: Matrix) -> np.ndarray:
    """x [T, K] @ W^T -> [T, rows]."""
    return kernels.matmul(np.ascontiguousarray(x, dtype=np.float32), w.data, w.fmt)


def pair(w: Matrix) -> tuple[np.ndarray, str]:
    return w.data, w.fmt


def mats(x: np.ndarray, *ws: Matrix) -> list[np.ndarray]:
    """[mat(x, w) for w in ws], in one call: x quantized once, one pass of the thread pool."""
    return kernels.matmul_many(np.ascontiguousarray(x, dtype=np.float32), [pair(w) for w in ws])


@dataclass
class Experts:
    data: np.ndarray  # uint8 [E, rows, row_bytes]
    fmt: str


def aligned_zeros(shape, align: int = 64) -> np.ndarray:
    """float32 zeros whose data starts on an `align`-byte boundary (the recurrent GDN kernel runs
    1.6x slower on a state that is only 16-byte aligned)."""
    n = int(np.prod(shape))
    buf = np.zeros(n + align // 4, np.float32)
    skip = (-buf.ctypes.data % align) // 4
    return buf[skip : skip + n].reshape(shape)


@dataclass(eq=False)  # (a cache is one sequence's: equal only to itself)
class Cache:
    """Per sequence: attention keys/values (F16 by default, F32 or Q8_0 blocks) per attention layer, GDN
    recurrent state and conv state (F32) per GDN layer. `n` tokens are committed; positions are 0..n-1."""

    # layer -> [capacity, n_head_kv, head_dim] (f16/f32), or uint8 [capacity, n_head_kv, head_dim/32*34]
    # (Q8_0: ggml's block_q8_0, an fp16 scale then 32 int8 per 32 values)
    k: dict[int, np.ndarray] = field(default_factory=dict)
    v: dict[int, np.ndarray] = field(default_factory=dict)
    ssm: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> [Hv, dk, dv]
    conv: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> [K-1, conv_dim]
    n: int = 0
    capacity_limit: int = 0
    tokens: list = field(default_factory=list)  # the committed token ids (positions 0..n-1)
    # the block grid the committed positions were written on (None: causal attention); set by the decoder
    block: int | None = None
    # checkpoints (`mark`): length -> the GDN / conv states there (two dicts like ssm / conv), so that the
    # cache can go back to one (`rewind`) after later commits; attention rows before it are never written
    # again. At most MAX_MARKS: the first (a conversation's start, which others may share) and the newest.
    marks: dict[int, tuple[dict, dict]] = field(default_factory=dict)
    spare: list = field(default_factory=list, repr=False)  # dropped checkpoints' buffers, for the next ones

    def reserve(self, layer: int, n_total: int, row_shape: tuple[int, int], dtype) -> None:
        """Grow the KV arrays of a layer to hold n_total rows of row_shape (doubling: allocated lazily up to
        the context)."""
        if n_total > self.capacity_limit:
            raise ValueError(f"context full: {n_total} tokens exceed the context length {self.capacity_limit}")
        cur = self.k.get(layer)
        if cur is not None and cur.shape[0] >= n_total:
            return
        cap = max(64, cur.shape[0] if cur is not None else 0)
        while cap < n_total:
            cap *= 2
        cap = min(cap, self.capacity_limit)
        for store in (self.k, self.v):
            new = np.zeros((cap, *row_shape), dtype)
            if layer in store:
                new[: self.n] = store[layer][: self.n]
            store[layer] = new

    def gdn_state(self, layer: int, c) -> tuple[np.ndarray, np.ndarray]:
        """The conv state [K-1, conv_dim] and recurrent state [Hv, dk, dv] of a GDN layer (zeros at first)."""
        if layer not in self.ssm:
            self.conv[layer] = np.zeros((c.conv_kernel - 1, c.conv_dim), np.float32)
            self.ssm[layer] = aligned_zeros((c.n_v_heads, c.k_head_dim, c.v_head_dim))
        return self.conv[layer], self.ssm[layer]

    def clear(self) -> None:
        """Back to an empty context, keeping the memory: KV rows are simply no longer committed and GDN
        states are zeroed in place. A fresh Cache costs page faults on its first writes (about 0.17 s for
        the 35B shape's 60 MB of GDN state on a 2-core x86 VM); a cleared one does not."""
        self.n = 0
        self.tokens = []
        self.block = None
        self._drop_marks(0)
        for a in (*self.ssm.values(), *self.conv.values()):
            a[...] = 0

    @property
    def mark_n(self) -> int | None:
        """The newest checkpoint's length (None: no checkpoint)."""
        return max(self.marks) if self.marks else None

    def _drop_marks(self, above: int) -> None:
        for n in [m for m in self.marks if m > above]:
            self.spare.append(self.marks.pop(n))
        del self.spare[MAX_MARKS:]

    def mark(self) -> None:
        """Checkpoint the current length: `rewind(n)` can later come back to it. Copies the recurrent and
        conv states (the only state a later commit overwrites; attention rows are append-only) into
        buffers kept from dropped checkpoints, so a checkpoint per request costs a copy, not page faults.
        Beyond MAX_MARKS the second oldest goes: the first stays (a conversation's start: its system
        prompt and tools, which a new conversation may share), and the newest (where its next turn goes
        on)."""
        if self.n in self.marks:  # (the same tokens: the same states)
            return
        if len(self.marks) >= MAX_MARKS:
            self.spare.append(self.marks.pop(sorted(self.marks)[1]))  # (MAX_MARKS >= 2: the first stays)
        ssm, conv = self.spare.pop() if self.spare else ({}, {})
        _copy_states(self.ssm, ssm)
        _copy_states(self.conv, conv)
        self.marks[self.n] = (ssm, conv)

    def reusable(self, prompt, block: int | None, grid: int, leave_last: bool) -> int:
        """How many of `prompt`'s tokens this cache can keep: all it holds, else its newest checkpoint that
        is a prefix of the prompt, on the decoder's grid (`block`: the block mode it writes with, `grid`:
        its block length); leave_last keeps the prompt's last token to read (with shifted logits its
        logits predict the first new token). 0: none (the cache must be cleared)."""
        if not self.n or self.block != block:
            return 0
        limit = min(self.n, len(prompt) - (1 if leave_last else 0))
        if limit <= 0:
            return 0
        differ = np.flatnonzero(np.asarray(self.tokens[:limit]) != np.asarray(prompt[:limit], dtype=np.int64))
        common = int(differ[0]) if differ.size else limit
        for n in (self.n, *sorted(self.marks, reverse=True)):
            if n and n <= common and n % grid == 0:
                return n
        return 0

    def rewind(self, n: int) -> None:
        """Back to length n: the current length, a checkpoint (the later ones are dropped), or 0 (a
        cleared cache)."""
        if n == self.n:
            return
        if n == 0:
            self.clear()
            return
        if n not in self.marks or n > self.n:
            marks = ", ".join(map(str, sorted(self.marks))) or "none"
            raise ValueError(f"the cache can go back to a checkpoint ({marks}) or to 0, not to {n}")
        ssm, conv = self.marks[n]
        _copy_states(ssm, self.ssm)
        _copy_states(conv, self.conv)
        self.n = n
        del self.tokens[n:]
        self._drop_marks(n)

    def copy_prefix(self, src: "Cache", n: int) -> None:
        """Become the first n positions of `src` (its length or one of its checkpoints), checkpointed there,
        leaving src as it is: a new conversation that shares another's start (a system prompt, tools) reads
        only the rest, and the other conversation keeps its cache. Costs a copy of n attention rows per
        attention layer and of the recurrent and conv states."""
        if n != src.n and n not in src.marks:
            raise ValueError(f"{n} is neither the length of the cache nor one of its checkpoints")
        self.clear()
        self.capacity_limit = self.capacity_limit or src.capacity_limit  # (a bare Cache(): set by a run)
        for layer, k in src.k.items():
            self.reserve(layer, n, k.shape[1:], k.dtype)
            self.k[layer][:n] = k[:n]
            self.v[layer][:n] = src.v[layer][:n]
        ssm, conv = (src.ssm, src.conv) if n == src.n else src.marks[n]
        _copy_states(ssm, self.ssm)
        _copy_states(conv, self.conv)
        self.n, self.tokens, self.block = n, list(src.tokens[:n]), src.block
        self.mark()

    def snapshot(self) -> "Cache":
        """A copy that later `restore` can return to (for a chat that continues)."""
        return self._copy()

    def restore(self, snap: "Cache") -> None:
        self.__dict__.update(snap._copy().__dict__)

    def _copy(self) -> "Cache":
        def states(d):
            out = {}
            _copy_states(d, out)
            return out

        return Cache(k={i: a.copy() for i, a in self.k.items()}, v={i: a.copy() for i, a in self.v.items()},
                     ssm=states(self.ssm), conv=states(self.conv), n=self.n,
                     capacity_limit=self.capacity_limit, tokens=list(self.tokens), block=self.block,
                     marks={n: (states(s), states(c)) for n, (s, c) in self.marks.items()})


MAX_MARKS = 2  # checkpoints a Cache keeps (each a copy of the recurrent and conv states: 66 MB, bench model)


def _copy_states(src: dict, dst: dict) -> None:
    """Copy a layer -> state dict into dst's arrays, making (64-byte aligned) ones where dst has none of
    that shape."""
    for i, a in src.items():
        if i not in dst or dst[i].shape != a.shape:
            dst[i] = aligned_zeros(a.shape) if a.dtype == np.float32 else np.zeros_like(a)
        np.copyto(dst[i], a)


# ---- the model ----

KV_TYPES = {"f16": np.float16, "f32": np.float32, "q8_0": np.uint8}  # attention cache element types
PREFETCH_MODES = ("auto", "on", "off")  # routed experts not in memory: read ahead (csrc/ops.cpp)
PREFETCH_QUIET = 8  # auto: forwards without a disk read before the residency checks stop
REPACK_MODES = ("auto", "on", "off")  # q4_k / q3_k / iq4_xs weights -> their _r16 layouts at load
REPACK_SHARE = 0.5  # auto: only a file that takes at most this share of the memory available


def memory_for_files() -> int | None:
    """Bytes of page cache a mapped file can have: MemAvailable (physical memory where there is no
    /proc/meminfo), capped by this process's cgroup memory limit. None if unknown."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            return None
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                hid, controllers, path = line.rstrip("\n").split(":", 2)
                if hid == "0":
                    limit = f"/sys/fs/cgroup{path}/memory.max"
                elif "memory" in controllers.split(","):
                    limit = f"/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"
                else:
                    continue
                try:
                    with open(limit) as g:
                        value = g.read().strip()
                except OSError:
                    continue
                if value.isdigit():
                    avail = min(avail, int(value))
    except (OSError, ValueError):
        pass
    return avail


def _disk_reads() -> tuple[int, int]:
    """(major page faults of this process, experts requested from the disk): either moving means
    weights came from the disk."""
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt if resource else 0
    return faults, kernels.experts_prefetched()


class Model:
    """A Clover or Qwen3.5-MoE model from a GGUF file, mapped in place."""

    def __init__(self, path, *, threads: int | None = None, ctx_len: int | None = None, kv_type: str = "f16",
                 prefetch: str = "auto", repack: str = "auto"):
        from . import set_num_threads

        if threads is not None:
            if threads < 0:
                raise ValueError("threads must be >= 0")
            set_num_threads(threads)
        if kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {', '.join(KV_TYPES)}")
        self.kv_type, self.kv_dtype = kv_type, KV_TYPES[kv_type]
        if prefetch not in PREFETCH_MODES:
            raise ValueError(f"prefetch must be one of {', '.join(PREFETCH_MODES)}")
        self.prefetch = prefetch
        if repack not in REPACK_MODES:
            raise ValueError(f"repack must be one of {', '.join(REPACK_MODES)}")
        # True: each token mixer (GDN or attention) and each feed-forward runs as one C++ call
        # (csrc/layers.h); False: the operator-by-operator Python code below (_gated_deltanet, _attention,
        # _moe), the same results bit for bit.
        self.fused = True
        self._costs = {}  # block length -> forward cost curve (mode auto), read or measured on first use
        self._fallback_template = None  # the template conversations are rendered with where the file has none
        self.file = GGUFFile(path)
        try:
            reason = why_not_runnable(self.file)
            if reason:
                raise GGUFError(reason)
            # auto: only when the page cache cannot hold the whole file (a model larger than the free
            # memory). Then the routed experts' residency is checked from the start, and no longer after
            # PREFETCH_QUIET forwards without a page read from the disk; a major page fault or an expert
            # requested from the disk turns the checks back on (prefetch_experts in csrc/ops.cpp). A file
            # that fits is left to page faults: their readahead windows also bring in the neighbouring
            # experts that later tokens use, which paid off on a cold Clover-35B-shape file that fits
            # (bench/NOTES.md change 32).
            room = memory_for_files()
            self._auto = prefetch == "auto" and room is not None and self.file.file_size > room
            self._prefetching, self._quiet, self._reads = prefetch == "on" or self._auto, 0, _disk_reads()
            # q4_k, q3_k, q2_k, q5_k, q6_k, iq4_xs, iq3_xxs, iq3_s, iq4_nl and mxfp4 layer weights repacked into
            # memory of their own (16 rows per group: the kernels keep a row per vector lane), the file's pages
            # released as each is done. auto: each format where the kernels have a product of their own for its repacked
            # layout (q4_k, iq4_xs, iq4_nl, mxfp4, iq3_xxs, iq3_s: AVX2 and the tables built on it, NEON with
            # sdot; q3_k: AVX2 and the tables built on it; q2_k: AVX-512; q5_k, q6_k: AVX2) and the
            # file takes at most REPACK_SHARE of the memory available (a larger model pages from its file
            # instead: the copy could not be evicted). The same weights; results differ from the file
            # layout's in float rounding only.
            native = [f for f in kernels.R16_FORMATS if kernels.has_native_r16(f)]
            if repack == "on" and not native:
                from . import system_info

                raise ValueError(f"repack on needs the AVX2, AVX-512 or NEON dot-product kernels, and the "
                                 f"kernels in use are {system_info()['isa']}: use repack='auto' or 'off' "
                                 "(run --repack auto|off)")
            want_repack = native if (repack == "on" or (
                repack == "auto" and room is not None and self.file.file_size <= REPACK_SHARE * room)) else []
            self.config = Config.from_gguf(self.file)
            D = self.config.head_dim
            if kv_type == "q8_0" and D % 32:
                raise ValueError(f"kv_type q8_0 needs a head dim that is a multiple of 32; this model's is {D}: "
                                 "use f16")
            self.kv_row = (self.config.n_head_kv, D // 32 * 34 if kv_type == "q8_0" else D)
            if ctx_len is not None and ctx_len < 1:
                raise ValueError("ctx_len must be >= 1")
            self.ctx_len = min(ctx_len or self.config.context_length, self.config.context_length)
            self._load_weights(want_repack)
            self.tokenizer = Tokenizer.from_gguf(self.file.kv)
        except Exception:
            self.file.close()
            raise

    # -- loading: every tensor checked by name, type and shape before use --

    def _tensor(self, name: str, ne: tuple[int, ...]):
        ti = self.file.tensors.get(name)
        if ti is None:
            raise GGUFError(f"tensor {name} is missing")
        got = tuple(ti.ne) + (1,) * (len(ne) - len(ti.ne))
        if got[: len(ne)] != tuple(ne) or any(d != 1 for d in got[len(ne) :]):
            raise GGUFError(f"tensor {name} has shape {list(ti.ne)}, expected {list(ne)}")
        return ti

    def _matrix(self, name: str, ne: tuple[int, ...]) -> Matrix:
        ti = self._tensor(name, ne)
        return Matrix(self.file.data(name), ti.type_name)

    def _vector(self, name: str, ne: tuple[int, ...]) -> np.ndarray:
        ti = self._tensor(name, ne)
        v = kernels.dequantize(self.file.data(name), ti.type_name)
        if not np.isfinite(v).all():
            raise GGUFError(f"tensor {name} holds NaN or Inf")
        return v.reshape(tuple(reversed(ne)) if len(ne) > 1 else (ne[0],))

    def _experts(self, name: str, ne: tuple[int, int, int]) -> Experts:
        ti = self._tensor(name, ne)
        d = self.file.data(name)
        return Experts(d.reshape(ne[2], ne[1], d.shape[1]), ti.type_name)

    def _repack(self, formats: list[str]) -> None:
        """The layers' weights and the output head in formats (of kernels.R16_FORMATS; matrices and experts
        with rows in whole groups of 16) copied into their _r16 layouts, all in one call: one buffer, each
        file range released as it is copied. The embedding keeps the file's layout (rows looked up by id),
        and so does a head that is the embedding (tied)."""
        # q6_k too: its repacked tile is 1.5x as fast as the file layout's at one token and 1.4-3x at 2-8
        # (the expert products of decoding steps and of batched sequences), ~20% slower from 64 tokens
        # (prefill), where a whole forward lost ~1.5% (bench/NOTES.md, 2026-12-06: q6_K layer weights and
        # q5_K repacked too). iq3_xxs grows to 1.4x its bytes (4-bit codes) for 2.8x the speed at one token
        # (kbench), iq3_s to 1.25x for 3.9x (both also faster at 4 and 64 tokens).
        head = [self.output] if self.output is not self.embed else []
        layers = [w for L in self.layers for w in L.values()]
        ws = [w for w in layers + head
              if isinstance(w, (Matrix, Experts)) and w.fmt in formats and w.data.shape[-2] % 16 == 0
              and w.data.shape[-1] % kernels.R16_RUN_BYTES[w.fmt] == 0]
        for w, packed in zip(ws, kernels.repack_r16([w.data for w in ws], [w.fmt for w in ws], release=True)):
            w.data, w.fmt = packed, w.fmt + "_r16"
        self.repacked = bool(ws)

    def _load_weights(self, repack: list[str]) -> None:
        c = self.config
        H, V = c.n_embd, c.vocab_size
        for fused in ("ffn_gate_up_exps", "attn_qkv_full"):
            if any(fused in n for n in self.file.tensors):
                raise GGUFError(f"fused {fused} tensors are not supported; convert without fusing")
        self.embed = self._matrix("token_embd.weight", (H, V))
        self.output = self._matrix("output.weight", (H, V)) if "output.weight" in self.file.tensors else self.embed
        self.output_norm = self._vector("output_norm.weight", (H,))
        self.layers = []
        for i in range(c.n_layer):
            b = f"blk.{i}."
            L = {
                "attn_norm": self._vector(b + "attn_norm.weight", (H,)),
                "post_norm": self._vector(b + "post_attention_norm.weight", (H,)),
                "router": self._matrix(b + "ffn_gate_inp.weight", (H, c.n_expert)),
                "gate_exps": self._experts(b + "ffn_gate_exps.weight", (H, c.n_ff_exp, c.n_expert)),
                "up_exps": self._experts(b + "ffn_up_exps.weight", (H, c.n_ff_exp, c.n_expert)),
                "down_exps": self._experts(b + "ffn_down_exps.weight", (c.n_ff_exp, H, c.n_expert)),
                "shexp_gate_inp": self._matrix(b + "ffn_gate_inp_shexp.weight", (H,)),
                "gate_shexp": self._matrix(b + "ffn_gate_shexp.weight", (H, c.n_ff_shexp)),
                "up_shexp": self._matrix(b + "ffn_up_shexp.weight", (H, c.n_ff_shexp)),
                "down_shexp": self._matrix(b + "ffn_down_shexp.weight", (c.n_ff_shexp, H)),
            }
            if L["gate_exps"].fmt != L["up_exps"].fmt:
                raise GGUFError(f"{b}ffn_gate_exps and ffn_up_exps must share one format")
            if c.recurrent[i]:
                L.update(
                    qkv=self._matrix(b + "attn_qkv.weight", (H, c.conv_dim)),
                    z=self._matrix(b + "attn_gate.weight", (H, c.value_dim)),
                    beta=self._matrix(b + "ssm_beta.weight", (H, c.n_v_heads)),
                    alpha=self._matrix(b + "ssm_alpha.weight", (H, c.n_v_heads)),
                    conv=self._vector(b + "ssm_conv1d.weight", (c.conv_kernel, c.conv_dim)),
                    dt_bias=self._vector(b + "ssm_dt.bias", (c.n_v_heads,)),
                    ssm_a=self._vector(b + "ssm_a", (c.n_v_heads,)),
                    ssm_norm=self._vector(b + "ssm_norm.weight", (c.v_head_dim,)),
                    ssm_out=self._matrix(b + "ssm_out.weight", (c.value_dim, H)),
                )
            else:
                D = c.head_dim
                L.update(
                    q=self._matrix(b + "attn_q.weight", (H, 2 * c.n_head * D)),
                    k=self._matrix(b + "attn_k.weight", (H, c.n_head_kv * D)),
                    v=self._matrix(b + "attn_v.weight", (H, c.n_head_kv * D)),
                    o=self._matrix(b + "attn_output.weight", (c.n_head * D, H)),
                    q_norm=self._vector(b + "attn_q_norm.weight", (D,)),
                    k_norm=self._vector(b + "attn_k_norm.weight", (D,)),
                )
            self.layers.append(L)
        self.repacked = False
        if repack:
            self._repack(repack)
        # the same weights for the fused sub-layers (csrc/layers.h): two C++ calls per layer
        self._stack = kernels.LayerStack(c.n_layer, H, c.eps)
        for i, L in enumerate(self.layers):
            self._stack.set_moe(i, L["post_norm"], pair(L["router"]), L["gate_exps"].data, L["up_exps"].data,
                                L["down_exps"].data, L["gate_exps"].fmt, L["down_exps"].fmt, pair(L["gate_shexp"]),
                                pair(L["up_shexp"]), pair(L["down_shexp"]), pair(L["shexp_gate_inp"]), c.n_expert_used)
            if not c.recurrent[i]:
                self._stack.set_attn(i, L["attn_norm"], pair(L["q"]), pair(L["k"]), pair(L["v"]), pair(L["o"]),
                                     L["q_norm"], L["k_norm"], c.n_head, c.n_head_kv, c.head_dim, c.n_rot,
                                     c.rope_theta)
            else:
                self._stack.set_gdn(i, L["attn_norm"], pair(L["qkv"]), pair(L["z"]), pair(L["alpha"]), pair(L["beta"]),
                                    pair(L["ssm_out"]), L["conv"], L["dt_bias"], L["ssm_a"], L["ssm_norm"],
                                    c.n_k_heads, c.n_v_heads, c.k_head_dim, c.v_head_dim)

    # -- the layers --

    def _attention(self, i: int, L: dict, x: np.ndarray, pos: np.ndarray, cache: Cache, commit: int,
                   block: int | None) -> np.ndarray:
        c = self.config
        T, D = x.shape[0], c.head_dim
        qg, k, v = mats(x, L["q"], L["k"], L["v"])
        qg = qg.reshape(T, c.n_head, 2 * D)  # per head: [query | gate]
        q, gate = np.ascontiguousarray(qg[..., :D]), np.ascontiguousarray(qg[..., D:])
        k = k.reshape(T, c.n_head_kv, D)
        v = v.reshape(T, c.n_head_kv, D)
        q = ops.rope_neox(ops.rms_norm(q, L["q_norm"], c.eps), pos, c.n_rot, c.rope_theta)
        k = ops.rope_neox(ops.rms_norm(k, L["k_norm"], c.eps), pos, c.n_rot, c.rope_theta)
        # the span's keys/values go in rows n..n+T-1; only cache.n (advanced by `commit`) makes them part
        # of the committed context, so a speculative run leaves nothing behind that a later run could read
        n0 = cache.n
        cache.reserve(i, n0 + T, self.kv_row, self.kv_dtype)
        if self.kv_type == "q8_0":
            k = kernels.quantize(k.reshape(T * c.n_head_kv, D), "q8_0").reshape(T, *self.kv_row)
            v = kernels.quantize(v.reshape(T * c.n_head_kv, D), "q8_0").reshape(T, *self.kv_row)
        cache.k[i][n0 : n0 + T] = k
        cache.v[i][n0 : n0 + T] = v
        o = ops.attention(q, cache.k[i], cache.v[i], pos, n0 + T, mask="causal" if block is None else "block_causal",
                          block_length=block or 1, gate=gate)
        return mat(o.reshape(T, -1), L["o"])

    def _gated_deltanet(self, i: int, L: dict, x: np.ndarray, cache: Cache, commit: int) -> np.ndarray:
        c = self.config
        T = x.shape[0]
        qkv, z, alpha, beta = mats(x, L["qkv"], L["z"], L["alpha"], L["beta"])
        z = z.reshape(T, c.n_v_heads, c.v_head_dim)
        g, beta = ops.gdn_gates(alpha, beta, L["dt_bias"], L["ssm_a"])
        conv_state, state = cache.gdn_state(i, c)
        # the committed tokens update the states; the rest of the span runs on from there, speculatively
        spans = [(a, b, upd) for a, b, upd in ((0, commit, True), (commit, T, False)) if b > a]

        def part(a, b, arr):  # rows [a, b) of arr (the whole array when the span is one part)
            return arr if len(spans) == 1 else np.ascontiguousarray(arr[a:b])

        y = [ops.conv1d_silu(part(a, b, qkv), L["conv"], conv_state, update_state=upd) for a, b, upd in spans]
        y = y[0] if len(y) == 1 else np.concatenate(y)
        q = np.ascontiguousarray(y[:, : c.key_dim]).reshape(T, c.n_k_heads, c.k_head_dim)
        k = np.ascontiguousarray(y[:, c.key_dim : 2 * c.key_dim]).reshape(T, c.n_k_heads, c.k_head_dim)
        v = np.ascontiguousarray(y[:, 2 * c.key_dim :]).reshape(T, c.n_v_heads, c.v_head_dim)
        o = [ops.gated_delta_rule(part(a, b, q), part(a, b, k), part(a, b, v), part(a, b, g), part(a, b, beta), state,
                                  update_state=upd) for a, b, upd in spans]
        o = o[0] if len(o) == 1 else np.concatenate(o)
        o = ops.gated_rms_norm(o, z, L["ssm_norm"], c.eps)
        return mat(o.reshape(T, c.value_dim), L["ssm_out"])

    def _moe(self, L: dict, x: np.ndarray, prefetch: bool) -> np.ndarray:
        c = self.config
        # routed experts (top-k of the router's softmax) + the gated shared expert, one C++ call:
        # moe(x) + sigmoid(x . shexp_gate) * down_sh(silu(gate_sh(x)) * up_sh(x))
        g, u, d = L["gate_exps"], L["up_exps"], L["down_exps"]
        out, self.last_experts_used = kernels.moe_block(
            np.ascontiguousarray(x, dtype=np.float32), pair(L["router"]), c.n_expert_used, g.data, u.data, d.data,
            g.fmt, d.fmt, pair(L["gate_shexp"]), pair(L["up_shexp"]), pair(L["down_shexp"]), pair(L["shexp_gate_inp"]),
            prefetch=prefetch)
        return out

    def _update_prefetch(self) -> None:
        if not self._auto:
            return
        reads = _disk_reads()
        if reads != self._reads:
            self._prefetching, self._quiet = True, 0
        else:
            self._quiet += 1
            self._prefetching = self._quiet < PREFETCH_QUIET
        self._reads = reads

    # -- spans --

    def run(self, cache: Cache, tokens, *, commit: bool | int, block: int | None = None, logits: bool = True,
            rows=None) -> np.ndarray:
        """Run tokens at positions cache.n .. cache.n + T - 1 from the committed caches.

        commit=False is speculative: the caches are read, never written. commit=True writes the span's
        keys/values and the GDN states and advances cache.n; an int n commits only the first n tokens
        (the rest run speculatively after them: a block's commit fused with the next block's first step). block=None gives causal attention; an int B
        gives Clover's block-causal attention (a token sees every token of its own B-block). Returns
        float32 logits [T, vocab] (or the final hidden states if logits=False). rows (ascending indices
        into the span) returns those positions' only: the last layer then computes its output for them
        alone (every position's keys, values and states are still written), as llama.cpp does for the
        positions whose logits nobody reads; rows=[] runs the span for its caches alone."""
        c = self.config
        self.file.check_unchanged()
        ids, commit, block = self._check_span(cache, tokens, commit, block)
        rows = self._check_rows(rows, ids.size)
        if ids.size == 0 or (rows is not None and rows.size == 0 and commit == 0):
            return np.zeros((0, c.vocab_size if logits else c.n_embd), np.float32)
        pos = np.arange(cache.n, cache.n + ids.size, dtype=np.int32)
        x = kernels.dequantize(np.ascontiguousarray(self.embed.data[ids]), self.embed.fmt)
        prefetch = self._prefetching
        last = len(self.layers) - 1
        for i, L in enumerate(self.layers):
            out = rows if i == last else None  # (the last layer: only the rows read)
            if self.fused:  # x updated in place, two C++ calls
                if c.recurrent[i]:
                    self._stack.gdn(i, x, *cache.gdn_state(i, c), commit)
                else:
                    cache.reserve(i, cache.n + ids.size, self.kv_row, self.kv_dtype)
                    self._stack.attn(i, x, cache.k[i], cache.v[i], cache.n, block, out)
                if out is not None:
                    x = np.ascontiguousarray(x[out])
                self.last_experts_used = self._stack.moe(i, x, prefetch)
                continue
            h = rmsnorm(x, L["attn_norm"], c.eps)
            if c.recurrent[i]:
                x += self._gated_deltanet(i, L, h, cache, commit)
            else:
                x += self._attention(i, L, h, pos, cache, commit, block)
            if out is not None:
                x = np.ascontiguousarray(x[out])
            x += self._moe(L, rmsnorm(x, L["post_norm"], c.eps), prefetch)
        self._update_prefetch()
        cache.n += commit
        cache.tokens.extend(ids[:commit].tolist())
        h = rmsnorm(x, self.output_norm, c.eps)
        return self.logits(h) if logits else h

    @staticmethod
    def _check_rows(rows, T: int) -> np.ndarray | None:
        """rows as `run` takes them: None, or ascending indices in [0, T) (as an int64 array)."""
        if rows is None:
            return None
        r = np.asarray(rows, dtype=np.int64).reshape(-1)
        if r.size and (r[0] < 0 or r[-1] >= T or (np.diff(r) <= 0).any()):
            raise ValueError(f"rows must be ascending indices in [0, {T})")
        return r

    def _check_span(self, cache: Cache, tokens, commit, block):
        """A span's token ids, commit count and block as `run` takes them, checked against the vocabulary and
        the cache's room (sets the cache's capacity limit to the context length on first use)."""
        c = self.config
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= c.vocab_size):
            raise ValueError(f"token ids must be in [0, {c.vocab_size})")
        if cache.capacity_limit == 0:
            cache.capacity_limit = self.ctx_len
        if cache.n + ids.size > cache.capacity_limit:
            raise ValueError(f"context full: {cache.n + ids.size} tokens exceed the context length {cache.capacity_limit}")
        if block is not None:
            block = operator.index(block)
            if block < 1:
                raise ValueError(f"block must be >= 1, got {block}")
        commit = ids.size if commit is True else int(commit)
        if not 0 <= commit <= ids.size:
            raise ValueError(f"commit must be between 0 and {ids.size}")
        return ids, commit, block

    def run_batch(self, spans) -> list[np.ndarray]:
        """Several sequences' spans in one forward (continuous batching): spans is a list of
        (cache, tokens, commit, block) or (cache, tokens, commit, block, rows), each as `run` takes them,
        every cache a different sequence's. The projections and experts run once over all the spans'
        tokens (one product per weight); each span's attention and recurrent state use its own cache.
        Returns each span's final hidden states [T_i, hidden] (as `run(..., logits=False)`; [len(rows),
        hidden] where rows are given); the same results as one `run` per span up to float summation order
        (a product over more tokens may take another kernel path)."""
        c = self.config
        spans = [tuple(s) + (None,) * (5 - len(s)) for s in spans]
        if len(spans) == 1 or not self.fused:
            return [self.run(cache, tokens, commit=commit, block=block, logits=False, rows=rows)
                    for cache, tokens, commit, block, rows in spans]
        self.file.check_unchanged()
        ids_all, items, out = [], [], []
        t = 0
        for cache, tokens, commit, block, rows in spans:
            if any(cache is it[0] for it in items):
                raise ValueError("run_batch: each span needs its own cache")
            ids, commit, block = self._check_span(cache, tokens, commit, block)
            rows = self._check_rows(rows, ids.size)
            out.append(np.arange(t, t + ids.size) if rows is None else rows + t)
            items.append((cache, ids, commit, block, t, t + ids.size))
            ids_all.append(ids)
            t += ids.size
        if t == 0:
            return [np.zeros((0, c.n_embd), np.float32) for _ in spans]
        ids = np.concatenate(ids_all)
        out_rows = np.concatenate(out)  # the rows any span reads: the last layer's output is computed for them
        if out_rows.size == t:
            out_rows = None
        x = kernels.dequantize(np.ascontiguousarray(self.embed.data[ids]), self.embed.fmt)
        prefetch = self._prefetching
        last = len(self.layers) - 1
        for i in range(len(self.layers)):
            sel = out_rows if i == last else None
            if c.recurrent[i]:
                self._stack.gdn_batch(i, x, [(t0, t1, *cache.gdn_state(i, c), commit)
                                             for cache, _, commit, _, t0, t1 in items])
            else:
                for cache, ids_i, _, _, _, _ in items:
                    cache.reserve(i, cache.n + ids_i.size, self.kv_row, self.kv_dtype)
                self._stack.attn_batch(i, x, [(t0, t1, cache.k[i], cache.v[i], cache.n, block)
                                              for cache, _, _, block, t0, t1 in items], sel)
            if sel is not None:
                x = np.ascontiguousarray(x[sel])
            self.last_experts_used = self._stack.moe(i, x, prefetch)
        self._update_prefetch()
        for cache, ids_i, commit, _, _, _ in items:
            cache.n += commit
            cache.tokens.extend(ids_i[:commit].tolist())
        h = rmsnorm(x, self.output_norm, c.eps)
        bounds = np.cumsum([0] + [len(o) for o in out])  # each span's rows of h, in order
        return [h[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def logits(self, h: np.ndarray) -> np.ndarray:
        """The output head on final hidden states; NaN or Inf there means corrupt weights (the loader
        checks norms, not every matrix: `clover-cpu info --verify` scans a whole file)."""
        out = mat(h, self.output)
        if not np.isfinite(out).all():
            raise GGUFError(f"the model produced NaN or Inf logits: {self.file.path.name} holds corrupt weights "
                            f"(find them with: clover-cpu info --verify {self.file.path})")
        return out

    def new_cache(self) -> Cache:
        return Cache(capacity_limit=self.ctx_len)

    def forward_costs(self, block: int):
        """This model's forward cost curve on this machine at this block length (clover_cpu.costs: read
        from the user's cache folder, else measured now), for decoding with mode auto."""
        from .costs import forward_costs

        if block not in self._costs:
            self._costs[block] = forward_costs(self, block)
        return self._costs[block]

    def forward(self, token_ids) -> np.ndarray:
        """Logits [T, vocab] for a fresh context, with the model's own attention pattern:
        causal for qwen35moe, block-causal (B = the file's block length) for clover."""
        block = self.config.block_length if self.config.is_diffusion else None
        return self.run(self.new_cache(), token_ids, commit=False, block=block)

    def greedy(self, prompt_ids, max_new_tokens: int, *, stop_at_eos: bool = True):
        """Plain autoregressive greedy decoding (B = 1) through the caches: the prompt is prefilled once,
        then one committed token per forward. Yields token ids as they are chosen."""
        if max_new_tokens < 0:
            raise ValueError("max_new_tokens must be >= 0")
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("the prompt is empty")
        if len(ids) + max_new_tokens > self.ctx_len:
            raise ValueError(f"prompt ({len(ids)} tokens) + {max_new_tokens} new tokens exceed the context length {self.ctx_len}")
        cache = self.new_cache()
        if max_new_tokens == 0:
            return
        h = self.run(cache, ids, commit=True, logits=False, rows=[len(ids) - 1])
        for step in range(max_new_tokens):
            logits = self.logits(h)[0]
            tok = int(np.argmax(logits))  # ties: the lowest id
            yield tok
            if (stop_at_eos and tok == self.config.eos_token_id) or step == max_new_tokens - 1:
                return
            h = self.run(cache, [tok], commit=True, logits=False)

    def generate(self, prompt, *, cache: Cache | None = None, mark: bool = False, **options):
        """Decode after `prompt` (text or token ids); yields clover_cpu.decode.Event objects as tokens
        become final. Options (keyword-only): max_new_tokens, temperature, top_k, top_p, seed, threshold,
        block_length, max_steps, window, reuse, mode ("exact" | "auto"), policy ("threshold" | "fixed"),
        scorer ("prob" | "margin" | "entropy"), stop_at_eos. Defaults come from the file (Clover's threshold and block length). `cache` continues
        an earlier context (ending on a block boundary) and is extended in place; mark=True checkpoints it a
        few tokens before the prompt's end (Cache.mark), where `cache.rewind(cache.mark_n)` can return to."""
        from .decode import Options, decode

        ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        yield from decode(self, ids, Options(**options), cache=cache, mark=mark)

    def generate_text(self, prompt, **options) -> dict:
        """The whole generation at once: text, token_ids and the statistics (prompt_tokens,
        generated_tokens, forwards, tokens_per_forward, seconds, tokens_per_second, prefill_*). When the
        prompt ends inside a <think> block (a chat template that starts the model's reasoning) or the
        output opens one, "text" is the answer alone and "reasoning_content" the reasoning."""
        from .chat import opens_thinking, split_reasoning

        out: list[int] = []
        stats = None
        for ev in self.generate(prompt, **options):
            if ev.kind == "tokens":
                out.extend(ev.tokens)
            elif ev.kind == "done":
                stats = ev.stats
        text = self.detokenize(out)
        result = {"text": text, "token_ids": out, **stats.as_dict()}
        if self.has_thinking_tokens():
            tail = prompt if isinstance(prompt, str) else self.tokenizer.decode(list(prompt)[-64:], skip_special=False)
            reasoning, answer = split_reasoning(text, opens_thinking(tail))
            if reasoning is not None:
                result.update(text=answer, reasoning_content=reasoning)
        return result

    def has_thinking_tokens(self) -> bool:
        """Whether the vocabulary spells <think> and </think> as tokens (a reasoning model's)."""
        return all(self.tokenizer.token_to_id(t) is not None for t in ("<think>", "</think>"))

    # -- chat --

    @property
    def chat_template(self):
        """The file's chat template (clover_cpu.chat.ChatTemplate), or None when it has none."""
        if not hasattr(self, "_chat_template"):
            from .chat import ChatTemplate

            source = self.file.kv.get("tokenizer.chat_template")
            self._chat_template = None
            if source is not None:
                if not isinstance(source, str):
                    raise GGUFError("tokenizer.chat_template is not a string")
                self._chat_template = ChatTemplate(source, tokenizer=self.tokenizer,
                                                   special_tokens=self.tokenizer.special_token_strings())
        return self._chat_template

    @property
    def user_turn_ids(self) -> list[int] | None:
        """The token ids that open a user message in the file's chat template, or for a file without one in
        the template its conversations are rendered with instead (use_fallback_template) (ChatTemplate.
        user_turn_ids; found once), or None: no template, or one that does not show where a message begins."""
        if not hasattr(self, "_user_turn_ids"):
            from .chat import ChatTemplateError

            try:
                tpl = self.chat_template or self._fallback_template
                self._user_turn_ids = tpl.user_turn_ids() if tpl is not None else None
            except (ChatTemplateError, GGUFError):
                self._user_turn_ids = None
        return self._user_turn_ids

    def use_fallback_template(self, template) -> None:
        """The template (clover_cpu.chat.ChatTemplate) a server renders this file's conversations with when the
        file has none (ChatML, as llama-server): the decoder then cuts a prompt's prefill where its first user
        message begins in that template too, as for a file's own (user_turn_ids)."""
        self._fallback_template = template
        self.__dict__.pop("_user_turn_ids", None)

    def apply_chat_template(self, messages, *, tools=None, add_generation_prompt: bool = True,
                            tokenize: bool = False, sanitize_control_tokens: bool = True, **template_kwargs):
        """The conversation `messages` rendered by the file's chat template, as transformers'
        tokenizer.apply_chat_template renders it (in a sandbox: a template cannot reach Python). `tools`:
        OpenAI-style JSON schemas; other keywords (documents, enable_thinking, ...) reach the template.
        tokenize=False gives the text; tokenize=True the ids, where (sanitize_control_tokens) a control
        token typed inside a message (`<|im_end|>`) stays text instead of closing the turn."""
        from .chat import ChatTemplateError

        tpl = self.chat_template
        if tpl is None:
            raise ChatTemplateError(f"{self.file.path.name} has no chat template (tokenizer.chat_template)")
        mark = tokenize and sanitize_control_tokens
        text = tpl.render(messages, tools=tools, add_generation_prompt=add_generation_prompt, mark=mark,
                          **template_kwargs)
        if not tokenize:
            return text
        return tpl.encode(text) if mark else self.tokenize(text)

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        """Token ids of `text`; special=True (default): control-token strings in it become those tokens."""
        return self.tokenizer.encode(text, special=special)

    def detokenize(self, ids) -> str:
        return self.tokenizer.decode(ids)

    def close(self) -> None:
        self.file.close()


def load(path, *, threads: int | None = None, ctx_len: int | None = None, kv_type: str = "f16",
         prefetch: str = "auto", repack: str = "auto") -> Model:
    """Open a clover or qwen35moe GGUF file; weights stay memory-mapped in place. kv_type: the attention
    cache's element type: "f16" (default), "f32", or "q8_0" (ggml's Q8_0 blocks, 1.06 bytes per value: about
    half the memory of f16 at a long context; needs a head dim that is a multiple of 32). prefetch: routed
    experts whose weights are not in memory are read from the disk all at once, before any is computed:
    "auto" (default: when the file is larger than the memory free for it, checked while the disk is being
    read), "on" (checked every forward, about 1 us per page checked), "off" (left to page faults). repack:
    q4_k, q3_k, q2_k, q5_k, q6_k, iq4_xs, iq3_xxs and iq3_s layer weights copied at load into a layout of 16
    rows per group, which the kernels multiply faster (q4_k, iq4_xs, iq3_xxs and iq3_s: AVX2, AVX-512 and NEON
    dot-product; q3_k AVX2 and AVX-512; q2_k AVX-512 alone; q5_k and q6_k AVX2 alone: AVX-512's GEMV on the
    file's layout streams them faster at one token) (the file's pages are released as each is copied, so memory
    grows by 0-4%, and by 41% / 25% of the iq3_xxs / iq3_s weights' size, transcoded to 4 bits per weight):
    "auto" (default: where the CPU has those kernels and the file takes at most half the memory available),
    "on" (whatever the file's size; an error without those kernels), "off"."""
    return Model(path, threads=threads, ctx_len=ctx_len, kv_type=kv_type, prefetch=prefetch, repack=repack)
