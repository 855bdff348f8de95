// The whole public API of attn.
#pragma once

#include "attn/attention.hpp"
#include "attn/backward.hpp"
#include "attn/contributions.hpp"
#include "attn/decode.hpp"
#include "attn/dropout.hpp"
#include "attn/error.hpp"
#include "attn/explain.hpp"
#include "attn/half.hpp"
#include "attn/kv_cache.hpp"
#include "attn/lesson.hpp"
#include "attn/options.hpp"
#include "attn/paged.hpp"
#include "attn/state.hpp"
#include "attn/tensor.hpp"
#include "attn/version.hpp"
#include "attn/weights.hpp"
