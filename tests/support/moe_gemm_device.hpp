#pragma once
// A moe_gemm test problem (tests/support/moe_gemm_problem.hpp) on the device, and the
// moe_gemm_args that read it (x, routes, tiled experts) and write its `out` ([rows][n_embd]).
#include <span>

#include "ds4/core/device_buffer.hpp"
#include "ds4/kernels/moe_gemm.cuh"
#include "tests/support/moe_gemm_problem.hpp"

namespace ds4::test {

struct device_problem {
    device_buffer<std::uint8_t> gq, uq, dq;
    device_buffer<std::uint16_t> gd, ud;
    device_buffer<std::uint32_t> ddd;
    device_buffer<float> x, w;
    device_buffer<std::int32_t> sel;
    device_buffer<float> out;
    int n_embd;

    explicit device_problem(const problem& P)
        : gq(std::span<const std::uint8_t>(P.gq)),
          uq(std::span<const std::uint8_t>(P.uq)),
          dq(std::span<const std::uint8_t>(P.dq)),
          gd(std::span<const std::uint16_t>(P.gd)),
          ud(std::span<const std::uint16_t>(P.ud)),
          ddd(std::span<const std::uint32_t>(P.ddd)),
          x(std::span<const float>(P.x)),
          w(std::span<const float>(P.w)),
          sel(std::span<const std::int32_t>(P.sel)),
          out(std::size_t(P.rows) * std::size_t(P.n_embd)),
          n_embd(P.n_embd) {}

    // The problem's first n_rows rows, clamp 10 (make_problem's and the model's).
    kernels::moe_gemm_args args(int n_rows) const {
        kernels::moe_gemm_args a;
        a.n_rows = n_rows;
        a.xn = x.data();
        a.x_stride = n_embd;
        a.sel = sel.data();
        a.wts = w.data();
        a.gate_q = gq.data();
        a.gate_d = gd.data();
        a.up_q = uq.data();
        a.up_d = ud.data();
        a.down_q = dq.data();
        a.down_dd = ddd.data();
        a.clamp = 10.0f;
        a.out = out.data();
        a.out_stride = n_embd;
        return a;
    }
};

}  // namespace ds4::test
