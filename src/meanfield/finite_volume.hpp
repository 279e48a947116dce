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
/// "Time steps"). In cell units cell a is [a, a + 1) and face a + 1/2 sits at u = a + 1; its foot
/// is a + 1 - shift[a] (shift > 0: the foot lies to the left; the feet must be in order). The
/// flux through a face is the mass that the reconstruction f_b + delta_b (2 s - 1) (s in [0, 1)
/// across cell b, the cut slopes of transport_rate) puts between the face and its foot, and
/// out_a = f_a + flux_{a-1/2} - flux_{a+1/2}: the mass between the feet of cell a's faces, >= 0
/// (values below 0 by rounding are cut to 0: ~1e-17 when the feet stay within eight cells of
/// their faces, up to 1e-16 of the row's total across longer shifts, whose whole cells come
/// from the prefix sum); the total is kept to that rounding;
/// the dt -> 0 limit is transport_rate's upwind flux. The shifts, not the feet, are the input
/// and the fluxes are formed from them: a small perturbation's shift of 1e-12 cells keeps its
/// flux to full precision (a foot's position near u = 4096 carries 4.5e-13 cells of rounding,
/// and a difference of two near-equal masses loses the flux's digits).
void remap_periodic(const CellLine& line, const double* f, const double* shift, double* out);

}  // namespace mfattn::meanfield
