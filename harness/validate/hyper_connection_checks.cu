// ds4-validate rows for kernels/hyper_connection.cuh against reference/hyper_connection, bitwise:
// hc pre (x_in and the split: pre, post, Sinkhorn comb), hc post (Y from the device split and a
// random sublayer output) and the output head's HC mix, at the flash shape (4 x 4096 = 16384 flat)
// and odd widths (a partial 512-segment; a flat length that is not a multiple of 8, which takes
// the scalar fn path, or of 4, which takes scalar state loads; more than 32 segments; n_hc 3
// and 8, launches compiled for those stream counts); row counts 1..64 (capacities across every
// rows-per-block variant; the flash shape at capacities 1, 3, 16 and 40 in the quick set too);
// rows past the live count untouched; one scratch shared by launches of several capacities (its
// arrival counters must come back to zero); the folded RMSNorm (xn against ref::rms_norm of the
// reference's x_in) on most rows, untouched xn where it is not folded. The graph row captures pre + post at 2 rows and
// replays at 5 and 8 with new states. The prefill chunk's forms (five launches, and
// hyper_connection_chunk.cuh's one) have rows of their own. Rows with hc_eps = -2 send every
// row through the Sinkhorn's fallback (its sums outside rcp_rn_fast's range); the last row sweeps
// rcp_rn_fast (the Sinkhorn passes' reciprocal) over every float of its range against div_rn.
#include <cuda_runtime.h>

#include <bit>
#include <random>
#include <string>
#include <vector>

#include "ds4/core/device_buffer.hpp"
#include "ds4/core/half.hpp"
#include "ds4/kernels/gemm_f16.cuh"
#include "ds4/kernels/hyper_connection.cuh"
#include "ds4/kernels/hyper_connection_chunk.cuh"
#include "ds4/kernels/hyper_connection_rows.cuh"
#include "harness/validate/checks.hpp"
#include "harness/validate/row_inputs.hpp"
#include "reference/hyper_connection.hpp"
#include "reference/norm_rope.hpp"

namespace ds4::validate {
namespace {

constexpr unsigned char poison = 0xff;
constexpr int sinkhorn_iters = 20;
constexpr float eps = 1e-6f;

// rcp_rn_fast (the register Sinkhorn's reciprocals) against div_rn(1.0f, x) for every float x of
// rcp_rn_fast_ok's range, [2^-125, 2^125]; `two_step` counts what a second Newton step would give.
__global__ void rcp_sweep_kernel(unsigned lo, unsigned hi, unsigned long long* bad, unsigned long long* bad_two_step) {
    unsigned long long n = 0, n2 = 0;
    const unsigned long long stride = std::uint64_t(gridDim.x) * blockDim.x;
    for (unsigned long long b = lo + std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; b <= hi; b += stride) {
        const float x = __uint_as_float(unsigned(b));
        const float want = div_rn(1.0f, x);
        const float y = rcp_rn_fast(x);
        n += __float_as_uint(y) != __float_as_uint(want);
        n2 += __float_as_uint(__fmaf_rn(y, __fmaf_rn(-x, y, 1.0f), y)) != __float_as_uint(want);
    }
    if (n) atomicAdd(bad, n);
    if (n2) atomicAdd(bad_two_step, n2);
}

check_row check_rcp_rn_fast() {
    const unsigned lo = std::bit_cast<unsigned>(0x1p-125f), hi = std::bit_cast<unsigned>(0x1p125f);
    device_buffer<unsigned long long> bad(2);
    cuda_check(cudaMemset(bad.data(), 0, 2 * sizeof(unsigned long long)), "rcp sweep");
    rcp_sweep_kernel<<<1024, 256>>>(lo, hi, bad.data(), bad.data() + 1);
    cuda_check(cudaGetLastError(), "rcp sweep launch");
    unsigned long long h[2] = {0, 0};
    cuda_check(cudaMemcpy(h, bad.data(), sizeof(h), cudaMemcpyDeviceToHost), "rcp sweep");
    comparison c;
    c.count = std::size_t(hi - lo) + 1;
    c.mismatches = std::size_t(h[0]);
    return row_of("rcp_rn_fast", "every float in [2^-125, 2^125]", "exact", c,
                  "against div_rn(1, x); with a second Newton step " + std::to_string(h[1]) + " differ");
}

// The weights of one HC site: fn F16 [n_mix][n_flat], scale F32[3], base F32[n_mix].
struct hc_site {
    int n_embd, n_hc, n_mix;
    std::vector<std::uint16_t> fn;
    std::vector<float> scale, base;
    device_buffer<std::uint16_t> d_fn;
    device_buffer<float> d_scale, d_base;

    hc_site(std::mt19937_64& g, int embd, int hc, bool output) : n_embd(embd), n_hc(hc), n_mix(output ? hc : 2 * hc + hc * hc) {
        const std::vector<float> w = spread_values(g, std::size_t(n_mix) * hc * embd, 0.02f);
        fn.resize(w.size());
        for (std::size_t i = 0; i < w.size(); ++i) fn[i] = f32_to_f16(w[i]);
        std::uniform_real_distribution<float> u(0.2f, 2.0f);
        scale = {u(g), u(g), u(g)};
        base = spread_values(g, n_mix, 0.5f);
        d_fn = device_buffer<std::uint16_t>(std::span<const std::uint16_t>(fn));
        d_scale = device_buffer<float>(std::span<const float>(scale));
        d_base = device_buffer<float>(std::span<const float>(base));
    }
};

struct hc_run {
    int n_embd, n_hc, capacity;
    bool output, norm;
    hc_site site;
    std::vector<float> norm_w;
    device_buffer<float> X, F, x_in, split, partials, Y, d_norm_w, xn;
    device_count rows;
    kernels::hc_pre_launch pre;
    kernels::hc_post_launch post;
    std::string failed;  // the outputs that differed in any run(), for the row's note
    float hc_eps = eps;  // the gates' and the Sinkhorn's eps (set_hc_eps)

    // norm: the RMSNorm that follows hc pre folded into its launch (xn against ref::rms_norm of
    // the reference's x_in).
    hc_run(std::mt19937_64& g, int embd, int hc, int cap, bool out, bool with_norm = false)
        : n_embd(embd), n_hc(hc), capacity(cap), output(out), norm(with_norm), site(g, embd, hc, out) {
        const std::size_t state = std::size_t(cap) * hc * embd;
        X = device_buffer<float>(state);
        Y = device_buffer<float>(state);
        F = device_buffer<float>(std::size_t(cap) * embd);
        x_in = device_buffer<float>(std::size_t(cap) * embd);
        split = device_buffer<float>(std::size_t(cap) * site.n_mix);
        pre.X = X.data();
        pre.fn = site.d_fn.data();
        pre.scale = site.d_scale.data();
        pre.base = site.d_base.data();
        pre.n_embd = embd;
        pre.n_hc = hc;
        pre.iters = sinkhorn_iters;
        pre.rms_eps = pre.hc_eps = eps;
        pre.output_mix = out;
        pre.x_in = x_in.data();
        pre.x_in_stride = embd;
        pre.split = out ? nullptr : split.data();
        pre.n_rows = rows.get();
        // The scratch's arrival counters start at zero; every launch leaves them there.
        partials = device_buffer<float>(kernels::hc_partial_floats(pre, cap));
        partials.fill_bytes(0);
        pre.partials = partials.data();
        post = {F.data(), embd, X.data(), split.data(), Y.data(), embd, hc, rows.get()};
        xn = device_buffer<float>(std::size_t(cap) * embd);
        if (norm) {
            norm_w = spread_values(g, embd, 1.0f);
            d_norm_w = device_buffer<float>(std::span<const float>(norm_w));
            pre.norm_weight = d_norm_w.data();
            pre.norm_out = xn.data();
            pre.norm_stride = embd;
            pre.norm_eps = eps;
        }
    }

    void set_hc_eps(float e) { hc_eps = pre.hc_eps = e; }

    // The reference for one row's state: the output mix into xo, or hc pre into xo with its
    // split packed as the kernel writes it (pre, post, comb) into so; returns the split.
    ref::hc_split want_mix(const float* state, float* xo, float* so) const {
        if (output) {
            ref::output_hc_mix(state, site.fn.data(), site.scale.data(), site.base.data(), n_embd, n_hc, eps, hc_eps, xo);
            return {};
        }
        const ref::hc_split s = ref::hc_pre(state, site.fn.data(), site.scale.data(), site.base.data(), n_embd, n_hc,
                                            sinkhorn_iters, eps, hc_eps, xo);
        for (int h = 0; h < n_hc; ++h) so[h] = s.pre[h], so[n_hc + h] = s.post[h];
        for (int k = 0; k < n_hc * n_hc; ++k) so[2 * n_hc + k] = s.comb[k];
        return s;
    }

    // Fresh X and F for n_rows rows; launch() runs pre (+ post); compares everything it wrote.
    template <class Run>
    comparison run(std::mt19937_64& g, int n_rows, Run&& launch) {
        const std::size_t row = std::size_t(n_hc) * n_embd;
        const std::vector<float> x = spread_values(g, capacity * row, 1.0f);
        const std::vector<float> f = spread_values(g, std::size_t(capacity) * n_embd, 0.5f);
        X.upload(x);
        F.upload(f);
        rows.set(n_rows);
        for (auto* b : {&x_in, &split, &Y, &xn}) b->fill_bytes(poison);
        cuda_check(cudaDeviceSynchronize(), "hc inputs");
        launch();
        const auto got_x = x_in.download(), got_s = split.download(), got_y = Y.download();
        std::vector<float> want_x(std::size_t(n_rows) * n_embd), want_s(std::size_t(n_rows) * site.n_mix), want_y(n_rows * row);
        for (int r = 0; r < n_rows; ++r) {
            const float* xr = x.data() + r * row;
            float* xo = want_x.data() + std::size_t(r) * n_embd;
            const ref::hc_split s = want_mix(xr, xo, want_s.data() + std::size_t(r) * site.n_mix);
            if (!output) ref::hc_post(f.data() + std::size_t(r) * n_embd, xr, s, n_embd, n_hc, want_y.data() + r * row);
        }
        // Each output on its own first, so that a failing row names what differed.
        comparison c;
        auto part = [&](const char* name, comparison p) {
            if (!passed(p)) failed += std::string(failed.empty() ? "" : ", ") + name;
            c.add(p);
        };
        comparison cx = compare(std::span<const float>(got_x.data(), want_x.size()), want_x);
        cx.mismatches += written_outside(got_x, want_x.size(), got_x.size(), poison);
        part(output ? "e" : "x_in", cx);
        if (!output) {
            comparison cs = compare(std::span<const float>(got_s.data(), want_s.size()), want_s);
            cs.mismatches += written_outside(got_s, want_s.size(), got_s.size(), poison);
            part("split", cs);
            comparison cy = compare(std::span<const float>(got_y.data(), want_y.size()), want_y);
            cy.mismatches += written_outside(got_y, want_y.size(), got_y.size(), poison);
            part("Y", cy);
        }
        const auto got_n = xn.download();
        if (norm) {
            std::vector<float> want_n(want_x.size());
            for (int r = 0; r < n_rows; ++r)
                ref::rms_norm(want_x.data() + std::size_t(r) * n_embd, norm_w.data(), n_embd, eps,
                              want_n.data() + std::size_t(r) * n_embd);
            comparison cn = compare(std::span<const float>(got_n.data(), want_n.size()), want_n);
            cn.mismatches += written_outside(got_n, want_n.size(), got_n.size(), poison);
            part("xn", cn);
        } else {
            comparison cn;
            cn.mismatches = written_outside(got_n, 0, got_n.size(), poison);
            part("xn written", cn);
        }
        return c;
    }

    // The inputs of an hc post followed by an hc pre: X (the state before the post) and F
    // uploaded, a previous split as a Sinkhorn leaves it (gates in [0.2, 2], combine entries in
    // [0, 1]) into `prev`, the outputs poisoned.
    struct post_inputs {
        std::vector<float> x, f, sp;
    };
    post_inputs upload_post_inputs(std::mt19937_64& g, int n_rows, device_buffer<float>& prev) {
        const std::size_t row = std::size_t(n_hc) * n_embd;
        const int n_split = 2 * n_hc + n_hc * n_hc;
        post_inputs in{spread_values(g, capacity * row, 1.0f), spread_values(g, std::size_t(capacity) * n_embd, 0.5f),
                       std::vector<float>(std::size_t(capacity) * n_split)};
        std::uniform_real_distribution<float> gate(0.2f, 2.0f), comb(0.0f, 1.0f);
        for (int r = 0; r < capacity; ++r)
            for (int k = 0; k < n_split; ++k) in.sp[std::size_t(r) * n_split + k] = k < 2 * n_hc ? gate(g) : comb(g);
        X.upload(in.x);
        F.upload(in.f);
        rows.set(n_rows);
        for (auto* b : {&x_in, &split, &Y, &xn}) b->fill_bytes(poison);
        prev.upload(in.sp);
        cuda_check(cudaDeviceSynchronize(), "hc post inputs");
        return in;
    }

    // The reference runs hc post on `in`, then hc pre (or the output mix) on its Y; compares Y,
    // x_in (e), the split and xn. want_s starts as what the split buffer must hold past the live
    // rows' splits (the previous split where the launch reads it from that buffer).
    comparison check_post_then_pre(const post_inputs& in, int n_rows, std::vector<float> want_s) {
        const std::size_t row = std::size_t(n_hc) * n_embd;
        const int n_split = 2 * n_hc + n_hc * n_hc;
        const auto got_x = x_in.download(), got_s = split.download(), got_y = Y.download(), got_n = xn.download();
        std::vector<float> want_x(std::size_t(n_rows) * n_embd), want_y(n_rows * row), want_n(want_x.size());
        for (int r = 0; r < n_rows; ++r) {
            const float* spr = in.sp.data() + std::size_t(r) * n_split;
            ref::hc_split s{};
            for (int h = 0; h < n_hc; ++h) s.pre[h] = spr[h], s.post[h] = spr[n_hc + h];
            for (int k = 0; k < n_hc * n_hc; ++k) s.comb[k] = spr[2 * n_hc + k];
            float* yr = want_y.data() + r * row;
            ref::hc_post(in.f.data() + std::size_t(r) * n_embd, in.x.data() + r * row, s, n_embd, n_hc, yr);
            float* xo = want_x.data() + std::size_t(r) * n_embd;
            want_mix(yr, xo, output ? nullptr : want_s.data() + std::size_t(r) * site.n_mix);
            if (norm) ref::rms_norm(xo, norm_w.data(), n_embd, eps, want_n.data() + std::size_t(r) * n_embd);
        }
        comparison c;
        auto part = [&](const char* name, const std::vector<float>& got, const std::vector<float>& want, bool check) {
            comparison p;
            if (check) p = compare(std::span<const float>(got.data(), want.size()), want);
            p.mismatches += written_outside(got, check ? want.size() : 0, got.size(), poison);
            if (!passed(p)) failed += std::string(failed.empty() ? "" : ", ") + name;
            c.add(p);
        };
        part("Y", got_y, want_y, true);
        part(output ? "e" : "x_in", got_x, want_x, true);
        part("split", got_s, want_s, !output);
        part("xn", got_n, want_n, norm);
        return c;
    }

    // hc post folded into hc pre (hc_pre_launch::post_F), as the backend launches it at decode:
    // the previous split sits in the buffer the launch writes its own split to (an output mix
    // reads it from a buffer of its own, its split being none).
    comparison run_fold(std::mt19937_64& g, int n_rows, cudaStream_t stream) {
        if (post_split.size() == 0) post_split = device_buffer<float>(std::size_t(capacity) * (2 * n_hc + n_hc * n_hc));
        device_buffer<float>& prev = output ? post_split : split;
        const post_inputs in = upload_post_inputs(g, n_rows, prev);
        kernels::hc_pre_launch a = pre;
        a.post_F = F.data();
        a.post_F_stride = n_embd;
        a.post_split = prev.data();
        a.post_Y = Y.data();
        switch (n_hc) {
            case 3: kernels::launch_hc_pre<3>(a, capacity, stream); break;
            case 8: kernels::launch_hc_pre<8>(a, capacity, stream); break;
            default: kernels::launch_hc_pre<4>(a, capacity, stream); break;
        }
        cuda_check(cudaDeviceSynchronize(), "hc fold");
        return check_post_then_pre(in, n_rows, output ? std::vector<float>{} : in.sp);
    }
    device_buffer<float> post_split;

    // A chunk's hc post forming its rows' scales (hc_post_launch::row_scale), then the chunk hc
    // pre reading them (hc_pre_launch::row_scale) on the Y it wrote, as the backend chains them
    // (a scale off by one ulp moves x_in through the mix).
    template <int NHC>
    comparison run_post_scales(std::mt19937_64& g, int n_rows, cudaStream_t stream) {
        if (post_split.size() == 0) post_split = device_buffer<float>(std::size_t(capacity) * (2 * n_hc + n_hc * n_hc));
        const post_inputs in = upload_post_inputs(g, n_rows, post_split);
        device_buffer<float> scales(static_cast<std::size_t>(capacity));
        kernels::hc_post_launch po = post;
        po.split = post_split.data();  // the previous sublayer's split
        po.row_scale = scales.data();
        po.rms_eps = pre.rms_eps;
        kernels::launch_hc_post<NHC>(po, capacity, stream);
        kernels::hc_pre_launch a = pre;
        a.X = Y.data();  // the state hc post wrote
        a.row_scale = scales.data();
        kernels::launch_hc_pre_chunk<NHC>(a, capacity, stream);
        cuda_check(cudaDeviceSynchronize(), "hc post scales + chunk pre");
        return check_post_then_pre(in, n_rows, std::vector<float>(std::size_t(n_rows) * site.n_mix));
    }

    void launch_all(cudaStream_t stream) {
        switch (n_hc) {
            case 3: launch_as<3>(stream); break;
            case 8: launch_as<8>(stream); break;
            default: launch_as<4>(stream); break;
        }
    }

    // The launches compiled for NHC streams (the shapes' n_hc: 3, 4, 8).
    template <int NHC>
    void launch_as(cudaStream_t stream) {
        kernels::launch_hc_pre<NHC>(pre, capacity, stream);
        if (!output) kernels::launch_hc_post<NHC>(post, capacity, stream);
    }

    // The prefill chunk's HC pre in five launches (hyper_connection_rows.cuh's launch_hc_pre_rows,
    // as cuda_ops runs chunks by default); then hc post.
    void launch_rows(cudaStream_t stream) {
        if (flat.size() == 0) {
            flat = device_buffer<float>(std::size_t(capacity) * n_hc * n_embd);
            mix = device_buffer<float>(std::size_t(capacity) * site.n_mix);
        }
        kernels::prepare_gemm_f16(current_device());
        kernels::launch_hc_pre_rows(pre, flat.data(), mix.data(), capacity, stream);
        switch (n_hc) {
            case 3: kernels::launch_hc_post<3>(post, capacity, stream); break;
            case 8: kernels::launch_hc_post<8>(post, capacity, stream); break;
            default: kernels::launch_hc_post<4>(post, capacity, stream); break;
        }
    }
    device_buffer<float> flat, mix;

    // The prefill chunk's HC pre in one launch (hyper_connection_chunk.cuh); then hc post.
    void launch_chunk(cudaStream_t stream) {
        switch (n_hc) {
            case 3: chunk_as<3>(stream); break;
            case 4: chunk_as<4>(stream); break;
            default: require(false, "ds4-validate: hc_pre_chunk rows take n_hc 3 or 4"); break;
        }
    }
    template <int NHC>
    void chunk_as(cudaStream_t stream) {
        kernels::launch_hc_pre_chunk<NHC>(pre, capacity, stream);
        kernels::launch_hc_post<NHC>(post, capacity, stream);
    }

    std::string shape(int n_rows) const {
        return std::to_string(n_hc) + "x" + std::to_string(n_embd) + " x" + std::to_string(n_rows) + " cap" +
               std::to_string(capacity) + (norm ? " +norm" : "");
    }
};

}  // namespace

std::vector<check_row> check_hyper_connection(std::uint64_t seed, bool quick) {
    std::mt19937_64 g(seed ^ 0x6863u);
    struct shape {
        int embd, hc;
    };
    // 37 x 3 (flat 111): scalar state loads; 64 x 8: the largest mix (80 outputs); 4160 x 4 (flat
    // 16640): 33 segments, so two partial tiles in the finish and two scale batches per thread.
    std::vector<shape> shapes = {{200, 4}, {37, 4}, {256, 4}, {96, 3}, {37, 3}, {64, 8}, {4160, 4}};
    if (!quick) shapes.push_back({4096, 4});
    std::vector<check_row> out;
    auto add_row = [&](int embd, int hc, int capacity, int rows, bool output, bool norm) {
        hc_run h(g, embd, hc, capacity, output, norm);
        const comparison c = h.run(g, rows, [&] {
            h.launch_all(nullptr);
            cuda_check(cudaDeviceSynchronize(), "hc");
        });
        out.push_back(row_of(output ? "output_hc_mix" : "hc_pre+post", h.shape(rows), "exact", c,
                             std::string(output ? "e" : "x_in, split, Y") + (norm ? ", xn" : "") +
                                 (h.failed.empty() ? "" : "; differ: " + h.failed)));
    };
    // The folded norm on every row count but 1 (both forms at every shape).
    for (const auto& s : shapes)
        for (bool output : {false, true})
            for (int rows : quick ? std::vector<int>{1, 3, 9} : std::vector<int>{1, 4, 9, 64})
                add_row(s.embd, s.hc, rows + 1, rows, output, rows != 1);
    // The flash shape at the decode capacities (one-row groups), every row live (1, 3, 16) and 13
    // of 16 live; 37 of 40 (four-row groups, a partial one); the norm folded as the backend folds
    // attn_norm / ffn_norm (and the output norm), and at 1 and 16 rows without it.
    for (bool output : {false, true}) {
        for (int cap : {1, 3, 16}) add_row(4096, 4, cap, cap, output, true);
        for (int cap : {1, 16}) add_row(4096, 4, cap, cap, output, false);
        add_row(4096, 4, 16, 13, output, true);
        add_row(4096, 4, 40, 37, output, true);
    }
    // hc post folded into hc pre (decode): the flash shape at capacities 1, 3 and 16 (13 live),
    // the small model's 4 x 2048, n_hc 3 and 8 (8 x 2048: 16 chunks a scale thread, the most
    // a fold takes); with and without the norm; the output mix.
    auto add_fold_row = [&](int embd, int hc, int capacity, int rows, bool output, bool norm) {
        require(kernels::hc_pre_folds_post(embd, hc, capacity), "ds4-validate: a fold row at a shape that cannot fold");
        hc_run h(g, embd, hc, capacity, output, norm);
        const comparison c = h.run_fold(g, rows, nullptr);
        out.push_back(row_of(output ? "hc_post+output_mix" : "hc_post+pre", h.shape(rows), "exact", c,
                             std::string(output ? "Y, e" : "Y, x_in, split") + (norm ? ", xn" : "") +
                                 (h.failed.empty() ? "" : "; differ: " + h.failed)));
    };
    for (bool output : {false, true}) {
        for (int cap : {1, 3, 16}) add_fold_row(4096, 4, cap, cap == 16 ? 13 : cap, output, true);
        add_fold_row(4096, 4, 1, 1, output, false);
        add_fold_row(2048, 4, 2, 2, output, true);
    }
    add_fold_row(2048, 3, 1, 1, false, true);
    add_fold_row(2048, 8, 4, 3, false, true);
    add_fold_row(1024, 8, 1, 1, false, false);
    // The prefill chunk's four-launch HC pre (hyper_connection_rows.cuh): 17 of 20 rows and 130 of
    // 133 at small shapes and n_hc 3 / 8, the flash shape at 33 rows (and 300 in the full run).
    auto add_rows_row = [&](int embd, int hc, int capacity, int rows) {
        hc_run h(g, embd, hc, capacity, false, true);
        const comparison c = h.run(g, rows, [&] {
            h.launch_rows(nullptr);
            cuda_check(cudaDeviceSynchronize(), "hc rows");
        });
        out.push_back(row_of("hc_pre_rows+post", h.shape(rows), "exact", c,
                             std::string("x_in, split, Y, xn") + (h.failed.empty() ? "" : "; differ: " + h.failed)));
    };
    for (const shape s : {shape{256, 4}, shape{96, 3}, shape{64, 8}, shape{4160, 4}})
        for (int rows : {17, 130}) add_rows_row(s.embd, s.hc, rows + 3, rows);
    add_rows_row(4096, 4, 36, 33);
    if (!quick) add_rows_row(4096, 4, 300, 300);
    // The same chunk's HC pre in one launch (hyper_connection_chunk.cuh): full and partial
    // eight-row groups, a partial segment (4 x 200: 800), 33 segments (4 x 4160), n_hc 3 (15
    // outputs: two a warp), the flash shape at 8, 13 of 16, 33 of 36 rows (300 in the full run),
    // without the norm once; then a graph captured at 20 rows and replayed at 7 and 36.
    auto add_chunk_row = [&](int embd, int hc, int capacity, int rows, bool norm) {
        hc_run h(g, embd, hc, capacity, false, norm);
        const comparison c = h.run(g, rows, [&] {
            h.launch_chunk(nullptr);
            cuda_check(cudaDeviceSynchronize(), "hc chunk");
        });
        out.push_back(row_of("hc_pre_chunk+post", h.shape(rows), "exact", c,
                             std::string("x_in, split, Y") + (norm ? ", xn" : "") + (h.failed.empty() ? "" : "; differ: " + h.failed)));
    };
    for (const shape s : {shape{256, 4}, shape{200, 4}, shape{96, 3}, shape{4160, 4}})
        for (int rows : {5, 17, 130}) add_chunk_row(s.embd, s.hc, rows + 3, rows, true);
    for (int rows : {8, 13, 33}) add_chunk_row(4096, 4, rows == 8 ? 8 : rows + 3, rows, true);
    add_chunk_row(4096, 4, 16, 16, false);
    if (!quick) add_chunk_row(4096, 4, 300, 300, true);
    // hc post forming the scales the chunk hc pre then reads (the backend's chunk chain).
    auto add_post_scales_row = [&](int embd, int hc, int capacity, int rows) {
        hc_run h(g, embd, hc, capacity, false, true);
        const comparison c =
            hc == 3 ? h.run_post_scales<3>(g, rows, nullptr) : h.run_post_scales<4>(g, rows, nullptr);
        out.push_back(row_of("hc_post_scales+pre_chunk", h.shape(rows), "exact", c,
                             std::string("Y, x_in, split, xn vs hc_post then hc_pre") +
                                 (h.failed.empty() ? "" : "; differ: " + h.failed)));
    };
    add_post_scales_row(1024, 3, 20, 17);
    add_post_scales_row(1024, 4, 8, 5);
    add_post_scales_row(4096, 4, 36, 33);
    if (!quick) add_post_scales_row(4096, 4, 300, 300);
    {
        hc_run h(g, quick ? 256 : 4096, 4, 36, false, true);
        comparison c;
        c.add(h.run(g, 20, [&] {
            h.launch_chunk(nullptr);
            cuda_check(cudaDeviceSynchronize(), "hc chunk");
        }));
        const replayed_graph graph([&](cudaStream_t st) { h.launch_chunk(st); });
        for (int rows : {7, 36}) c.add(h.run(g, rows, graph));
        out.push_back(row_of("hc_pre_chunk+post", h.shape(36), "exact", c,
                             "graph captured at 20 rows; replayed at 7, 36" + (h.failed.empty() ? std::string() : "; differ: " + h.failed)));
    }
    // One scratch for launches of several capacities, as the backend's: 65 rows (eight-row
    // groups), then 1, 16 and 65 again on the same partials and counters.
    {
        hc_run h(g, 256, 4, 65, false, true);
        comparison c;
        for (int cap : {65, 1, 16, 65}) {
            h.capacity = cap;
            c.add(h.run(g, cap, [&] {
                h.launch_all(nullptr);
                cuda_check(cudaDeviceSynchronize(), "hc");
            }));
        }
        out.push_back(row_of("hc_pre+post", "4x256 cap 65, 1, 16, 65", "exact", c, "one scratch across capacities"));
    }
    hc_run h(g, quick ? 256 : 4096, 4, 8, false, true);
    comparison total;
    total.add(h.run(g, 2, [&] {
                   h.launch_all(nullptr);
                   cuda_check(cudaDeviceSynchronize(), "hc");
               }));
    const replayed_graph graph([&](cudaStream_t st) { h.launch_all(st); });
    for (int rows : {5, 8}) total.add(h.run(g, rows, graph));
    out.push_back(row_of("hc_pre+post", h.shape(8), "exact", total, "graph captured at 2 rows; replayed at 5, 8"));
    // The Sinkhorn's fallback: hc_eps = -2 puts every pass's sum + eps below zero, outside
    // rcp_rn_fast_ok's range, so every row goes to hc_split_sinkhorn itself (one-row groups at
    // capacities 1 and 3, four-row groups at 20: both halves of warp 0).
    for (int cap : {1, 3, 20}) {
        hc_run h(g, 256, 4, cap, false, true);
        h.set_hc_eps(-2.0f);
        const comparison c = h.run(g, cap, [&] {
            h.launch_all(nullptr);
            cuda_check(cudaDeviceSynchronize(), "hc");
        });
        out.push_back(row_of("hc_pre+post", h.shape(cap), "exact", c,
                             "hc_eps -2: every row through the Sinkhorn's reference fallback" +
                                 (h.failed.empty() ? std::string() : "; differ: " + h.failed)));
    }
    out.push_back(check_rcp_rn_fast());
    return out;
}

}  // namespace ds4::validate
