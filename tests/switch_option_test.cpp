// The CUDA backend's on/off environment switches (backends/cuda/switch_option.hpp), parsed
// without a GPU: unset and empty keep the default, 0 and 1 set it, anything else names the
// variable and its value in the error.
#include <doctest/doctest.h>

#include <string>

#include "backends/cuda/switch_option.hpp"
#include "ds4/core/error.hpp"

TEST_CASE("switch_option: unset or empty keeps the default, 0 and 1 set it, anything else is an error naming it") {
    using ds4::cuda_backend::switch_option;
    for (bool fallback : {false, true}) {
        CHECK(switch_option("DS4_HC_FOLD", nullptr, fallback) == fallback);
        CHECK(switch_option("DS4_HC_FOLD", "", fallback) == fallback);
        CHECK(switch_option("DS4_HC_FOLD", "0", fallback) == false);
        CHECK(switch_option("DS4_HC_FOLD", "1", fallback) == true);
    }
    for (const char* bad : {"2", "yes", "true", " 1", "1 ", "01", "-0", "off"}) {
        CAPTURE(bad);
        try {
            (void)switch_option("DS4_HC_FOLD", bad, true);
            FAIL("accepted");
        } catch (const ds4::error& e) {
            CHECK(std::string(e.what()).find(std::string("DS4_HC_FOLD=") + bad + ":") != std::string::npos);
        }
    }
}
