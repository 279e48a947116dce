// O-closure (include/mfattn/oattn/oclosure.hpp): every O-closed component keeps zero tokens at zero
// and leaves the active tokens bit-identical under zero insertion, the standard components do
// not, and the two-block ablation of `mfattn oclosure` (include/mfattn/app/oclosure_command.hpp).
#include <cstring>

#include "mfattn/oattn/oclosure.hpp"
#include "mfattn/app/oclosure_command.hpp"
#include "test_support.hpp"

namespace mfattn {
namespace {

using namespace oclosure;

constexpr std::size_t kTokens = 13, kZeros = 9, kDim = 8;

Rows<double> with_zeros(const Rows<double>& active, const std::vector<long>& layout) {
  Rows<double> out = Rows<double>::Zero(static_cast<Eigen::Index>(layout.size()), active.cols());
  for (std::size_t a = 0; a < layout.size(); ++a)
    if (layout[a] >= 0) out.row(a) = active.row(layout[a]);
  return out;
}

/// Rows for the zero tokens from `extra` (their own signals), active rows from `active`.
Rows<double> interleave(const Rows<double>& active, const Rows<double>& extra, const std::vector<long>& layout) {
  Rows<double> out(static_cast<Eigen::Index>(layout.size()), active.cols());
  Eigen::Index z = 0;
  for (std::size_t a = 0; a < layout.size(); ++a)
    out.row(a) = layout[a] >= 0 ? active.row(layout[a]) : extra.row(z++);
  return out;
}

struct Verdict {
  bool zeros_stay_zero = true;      // every zero token's row is exactly +0
  bool active_bit_identical = true; // every active row equals its row without the zeros
  double active_shift = 0.0;
  double zero_output = 0.0;
};

template <class T>
Verdict compare(const Rows<T>& base, const Rows<T>& padded, const std::vector<long>& layout) {
  Verdict v;
  for (std::size_t a = 0; a < layout.size(); ++a) {
    const T* row = padded.data() + a * padded.cols();
    if (layout[a] < 0) {
      for (Eigen::Index c = 0; c < padded.cols(); ++c) {
        v.zeros_stay_zero = v.zeros_stay_zero && row[c] == T(0) && !std::signbit(row[c]);
        v.zero_output = std::max(v.zero_output, std::fabs(static_cast<double>(row[c])));
      }
    } else {
      const T* ref = base.data() + layout[a] * base.cols();
      v.active_bit_identical = v.active_bit_identical && std::memcmp(row, ref, sizeof(T) * base.cols()) == 0;
      for (Eigen::Index c = 0; c < base.cols(); ++c)
        v.active_shift = std::max(v.active_shift, std::fabs(static_cast<double>(row[c]) - static_cast<double>(ref[c])));
    }
  }
  return v;
}

template <class T>
Rows<T> cast(const Rows<double>& m) {
  return m.template cast<T>();
}

/// Every component in precision T, on N active carriers with and without zero tokens.
template <class T>
void check_components(const char* name) {
  const auto layout = insertion_layout(kTokens, kZeros);
  const Rows<double> active = random_rows(kTokens, kDim, 7, kCarriersKey);
  const Rows<double> signal = random_rows(kTokens, kDim, 7, kSignalsKey);
  const Rows<double> zero_signal = random_rows(kZeros, kDim, 7, kSignalsKey, kTokens);
  const Rows<T> h = cast<T>(active), hz = cast<T>(with_zeros(active, layout));
  const Rows<T> s = cast<T>(signal), sz = cast<T>(interleave(signal, zero_signal, layout));
  const HostWeights<T> w = cast_weights<T>(random_host_weights(kDim, 2, 7));
  const Settings settings;
  const auto& b = w.blocks[0];
  oattn::OAttentionOptions options;
  auto residual_oattention = [&](const Rows<T>& x) -> Rows<T> {
    return x + oattn::oattention(x, b.attention, oattn::Visibility::full(), options);
  };
  struct Named {
    const char* component;
    Verdict verdict;
  };
  const Named results[] = {
      {"OFFN", compare(offn(h, b.ffn, settings), offn(hz, b.ffn, settings), layout)},
      {"ONorm", compare(onorm(h, b.norm1, settings), onorm(hz, b.norm1, settings), layout)},
      {"OStandardize", compare(ostandardize(h, settings), ostandardize(hz, settings), layout)},
      {"OInject", compare(oinject(h, s, w.inject, settings), oinject(hz, sz, w.inject, settings), layout)},
      {"OAttention residual", compare(residual_oattention(h), residual_oattention(hz), layout)},
      {"O-block", compare(block(BlockKind::O, h, b, settings), block(BlockKind::O, hz, b, settings), layout)},
      {"OTransformer", compare(host_forward(BlockKind::O, FrontEnd::O, h, s, w, settings),
                               host_forward(BlockKind::O, FrontEnd::O, hz, sz, w, settings), layout)},
  };
  for (const auto& r : results) {
    EXPECT_TRUE(r.verdict.zeros_stay_zero) << name << " " << r.component << ": zero output " << r.verdict.zero_output;
    EXPECT_TRUE(r.verdict.active_bit_identical) << name << " " << r.component << ": shift " << r.verdict.active_shift;
  }
  // Active tokens do move (the components are not the identity).
  EXPECT_GT((offn(h, b.ffn, settings) - h).cwiseAbs().maxCoeff(), T(1e-2)) << name;
  EXPECT_GT((ostandardize(h, settings) - h).cwiseAbs().maxCoeff(), T(1e-2)) << name;
}

// Bit-identical in double and in float: every per-token map reads its own row only, in a
// fixed order, and every cross-token sum (OStandardize's moments, OAttention's row sums)
// skips tokens of presence 0 instead of adding 0 * h, so no tolerance is needed.
TEST(OClosure, EveryOComponentKeepsZerosAtZeroAndActiveTokensBitIdentical) {
  check_components<double>("double");
  check_components<float>("float");
}

// The standard counterparts reactivate zero tokens (FFN(0) = W_2 gelu(b_1) + b_2 != 0,
// LN(0) = beta_ln, Inject adds W s + b) or let them shift the moments (Standardize).
TEST(OClosure, StandardComponentsReactivateZeroTokens) {
  const auto layout = insertion_layout(kTokens, kZeros);
  const Rows<double> active = random_rows(kTokens, kDim, 7, kCarriersKey);
  const Rows<double> hz = with_zeros(active, layout);
  const Rows<double> sz = interleave(random_rows(kTokens, kDim, 7, kSignalsKey),
                                     random_rows(kZeros, kDim, 7, kSignalsKey, kTokens), layout);
  const HostWeights<double> w = random_host_weights(kDim, 2, 7);
  const Settings settings;
  EXPECT_GT(compare(active, ffn_residual(hz, w.blocks[0].ffn), layout).zero_output, 1e-2);
  EXPECT_GT(compare(active, layer_norm(hz, w.blocks[0].norm1, settings), layout).zero_output, 1e-2);
  EXPECT_GT(compare(active, inject(hz, sz, w.inject), layout).zero_output, 1e-2);
  EXPECT_GT(compare(standardize(active, settings), standardize(hz, settings), layout).active_shift, 1e-2);
}

// The ablation of `mfattn oclosure` with its default sizes (N = 32, Z = 32, D = 16, seed 0):
// the OTransformer (and the bare O-blocks) shift nothing; attention-only is exact after block
// 1 (its OAttention ignores the zero sources) but LN_1(0) = beta_ln reactivates the zeros, so
// block 2 attends to them and the existing outputs move by more than 1 (on outputs of
// LayerNorm scale, max |out| ~ 2-3).
TEST(OClosure, OTransformerInsertionShiftIsZeroWhileAttentionOnlyIsLarge) {
  const OClosureReport report = run_oclosure_experiment(OClosureOptions{});
  ASSERT_EQ(report.ablation.size(), 5u);
  const auto& standard = report.ablation[0];
  const auto& attention_only = report.ablation[1];
  const auto& o_blocks = report.ablation[2];
  const auto& otransformer = report.ablation[3];
  const auto& standard_front = report.ablation[4];
  EXPECT_EQ(otransformer.host, "OTransformer");
  EXPECT_EQ(otransformer.front_end_shift, 0.0);
  EXPECT_EQ(otransformer.block1_shift, 0.0);
  EXPECT_EQ(otransformer.output_shift, 0.0);
  EXPECT_EQ(otransformer.zero_output_max, 0.0);
  EXPECT_EQ(o_blocks.output_shift, 0.0);
  EXPECT_EQ(o_blocks.zero_output_max, 0.0);
  EXPECT_EQ(attention_only.block1_shift, 0.0);
  EXPECT_GT(attention_only.output_shift, 1.0);
  EXPECT_GT(attention_only.zero_output_max, 0.1);
  EXPECT_GT(standard.block1_shift, 1e-2);
  EXPECT_GT(standard.output_shift, 0.1);
  EXPECT_GT(standard_front.front_end_shift, 1e-2);
  EXPECT_GT(standard_front.output_shift, 0.1);
}

TEST(OClosure, InsertionLayoutSpreadsZerosBetweenActiveTokens) {
  EXPECT_EQ(insertion_layout(4, 1), (std::vector<long>{0, 1, -1, 2, 3}));
  EXPECT_EQ(insertion_layout(2, 3), (std::vector<long>{-1, 0, -1, -1, 1}));  // before tokens 0, 1, 1
  EXPECT_EQ(insertion_layout(3, 0), (std::vector<long>{0, 1, 2}));
}

TEST(OClosure, WeightsAreSeededPerParameter) {
  const auto a = random_host_weights(6, 2, 11), b = random_host_weights(6, 1, 11), c = random_host_weights(6, 2, 12);
  // Block 0 does not depend on how many blocks follow; another seed changes everything.
  EXPECT_EQ(a.blocks[0].ffn.w1, b.blocks[0].ffn.w1);
  EXPECT_EQ(a.inject.w, b.inject.w);
  EXPECT_NE(a.blocks[0].attention.w_q, c.blocks[0].attention.w_q);
  EXPECT_NE(a.blocks[0].attention.w_q, a.blocks[0].attention.w_k);
  EXPECT_NE(a.blocks[0].attention.w_q, a.blocks[1].attention.w_q);
}

TEST(OClosureCommand, PrintsAblationAndPrecisionTables) {
  const auto text = testing::run_mfattn("oclosure --tokens 8 --zeros 4 --dim 6 --seed 2");
  EXPECT_EQ(text.exit_code, 0) << text.output;
  for (const char* needle : {"| OTransformer |", "| attention-only |", "| float32 | float32 |", "| bfloat16 | float32 |"})
    EXPECT_NE(text.output.find(needle), std::string::npos) << needle << "\n" << text.output;
  const auto json = testing::run_mfattn("oclosure --tokens 8 --zeros 4 --dim 6 --json");
  EXPECT_EQ(json.exit_code, 0) << json.output;
  EXPECT_EQ(json.output.front(), '{');
  EXPECT_NE(json.output.find("\"output_shift\": 0,"), std::string::npos) << json.output;
  EXPECT_EQ(testing::run_mfattn("oclosure --help").exit_code, 0);
}

TEST(OClosureCommand, BadOptionsPrintOneLineAndExitTwo) {
  const std::pair<std::string, std::string> cases[] = {
      {"--tokens 0", "--tokens 0"},  {"--tokens abc", "--tokens abc"}, {"--zeros -1", "--zeros -1"},
      {"--dim 1", "--dim 1"},        {"--dim 1000", "--dim 1000"},     {"--seed 1.5", "--seed 1.5"},
      {"--dim=", "--dim"},           {"--seed", "--seed"},             {"--bogus 3", "--bogus"},
  };
  for (const auto& [args, needle] : cases) {
    const auto r = testing::run_mfattn("oclosure " + args);
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << ": " << r.output;
  }
}

}  // namespace
}  // namespace mfattn
