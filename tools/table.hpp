// Matrices printed as aligned text tables, for the demo.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace attn::tools {

// values: [rows.size(), columns.size()] row-major. Row labels left-aligned, numbers
// right-aligned with `decimals` digits after the point.
void print_table(std::ostream& out, const std::vector<std::string>& rows,
                 const std::vector<std::string>& columns, const std::vector<double>& values,
                 int decimals = 3);

}  // namespace attn::tools
