// The repacked order of 4-bit affine words (QuantFormat::repacked), shared
// by the host repack, the device repack and dequantization, and the float64
// reference. quant_decode/repacked.cuh says why this order.
//
// A row's K is cut into chunks of 128 elements (16 words; the repacked row
// is padded with zero words to whole chunks). Inside a chunk, word 4 wd + t
// of the checkpoint's order (elements 32 wd + 8 t ... + 7) goes to position
// 4 t + wd (a 4 x 4 transpose, its own inverse), and its nibbles are
// reordered so that nibble i holds element 2i and nibble i + 4 element
// 2i + 1 (i = 0 ... 3).
#pragma once

#include <cstdint>

#include "common/layout_math.hpp"  // GATEDMLP_HD

namespace gatedmlp::detail {

inline constexpr int64_t kRepackChunkWords = 16;

// Words in a repacked row of K elements: whole chunks of 128.
GATEDMLP_HD int64_t repacked_words_per_row(int64_t k) { return (k + 127) / 128 * kRepackChunkWords; }

// Where word `wi` of a row goes (either way: the map is its own inverse).
GATEDMLP_HD int64_t repacked_word_pos(int64_t wi) {
  const int64_t w = wi & 15;
  return (wi - w) + ((w & 3) << 2) + (w >> 2);
}

// A checkpoint-order word's nibbles in the repacked order, and back.
GATEDMLP_HD uint32_t repack_nibbles(uint32_t w) {
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    r |= ((w >> (8 * i)) & 0xFu) << (4 * i);
    r |= ((w >> (8 * i + 4)) & 0xFu) << (4 * i + 16);
  }
  return r;
}
GATEDMLP_HD uint32_t unrepack_nibbles(uint32_t r) {
  uint32_t w = 0;
  for (int i = 0; i < 4; ++i) {
    w |= ((r >> (4 * i)) & 0xFu) << (8 * i);
    w |= ((r >> (4 * i + 16)) & 0xFu) << (8 * i + 4);
  }
  return w;
}

// The 4-bit code of element i of a repacked row.
GATEDMLP_HD uint32_t repacked_code_at(const uint32_t* row_words, int64_t i) {
  const int e = static_cast<int>(i & 7);
  const int nib = (e >> 1) + 4 * (e & 1);
  return (row_words[repacked_word_pos(i >> 3)] >> (4 * nib)) & 0xFu;
}

}  // namespace gatedmlp::detail
