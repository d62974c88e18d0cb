// Uses one format header of ds4, as another engine would.
#include <cstdio>

#include "ds4/core/half.hpp"

int main() {
    const float x = ds4::f16_round(0.1f);
    std::printf("f16_round(0.1) = %.9g\n", double(x));
    return x == 0.0999755859375f ? 0 : 1;
}
