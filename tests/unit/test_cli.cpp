// The mfattn binary as a user runs it: bad input, exit codes, output files, baseline collapse.
#include <hdf5.h>

#include <fstream>
#include <set>
#include <sstream>

#include "mfattn/app/config.hpp"
#include "mfattn/app/run_choices.hpp"

#include "mfattn/io/h5md.hpp"
#include "mfattn/app/run_resources.hpp"
#include "test_support.hpp"

namespace mfattn {
namespace {

using testing::run_mfattn;
using testing::scratch_dir;

std::size_t line_count(const std::string& text) {
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}

double last_observable(const std::string& path, const std::string& name) {
  return testing::read_doubles(path, "/observables/" + name + "/value").back();
}

std::vector<double> all_positions(const std::string& path) {
  return testing::read_doubles(path, "/particles/tokens/position/value");
}

TEST(Cli, BadInputGetsOneLineExitTwoAndNoFile) {
  const auto dir = scratch_dir("bad_input");
  const std::string out = (dir / "bad.h5").string();
  std::ofstream(dir / "matrix.txt") << "1 0\n0 1\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--kernel softmax", "--kernel"},
      {"--n 0", "--n"},
      {"--d 1", "--d"},
      {"--beta -800", "--beta"},
      {"--beta nan", "--beta"},
      {"--dt 0", "--dt"},
      {"--horizon inf", "--horizon"},
      {"--integrator rk5", "--integrator"},
      {"--time-scale fast", "--time-scale"},
      {"--init equiangular --n 10 --d 3", "--init"},
      {"--init file --init-file /nonexistent/x.txt", "--init-file"},
      {"--q /nonexistent/q.txt", "--q"},
      {"--q " + (dir / "matrix.txt").string() + " --d 3", "--q"},
      {"--amplitudes 1,2", "--amplitudes"},
      {"--noise-kappa 1", "--noise-kappa"},
      {"--save-every 1 --save-log 10", "--save-every"},
      {"--unknown-option 3", "unknown-option"},
      {"--n ten", "--n"},
      {"--backend gpu", "--backend"},
      {"--resume --overwrite", "--resume"},
      {"--save-times 0.5,-1 --horizon 2", "--save-times"},
      {"--init-file " + (dir / "matrix.txt").string(), "--init-file"},
      {"--config " + (dir / "missing.ini").string(), "--config"},
      {"--mask diagonal", "--mask"},
      {"--replicas 0", "--replicas"},
      {"--geometry ropes", "--geometry"},
      {"--kernel sa --aux-factor cosine", "--aux-factor"},
      {"--generators " + (dir / "matrix.txt").string() + " --geometry rope", "--generators"},
      {"--geometry rope --d 6 --rope-freqs 1,2", "--geometry"},
      {"--aux-sigma 0 --aux-factor gaussian", "--aux-sigma"},
      {"--values transport", "--values"},
  };
  for (const auto& [arguments, named] : cases) {
    const auto result = run_mfattn("run " + arguments + " --quiet --out " + out);
    EXPECT_EQ(result.exit_code, 2) << arguments << "\n" << result.output;
    EXPECT_EQ(line_count(result.output), 1u) << arguments << "\n" << result.output;
    EXPECT_NE(result.output.find(named), std::string::npos) << arguments << "\n" << result.output;
    EXPECT_FALSE(std::filesystem::exists(out)) << arguments;
  }
}

// An unknown option says that there is no such option and names the closest ones, on the
// command line, in a config file and for mfattn sweep; nothing close: no list.
TEST(Cli, AnUnknownOptionNamesTheClosestOnes) {
  using testing::usage_message;
  EXPECT_EQ(usage_message({"--heds", "2"}),
            "--heds: no such option (the closest: --heads); --help lists every option");
  EXPECT_EQ(usage_message({"--mlp-activatoin", "relu"}),
            "--mlp-activatoin: no such option (the closest: --mlp-activation); --help lists every option");
  // A stem names the options it begins.
  const std::string head = usage_message({"--head", "2"});
  EXPECT_NE(head.find("(the closest: --head-dim, --heads)"), std::string::npos) << head;
  EXPECT_EQ(usage_message({"--zzzzzzzz", "1"}), "--zzzzzzzz: no such option; --help lists every option");
  const auto dir = scratch_dir("unknown_option");
  std::ofstream(dir / "run.ini") << "n = 8\nbetta = 2\n";
  const auto from_file = run_mfattn("run --config " + (dir / "run.ini").string() + " --out " + (dir / "o.h5").string());
  EXPECT_EQ(from_file.exit_code, 2);
  EXPECT_NE(from_file.output.find("betta"), std::string::npos) << from_file.output;
  EXPECT_NE(from_file.output.find("(not an option of mfattn run; the closest: --beta)"), std::string::npos)
      << from_file.output;
  std::ofstream(dir / "grid.ini") << "n = 8\n[axes]\nbetta = 1 2\n";
  const auto axis = run_mfattn("sweep --config " + (dir / "grid.ini").string() + " --dry-run");
  EXPECT_EQ(axis.exit_code, 2);
  EXPECT_NE(axis.output.find("'axes.betta'; the closest: --beta)"), std::string::npos) << axis.output;
  const auto sweep = run_mfattn("sweep --confg x.ini");
  EXPECT_EQ(sweep.exit_code, 2);
  EXPECT_NE(sweep.output.find("--confg: no such option (the closest: --config)"), std::string::npos) << sweep.output;
}

// The commands with tables of their own (analyze, realize, oclosure) parse through one helper
// with run's rules: each option once, unknown options named with the closest, a missing value
// named with what the option takes, values that start with '-', and the operands in order.
TEST(Cli, CommandOptionsFollowRunsRules) {
  namespace po = boost::program_options;
  auto parse = [](const std::vector<std::string>& args, std::string* replica = nullptr) {
    std::string value;
    bool json = false;
    po::options_description table("test");
    table.add_options()("replica", po::value(&value), "a replica index >= 0")("json", po::bool_switch(&json), "json");
    po::variables_map vm;
    const std::vector<std::string> operands = parse_command_options(args, table, vm);
    if (replica) *replica = value;
    return operands;
  };
  auto refusal = [&](const std::vector<std::string>& args) {
    try {
      parse(args);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  std::string replica;
  EXPECT_EQ(parse({"a.h5", "--replica", "-1", "b.h5", "--json"}, &replica), (std::vector<std::string>{"a.h5", "b.h5"}));
  EXPECT_EQ(replica, "-1");
  EXPECT_EQ(parse({"--replica=3"}, &replica), std::vector<std::string>{});
  EXPECT_EQ(replica, "3");
  EXPECT_EQ(refusal({"--replica", "1", "--replica=2"}), "--replica: given more than once (give each option once)");
  EXPECT_EQ(refusal({"--json", "--json"}), "--json: given more than once (give each option once)");
  EXPECT_EQ(refusal({"--replca", "1"}), "--replca: no such option (the closest: --replica); --help lists every option");
  EXPECT_EQ(refusal({"--replica"}), "--replica: a value is missing (a replica index >= 0)");
}

TEST(Cli, CudaBackendInCpuBuildSaysSoClearly) {
  const auto dir = scratch_dir("cuda");
  const auto result = run_mfattn("run --backend cuda --quiet --out " + (dir / "c.h5").string());
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("no CUDA"), std::string::npos) << result.output;
  EXPECT_EQ(line_count(result.output), 1u);
  EXPECT_FALSE(std::filesystem::exists(dir / "c.h5"));
}

TEST(Cli, UsaOverflowIsRefusedUpFrontNamingRescaledTime) {
  const auto dir = scratch_dir("overflow");
  const auto result = run_mfattn("run --beta 1000 --n 8 --quiet --out " + (dir / "o.h5").string());
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_EQ(line_count(result.output), 1u) << result.output;
  EXPECT_NE(result.output.find("--time-scale rescaled"), std::string::npos) << result.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "o.h5"));
  const auto rescaled = run_mfattn("run --beta 1000 --n 8 --time-scale rescaled --horizon 1 --quiet --out " +
                                   (dir / "r.h5").string());
  EXPECT_EQ(rescaled.exit_code, 0) << rescaled.output;
}

TEST(Cli, ExistingOutputIsNotOverwrittenWithoutOverwrite) {
  const auto dir = scratch_dir("overwrite");
  const std::string out = (dir / "run.h5").string();
  ASSERT_EQ(run_mfattn("run --n 8 --horizon 1 --quiet --out " + out).exit_code, 0);
  const auto before = std::filesystem::last_write_time(out);
  const auto again = run_mfattn("run --n 8 --horizon 1 --quiet --out " + out);
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.output.find("--overwrite"), std::string::npos) << again.output;
  EXPECT_EQ(std::filesystem::last_write_time(out), before);
  EXPECT_EQ(run_mfattn("run --n 8 --horizon 1 --quiet --overwrite --out " + out).exit_code, 0);
}

TEST(Cli, ThreadCountDoesNotChangeOutputPositions) {
  const auto dir = scratch_dir("threads");
  const std::string one = (dir / "one.h5").string(), two = (dir / "two.h5").string();
  const std::string common = "run --n 130 --d 3 --kernel sa --horizon 4 --integrator dopri5 --quiet ";
  ASSERT_EQ(run_mfattn(common + "--threads 1 --out " + one).exit_code, 0);
  ASSERT_EQ(run_mfattn(common + "--threads 2 --out " + two).exit_code, 0);
  const auto a = all_positions(one), b = all_positions(two);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_TRUE(testing::bitwise_equal(a.data(), b.data(), a.size()));
}

// Baseline of seed 003: USA and SA at n = 64, 128, 256, d = 3, beta = 1, t = 20 collapse.
TEST(Collapse, BaselineUsaAndSaCollapseByTimeTwenty) {
  const auto dir = scratch_dir("collapse");
  for (const std::string kernel : {"usa", "sa"})
    for (const std::string n : {"64", "128", "256"}) {
      const std::string out = (dir / (kernel + n + ".h5")).string();
      const auto result = run_mfattn("run --n " + n + " --d 3 --beta 1 --kernel " + kernel +
                                     " --horizon 20 --quiet --out " + out);
      ASSERT_EQ(result.exit_code, 0) << result.output;
      EXPECT_GT(last_observable(out, "min_inner"), 0.999) << kernel << " n = " << n;
    }
}

TEST(Cli, VersionAndHelpWork) {
  const auto version = run_mfattn("--version");
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_NE(version.output.find("mfattn"), std::string::npos);
  const auto help = run_mfattn("run --help");
  EXPECT_EQ(help.exit_code, 0);
  for (const char* option : {"--n", "--beta", "--kernel", "--integrator", "--null-tokens", "--eps-den"})
    EXPECT_NE(help.output.find(option), std::string::npos) << option;
}

using testing::usage_message;

TEST(Config, ParserTakesFullNamesOneValueEachAndListsJoined) {
  const std::string out = (scratch_dir("parser") / "p.h5").string();
  EXPECT_EQ(usage_message({"--kern", "sa", "--out", out}),
            "--kern: no such option (the closest: --kernel); --help lists every option");
  EXPECT_NE(usage_message({"--n", "8", "16", "--out", out}).find("stray value '16'"), std::string::npos);
  EXPECT_NE(usage_message({"oops", "--out", out}).find("stray argument 'oops'"), std::string::npos);
  EXPECT_EQ(usage_message({"--n", "1e3", "--out", out}), "--n 1e3: must be an integer >= 1");
  EXPECT_EQ(usage_message({"--pair-delta", "x", "--out", out}), "--pair-delta x: must be a number in (0, 2)");
  const RunConfig cfg = parse_run_arguments({"--save-times", "0.5", "1", "1.5", "--horizon", "2",
                                             "--eps-den", "auto", "--out", out});
  EXPECT_EQ(cfg.save_times, "0.5,1,1.5");
  EXPECT_EQ(cfg.eps_den, -1.0);
  EXPECT_NE(usage_message({"--eps-den", "-1", "--out", out}).find("auto"), std::string::npos);
}

TEST(Config, ConfigErrorsNameTheFileAndLine) {
  RunConfig scratch;
  const auto table = run_options(scratch);
  auto message = [&](const std::string& text) {
    try {
      parse_config_text(text, "x.ini", table);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(message("[model]\nn = 8\nwhat\n").rfind("x.ini:3: ", 0), 0u) << message("[model]\nn = 8\nwhat\n");
  EXPECT_EQ(message("n = 1\n# c\nn = 2\n").rfind("x.ini:3: --n given twice (first on line 1)", 0), 0u);
  EXPECT_EQ(message("[a]\nbetta = 1\n").rfind("x.ini:2: unknown key 'a.betta'", 0), 0u);
  EXPECT_EQ(message("[model] # sizes\nmodel.n = 8 # eight\n\n"), "(accepted)");
  EXPECT_EQ(parse_config_text("[model]\n n = 8 \r\n", "x.ini", table).at(0).value, "8");
}

TEST(Config, HelpShowsShortestDefaultsAndSizesAreBounded) {
  RunConfig defaults;
  std::ostringstream help;
  help << run_options(defaults);
  EXPECT_EQ(help.str().find("0.050000000000000003"), std::string::npos);
  EXPECT_NE(help.str().find("(=0.05)"), std::string::npos);
  RunConfig big;
  big.n = 1000;
  const double small = estimated_memory_bytes(big);
  big.replicas = 10;
  EXPECT_GT(estimated_memory_bytes(big), 8.0 * small);
  EXPECT_GT(available_memory_bytes(), 0.0);
  const std::string out = (scratch_dir("sizes") / "s.h5").string();
  EXPECT_NE(usage_message({"--prefix", "4611686018427387904", "--prompts", "4", "--out", out}).find("--prefix"),
            std::string::npos);
  EXPECT_NE(usage_message({"--replicas", "1000000000", "--out", out}).find("memory"), std::string::npos);
}

// A choice option's table is its --help line, its validation and the value the model gets:
// every name of the table is accepted (another rule may still ask for more, as --init file
// asks for --init-file, but never as an unknown name), any other name is refused with the
// table's list, and choice() gives the name's value.
template <class Value>
void expect_table_drives_option(const ChoiceOption<Value>& option, const std::string& out) {
  const std::string flag = "--" + std::string(option.option);
  SCOPED_TRACE(flag);
  RunConfig defaults;
  const auto table = run_options(defaults);
  const auto* described = table.find_nothrow(std::string(option.option), false);
  ASSERT_NE(described, nullptr);
  EXPECT_EQ(described->description(), option.help());
  std::set<std::string_view> names;
  for (const Choice<Value>& entry : option.choices) EXPECT_TRUE(names.insert(entry.name).second) << entry.name;
  // (--mask goes on to say how its parts join.)
  const std::string refused = usage_message({flag, "no-such-choice", "--out", out});
  EXPECT_EQ(refused.rfind(flag + " no-such-choice: " + option.accepted(), 0), 0u) << refused;
  for (const Choice<Value>& entry : option.choices) {
    const std::string name(entry.name);
    const std::string message = usage_message({flag, name, "--out", out});
    EXPECT_EQ(message.find(flag + " " + name + ": accepted:"), std::string::npos) << message;
    EXPECT_EQ(option.find(name), &entry) << name;  // the name selects this entry's value
    EXPECT_EQ(option.name_of(entry.value), entry.name);
  }
}

// Validation turns every choice name into its value once (RunConfig::choices); the model
// builder and the run read those.
TEST(Config, ValidationReturnsTheTypedChoices) {
  const RunConfig cfg = testing::config({"--kernel", "sa", "--time-scale", "rescaled", "--q", "goe", "--matrices",
                                "per-replica", "--geometry", "rope-axial", "--positions", "grid", "--values",
                                "plain", "--aux-factor", "power", "--mask", "causal+per-prompt", "--prefix", "1",
                                "--prefix-init", "clustered", "--init", "hemisphere", "--integrator",
                                "euler-maruyama", "--noise-kappa", "10", "--save-positions", "ends",
                                "--backend", "reference"});
  const RunChoices& c = cfg.choices;
  EXPECT_EQ(c.kernel, Normalization::Sa);
  EXPECT_EQ(c.time_scale, TimeScale::Rescaled);
  EXPECT_EQ(c.q, MatrixPreset::Goe);
  EXPECT_EQ(c.k, MatrixPreset::Identity);
  EXPECT_EQ(c.matrices, MatrixSharing::PerReplica);
  EXPECT_EQ(c.geometry, GeometryKind::RopeAxial);
  EXPECT_EQ(c.positions, PositionLayout::Grid);
  EXPECT_EQ(c.values, ValueTransport::Plain);
  EXPECT_EQ(c.aux_factor.factor, AuxFactor::Power);
  EXPECT_EQ(c.mask.kind, MaskKind::Causal);
  EXPECT_TRUE(c.mask.per_prompt);
  EXPECT_EQ(c.prefix_init, PrefixPlacement::Clustered);
  EXPECT_EQ(c.init, InitKind::Hemisphere);
  EXPECT_EQ(c.save_positions, PositionFrames::Ends);
  ASSERT_NE(c.integrator, nullptr);
  EXPECT_STREQ(c.integrator->name, "euler-maruyama");
  EXPECT_TRUE(c.integrator->stochastic);
  ASSERT_NE(c.backend, nullptr);
  EXPECT_STREQ(c.backend->name, "reference");
  EXPECT_FALSE(c.backend->takes_float);
  const Model model = build_model(cfg);
  EXPECT_EQ(model.normalization, Normalization::Sa);
  EXPECT_EQ(model.pair_terms.factor, AuxFactor::Power);
  EXPECT_EQ(model.position_dim, 2u);
}

TEST(Config, ChoiceTablesDriveHelpValidationAndValues) {
  const std::string out = (scratch_dir("choices") / "c.h5").string();
  expect_table_drives_option(kKernelOption, out);
  expect_table_drives_option(kTimeScaleOption, out);
  expect_table_drives_option(kQueryOption, out);
  expect_table_drives_option(kKeyOption, out);
  expect_table_drives_option(kValueOption, out);
  expect_table_drives_option(kMatrixSharingOption, out);
  expect_table_drives_option(kGeometryOption, out);
  expect_table_drives_option(kPositionsOption, out);
  expect_table_drives_option(kValuesOption, out);
  expect_table_drives_option(kAuxFactorOption, out);
  expect_table_drives_option(kMaskOption, out);
  expect_table_drives_option(kPrefixInitOption, out);
  expect_table_drives_option(kInitOption, out);
  EXPECT_EQ(kQueryOption.accepted(),
            "accepted: identity, gaussian, goe, gaussian-product, wigner-unit, goe-unit or a readable file");
  EXPECT_EQ(kKernelOption.help(), "usa (unnormalised) | sa (softmax) | sinkhorn (softmax scaled to a doubly stochastic matrix)");
}

TEST(Config, ModelTakesTheValueEachChoiceNames) {
  for (const auto& entry : kKernelChoices)
    EXPECT_EQ(build_model(testing::config({"--kernel", std::string(entry.name)})).normalization, entry.value);
  for (const auto& entry : kTimeScaleChoices)
    EXPECT_EQ(build_model(testing::config({"--time-scale", std::string(entry.name)})).time_scale, entry.value);
  for (const auto& entry : kValuesChoices)
    EXPECT_EQ(build_model(testing::config({"--values", std::string(entry.name)})).values, entry.value);
  for (const auto& entry : kAuxFactorChoices) {
    const std::string name(entry.name);
    EXPECT_EQ(build_model(testing::config({"--aux-factor", name})).pair_terms.factor, entry.value.factor) << name;
    // The rules read the table's properties, so a factor that changes sign is refused with SA.
    const std::string with_sa =
        usage_message({"--aux-factor", name, "--kernel", "sa", "--out", (scratch_dir("choices") / "a.h5").string()});
    EXPECT_EQ(with_sa.find("changes sign") != std::string::npos, entry.value.changes_sign) << with_sa;
  }
  for (const auto& entry : kMaskChoices) {
    const Model model = build_model(testing::config({"--mask", std::string(entry.name), "--prefix", "1"}));
    EXPECT_EQ(model.pair_terms.mask, entry.value.kind) << entry.name;
    EXPECT_EQ(model.pair_terms.per_prompt, entry.value.per_prompt) << entry.name;
  }
  const Model joined = build_model(testing::config({"--mask", "window+per-prompt", "--prefix", "1"}));
  EXPECT_EQ(joined.pair_terms.mask, MaskKind::Window);
  EXPECT_TRUE(joined.pair_terms.per_prompt);
  EXPECT_FALSE(parse_mask("full+per-prompt"));
  EXPECT_FALSE(parse_mask("causal+window"));
  EXPECT_FALSE(parse_mask(""));
}

}  // namespace
}  // namespace mfattn
