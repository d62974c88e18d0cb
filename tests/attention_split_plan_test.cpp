// The tensor-core decode's split-KV geometry (kernels/attention_split_plan.hpp): every visible
// row lands in exactly one slot, slots are whole 64-row tiles, and an explicit split is kept; and
// the backend's DS4_ATTN_SPLIT parse (backends/cuda/attention_split_option.hpp).
#include <doctest/doctest.h>

#include <string>

#include "backends/cuda/attention_split_option.hpp"
#include "ds4/core/error.hpp"
#include "ds4/kernels/attention_split_plan.hpp"

using ds4::kernels::plan_attention_split;

TEST_CASE("every window row and every visible compressed row is covered by exactly one slot") {
    for (int n_swa : {1, 16, 63, 64, 65, 128, 130})
        for (double rows_q : {1.0, 5.0, 16.0, 64.0, 1024.0})
            for (int max_comp : {0, 1, 63, 64, 65, 512, 8192, 65536, 262144})
                for (int n_sm : {1, 108, 132}) {
                    const auto p = plan_attention_split(n_swa, rows_q, max_comp, n_sm);
                    INFO("n_swa " << n_swa << " rows_q " << rows_q << " max_comp " << max_comp << " n_sm " << n_sm);
                    CHECK(p.split_rows >= 64);
                    CHECK(p.split_rows % 64 == 0);
                    CHECK(p.raw_split % 64 == 0);
                    CHECK(p.raw_split <= p.split_rows);
                    CHECK(long(p.raw_slots) * p.raw_split >= n_swa);
                    CHECK(long(p.raw_slots - 1) * p.raw_split < n_swa);
                    CHECK(long(p.comp_slots) * p.split_rows >= max_comp);
                    if (max_comp == 0) CHECK(p.comp_slots == 0);
                    else CHECK(long(p.comp_slots - 1) * p.split_rows < max_comp);
                }
}

TEST_CASE("an explicit split size is kept; the window then splits at most as finely") {
    const auto p = plan_attention_split(128, 1.0, 8192, 132, 64);
    CHECK(p.split_rows == 64);
    CHECK(p.raw_split == 64);
    CHECK(p.raw_slots == 2);
    CHECK(p.comp_slots == 128);
    const auto q = plan_attention_split(128, 1.0, 8192, 132, 1024);
    CHECK(q.raw_split == 128);  // the window (128 rows) is one slot
    CHECK(q.raw_slots == 1);
    CHECK(q.comp_slots == 8);
}

TEST_CASE("one query row on a large GPU uses many small slots; a full batch uses few large ones") {
    // 64 sequences x 8192 rows on 132 SMs: one-tile slots make 64 x (2 + 128) = 8320 CTAs, 64 waves
    // of cost 2 = 128, while 960-row slots make 64 x (1 + 9) = 640 CTAs, 5 waves of cost 16 = 80:
    // the finest split must lose there. For a lone query row it fits one wave and wins.
    CHECK(plan_attention_split(128, 1.0, 8192, 132).split_rows <= 128);
    CHECK(plan_attention_split(128, 64.0, 8192, 132).split_rows > 128);
}

TEST_CASE("DS4_ATTN_SPLIT: unset gives 256, a multiple of 64 is kept, anything else is an error naming it") {
    using ds4::cuda_backend::attention_split_rows;
    CHECK(attention_split_rows(nullptr) == 256);
    CHECK(attention_split_rows("") == 256);
    CHECK(attention_split_rows("64") == 64);
    CHECK(attention_split_rows("128") == 128);
    CHECK(attention_split_rows("65536") == 65536);
    for (const char* bad : {"0", "32", "100", "-64", "65600", "128x", "x", " ", "99999999999999999999"}) {
        CAPTURE(bad);
        try {
            (void)attention_split_rows(bad);
            FAIL("accepted");
        } catch (const ds4::error& e) {
            CHECK(std::string(e.what()).find(std::string("DS4_ATTN_SPLIT=") + bad) != std::string::npos);
        }
    }
}
