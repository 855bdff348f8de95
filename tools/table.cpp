#include "table.hpp"

#include <algorithm>
#include <cstdio>
#include <iomanip>

namespace attn::tools {

void print_table(std::ostream& out, const std::vector<std::string>& rows,
                 const std::vector<std::string>& columns, const std::vector<double>& values,
                 int decimals) {
  std::vector<std::string> cells(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    char text[64];
    std::snprintf(text, sizeof text, "%.*f", decimals, values[i]);
    cells[i] = text;
  }
  std::size_t label_width = 0;
  for (const std::string& row : rows) label_width = std::max(label_width, row.size());
  std::size_t width = 0;
  for (const std::string& column : columns) width = std::max(width, column.size());
  for (const std::string& cell : cells) width = std::max(width, cell.size());

  out << "  " << std::string(label_width, ' ');
  for (const std::string& column : columns)
    out << "  " << std::setw(static_cast<int>(width)) << column;
  out << '\n';
  for (std::size_t r = 0; r < rows.size(); ++r) {
    out << "  " << std::left << std::setw(static_cast<int>(label_width)) << rows[r] << std::right;
    for (std::size_t c = 0; c < columns.size(); ++c) {
      out << "  " << std::setw(static_cast<int>(width)) << cells[r * columns.size() + c];
    }
    out << '\n';
  }
}

}  // namespace attn::tools
