// Sinkhorn attention (docs/model.md section 2d). The sweeps (backends/sinkhorn_scaling.hpp)
// on a dense test matrix: rows sum to 1 after every sweep, columns to their shares within
// the tolerance when it stops, the stopping rule and the targets with presences and unseen
// sources. The CPU backend against the reference on the options Sinkhorn takes (prefix
// tokens, per-prompt and window masks, nonnegative factors, gauges, presences, null tokens,
// layers); zero sweeps are SA; null tokens and the thread count change no bit; the options it
// has no scaling for are refused naming them.
#include "test_support.hpp"

#include "backends/sinkhorn_scaling.hpp"
#include "mfattn/core/rng.hpp"

namespace mfattn {
namespace {

using testing::config;
using testing::max_abs_difference;

/// The passes of the scaling over a dense matrix of log-weights l (rows x sources), -inf
/// where a pair is hidden: log-sum-exps from each row's exact maximum.
struct DensePasses {
  std::size_t rows_count, sources;
  std::vector<double> logits;  // l_ij without log p_j
  double at(std::size_t i, std::size_t j) const { return logits[i * sources + j]; }
  template <class Term>
  static double lse(std::size_t count, Term&& term) {
    double m = -HUGE_VAL, s = 0.0;
    for (std::size_t k = 0; k < count; ++k) m = std::max(m, term(k));
    if (m == -HUGE_VAL) return m;
    for (std::size_t k = 0; k < count; ++k) s += std::exp(term(k) - m);
    return m + std::log(s);
  }
  void rows(host::SinkhornScaling& scaling) {
    host::SinkhornSlot& slot = scaling.slots.front();
    for (std::size_t i = 0; i < rows_count; ++i)
      scaling.finish_row(slot, i, lse(sources, [&](std::size_t j) { return at(i, j) + slot.row_bias[j]; }));
  }
  void columns(host::SinkhornScaling& scaling) {
    host::SinkhornSlot& slot = scaling.slots.front();
    for (std::size_t j = 0; j < sources; ++j)
      scaling.finish_column(slot, j, lse(rows_count, [&](std::size_t i) { return slot.row_scale[i] + at(i, j); }));
  }
  /// The plan's entry P_ij = exp(f_i + l_ij + log p_j + g_j).
  double plan(const host::SinkhornSlot& slot, std::size_t i, std::size_t j) const {
    return std::exp(slot.row_scale[i] + at(i, j) + slot.row_bias[j]);
  }
};

struct DenseCase {
  DensePasses passes;
  std::vector<double> presence;   // sources
  std::vector<char> present;      // receivers
};

DenseCase dense_case(std::size_t rows, std::size_t sources, double spread, std::uint64_t seed) {
  RandomStream stream(seed, 1);
  DenseCase c{DensePasses{rows, sources, std::vector<double>(rows * sources)}, std::vector<double>(sources, 1.0),
              std::vector<char>(rows, 1)};
  for (double& l : c.passes.logits) l = spread * stream.normal();
  return c;
}

host::SinkhornScaling scaled(DenseCase& c, std::size_t sweeps, double tolerance) {
  host::SinkhornScaling scaling(kernels::SinkhornTerms{sweeps, tolerance});
  host::SinkhornSlot& slot = scaling.slots.emplace_back();
  for (double p : c.presence) slot.source_log_presence.push_back(p > 0 ? std::log(p) : -HUGE_VAL);
  slot.receiver_present = c.present;
  scaling.reset();
  scaling.run(c.passes);
  return scaling;
}

// Rows sum to 1 for every sweep count (rows are scaled last); columns reach 1 within the
// tolerance, and the scaling stops as soon as they do (the column error it reports is the
// plan's).
TEST(Sinkhorn, RowsSumToOneAndColumnsReachTheirSharesWithinTheTolerance) {
  for (const double spread : {0.5, 2.0, 6.0}) {
    DenseCase c = dense_case(37, 37, spread, 3);
    for (const std::size_t sweeps : {0u, 1u, 4u, 20u}) {
      const host::SinkhornScaling scaling = scaled(c, sweeps, 0.0);
      const host::SinkhornSlot& slot = scaling.slots.front();
      EXPECT_EQ(slot.sweeps, sweeps);
      double column_error = 0.0;
      for (std::size_t i = 0; i < 37; ++i) {
        double row = 0.0;
        for (std::size_t j = 0; j < 37; ++j) row += c.passes.plan(slot, i, j);
        EXPECT_NEAR(row, 1.0, 1e-14) << "spread " << spread << " sweeps " << sweeps;
      }
      for (std::size_t j = 0; j < 37; ++j) {
        double column = 0.0;
        for (std::size_t i = 0; i < 37; ++i) column += c.passes.plan(slot, i, j);
        column_error = std::max(column_error, std::fabs(column - 1.0));
      }
      EXPECT_NEAR(slot.column_error, column_error, 1e-13) << "spread " << spread << " sweeps " << sweeps;
    }
    const host::SinkhornScaling converged = scaled(c, 100000, 1e-12);
    const host::SinkhornSlot& slot = converged.slots.front();
    EXPECT_LE(slot.column_error, 1e-12);
    EXPECT_LT(slot.sweeps, 100000u);
    // One sweep fewer was not yet within the tolerance: it stopped at the first plan that is.
    if (slot.sweeps > 0) {
      EXPECT_GT(scaled(c, slot.sweeps - 1, 0.0).slots.front().column_error, 1e-12);
    }
  }
}

// Presences and unseen sources: column j's share is R p_j / M_J over the sources some
// receiver sees; a null receiver has an empty row, a source no receiver sees a zero column.
TEST(Sinkhorn, ColumnSharesFollowThePresencesOfTheSourcesInView) {
  DenseCase c = dense_case(12, 15, 1.0, 5);
  for (std::size_t j = 0; j < 15; ++j) c.presence[j] = 0.2 + 0.05 * double(j);
  c.presence[4] = 0.0;                                      // a null source
  c.present[7] = 0;                                         // a null receiver
  for (std::size_t i = 0; i < 12; ++i) c.passes.logits[i * 15 + 9] = -HUGE_VAL;  // source 9 unseen
  const host::SinkhornScaling scaling = scaled(c, 100000, 1e-13);
  const host::SinkhornSlot& slot = scaling.slots.front();
  double visible_mass = 0.0;
  for (std::size_t j = 0; j < 15; ++j)
    if (j != 9) visible_mass += c.presence[j];
  for (std::size_t j = 0; j < 15; ++j) {
    double column = 0.0;
    for (std::size_t i = 0; i < 12; ++i) column += c.passes.plan(slot, i, j);
    const double share = j == 9 ? 0.0 : 11.0 * c.presence[j] / visible_mass;
    EXPECT_NEAR(column, share, 1e-12) << "source " << j;
  }
  for (std::size_t i = 0; i < 12; ++i) {
    double row = 0.0;
    for (std::size_t j = 0; j < 15; ++j) row += c.passes.plan(slot, i, j);
    EXPECT_NEAR(row, i == 7 ? 0.0 : 1.0, 1e-14) << "receiver " << i;
  }
}

std::vector<double> evaluate(const Model& model, const State& state, const std::string& backend_name, int threads,
                             std::vector<double>* weight_sums = nullptr) {
  return testing::evaluate_velocity(model, state, backend_name, threads, weight_sums);
}

const std::vector<std::vector<std::string>> kSinkhornOptions = {
    {},
    {"--geometry", "rope", "--q", "gaussian", "--k", "gaussian", "--v", "gaussian"},
    {"--prefix", "3", "--prefix-weight", "2", "--geometry", "rope", "--values", "plain"},
    {"--prefix", "4", "--prompts", "2", "--mask", "window+per-prompt", "--window", "6", "--positions", "index"},
    {"--aux-factor", "distance", "--aux-lambda", "0.3", "--q", "goe"},
    {"--aux-factor", "gaussian", "--aux-sigma", "5", "--mask", "window", "--window", "9"},
    {"--amplitudes", "0.7", "--null-tokens", "3", "--time-scale", "rescaled", "--matrices", "per-replica",
     "--q", "gaussian"},
    {"--heads", "3", "--head-dim", "2", "--mlp", "4", "--q", "gaussian", "--k", "gaussian", "--prefix", "2"},
};

// The CPU backend's lanes against the reference's pairs: velocities within 1e-13, weight
// sums (SA's, of the unscaled weights) within 1e-12, for converged and truncated scalings.
TEST(Sinkhorn, CpuAgreesWithReferenceOnTheOptionsItTakes) {
  int checked = 0;
  for (const std::string d : {"3", "9"})
    for (const std::string n : {"1", "13", "70"})
      for (const std::string sweeps : {"3", "40"})
        for (const auto& extra : kSinkhornOptions) {
          if (n == "1" && std::find(extra.begin(), extra.end(), "--prompts") != extra.end()) continue;
          const RunConfig cfg =
              config(testing::with({"--n", n, "--d", d, "--kernel", "sinkhorn", "--sinkhorn-iterations", sweeps,
                                    "--beta", "1.5", "--seed", std::to_string(++checked), "--replicas", "2"},
                                   extra));
          testing::expect_cpu_field_matches_reference(
              cfg, "d " + d + " n " + n + " sweeps " + sweeps + " case " + std::to_string(checked));
        }
  EXPECT_GT(checked, 80);
}

// Zero sweeps scale the rows only: SA, within 1e-15, with its weight sums.
TEST(Sinkhorn, ZeroSweepsAreSoftmaxAttention) {
  for (const auto& extra : kSinkhornOptions) {
    const RunConfig sinkhorn_cfg = config(
        testing::with({"--n", "50", "--d", "5", "--kernel", "sinkhorn", "--sinkhorn-iterations", "0", "--seed", "7"},
                      extra));
    const RunConfig sa_cfg =
        config(testing::with({"--n", "50", "--d", "5", "--kernel", "sa", "--seed", "7", "--eps-den", "0"}, extra));
    const Model sinkhorn = build_model(sinkhorn_cfg), sa = build_model(sa_cfg);
    const State state = build_initial_state(sa_cfg, sa);
    for (const std::string backend : {"cpu", "reference"}) {
      std::vector<double> sums, sa_sums;
      const auto v = evaluate(sinkhorn, state, backend, 1, &sums), v_sa = evaluate(sa, state, backend, 1, &sa_sums);
      std::string label = backend;
      for (const std::string& word : extra) label += " " + word;
      EXPECT_LE(max_abs_difference(v, v_sa), 1e-15) << label;
      double largest_sum = 0.0;
      for (double s : sa_sums) largest_sum = std::max(largest_sum, s);
      EXPECT_LE(max_abs_difference(sums, sa_sums), 1e-14 * largest_sum) << backend;
    }
  }
}

// Null tokens appended change no bit of the others' velocities (they are neither receivers
// nor sources of the plan), and 1 or 2 threads give the same bits.
TEST(Sinkhorn, NullTokensAndThreadCountsChangeNoBit) {
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--geometry", "rope", "--prefix", "2", "--q", "gaussian"},
        std::vector<std::string>{"--heads", "2", "--head-dim", "3", "--mlp", "3", "--aux-factor", "distance"}})
    testing::expect_null_tokens_and_threads_change_no_bit(testing::with(
        {"--kernel", "sinkhorn", "--sinkhorn-tol", "0", "--sinkhorn-iterations", "12", "--seed", "4"}, extra));
}

// What has no doubly stochastic scaling, or is not built for it, is refused naming the option.
TEST(Sinkhorn, OptionsWithoutAScalingAreRefusedNamingThem) {
  using testing::usage_message;
  EXPECT_EQ(usage_message({"--kernel", "sinkhorn", "--mask", "causal", "--out", "x.h5"}).substr(0, 59),
            "--mask causal: with --kernel sinkhorn: a causal matrix has ");
  EXPECT_EQ(usage_message({"--kernel", "sinkhorn", "--aux-factor", "cosine", "--out", "x.h5"}).substr(0, 46),
            "--aux-factor cosine: the cosine factor changes");
  EXPECT_EQ(usage_message({"--kernel", "sinkhorn", "--eps-den", "1e-9", "--out", "x.h5"}).substr(0, 39),
            "--eps-den 1e-09: is SA's denominator te");
  EXPECT_EQ(usage_message({"--kernel", "sinkhorn", "--sinkhorn-iterations", "-1", "--out", "x.h5"}),
            "--sinkhorn-iterations -1: must be an integer in [0, 100000]");
  EXPECT_EQ(usage_message({"--kernel", "sinkhorn", "--sinkhorn-tol", "-1", "--out", "x.h5"}),
            "--sinkhorn-tol -1: must be >= 0");
  const Model model = build_model(config({"--n", "8", "--kernel", "sinkhorn"}));
  try {
    make_backend("cuda", model, BackendOptions{1});
    ADD_FAILURE() << "cuda took Sinkhorn attention";
  } catch (const BackendUnavailable& error) {
    EXPECT_NE(std::string(error.what()).find("sinkhorn"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace mfattn
