#pragma once
// Conservative transport on a line of cells (docs/meanfield.md, "Transport"): the circle's
// rows (periodic) and the zonal polar cells (walls at both ends). For cell a with measure W_a
// and value f_a (its mass is W_a f_a), and face a + 1/2 of measure s_{a+1/2} carrying the
// velocity v_{a+1/2},
//   d/dt (W_a f_a) = -(F_{a+1/2} - F_{a-1/2}),   F = s v f_upwind,
// where f_upwind is the linear reconstruction of the upwind cell, f_a +- delta_a, with
// delta_a = (f_{a+1} - f_{a-1}) / 4 (the central slope: second order) cut to |delta_a| <= f_a
// so that both face values of a cell are >= 0 (the positivity scaling of Zhang and Shu).
// A forward-Euler step then keeps every value >= 0 when dt <= positive_transport_step: the
// outflow of cell a is at most dt max(s v^+, s |v^-|) (f_a + delta + f_a - delta).
// Walls have zero flux; next to a wall the slope takes the mirror image f_{-1} = f_0.
#include <cstddef>
#include <vector>

namespace mfattn::meanfield {

struct CellLine {
  std::size_t cells = 0;
  bool periodic = true;
  std::vector<double> cell_measure;  ///< W_a
  /// s at face a + 1/2, the right face of cell a (periodic: the last is between cells M-1
  /// and 0; walled: the last is the wall and must be 0).
  std::vector<double> face_measure;
};

/// out_a = d f_a / dt of the transport alone (v: cells numbers, v[a] at face a + 1/2).
void transport_rate(const CellLine& line, const double* f, const double* v, double* out);

/// The largest dt for which f + dt transport_rate(f) >= 0 whenever f >= 0 (infinity when
/// nothing moves).
double positive_transport_step(const CellLine& line, const double* v);

/// The flux-form semi-Lagrangian step of a periodic line of equal cells (docs/meanfield.md,
/// "Time steps"): face a + 1/2 sits at u = a + 1 in cell units and departs from depart[a]
/// (unwrapped, increasing in a, depart[M-1] - depart[-1 + M] spans one period); the new value
/// of cell a is the mass that the reconstruction f_b + delta_b (2 s - 1) (s in [0, 1] across
/// cell b, the cut slopes of transport_rate) puts between depart[a - 1] and depart[a], over h.
/// Each piece is >= 0, so out >= 0 exactly; the pieces of a cell add up to its mass, so the
/// total is kept to rounding. Its dt -> 0 limit is transport_rate's upwind flux.
void remap_periodic(const CellLine& line, const double* f, const double* depart, double* out);

}  // namespace mfattn::meanfield
