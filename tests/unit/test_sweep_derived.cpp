// mfattn sweep files: the [derived] expressions (their grammar, evaluation and errors) and
// zipped axes ([zip], [zip.LABEL]); docs/sweeps.md, "Derived values" and "Zipped axes".
#include <cmath>
#include <fstream>
#include <numbers>

#include "mfattn/sweep/sweep.hpp"
#include "sweep/sweep_expression.hpp"
#include "test_support.hpp"

namespace mfattn {
namespace {

namespace fs = std::filesystem;

double value_of(const std::string& text, const std::vector<double>& variables = {}) {
  return Expression::parse(text).evaluate(variables);
}

/// The 1-based column and message of the syntax error of `text` (column 0: none thrown).
std::pair<std::size_t, std::string> syntax_error(const std::string& text) {
  try {
    Expression::parse(text);
  } catch (const ExpressionSyntaxError& e) {
    return {e.column, e.what()};
  }
  return {0, "<no syntax error>"};
}

std::string value_error(const std::string& text, const std::vector<double>& variables = {}) {
  try {
    value_of(text, variables);
  } catch (const ExpressionValueError& e) {
    return e.what();
  }
  return "<no value error>";
}

/// The message of the UsageError that make_sweep throws for `text`.
std::string sweep_error(const std::string& text) {
  try {
    make_sweep(text, "grid.ini");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no UsageError thrown>";
}

RunConfig resolved(const SweepCase& c) {
  auto args = c.arguments;
  args.insert(args.end(), {"--out", "x.h5"});
  return parse_run_arguments(args);
}

TEST(SweepExpression, PrecedenceAndAssociativityAreThoseOfPython) {
  EXPECT_EQ(value_of("1 + 2 * 3"), 7.0);
  EXPECT_EQ(value_of("(1 + 2) * 3"), 9.0);
  EXPECT_EQ(value_of("1 - 2 - 3"), -4.0);   // left to right
  EXPECT_EQ(value_of("8 / 2 / 2"), 2.0);
  EXPECT_EQ(value_of("2 ^ 3 ^ 2"), 512.0);  // right to left, as Python's **
  EXPECT_EQ(value_of("-2 ^ 2"), -4.0);      // the power binds tighter than the sign
  EXPECT_EQ(value_of("2 ^ -1"), 0.5);       // the exponent may carry a sign
  EXPECT_EQ(value_of("--3"), 3.0);
  EXPECT_EQ(value_of("+3 - -2"), 5.0);
  EXPECT_EQ(value_of("2 * -3"), -6.0);
  EXPECT_EQ(value_of("2*(3)"), 6.0);
  EXPECT_EQ(syntax_error("(2)(3)").first, 4u);  // no implicit multiplication
}

TEST(SweepExpression, NumbersFunctionsAndConstants) {
  EXPECT_EQ(value_of("1e-3"), 1e-3);
  EXPECT_EQ(value_of("2.5E+2"), 250.0);
  EXPECT_EQ(value_of(".5"), 0.5);
  EXPECT_EQ(value_of("5."), 5.0);
  EXPECT_EQ(value_of("0.1"), 0.1);  // correctly rounded, as Python's float("0.1")
  EXPECT_EQ(value_of("0.1 + 0.2"), 0.1 + 0.2);
  EXPECT_EQ(value_of("sqrt(2)"), std::sqrt(2.0));
  EXPECT_EQ(value_of("exp(1.5)"), std::exp(1.5));
  EXPECT_EQ(value_of("log(10)"), std::log(10.0));
  EXPECT_EQ(value_of("abs(-2.5)"), 2.5);
  EXPECT_EQ(value_of("floor(-1.5)"), -2.0);
  EXPECT_EQ(value_of("ceil(-1.5)"), -1.0);
  EXPECT_EQ(value_of("pow(2, 0.5)"), std::pow(2.0, 0.5));
  EXPECT_EQ(value_of("2 ^ 0.5"), std::pow(2.0, 0.5));
  EXPECT_EQ(value_of("min(3, 1, 2)"), 1.0);
  EXPECT_EQ(value_of("max(3, 1, 2, 7, 0)"), 7.0);
  EXPECT_EQ(value_of("max(1, 2)"), 2.0);
  EXPECT_EQ(value_of("pi"), std::numbers::pi);
  EXPECT_EQ(value_of("e"), std::numbers::e);
  EXPECT_EQ(value_of("exp(1) - e"), std::exp(1.0) - std::numbers::e);
}

TEST(SweepExpression, VariablesAreListedOnceInOrderOfFirstUse) {
  const Expression expression = Expression::parse("0.1 / max(sqrt(beta) * exp(beta - 0.5), n, 1) + save_every");
  EXPECT_EQ(expression.variables(), (std::vector<std::string>{"beta", "n", "save_every"}));
  const double beta = 3.0, n = 2.0, save_every = 0.25;
  EXPECT_EQ(expression.evaluate({beta, n, save_every}),
            0.1 / std::max({std::sqrt(beta) * std::exp(beta - 0.5), n, 1.0}) + save_every);
}

TEST(SweepExpression, SyntaxErrorsNameTheColumn) {
  EXPECT_EQ(syntax_error("1 +"), (std::pair<std::size_t, std::string>{
                                     4, "the expression ends where a number, a name or '(' is expected"}));
  EXPECT_EQ(syntax_error("(1 + 2"), (std::pair<std::size_t, std::string>{7, "'(' at column 1 is not closed"}));
  EXPECT_EQ(syntax_error("1 + 2)"), (std::pair<std::size_t, std::string>{6, "')' without a matching '('"}));
  EXPECT_EQ(syntax_error("2 ** 3").first, 3u);
  EXPECT_NE(syntax_error("2 ** 3").second.find("write a power as a ^ b"), std::string::npos);
  EXPECT_EQ(syntax_error("1 + sin(2)").first, 5u);
  EXPECT_NE(syntax_error("1 + sin(2)").second.find("unknown function 'sin'"), std::string::npos);
  EXPECT_EQ(syntax_error("sqrt + 1").second, "sqrt is a function: write sqrt(...)");
  EXPECT_EQ(syntax_error("min(1)").second, "min takes at least 2 arguments, got 1");
  EXPECT_EQ(syntax_error("sqrt(1, 2)").second, "sqrt takes 1 argument, got 2");
  EXPECT_EQ(syntax_error("pow(1)").second, "pow takes 2 arguments, got 1");
  EXPECT_EQ(syntax_error("max(1, 2").second, "the arguments of max( are not closed with ')'");
  EXPECT_EQ(syntax_error("1e").first, 3u);
  EXPECT_EQ(syntax_error("1e+x").second, "the exponent of a number needs a digit");
  EXPECT_EQ(syntax_error("2beta").second, "a number is followed by 'b' (missing operator?)");
  EXPECT_EQ(syntax_error("1 2").first, 3u);
  EXPECT_EQ(syntax_error("1 $ 2").second, "expected an operator (+ - * / ^) or the end, got '$'");
  EXPECT_EQ(syntax_error("").second, "the expression is empty");
  EXPECT_EQ(syntax_error("1e999").second, "the number 1e999 is out of the range of a double");
  EXPECT_EQ(syntax_error(".").second, "a number needs a digit");
}

TEST(SweepExpression, NestingIsBoundedInsteadOfOverflowingTheStack) {
  // 20,000 levels overflowed the stack (SIGSEGV) before the bound; 256 of each kind parse.
  const std::size_t deep = 20000, allowed = 255;
  const std::string refused = "the expression nests deeper than 256 levels (parentheses, arguments, signs and exponents)";
  EXPECT_EQ(syntax_error(std::string(deep, '(') + "1" + std::string(deep, ')')).second, refused);
  EXPECT_EQ(syntax_error(std::string(deep, '-') + "1").second, refused);
  std::string powers = "1";
  for (std::size_t k = 0; k < deep; ++k) powers += "^1";
  EXPECT_EQ(syntax_error(powers).second, refused);
  std::string calls;
  for (std::size_t k = 0; k < deep; ++k) calls += "abs(";
  EXPECT_EQ(syntax_error(calls + "1" + std::string(deep, ')')).second, refused);
  EXPECT_EQ(value_of(std::string(allowed, '(') + "2" + std::string(allowed, ')')), 2.0);
  EXPECT_EQ(value_of(std::string(allowed - 1, '-') + "2"), 2.0);
}

TEST(SweepExpression, NonFiniteResultsAndDivisionByZeroAreRefused) {
  EXPECT_EQ(value_error("1 / (2 - 2)"), "division by zero (1 / 0)");
  EXPECT_EQ(value_error("0 / 0"), "division by zero (0 / 0)");
  EXPECT_EQ(value_error("exp(1000)"), "exp(1000) = inf is not a finite number");
  EXPECT_EQ(value_error("log(0)"), "log(0) = -inf is not a finite number");
  EXPECT_EQ(value_error("sqrt(x)", {-1.0}), "sqrt(-1) = nan is not a finite number");
  EXPECT_EQ(value_error("1e308 * 10"), "1e+308 * 10 = inf is not a finite number");
  EXPECT_EQ(value_error("(-8) ^ (1/3)"), "-8 ^ 0.3333333333333333 = nan is not a finite number");
  EXPECT_EQ(value_error("pow(10, 400)"), "pow(10, 400) = inf is not a finite number");
  // An intermediate overflow is an error even when a later min would hide it.
  EXPECT_EQ(value_error("min(exp(800), 1)"), "exp(800) = inf is not a finite number");
}

constexpr const char* kBase = "[base]\nd = 3\nn = 8\nhorizon = 0.2\nsave-every = 0.05\nthreads = 1\n";

TEST(SweepDerived, EachCaseGetsTheValueOfItsExpressionThroughTheOptionTable) {
  const SweepPlan plan = make_sweep(std::string(kBase) +
                                        "[axes]\nbeta = 0.1 1 4.5\n"
                                        "[derived]\ndt = 0.1 / max(sqrt(beta) * exp(beta - 0.5), 1)\n",
                                    "grid.ini");
  ASSERT_EQ(plan.derived.size(), 1u);
  EXPECT_EQ(plan.derived[0].name, "dt");
  EXPECT_EQ(plan.derived[0].line, 10u);  // kBase is 6 lines, then [axes], beta, [derived]
  ASSERT_EQ(plan.cases.size(), 3u);
  for (const SweepCase& c : plan.cases) {
    const double beta = std::stod(c.values[0]);
    const double expected = 0.1 / std::max(std::sqrt(beta) * std::exp(beta - 0.5), 1.0);
    const RunConfig cfg = resolved(c);
    EXPECT_EQ(cfg.dt, expected) << c.values[0];
    ASSERT_EQ(c.derived.size(), 1u);
    EXPECT_EQ(std::stod(c.derived[0]), expected);
    EXPECT_EQ(c.arguments.back(), "--dt=" + c.derived[0]);
    EXPECT_EQ(case_id(cfg), c.id);
  }
  EXPECT_EQ(plan.cases[0].derived[0], "0.1");  // under the cap: 0.1 exactly, shortest text
}

TEST(SweepDerived, VariablesTakeTheResolvedValueAndEarlierDerivedOptions) {
  // horizon from an axis, save-every from the derived horizon, replicas from the base n,
  // seed from run's default (0), pos-scale from a zipped axis.
  const SweepPlan plan = make_sweep(
      "[base]\nd = 3\nn = 8\nthreads = 1\n[axes]\nbeta = 1 2\n[zip]\npos-scale = 0.5 0.25\nprompts = 1 2\n"
      "[derived]\nhorizon = 2 * beta\nsave-every = horizon / 4\nreplicas = n / 2 + seed\n"
      "window = pos_scale * prompts\n",
      "grid.ini");
  ASSERT_EQ(plan.cases.size(), 4u);
  for (const SweepCase& c : plan.cases) {
    const RunConfig cfg = resolved(c);
    EXPECT_EQ(cfg.horizon, 2 * cfg.beta);
    EXPECT_EQ(cfg.save_every, cfg.horizon / 4);
    EXPECT_EQ(cfg.replicas, 4);
    EXPECT_EQ(cfg.pair_terms.window, cfg.pos_scale * static_cast<double>(cfg.prompts));
  }
  EXPECT_EQ(plan.cases[3].derived, (std::vector<std::string>{"4", "1", "4", "0.5"}));
  EXPECT_EQ(case_values_text(plan, plan.cases[3], " "),
            "beta=2 pos-scale=0.25 prompts=2 horizon=4 save-every=1 replicas=4 window=0.5");
}

TEST(SweepDerived, IntegerOptionsTakeIntegralValuesOnly) {
  const SweepPlan plan = make_sweep(
      std::string("[base]\nd = 3\nthreads = 1\n[axes]\nbeta = 1 2\n[derived]\nn = 2 ^ 5\nseed = -0 * beta\n"
                  "replicas = floor(beta * 2.5)\n"),
      "grid.ini");
  EXPECT_EQ(plan.cases[0].derived, (std::vector<std::string>{"32", "0", "2"}));
  EXPECT_EQ(plan.cases[1].derived, (std::vector<std::string>{"32", "0", "5"}));
  EXPECT_EQ(resolved(plan.cases[1]).n, 32);
  EXPECT_EQ(sweep_error("[base]\nd = 3\n[axes]\nn = 8 9\n[derived]\nreplicas = n / 2\n"),
            "grid.ini:6: derived replicas: --replicas takes an integer, the expression gives 4.5 in case 1 of 2 (n=9)");
  EXPECT_EQ(sweep_error("[base]\nd = 3\n[derived]\nseed = 2 ^ 63\n"),
            "grid.ini:4: derived seed: --seed takes an integer, the expression gives 9223372036854775808");
  // Integral, but run's own check refuses it: named as the derived value of its case.
  EXPECT_EQ(sweep_error("[base]\nd = 3\n[axes]\nbeta = 1 2\n[derived]\nn = 1 - beta\n"),
            "grid.ini:6: derived n = 0 in case 0 of 2 (beta=1): --n 0: must be an integer >= 1");
  EXPECT_EQ(sweep_error("[base]\nd = 3\n[axes]\nbeta = 2 1\n[derived]\ndt = 1 - beta\n"),
            "grid.ini:6: derived dt = -1 in case 0 of 2 (beta=2): --dt -1: must be > 0");
}

TEST(SweepDerived, BadDerivedLinesAreNamedWithFileLineAndKey) {
  const std::string base = "[base]\nd = 3\n[axes]\nbeta = 0 1\n[derived]\n";  // derived lines from 6
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"dt = 1e-3 * (", "grid.ini:6: derived dt: syntax error at column 9 of '1e-3 * (': the expression ends "
                        "where a number, a name or '(' is expected"},
      {"dt = bta", "grid.ini:6: derived dt: unknown variable 'bta' (variables are the numeric options of mfattn "
                   "run, with '-' written as '_', e.g. save_every; constants: pi, e)"},
      {"dt = kernel", "grid.ini:6: derived dt: variable kernel: --kernel takes text, not a number"},
      {"dt = deflate", "grid.ini:6: derived dt: variable deflate: --deflate is a switch (true / false), not a number"},
      {"dt = horizon / 100\nhorizon = 2",
       "grid.ini:6: derived dt: variable horizon: it is derived below (line 7): a derived option may use only "
       "the options derived above it"},
      {"dt = dt / 2", "grid.ini:6: derived dt: variable dt: it is the option being derived (a derived option may "
                      "use only the options derived above it)"},
      {"dt = 1 / beta", "grid.ini:6: derived dt: division by zero (1 / 0) in case 0 of 2 (beta=0)"},
      {"dt = log(beta)", "grid.ini:6: derived dt: log(0) = -inf is not a finite number in case 0 of 2 (beta=0)"},
      {"beta = 1", "grid.ini:6: derived beta: also an axis (keep one)"},
      {"d = 3", "grid.ini:6: derived d: also set in the base config (keep one)"},
      {"kernel = 1", "grid.ini:6: derived kernel: --kernel takes text, not a number; only numeric options can "
                     "be derived"},
      {"out = 1", "grid.ini:6: derived out: not allowed (the sweep sets --out itself)"},
      {"bogus = 1", "grid.ini:6: unknown key 'derived.bogus' (not an option of mfattn run)"},
      {"dt = 0.1\ndt = 0.2", "grid.ini:7: derived dt: given twice (first on line 6)"},
  };
  for (const auto& [lines, expected] : cases) EXPECT_EQ(sweep_error(base + lines + "\n"), expected) << lines;
  // A variable whose value is no number: run's message about it, as without [derived].
  EXPECT_EQ(
      sweep_error("[base]\nd = 3\n[axes]\nbeta = 2 x\n[derived]\ndt = 1 / beta\n"),
      "axis beta value x: --beta x: must be a number (inverse temperature, finite; negative repels)");
  EXPECT_EQ(sweep_error("[base]\nd = 3\neps-den = auto\n[derived]\ndt = eps_den + 1\n"),
            "grid.ini:5: derived dt: variable eps_den: --eps-den auto is not a number");
}

TEST(SweepDerived, IdsDependOnTheResolvedValuesOnly) {
  // A derived value equal to run's default is no parameter of the id; one equal to a base
  // value gives the id of that base value.
  const SweepPlan plain = make_sweep(std::string(kBase) + "[axes]\nbeta = 1 2\n", "a.ini");
  const SweepPlan as_default = make_sweep(std::string(kBase) + "[axes]\nbeta = 1 2\n[derived]\ndt = 0.01\n", "b.ini");
  const SweepPlan as_base = make_sweep(std::string(kBase) + "dt = 0.02\n[axes]\nbeta = 1 2\n", "c.ini");
  const SweepPlan derived = make_sweep(std::string(kBase) + "[axes]\nbeta = 1 2\n[derived]\ndt = 0.04 / 2\n", "d.ini");
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(as_default.cases[i].id, plain.cases[i].id);
    EXPECT_EQ(derived.cases[i].id, as_base.cases[i].id);
    EXPECT_NE(derived.cases[i].id, plain.cases[i].id);
  }
}

TEST(SweepZip, GroupsAdvanceTogetherAsOneFactorInFileOrder) {
  const SweepPlan plan = make_sweep(std::string(kBase) +
                                        "[axes]\nkernel = usa sa\n"
                                        "[zip]\nbeta = 1 2 3\nseed = 10 20 30\n"
                                        "[axes]\nprompts = 1 2\n"
                                        "[zip.geometry]\ngeometry = none rope\nrope-base = 100 1000\n",
                                    "grid.ini");
  ASSERT_EQ(plan.axes.size(), 6u);
  EXPECT_EQ(plan.factors, (std::vector<std::vector<std::size_t>>{{0}, {1, 2}, {3}, {4, 5}}));
  EXPECT_TRUE(plan.axes[1].zipped);
  EXPECT_EQ(plan.axes[1].zip_label, "");
  EXPECT_EQ(plan.axes[5].zip_label, "geometry");
  EXPECT_FALSE(plan.axes[3].zipped);
  ASSERT_EQ(plan.cases.size(), 2u * 3u * 2u * 2u);
  // The last factor fastest; the axes of a group side by side with equal positions.
  EXPECT_EQ(plan.cases[0].values, (std::vector<std::string>{"usa", "1", "10", "1", "none", "100"}));
  EXPECT_EQ(plan.cases[1].values, (std::vector<std::string>{"usa", "1", "10", "1", "rope", "1000"}));
  EXPECT_EQ(plan.cases[2].values, (std::vector<std::string>{"usa", "1", "10", "2", "none", "100"}));
  EXPECT_EQ(plan.cases[4].values, (std::vector<std::string>{"usa", "2", "20", "1", "none", "100"}));
  EXPECT_EQ(plan.cases[12].values, (std::vector<std::string>{"sa", "1", "10", "1", "none", "100"}));
  EXPECT_EQ(plan.cases[23].values, (std::vector<std::string>{"sa", "3", "30", "2", "rope", "1000"}));
  for (const SweepCase& c : plan.cases) {
    const RunConfig cfg = resolved(c);
    EXPECT_EQ(cfg.seed, static_cast<std::int64_t>(10 * cfg.beta));
    EXPECT_EQ(cfg.rope_base, cfg.geometry == "none" ? 100.0 : 1000.0);
  }
}

TEST(SweepZip, AGroupReopenedLaterKeepsThePlaceOfItsFirstKey) {
  const SweepPlan plan = make_sweep(std::string(kBase) +
                                        "[zip]\nbeta = 1 2\n[axes]\nkernel = usa sa\n[zip]\nseed = 5 6\n",
                                    "grid.ini");
  ASSERT_EQ(plan.axes.size(), 3u);
  EXPECT_EQ(plan.axes[0].name, "beta");
  EXPECT_EQ(plan.axes[1].name, "seed");
  EXPECT_EQ(plan.axes[2].name, "kernel");
  EXPECT_EQ(plan.factors, (std::vector<std::vector<std::size_t>>{{0, 1}, {2}}));
  EXPECT_EQ(plan.cases[1].values, (std::vector<std::string>{"1", "5", "sa"}));
  EXPECT_EQ(plan.cases[2].values, (std::vector<std::string>{"2", "6", "usa"}));
}

TEST(SweepZip, TheRulesOfAxesHoldForZippedAxes) {
  const std::string base = "[base]\nd = 3\nn = 8\n";
  EXPECT_EQ(sweep_error(base + "[zip]\nbeta = 1 2 3\nseed = 1 2\n"),
            "grid.ini:6: [zip]: axis seed has 2 values, axis beta 3 (the axes of a zip group advance together: "
            "give each as many values)");
  EXPECT_EQ(sweep_error(base + "[zip.steps]\nbeta = 1 2\ndt = 0.1\n"),
            "grid.ini:6: [zip.steps]: axis dt has 1 value, axis beta 2 (the axes of a zip group advance together: "
            "give each as many values)");
  EXPECT_EQ(sweep_error(base + "[zip]\nn = 8 9\n"), "axis n: also set in the base config (keep one)");
  EXPECT_EQ(sweep_error(base + "[axes]\nbeta = 1 2\n[zip]\nbeta = 1 2\nseed = 1 2\n"), "axis beta: given twice");
  EXPECT_EQ(sweep_error(base + "[zip.a]\nbeta = 1 2\n[zip.b]\nbeta = 1 2\n"), "axis beta: given twice");
  EXPECT_EQ(sweep_error(base + "[zip]\nbeta =\n"), "axis beta: no values");
  EXPECT_EQ(sweep_error(base + "[zip]\nout = a b\n"), "axis out: not allowed (the sweep sets --out itself)");
  EXPECT_EQ(sweep_error(base + "[zip]\nbogus = 1 2\n"),
            "axis bogus: not an option of mfattn run (grid.ini: unknown key 'zip.bogus')");
  EXPECT_EQ(make_sweep(base + "[zip]\nbeta = 1 1.0\nseed = 3 4\n", "grid.ini").cases.size(), 2u);
  // Equal tuples are the same case; a tuple that differs only in spelling too.
  EXPECT_NE(sweep_error(base + "[zip]\nbeta = 1 1.0\nseed = 3 3\n").find("axis beta value 1.0: the same case as value 1"),
            std::string::npos);
  EXPECT_NE(sweep_error(base + "[zip]\nbeta = 1 1\nseed = 3 3\n").find("two cases with the same id"), std::string::npos);
}

TEST(SweepZip, ZippingChangesNoCaseId) {
  // One zip group of two axes gives the cases of the diagonal of their product, with the
  // same ids; a one-axis group is a plain axis.
  const SweepPlan product = make_sweep(std::string(kBase) + "[axes]\nbeta = 1 2\nseed = 3 4\n", "a.ini");
  const SweepPlan zipped = make_sweep(std::string(kBase) + "[zip]\nbeta = 1 2\nseed = 3 4\n", "b.ini");
  const SweepPlan single = make_sweep(std::string(kBase) + "[zip.x]\nbeta = 1 2\n[zip.y]\nseed = 3 4\n", "c.ini");
  ASSERT_EQ(zipped.cases.size(), 2u);
  EXPECT_EQ(zipped.cases[0].id, product.cases[0].id);
  EXPECT_EQ(zipped.cases[1].id, product.cases[3].id);
  ASSERT_EQ(single.cases.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(single.cases[i].id, product.cases[i].id);
}

TEST(SweepDerived, TheManifestRecordsDerivedValuesBesideTheAxes) {
  const auto dir = testing::scratch_dir("sweep_derived_manifest");
  const SweepPlan plan =
      make_sweep(std::string(kBase) + "[zip]\nbeta = 1 2\nseed = 3 4\n[derived]\ndt = 0.01 * beta\n", "m.ini");
  write_manifest(plan, dir.string());
  std::ifstream csv(dir / "manifest.csv");
  std::string header, first;
  std::getline(csv, header);
  std::getline(csv, first);
  EXPECT_EQ(header, "index,case_id,file,status,beta,seed,dt,final_time\r");
  EXPECT_EQ(first, "0," + plan.cases[0].id + "," + plan.cases[0].id + ".h5,missing,1,3,0.01,\r");
  std::ifstream json_file(dir / "manifest.json");
  const std::string json((std::istreambuf_iterator<char>(json_file)), std::istreambuf_iterator<char>());
  EXPECT_NE(json.find("\"derived\": {\"dt\": \"0.01 * beta\"}"), std::string::npos) << json;
  EXPECT_NE(json.find("\"axes\": {\"beta\": \"2\", \"seed\": \"4\"}, \"derived\": {\"dt\": \"0.02\"}"),
            std::string::npos)
      << json;
  // Without [derived], no derived keys: the manifests of older sweep files stay as they were.
  write_manifest(make_sweep(std::string(kBase) + "[axes]\nbeta = 1 2\n", "m.ini"), dir.string());
  std::ifstream plain(dir / "manifest.json");
  const std::string plain_json((std::istreambuf_iterator<char>(plain)), std::istreambuf_iterator<char>());
  EXPECT_EQ(plain_json.find("\"derived\""), std::string::npos);
  EXPECT_NE(plain_json.find("\"axes\": {\"beta\": \"2\"}, \"final_time\""), std::string::npos) << plain_json;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mfattn
