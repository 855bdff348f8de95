// .npy files whose rows are spread over the ranks of a communicator (attn run --distributed):
// each rank writes only its own rows, with MPI-IO, into one file that appears under its
// name only once every rank has written all of them.
#pragma once

#include <string>
#include <vector>

#include "attn/tensor.hpp"
#include "dist/collective.hpp"
#include "dist/shards.hpp"
#include "io/npy.hpp"

namespace attn::dist {

// This rank's part of one output file: the whole file is a C-order array of `shape`, and
// this rank holds the rows `pieces` of its dim `axis` (global row, count, and local row in
// `data`), stored at `data` as a C-order array of `shape` with dim `axis` the pieces'
// total count.
struct RowsOfFile {
  std::string path;
  DType dtype = DType::f32;
  io::Shape shape;
  std::size_t axis = 0;
  std::vector<Piece> pieces;
  const void* data = nullptr;
};

// Collective over comm; every rank passes its part of the same files, in the same order.
// Rank 0 stages each file (io::StagedFile: a temporary name beside the path, the header
// written), every rank writes its rows into each at their offsets, and rank 0 renames them
// all into place (io::commit_all) once every rank has written all of its rows. A failure
// on any rank throws the same AgreedError on every rank and leaves every path as it was.
void write_rows(const Communicator& comm, const std::vector<RowsOfFile>& files);

}  // namespace attn::dist
