// The tiled order of 4-bit affine weights (QuantFormat::tiled), shared by
// the host and device tiling, dequantization and the float64 reference.
// quant.hpp defines the order; docs/notes/quantized-decode.md (h95) says why.
//
// A [rows, K] weight (rows a multiple of 16) is cut into tiles of 16 rows x
// 128 elements of K (K padded with zeros to whole k-blocks of 128): tile
// (c, kb) holds rows 16c ... 16c + 15, each its 16 checkpoint-order words
// of k-block kb, 1 KB in all; tiles in the order (c, kb). The scales and
// biases (K padded to whole k-blocks: 128 / group_size groups per k-block)
// are one array of (scale, bias) pairs ordered (c, group, row % 8, row / 8 %
// 2): the decode kernel's lane holds rows r and r + 8 of a tile and loads
// both rows' scales and biases as one 8-byte word (two arrays, two loads,
// ran 6-11 % slower at M = 1, h95).
#pragma once

#include <cstdint>

#include "common/layout_math.hpp"  // GATEDMLP_HD

namespace gatedmlp::detail {

inline constexpr int64_t kTileRows = 16, kTileK = 128, kTileWordsPerRow = 16;

GATEDMLP_HD int64_t tiled_k_blocks(int64_t k) { return (k + kTileK - 1) / kTileK; }
// Words and groups per row of the tiled arrays (K padded to k-blocks).
GATEDMLP_HD int64_t tiled_words_per_row(int64_t k) { return tiled_k_blocks(k) * kTileWordsPerRow; }
GATEDMLP_HD int64_t tiled_groups_per_row(int64_t k, int64_t group_size) {
  return tiled_k_blocks(k) * (kTileK / group_size);
}
// Elements per row of the (scale, bias) array: two per group.
GATEDMLP_HD int64_t tiled_scale_elems_per_row(int64_t k, int64_t group_size) {
  return 2 * tiled_groups_per_row(k, group_size);
}

// Where word wi (of tiled_words_per_row) of row r lies in the tiled words.
GATEDMLP_HD int64_t tiled_word_index(int64_t r, int64_t wi, int64_t k_blocks) {
  return ((r / kTileRows * k_blocks + wi / kTileWordsPerRow) * kTileRows + r % kTileRows) * kTileWordsPerRow +
         wi % kTileWordsPerRow;
}

// Where the scale of group gi (of `groups` = tiled_groups_per_row) of row r
// lies in the (scale, bias) array; its bias is the next element.
GATEDMLP_HD int64_t tiled_scale_index(int64_t r, int64_t gi, int64_t groups) {
  return (((r / kTileRows * groups + gi) * 8 + r % 8) * 2 + (r / 8) % 2) * 2;
}

}  // namespace gatedmlp::detail
