// A vector or one element of a stored row (float32, float16, bfloat16, int8 or fp8) read as
// float32, exactly, or of a row of codes times their group scales (GroupedRow): how every
// micro-kernel reads K and V where they lie; and a row asked for ahead of its reads
// (prefetch_row).
#if defined(ATTN_CPU_TILE_STORED_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN_CPU_TILE_STORED_ROWS_INL_H_
#undef ATTN_CPU_TILE_STORED_ROWS_INL_H_
#else
#define ATTN_CPU_TILE_STORED_ROWS_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attn/half.hpp"
#include "attn/tensor.hpp"
#include "core/float8.hpp"
#include "core/int4.hpp"

#include "cpu/tile/target-inl.h"
#include "cpu/tile/to_floats-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attn::cpu::HWY_NAMESPACE {
namespace tile {

template <class T>
inline constexpr bool kIsFloat8 = std::is_same_v<T, float8_e4m3> || std::is_same_v<T, float8_e5m2>;

// A vector of fp8 codes as float32, by way of float16, which holds every code exactly: E5M2
// is float16's upper byte. E4M3 sign-extended to 16 bits and shifted left by 7 has its
// sign at bit 15 and exponent and mantissa in float16's fields, less a copy of the sign at
// bit 14 (the top exponent bit), which the mask clears; it then reads 2^(15 - 7) times too
// small, a power of two the multiply restores exactly. float16's own widening keeps
// subnormal codes away from float32 subnormals.
template <class T>
HWY_INLINE VF load_float8(DF df, const T* HWY_RESTRICT row) {
  const hn::Rebind<hwy::float16_t, DF> dh;
  if constexpr (std::is_same_v<T, float8_e5m2>) {
    const hn::Rebind<std::uint16_t, DF> du;
    const auto bits = hn::PromoteTo(
        du, hn::LoadU(hn::Rebind<std::uint8_t, DF>(), reinterpret_cast<const std::uint8_t*>(row)));
    return hn::PromoteTo(df, hn::BitCast(dh, hn::ShiftLeft<8>(bits)));
  } else {
    const hn::Rebind<std::int16_t, DF> di;
    const auto bits = hn::PromoteTo(
        di, hn::LoadU(hn::Rebind<std::int8_t, DF>(), reinterpret_cast<const std::int8_t*>(row)));
    const auto fields = hn::And(hn::ShiftLeft<7>(bits), hn::Set(di, ~std::int16_t{0x4000}));
    return hn::Mul(hn::PromoteTo(df, hn::BitCast(dh, fields)), hn::Set(df, 0x1p8f));
  }
}

// One vector of a stored row (float, float16, bfloat16, int8 or fp8) as float32; exact.
template <class T>
HWY_INLINE VF load_floats(DF df, const T* HWY_RESTRICT row) {
  if constexpr (std::is_same_v<T, float>) {
    return hn::LoadU(df, row);
  } else if constexpr (std::is_same_v<T, std::int8_t>) {
    const hn::Rebind<std::int32_t, DF> di;
    return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(hn::Rebind<std::int8_t, DF>(), row)));
  } else if constexpr (kIsFloat8<T>) {
    return load_float8(df, row);
  } else {
    return load_widened(df, row);
  }
}

template <class T>
HWY_INLINE float load_float(const T* row, Index d) {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16> || kIsFloat8<T>) {
    return to_float(row[d]);
  } else {
    return static_cast<float>(row[d]);
  }
}

// Locality hints of __builtin_prefetch: to L1 (what hwy::Prefetch issues), or to L2.
inline constexpr int kToL1 = 3, kToL2 = 1;

// Asks for every cache line of a row of `bytes` bytes. It and every function that only
// prefetches must be inlined (HWY_INLINE): GCC takes a function with no effect but
// prefetches as pure and deletes calls to it that stay out of line.
template <int kLocality>
HWY_INLINE void prefetch_row(const void* row, Index bytes) {
  constexpr Index kLine = 64;
  constexpr int kRead = 0;
  for (Index offset = 0; offset < bytes; offset += kLine) {
    __builtin_prefetch(static_cast<const char*>(row) + offset, kRead, kLocality);
  }
}

// Lanes of int32 holding an int4 row's bytes from byte b, read as Byte (int8: sign-extended,
// uint8: zero-extended), and one nibble of sign-extended bytes as codes (the high one: the
// second half of a block of 32 elements).
template <class Byte = std::int8_t>
HWY_INLINE auto int4_bytes(const Int4Pair* HWY_RESTRICT row, Index b) {
  const hn::Rebind<std::int32_t, DF> di;
  return hn::PromoteTo(di,
                       hn::LoadU(hn::Rebind<Byte, DF>(), reinterpret_cast<const Byte*>(row + b)));
}
template <bool kHigh, class V>
HWY_INLINE V int4_nibbles(V bytes) {
  if constexpr (kHigh) {
    return hn::ShiftRight<4>(bytes);
  } else {
    return hn::ShiftRight<28>(hn::ShiftLeft<28>(bytes));
  }
}

// Elements [d, d + lanes) of an int4 row as float32, d a multiple of the lanes and the
// lanes at most 16: one nibble of consecutive bytes (core/int4.hpp), sign-extended.
HWY_INLINE VF load_int4(DF df, const Int4Pair* HWY_RESTRICT row, Index d) {
  const auto bytes = int4_bytes(row, int4_byte(d));
  return hn::ConvertTo(df, int4_high(d) ? int4_nibbles<true>(bytes) : int4_nibbles<false>(bytes));
}

// Elements [d, d + lanes) and element d of a row of codes (int8, int4), as float32.
template <class T>
HWY_INLINE VF load_codes(DF df, const T* HWY_RESTRICT row, Index d) {
  if constexpr (std::is_same_v<T, Int4Pair>) {
    return load_int4(df, row, d);
  } else {
    return load_floats(df, row + d);
  }
}

template <class T>
HWY_INLINE float load_code(const T* row, Index d) {
  if constexpr (std::is_same_v<T, Int4Pair>) {
    return static_cast<float>(int4_code(row, d));
  } else {
    return load_float(row, d);
  }
}

// A row of int8 or int4 codes with a scale per group of elements (grouped caches, and int4's
// one scale a row): element d is its code times scales[d >> scale_shift], one float32
// product (one rounding), the same bits on every target; or with kZeroPoint, scales holding
// (scale, offset) pairs, code * scale + offset by a multiply-add: one rounding where the
// target has FMA (AVX2, AVX-512, NEON, SVE), two on SSE4's and the scalar target's vectors,
// which have none (a row's last d % lanes elements take std::fma everywhere); read in
// registers by the micro-kernels where they take a row pointer. A vector (at
// most 16 floats: the kernels assume vectors of at most 512 bits, as decode's softmax steps
// of 16 keys do) lies within one group (32, 64 or 128 elements) and one nibble's run of
// int4 bytes.
template <class T, bool kZeroPoint = false>
struct GroupedRow {
  const T* codes = nullptr;
  const float* scales = nullptr;
  Index scale_shift = 0;
};

// Elements [d, d + lanes) (d a multiple of the lanes) and element d of a row as float32: a
// stored row where it lies, or a grouped row's codes times their scales.
template <class T>
HWY_INLINE VF row_floats(DF df, const T* HWY_RESTRICT row, Index d) {
  return load_floats(df, row + d);
}
// Codes of a grouped row's group g times its scale (plus its offset).
template <class T, bool kZeroPoint>
HWY_INLINE VF scaled_codes(DF df, const GroupedRow<T, kZeroPoint>& row, VF codes, Index g) {
  if constexpr (kZeroPoint) {
    return hn::MulAdd(codes, hn::Set(df, row.scales[2 * g]), hn::Set(df, row.scales[2 * g + 1]));
  } else {
    return hn::Mul(codes, hn::Set(df, row.scales[g]));
  }
}
template <class T, bool kZeroPoint>
HWY_INLINE VF row_floats(DF df, const GroupedRow<T, kZeroPoint>& row, Index d) {
  return scaled_codes(df, row, load_codes(df, row.codes, d), d >> row.scale_shift);
}

template <class Row>
inline constexpr bool kIsInt4Row = std::is_same_v<Row, GroupedRow<Int4Pair, false>> ||
                                   std::is_same_v<Row, GroupedRow<Int4Pair, true>>;

// Where the lanes are known when compiling (every x86 and NEON target; not SVE's scalable
// vectors), int4 rows are read a block of 32 elements at a time: each vector's byte, nibble
// and group are then constants after the block's start, not a select at run time.
inline constexpr int kInt4BlockVectors =
    HWY_HAVE_SCALABLE || hn::MaxLanes(DF()) < 4 ? 1 : 32 / static_cast<int>(hn::MaxLanes(DF()));

// Vectors of a row a kernel reads per step along d, from a multiple of that many.
template <class Row>
inline constexpr int kRowStepVectors = kIsInt4Row<Row> ? kInt4BlockVectors : 1;

// Vector kVector after element d of a row as float32: row_floats(d + kVector lanes), d a
// multiple of kRowStepVectors<Row> lanes. With 16 lanes, an int4 vector is its 16 bytes'
// nibbles as indices into its group's products of the 16 codes (one vpermps, the table shared
// by the block's two vectors) in place of a conversion and a multiply each: the same
// products, so the same bits (bench/README.md, "int4 a block at a time", has the figures).
template <int kVector, class Row>
HWY_INLINE VF row_floats_at(DF df, const Row& row, Index d) {
  if constexpr (kIsInt4Row<Row> && kInt4BlockVectors > 1) {
    constexpr Index kOffset = kVector * static_cast<Index>(hn::MaxLanes(DF()));
    constexpr bool kHigh = int4_high(kOffset);
    // The vector's block of 32 elements: 16 bytes, within one group.
    const Index block = d + kOffset / 32 * 32, g = block >> row.scale_shift;
    const hn::RebindToSigned<DF> di;
    if constexpr (hn::MaxLanes(DF()) == 16) {
      const auto bytes = int4_bytes<std::uint8_t>(row.codes, block / 2);
      const auto nibbles = kHigh ? hn::ShiftRight<4>(bytes) : hn::And(bytes, hn::Set(di, 15));
      const VF codes_by_nibble = hn::ConvertTo(df, int4_nibbles<false>(hn::Iota(di, 0)));
      return hn::TableLookupLanes(scaled_codes(df, row, codes_by_nibble, g),
                                  hn::IndicesFromVec(df, nibbles));
    } else {
      const auto bytes = int4_bytes(row.codes, block / 2 + kOffset % 16);
      return scaled_codes(df, row, hn::ConvertTo(df, int4_nibbles<kHigh>(bytes)), g);
    }
  } else {
    return row_floats(df, row, d + kVector * lanes());
  }
}
template <class T>
HWY_INLINE float row_float(const T* row, Index d) {
  return load_float(row, d);
}
template <class T, bool kZeroPoint>
HWY_INLINE float row_float(const GroupedRow<T, kZeroPoint>& row, Index d) {
  const Index g = d >> row.scale_shift;
  if constexpr (kZeroPoint) {
    return std::fma(load_code(row.codes, d), row.scales[2 * g], row.scales[2 * g + 1]);
  } else {
    return load_code(row.codes, d) * row.scales[g];
  }
}

// out[0 .. n) = row[0 .. n) as float32, by the reads above: what a micro-kernel reading
// the row where it lies would see, so kernels given `out` instead compute the same bits.
template <class Row>
HWY_INLINE void widen_row(const Row& row, Index n, float* HWY_RESTRICT out) {
  const DF df;
  const Index step = lanes(), whole = n - n % step;
  for (Index d = 0; d < whole; d += step) hn::StoreU(row_floats(df, row, d), df, out + d);
  for (Index d = whole; d < n; ++d) out[d] = row_float(row, d);
}

}  // namespace tile
}  // namespace attn::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggled per target
