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

void remap_periodic(const CellLine& line, const double* f, const double* shift, double* out) {
  const std::size_t m = line.cells;
  const auto cells = static_cast<long long>(m);
  thread_local std::vector<double> delta, prefix, flux;
  delta.resize(m);
  prefix.resize(m + 1);
  flux.resize(m);
  prefix[0] = 0.0;
  for (std::size_t a = 0; a < m; ++a) {
    delta[a] = half_slope(line, f, a);
    prefix[a + 1] = prefix[a] + f[a];
  }
  const auto wrap = [cells](long long cell) {
    const long long index = cell % cells;
    return static_cast<std::size_t>(index < 0 ? index + cells : index);
  };
  // The sum of count whole cells from cell first on, >= 0: a few cells added directly (their
  // own rounding), more as differences of the non-decreasing prefix sum (rounding of the
  // total's size).
  const auto whole_cells = [&](std::size_t first, long long count) {
    if (count <= 8) {
      double sum = 0.0;
      for (long long j = 0; j < count; ++j) sum += f[(first + static_cast<std::size_t>(j)) % m];
      return sum;
    }
    double sum = double(count / cells) * prefix[m];
    const std::size_t rest = static_cast<std::size_t>(count % cells);
    if (first + rest <= m) return sum + (prefix[first + rest] - prefix[first]);
    return sum + (prefix[m] - prefix[first]) + prefix[first + rest - m];
  };
  // flux[a]: the mass through face a + 1/2 (at u = a + 1) over the step, the mass between the
  // face and its foot (> 0 rightwards). It is formed from the piece lengths themselves, so a
  // shift of 1e-12 cells gives its flux to full precision.
  for (std::size_t a = 0; a < m; ++a) {
    const long long face = static_cast<long long>(a) + 1;
    const double length = std::abs(shift[a]), whole = std::floor(length), part = length - whole;
    const auto crossed = static_cast<long long>(whole);
    if (shift[a] >= 0.0) {
      // Cells face - 1 .. face - crossed whole, and the right part of cell face - crossed - 1.
      const std::size_t partial = wrap(face - crossed - 1);
      flux[a] = whole_cells(wrap(face - crossed), crossed) + part * (f[partial] + delta[partial] * (1.0 - part));
    } else {
      // Cells face .. face + crossed - 1 whole, and the left part of cell face + crossed.
      const std::size_t partial = wrap(face + crossed);
      flux[a] = -(whole_cells(wrap(face), crossed) + part * (f[partial] - delta[partial] * (1.0 - part)));
    }
  }
  // The new value of cell a is the mass between the feet of its faces: f_a + inflow - outflow
  // (>= 0 up to rounding, which the cut to 0 removes).
  for (std::size_t a = 0; a < m; ++a) out[a] = std::max(f[a] + flux[a > 0 ? a - 1 : m - 1] - flux[a], 0.0);
}

}  // namespace mfattn::meanfield
