#pragma once
/// \file observables.hpp
/// Per-frame observables of docs/model.md section 6, over the m tokens that move (p_i > 0), in the
/// order observable_layout gives them:
///   energy                   E = 1 / (2 beta M^2) sum_{i,j} p_i p_j m_ij c_ij exp(s_ij)
///   mean_inner               (|sum_i x_i|^2 - m) / (m (m - 1))                   (1 for m = 1)
///   min_inner                min_{i != j} <x_i, x_j>                              (1 for m < 2)
///   max_speed                max_i |dx_i/dt|
///   clustered_pair_fraction  #{i < j : <x_i, x_j> > 1 - delta} / (m (m - 1) / 2),
///                            delta = ObservableSettings::pair_delta               (1 for m < 2)
///   n_clusters               connected components of the graph with an edge i ~ j where
///                            <x_i, x_j> > 1 - delta_c, delta_c = cluster_delta (union-find;
///                            m singletons when no pair is close, 1 for a collapsed state)
///   order_parameter          |(1/m) sum_i x_i|
///   moment_eigenvalues       lambda_1 >= ... >= lambda_d, the eigenvalues of the second
///                            moment C = (1/m) sum_i x_i x_i^T (d components; trace C = 1)
///   effective_rank           exp(-sum_k q_k log q_k), q_k = max(lambda_k, 0) / sum_l max(lambda_l, 0),
///                            0 log 0 = 0 (Roy and Vetterli 2007): 1 for a collapsed state
///                            (or an antipodal pair of clusters), d for an isotropic one
///   marginal_spread          1 - lambda_1: 0 when every x_i = +-u (a collapsed state)
///   conditional_spread       only when the labels can matter (Model::gauge set or
///                            Model::prompts > 1): the spread left once the known dependence on
///                            the labels is removed. With y_i = G(xi_i) x_i (y_i = x_i without a
///                            gauge) and, per prompt g with m_g moving tokens,
///                              s_g = 1 - lambda_1((1/m_g) sum_{i in g} y_i y_i^T),
///                            conditional_spread = sum_g m_g s_g / m. It is 0 exactly when each
///                            prompt's tokens lie on one orbit x_i = G(xi_i)^T (+-u_g): the
///                            "conditional Dirac" graph law of the auxiliary-variable theory
///                            (transported RoPE collapses y while x keeps a latitude circle, so
///                            conditional_spread -> 0 while marginal_spread stays large).
/// Each value is per replica. With no moving token (m = 0) the averages over tokens
/// (order_parameter, moment_eigenvalues, effective_rank, the spreads) are NaN and n_clusters 0.
///
/// Cost per frame and replica: one pass over the m (m - 1) / 2 pairs (O(m^2 d), threaded for
/// m > 512) gives min_inner, the close-pair count and the cluster edges together; the moments
/// are O(m d^2 + d^3). Every result is independent of the thread count: the minimum and the
/// integer counts do not depend on the order they are taken in, each thread unites its edges
/// in a private union-find forest, and the forests are merged serially (the components of a
/// graph do not depend on the order its edges are added in).
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mfattn/integrators/integrator.hpp"
#include "mfattn/backends/pair_statistics.hpp"

namespace mfattn {

/// Thresholds of the pair observables (`--pair-delta`, `--cluster-delta`).
struct ObservableSettings {
  double pair_delta = 1e-3;     ///< clustered_pair_fraction counts <x_i, x_j> > 1 - pair_delta
  double cluster_delta = 1e-4;  ///< n_clusters joins i, j when <x_i, x_j> > 1 - cluster_delta
  /// --observables default+attention: attention_{entropy,largest_weight,participation}_{mean,
  /// min,max}, one component a head (attention_plan_summaries; docs/model.md section 6).
  bool attention = false;
};

/// Names and component counts, in the order compute_observables returns them.
std::vector<std::pair<std::string, std::size_t>> observable_layout(const Model& model);
std::vector<std::pair<std::string, std::size_t>> observable_layout(const Model& model,
                                                                   const ObservableSettings& settings);

/// True when the layout carries conditional_spread: a gauge, or more than one prompt.
bool has_conditional_spread(const Model& model);

/// values[o][r * components + c] for observable o of observable_layout. velocity_out, when
/// given, receives dx/dt at the frame (R * n * d), from the same evaluation.
std::vector<std::vector<double>> compute_observables(Dynamics& dynamics, const State& state,
                                                     std::vector<double>* velocity_out = nullptr);
std::vector<std::vector<double>> compute_observables(Dynamics& dynamics, const State& state,
                                                     const ObservableSettings& settings,
                                                     std::vector<double>* velocity_out = nullptr);

/// What one pass over the pairs i < j of `tokens` (rows of x, d numbers each) gives.
/// The pair pass of compute_observables for any token subset (mfattn analyze uses it on
/// stored positions). Identical results for every thread count.
PairStatistics pair_statistics(const double* x, std::size_t d,
                               const std::vector<std::size_t>& tokens,
                               const ObservableSettings& settings = {});

/// Beyond this many unit tokens on the circle (d = 2) the pair pass takes their sorted angles,
/// O(m log m) instead of m^2 / 2 pairs (circle_pair_statistics).
inline constexpr std::size_t kSortedCircleTokens = 65536;
/// The pair pass of unit tokens on the circle by their angle order (the same predicates on the
/// same inner products): the clusters are the arcs between consecutive pairs that are no edge,
/// the close pairs are counted by a forward pointer, and min <x_i, x_j> is taken over each
/// token's four neighbours in angle order of its opposite point.
PairStatistics circle_pair_statistics(const double* x, const std::vector<std::size_t>& tokens,
                                      const ObservableSettings& settings = {});

/// Beyond this many unit tokens on S^2 (d = 3) the pair pass takes a k-d tree of them
/// (sphere_pair_statistics) instead of m^2 / 2 pairs.
inline constexpr std::size_t kSphereTreeTokens = 16384;
/// The pair pass of unit tokens on S^2 by a k-d tree (the same predicates on the same inner
/// products): pairs of tree nodes whose boxes are all within, or all beyond, the chord of a
/// threshold are counted or left whole, and only the pairs of nodes that straddle it are
/// looked at point by point; min <x_i, x_j> is the farthest pair, by branch and bound. About
/// O(m log m) for spread tokens and for clusters alike (docs/model.md section 6). counts:
/// also the close pairs and the clusters (else min_inner alone). inner_products (if not null):
/// how many inner products of pairs the pass took, the measure of its work (tests).
PairStatistics sphere_pair_statistics(const double* x, const std::vector<std::size_t>& tokens,
                                      const ObservableSettings& settings = {}, bool counts = true,
                                      std::int64_t* inner_products = nullptr);

/// The d eigenvalues of (1/m) sum_{a} y_a y_a^T over m rows y_a of d numbers, descending
/// (all NaN for m = 0). With fewer rows than dimensions (m < d, d > 4) they are those of the
/// m x m Gram matrix (1/m) y_a . y_b and d - m exact zeros: O(m^2 d + m^3), not O(d^3).
std::vector<double> second_moment_eigenvalues(const double* rows, std::size_t m, std::size_t d);
/// exp(-sum q_k log q_k) of the eigenvalues normalised to sum 1 (negatives from rounding count
/// as 0; NaN when none is positive or any is NaN).
double effective_rank(const std::vector<double>& eigenvalues);

/// min_{i != j} <x_i, x_j> over the moving tokens of one replica (1 if fewer than two).
double min_inner_product(const Model& model, const double* x);
/// Mean over pairs i != j of <x_i, x_j> (moving tokens).
double mean_inner_product(const Model& model, const double* x);

}  // namespace mfattn
