#pragma once
/// \file state.hpp
/// Run state: contents of every replica at one time. Positions are R blocks of n rows of d
/// numbers, row-major, so token i of replica r starts at x[(r * n + i) * d].
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mfattn {

struct State {
  std::size_t replicas = 1;
  std::size_t n = 0;
  std::size_t d = 0;
  double time = 0.0;
  std::int64_t step = 0;
  std::vector<double> x;

  State() = default;
  State(std::size_t replicas_, std::size_t n_, std::size_t d_)
      : replicas(replicas_), n(n_), d(d_), x(replicas_ * n_ * d_, 0.0) {}
  double* token(std::size_t r, std::size_t i) { return x.data() + (r * n + i) * d; }
  const double* token(std::size_t r, std::size_t i) const { return x.data() + (r * n + i) * d; }
  double* replica(std::size_t r) { return x.data() + r * n * d; }
  const double* replica(std::size_t r) const { return x.data() + r * n * d; }
  std::size_t size() const { return x.size(); }
};

}  // namespace mfattn
