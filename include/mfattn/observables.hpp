#pragma once
/// \file observables.hpp
/// Per-frame observables of model.md section 6, over the tokens that move (p_i > 0):
///   energy        E = 1 / (2 beta M^2) sum_{i,j} p_i p_j m_ij c_ij exp(s_ij)
///   mean_inner    (|sum_i x_i|^2 - m) / (m (m - 1)),  m tokens        (1 for m = 1)
///   min_inner     min_{i != j} <x_i, x_j>                              (1 for m = 1)
///   max_speed     max_i |dx_i/dt|
/// Each value is per replica.
#include <string>
#include <utility>
#include <vector>

#include "mfattn/integrator.hpp"

namespace mfattn {

/// Names and component counts, in the order compute_observables returns them.
std::vector<std::pair<std::string, std::size_t>> observable_layout(const Model& model);

/// values[o][r * components + c] for observable o of observable_layout. velocity_out, when
/// given, receives dx/dt at the frame (R * n * d), from the same evaluation.
std::vector<std::vector<double>> compute_observables(Dynamics& dynamics, const State& state,
                                                     std::vector<double>* velocity_out = nullptr);

/// min_{i != j} <x_i, x_j> over the moving tokens of one replica (1 if fewer than two).
double min_inner_product(const Model& model, const double* x);
/// Mean over pairs i != j of <x_i, x_j> (moving tokens).
double mean_inner_product(const Model& model, const double* x);

}  // namespace mfattn
