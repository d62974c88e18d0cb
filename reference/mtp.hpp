#pragma once
// The MTP (multi-token prediction) head of model.md §4 on the CPU reference.
//
// The head lives in its own GGUF (mtp.0.* tensors), validated against the base model's dims,
// and reuses the base model's token_embd and output.weight. One draft step:
//   e = RMSNorm(token_embd[token]) * enorm;  E = e_proj . e                       (Q8_0)
//   H_s = h_proj . (RMSNorm(prev_hc[s]) * hnorm)     for each HC stream s       (Q8_0)
//   input_hc[s] = E + H_s
//   out_hc = the decode layer with the mtp.0 block: window-only (ratio 0), RoPE base 10000
//            without YaRN, learned top-k routing with the required exp_probs_b.bias
//   logits = output head(out_hc) with mtp.0.hc_head_{fn,scale,base}, mtp.0.norm and the base
//            output.weight
// prev_hc is the base model's final HC state (forward_options::want_hc_state) for the first
// draft and the previous step's out_hc for recursive drafts.
//
// The MTP state of a sequence is its own raw window of n_swa rows in the engine's native
// attention row format (kv_layout.hpp). It is a plain value: copying it is its snapshot, and
// assigning the copy back is its restore (the base engine's snapshot blob does not carry it).
// Rows are written in position order, one per draft step; a step at position p needs the state
// at length p.
//
// The acceptance / verification of drafts (§4 steps 2, 4-6) belongs to the server.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "ds4/gguf/reader.hpp"
#include "ds4/model/shape.hpp"

namespace ds4::ref {

class cpu_engine;

struct mtp_state {
    std::int32_t length = 0;        // positions written (rows 0..length-1; the last n_swa are kept)
    std::vector<std::uint8_t> raw;  // n_swa rows, row of position p at slot p % n_swa
};

struct mtp_step {
    std::vector<float> logits;  // n_vocab
    std::vector<float> hc;      // n_hc * n_embd: prev_hc of the next recursive step
    std::int32_t token = 0;     // argmax(logits), the lowest id on ties (sample_argmax)
};

class mtp_head {
public:
    // Opens the MTP file and binds it against `base` (which must outlive the head). A file that
    // is not an MTP file of the base model's shape is a ds4::error listing every difference.
    static std::unique_ptr<mtp_head> load(const std::filesystem::path& path, const cpu_engine& base);
    mtp_head(gguf::file file, const cpu_engine& base);
    ~mtp_head();

    const model::model_dims& dims() const;
    mtp_state new_state() const;

    // One MTP step at `pos` (== state.length): writes the state's row for pos.
    mtp_step draft(mtp_state& state, std::int32_t token, const float* prev_hc, std::int32_t pos) const;

    // Up to n greedy drafts from the target's token x_p and final HC state h_p at position p
    // (§4 steps 1 and 3): draft[0] = MTP(x_p, h_p, p) and draft[k] = MTP(draft[k-1], out_hc of
    // step k-1, p+k). Step 0's row is the real row for p and stays in `state` (length p+1); the
    // recursive steps run on a copy, since their inputs are speculative.
    std::vector<std::int32_t> greedy_draft(mtp_state& state, std::int32_t token, const float* prev_hc,
                                           std::int32_t pos, int n) const;

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

}  // namespace ds4::ref
