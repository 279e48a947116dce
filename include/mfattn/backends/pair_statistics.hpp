#pragma once
/// \file pair_statistics.hpp
/// What the pair pass of the per-frame observables counts (docs/model.md section 6).
#include <cstddef>
#include <cstdint>

namespace mfattn {

/// The largest d whose pair pass runs in the CPU kernels' lanes (cpu_pair_statistics); larger d
/// takes the observers' Gram blocks.
inline constexpr std::size_t kLanePairStatisticsDimensions = 8;

struct PairStatistics {
  double min_inner = 1.0;            ///< min <x_i, x_j> (1 for fewer than two tokens)
  std::int64_t close_pairs = 0;      ///< #{i < j : <x_i, x_j> > 1 - pair_delta}
  std::int64_t pairs = 0;            ///< m (m - 1) / 2
  std::size_t clusters = 0;          ///< components of <x_i, x_j> > 1 - cluster_delta
};

}  // namespace mfattn
