// Intel AMX tiles, for the kernels that multiply bf16 matrices on them (cpu/amx/scores.hpp).
// The kernels are templates over a Tiles type with the members of HardwareTiles below, so that
// the same code runs on AMX hardware and, in the tests, on a model of the instructions
// (tests/support/amx_model.hpp) on any CPU.
#pragma once

#include <cstdint>
#include <type_traits>

#include "attn/tensor.hpp"

namespace attn::cpu {

// Does this CPU multiply bf16 tiles (AMX-TILE and AMX-BF16), with the OS saving tile state
// and Linux having granted this process the tile data (arch_prctl(ARCH_REQ_XCOMP_PERM))?
// Asked once; false when any of these is missing, and the kernels then use AVX512-BF16.
bool has_amx();

// The 64-byte operand of ldtilecfg, palette 1: rows and bytes per row of tiles 0 to 7.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Palette 1's largest tile: 16 rows of 64 bytes (16 floats, or 32 bf16 as 16 pairs).
constexpr int kTileRows = 16;
constexpr int kTileBytesPerRow = 64;
constexpr int kTileColumns = kTileBytesPerRow / 4;  // float32 columns of an accumulator
constexpr int kTileCount = 8;

// The most memory an input repacked for the tiles may take (forward's V^T, fp16 K's parts):
// past it, the float path, which needs no copy.
constexpr Index kAmxPackedMaxBytes = Index{1} << 30;

// Every tile at its largest: the only shape the kernels use, so one configuration serves
// them all (partial blocks go through zero-padded scratch instead).
constexpr TileConfig full_tiles() {
  TileConfig config;
  for (int t = 0; t < kTileCount; ++t) {
    config.bytes_per_row[t] = kTileBytesPerRow;
    config.rows[t] = kTileRows;
  }
  return config;
}

// The kernels' block of tiles on Tiles: accumulators C[i][j] in tiles 2i + j, for kRows
// row blocks (A, tiles 4 + i) and kColumns column blocks (B, tiles 6 + j), 1 or 2 each. A
// 2 x 2 block loads 4 tiles for 4 products, so that loads keep pace with TDPBF16PS.
template <class Tiles, int kRows, int kColumns>
struct TileBlock {
  static_assert(kRows >= 1 && kRows <= 2 && kColumns >= 1 && kColumns <= 2);

  static void zero() {
    Tiles::template zero<0>();
    if constexpr (kColumns == 2) Tiles::template zero<1>();
    if constexpr (kRows == 2) Tiles::template zero<2>();
    if constexpr (kRows == 2 && kColumns == 2) Tiles::template zero<3>();
  }
  // C[i][j] from floats at c + i * 16 rows + j * 16 columns, rows `bytes` apart.
  static void load(const float* c, long bytes) {
    const float* lower = c + kTileRows * (bytes / 4);
    Tiles::template load<0>(c, bytes);
    if constexpr (kColumns == 2) Tiles::template load<1>(c + kTileColumns, bytes);
    if constexpr (kRows == 2) Tiles::template load<2>(lower, bytes);
    if constexpr (kRows == 2 && kColumns == 2) Tiles::template load<3>(lower + kTileColumns, bytes);
  }
  static void store(float* c, long bytes) {
    float* lower = c + kTileRows * (bytes / 4);
    Tiles::template store<0>(c, bytes);
    if constexpr (kColumns == 2) Tiles::template store<1>(c + kTileColumns, bytes);
    if constexpr (kRows == 2) Tiles::template store<2>(lower, bytes);
    if constexpr (kRows == 2 && kColumns == 2)
      Tiles::template store<3>(lower + kTileColumns, bytes);
  }
  // A's row blocks from a and a + next_rows (bf16 elements), rows `bytes` apart.
  static void load_a(const std::uint16_t* a, Index next_rows, long bytes) {
    Tiles::template load<4>(a, bytes);
    if constexpr (kRows == 2) Tiles::template load<5>(a + next_rows, bytes);
  }
  // B's column blocks from b and b + next_columns (elements of T), rows `bytes` apart.
  template <class T>
  static void load_b(const T* b, Index next_columns, long bytes) {
    Tiles::template load<6>(b, bytes);
    if constexpr (kColumns == 2) Tiles::template load<7>(b + next_columns, bytes);
  }
  // C[i][j] += A[i] B[j]
  static void multiply() {
    Tiles::template dot_bf16<0, 4, 6>();
    if constexpr (kColumns == 2) Tiles::template dot_bf16<1, 4, 7>();
    if constexpr (kRows == 2) Tiles::template dot_bf16<2, 5, 6>();
    if constexpr (kRows == 2 && kColumns == 2) Tiles::template dot_bf16<3, 5, 7>();
  }
};

// fn(std::integral_constant<int, 2>, i) for i = 0, 2, ... while two remain, then
// fn(std::integral_constant<int, 1>, i) for a last one: blocks of tiles taken two at a time.
template <class Fn>
void in_twos(Index count, Fn&& fn) {
  Index i = 0;
  for (; i + 2 <= count; i += 2) fn(std::integral_constant<int, 2>{}, i);
  if (i < count) fn(std::integral_constant<int, 1>{}, i);
}

#if defined(__x86_64__)
// The instructions themselves. Each asm names the tile register by its number (%c prints the
// bare constant) and clobbers memory, so that the compiler neither keeps a store to a tile's
// source in a register nor moves a read of its destination above it.
struct HardwareTiles {
  static void configure(const TileConfig& config) {
    asm volatile("ldtilecfg %0" ::"m"(config) : "memory");
  }
  static void release() { asm volatile("tilerelease" ::: "memory"); }
  template <int kTile>
  static void zero() {
    asm volatile("tilezero %%tmm%c0" ::"i"(kTile));
  }
  // Tile rows from base, base + stride, ... (stride in bytes).
  template <int kTile>
  static void load(const void* base, long stride) {
    asm volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride), "i"(kTile) : "memory");
  }
  template <int kTile>
  static void store(void* base, long stride) {
    asm volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride), "i"(kTile) : "memory");
  }
  // C[m][n] += sum over pairs k of A[m][2k] B[k][2n] + A[m][2k + 1] B[k][2n + 1]: A rows of
  // bf16 pairs, B rows of pairs laid side by side, C float32.
  template <int kC, int kA, int kB>
  static void dot_bf16() {
    asm volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(kC), "i"(kA), "i"(kB));
  }
};
#endif

}  // namespace attn::cpu
