#pragma once
// Every block format and minifloat of ds4 in one include (convenience; each header stands
// alone, and kernels include only the formats they read).
#include "ds4/core/rounding.hpp"
#include "ds4/format/e2m1.hpp"
#include "ds4/format/e4m3.hpp"
#include "ds4/format/iq2_xxs.hpp"
#include "ds4/format/iq2_xxs_tables.hpp"
#include "ds4/format/q2_k.hpp"
#include "ds4/format/q4_k.hpp"
#include "ds4/format/q8_0.hpp"
#include "ds4/format/q8_k.hpp"
#include "ds4/format/types.hpp"
