#include "meanfield/finite_volume.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace mfattn::meanfield {

namespace {

// The half-slope delta_a of cell a, cut so that f_a +- delta_a >= 0.
double half_slope(const CellLine& line, const double* f, std::size_t a) {
  const std::size_t m = line.cells;
  const double left = a > 0 ? f[a - 1] : (line.periodic ? f[m - 1] : f[0]);
  const double right = a + 1 < m ? f[a + 1] : (line.periodic ? f[0] : f[m - 1]);
  const double delta = 0.25 * (right - left);
  const double room = std::max(f[a], 0.0);
  return std::clamp(delta, -room, room);
}

}  // namespace

void transport_rate(const CellLine& line, const double* f, const double* v, double* out) {
  const std::size_t m = line.cells;
  // The half-slopes once per cell (thread_local: the solvers call this per row and stage).
  thread_local std::vector<double> delta, flux;
  delta.resize(m);
  flux.resize(m);
  for (std::size_t a = 0; a < m; ++a) delta[a] = half_slope(line, f, a);
  // flux[a] through face a + 1/2; the walled line's last face is the wall.
  for (std::size_t a = 0; a + 1 < m; ++a) {
    const double velocity = v[a];
    const double upwind = velocity > 0.0 ? f[a] + delta[a] : f[a + 1] - delta[a + 1];
    flux[a] = line.face_measure[a] * velocity * upwind;
  }
  flux[m - 1] = line.periodic ? line.face_measure[m - 1] * v[m - 1] *
                                    (v[m - 1] > 0.0 ? f[m - 1] + delta[m - 1] : f[0] - delta[0])
                              : 0.0;
  const double first_inflow = line.periodic ? flux[m - 1] : 0.0;
  out[0] = (first_inflow - flux[0]) / line.cell_measure[0];
  for (std::size_t a = 1; a < m; ++a) out[a] = (flux[a - 1] - flux[a]) / line.cell_measure[a];
}

double positive_transport_step(const CellLine& line, const double* v) {
  const std::size_t m = line.cells;
  double step = std::numeric_limits<double>::infinity();
  for (std::size_t a = 0; a < m; ++a) {
    const bool has_left = a > 0 || line.periodic;
    const std::size_t left = a > 0 ? a - 1 : m - 1;
    const double out_right = line.face_measure[a] * std::max(v[a], 0.0);
    const double out_left = has_left ? line.face_measure[left] * std::max(-v[left], 0.0) : 0.0;
    const double outflow = std::max(out_right, out_left);
    if (outflow > 0.0) step = std::min(step, line.cell_measure[a] / (2.0 * outflow));
  }
  return step;
}

void remap_periodic(const CellLine& line, const double* f, const double* depart, double* out) {
  const std::size_t m = line.cells;
  thread_local std::vector<double> delta, prefix;
  delta.resize(m);
  prefix.resize(m + 1);
  prefix[0] = 0.0;
  for (std::size_t a = 0; a < m; ++a) {
    delta[a] = half_slope(line, f, a);
    prefix[a + 1] = prefix[a] + f[a];
  }
  const auto wrap = [m](double cell) {
    const auto whole = static_cast<long long>(cell) % static_cast<long long>(m);
    return static_cast<std::size_t>(whole < 0 ? whole + static_cast<long long>(m) : whole);
  };
  // The sum of count whole cells from cell first on (>= 0: differences of a non-decreasing
  // prefix sum).
  const auto whole_cells = [&](std::size_t first, long long count) {
    double sum = double(count / static_cast<long long>(m)) * prefix[m];
    const std::size_t rest = static_cast<std::size_t>(count % static_cast<long long>(m));
    if (first + rest <= m) return sum + (prefix[first + rest] - prefix[first]);
    return sum + (prefix[m] - prefix[first]) + prefix[first + rest - m];
  };
  for (std::size_t a = 0; a < m; ++a) {
    // depart[-1] is depart[M-1] one period back.
    const double from = a > 0 ? depart[a - 1] : depart[m - 1] - double(m), to = depart[a];
    const double from_cell = std::floor(from), to_cell = std::floor(to);
    const double s0 = from - from_cell, s1 = to - to_cell;
    const std::size_t b0 = wrap(from_cell), b1 = wrap(to_cell);
    double value;
    if (from_cell == to_cell) {
      value = (s1 - s0) * (f[b0] + delta[b0] * (s0 + s1 - 1.0));
    } else {
      value = (1.0 - s0) * (f[b0] + delta[b0] * s0) + s1 * (f[b1] + delta[b1] * (s1 - 1.0)) +
              whole_cells((b0 + 1) % m, static_cast<long long>(to_cell - from_cell) - 1);
    }
    out[a] = std::max(value, 0.0);
  }
}

}  // namespace mfattn::meanfield
