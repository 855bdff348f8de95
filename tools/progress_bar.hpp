// A progress bar on stderr for long computations: it appears only after a second, so
// quick runs print nothing, and only when stderr is a terminal, so logs stay clean.
#pragma once

#include <functional>
#include <string>

#include "forward_in_pieces.hpp"

namespace attn::tools {

bool stderr_is_terminal();

// Runs work(progress) on a worker thread; `progress(done, total)` may be called from it at
// any time. While it runs, the bar is redrawn a few times a second once a second has passed,
// and erased at the end. Exceptions from `work` are rethrown here.
void run_with_progress_bar(const std::string& label,
                           const std::function<void(const ProgressCallback&)>& work);

}  // namespace attn::tools
