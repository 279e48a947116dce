#pragma once
// The cluster graph's components for the per-frame observables (docs/model.md section 6):
// a union-find forest per thread, fed row by row with the pairs <x_i, x_j> > edge_above, and
// merged at the end. Shared by the observers' Gram-block pass and the CPU kernels' lane pass
// (backends/cpu/lane_pair_statistics.hpp), so that neither reads the other's internals.
// Integers and comparisons only: every instruction set gives the same forest.
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <optional>
#include <vector>

namespace mfattn {

/// Union-find over 0..m-1; roots are the smallest index of their set, path halving.
class UnionFind {
 public:
  explicit UnionFind(std::size_t count) : parent_(count) {
    std::iota(parent_.begin(), parent_.end(), std::uint32_t{0});
  }
  std::uint32_t find(std::uint32_t a) {
    while (parent_[a] != a) {
      parent_[a] = parent_[parent_[a]];
      a = parent_[a];
    }
    return a;
  }
  /// Joins two different roots; returns the root of the union.
  std::uint32_t link(std::uint32_t root_a, std::uint32_t root_b) {
    if (root_b < root_a) std::swap(root_a, root_b);
    parent_[root_b] = root_a;
    ++unions_;
    return root_a;
  }
  /// Joins the sets of a and b.
  void unite(std::uint32_t a, std::uint32_t b) {
    a = find(a);
    b = find(b);
    if (a != b) link(a, b);
  }
  /// Every element in one set: further edges change nothing.
  bool whole() const { return unions_ + 1 >= parent_.size(); }
  std::size_t components() const { return parent_.size() - unions_; }

 private:
  std::vector<std::uint32_t> parent_;
  std::size_t unions_ = 0;
};

/// The cluster edges of one receiver row i: inner[j] = <x_i, x_{base + j}> for j in
/// [from, to). Unites i with every base + j where inner[j] > edge_above (indices gathered
/// without branches first, so a row of random cluster labels costs no mispredictions).
inline void unite_row(UnionFind& forest, std::uint32_t i, const double* inner, std::size_t base,
               std::size_t from, std::size_t to, double edge_above,
               std::vector<std::uint32_t>& scratch) {
  scratch.resize(to - from + 1);
  std::size_t found = 0;
  for (std::size_t j = from; j < to; ++j) {
    scratch[found] = static_cast<std::uint32_t>(base + j);
    found += inner[j] > edge_above;
  }
  std::uint32_t root = forest.find(i);
  for (std::size_t e = 0; e < found && !forest.whole(); ++e) {
    const std::uint32_t other = forest.find(scratch[e]);
    if (other != root) root = forest.link(root, other);
  }
}

/// Per-thread state of the pair pass: a private union-find forest (made on first use) and
/// row buffers. The forests are merged serially at the end; the components of a graph do not
/// depend on the order its edges are added in, so neither the thread count nor the schedule
/// changes the count.
class ThreadForests {
 public:
  /// row_padding: numbers beyond m in each row buffer (a lane loop's overrun).
  ThreadForests(std::size_t m, std::size_t row_padding)
      : m_(m), row_padding_(row_padding), slots_(static_cast<std::size_t>(std::max(1, omp_get_max_threads()))) {}
  struct Slot {
    std::optional<UnionFind> forest;  ///< made on the thread's first row
    std::vector<double> row;
    std::vector<std::uint32_t> scratch;
  };
  /// The calling thread's slot, with its forest and an m-long row buffer.
  Slot& local() {
    Slot& slot = slots_[static_cast<std::size_t>(omp_get_thread_num())];
    if (!slot.forest) {
      slot.forest.emplace(m_);
      slot.row.resize(m_ + row_padding_);
    }
    return slot;
  }
  /// Components after merging the forests serially.
  std::size_t components() {
    UnionFind merged(m_);
    for (auto& slot : slots_) {
      if (!slot.forest) continue;
      for (std::size_t a = 0; a < m_; ++a) {
        const std::uint32_t root = slot.forest->find(static_cast<std::uint32_t>(a));
        if (root != a) merged.unite(static_cast<std::uint32_t>(a), root);
      }
    }
    return merged.components();
  }

 private:
  std::size_t m_, row_padding_;
  std::vector<Slot> slots_;  ///< one per thread
};

}  // namespace mfattn
