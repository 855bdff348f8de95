// A paged KV cache as a picture: the sequence's blocks in block-table order, each with its
// slots; a filled slot shows its token and the current query's weight on it (coloured as the
// heatmaps are), an empty slot waits for a later token. Stepping through a generation shows
// the blocks filling up and a new block taken when one is full.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::viz {

struct CacheBlocks {
  Index page_size = 1;                    // slots per block
  std::vector<std::int32_t> block_table;  // the sequence's blocks, in order
  std::vector<std::string> tokens;        // every cached token, in order
  std::vector<double> weights;            // the current query's weight on each cached token
};

// An <svg> element (no XML declaration), for an HTML page. Each filled slot is a <rect
// class="slot"> with data-value (the weight). Throws attn::Error naming tokens, weights or
// block_table when their counts disagree.
std::string cache_blocks_svg_element(const CacheBlocks& cache);

}  // namespace attn::viz
