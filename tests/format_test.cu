// The format functions compiled for the device give the same bits as the host build of the
// same headers (docs/README.md decision 1): decode, integer dots, activation quantisers, E4M3/E2M1 and
// the rounding primitives, on random blocks and on the special values of each. Exit code 77
// (skipped) when no CUDA device is present.
#include <doctest/doctest.h>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "ds4/core/device_buffer.hpp"
#include "ds4/format/formats.hpp"

namespace {

using namespace ds4;

void require_device() {
    if (!cuda_device_present()) {
        std::fprintf(stderr, "format_test_gpu: no CUDA device, skipped\n");
        std::exit(77);
    }
}

std::mt19937_64& rng() {
    static std::mt19937_64 g = [] {
        const std::uint64_t seed = std::random_device{}();
        std::printf("format_test_gpu seed %llu\n", static_cast<unsigned long long>(seed));
        return std::mt19937_64(seed);
    }();
    return g;
}

// A finite, non-zero-range F16 scale of either sign (random bytes would include inf/NaN).
std::uint16_t random_f16_scale(int lo_exp, int hi_exp) {
    const float mag = std::ldexp(std::uniform_real_distribution<float>(1.0f, 2.0f)(rng()),
                                 std::uniform_int_distribution<int>(lo_exp, hi_exp)(rng()));
    return f32_to_f16(rng()() & 1 ? -mag : mag);
}

template <class T>
std::vector<T> random_blocks(std::size_t n) {
    std::vector<T> v(n);
    auto* p = reinterpret_cast<unsigned char*>(v.data());
    for (std::size_t i = 0; i < n * sizeof(T); ++i) p[i] = static_cast<unsigned char>(rng()());
    return v;
}

std::vector<float> gaussian(std::size_t n, float sigma) {
    std::normal_distribution<float> nd(0.0f, sigma);
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng());
    return v;
}

template <class T>
void check_same_bytes(const std::vector<T>& host, const std::vector<T>& dev, const char* what) {
    REQUIRE(host.size() == dev.size());
    std::size_t first = host.size();
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < host.size(); ++i)
        if (std::memcmp(&host[i], &dev[i], sizeof(T)) != 0) {
            if (first == host.size()) first = i;
            ++mismatches;
        }
    INFO(what << ": " << mismatches << " of " << host.size() << " differ, first at " << first);
    CHECK(mismatches == 0);
}

constexpr int threads = 128;
int grid_for(std::size_t n) { return static_cast<int>((n + threads - 1) / threads); }

template <class Block, int Elems>
__global__ void dequantize_kernel(const Block* b, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dequantize(b[i], out + std::size_t(Elems) * i);
}

template <class Block, int Elems>
void check_dequantize(const std::vector<Block>& blocks, const char* what) {
    device_buffer<Block> db{std::span<const Block>(blocks)};
    device_buffer<float> dout(blocks.size() * Elems);
    dout.fill_bytes(0xff);
    dequantize_kernel<Block, Elems><<<grid_for(blocks.size()), threads>>>(db.data(), dout.data(), int(blocks.size()));
    cuda_check_launch("dequantize_kernel");
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::vector<float> host(blocks.size() * Elems);
    for (std::size_t i = 0; i < blocks.size(); ++i) dequantize(blocks[i], host.data() + Elems * i);
    check_same_bytes(host, dout.download(), what);
}

// One row of weights per thread against one shared activation row.
struct q8_0_dot {
    __host__ __device__ float operator()(const q8_0_block* w, const q8_0_act_block* x, int nb) const {
        return dot_q8_0(w, x, nb);
    }
};
struct q2_k_dot {
    __host__ __device__ float operator()(const q2_k_block* w, const q8_k_block* x, int nb) const {
        return dot_q2_k_q8_k(w, x, nb);
    }
};
struct q4_k_dot {
    __host__ __device__ float operator()(const q4_k_block* w, const q8_k_block* x, int nb) const {
        return dot_q4_k_q8_k(w, x, nb);
    }
};
struct iq2_xxs_dot {
    __host__ __device__ float operator()(const iq2_xxs_block* w, const q8_k_block* x, int nb) const {
        return dot_iq2_xxs_q8_k(w, x, nb);
    }
};

template <class Dot, class W, class X>
__global__ void dot_kernel(const W* w, const X* x, int nb, int rows, float* out) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows) out[r] = Dot{}(w + std::size_t(r) * nb, x, nb);
}

template <class Dot, class W, class X>
void check_dot(const std::vector<W>& w, const std::vector<X>& x, int nb, const char* what) {
    const int rows = static_cast<int>(w.size() / nb);
    device_buffer<W> dw{std::span<const W>(w)};
    device_buffer<X> dx{std::span<const X>(x)};
    device_buffer<float> dout(rows);
    dot_kernel<Dot><<<grid_for(rows), threads>>>(dw.data(), dx.data(), nb, rows, dout.data());
    cuda_check_launch("dot_kernel");
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::vector<float> host(rows);
    for (int r = 0; r < rows; ++r) host[r] = Dot{}(w.data() + std::size_t(r) * nb, x.data(), nb);
    check_same_bytes(host, dout.download(), what);
}

__global__ void quantize_q8_0_act_kernel(const float* x, q8_0_act_block* out, int nblocks) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < nblocks) quantize_q8_0_act(x + 32 * std::size_t(i), out + i, 32);
}

__global__ void quantize_q8_k_kernel(const float* x, q8_k_block* out, int nblocks) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < nblocks) quantize_q8_k(x + 256 * std::size_t(i), out + i, 256);
}

// Scalar primitives, one input per thread, every result kept.
struct scalar_results {
    int rhe, ceil2, floor2;
    std::uint32_t exp2, e4m3_round_bits, e2m1_round_bits;
    std::uint8_t e4m3_code, e2m1_code;
};

__host__ __device__ scalar_results scalar_ops(float x, int e) {
    scalar_results r{};
    r.rhe = round_half_even(x);
    const float a = abs_exact(x);
    const bool positive_finite_or_inf = a > 0.0f;
    r.ceil2 = positive_finite_or_inf ? ceil_log2(a) : 0;
    r.floor2 = positive_finite_or_inf && a < bits_float(0x7f800000u) ? floor_log2(a) : 0;
    r.exp2 = float_bits(exp2i(e));
    r.e4m3_code = e4m3_encode(x);
    r.e2m1_code = e2m1_encode(x);
    r.e4m3_round_bits = float_bits(e4m3_round(x));
    r.e2m1_round_bits = float_bits(e2m1_round(x));
    return r;
}

__global__ void scalar_kernel(const float* x, const int* e, scalar_results* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = scalar_ops(x[i], e[i]);
}

__global__ void decode_codes_kernel(float* e4m3, float* e2m1) {
    const int c = threadIdx.x;
    e4m3[c] = e4m3_decode(static_cast<std::uint8_t>(c));
    if (c < 16) e2m1[c] = e2m1_decode(static_cast<std::uint8_t>(c));
}

// Per block of n values: round trip in place, native encode (codes + exponent) and decode.
__global__ void minifloat_block_kernel(const float* x, int nblocks, float* rt4, std::uint8_t* codes4, int* exp4,
                                      float* dec4, float* rt2, std::uint8_t* packed2, int* exp2, float* dec2) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= nblocks) return;
    const float* xb = x + 64 * std::size_t(b);
    for (int i = 0; i < 64; ++i) rt4[64 * b + i] = xb[i];
    e4m3_block_roundtrip(rt4 + 64 * b, 64);
    exp4[b] = e4m3_block_encode(xb, 64, codes4 + 64 * b);
    e4m3_block_decode(codes4 + 64 * b, exp4[b], 64, dec4 + 64 * b);
    for (int i = 0; i < 32; ++i) rt2[32 * b + i] = xb[i];
    e2m1_block_roundtrip(rt2 + 32 * b, 32);
    exp2[b] = e2m1_block_encode(xb, 32, packed2 + 16 * b);
    e2m1_block_decode(packed2 + 16 * b, exp2[b], 32, dec2 + 32 * b);
}

}  // namespace

TEST_CASE("gpu format: a device is present (else exit 77)") {
    require_device();
    int dev = 0;
    cudaDeviceProp prop{};
    cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
    cuda_check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
    MESSAGE("device " << prop.name << " sm_" << prop.major << prop.minor);
}

TEST_CASE("gpu format: dequantize matches the host bitwise") {
    require_device();
    auto q8 = random_blocks<q8_0_block>(3001);
    for (auto& b : q8) b.d = random_f16_scale(-24, 15);
    q8[0] = q8_0_block{};
    check_dequantize<q8_0_block, 32>(q8, "q8_0");

    auto q2 = random_blocks<q2_k_block>(1001);
    for (auto& b : q2) {
        b.d = random_f16_scale(-14, 4);
        b.dmin = random_f16_scale(-14, 4);
    }
    check_dequantize<q2_k_block, 256>(q2, "q2_k");

    auto q4 = random_blocks<q4_k_block>(1001);
    for (auto& b : q4) {
        b.d = random_f16_scale(-14, 4);
        b.dmin = random_f16_scale(-14, 4);
    }
    check_dequantize<q4_k_block, 256>(q4, "q4_k");

    std::vector<iq2_xxs_block> iq(1001);
    std::uint64_t state = rng()();
    fill_random_iq2_xxs(state, iq.data(), iq.size(), 1.0f);
    for (auto& b : iq) b.d = random_f16_scale(-14, 4);
    check_dequantize<iq2_xxs_block, 256>(iq, "iq2_xxs");

    auto q8k = random_blocks<q8_k_block>(501);
    for (auto& b : q8k) b.d = std::ldexp(std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng()), -7);
    check_dequantize<q8_k_block, 256>(q8k, "q8_k");
}

TEST_CASE("gpu format: activation quantisers match the host bitwise") {
    require_device();
    const int nb0 = 4099;
    std::vector<float> x = gaussian(32 * std::size_t(nb0), 3.0f);
    // Tie blocks: amax 127 makes id = 1, so the .5 values are exact ties.
    for (int i = 0; i < 32; ++i) x[i] = i == 0 ? 127.0f : float(i) - 15.5f;
    for (int i = 32; i < 64; ++i) x[i] = 0.0f;
    {
        device_buffer<float> dx{std::span<const float>(x)};
        device_buffer<q8_0_act_block> dq(nb0);
        quantize_q8_0_act_kernel<<<grid_for(nb0), threads>>>(dx.data(), dq.data(), nb0);
        cuda_check_launch("quantize_q8_0_act_kernel");
        cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        std::vector<q8_0_act_block> host(nb0);
        quantize_q8_0_act(x.data(), host.data(), 32 * nb0);
        check_same_bytes(host, dq.download(), "quantize_q8_0_act");
    }
    const int nbk = 513;
    std::vector<float> xk = gaussian(256 * std::size_t(nbk), 0.3f);
    for (int i = 0; i < 256; ++i) xk[i] = 0.0f;             // zero block
    xk[256 + 9] = -50.0f;                                   // negative signed max
    xk[512 + 3] = std::numeric_limits<float>::quiet_NaN();  // NaN quantises to 0 on both sides
    {
        device_buffer<float> dx{std::span<const float>(xk)};
        device_buffer<q8_k_block> dq(nbk);
        quantize_q8_k_kernel<<<grid_for(nbk), threads>>>(dx.data(), dq.data(), nbk);
        cuda_check_launch("quantize_q8_k_kernel");
        cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        std::vector<q8_k_block> host(nbk);
        quantize_q8_k(xk.data(), host.data(), 256 * nbk);
        check_same_bytes(host, dq.download(), "quantize_q8_k");
    }
}

TEST_CASE("gpu format: integer dots match the host bitwise") {
    require_device();
    for (int nb : {1, 3, 16, 29}) {
        CAPTURE(nb);
        const int rows = 257;
        {
            std::vector<float> wf = gaussian(32 * std::size_t(nb) * rows, 0.05f), xf = gaussian(32 * std::size_t(nb), 1.0f);
            std::vector<q8_0_block> w(std::size_t(nb) * rows);
            std::vector<q8_0_act_block> x(nb);
            quantize_q8_0(wf.data(), w.data(), wf.size());
            quantize_q8_0_act(xf.data(), x.data(), 32 * nb);
            check_dot<q8_0_dot>(w, x, nb, "dot_q8_0");
        }
        std::vector<float> xf = gaussian(256 * std::size_t(nb), 1.0f);
        std::vector<q8_k_block> x(nb);
        quantize_q8_k(xf.data(), x.data(), 256 * nb);
        {
            auto w = random_blocks<q2_k_block>(std::size_t(nb) * rows);
            for (auto& b : w) {
                b.d = random_f16_scale(-14, 0);
                b.dmin = random_f16_scale(-14, 0);
            }
            check_dot<q2_k_dot>(w, x, nb, "dot_q2_k_q8_k");
        }
        {
            auto w = random_blocks<q4_k_block>(std::size_t(nb) * rows);
            for (auto& b : w) {
                b.d = random_f16_scale(-14, 0);
                b.dmin = random_f16_scale(-14, 0);
            }
            check_dot<q4_k_dot>(w, x, nb, "dot_q4_k_q8_k");
        }
        {
            std::vector<iq2_xxs_block> w(std::size_t(nb) * rows);
            std::uint64_t state = rng()();
            fill_random_iq2_xxs(state, w.data(), w.size(), 0.01f);
            for (auto& b : w) b.d = random_f16_scale(-14, 0);
            check_dot<iq2_xxs_dot>(w, x, nb, "dot_iq2_xxs_q8_k");
        }
    }
}

TEST_CASE("gpu format: rounding primitives and minifloat codes match the host bitwise") {
    require_device();
    std::vector<float> x;
    // Special values first, then random bit patterns (NaN and inf included) and small ranges.
    const float specials[] = {0.0f, -0.0f, 0.5f, 1.5f, 2.5f, -2.5f, 0.25f, 0.75f, 5.0f, 432.0f, 448.0f, 449.0f,
                              std::ldexp(1.0f, -6), std::ldexp(1.0f, -9), std::ldexp(1.0f, -10),
                              7.5f * std::ldexp(1.0f, -9), 3e9f, -3e9f, std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::denorm_min(), std::nextafter(std::ldexp(1.0f, -10), 1.0f)};
    for (float s : specials) x.push_back(s);
    for (int i = 0; i < 100000; ++i) x.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng()())));
    std::uniform_real_distribution<float> small(-500.0f, 500.0f);
    for (int i = 0; i < 100000; ++i) x.push_back(small(rng()));
    std::vector<int> e(x.size());
    for (std::size_t i = 0; i < e.size(); ++i) e[i] = static_cast<int>(i % 320) - 170;

    device_buffer<float> dx{std::span<const float>(x)};
    device_buffer<int> de{std::span<const int>(e)};
    device_buffer<scalar_results> dr(x.size());
    dr.fill_bytes(0);
    scalar_kernel<<<grid_for(x.size()), threads>>>(dx.data(), de.data(), dr.data(), int(x.size()));
    cuda_check_launch("scalar_kernel");
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::vector<scalar_results> host(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) host[i] = scalar_ops(x[i], e[i]);
    std::vector<scalar_results> dev = dr.download();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        const scalar_results &h = host[i], &d = dev[i];
        const bool same = h.rhe == d.rhe && h.ceil2 == d.ceil2 && h.floor2 == d.floor2 && h.exp2 == d.exp2 &&
                          h.e4m3_round_bits == d.e4m3_round_bits && h.e2m1_round_bits == d.e2m1_round_bits &&
                          h.e4m3_code == d.e4m3_code && h.e2m1_code == d.e2m1_code;
        if (!same && bad++ < 5)
            MESSAGE("x = " << x[i] << " bits " << std::bit_cast<std::uint32_t>(x[i]) << ": rhe " << h.rhe << "/"
                           << d.rhe << " ceil " << h.ceil2 << "/" << d.ceil2 << " e4m3 " << int(h.e4m3_code) << "/"
                           << int(d.e4m3_code));
    }
    CHECK(bad == 0);

    device_buffer<float> d4(256), d2(16);
    decode_codes_kernel<<<1, 256>>>(d4.data(), d2.data());
    cuda_check_launch("decode_codes_kernel");
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::vector<float> h4(256), h2(16);
    for (int c = 0; c < 256; ++c) h4[c] = e4m3_decode(static_cast<std::uint8_t>(c));
    for (int c = 0; c < 16; ++c) h2[c] = e2m1_decode(static_cast<std::uint8_t>(c));
    check_same_bytes(h4, d4.download(), "e4m3_decode");
    check_same_bytes(h2, d2.download(), "e2m1_decode");
}

TEST_CASE("gpu format: E4M3/E2M1 block codecs match the host bitwise") {
    require_device();
    const int nb = 2048;
    std::vector<float> x(64 * std::size_t(nb));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int b = 0; b < nb; ++b) {
        const float sigma = std::ldexp(1.0f, std::uniform_int_distribution<int>(-60, 60)(rng()));
        for (int i = 0; i < 64; ++i) x[64 * b + i] = nd(rng()) * sigma;
        if (b % 7 == 0) x[64 * b + (b % 64)] *= 1000.0f;
        if (b % 11 == 0)
            for (int i = 0; i < 64; ++i) x[64 * b + i] = 0.0f;
    }
    device_buffer<float> dx{std::span<const float>(x)};
    device_buffer<float> rt4(64 * nb), dec4(64 * nb), rt2(32 * nb), dec2(32 * nb);
    device_buffer<std::uint8_t> codes4(64 * nb), packed2(16 * nb);
    device_buffer<int> exp4(nb), exp2(nb);
    minifloat_block_kernel<<<grid_for(nb), threads>>>(dx.data(), nb, rt4.data(), codes4.data(), exp4.data(),
                                                      dec4.data(), rt2.data(), packed2.data(), exp2.data(),
                                                      dec2.data());
    cuda_check_launch("minifloat_block_kernel");
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

    std::vector<float> h_rt4(x), h_dec4(64 * nb), h_rt2(32 * nb), h_dec2(32 * nb);
    std::vector<std::uint8_t> h_codes4(64 * nb), h_packed2(16 * nb);
    std::vector<int> h_exp4(nb), h_exp2(nb);
    for (int b = 0; b < nb; ++b) {
        e4m3_block_roundtrip(h_rt4.data() + 64 * b, 64);
        h_exp4[b] = e4m3_block_encode(x.data() + 64 * b, 64, h_codes4.data() + 64 * b);
        e4m3_block_decode(h_codes4.data() + 64 * b, h_exp4[b], 64, h_dec4.data() + 64 * b);
        std::memcpy(h_rt2.data() + 32 * b, x.data() + 64 * b, 32 * sizeof(float));
        e2m1_block_roundtrip(h_rt2.data() + 32 * b, 32);
        h_exp2[b] = e2m1_block_encode(x.data() + 64 * b, 32, h_packed2.data() + 16 * b);
        e2m1_block_decode(h_packed2.data() + 16 * b, h_exp2[b], 32, h_dec2.data() + 32 * b);
    }
    check_same_bytes(h_rt4, rt4.download(), "e4m3_block_roundtrip");
    check_same_bytes(h_codes4, codes4.download(), "e4m3_block_encode codes");
    check_same_bytes(h_exp4, exp4.download(), "e4m3_block_encode exponent");
    check_same_bytes(h_dec4, dec4.download(), "e4m3_block_decode");
    check_same_bytes(h_rt2, rt2.download(), "e2m1_block_roundtrip");
    check_same_bytes(h_packed2, packed2.download(), "e2m1_block_encode codes");
    check_same_bytes(h_exp2, exp2.download(), "e2m1_block_encode exponent");
    check_same_bytes(h_dec2, dec2.download(), "e2m1_block_decode");
    // And the storage property on the device's own results.
    check_same_bytes(rt4.download(), dec4.download(), "device e4m3 decode(encode) vs round trip");
    check_same_bytes(rt2.download(), dec2.download(), "device e2m1 decode(encode) vs round trip");
}
