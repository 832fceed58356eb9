// Per-launch tags for the split tails' flags and tickets, so a workspace needs
// no clearing between calls: a word written by an earlier launch (or never
// written) carries another tag and reads as unset.
#pragma once

#include <atomic>
#include <cstdint>
#include <random>

namespace gatedmlp::detail {

// A fresh, nonzero 64-bit token per call (splitmix64 of a counter seeded per
// process).
inline uint64_t next_token() {
  static std::atomic<uint64_t> counter{(uint64_t(std::random_device{}()) << 32) ^ std::random_device{}()};
  uint64_t z = counter.fetch_add(0x9e3779b97f4a7c15ull) + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z ? z : 1;
}

}  // namespace gatedmlp::detail
