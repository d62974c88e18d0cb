#include "reference/moe.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "ds4/core/error.hpp"
#include "ds4/core/math.hpp"
#include "ds4/format/q8_k.hpp"
#include "reference/matvec.hpp"
#include "reference/parallel.hpp"

namespace ds4::ref {
namespace {

// w_s = p[sel_s] / max(sum_s p[sel_s], 2^-14) * scale; the sum in slot order.
void normalise_weights(moe_route& r, const float* p, float weight_scale) {
    float sum = 0.0f;
    for (int s = 0; s < r.n_used; ++s) sum += p[r.expert[s]];
    const float denom = std::fmax(sum, 6.103515625e-5f);
    for (int s = 0; s < r.n_used; ++s) r.weight[s] = p[r.expert[s]] / denom * weight_scale;
}

void check_used(int n_used) {
    require(n_used > 0 && n_used <= moe_route::max_used, "moe: n_used = " + std::to_string(n_used));
}

// SwiGLU clamps: the gate only from above, the up projection on both sides (fminf/fmaxf).
float clamp_gate(float g, float c) { return std::fmin(g, c); }
float clamp_up(float u, float c) { return std::fmax(std::fmin(u, c), -c); }

}  // namespace

void router_probs(const std::uint16_t* gate_inp, const float* xn, int n_embd, int n_expert, float* p) {
    matvec_f16(gate_inp, xn, n_embd, n_expert, p);
    for (int e = 0; e < n_expert; ++e) p[e] = std::sqrt(softplus(p[e]));
}

moe_route route_top_k(const float* p, const float* bias, int n_expert, int n_used, float weight_scale) {
    check_used(n_used);
    moe_route r;
    float best[moe_route::max_used];
    int n = 0;
    for (int e = 0; e < n_expert; ++e) {
        const float v = bias ? p[e] + bias[e] : p[e];
        if (n == n_used && !(v > best[n - 1])) continue;
        int at = n < n_used ? n : n - 1;  // slot freed at the end, then shifted into place
        while (at > 0 && v > best[at - 1]) {
            if (at < n_used) {
                best[at] = best[at - 1];
                r.expert[at] = r.expert[at - 1];
            }
            --at;
        }
        best[at] = v;
        r.expert[at] = e;
        if (n < n_used) ++n;
    }
    require(n == n_used, "route_top_k: fewer experts than slots");
    r.n_used = n_used;
    normalise_weights(r, p, weight_scale);
    return r;
}

moe_route route_hash(const float* p, const std::int32_t* tid2eid_row, int n_used, float weight_scale) {
    check_used(n_used);
    moe_route r;
    r.n_used = n_used;
    for (int s = 0; s < n_used; ++s) r.expert[s] = tid2eid_row[s];
    normalise_weights(r, p, weight_scale);
    return r;
}

namespace {

// One expert block dot per weight format, all against Q8_K activations in the §7 scalar order.
float expert_dot(const iq2_xxs_block* w, const q8_k_block* x, int nb) { return dot_iq2_xxs_q8_k(w, x, nb); }
float expert_dot(const q2_k_block* w, const q8_k_block* x, int nb) { return dot_q2_k_q8_k(w, x, nb); }
float expert_dot(const q4_k_block* w, const q8_k_block* x, int nb) { return dot_q4_k_q8_k(w, x, nb); }

// The routed-expert math once, for any gate/up and down block formats (IQ2_XXS + Q2_K in the
// q2 model, Q4_K everywhere in the MTP file).
template <class GateUp, class Down>
void routed_experts(const GateUp* gate_exps, const GateUp* up_exps, const Down* down_exps, const moe_route& route,
                    const float* xn, int n_embd, int n_ff, float clamp, float* out) {
    require(n_embd % 256 == 0 && n_ff % 256 == 0,
            "moe_routed: n_embd " + std::to_string(n_embd) + " and n_ff " + std::to_string(n_ff) +
                " must be multiples of 256");
    const int nb_in = n_embd / 256, nb_ff = n_ff / 256;
    std::vector<q8_k_block> xq(nb_in), midq(nb_ff);
    quantize_q8_k(xn, xq.data(), n_embd);
    std::vector<float> g(n_ff), u(n_ff), mid(n_ff), y(std::size_t(route.n_used) * n_embd);
    for (int s = 0; s < route.n_used; ++s) {
        const std::int64_t e = route.expert[s];
        const GateUp* ge = gate_exps + e * n_ff * nb_in;
        const GateUp* ue = up_exps + e * n_ff * nb_in;
        const Down* de = down_exps + e * std::int64_t(n_embd) * nb_ff;
        parallel_for(n_ff, [&](std::int64_t b, std::int64_t end) {
            for (std::int64_t r = b; r < end; ++r) {
                g[r] = clamp_gate(expert_dot(ge + r * nb_in, xq.data(), nb_in), clamp);
                u[r] = clamp_up(expert_dot(ue + r * nb_in, xq.data(), nb_in), clamp);
                mid[r] = (silu(g[r]) * u[r]) * route.weight[s];
            }
        }, 64);
        quantize_q8_k(mid.data(), midq.data(), n_ff);
        float* ys = y.data() + std::int64_t(s) * n_embd;
        parallel_for(n_embd, [&](std::int64_t b, std::int64_t end) {
            for (std::int64_t o = b; o < end; ++o) ys[o] = expert_dot(de + o * nb_ff, midq.data(), nb_ff);
        }, 64);
    }
    for (int o = 0; o < n_embd; ++o) {
        float acc = 0.0f;
        for (int s = 0; s < route.n_used; ++s) acc += y[std::int64_t(s) * n_embd + o];
        out[o] = acc;
    }
}

}  // namespace

void moe_routed(const iq2_xxs_block* gate_exps, const iq2_xxs_block* up_exps, const q2_k_block* down_exps,
                const moe_route& route, const float* xn, int n_embd, int n_ff, float clamp, float* out) {
    routed_experts(gate_exps, up_exps, down_exps, route, xn, n_embd, n_ff, clamp, out);
}

void moe_routed(const q4_k_block* gate_exps, const q4_k_block* up_exps, const q4_k_block* down_exps,
                const moe_route& route, const float* xn, int n_embd, int n_ff, float clamp, float* out) {
    routed_experts(gate_exps, up_exps, down_exps, route, xn, n_embd, n_ff, clamp, out);
}

void shared_expert(const q8_0_block* gate, const q8_0_block* up, const q8_0_block* down, const float* xn,
                   int n_embd, int n_ff, float clamp, float* out) {
    std::vector<q8_0_act_block> xq(n_embd / 32);
    quantize_q8_0_act(xn, xq.data(), n_embd);
    std::vector<float> g(n_ff), u(n_ff), mid(n_ff);
    matvec_q8_0_prequant(gate, xq.data(), n_embd, n_ff, g.data());
    matvec_q8_0_prequant(up, xq.data(), n_embd, n_ff, u.data());
    for (int r = 0; r < n_ff; ++r) mid[r] = swiglu_clamped(g[r], u[r], clamp);
    matvec_q8_0(down, mid.data(), n_ff, n_embd, out);
}

}  // namespace ds4::ref
