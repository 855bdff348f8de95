// The binding of attn::BlockMask (attn._attn.BlockMask): its builders, and one that takes a
// Python function evaluating a query block's stripe of the pattern at once (attn.BlockMask's
// from_predicate in attn/_block_mask.py).
#pragma once

#include <nanobind/nanobind.h>

namespace attn::python {

void bind_block_mask(nanobind::module_& m);

}  // namespace attn::python
