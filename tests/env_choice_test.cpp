// core/env_choice.hpp: a measurement switch is its plan's own choice when unset or empty, one of
// its allowed values when set to one, and an error naming the variable otherwise.
#include <doctest/doctest.h>

#include <cstdlib>

#include "ds4/core/env_choice.hpp"

namespace {

constexpr const char* var = "DS4_ENV_CHOICE_TEST";

int choice_with(const char* value) {
    if (value == nullptr)
        unsetenv(var);
    else
        setenv(var, value, 1);
    return ds4::env_choice(var, {1, 2, 4, 8});
}

}  // namespace

TEST_CASE("env_choice: unset or empty leaves the plan's choice (0)") {
    CHECK(choice_with(nullptr) == 0);
    CHECK(choice_with("") == 0);
}

TEST_CASE("env_choice: an allowed value is returned") {
    CHECK(choice_with("1") == 1);
    CHECK(choice_with("4") == 4);
    CHECK(choice_with("8") == 8);
}

TEST_CASE("env_choice: anything else is an error naming the variable and the allowed values") {
    for (const char* bad : {"3", "0", "16", "2x", " 2", "two", "-1"})
        CHECK_THROWS_WITH_AS(choice_with(bad), doctest::Contains("DS4_ENV_CHOICE_TEST="), ds4::error);
    CHECK_THROWS_WITH_AS(choice_with("3"), doctest::Contains("expected one of 1|2|4|8"), ds4::error);
    unsetenv(var);
}
