// Python bindings of the model operators: every argument is checked here (dtype, contiguity,
// shapes, ranges) and raises ValueError; the GIL is released while the operators run.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "model_ops.h"

namespace py = pybind11;
using namespace clover;

KvType kv_type_of(const py::dtype& dt);  // below

namespace {

[[noreturn]] void fail(const std::string& msg) { throw py::value_error(msg); }

std::string shape_str(const py::array& a) {
    std::string s = "[";
    for (py::ssize_t i = 0; i < a.ndim(); i++) s += (i ? ", " : "") + std::to_string(a.shape(i));
    return s + "]";
}

// ndim < 0: any number of dimensions >= 1.
void check(const py::array& a, const char* what, int ndim, const py::dtype& dt, const char* dtype_name,
           bool writeable = false) {
    if (!a.dtype().is(dt))
        fail(std::string(what) + " must have dtype " + dtype_name + ", got " + std::string(py::str(a.dtype())));
    if (ndim >= 0 && a.ndim() != ndim)
        fail(std::string(what) + " must be " + std::to_string(ndim) + "-D, got " + std::to_string(a.ndim()) + "-D");
    if (ndim < 0 && a.ndim() < 1) fail(std::string(what) + " must have at least one dimension");
    if (!(a.flags() & py::array::c_style)) fail(std::string(what) + " must be C-contiguous (use np.ascontiguousarray)");
    if (writeable && !a.writeable()) fail(std::string(what) + " must be writeable (it is updated in place)");
}
void check_f32(const py::array& a, const char* what, int ndim, bool writeable = false) {
    check(a, what, ndim, py::dtype::of<float>(), "float32", writeable);
}
void check_i32(const py::array& a, const char* what, int ndim) { check(a, what, ndim, py::dtype::of<int32_t>(), "int32"); }

void same_shape(const py::array& a, const py::array& b, const char* wa, const char* wb) {
    if (a.ndim() != b.ndim() || !std::equal(a.shape(), a.shape() + a.ndim(), b.shape()))
        fail(std::string(wb) + " must have the shape of " + wa + " " + shape_str(a) + ", got " + shape_str(b));
}

void want_shape(const py::array& a, const char* what, std::initializer_list<int64_t> shape) {
    int64_t i = 0;
    bool ok = a.ndim() == (py::ssize_t)shape.size();
    for (int64_t s : shape) ok = ok && a.shape(i++) == s;
    if (!ok) {
        std::string want = "[";
        i = 0;
        for (int64_t s : shape) want += (i++ ? ", " : "") + std::to_string(s);
        fail(std::string(what) + " must have shape " + want + "], got " + shape_str(a));
    }
}

const ModelKernels& kernels_arg(const std::optional<std::string>& isa) {
    try {
        return isa ? model_kernels_for(*isa) : active_model_kernels();
    } catch (const std::invalid_argument& e) {
        fail(e.what());
    }
}

py::array_t<float> new_like(const py::array& a) {
    std::vector<py::ssize_t> shape(a.shape(), a.shape() + a.ndim());
    return py::array_t<float>(shape);
}

// out (or a new array) of the shape of x; out may be x itself.
py::array out_arg(const std::optional<py::array>& out, const py::array& x) {
    if (!out) return new_like(x);
    check_f32(*out, "out", -1, true);
    same_shape(x, *out, "x", "out");
    return *out;
}

py::array py_rms_norm(const py::array& x, const py::array& w, float eps, const std::optional<py::array>& out,
                      const std::optional<std::string>& isa) {
    const ModelKernels& kr = kernels_arg(isa);
    check_f32(x, "x", -1);
    check_f32(w, "w", 1);
    const int64_t d = x.shape(x.ndim() - 1);
    want_shape(w, "w", {d});
    if (!(eps >= 0.f)) fail("eps must be >= 0");
    py::array y = out_arg(out, x);
    const int64_t rows = d ? (int64_t)x.size() / d : 0;
    const float *X = (const float*)x.data(), *W = (const float*)w.data();
    float* Y = (float*)y.mutable_data();
    {
        py::gil_scoped_release nogil;
        rms_norm(kr, X, W, rows, d, eps, Y);
    }
    return y;
}

py::array py_gated_rms_norm(const py::array& o, const py::array& z, const py::array& w, float eps,
                            const std::optional<py::array>& out, const std::optional<std::string>& isa) {
    const ModelKernels& kr = kernels_arg(isa);
    check_f32(o, "o", -1);
    check_f32(z, "z", -1);
    same_shape(o, z, "o", "z");
    check_f32(w, "w", 1);
    const int64_t d = o.shape(o.ndim() - 1);
    want_shape(w, "w", {d});
    if (!(eps >= 0.f)) fail("eps must be >= 0");
    py::array y = out_arg(out, o);
    const int64_t rows = d ? (int64_t)o.size() / d : 0;
    const float *O = (const float*)o.data(), *Z = (const float*)z.data(), *W = (const float*)w.data();
    float* Y = (float*)y.mutable_data();
    {
        py::gil_scoped_release nogil;
        gated_rms_norm(kr, O, Z, W, rows, d, eps, Y);
    }
    return y;
}

void py_rope_neox(py::array x, const py::array& positions, int64_t n_rot, double theta) {
    check_f32(x, "x", 3, true);
    check_i32(positions, "positions", 1);
    const int64_t T = x.shape(0), H = x.shape(1), D = x.shape(2);
    want_shape(positions, "positions", {T});
    if (n_rot < 0 || n_rot > D || n_rot % 2)
        fail("n_rot must be even and in [0, " + std::to_string(D) + "] (the head dim), got " + std::to_string(n_rot));
    if (!(theta > 0.0) || !std::isfinite(theta)) fail("theta must be a positive finite number");
    float* X = (float*)x.mutable_data();
    const int32_t* P = (const int32_t*)positions.data();
    py::gil_scoped_release nogil;
    rope_neox(X, P, T, H, D, n_rot, theta);
}

py::array_t<float> py_attention(const py::array& q, const py::array& k_cache, const py::array& v_cache,
                                const py::array& q_pos, int64_t n_kv, const std::string& mask, int64_t block_length,
                                std::optional<float> scale, const std::optional<py::array>& gate,
                                const std::optional<std::string>& isa) {
    const ModelKernels& kr = kernels_arg(isa);
    check_f32(q, "q", 3);
    const py::dtype kv_dt = k_cache.dtype();
    const KvType kv = kv_type_of(kv_dt);
    check(k_cache, "k_cache", 3, kv_dt, "float32/float16/uint16/uint8");
    check(v_cache, "v_cache", 3, kv_dt, ("the dtype of k_cache (" + std::string(py::str(kv_dt)) + ")").c_str());
    same_shape(k_cache, v_cache, "k_cache", "v_cache");
    check_i32(q_pos, "q_pos", 1);
    const int64_t T = q.shape(0), Hq = q.shape(1), D = q.shape(2);
    const int64_t S = k_cache.shape(0), Hkv = k_cache.shape(1);
    if (kv == KvType::Q8_0) {
        if (D % KV_Q8_BLOCK)
            fail("a Q8_0 KV cache needs a head dim that is a multiple of 32, got " + std::to_string(D));
        if (k_cache.shape(2) != kv_head_bytes(kv, D))
            fail("a Q8_0 k_cache for head dim " + std::to_string(D) + " has " + std::to_string(kv_head_bytes(kv, D)) +
                 " bytes per head (D / 32 blocks of 34), got " + std::to_string(k_cache.shape(2)));
    } else if (k_cache.shape(2) != D) {
        fail("k_cache head dim " + std::to_string(k_cache.shape(2)) + " != q head dim " + std::to_string(D));
    }
    if (Hkv < 1 || Hq % Hkv) fail("the query heads (" + std::to_string(Hq) + ") must be a multiple of the kv heads (" +
                                  std::to_string(Hkv) + ")");
    want_shape(q_pos, "q_pos", {T});
    if (n_kv < 0 || n_kv > S) fail("n_kv must be in [0, " + std::to_string(S) + "] (cache rows), got " +
                                   std::to_string(n_kv));
    AttnMask mk;
    if (mask == "causal")
        mk = AttnMask::Causal;
    else if (mask == "block_causal")
        mk = AttnMask::BlockCausal;
    else
        fail("mask must be 'causal' or 'block_causal', got '" + mask + "'");
    if (block_length < 1) fail("block_length must be >= 1");
    const int32_t* P = (const int32_t*)q_pos.data();
    for (int64_t t = 0; t < T; t++)
        if (P[t] < 0) fail("q_pos must be >= 0, got " + std::to_string(P[t]) + " at " + std::to_string(t));
    const float* G = nullptr;
    if (gate) {
        check_f32(*gate, "gate", 3);
        same_shape(q, *gate, "q", "gate");
        G = (const float*)gate->data();
    }
    const float sc = scale ? *scale : 1.f / std::sqrt((float)D);
    py::array_t<float> o({(py::ssize_t)T, (py::ssize_t)Hq, (py::ssize_t)D});
    const float* Q = (const float*)q.data();
    const void *K = k_cache.data(), *V = v_cache.data();
    float* O = o.mutable_data();
    if (T > 0 && Hq > 0 && D > 0) {
        py::gil_scoped_release nogil;
        attention(kr, Q, K, V, kv, P, G, T, Hq, Hkv, D, n_kv, mk, block_length, sc, O);
    }
    return o;
}

py::array_t<float> py_conv1d_silu(const py::array& x, const py::array& w, py::array state, bool update_state,
                                  const std::optional<std::string>& isa) {
    const ModelKernels& kr = kernels_arg(isa);
    check_f32(x, "x", 2);
    check_f32(w, "w", 2);
    check_f32(state, "state", 2, update_state);
    const int64_t T = x.shape(0), C = x.shape(1), K = w.shape(1);
    if (w.shape(0) != C) fail("w must be [C, K] with C = " + std::to_string(C) + " (x columns), got " + shape_str(w));
    if (K < 1) fail("w must have at least one tap");
    want_shape(state, "state", {K - 1, C});
    py::array_t<float> y({(py::ssize_t)T, (py::ssize_t)C});
    const float *X = (const float*)x.data(), *W = (const float*)w.data();
    float* St = update_state ? (float*)state.mutable_data() : (float*)state.data();
    float* Y = y.mutable_data();
    {
        py::gil_scoped_release nogil;
        conv1d_silu(kr, X, W, St, T, C, K, update_state, Y);
    }
    return y;
}

py::array_t<float> py_gated_delta_rule(const py::array& q, const py::array& k, const py::array& v, const py::array& g,
                                       const py::array& beta, py::array state, bool update_state,
                                       const std::string& mode, const std::optional<std::string>& isa) {
    const ModelKernels& kr = kernels_arg(isa);
    check_f32(q, "q", 3);
    check_f32(k, "k", 3);
    same_shape(q, k, "q", "k");
    check_f32(v, "v", 3);
    check_f32(g, "g", 2);
    check_f32(beta, "beta", 2);
    check_f32(state, "state", 3, update_state);
    const int64_t T = q.shape(0), Hk = q.shape(1), dk = q.shape(2), Hv = v.shape(1), dv = v.shape(2);
    if (v.shape(0) != T) fail("v must have " + std::to_string(T) + " tokens (as q), got " + shape_str(v));
    if (Hk < 1 || Hv % Hk) fail("the value heads (" + std::to_string(Hv) + ") must be a multiple of the key heads (" +
                                std::to_string(Hk) + ")");
    want_shape(g, "g", {T, Hv});
    want_shape(beta, "beta", {T, Hv});
    want_shape(state, "state", {Hv, dk, dv});
    GdnMode md;
    if (mode == "recurrent")
        md = GdnMode::Recurrent;
    else if (mode == "chunked")
        md = GdnMode::Chunked;
    else if (mode == "auto")
        md = GdnMode::Auto;
    else
        fail("mode must be 'recurrent', 'chunked' or 'auto', got '" + mode + "'");
    py::array_t<float> o({(py::ssize_t)T, (py::ssize_t)Hv, (py::ssize_t)dv});
    const float *Q = (const float*)q.data(), *K = (const float*)k.data(), *V = (const float*)v.data();
    const float *Gp = (const float*)g.data(), *B = (const float*)beta.data();
    float* St = update_state ? (float*)state.mutable_data() : (float*)state.data();  // read only unless updating
    float* O = o.mutable_data();
    if (T > 0 && Hv > 0 && dv > 0) {
        py::gil_scoped_release nogil;
        gated_delta_rule(kr, md, Q, K, V, Gp, B, St, T, Hk, Hv, dk, dv, update_state, O);
    }
    return o;
}

py::tuple py_router_topk(const py::array& logits, int64_t k) {
    check_f32(logits, "logits", 2);
    const int64_t T = logits.shape(0), E = logits.shape(1);
    if (k < 1 || k > E) fail("k must be in [1, " + std::to_string(E) + "] (the experts), got " + std::to_string(k));
    py::array_t<int32_t> ids({(py::ssize_t)T, (py::ssize_t)k});
    py::array_t<float> w({(py::ssize_t)T, (py::ssize_t)k});
    const float* L = (const float*)logits.data();
    int32_t* I = ids.mutable_data();
    float* W = w.mutable_data();
    {
        py::gil_scoped_release nogil;
        router_topk(L, T, E, k, I, W);
    }
    return py::make_tuple(ids, w);
}

py::array py_swiglu(const py::array& gate, const py::array& up, const std::optional<py::array>& out,
                    const std::optional<std::string>& isa) {
    const ModelKernels& kr = kernels_arg(isa);
    check_f32(gate, "gate", -1);
    check_f32(up, "up", -1);
    same_shape(gate, up, "gate", "up");
    py::array y = out_arg(out, gate);
    const float *G = (const float*)gate.data(), *U = (const float*)up.data();
    float* Y = (float*)y.mutable_data();
    const int64_t n = (int64_t)gate.size();
    {
        py::gil_scoped_release nogil;
        swiglu(kr, G, U, n, Y);
    }
    return y;
}

py::array py_sigmoid_mul(const py::array& x, const py::array& gate, const std::optional<py::array>& out,
                         const std::optional<std::string>& isa) {
    const ModelKernels& kr = kernels_arg(isa);
    check_f32(x, "x", -1);
    check_f32(gate, "gate", -1);
    same_shape(x, gate, "x", "gate");
    py::array y = out_arg(out, x);
    const float *X = (const float*)x.data(), *G = (const float*)gate.data();
    float* Y = (float*)y.mutable_data();
    const int64_t n = (int64_t)x.size();
    {
        py::gil_scoped_release nogil;
        sigmoid_mul(kr, X, G, n, Y);
    }
    return y;
}

py::tuple py_gdn_gates(const py::array& a, const py::array& b, const py::array& dt_bias, const py::array& ssm_a) {
    check_f32(a, "a", 2);
    check_f32(b, "b", 2);
    same_shape(a, b, "a", "b");
    check_f32(dt_bias, "dt_bias", 1);
    check_f32(ssm_a, "ssm_a", 1);
    const int64_t T = a.shape(0), Hv = a.shape(1);
    want_shape(dt_bias, "dt_bias", {Hv});
    want_shape(ssm_a, "ssm_a", {Hv});
    py::array_t<float> g({(py::ssize_t)T, (py::ssize_t)Hv}), beta({(py::ssize_t)T, (py::ssize_t)Hv});
    const float *A = (const float*)a.data(), *B = (const float*)b.data();
    const float *Dt = (const float*)dt_bias.data(), *Sa = (const float*)ssm_a.data();
    float *Gp = g.mutable_data(), *Bp = beta.mutable_data();
    {
        py::gil_scoped_release nogil;
        gdn_gates(A, B, Dt, Sa, T, Hv, Gp, Bp);
    }
    return py::make_tuple(g, beta);
}

}  // namespace

// The KV cache element type a k_cache dtype holds (LayerStack in bindings.cpp checks its caches with it too).
KvType kv_type_of(const py::dtype& dt) {
    if (dt.is(py::dtype::of<float>())) return KvType::F32;
    if (dt.is(py::dtype("float16")) || dt.is(py::dtype::of<uint16_t>())) return KvType::F16;
    if (dt.is(py::dtype::of<uint8_t>())) return KvType::Q8_0;
    fail("k_cache must have dtype float32, float16, uint16 (float16 bits) or uint8 (Q8_0 blocks), got " +
         std::string(py::str(dt)));
}

void bind_model_ops(py::module_& m) {
    m.def("rms_norm", &py_rms_norm, py::arg("x"), py::arg("w"), py::arg("eps"), py::arg("out") = py::none(),
          py::kw_only(), py::arg("isa") = py::none());
    m.def("gated_rms_norm", &py_gated_rms_norm, py::arg("o"), py::arg("z"), py::arg("w"), py::arg("eps"),
          py::arg("out") = py::none(), py::kw_only(), py::arg("isa") = py::none());
    m.def("rope_neox", &py_rope_neox, py::arg("x"), py::arg("positions"), py::arg("n_rot"), py::arg("theta"));
    m.def("attention", &py_attention, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("q_pos"),
          py::arg("n_kv"), py::arg("mask") = "causal", py::arg("block_length") = 32, py::arg("scale") = py::none(),
          py::arg("gate") = py::none(), py::kw_only(), py::arg("isa") = py::none());
    m.def("conv1d_silu", &py_conv1d_silu, py::arg("x"), py::arg("w"), py::arg("state"), py::arg("update_state") = true,
          py::kw_only(), py::arg("isa") = py::none());
    m.def("gated_delta_rule", &py_gated_delta_rule, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("g"),
          py::arg("beta"), py::arg("state"), py::arg("update_state") = true, py::arg("mode") = "auto", py::kw_only(),
          py::arg("isa") = py::none());
    m.def("router_topk", &py_router_topk, py::arg("logits"), py::arg("k"));
    m.def("swiglu", &py_swiglu, py::arg("gate"), py::arg("up"), py::arg("out") = py::none(), py::kw_only(),
          py::arg("isa") = py::none());
    m.def("sigmoid_mul", &py_sigmoid_mul, py::arg("x"), py::arg("gate"), py::arg("out") = py::none(), py::kw_only(),
          py::arg("isa") = py::none());
    m.def("gdn_gates", &py_gdn_gates, py::arg("a"), py::arg("b"), py::arg("dt_bias"), py::arg("ssm_a"));
}
