// What a registered entry takes of a model is declared once (core/capabilities.hpp: the
// backends' registry, the mean-field solver, the OAttention link), and every refusal of it is
// generated from the choice tables: the option's validation, make_backend and the entries
// themselves name the option, its value and the accepted values in the tables' order.
#include "test_support.hpp"

#include "mfattn/app/meanfield.hpp"
#include "mfattn/oattn/oattention.hpp"

namespace mfattn {
namespace {

using testing::config;
using testing::usage_message;

/// The names of a table's values that `capabilities` takes, as the refusals list them.
template <class Value, class Key, class KeyOf>
std::string taken_names(const ChoiceOption<Value>& option, std::span<const Key> accepted, KeyOf&& key_of) {
  std::string names;
  for (const Choice<Value>& choice : option.choices)
    if (accepted.empty() || std::find(accepted.begin(), accepted.end(), key_of(choice.value)) != accepted.end())
      names += (names.empty() ? "" : ", ") + std::string(choice.name);
  return names;
}

TEST(Capabilities, EveryBackendRefusesWhatItsEntryDoesNotTakeNamingTheTablesValues) {
  const auto same = [](const auto& value) { return value; };
  int refusals = 0;
  for (const BackendName& entry : kBackendNames) {
    const std::string backend = entry.name;
    for (const auto& choice : kKernelOption.choices) {
      const std::string said = usage_message({"--backend", backend, "--kernel", std::string(choice.name), "--out", "x.h5"});
      const bool taken = entry.takes.kernels.empty() ||
                         std::find(entry.takes.kernels.begin(), entry.takes.kernels.end(), choice.value) !=
                             entry.takes.kernels.end();
      if (taken) continue;
      ++refusals;
      EXPECT_EQ(said, "--kernel " + std::string(choice.name) + ": --backend " + backend + " takes --kernel " +
                          taken_names(kKernelOption, entry.takes.kernels, same));
    }
    for (const auto& choice : kPlacementOption.choices) {
      const bool taken = entry.takes.placements.empty() ||
                         std::find(entry.takes.placements.begin(), entry.takes.placements.end(), choice.value) !=
                             entry.takes.placements.end();
      if (taken) continue;
      ++refusals;
      EXPECT_EQ(usage_message({"--backend", backend, "--normalization", std::string(choice.name), "--out", "x.h5"}),
                "--normalization " + std::string(choice.name) + ": --backend " + backend + " takes --normalization " +
                    taken_names(kPlacementOption, entry.takes.placements, same));
    }
    if (!entry.takes.whole_layers) {
      ++refusals;
      const std::string said = usage_message({"--backend", backend, "--heads", "2", "--out", "x.h5"});
      EXPECT_NE(said.find("--backend " + backend + " takes no whole layer"), std::string::npos) << said;
    }
  }
  EXPECT_GE(refusals, 4);  // cuda: sinkhorn, four placements, layers
}

TEST(Capabilities, MakeBackendRefusesAModelBuiltInCodeAsValidationRefusesItsOptions) {
  Model model = build_model(config({"--n", "4", "--kernel", "sinkhorn"}));
  try {
    make_backend("cuda", model, BackendOptions{1});
    FAIL() << "cuda took --kernel sinkhorn";
  } catch (const BackendUnavailable& e) {
    EXPECT_EQ(std::string(e.what()), "--kernel sinkhorn: --backend cuda takes --kernel usa, sa");
  }
  model = build_model(config({"--n", "4"}));
  model.receivers_at_unit_speed = true;
  EXPECT_THROW(make_backend("cuda", model, BackendOptions{1}), BackendUnavailable);
  EXPECT_NO_THROW(make_backend("cpu", model, BackendOptions{1}));
}

TEST(Capabilities, TheMeanfieldSolverAndTheOAttentionLinkUseTheSameDeclarations) {
  try {
    parse_meanfield_arguments({"--d", "2", "--kernel", "sinkhorn", "--out", "x.h5"});
    FAIL() << "meanfield took --kernel sinkhorn";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "--kernel sinkhorn: mfattn meanfield takes --kernel usa, sa");
  }
  const Model usa = build_model(config({"--n", "4", "--kernel", "usa"}));
  std::vector<double> x(4 * 3, 0.5), v(4 * 3);
  try {
    oattn::sa_velocity_via_oattention(usa, x.data(), v.data());
    FAIL() << "the OAttention link took USA";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "sa_velocity_via_oattention: --kernel usa: the OAttention link takes --kernel sa");
  }
  const Model layer = build_model(config({"--n", "4", "--kernel", "sa", "--heads", "2"}));
  EXPECT_THROW(oattn::sa_velocity_via_oattention(layer, x.data(), v.data()), std::invalid_argument);
}

TEST(Capabilities, TheDerivativesRefuseWhatTheRegistryDeclares) {
  // The CUDA backend has none; the others name what their derivatives do not take.
  ModelKinds kinds;
  for (const BackendName& entry : kBackendNames) {
    const std::string said = derivative_refusal(entry, kinds);
    if (!entry.has_derivatives)
      EXPECT_EQ(said, "--backend " + std::string(entry.name) + ": has no derivatives (they run on --backend cpu, reference)");
    else
      EXPECT_EQ(said, "");
  }
  kinds.receivers_at_unit_speed = true;
  EXPECT_EQ(derivative_refusal(*find_backend("cpu"), kinds),
            "differentiating on --backend cpu takes no receivers at unit speed (the mean-field quadrature's grid points)");
  EXPECT_FALSE(find_backend("cuda")->has_derivatives);
  // --evaluation fourier's entry: no --backend, found by the name its backends give.
  EXPECT_EQ(find_backend(kSeriesEvaluation.name), nullptr);
  EXPECT_EQ(find_evaluator(kSeriesEvaluation.name), &kSeriesEvaluation);
  EXPECT_EQ(find_evaluator("cpu"), find_backend("cpu"));
  EXPECT_EQ(
      derivative_refusal(kSeriesEvaluation, ModelKinds{}),
      "--evaluation fourier: has no derivatives (they take --evaluation direct, on --backend cpu, reference)");
}

}  // namespace
}  // namespace mfattn
