// Uses one piece of ds4, as another engine would: the Q8_0 block format and its integer dot
// (format/q8_0.hpp), nothing else of the library.
#include <cstdio>
#include <vector>

#include "ds4/format/q8_0.hpp"

int main() {
    // Weights w[i] = (i % 7 - 3) / 8 and activations x[i] = 1 for 64 inputs: the quantized dot
    // must match the float dot within the Q8_0 rounding (the F16 scale amax/127 makes each
    // weight off by at most half a step, 0.375/127/2 here, far under the 1e-3 allowed).
    std::vector<float> w(64), x(64, 1.0f);
    double expect = 0;
    for (int i = 0; i < 64; ++i) {
        w[i] = float(i % 7 - 3) / 8.0f;
        expect += w[i];
    }
    std::vector<ds4::q8_0_block> wq(2);
    std::vector<ds4::q8_0_act_block> xq(2);
    ds4::quantize_q8_0(w.data(), wq.data(), w.size());
    ds4::quantize_q8_0_act(x.data(), xq.data(), int(x.size()));
    const float got = ds4::dot_q8_0(wq.data(), xq.data(), 2);
    std::printf("q8_0 dot = %.6f (float dot %.6f)\n", double(got), expect);
    const double diff = double(got) - expect;
    return diff < 1e-3 && diff > -1e-3 ? 0 : 1;
}
