// Token text made safe for the pictures: tokens come from user files and may hold markup
// characters, control bytes or broken UTF-8, none of which may break the SVG or HTML.
#pragma once

#include <string>

namespace attn::viz {

// `text` with invalid UTF-8 sequences and the noncharacters U+FFFE and U+FFFF (which XML
// forbids) replaced by U+FFFD, and control characters by '?'.
std::string clean_utf8(const std::string& text);

// clean_utf8(text) with & < > " ' escaped, for XML/HTML text and attribute values.
std::string xml_escaped(const std::string& text);

// clean_utf8(text) as a JSON string literal with quotes; '<' is escaped too so that the
// literal can sit inside an HTML <script> element.
std::string json_string(const std::string& text);

// At most `max_chars` code points of `text`, the last one an ellipsis when cut.
std::string shortened(const std::string& text, std::size_t max_chars);

}  // namespace attn::viz
