// attn::explain: the backend choice of attn::forward, made as forward makes it, and the
// fast kernel's plan when it runs.
#include "attn/explain.hpp"

#include "api/backend.hpp"
#include "core/problem.hpp"
#include "cpu/forward/forward.hpp"
#include "cpu/plan/support.hpp"

namespace attn {

Explanation explain(const TensorView& q, const TensorView& k, const TensorView& v,
                    const Options& options) {
  const core::Problem problem = core::make_problem(q, k, v, options);
  Explanation out = api::choose(options.backend, cpu::unsupported(problem));
  if (out.backend == Backend::fast && out.reason.empty()) out.plan = cpu::describe_plan(problem);
  return out;
}

}  // namespace attn
