#pragma once
// The int8 mma.sync ceiling of this GPU (int8_mma_probe.cu), measured once per process, and the
// counters of an int8 GEMM row against it: TOP/s, the ceiling and the percentage.
#include <benchmark/benchmark.h>

#include "bench/gpu_timer.hpp"

namespace ds4::bench {

double measured_int8_mma_peak();  // int8 ops (2 per multiply-add) per second
void report_int8(benchmark::State& state, const timing& t, double ops);

}  // namespace ds4::bench
