"""Mixture-of-experts product against a per-token float64 reference and against per-expert matmuls."""

import os

import numpy as np
import pytest

import clover_cpu
from clover_cpu import kernels

from conftest import check_close

ISAS = clover_cpu.system_info()["available_isas"]


def silu(x):
    return x / (1 + np.exp(-x))


def make_experts(rng, fmt, e, rows, k):
    w = rng.standard_normal((e * rows, k)).astype(np.float32) * 0.2
    q = kernels.quantize(w, fmt).reshape(e, rows, -1)
    return q, kernels.dequantize(q.reshape(e * rows, -1), fmt).reshape(e, rows, k).astype(np.float64)


def route(rng, m, e, k):
    ids = np.stack([rng.choice(e, k, replace=False) for _ in range(m)]).astype(np.int32)
    w = rng.random((m, k)).astype(np.float32)
    return ids, w / w.sum(1, keepdims=True)


def reference(x, ids, w, gd, ud, dd):
    out = np.zeros((x.shape[0], dd.shape[1]))
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            h = silu(gd[e] @ x[t]) * (ud[e] @ x[t])
            out[t] += w[t, j] * (dd[e] @ h)
    return out


@pytest.mark.parametrize("fmt,down_fmt", [("q4_k", "q6_k"), ("q5_k", "q5_k"), ("q4_0", "q8_0"), ("q8_0", "q4_k"), ("f16", "f32")])
@pytest.mark.parametrize("m", [1, 5, 32])
def test_moe_vs_reference(fmt, down_fmt, m, rng):
    E, H, I, K = 16, 256, 256, 4
    g, gd = make_experts(rng, fmt, E, I, H)
    u, ud = make_experts(rng, fmt, E, I, H)
    d, dd = make_experts(rng, down_fmt, E, H, I)
    x = rng.standard_normal((m, H)).astype(np.float32)
    ids, w = route(rng, m, E, K)
    want = reference(x.astype(np.float64), ids, w, gd, ud, dd)
    for isa in ISAS:
        out, used = kernels.moe(x, ids, w, g, u, d, fmt, fmt, down_fmt, isa=isa)
        check_close(out, want, 5e-2, f"moe {fmt}/{down_fmt} {isa} M={m}")
        assert used == len(np.unique(ids))


@pytest.mark.parametrize("m", [3, 220])
def test_moe_hidden_size_not_a_multiple_of_64(m, rng):
    # The slots' weighted sum runs 64 outputs at a time: H = 160 ends on a part chunk. 220 tokens x 160
    # outputs take the combine to the pool, 3 keep it on the calling thread.
    E, H, I, K = 8, 160, 64, 2
    g, gd = make_experts(rng, "q8_0", E, I, H)
    u, ud = make_experts(rng, "q8_0", E, I, H)
    d, dd = make_experts(rng, "q8_0", E, H, I)
    x = rng.standard_normal((m, H)).astype(np.float32)
    ids, w = route(rng, m, E, K)
    want = reference(x.astype(np.float64), ids, w, gd, ud, dd)
    for isa in ISAS:
        out, _ = kernels.moe(x, ids, w, g, u, d, "q8_0", isa=isa)
        check_close(out, want, 5e-2, f"moe H=160 {isa} M={m}")


def test_moe_equals_per_expert_matmuls(rng):
    """Grouping is exact: the same numbers as running each expert's tokens through matmul."""
    E, H, I, K, M = 8, 256, 512, 2, 12
    g, _ = make_experts(rng, "q4_k", E, I, H)
    u, _ = make_experts(rng, "q4_k", E, I, H)
    d, _ = make_experts(rng, "q4_k", E, H, I)
    x = rng.standard_normal((M, H)).astype(np.float32)
    ids, w = route(rng, M, E, K)
    out, _ = kernels.moe(x, ids, w, g, u, d, "q4_k")
    want = np.zeros((M, H), np.float64)
    for t in range(M):
        for j in range(K):
            e = ids[t, j]
            gate = kernels.matmul(x[t : t + 1], g[e], "q4_k")
            up = kernels.matmul(x[t : t + 1], u[e], "q4_k")
            h = (gate / (1 + np.exp(-gate)) * up).astype(np.float32)
            want[t] += w[t, j] * kernels.matmul(h, d[e], "q4_k")[0]
    check_close(out, want, 1e-4, "moe vs per-expert matmul")


def test_moe_buffers_past_the_kept_size(rng):
    """A call whose per-expert outputs exceed the per-thread scratch (8 MB) allocates its own; calls
    before and after it reuse the kept buffers and their stale contents never leak into a result."""
    E, H, I, K = 4, 2048, 256, 4
    g, gd = make_experts(rng, "q4_k", E, I, H)
    u, ud = make_experts(rng, "q4_k", E, I, H)
    d, dd = make_experts(rng, "q4_k", E, H, I)
    xs = rng.standard_normal((5, H)).astype(np.float32)
    ids_s, w_s = route(rng, 5, E, K)
    small, _ = kernels.moe(xs, ids_s, w_s, g, u, d, "q4_k")
    x = rng.standard_normal((300, H)).astype(np.float32)  # 1200 slots x 2048 floats: 9.8 MB
    ids, w = route(rng, 300, E, K)
    out, _ = kernels.moe(x, ids, w, g, u, d, "q4_k")
    check_close(out, reference(x.astype(np.float64), ids, w, gd, ud, dd), 5e-2, "moe 300 tokens")
    again, _ = kernels.moe(xs, ids_s, w_s, g, u, d, "q4_k")
    np.testing.assert_array_equal(again, small)


def test_moe_repeated_expert_and_skew(rng):
    """All tokens on one expert, and an expert listed twice for a token, are handled."""
    E, H, I = 4, 256, 256
    g, gd = make_experts(rng, "q8_0", E, I, H)
    u, ud = make_experts(rng, "q8_0", E, I, H)
    d, dd = make_experts(rng, "q8_0", E, H, I)
    x = rng.standard_normal((7, H)).astype(np.float32)
    ids = np.array([[2, 2]] * 7, np.int32)
    w = np.full((7, 2), 0.5, np.float32)
    out, used = kernels.moe(x, ids, w, g, u, d, "q8_0")
    assert used == 1
    check_close(out, reference(x.astype(np.float64), ids, w, gd, ud, dd), 5e-2, "moe one expert")


@pytest.mark.parametrize("E,K", [(32, 8), (4, 2)])
def test_moe_thread_independent(E, K, rng):
    # 32 experts: whole-expert tasks with both phases in one task on 1 and 4 threads; 4 experts on 4
    # threads: row-chunk tasks and two phases (against whole experts on 1 thread)
    H, I, M = 512, 256, 32
    g, _ = make_experts(rng, "q4_k", E, I, H)
    u, _ = make_experts(rng, "q4_k", E, I, H)
    d, _ = make_experts(rng, "q6_k", E, H, I)
    x = rng.standard_normal((M, H)).astype(np.float32)
    ids, w = route(rng, M, E, K)
    before = clover_cpu.system_info()["threads"]
    try:
        clover_cpu.set_num_threads(1)
        a, _ = kernels.moe(x, ids, w, g, u, d, "q4_k", "q4_k", "q6_k")
        clover_cpu.set_num_threads(4)
        b, _ = kernels.moe(x, ids, w, g, u, d, "q4_k", "q4_k", "q6_k")
    finally:
        clover_cpu.set_num_threads(before)
    np.testing.assert_array_equal(a, b)


def moe_block_parts(rng, E=16, H=256, I=256, I_sh=512, fmt="q4_k", down_fmt="q6_k"):
    g, _ = make_experts(rng, fmt, E, I, H)
    u, _ = make_experts(rng, fmt, E, I, H)
    d, _ = make_experts(rng, down_fmt, E, H, I)
    mat = lambda n, k, f: (kernels.quantize(rng.standard_normal((n, k)).astype(np.float32) * 0.2, f), f)
    router = (rng.standard_normal((E, H)).astype(np.float32).view(np.uint8), "f32")
    return dict(router=router, gate=g, up=u, down=d, gate_fmt=fmt, down_fmt=down_fmt, gate_sh=mat(I_sh, H, fmt),
                up_sh=mat(I_sh, H, fmt), down_sh=mat(H, I_sh, down_fmt), shexp_gate=mat(1, H, "q8_0"))


@pytest.mark.parametrize("m", [1, 5, 32])
def test_moe_block_equals_its_parts(m, rng):
    from clover_cpu import ops

    p = moe_block_parts(rng)
    x = rng.standard_normal((m, 256)).astype(np.float32)
    for isa in clover_cpu.system_info()["available_isas"]:
        out, n_used = kernels.moe_block(x, p["router"], 4, p["gate"], p["up"], p["down"], p["gate_fmt"],
                                        p["down_fmt"], p["gate_sh"], p["up_sh"], p["down_sh"], p["shexp_gate"],
                                        isa=isa)
        logits, gs, us, sg = kernels.matmul_many(x, [p["router"], p["gate_sh"], p["up_sh"], p["shexp_gate"]],
                                                 isa=isa)
        ids, w = ops.router_topk(logits, 4)
        routed, n_want = kernels.moe(x, ids, w, p["gate"], p["up"], p["down"], p["gate_fmt"], p["gate_fmt"],
                                     p["down_fmt"], isa=isa)
        shared = kernels.matmul(ops.swiglu(gs, us, isa=isa), *p["down_sh"], isa=isa)
        want = routed + shared / (1 + np.exp(-sg.astype(np.float64)))
        assert n_used == n_want
        check_close(out, want, 1e-6, f"moe_block {isa} m={m}")  # only the sigmoid's exp differs


def test_moe_block_bad_input(rng):
    p = moe_block_parts(rng)
    x = rng.standard_normal((2, 256)).astype(np.float32)
    args = [p["router"], 4, p["gate"], p["up"], p["down"], p["gate_fmt"], p["down_fmt"], p["gate_sh"], p["up_sh"],
            p["down_sh"], p["shexp_gate"]]
    with pytest.raises(ValueError, match="top_k"):
        kernels.moe_block(x, *args[:1], 17, *args[2:])
    with pytest.raises(ValueError, match="one row per expert"):
        kernels.moe_block(x, (p["router"][0][:8], "f32"), *args[1:])
    with pytest.raises(ValueError, match="pair"):
        kernels.moe_block(x, p["router"][0], *args[1:])
    with pytest.raises(ValueError, match="shared expert"):
        kernels.moe_block(x, *args[:7], p["up_sh"], p["gate_sh"], p["gate_sh"], p["shexp_gate"])
    with pytest.raises(ValueError, match="one row"):
        kernels.moe_block(x, *args[:10], p["gate_sh"])


def _filesystem(path) -> str:
    best, fs = "", ""
    for line in open("/proc/mounts"):
        mnt, kind = line.split()[1:3]
        if str(path).startswith(mnt) and len(mnt) > len(best):
            best, fs = mnt, kind
    return fs


@pytest.mark.skipif(not hasattr(os, "posix_fadvise") or not os.path.exists("/proc/mounts"),
                    reason="needs posix_fadvise to drop a file from the page cache (Linux)")
@pytest.mark.parametrize("m", [1, 32])
def test_moe_block_prefetch_from_a_cold_file(m, rng, tmp_path):
    # experts mapped from a file that is not in the page cache: prefetch=True requests the routed experts
    # from the disk (the counter moves), computes them after the resident ones, and gives the same result
    if _filesystem(tmp_path) in ("tmpfs", "ramfs", "overlay"):
        pytest.skip("the temporary directory is in memory: nothing to drop from the page cache")
    p = moe_block_parts(rng)
    x = rng.standard_normal((m, 256)).astype(np.float32)
    args = lambda g, u, d: (p["router"], 4, g, u, d, p["gate_fmt"], p["down_fmt"], p["gate_sh"], p["up_sh"],
                            p["down_sh"], p["shexp_gate"])
    want, n_want = kernels.moe_block(x, *args(p["gate"], p["up"], p["down"]))
    offsets = []
    with open(tmp_path / "experts.bin", "wb") as f:  # the three stacks, each at a 64 KiB boundary
        for a in (p["gate"], p["up"], p["down"]):
            f.seek(-(-f.tell() // 65536) * 65536)
            offsets.append(f.tell())
            f.write(a.tobytes())
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    mm = np.memmap(tmp_path / "experts.bin", mode="r")
    parts = [mm[o : o + a.nbytes].reshape(a.shape) for o, a in zip(offsets, (p["gate"], p["up"], p["down"]))]
    before = kernels.experts_prefetched()
    out, n_used = kernels.moe_block(x, *args(*parts), prefetch=True)
    cold = kernels.experts_prefetched() - before
    assert n_used == n_want and np.array_equal(out, want)
    assert 0 < cold <= n_used  # the file was just dropped from the page cache
    before = kernels.experts_prefetched()
    out, _ = kernels.moe_block(x, *args(*parts), prefetch=True)
    assert kernels.experts_prefetched() == before, "experts read by the first call must count as in memory"
    assert np.array_equal(out, want)
    del mm
