#pragma once
// Counter-based random streams for ds4-synth. Every tensor gets a key derived from the seed and
// its name, and every fixed-size chunk of a tensor a stream derived from that key and the chunk
// index, so any chunk can be generated on any thread, in any order, and the file's bytes depend
// only on the seed. The generator inside a chunk is wyrand (one 64x64->128 multiply per 8
// bytes), which is what lets two cores fill ~81 GiB at more than 1 GB/s.
#include <cstdint>
#include <string_view>

namespace ds4::synth {

// splitmix64's finaliser: a bijective mix, so distinct inputs never collide.
constexpr std::uint64_t mix64(std::uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// FNV-1a of the tensor name, then mixed with the seed: renaming a tensor changes its stream,
// adding a tensor elsewhere does not.
constexpr std::uint64_t tensor_key(std::uint64_t seed, std::string_view name) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
    return mix64(mix64(seed) ^ h);
}

class rng {
public:
    explicit rng(std::uint64_t state) : s_(state) {}
    // The stream of chunk `index` of the tensor with key `key`.
    static rng for_chunk(std::uint64_t key, std::uint64_t index) { return rng(mix64(key ^ mix64(index + 1))); }

    std::uint64_t next() {
        s_ += 0xa0761d6478bd642full;
        const unsigned __int128 t = static_cast<unsigned __int128>(s_) * (s_ ^ 0xe7037ed1a0b428dbull);
        return static_cast<std::uint64_t>(t >> 64) ^ static_cast<std::uint64_t>(t);
    }
    // Uniform in [0, n) by multiply-shift (Lemire), no modulo bias worth the name for n < 2^32.
    std::uint32_t below(std::uint32_t n) {
        return static_cast<std::uint32_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
    }
    // Uniform in [lo, hi).
    float uniform(float lo, float hi) {
        return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
    }

private:
    std::uint64_t s_;
};

}  // namespace ds4::synth
