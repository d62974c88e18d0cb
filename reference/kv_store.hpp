#pragma once
// The KV row as the cache stores it (docs/model.md §2.4 steps 5-6, §7.5): the FP8 E4M3 round trip
// on the non-RoPE dims [0, head_dim - n_rot) in blocks of 64 (power-of-two block scales), then
// the F16 round of all head_dim values. Applied to raw rows after RoPE, and (fp8 part) to
// compressed attention rows after norm and RoPE.
namespace ds4::ref {

// E4M3 round trip of x[0, n_nope) per 64-value block, in place (n_nope a multiple of 64).
void fp8_kv_roundtrip(float* x, int n_nope);

// fp8_kv_roundtrip on the nope part, then f16_round on every value: the stored row, in place.
void kv_row_as_stored(float* row, int head_dim, int n_rot);

}  // namespace ds4::ref
