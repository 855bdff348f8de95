// A model of the AMX tile instructions the kernels use, with HardwareTiles' members
// (src/cpu/amx/tiles.hpp), so that the tile kernels run and are checked on a CPU without
// AMX. It follows the Intel SDM's operation of each instruction, and where the hardware
// raises #UD or #GP (a tile used before ldtilecfg, shapes that do not agree, a reserved
// field set, a tile reused as two operands) it throws std::logic_error saying which.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cpu/amx/tiles.hpp"

namespace attn::testing {

class ModelTiles {
 public:
  static void configure(const cpu::TileConfig& config) {
    State& s = state();
    s = State{};
    if (config.palette == 0) return;  // palette 0: the init state, as tilerelease
    require(config.palette == 1, "ldtilecfg: palette " + std::to_string(config.palette));
    require(config.start_row == 0, "ldtilecfg: start_row set");
    for (const std::uint8_t byte : config.reserved) require(byte == 0, "ldtilecfg: reserved byte");
    for (int t = 0; t < 16; ++t) {
      const int bytes = config.bytes_per_row[t], rows = config.rows[t];
      if (t >= cpu::kTileCount) {
        require(bytes == 0 && rows == 0, "ldtilecfg: tile " + std::to_string(t) + " set");
        continue;
      }
      require(bytes <= cpu::kTileBytesPerRow && rows <= cpu::kTileRows && bytes % 4 == 0 &&
                  (bytes == 0) == (rows == 0),
              "ldtilecfg: tile " + std::to_string(t) + " shape");
      s.tiles[t].bytes = bytes;
      s.tiles[t].rows = rows;
    }
    s.configured = true;
  }
  static void release() { state() = State{}; }

  template <int kTile>
  static void zero() {
    Tile& t = tile(kTile, "tilezero");
    t.data.fill(0);
  }
  template <int kTile>
  static void load(const void* base, long stride) {
    Tile& t = tile(kTile, "tileloadd");
    t.data.fill(0);
    for (int r = 0; r < t.rows; ++r) {
      std::memcpy(t.data.data() + r * cpu::kTileBytesPerRow,
                  static_cast<const std::uint8_t*>(base) + r * stride, t.bytes);
    }
  }
  template <int kTile>
  static void store(void* base, long stride) {
    const Tile& t = tile(kTile, "tilestored");
    for (int r = 0; r < t.rows; ++r) {
      std::memcpy(static_cast<std::uint8_t*>(base) + r * stride,
                  t.data.data() + r * cpu::kTileBytesPerRow, t.bytes);
    }
  }
  // TDPBF16PS: per row m and pair k, in the SDM's order, c[m][n] += a[m][2k] b[k][2n], then
  // += a[m][2k + 1] b[k][2n + 1], each rounded to nearest even; denormal inputs read as 0,
  // denormal results written as 0.
  template <int kC, int kA, int kB>
  static void dot_bf16() {
    static_assert(kC != kA && kC != kB && kA != kB, "tdpbf16ps: a tile used twice (#UD)");
    Tile& c = tile(kC, "tdpbf16ps");
    const Tile& a = tile(kA, "tdpbf16ps");
    const Tile& b = tile(kB, "tdpbf16ps");
    require(c.rows == a.rows && c.bytes == b.bytes && a.bytes / 4 == b.rows,
            "tdpbf16ps: tile shapes disagree");
    for (int m = 0; m < c.rows; ++m) {
      for (int n = 0; n < c.bytes / 4; ++n) {
        float sum = element<float>(c, m, n);
        for (int k = 0; k < a.bytes / 4; ++k) {
          for (int half = 0; half < 2; ++half) {
            const float x = widen(element<std::uint16_t>(a, m, 2 * k + half));
            const float y = widen(element<std::uint16_t>(b, k, 2 * n + half));
            sum = flush(std::fma(x, y, sum));
          }
        }
        std::memcpy(c.data.data() + m * cpu::kTileBytesPerRow + n * 4, &sum, 4);
      }
    }
    ++state().products;
  }

  // TDPBF16PS instructions run since the last ldtilecfg or tilerelease.
  static long products() { return state().products; }

 private:
  struct Tile {
    int rows = 0, bytes = 0;
    std::array<std::uint8_t, cpu::kTileRows * cpu::kTileBytesPerRow> data{};
  };
  struct State {
    bool configured = false;
    std::array<Tile, cpu::kTileCount> tiles{};
    long products = 0;
  };

  static State& state() {
    thread_local State s;
    return s;
  }
  static void require(bool holds, const std::string& what) {
    if (!holds) throw std::logic_error("AMX model: " + what);
  }
  static Tile& tile(int index, const char* instruction) {
    State& s = state();
    require(s.configured, std::string(instruction) + " before ldtilecfg");
    Tile& t = s.tiles[static_cast<std::size_t>(index)];
    require(t.rows > 0,
            std::string(instruction) + ": tile " + std::to_string(index) + " not configured");
    return t;
  }
  template <class T>
  static T element(const Tile& t, int row, int index) {
    T value;
    std::memcpy(&value, t.data.data() + row * cpu::kTileBytesPerRow + index * sizeof(T), sizeof(T));
    return value;
  }
  static float widen(std::uint16_t bits) {
    if ((bits & 0x7F80u) == 0) bits &= 0x8000u;  // denormal (or zero): a signed zero
    const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &wide, 4);
    return value;
  }
  static float flush(float value) {
    return std::fpclassify(value) == FP_SUBNORMAL ? std::copysign(0.0f, value) : value;
  }
};

}  // namespace attn::testing
