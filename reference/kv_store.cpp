#include "reference/kv_store.hpp"

#include <string>

#include "ds4/core/error.hpp"
#include "ds4/core/half.hpp"
#include "ds4/format/e4m3.hpp"

namespace ds4::ref {

void fp8_kv_roundtrip(float* x, int n_nope) {
    require(n_nope % e4m3_block_size == 0,
            "fp8_kv_roundtrip: nope width " + std::to_string(n_nope) + " is not a multiple of 64");
    for (int b = 0; b < n_nope; b += e4m3_block_size) e4m3_block_roundtrip(x + b, e4m3_block_size);
}

void kv_row_as_stored(float* row, int head_dim, int n_rot) {
    fp8_kv_roundtrip(row, head_dim - n_rot);
    for (int i = 0; i < head_dim; ++i) row[i] = f16_round(row[i]);
}

}  // namespace ds4::ref
