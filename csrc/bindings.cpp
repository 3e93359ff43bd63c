// Python bindings: every argument is checked here (dtype, contiguity, shapes, block multiples)
// and raises ValueError; the GIL is released while kernels run.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "dispatch.h"
#include "layers.h"
#include "ops.h"
#include "quants.h"
#include "threadpool.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace py = pybind11;
using namespace clover;

void bind_model_ops(py::module_& m);  // bind_model_ops.cpp
KvType kv_type_of(const py::dtype& dt);  // bind_model_ops.cpp: a KV cache's element type, or ValueError

namespace {

[[noreturn]] void fail(const std::string& msg) { throw py::value_error(msg); }

const TypeInfo& parse_type(const std::string& name) {
    std::string lower = name;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return (char)std::tolower(c); });
    const TypeInfo* ti = type_info_by_name(lower.c_str());
    if (!ti) fail("unknown format '" + name + "' (known: f32, f16, bf16, q8_0, q4_0, q4_k, q5_k, q6_k)");
    return *ti;
}

bool is_r16(Type t) {
    const R16Format* f = r16_format_of(t);
    return f && f->to == t;
}

// the _r16 layouts' weights come in whole groups of 16 rows
void check_groups(const TypeInfo& ti, int64_t rows, const char* what) {
    if (is_r16(ti.type) && rows % R16)
        fail(std::string(what) + ": " + ti.name + " weights hold whole groups of 16 rows, got " + std::to_string(rows));
}

template <typename T>
void check_array(const py::array& a, const char* what, int ndim, const char* dtype_name) {
    if (!a.dtype().is(py::dtype::of<T>()))
        fail(std::string(what) + " must have dtype " + dtype_name + ", got " + std::string(py::str(a.dtype())));
    if (a.ndim() != ndim)
        fail(std::string(what) + " must be " + std::to_string(ndim) + "-D, got " + std::to_string(a.ndim()) + "-D");
    if (!(a.flags() & py::array::c_style)) fail(std::string(what) + " must be C-contiguous (use np.ascontiguousarray)");
}

const Kernels& kernels_arg(const std::optional<std::string>& isa) {
    try {
        return isa ? kernels_for(*isa) : active_kernels();
    } catch (const std::invalid_argument& e) {
        fail(e.what());
    }
}

// A [rows, row_bytes] uint8 weight array of the given format: K follows from row_bytes.
WeightView weight_view(const py::array& w, const TypeInfo& ti, const char* what) {
    check_array<uint8_t>(w, what, 2, "uint8");
    const size_t rb = (size_t)w.shape(1);
    if (rb == 0 || rb % ti.block_bytes != 0)
        fail(std::string(what) + ": row of " + std::to_string(rb) + " bytes is not a whole number of " + ti.name +
             " blocks (" + std::to_string(ti.block_bytes) + " bytes each)");
    check_groups(ti, (int64_t)w.shape(0), what);
    return WeightView{ti.type, (const uint8_t*)w.data(), (int64_t)w.shape(0),
                      (int64_t)(rb / ti.block_bytes) * ti.block_size, rb};
}

ExpertsView experts_view(const py::array& w, const TypeInfo& ti, const char* what) {
    check_array<uint8_t>(w, what, 3, "uint8");
    const size_t rb = (size_t)w.shape(2);
    if (rb == 0 || rb % ti.block_bytes != 0)
        fail(std::string(what) + ": row of " + std::to_string(rb) + " bytes is not a whole number of " + ti.name +
             " blocks");
    check_groups(ti, (int64_t)w.shape(1), what);
    ExpertsView v;
    v.w = WeightView{ti.type, (const uint8_t*)w.data(), (int64_t)w.shape(1),
                     (int64_t)(rb / ti.block_bytes) * ti.block_size, rb};
    v.n_expert = (int64_t)w.shape(0);
    return v;
}

// x: float32 rows, or float16 rows, or bf16 rows as uint16 (bf16=True); widened per row chunk on
// the worker threads, so a converter can hand over raw checkpoint bytes. imatrix: the tensor's importance
// matrix (float32 [k], llama-imatrix's), for the types whose quantizers take one (takes_imatrix), or None.
py::array_t<uint8_t> py_quantize(const py::array& x, const std::string& type, bool bf16,
                                 const std::optional<py::array>& imatrix) {
    const TypeInfo& ti = parse_type(type);
    if (is_r16(ti.type)) fail(std::string(ti.name) + " is a layout made at load (repack_r16), not a format to quantize to");
    if (!has_quantizer(ti.type)) fail(std::string("clover-cpu has no quantizer for ") + ti.name + " (it reads and multiplies it)");
    enum { F32, F16, BF16 } src;
    if (bf16) {
        check_array<uint16_t>(x, "x", 2, "uint16 (bf16 bits)");
        src = BF16;
    } else if (x.dtype().is(py::dtype("float16"))) {
        if (x.ndim() != 2) fail("x must be 2-D, got " + std::to_string(x.ndim()) + "-D");
        if (!(x.flags() & py::array::c_style)) fail("x must be C-contiguous (use np.ascontiguousarray)");
        src = F16;
    } else {
        check_array<float>(x, "x", 2, "float32");
        src = F32;
    }
    const int64_t rows = x.shape(0), k = x.shape(1);
    if (k % ti.block_size != 0)
        fail("row length " + std::to_string(k) + " is not a multiple of the " + ti.name + " block size " +
             std::to_string(ti.block_size));
    const float* qw = nullptr;
    if (imatrix) {
        if (!takes_imatrix(ti.type))
            fail(std::string("the ") + ti.name +
                 " quantizer takes no importance matrix (q2_k .. q6_k, q4_0, q4_1, q5_0, q5_1, iq4_nl and iq4_xs do)");
        check_array<float>(*imatrix, "imatrix", 1, "float32");
        if (imatrix->shape(0) != k)
            fail("imatrix has " + std::to_string(imatrix->shape(0)) + " values for rows of " + std::to_string(k));
        qw = (const float*)imatrix->data();
    }
    // (the chunks' rows are independent: the importance matrix is per column)
    auto quant = [&](const float* s, uint8_t* d, int64_t n) {
        if (qw)
            quantize_rows_lowbit(ti.type, s, d, n, k, qw);
        else
            quantize_rows(ti.type, s, d, n, k);
    };
    const size_t rb = row_bytes(ti, k);
    py::array_t<uint8_t> out({(py::ssize_t)rows, (py::ssize_t)rb});
    const uint8_t* in = (const uint8_t*)x.data();
    uint8_t* dst = out.mutable_data();
    {
        py::gil_scoped_release nogil;
        const int64_t chunk = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, k));
        const int64_t n_tasks = (rows + chunk - 1) / chunk;
        pool()->run(n_tasks, [&](int64_t t, int) {
            const int64_t r0 = t * chunk, r1 = std::min(rows, r0 + chunk);
            if (src == F32) {
                quant((const float*)in + r0 * k, dst + r0 * rb, r1 - r0);
                return;
            }
            std::vector<float> buf((size_t)(r1 - r0) * k);
            const uint16_t* h = (const uint16_t*)in + r0 * k;
            for (size_t i = 0; i < buf.size(); i++) buf[i] = src == F16 ? fp16_to_f32(h[i]) : bf16_to_f32(h[i]);
            quant(buf.data(), dst + r0 * rb, r1 - r0);
        });
    }
    return out;
}

// The activation quantizers (what the kernels multiply weights against), for tests: kind "q8_a" (32
// values per block, Q8_0/Q4_0 weights) or "q8_K" (256, k-quants); simd picks the AVX2 twin (where the
// build and CPU have it) or the scalar reference.
py::array_t<uint8_t> py_quantize_acts(const py::array& x, const std::string& kind, bool simd) {
    check_array<float>(x, "x", 2, "float32");
    const bool k_quant = kind == "q8_K";
    if (!k_quant && kind != "q8_a") fail("kind must be 'q8_a' or 'q8_K'");
    const int64_t M = x.shape(0), K = x.shape(1), block = k_quant ? QK_K : QK;
    if (K % block) fail("x columns must be a multiple of " + std::to_string(block));
    const ActQuant& aq = simd && act_quant_avx2() && cpu_features().avx2 ? *act_quant_avx2() : act_quant_ref();
    const size_t rb = (size_t)(K / block) * (k_quant ? sizeof(block_q8_K) : sizeof(block_q8_a));
    py::array_t<uint8_t> out({(py::ssize_t)M, (py::ssize_t)rb});
    const float* X = (const float*)x.data();
    uint8_t* O = out.mutable_data();
    for (int64_t m = 0; m < M; m++) {
        if (k_quant)
            aq.q8_K(X + m * K, (block_q8_K*)(O + m * rb), K);
        else
            aq.q8_a(X + m * K, (block_q8_a*)(O + m * rb), K);
    }
    return out;
}

py::array_t<float> py_dequantize(const py::array& data, const std::string& type) {
    const TypeInfo& ti = parse_type(type);
    const WeightView w = weight_view(data, ti, "data");
    py::array_t<float> out({(py::ssize_t)w.rows, (py::ssize_t)w.k});
    float* dst = out.mutable_data();
    {
        py::gil_scoped_release nogil;
        int64_t chunk = std::max<int64_t>(1, (1 << 16) / w.k);
        if (is_r16(ti.type)) chunk = (chunk + R16 - 1) / R16 * R16;
        pool()->run((w.rows + chunk - 1) / chunk, [&](int64_t t, int) {
            const int64_t r0 = t * chunk, r1 = std::min(w.rows, r0 + chunk);
            dequantize_rows(ti.type, w.data + r0 * w.row_bytes, dst + r0 * w.k, r1 - r0, w.k);
        });
    }
    return out;
}

// This process's read-only shared mappings of files (/proc/self/maps; none where there is no such file):
// the memory we release, whose pages MADV_DONTNEED drops without losing data (they fault back in from the
// file). An anonymous mapping's pages would come back as zeros, a private one's without its changes (a
// private mapping made read-only after a write still holds them).
struct Mapping {
    uintptr_t lo, hi;
};
std::vector<Mapping> file_mappings() {
    std::vector<Mapping> out;
#if defined(__linux__)
    FILE* f = std::fopen("/proc/self/maps", "r");
    if (!f) return out;
    char line[512];
    bool at_start = true;  // (a long path splits a line: its tail must not be read as a mapping)
    while (std::fgets(line, sizeof line, f)) {
        unsigned long lo = 0, hi = 0, inode = 0;
        char perms[8] = {};
        if (at_start && std::sscanf(line, "%lx-%lx %7s %*s %*s %lu", &lo, &hi, perms, &inode) == 4 &&
            perms[1] == '-' && perms[3] == 's' && inode != 0)
            out.push_back({(uintptr_t)lo, (uintptr_t)hi});
        at_start = std::strchr(line, '\n') != nullptr;
    }
    std::fclose(f);
#endif
    return out;
}

// Whether [a, b) lies wholly in the mappings (adjacent ones may cover it together; maps are sorted).
bool read_only_file_pages(const std::vector<Mapping>& maps, uintptr_t a, uintptr_t b) {
    for (const Mapping& m : maps) {
        if (m.hi <= a || m.lo > a) continue;
        a = m.hi;
        if (a >= b) return true;
    }
    return false;
}

// The formats repack_r16 makes (quants.h's R16Format): from q4_k (148 bytes per row and super-block), q3_k
// (114), q2_k (84), q5_k (180), q6_k (210), iq4_xs (138), iq3_xxs and iq3_s (138, transcoded to 4-bit codes),
// iq4_nl (144) and mxfp4 (136; both per 256 weights, as the file).
const R16Format& r16_format(const std::string& name) {
    const TypeInfo& ti = parse_type(name);
    if (const R16Format* f = r16_format_of(ti.type); f && f->from == ti.type) return *f;
    fail("repack_r16 takes q4_k, q3_k, q2_k, q5_k, q6_k, iq4_xs, iq3_xxs, iq3_s, iq4_nl or mxfp4 weights, got " + name);
}

// Weight arrays of format fmts[i] (r16_format's) -> the same shapes in its _r16 layout: [rows, row_bytes]
// or stacked experts [E, rows, row_bytes], rows a multiple of 16. The results are views of one buffer of
// their own, 2 MB aligned (huge pages where the kernel gives them on request; one buffer, so no huge page
// is left part-filled at the end of each array). release: where a source is a read-only shared mapping of
// a file (Linux), its whole pages are dropped from this process once it is repacked (MADV_DONTNEED: they
// stay in the page cache and fault back in if read), so the process never holds both copies; other memory
// is left alone.
py::list py_repack_r16(const py::sequence& ws, const std::vector<std::string>& fmts, bool release) {
    struct Job {
        py::array w;
        int64_t E, rows, k;
        size_t rb, orb, offset;
        const R16Format* f;
    };
    std::vector<Job> jobs;
    size_t total = 0;
    if (fmts.size() != py::len(ws))
        fail("repack_r16: " + std::to_string(py::len(ws)) + " arrays but " + std::to_string(fmts.size()) + " formats");
    for (size_t i = 0; i < py::len(ws); i++) {
        const std::string what = "w[" + std::to_string(i) + "]";
        const R16Format& f = r16_format(fmts[i]);
        const TypeInfo& from = *type_info((int32_t)f.from);
        if (!py::isinstance<py::array>(ws[i])) fail(what + " is not an array");
        py::array w = py::reinterpret_borrow<py::array>(ws[i]);
        if (!w.dtype().is(py::dtype::of<uint8_t>())) fail(what + " must have dtype uint8");
        if (w.ndim() != 2 && w.ndim() != 3) fail(what + " must be 2-D [rows, row_bytes] or 3-D [experts, rows, row_bytes]");
        if (!(w.flags() & py::array::c_style)) fail(what + " must be C-contiguous");
        const int nd = (int)w.ndim();
        Job j{w, nd == 3 ? (int64_t)w.shape(0) : 1, (int64_t)w.shape(nd - 2), 0, (size_t)w.shape(nd - 1), 0, 0, &f};
        // (iq4_nl's and mxfp4's blocks hold 32 weights: their rows must be whole runs of 8, 256 weights)
        const size_t sb_bytes = (size_t)from.block_bytes * (QK_K / from.block_size);
        if (j.rb == 0 || j.rb % sb_bytes)
            fail(what + ": rows are not whole " + from.name + " super-blocks (" + std::to_string(sb_bytes) +
                 " bytes per 256 weights)");
        if (j.rows % R16) fail(what + ": repacking takes rows in groups of 16, got " + std::to_string(j.rows) + " rows");
        j.k = (int64_t)(j.rb / sb_bytes) * QK_K;
        j.orb = row_bytes(*type_info((int32_t)f.to), j.k);
        j.offset = total;
        total += ((size_t)j.E * j.rows * j.orb + 63) / 64 * 64;
        jobs.push_back(std::move(j));
    }
    if (jobs.empty()) return py::list();
    const std::vector<Mapping> maps = release ? file_mappings() : std::vector<Mapping>{};
    constexpr size_t ALIGN = 2u << 20;
    const size_t bytes = std::max<size_t>(ALIGN, (total + ALIGN - 1) / ALIGN * ALIGN);
    uint8_t* out = (uint8_t*)::operator new(bytes, std::align_val_t(ALIGN));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(out, bytes, MADV_HUGEPAGE);
#endif
    py::capsule owner(out, [](void* p) { ::operator delete(p, std::align_val_t(ALIGN)); });
    {
        py::gil_scoped_release nogil;
        for (const Job& j : jobs) {
            const uint8_t* src = (const uint8_t*)j.w.data();
            const int64_t n = j.E * j.rows / R16;  // groups (an expert's rows are whole groups)
            const int64_t chunk = std::max<int64_t>(1, (int64_t)((1 << 20) / (R16 * j.rb)));
            pool()->run((n + chunk - 1) / chunk, [&](int64_t t, int) {
                j.f->repack(src, j.rb, t * chunk, std::min(n, (t + 1) * chunk), j.k, out + j.offset);
            });
#if defined(__linux__)
            if (release) {
                const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
                const uintptr_t a = ((uintptr_t)src + page - 1) / page * page;
                const uintptr_t b = ((uintptr_t)src + (size_t)j.E * j.rows * j.rb) / page * page;
                if (b > a && read_only_file_pages(maps, a, b)) madvise((void*)a, b - a, MADV_DONTNEED);
            }
#endif
        }
    }
    py::list res;
    for (const Job& j : jobs) {
        std::vector<py::ssize_t> shape;
        if (j.w.ndim() == 3) shape.push_back((py::ssize_t)j.E);
        shape.push_back((py::ssize_t)j.rows);
        shape.push_back((py::ssize_t)j.orb);
        res.append(py::array_t<uint8_t>(shape, out + j.offset, owner));
    }
    return res;
}

py::array_t<float> py_matmul(const py::array& x, const py::array& w, const std::string& type,
                             const std::optional<std::string>& isa) {
    const TypeInfo& ti = parse_type(type);
    const Kernels& kr = kernels_arg(isa);
    check_array<float>(x, "x", 2, "float32");
    const WeightView W = weight_view(w, ti, "w");
    if (x.shape(1) != W.k)
        fail("x has " + std::to_string(x.shape(1)) + " columns but the weight rows hold " + std::to_string(W.k) +
             " values");
    const int64_t M = x.shape(0);
    py::array_t<float> y({(py::ssize_t)M, (py::ssize_t)W.rows});
    const float* X = (const float*)x.data();
    float* Y = y.mutable_data();
    if (M > 0 && W.rows > 0) {
        py::gil_scoped_release nogil;
        matmul(kr, W, X, M, Y);
    }
    return y;
}

py::list py_matmul_many(const py::array& x, const py::sequence& ws, const py::sequence& types,
                        const std::optional<std::string>& isa) {
    const Kernels& kr = kernels_arg(isa);
    check_array<float>(x, "x", 2, "float32");
    if (py::len(ws) != py::len(types)) fail("matmul_many needs one type per weight");
    const size_t n = py::len(ws);
    std::vector<py::array> keep;  // the weight arrays stay referenced while the kernels run
    std::vector<WeightView> Ws;
    for (size_t i = 0; i < n; i++) {
        if (!py::isinstance<py::array>(ws[i])) fail("matmul_many: weight " + std::to_string(i) + " is not an array");
        keep.push_back(py::reinterpret_borrow<py::array>(ws[i]));
        const std::string name = "w[" + std::to_string(i) + "]";
        Ws.push_back(weight_view(keep.back(), parse_type(types[i].cast<std::string>()), name.c_str()));
        if (x.shape(1) != Ws.back().k)
            fail("x has " + std::to_string(x.shape(1)) + " columns but the rows of " + name + " hold " +
                 std::to_string(Ws.back().k) + " values");
    }
    const int64_t M = x.shape(0);
    py::list out;
    std::vector<float*> Ys;
    for (const WeightView& W : Ws) {
        py::array_t<float> y({(py::ssize_t)M, (py::ssize_t)W.rows});
        Ys.push_back(y.mutable_data());
        out.append(y);
    }
    if (M > 0 && n > 0) {
        const float* X = (const float*)x.data();
        py::gil_scoped_release nogil;
        matmul_many(kr, Ws.data(), n, X, M, Ys.data());
    }
    return out;
}

// Stacked experts that fit rows of H activations: gate and up [E, I, H] (formats with the same
// activations), down [E, H, I].
void check_experts(const ExpertsView& g, const ExpertsView& u, const ExpertsView& d, int64_t H) {
    if (g.w.k != H || u.w.k != H) fail("gate and up experts must take rows of " + std::to_string(H) + " (x columns)");
    if (u.w.rows != g.w.rows || u.n_expert != g.n_expert) fail("gate and up experts must have the same shape");
    if (d.n_expert != g.n_expert) fail("down must have as many experts as gate");
    if (d.w.rows != H || d.w.k != g.w.rows)
        fail("down experts must be [E, " + std::to_string(H) + ", " + std::to_string(g.w.rows) + "]");
    if (act_format(g.w.type) != act_format(u.w.type)) fail("gate and up must use formats with the same activations");
}

py::tuple py_moe(const py::array& x, const py::array& ids, const py::array& weights, const py::array& gate,
                 const py::array& up, const py::array& down, const std::string& gate_type, const std::string& up_type,
                 const std::string& down_type, const std::optional<std::string>& isa) {
    const Kernels& kr = kernels_arg(isa);
    check_array<float>(x, "x", 2, "float32");
    check_array<int32_t>(ids, "ids", 2, "int32");
    check_array<float>(weights, "weights", 2, "float32");
    const ExpertsView g = experts_view(gate, parse_type(gate_type), "gate");
    const ExpertsView u = experts_view(up, parse_type(up_type), "up");
    const ExpertsView d = experts_view(down, parse_type(down_type), "down");
    const int64_t M = x.shape(0), H = x.shape(1);
    check_experts(g, u, d, H);
    if (ids.shape(0) != M || weights.shape(0) != M || ids.shape(1) != weights.shape(1))
        fail("ids and weights must both be [" + std::to_string(M) + ", top_k]");
    const int top_k = (int)ids.shape(1);
    const int32_t* id = (const int32_t*)ids.data();
    for (int64_t i = 0; i < M * top_k; i++)
        if (id[i] < 0 || id[i] >= g.n_expert)
            fail("expert id " + std::to_string(id[i]) + " out of range [0, " + std::to_string(g.n_expert) + ")");
    py::array_t<float> out({(py::ssize_t)M, (py::ssize_t)H});
    int n_used = 0;
    const float* X = (const float*)x.data();
    const float* wt = (const float*)weights.data();
    float* O = out.mutable_data();
    if (M > 0 && top_k > 0) {
        py::gil_scoped_release nogil;
        n_used = moe(kr, X, M, id, wt, top_k, g, u, d, O);
    } else {
        std::fill(O, O + M * H, 0.f);
    }
    return py::make_tuple(out, n_used);
}

WeightView weight_arg(const py::object& obj, const char* what) {
    if (!py::isinstance<py::tuple>(obj) || py::len(obj) != 2)
        fail(std::string(what) + " must be a (uint8 array, format name) pair");
    const py::tuple wt = py::reinterpret_borrow<py::tuple>(obj);
    if (!py::isinstance<py::array>(wt[0]) || !py::isinstance<py::str>(wt[1]))
        fail(std::string(what) + " must be a (uint8 array, format name) pair");
    return weight_view(py::reinterpret_borrow<py::array>(wt[0]), parse_type(wt[1].cast<std::string>()), what);
}

void check_moe_block(const WeightView& R, const ExpertsView& g, const ExpertsView& u, const ExpertsView& d,
                     const WeightView& GS, const WeightView& US, const WeightView& DS, const WeightView& SG, int top_k,
                     int64_t H) {
    for (const WeightView* w : {&R, &GS, &US, &SG})
        if (w->k != H) fail("router, gate_sh, up_sh and shexp_gate must take rows of " + std::to_string(H) + " (x columns)");
    if (SG.rows != 1) fail("shexp_gate must have one row");
    if (US.rows != GS.rows || DS.k != GS.rows || DS.rows != H)
        fail("the shared expert must be gate/up [I, " + std::to_string(H) + "] and down [" + std::to_string(H) + ", I]");
    check_experts(g, u, d, H);
    if (R.rows != g.n_expert) fail("the router must have one row per expert (" + std::to_string(g.n_expert) + ")");
    if (top_k < 1 || top_k > g.n_expert) fail("top_k must be in [1, " + std::to_string(g.n_expert) + "]");
}

py::tuple py_moe_block(const py::array& x, const py::object& router, int top_k, const py::array& gate,
                       const py::array& up, const py::array& down, const std::string& gate_type,
                       const std::string& down_type, const py::object& gate_sh, const py::object& up_sh,
                       const py::object& down_sh, const py::object& shexp_gate, const std::optional<std::string>& isa,
                       bool prefetch) {
    const Kernels& kr = kernels_arg(isa);
    check_array<float>(x, "x", 2, "float32");
    const int64_t M = x.shape(0), H = x.shape(1);
    const WeightView R = weight_arg(router, "router"), GS = weight_arg(gate_sh, "gate_sh"),
                     US = weight_arg(up_sh, "up_sh"), DS = weight_arg(down_sh, "down_sh"),
                     SG = weight_arg(shexp_gate, "shexp_gate");
    const ExpertsView g = experts_view(gate, parse_type(gate_type), "gate");
    const ExpertsView u = experts_view(up, parse_type(gate_type), "up");
    const ExpertsView d = experts_view(down, parse_type(down_type), "down");
    check_moe_block(R, g, u, d, GS, US, DS, SG, top_k, H);
    py::array_t<float> out({(py::ssize_t)M, (py::ssize_t)H});
    int n_used = 0;
    const float* X = (const float*)x.data();
    float* O = out.mutable_data();
    if (M > 0) {
        py::gil_scoped_release nogil;
        n_used = moe_block(kr, X, M, R, top_k, g, u, d, GS, US, DS, SG, O, prefetch);
    }
    return py::make_tuple(out, n_used);
}

// The per-layer weights of a model, checked once at load, for the fused sub-layers (layers.h): the
// Python forward then makes two calls per layer. The arrays it was given (views of the mapped file,
// dequantized norms) stay referenced for its lifetime. set_gdn / set_attn / set_moe are for loading: a
// layer set again while another thread runs it would be read half-written.
class LayerStack {
  public:
    LayerStack(int64_t n_layer, int64_t H, float eps) : H_(H), eps_(eps) {
        if (n_layer < 1 || n_layer > (1 << 20) || H < 1) fail("a layer stack needs 1 <= n_layer <= 2^20 and H >= 1");
        if (!(eps >= 0.f)) fail("eps must be >= 0");
        gdn_.resize(n_layer);
        attn_.resize(n_layer);
        moe_.resize(n_layer);
    }

    void set_gdn(int64_t i, const py::array& norm, const py::object& qkv, const py::object& z, const py::object& alpha,
                 const py::object& beta, const py::object& out, const py::array& conv, const py::array& dt_bias,
                 const py::array& ssm_a, const py::array& ssm_norm, int64_t n_k_heads, int64_t n_v_heads, int64_t dk,
                 int64_t dv) {
        layer(i);
        if (n_k_heads < 1 || dk < 1 || dv < 1 || n_v_heads % n_k_heads)
            fail("GDN heads: n_v_heads must be a multiple of n_k_heads >= 1, dk and dv >= 1");
        GdnWeights w;
        w.norm = vec(norm, "attn_norm", H_);
        w.qkv = weight_arg(qkv, "qkv");
        w.z = weight_arg(z, "z");
        w.alpha = weight_arg(alpha, "alpha");
        w.beta = weight_arg(beta, "beta");
        w.out = weight_arg(out, "ssm_out");
        const int64_t C = 2 * n_k_heads * dk + n_v_heads * dv, V = n_v_heads * dv;
        for (const WeightView* m : {&w.qkv, &w.z, &w.alpha, &w.beta})
            if (m->k != H_) fail("qkv, z, alpha and beta must take rows of " + std::to_string(H_));
        if (w.qkv.rows != C || w.z.rows != V || w.alpha.rows != n_v_heads || w.beta.rows != n_v_heads)
            fail("GDN projections: qkv must have " + std::to_string(C) + " rows, z " + std::to_string(V) +
                 ", alpha and beta " + std::to_string(n_v_heads));
        if (w.out.rows != H_ || w.out.k != V)
            fail("ssm_out must be [" + std::to_string(H_) + ", " + std::to_string(V) + "]");
        check_array<float>(conv, "conv", 2, "float32");
        if (conv.shape(0) != C || conv.shape(1) < 1) fail("conv must be [" + std::to_string(C) + ", K >= 1]");
        w.conv = (const float*)conv.data();
        w.conv_k = conv.shape(1);
        w.dt_bias = vec(dt_bias, "dt_bias", n_v_heads);
        w.ssm_a = vec(ssm_a, "ssm_a", n_v_heads);
        w.ssm_norm = vec(ssm_norm, "ssm_norm", dv);
        w.n_k_heads = n_k_heads;
        w.n_v_heads = n_v_heads;
        w.dk = dk;
        w.dv = dv;
        for (const py::object& o : {py::object(norm), qkv, z, alpha, beta, out, py::object(conv), py::object(dt_bias),
                                    py::object(ssm_a), py::object(ssm_norm)})
            keep_.push_back(o);
        gdn_[i] = w;
    }

    void set_attn(int64_t i, const py::array& norm, const py::object& q, const py::object& k, const py::object& v,
                  const py::object& o, const py::array& q_norm, const py::array& k_norm, int64_t n_head,
                  int64_t n_head_kv, int64_t D, int64_t n_rot, double theta) {
        layer(i);
        if (n_head_kv < 1 || D < 1 || n_head % n_head_kv)
            fail("attention heads: n_head must be a multiple of n_head_kv >= 1, D >= 1");
        if (n_rot < 0 || n_rot > D || n_rot % 2) fail("n_rot must be even and in [0, D]");
        if (!(theta > 0.0) || !std::isfinite(theta)) fail("theta must be a positive finite number");
        AttnWeights w;
        w.norm = vec(norm, "attn_norm", H_);
        w.q = weight_arg(q, "q");
        w.k = weight_arg(k, "k");
        w.v = weight_arg(v, "v");
        w.o = weight_arg(o, "attn_output");
        for (const WeightView* m : {&w.q, &w.k, &w.v})
            if (m->k != H_) fail("q, k and v must take rows of " + std::to_string(H_));
        if (w.q.rows != 2 * n_head * D || w.k.rows != n_head_kv * D || w.v.rows != n_head_kv * D)
            fail("attention projections: q must have " + std::to_string(2 * n_head * D) + " rows (query and gate), k and v " +
                 std::to_string(n_head_kv * D));
        if (w.o.rows != H_ || w.o.k != n_head * D)
            fail("attn_output must be [" + std::to_string(H_) + ", " + std::to_string(n_head * D) + "]");
        w.q_norm = vec(q_norm, "q_norm", D);
        w.k_norm = vec(k_norm, "k_norm", D);
        w.n_head = n_head;
        w.n_head_kv = n_head_kv;
        w.D = D;
        w.n_rot = n_rot;
        w.theta = theta;
        for (const py::object& a : {py::object(norm), q, k, v, o, py::object(q_norm), py::object(k_norm)}) keep_.push_back(a);
        attn_[i] = w;
    }

    void set_moe(int64_t i, const py::array& norm, const py::object& router, const py::array& gate, const py::array& up,
                 const py::array& down, const std::string& gate_type, const std::string& down_type,
                 const py::object& gate_sh, const py::object& up_sh, const py::object& down_sh,
                 const py::object& shexp_gate, int top_k) {
        layer(i);
        MoeWeights w;
        w.norm = vec(norm, "post_attention_norm", H_);
        w.router = weight_arg(router, "router");
        w.gate_sh = weight_arg(gate_sh, "gate_sh");
        w.up_sh = weight_arg(up_sh, "up_sh");
        w.down_sh = weight_arg(down_sh, "down_sh");
        w.shexp_gate = weight_arg(shexp_gate, "shexp_gate");
        w.gate = experts_view(gate, parse_type(gate_type), "gate");
        w.up = experts_view(up, parse_type(gate_type), "up");
        w.down = experts_view(down, parse_type(down_type), "down");
        check_moe_block(w.router, w.gate, w.up, w.down, w.gate_sh, w.up_sh, w.down_sh, w.shexp_gate, top_k, H_);
        w.top_k = top_k;
        for (const py::object& o : {py::object(norm), router, py::object(gate), py::object(up), py::object(down), gate_sh,
                                    up_sh, down_sh, shexp_gate})
            keep_.push_back(o);
        moe_[i] = w;
    }

    // x [T, H] += the GDN mixer of layer i; the first `commit` tokens update the states in place.
    void gdn(int64_t i, py::array x, py::array conv_state, py::array ssm_state, int64_t commit) {
        layer(i);
        if (!gdn_[i]) fail("layer " + std::to_string(i) + " has no GDN weights");
        const GdnWeights& w = *gdn_[i];
        const int64_t T = rows_of(x);
        check_gdn_states(w, conv_state, ssm_state, commit, T);
        float* X = (float*)x.mutable_data();
        // (read only when nothing is committed: the delta rule then works on a copy)
        float *Cs = (float*)conv_state.data(), *Ss = (float*)ssm_state.data();
        if (T == 0) return;
        const Kernels& kr = active_kernels();
        py::gil_scoped_release nogil;
        gdn_residual(kr, w, eps_, X, T, H_, Cs, Ss, commit);
    }

    // x [T, H] += the attention mixer of layer i for positions n0 .. n0 + T - 1, whose keys and values go
    // to rows [n0, n0 + T) of the caches; block: None for the causal mask, B for the block-causal one.
    // out_rows (None: all): ascending rows of x whose outputs are wanted; the keys and values of every row
    // are written, and the other rows of x are left as they were (layers.h).
    void attn(int64_t i, py::array x, py::array k_cache, py::array v_cache, int64_t n0, std::optional<int64_t> block,
              const py::object& out_rows) {
        layer(i);
        if (!attn_[i]) fail("layer " + std::to_string(i) + " has no attention weights");
        const AttnWeights& w = *attn_[i];
        const int64_t T = rows_of(x);
        const KvType kv = check_kv(w, k_cache, v_cache, n0, T, block);
        const std::optional<std::vector<int64_t>> rows = rows_arg(out_rows, T);
        float* X = (float*)x.mutable_data();
        void *K = k_cache.mutable_data(), *V = v_cache.mutable_data();
        if (T == 0) return;
        const Kernels& kr = active_kernels();
        py::gil_scoped_release nogil;
        attn_residual(kr, w, eps_, X, T, H_, kv, K, V, n0, block ? AttnMask::BlockCausal : AttnMask::Causal,
                      block ? *block : 1, rows_ptr(rows), rows ? (int64_t)rows->size() : 0);
    }

    // Several sequences' spans in x, one after another (continuous batching, layers.h): segs is a list of
    // (t0, t1, conv_state, ssm_state, commit), one per sequence, covering the rows of x in order.
    void gdn_batch(int64_t i, py::array x, const py::list& segs) {
        layer(i);
        if (!gdn_[i]) fail("layer " + std::to_string(i) + " has no GDN weights");
        const GdnWeights& w = *gdn_[i];
        const int64_t T = rows_of(x);
        std::vector<GdnSeg> sg;
        int64_t next = 0;
        for (const py::handle& h : segs) {
            const py::tuple t = seg_tuple(h, 5, "(t0, t1, conv_state, ssm_state, commit)");
            const int64_t t0 = t[0].cast<int64_t>(), t1 = t[1].cast<int64_t>(), commit = t[4].cast<int64_t>();
            if (t0 != next || t1 < t0 || t1 > T) fail("segments must cover the rows of x in order");
            next = t1;
            const py::array conv = t[2].cast<py::array>(), ssm = t[3].cast<py::array>();
            check_gdn_states(w, conv, ssm, commit, t1 - t0);
            sg.push_back({t0, t1, (float*)conv.data(), (float*)ssm.data(), commit});
        }
        if (next != T) fail("segments must cover the rows of x in order");
        float* X = (float*)x.mutable_data();
        if (T == 0) return;
        const Kernels& kr = active_kernels();
        py::gil_scoped_release nogil;
        gdn_residual_segs(kr, w, eps_, X, T, H_, sg.data(), (int64_t)sg.size());
    }

    // segs: a list of (t0, t1, k_cache, v_cache, n0, block or None), one per sequence (as gdn_batch).
    void attn_batch(int64_t i, py::array x, const py::list& segs, const py::object& out_rows) {
        layer(i);
        if (!attn_[i]) fail("layer " + std::to_string(i) + " has no attention weights");
        const AttnWeights& w = *attn_[i];
        const int64_t T = rows_of(x);
        std::vector<AttnSeg> sg;
        std::optional<KvType> kv;
        int64_t next = 0;
        for (const py::handle& h : segs) {
            const py::tuple t = seg_tuple(h, 6, "(t0, t1, k_cache, v_cache, n0, block)");
            const int64_t t0 = t[0].cast<int64_t>(), t1 = t[1].cast<int64_t>(), n0 = t[4].cast<int64_t>();
            if (t0 != next || t1 < t0 || t1 > T) fail("segments must cover the rows of x in order");
            next = t1;
            const std::optional<int64_t> block = t[5].is_none() ? std::nullopt : std::optional<int64_t>(t[5].cast<int64_t>());
            py::array k = t[2].cast<py::array>(), v = t[3].cast<py::array>();
            const KvType this_kv = check_kv(w, k, v, n0, t1 - t0, block);
            if (kv && *kv != this_kv) fail("every segment's KV caches must have the same dtype");
            kv = this_kv;
            sg.push_back({t0, t1, k.mutable_data(), v.mutable_data(), n0,
                          block ? AttnMask::BlockCausal : AttnMask::Causal, block ? *block : 1});
        }
        if (next != T) fail("segments must cover the rows of x in order");
        const std::optional<std::vector<int64_t>> rows = rows_arg(out_rows, T);
        float* X = (float*)x.mutable_data();
        if (T == 0) return;
        const Kernels& kr = active_kernels();
        py::gil_scoped_release nogil;
        attn_residual_segs(kr, w, eps_, X, T, H_, *kv, sg.data(), (int64_t)sg.size(), rows_ptr(rows),
                           rows ? (int64_t)rows->size() : 0);
    }

    // x [T, H] += the feed-forward of layer i; returns the number of distinct routed experts used.
    int moe(int64_t i, py::array x, bool prefetch) {
        layer(i);
        if (!moe_[i]) fail("layer " + std::to_string(i) + " has no MoE weights");
        const int64_t T = rows_of(x);
        float* X = (float*)x.mutable_data();
        if (T == 0) return 0;
        const Kernels& kr = active_kernels();
        py::gil_scoped_release nogil;
        return moe_residual(kr, *moe_[i], eps_, X, T, H_, prefetch);
    }

  private:
    // None, or row indices of x in [0, T), strictly ascending.
    static std::optional<std::vector<int64_t>> rows_arg(const py::object& o, int64_t T) {
        if (o.is_none()) return std::nullopt;
        std::vector<int64_t> rows;
        for (const py::handle& h : o) {
            const int64_t r = h.cast<int64_t>();
            if (r < 0 || r >= T || (!rows.empty() && r <= rows.back()))
                fail("out_rows must be ascending row indices in [0, " + std::to_string(T) + ")");
            rows.push_back(r);
        }
        return rows;
    }

    // out_rows for layers.h: nullptr for all rows, else a pointer that is not null even for no rows (an empty
    // vector's data() may be null, which would mean all of them)
    static const int64_t* rows_ptr(const std::optional<std::vector<int64_t>>& rows) {
        static const int64_t none = 0;
        return !rows ? nullptr : rows->empty() ? &none : rows->data();
    }

    static void check_gdn_states(const GdnWeights& w, const py::array& conv_state, const py::array& ssm_state,
                                 int64_t commit, int64_t T) {
        check_array<float>(conv_state, "conv_state", 2, "float32");
        check_array<float>(ssm_state, "ssm_state", 3, "float32");
        if (conv_state.shape(0) != w.conv_k - 1 || conv_state.shape(1) != w.qkv.rows)
            fail("conv_state must be [" + std::to_string(w.conv_k - 1) + ", " + std::to_string(w.qkv.rows) + "]");
        if (ssm_state.shape(0) != w.n_v_heads || ssm_state.shape(1) != w.dk || ssm_state.shape(2) != w.dv)
            fail("ssm_state must be [" + std::to_string(w.n_v_heads) + ", " + std::to_string(w.dk) + ", " +
                 std::to_string(w.dv) + "]");
        if (commit > 0 && (!conv_state.writeable() || !ssm_state.writeable()))
            fail("the GDN states must be writeable (a commit updates them)");
        if (commit < 0 || commit > T) fail("commit must be in [0, " + std::to_string(T) + "]");
    }
    static KvType check_kv(const AttnWeights& w, const py::array& k_cache, const py::array& v_cache, int64_t n0,
                           int64_t T, std::optional<int64_t> block) {
        const py::dtype dt = k_cache.dtype();
        const KvType kv = kv_type_of(dt);
        if (kv == KvType::Q8_0 && w.D % KV_Q8_BLOCK) fail("a Q8_0 KV cache needs a head dim that is a multiple of 32");
        const int64_t width = kv == KvType::Q8_0 ? kv_head_bytes(kv, w.D) : w.D;
        for (const py::array* c : {&k_cache, &v_cache}) {
            if (!c->dtype().is(dt)) fail("k_cache and v_cache must have the same dtype");
            if (c->ndim() != 3 || c->shape(1) != w.n_head_kv || c->shape(2) != width)
                fail("the KV caches must be [S, " + std::to_string(w.n_head_kv) + ", " + std::to_string(width) + "]");
            if (!(c->flags() & py::array::c_style)) fail("the KV caches must be C-contiguous");
            if (!c->writeable()) fail("the KV caches must be writeable (the span's rows are written)");
        }
        if (k_cache.shape(0) != v_cache.shape(0)) fail("k_cache and v_cache must have the same rows");
        if (n0 < 0 || n0 > k_cache.shape(0) - T || n0 + T > INT32_MAX)
            fail("rows [n0, n0 + T) must lie in the caches' " + std::to_string(k_cache.shape(0)) + " rows");
        if (block && *block < 1) fail("block must be >= 1");
        return kv;
    }
    static py::tuple seg_tuple(const py::handle& h, size_t n, const char* shape) {
        if (!py::isinstance<py::tuple>(h) || py::len(h) != n) fail(std::string("each segment must be ") + shape);
        return py::reinterpret_borrow<py::tuple>(h);
    }
    void layer(int64_t i) const {
        if (i < 0 || i >= (int64_t)gdn_.size())
            fail("layer " + std::to_string(i) + " out of range [0, " + std::to_string(gdn_.size()) + ")");
    }
    const float* vec(const py::array& a, const char* what, int64_t n) const {
        check_array<float>(a, what, 1, "float32");
        if (a.shape(0) != n) fail(std::string(what) + " must have " + std::to_string(n) + " values");
        return (const float*)a.data();
    }
    int64_t rows_of(const py::array& x) const {
        check_array<float>(x, "x", 2, "float32");
        if (x.shape(1) != H_) fail("x must be [T, " + std::to_string(H_) + "]");
        if (!x.writeable()) fail("x must be writeable (updated in place)");
        return x.shape(0);
    }

    int64_t H_;
    float eps_;
    std::vector<std::optional<GdnWeights>> gdn_;
    std::vector<std::optional<AttnWeights>> attn_;
    std::vector<std::optional<MoeWeights>> moe_;
    std::vector<py::object> keep_;
};

py::dict py_system_info() {
    const CpuFeatures f = cpu_features();
    py::dict feats;
    feats["avx2"] = f.avx2;
    feats["fma"] = f.fma;
    feats["f16c"] = f.f16c;
    feats["avx512f"] = f.avx512f;
    feats["avx512bw"] = f.avx512bw;
    feats["avx512vl"] = f.avx512vl;
    feats["avx512vnni"] = f.avx512vnni;
    feats["avx512vbmi"] = f.avx512vbmi;
    feats["avx512bitalg"] = f.avx512bitalg;
    feats["avxvnni"] = f.avxvnni;
    feats["neon"] = f.neon;
    feats["dotprod"] = f.dotprod;
    feats["i8mm"] = f.i8mm;
    py::dict d;
    d["isa"] = kernels_arg(std::nullopt).isa;
    d["available_isas"] = available_isas();
    d["threads"] = pool()->size();
    d["default_threads"] = default_num_threads();
    d["cpu_features"] = feats;
#if defined(CLOVER_NATIVE)
    d["native_build"] = true;
#else
    d["native_build"] = false;
#endif
    return d;
}

}  // namespace

namespace {

// A forward allocates and frees its activations (numpy arrays of 0.1-30 MB) on every call. With
// glibc's defaults, once the process has run a small forward, every larger one gets fresh pages
// from the kernel and returns them when it ends (mmap'd chunks, heap trimming): measured on the
// bench twin, a 128-token prefill ran at 67-72 tok/s after an 8-token one, against 94-101 without
// it. Fixed thresholds keep such buffers in the heap for reuse. Set at import, unless the user set
// glibc's own variables.
void tune_allocator() {
#if defined(__GLIBC__)
    if (std::getenv("MALLOC_MMAP_THRESHOLD_") || std::getenv("MALLOC_TRIM_THRESHOLD_") || std::getenv("MALLOC_TOP_PAD_"))
        return;
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

}  // namespace

PYBIND11_MODULE(_core, m) {
    tune_allocator();
    m.doc() = "clover-cpu kernels: GGUF block formats, quantized matrix products, mixture of experts";
    m.def("system_info", &py_system_info, "ISA path, thread count and CPU features");
    m.def(
        "set_isa", [](const std::string& isa) {
            try {
                set_active_isa(isa);
            } catch (const std::invalid_argument& e) {
                fail(e.what());
            }
        },
        py::arg("isa"));
    m.def(
        "set_num_threads",
        [](int n) {
            if (n < 0) fail("threads must be >= 0 (0 = one per physical core)");
            py::gil_scoped_release nogil;
            set_num_threads(n);
        },
        py::arg("n"));
    m.def("num_threads", [] { return pool()->size(); });
    m.def("quantize", &py_quantize, py::arg("x"), py::arg("type"), py::kw_only(), py::arg("bf16") = false,
          py::arg("imatrix") = py::none());
    m.def("set_fast_quant_search", &set_fast_quant_search, py::arg("fast"),
          "k-quant quantizers: True = the active ISA's search (default), False = the scalar reference");
    m.def("dequantize", &py_dequantize, py::arg("data"), py::arg("type"));
    m.def("repack_r16", &py_repack_r16, py::arg("ws"), py::arg("formats"), py::kw_only(), py::arg("release") = false);
    m.def(
        "has_native_r16",
        [](const std::string& fmt, const std::optional<std::string>& isa) {
            const Kernels& k = kernels_arg(isa);
            return has_native_r16(k, r16_format(fmt).to);
        },
        py::arg("format"), py::arg("isa") = py::none());
    m.def(
        "amx_min_tokens",
        [](const std::string& fmt, const std::optional<std::string>& isa) {
            const Kernels& k = kernels_arg(isa);
            return k.amx ? k.amx->min_tokens(parse_type(fmt).type) : 0;
        },
        py::arg("format"), py::arg("isa") = py::none());
    m.def("quantize_acts", &py_quantize_acts, py::arg("x"), py::arg("kind"), py::arg("simd"));
    m.def("matmul", &py_matmul, py::arg("x"), py::arg("w"), py::arg("type"), py::kw_only(),
          py::arg("isa") = py::none());
    m.def("matmul_many", &py_matmul_many, py::arg("x"), py::arg("ws"), py::arg("types"), py::kw_only(),
          py::arg("isa") = py::none());
    m.def("moe_block", &py_moe_block, py::arg("x"), py::arg("router"), py::arg("top_k"), py::arg("gate"),
          py::arg("up"), py::arg("down"), py::arg("gate_type"), py::arg("down_type"), py::arg("gate_sh"),
          py::arg("up_sh"), py::arg("down_sh"), py::arg("shexp_gate"), py::kw_only(), py::arg("isa") = py::none(),
          py::arg("prefetch") = false);
    m.def("experts_prefetched", &experts_prefetched);
    py::class_<LayerStack>(m, "LayerStack")
        .def(py::init<int64_t, int64_t, float>(), py::arg("n_layer"), py::arg("H"), py::arg("eps"))
        .def("set_gdn", &LayerStack::set_gdn, py::arg("i"), py::arg("norm"), py::arg("qkv"), py::arg("z"),
             py::arg("alpha"), py::arg("beta"), py::arg("out"), py::arg("conv"), py::arg("dt_bias"), py::arg("ssm_a"),
             py::arg("ssm_norm"), py::arg("n_k_heads"), py::arg("n_v_heads"), py::arg("dk"), py::arg("dv"))
        .def("set_moe", &LayerStack::set_moe, py::arg("i"), py::arg("norm"), py::arg("router"), py::arg("gate"),
             py::arg("up"), py::arg("down"), py::arg("gate_type"), py::arg("down_type"), py::arg("gate_sh"),
             py::arg("up_sh"), py::arg("down_sh"), py::arg("shexp_gate"), py::arg("top_k"))
        .def("gdn", &LayerStack::gdn, py::arg("i"), py::arg("x"), py::arg("conv_state"), py::arg("ssm_state"),
             py::arg("commit"))
        .def("set_attn", &LayerStack::set_attn, py::arg("i"), py::arg("norm"), py::arg("q"), py::arg("k"), py::arg("v"),
             py::arg("o"), py::arg("q_norm"), py::arg("k_norm"), py::arg("n_head"), py::arg("n_head_kv"), py::arg("D"),
             py::arg("n_rot"), py::arg("theta"))
        .def("attn", &LayerStack::attn, py::arg("i"), py::arg("x"), py::arg("k_cache"), py::arg("v_cache"), py::arg("n0"),
             py::arg("block") = py::none(), py::arg("out_rows") = py::none())
        .def("gdn_batch", &LayerStack::gdn_batch, py::arg("i"), py::arg("x"), py::arg("segs"))
        .def("attn_batch", &LayerStack::attn_batch, py::arg("i"), py::arg("x"), py::arg("segs"),
             py::arg("out_rows") = py::none())
        .def("moe", &LayerStack::moe, py::arg("i"), py::arg("x"), py::arg("prefetch") = false);
    m.def("moe", &py_moe, py::arg("x"), py::arg("ids"), py::arg("weights"), py::arg("gate"), py::arg("up"),
          py::arg("down"), py::arg("gate_type"), py::arg("up_type"), py::arg("down_type"), py::kw_only(),
          py::arg("isa") = py::none());
    bind_model_ops(m);
    m.def("type_table", [] {
        py::list out;
        for (const char* n : {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q4_1", "q5_0", "q5_1",
                              "iq4_nl", "mxfp4", "q2_k", "q3_k", "iq4_xs", "iq3_s", "iq3_xxs", "iq2_s", "iq2_xs",
                              "iq2_xxs", "iq1_s", "iq1_m"}) {
            const TypeInfo* t = type_info_by_name(n);
            py::dict d;
            d["name"] = t->name;
            d["ggml_type"] = (int)t->type;
            d["block_size"] = t->block_size;
            d["block_bytes"] = t->block_bytes;
            out.append(d);
        }
        return out;
    });
}
