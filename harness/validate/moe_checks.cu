// ds4-validate rows for kernels/moe.cuh: the whole MoE FFN step (router, hash or biased top-6,
// IQ2_XXS gate/up, Q8_K mids, Q2_K down, slot sum, shared expert) against reference/moe, for
// 1..16 rows, a small odd-expert shape, router ties and the real DeepSeek-V4-Flash shape; and the
// chunk's route launch (launch_moe_route_rows: router logits of many rows -> probabilities, slots,
// weights) on the same cases.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ds4/core/cuda_graph.hpp"
#include "ds4/core/device_buffer.hpp"
#include "ds4/format/tiled.hpp"
#include "ds4/kernels/moe.cuh"
#include "harness/fixtures/matvec_args.hpp"
#include "harness/fixtures/moe_args.hpp"
#include "harness/validate/checks.hpp"
#include "reference/matvec.hpp"
#include "reference/moe.hpp"

namespace ds4::validate {
namespace {

using kernels::moe_shape;

struct moe_case {
    std::string name;
    moe_shape shape;
    bool hash = false;
    bool ties = false;     // 8 router rows identical with equal large bias: 8 equal scores, 6 slots
    int n_alloc = 0;       // experts holding weights (routing is confined to them); 0 = all
    bool shared_token = false;  // every row the same token: one expert named by many rows
    bool no_bias = false;       // the optional exp_probs_b.bias absent
};

struct host_layer {
    std::vector<std::uint16_t> router;  // [n_expert][n_embd] F16
    std::vector<float> bias;
    std::vector<std::int32_t> tid2eid;  // [n_vocab][6]
    std::vector<iq2_xxs_block> gate, up;
    std::vector<q2_k_block> down;
    std::vector<q8_0_block> sh_gate, sh_up, sh_down;
};

constexpr int n_vocab = 97;

std::vector<q8_0_block> random_q8_0(std::mt19937_64& g, std::size_t n) {
    std::vector<q8_0_block> v(n);
    std::uniform_real_distribution<float> d(1e-4f, 4e-4f);
    for (auto& b : v) {
        b.d = f32_to_f16(g() & 1 ? d(g) : -d(g));
        for (auto& q : b.qs) q = std::int8_t(g());
    }
    return v;
}

// Random valid Q2_K blocks: every byte pattern is valid; d, dmin give an RMS around 0.02.
std::vector<q2_k_block> random_q2_k(std::mt19937_64& g, std::size_t n) {
    std::vector<q2_k_block> v(n);
    std::uniform_real_distribution<float> d(1e-3f, 3e-3f);
    for (auto& b : v) {
        std::uint64_t r[10];
        for (auto& x : r) x = g();
        std::memcpy(b.scales, r, 16);
        std::memcpy(b.qs, r + 2, 64);
        b.d = f32_to_f16(d(g));
        b.dmin = f32_to_f16(d(g));
    }
    return v;
}

host_layer make_layer(std::mt19937_64& g, const moe_case& c) {
    const moe_shape& s = c.shape;
    const int n_alloc = c.n_alloc ? c.n_alloc : s.n_expert;
    host_layer h;
    std::normal_distribution<float> n01(0.0f, 1.0f);
    h.router.resize(std::size_t(s.n_expert) * s.n_embd);
    for (auto& v : h.router) v = f32_to_f16(0.02f * n01(g));
    if (c.ties)  // experts 1, 2, 4, 7, 8, 11, 13, 15 share one row: equal logits
        for (int e : {2, 4, 7, 8, 11, 13, 15})
            for (int i = 0; i < s.n_embd; ++i) {
                h.router[std::size_t(1) * s.n_embd + i] = f32_to_f16(0.1f * f16_to_f32(h.router[i]) + 0.05f);
                h.router[std::size_t(e) * s.n_embd + i] = h.router[std::size_t(1) * s.n_embd + i];
            }
    if (c.ties) {
        h.bias.assign(s.n_expert, 0.0f);
        for (int e : {1, 2, 4, 7, 8, 11, 13, 15}) h.bias[e] = 20.0f;
    } else if (!c.no_bias) {
        h.bias.resize(s.n_expert);
        for (int e = 0; e < s.n_expert; ++e) h.bias[e] = 0.1f * n01(g) + (e < n_alloc && n_alloc < s.n_expert ? 20.0f : 0.0f);
    }
    h.tid2eid.resize(std::size_t(n_vocab) * kernels::moe_slots);
    for (int t = 0; t < n_vocab; ++t) {
        std::vector<int> ids(n_alloc);
        for (int e = 0; e < n_alloc; ++e) ids[e] = e;
        std::shuffle(ids.begin(), ids.end(), g);
        for (int k = 0; k < kernels::moe_slots; ++k) h.tid2eid[t * kernels::moe_slots + k] = ids[k];
    }
    h.tid2eid[1] = h.tid2eid[0];  // token 0 names one expert in two slots (the reference allows it)
    const int nb_in = s.n_embd / 256, nb_ff = s.n_ff / 256;
    std::uint64_t state = g();
    const float d = 0.02f / float(iq2_xxs_random_rms(1.0f));
    h.gate.resize(std::size_t(n_alloc) * s.n_ff * nb_in);
    h.up.resize(h.gate.size());
    fill_random_iq2_xxs(state, h.gate.data(), h.gate.size(), d);
    fill_random_iq2_xxs(state, h.up.data(), h.up.size(), d);
    h.down = random_q2_k(g, std::size_t(n_alloc) * s.n_embd * nb_ff);
    h.sh_gate = random_q8_0(g, std::size_t(s.n_ff_shared) * (s.n_embd / 32));
    h.sh_up = random_q8_0(g, h.sh_gate.size());
    h.sh_down = random_q8_0(g, std::size_t(s.n_embd) * (s.n_ff_shared / 32));
    return h;
}

struct device_layer {
    device_buffer<std::uint16_t> router, gate_d, up_d, sh_gate_d, sh_up_d, sh_down_d;
    device_buffer<float> bias;
    device_buffer<std::int32_t> tid2eid;
    device_buffer<std::uint8_t> gate_q, up_q, down_q, sh_gate_q, sh_up_q, sh_down_q;
    device_buffer<std::uint32_t> down_dd;
};

template <class T>
device_buffer<T> up(const std::vector<T>& v) {
    return device_buffer<T>(std::span<const T>(v));
}

void upload_q8_0(const std::vector<q8_0_block>& src, int rows, int in, device_buffer<std::uint8_t>& q,
                 device_buffer<std::uint16_t>& d) {
    const auto L = q8_0_tiled_layout::make(rows, in);
    std::vector<std::uint8_t> qs(L.quant_bytes());
    std::vector<std::uint16_t> ds(L.scale_count());
    repack_q8_0(L, src.data(), qs.data(), ds.data());
    q = up(qs);
    d = up(ds);
}

void upload_iq2(const std::vector<iq2_xxs_block>& src, int n_alloc, int rows, int in, device_buffer<std::uint8_t>& q,
                device_buffer<std::uint16_t>& d) {
    const auto L = iq2_xxs_tiled_layout::make(rows, in);
    std::vector<std::uint8_t> qs(L.quant_bytes() * n_alloc);
    std::vector<std::uint16_t> ds(L.scale_count() * n_alloc);
    for (int e = 0; e < n_alloc; ++e)
        repack_iq2_xxs(L, src.data() + std::size_t(e) * rows * L.nb, qs.data() + e * L.quant_bytes(),
                       ds.data() + e * L.scale_count());
    q = up(qs);
    d = up(ds);
}

device_layer upload(const host_layer& h, const moe_case& c) {
    const moe_shape& s = c.shape;
    const int n_alloc = c.n_alloc ? c.n_alloc : s.n_expert;
    device_layer d;
    d.router = up(h.router);  // the F16 matvec reads GGUF rows as they are
    if (!h.bias.empty()) d.bias = up(h.bias);
    d.tid2eid = up(h.tid2eid);
    upload_iq2(h.gate, n_alloc, s.n_ff, s.n_embd, d.gate_q, d.gate_d);
    upload_iq2(h.up, n_alloc, s.n_ff, s.n_embd, d.up_q, d.up_d);
    const auto D = q2_k_tiled_layout::make(s.n_embd, s.n_ff);
    std::vector<std::uint8_t> dq(D.quant_bytes() * n_alloc);
    std::vector<std::uint32_t> dd(D.dd_count() * n_alloc);
    for (int e = 0; e < n_alloc; ++e)
        repack_q2_k(D, h.down.data() + std::size_t(e) * s.n_embd * D.nb, dq.data() + e * D.quant_bytes(),
                    dd.data() + e * D.dd_count());
    d.down_q = up(dq);
    d.down_dd = up(dd);
    upload_q8_0(h.sh_gate, s.n_ff_shared, s.n_embd, d.sh_gate_q, d.sh_gate_d);
    upload_q8_0(h.sh_up, s.n_ff_shared, s.n_embd, d.sh_up_q, d.sh_up_d);
    upload_q8_0(h.sh_down, s.n_embd, s.n_ff_shared, d.sh_down_q, d.sh_down_d);
    return d;
}

kernels::moe_weights weights_of(const device_layer& d, const moe_case& c) {
    kernels::moe_weights w = fixtures::moe_weights_of(d, d);
    w.bias = d.bias.size() ? d.bias.data() : nullptr;
    w.tid2eid = c.hash ? d.tid2eid.data() : nullptr;
    return w;
}

using fixtures::sm_count;

// router_cluster: the plan's router as one cluster where the device and the plan take it (the
// default; one-row plans), or the 256-CTA router with its check-in. one_row_plan: a plan of
// capacity 1 (n_rows 1), else twice the rows.
std::vector<check_row> run_case(std::mt19937_64& g, const moe_case& c, const host_layer& h, const device_layer& d,
                                int n_rows, bool router_cluster, bool one_row_plan = false) {
    const moe_shape& s = c.shape;
    // The graph covers more rows than the live count (up to 16): the step is captured once with its
    // live count in device memory and replayed at a different count.
    const int capacity =
        one_row_plan ? 1 : kernels::matvec_capacity_for(std::min(kernels::matvec_max_rows, 2 * n_rows));
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> xn(std::size_t(capacity) * s.n_embd);
    for (int r = 0; r < capacity; ++r) {
        const float sc = std::ldexp(1.0f, int(g() % 5) - 2);
        for (int i = 0; i < s.n_embd; ++i) xn[std::size_t(r) * s.n_embd + i] = sc * n01(g);
    }
    std::vector<std::int32_t> tokens(capacity);
    for (auto& t : tokens) t = c.shared_token ? 5 : int(g() % n_vocab);
    if (c.hash && !c.shared_token) tokens[0] = 0;  // the duplicate-expert row

    kernels::moe_decode_plan plan(s, capacity, sm_count());
    plan.set_router_cluster(router_cluster);
    device_buffer<std::uint8_t> scratch(plan.scratch_bytes());
    scratch.fill_bytes(0);
    device_buffer<float> dx{std::span<const float>(xn)};
    device_buffer<std::int32_t> dt{std::span<const std::int32_t>(tokens)};
    device_buffer<float> out(std::size_t(capacity) * s.n_embd);
    const auto w = weights_of(d, c);
    // Graph contract: the step captured on its first call (device prepared, no launch before),
    // replayed on decoy inputs (other activations, other tokens) with every row of the capacity
    // live, then replayed after the real inputs and a live count of n_rows are copied into the
    // same device buffers. The result proves the counters came back to zero and that token ids,
    // activations and the live row count are read from device memory at replay, not baked in.
    std::vector<float> decoy_x(xn.size());
    for (auto& v : decoy_x) v = n01(g);
    std::vector<std::int32_t> decoy_t(tokens.size());
    for (auto& t : decoy_t) t = int(g() % n_vocab);
    dx.upload(std::span<const float>(decoy_x));
    dt.upload(std::span<const std::int32_t>(decoy_t));
    device_buffer<std::int32_t> d_live(1);
    d_live.upload(std::vector<std::int32_t>{capacity});
    cuda_check(cudaDeviceSynchronize(), "decoy inputs");
    const cuda_stream stream;
    plan.prepare(current_device());
    const cuda_graph graph(stream, [&] {
        plan.launch(w, dx.data(), s.n_embd, dt.data(), n_rows, out.data(), s.n_embd, scratch.data(), stream,
                    d_live.data());
    });
    graph.launch(stream);
    stream.synchronize("moe (graph replay, decoy)");
    dx.upload(std::span<const float>(xn));
    dt.upload(std::span<const std::int32_t>(tokens));
    d_live.upload(std::vector<std::int32_t>{n_rows});
    out.fill_bytes(0xff);
    // The copies and the memset ran on the legacy stream, which a non-blocking stream does not
    // wait for.
    cuda_check(cudaDeviceSynchronize(), "inputs");
    graph.launch(stream);
    stream.synchronize("moe (graph replay)");
    const auto got_graph = out.download();
    // The same step uncaptured, with the live count as a launch value: bitwise the replay's rows.
    out.fill_bytes(0xff);
    cuda_check(cudaDeviceSynchronize(), "poison");
    plan.launch(w, dx.data(), s.n_embd, dt.data(), n_rows, out.data(), s.n_embd, scratch.data(), stream);
    stream.synchronize("moe (eager)");
    const auto got_eager = out.download();
    const std::size_t live_n = std::size_t(n_rows) * s.n_embd;
    const comparison graph_cmp =
        compare(std::span<const float>(got_graph.data(), live_n), std::span<const float>(got_eager.data(), live_n));
    const std::vector<float>& got = got_graph;
    const auto sc = plan.carve(scratch.data());
    std::vector<std::int32_t> got_sel(std::size_t(n_rows) * kernels::moe_slots);
    std::vector<float> got_w(got_sel.size());
    cuda_check(cudaMemcpy(got_sel.data(), sc.sel, got_sel.size() * 4, cudaMemcpyDeviceToHost), "sel");
    cuda_check(cudaMemcpy(got_w.data(), sc.wts, got_w.size() * 4, cudaMemcpyDeviceToHost), "wts");

    std::vector<float> want(std::size_t(n_rows) * s.n_embd), want_w(got_w.size());
    std::size_t sel_mismatch = 0;
    std::vector<float> p(s.n_expert), moe(s.n_embd), shared(s.n_embd);
    for (int r = 0; r < n_rows; ++r) {
        const float* x = xn.data() + std::size_t(r) * s.n_embd;
        ref::router_probs(h.router.data(), x, s.n_embd, s.n_expert, p.data());
        const ref::moe_route route =
            c.hash ? ref::route_hash(p.data(), h.tid2eid.data() + std::size_t(tokens[r]) * kernels::moe_slots,
                                     kernels::moe_slots, 1.5f)
                   : ref::route_top_k(p.data(), h.bias.empty() ? nullptr : h.bias.data(), s.n_expert,
                                      kernels::moe_slots, 1.5f);
        for (int k = 0; k < kernels::moe_slots; ++k) {
            sel_mismatch += got_sel[r * kernels::moe_slots + k] != route.expert[k];
            want_w[r * kernels::moe_slots + k] = route.weight[k];
        }
        ref::moe_routed(h.gate.data(), h.up.data(), h.down.data(), route, x, s.n_embd, s.n_ff, 10.0f, moe.data());
        ref::shared_expert(h.sh_gate.data(), h.sh_up.data(), h.sh_down.data(), x, s.n_embd, s.n_ff_shared, 10.0f,
                           shared.data());
        for (int o = 0; o < s.n_embd; ++o) want[std::size_t(r) * s.n_embd + o] = moe[o] + shared[o];
    }
    comparison route_cmp = compare(got_w, want_w);
    route_cmp.mismatches += sel_mismatch;
    const comparison out_cmp = compare(std::span<const float>(got.data(), want.size()), want);

    const std::string shape = std::to_string(s.n_embd) + "/ff" + std::to_string(s.n_ff) + "/e" +
                              std::to_string(s.n_expert) + " x" + std::to_string(n_rows);
    const std::string mode = std::string(c.hash ? "hash" : (c.ties ? "ties" : "biased")) +
                             (router_cluster ? "" : " (256-CTA router)") + (one_row_plan ? " (one-row plan)" : "");
    std::vector<check_row> rows;
    rows.push_back({"moe_route", c.name + " " + mode + " " + shape, "exact", route_cmp, passed(route_cmp),
                    sel_mismatch ? std::to_string(sel_mismatch) + " slots differ" : "slots + weights"});
    rows.push_back({"moe_decode", c.name + " " + mode + " " + shape, "exact", out_cmp, passed(out_cmp),
                    "F = moe + shared, graph replay"});
    rows.push_back({"moe_graph", c.name + " " + mode + " " + shape + " of capacity " + std::to_string(capacity),
                    "exact", graph_cmp, passed(graph_cmp), "replay at a live count != capture's vs uncaptured, bitwise"});
    return rows;
}

// The chunk path's routes: the router logits of n_rows rows (the reference's F16 matvec, as
// gemm_f16 computes them bit for bit) through launch_moe_route_rows, which overwrites them with
// the probabilities and writes each row's six slots and weights; all three against reference/moe.
check_row run_route_rows(std::mt19937_64& g, const moe_case& c, const host_layer& h, const device_layer& d, int n_rows) {
    const moe_shape& s = c.shape;
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::vector<float> xn(std::size_t(n_rows) * s.n_embd), logits(std::size_t(n_rows) * s.n_expert);
    for (int r = 0; r < n_rows; ++r) {
        const float sc = std::ldexp(1.0f, int(g() % 5) - 2);
        for (int i = 0; i < s.n_embd; ++i) xn[std::size_t(r) * s.n_embd + i] = sc * n01(g);
        ref::matvec_f16(h.router.data(), xn.data() + std::size_t(r) * s.n_embd, s.n_embd, s.n_expert,
                        logits.data() + std::size_t(r) * s.n_expert);
    }
    std::vector<std::int32_t> tokens(n_rows);
    for (auto& t : tokens) t = c.shared_token ? 5 : int(g() % n_vocab);
    if (c.hash && !c.shared_token) tokens[0] = 0;  // the duplicate-expert row
    device_buffer<float> dl{std::span<const float>(logits)};
    device_buffer<std::int32_t> dt{std::span<const std::int32_t>(tokens)};
    device_buffer<std::int32_t> dsel(std::size_t(n_rows) * kernels::moe_slots);
    device_buffer<float> dw(std::size_t(n_rows) * kernels::moe_slots);
    dsel.fill_bytes(0xff);
    dw.fill_bytes(0xff);
    const cuda_stream stream;
    kernels::launch_moe_route_rows(s, weights_of(d, c), dl.data(), dt.data(), n_rows, dsel.data(), dw.data(), stream);
    stream.synchronize("moe route rows");
    const auto got_p = dl.download();
    const auto got_sel = dsel.download();
    const auto got_w = dw.download();
    std::vector<float> want_p(logits.size()), want_w(got_w.size());
    std::size_t sel_mismatch = 0;
    for (int r = 0; r < n_rows; ++r) {
        float* p = want_p.data() + std::size_t(r) * s.n_expert;
        ref::router_probs(h.router.data(), xn.data() + std::size_t(r) * s.n_embd, s.n_embd, s.n_expert, p);
        const ref::moe_route route =
            c.hash ? ref::route_hash(p, h.tid2eid.data() + std::size_t(tokens[r]) * kernels::moe_slots, kernels::moe_slots, 1.5f)
                   : ref::route_top_k(p, h.bias.empty() ? nullptr : h.bias.data(), s.n_expert, kernels::moe_slots, 1.5f);
        for (int k = 0; k < kernels::moe_slots; ++k) {
            sel_mismatch += got_sel[std::size_t(r) * kernels::moe_slots + k] != route.expert[k];
            want_w[std::size_t(r) * kernels::moe_slots + k] = route.weight[k];
        }
    }
    comparison cmp = compare(got_w, want_w);
    cmp.add(compare(got_p, want_p));
    cmp.mismatches += sel_mismatch;
    const std::string mode = c.hash ? "hash" : (c.ties ? "ties" : "biased");
    return {"moe_route_rows", c.name + " " + mode + " e" + std::to_string(s.n_expert) + " x" + std::to_string(n_rows), "exact",
            cmp, passed(cmp),
            sel_mismatch ? std::to_string(sel_mismatch) + " slots differ" : "probabilities, slots, weights"};
}

}  // namespace

std::vector<check_row> check_moe(std::uint64_t seed, bool quick) {
    std::mt19937_64 g(seed ^ 0x6d6f65ull);
    const moe_shape small{256, 256, 256, 16};
    const moe_shape odd{512, 768, 96, 40};
    const moe_shape real{4096, 2048, 2048, 256};
    std::vector<moe_case> cases = {
        {"small", small, false},
        {"small", small, true},
        {"small", small, false, true},
        {"odd-nobias", odd, false, false, 0, false, true},
        {"odd-one-token", odd, true, false, 0, true},
        {"real(16 experts)", real, true, false, 16},
        {"real(16 experts)", real, false, false, 16},
    };
    if (!quick) {
        cases.push_back({"real", real, true});
        cases.push_back({"real", real, false});
    }
    std::vector<check_row> out;
    for (const auto& c : cases) {
        const host_layer h = make_layer(g, c);
        const device_layer d = upload(h, c);
        const bool big = c.shape.n_embd == real.n_embd;
        const std::vector<int> counts = quick && big ? std::vector<int>{1, 4} : std::vector<int>{1, 2, 4, 8, 16};
        for (int n : counts) {
            auto r = run_case(g, c, h, d, n, true);
            out.insert(out.end(), r.begin(), r.end());
        }
        // A one-row plan (the cluster router where the device takes one), and the 256-CTA router
        // at 1 and 4 rows.
        for (const bool cluster : {true, false}) {
            auto r = run_case(g, c, h, d, 1, cluster, true);
            out.insert(out.end(), r.begin(), r.end());
        }
        for (int n : {1, 4}) {
            auto r = run_case(g, c, h, d, n, false);
            out.insert(out.end(), r.begin(), r.end());
        }
        // Past one route CTA's rows and, outside --quick, a chunk's worth.
        for (int n : quick ? std::vector<int>{1, 37} : std::vector<int>{1, 37, 300})
            out.push_back(run_route_rows(g, c, h, d, n));
    }
    return out;
}

}  // namespace ds4::validate
