// `mfattn oclosure`: the zero-insertion ablation and the OAttention precision table
// (include/mfattn/app/oclosure_command.hpp, docs/oattention.md).
#include "mfattn/app/oclosure_command.hpp"

#include <boost/program_options.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <ostream>
#include <sstream>

#include "io/json_text.hpp"
#include "mfattn/app/config.hpp"
#include "mfattn/oattn/oattention.hpp"
#include "mfattn/oattn/oclosure.hpp"
#include "mfattn/app/run.hpp"

namespace mfattn {

namespace {

using oattn::Rows;

constexpr std::size_t kMaxTokens = 2048, kMaxZeros = 2048, kMaxDim = 256;

/// rows of `source` for the active entries of layout, zero rows (or `zero_rows`' rows in
/// order) for the inserted ones.
Rows<double> augmented(const Rows<double>& source, const std::vector<long>& layout,
                       const Rows<double>* zero_rows) {
  Rows<double> out = Rows<double>::Zero(static_cast<Eigen::Index>(layout.size()), source.cols());
  Eigen::Index next_zero = 0;
  for (std::size_t a = 0; a < layout.size(); ++a) {
    if (layout[a] >= 0) out.row(a) = source.row(layout[a]);
    else if (zero_rows) out.row(a) = zero_rows->row(next_zero++);
  }
  return out;
}

/// max over active tokens of |aug - base| (rows of aug picked through layout).
template <class T>
double active_shift(const Rows<T>& base, const Rows<T>& aug, const std::vector<long>& layout) {
  double worst = 0.0;
  for (std::size_t a = 0; a < layout.size(); ++a)
    if (layout[a] >= 0)
      for (Eigen::Index c = 0; c < base.cols(); ++c)
        worst = std::max(worst, std::fabs(static_cast<double>(aug(a, c)) - static_cast<double>(base(layout[a], c))));
  return worst;
}

double zero_rows_max(const Rows<double>& aug, const std::vector<long>& layout) {
  double worst = 0.0;
  for (std::size_t a = 0; a < layout.size(); ++a)
    if (layout[a] < 0) worst = std::max(worst, aug.row(a).cwiseAbs().maxCoeff());
  return worst;
}

std::vector<AblationRow> ablation(const OClosureOptions& o) {
  using namespace oclosure;
  const auto layout = insertion_layout(o.tokens, o.zeros);
  const Rows<double> carriers = random_rows(o.tokens, o.dim, o.seed, kCarriersKey);
  const Rows<double> signals = random_rows(o.tokens, o.dim, o.seed, kSignalsKey);
  const Rows<double> zero_signals = random_rows(o.zeros, o.dim, o.seed, kSignalsKey, o.tokens);
  const Rows<double> carriers_aug = augmented(carriers, layout, nullptr);
  const Rows<double> signals_aug = augmented(signals, layout, &zero_signals);
  const HostWeights<double> weights = random_host_weights(o.dim, 2, o.seed);
  const Settings settings;
  struct Host {
    const char* name;
    const char* components;
    BlockKind kind;
    FrontEnd front;
  };
  const Host hosts[] = {
      {"standard", "softmax attention, FFN, affine LayerNorm", BlockKind::Standard, FrontEnd::None},
      {"attention-only", "OAttention, FFN, affine LayerNorm", BlockKind::AttentionOnly, FrontEnd::None},
      {"O-blocks", "OAttention, OFFN, ONorm", BlockKind::O, FrontEnd::None},
      {"OTransformer", "OStandardize, OInject, then two O-blocks", BlockKind::O, FrontEnd::O},
      {"O-blocks, standard front end", "Standardize, Inject, then two O-blocks", BlockKind::O, FrontEnd::Standard},
  };
  std::vector<AblationRow> rows;
  for (const Host& h : hosts) {
    std::vector<Rows<double>> base, aug;
    host_forward(h.kind, h.front, carriers, signals, weights, settings, &base);
    host_forward(h.kind, h.front, carriers_aug, signals_aug, weights, settings, &aug);
    AblationRow row;
    row.host = h.name;
    row.components = h.components;
    row.has_front_end = h.front != FrontEnd::None;
    const std::size_t first_block = row.has_front_end ? 1 : 0;
    if (row.has_front_end) row.front_end_shift = active_shift(base[0], aug[0], layout);
    row.block1_shift = active_shift(base[first_block], aug[first_block], layout);
    row.output_shift = active_shift(base.back(), aug.back(), layout);
    row.zero_output_max = zero_rows_max(aug.back(), layout);
    rows.push_back(row);
  }
  return rows;
}

/// The literal formula in A (oattention_direct) on carriers x with weights w: the float64
/// reference, or the "direct evaluation in the same precision" for A = float.
template <class A>
Rows<A> direct_reference(const Rows<A>& x, const oattn::AttentionWeights<A>& w,
                         const oattn::OAttentionOptions& options) {
  const std::size_t n = static_cast<std::size_t>(x.rows()), dim = static_cast<std::size_t>(x.cols());
  std::vector<A> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = oattn::presence(x.data() + i * dim, dim, options.tau);
  const Rows<A> q = oattn::project(x, w.w_q), k = oattn::project(x, w.w_k), v = oattn::project(x, w.w_v);
  Rows<A> out(x.rows(), w.w_v.rows());
  const oattn::QkvView<A> view{n, n, static_cast<std::size_t>(q.cols()), static_cast<std::size_t>(v.cols()),
                               q.data(), k.data(), v.data(), p.data(), p.data()};
  oattn::oattention_direct(view, oattn::Visibility::full(), options, out.data());
  return out;
}

template <class T>
Rows<double> to_double(const Rows<T>& m) {
  Rows<double> out(m.rows(), m.cols());
  for (Eigen::Index e = 0; e < m.size(); ++e) out.data()[e] = static_cast<double>(m.data()[e]);
  return out;
}

template <class T>
Rows<T> from_double(const Rows<double>& m) {
  Rows<T> out(m.rows(), m.cols());
  for (Eigen::Index e = 0; e < m.size(); ++e) out.data()[e] = static_cast<T>(m.data()[e]);
  return out;
}

template <class T>
PrecisionRow precision_row(const char* inputs, const char* accumulate, const Rows<double>& x_aug,
                           const Rows<double>& x_base, const oattn::AttentionWeights<double>& w,
                           const std::vector<long>& layout, const Rows<double>& reference,
                           const oattn::OAttentionOptions& options,
                           bool output_in_float32 = false) {
  // Inputs in T (rounded from the float32-exact values), computed in accumulator_t<T>.
  const oattn::AttentionWeights<T> wt{from_double<T>(w.w_q), from_double<T>(w.w_k), from_double<T>(w.w_v)};
  const Rows<T> xt_aug = from_double<T>(x_aug), xt_base = from_double<T>(x_base);
  const auto out_aug = oattn::oattention(xt_aug, wt, oattn::Visibility::full(), options);
  const auto out_base = oattn::oattention(xt_base, wt, oattn::Visibility::full(), options);
  // Float32 storage with float64 accumulation hands its result back in float32.
  const Rows<double> got = output_in_float32 ? to_double(from_double<float>(to_double(out_aug)))
                                             : to_double(out_aug);
  // The same formula in float64 on the inputs as rounded to T: arithmetic error alone.
  const oattn::AttentionWeights<double> wr{to_double(wt.w_q), to_double(wt.w_k), to_double(wt.w_v)};
  const Rows<double> reference_rounded = direct_reference(to_double(xt_aug), wr, options);
  using A = oattn::accumulator_t<T>;
  PrecisionRow row;
  row.inputs = inputs;
  row.accumulate = accumulate;
  row.error = (got - reference).cwiseAbs().maxCoeff();
  const double scale = reference.cwiseAbs().maxCoeff();
  row.relative_error = scale > 0.0 ? row.error / scale : 0.0;
  row.arithmetic_error = (got - reference_rounded).cwiseAbs().maxCoeff();
  row.null_rows_zero = true;
  row.insertion_bit_identical = true;
  for (std::size_t a = 0; a < layout.size(); ++a) {
    const A* r = out_aug.data() + a * out_aug.cols();
    if (layout[a] < 0) {
      for (Eigen::Index c = 0; c < out_aug.cols(); ++c)
        row.null_rows_zero = row.null_rows_zero && r[c] == A(0) && !std::signbit(r[c]);
    } else {
      row.insertion_bit_identical =
          row.insertion_bit_identical &&
          std::memcmp(r, out_base.data() + layout[a] * out_base.cols(), sizeof(A) * out_base.cols()) == 0;
    }
  }
  return row;
}

std::vector<PrecisionRow> precision(const OClosureOptions& o, double& max_score, double& max_output) {
  using namespace oclosure;
  const auto layout = insertion_layout(o.tokens, o.zeros);
  // Drawn in double, rounded to float32: every format below starts from float32-exact values.
  const Rows<double> base = to_double(from_double<float>(random_rows(o.tokens, o.dim, o.seed, kPrecisionCarriersKey)));
  const double wscale = 1.0 / std::sqrt(static_cast<double>(o.dim));
  auto weight = [&](std::uint64_t which) {
    return to_double(from_double<float>(random_rows(o.dim, o.dim, o.seed, kPrecisionKey, which << 32, wscale)));
  };
  const oattn::AttentionWeights<double> w{weight(0), weight(1), weight(2)};
  const Rows<double> aug = augmented(base, layout, nullptr);
  const oattn::OAttentionOptions options;  // tau = 1, eps_den = 1e-12, c = 1/sqrt(D)
  const Rows<double> reference = direct_reference(aug, w, options);
  // The score range and the output scale, which set the float32 error (docs/oattention.md).
  const Rows<double> q = oattn::project(base, w.w_q), k = oattn::project(base, w.w_k);
  max_score = (q * k.transpose()).cwiseAbs().maxCoeff() * oattn::effective_score_scale(options, o.dim);
  max_output = reference.cwiseAbs().maxCoeff();
  return {precision_row<double>("float64", "float64", aug, base, w, layout, reference, options),
          precision_row<float>("float32", "float32", aug, base, w, layout, reference, options),
          // float32 in and out, the sums in float64: as the 16-bit formats accumulate in float.
          precision_row<double>("float32", "float64", aug, base, w, layout, reference, options, true),
          precision_row<Eigen::half>("float16", "float32", aug, base, w, layout, reference, options),
          precision_row<Eigen::bfloat16>("bfloat16", "float32", aug, base, w, layout, reference, options)};
}

std::string number(double v, const char* format = "%.3g") {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, v);
  return buffer;
}

/// Strict unsigned integer in [low, high]; nullopt otherwise.
std::optional<std::uint64_t> parse_unsigned(const std::string& text, std::uint64_t low, std::uint64_t high) {
  if (text.empty() || text.front() == '-' || text.front() == '+' || std::isspace(static_cast<unsigned char>(text.front())))
    return std::nullopt;
  std::size_t used = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &used, 10);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size() || value < low || value > high) return std::nullopt;
  return value;
}

}  // namespace

std::vector<long> insertion_layout(std::size_t tokens, std::size_t zeros) {
  std::vector<long> layout;
  layout.reserve(tokens + zeros);
  std::size_t k = 0;
  for (std::size_t t = 0; t <= tokens; ++t) {
    while (k < zeros && (k + 1) * tokens / (zeros + 1) == t) {
      layout.push_back(-1);
      ++k;
    }
    if (t < tokens) layout.push_back(static_cast<long>(t));
  }
  return layout;
}

OClosureReport run_oclosure_experiment(const OClosureOptions& options) {
  OClosureReport report;
  report.options = options;
  report.ablation = ablation(options);
  report.precision = precision(options, report.precision_max_score, report.precision_max_output);
  return report;
}

void write_oclosure_text(const OClosureReport& r, std::ostream& out) {
  const auto& o = r.options;
  out << "mfattn oclosure: N = " << o.tokens << " active tokens, Z = " << o.zeros << " zero tokens inserted, D = "
      << o.dim << ", seed " << o.seed << "\n"
      << "tau = 1, eps_den = 1e-12, s_ij = <q_i, k_j> / sqrt(D), FFN width 4D, eps_norm = eps_std = 1e-5\n\n"
      << "Zero-token insertion, two blocks: L-inf change of the " << o.tokens
      << " existing tokens' outputs after each stage\n\n"
      << "| host | components | front end | block 1 | block 2 (output) | zero tokens' largest output |\n"
      << "|---|---|---|---|---|---|\n";
  for (const auto& a : r.ablation)
    out << "| " << a.host << " | " << a.components << " | "
        << (a.has_front_end ? number(a.front_end_shift) : std::string("-")) << " | " << number(a.block1_shift)
        << " | " << number(a.output_shift) << " | " << number(a.zero_output_max) << " |\n";
  out << "\nOAttention precision: L-inf error against a float64 direct evaluation (" << o.tokens + o.zeros
      << " tokens, " << o.zeros << " of them zero; max |s_ij| = " << number(r.precision_max_score)
      << ", max |output| = " << number(r.precision_max_output) << ")\n\n"
      << "| inputs | accumulate | L-inf error | relative | arithmetic only | zero rows exactly 0 | insertion bit-identical |\n"
      << "|---|---|---|---|---|---|---|\n";
  for (const auto& p : r.precision)
    out << "| " << p.inputs << " | " << p.accumulate << " | " << number(p.error, "%.3e") << " | "
        << number(p.relative_error, "%.3e") << " | " << number(p.arithmetic_error, "%.3e") << " | "
        << (p.null_rows_zero ? "yes" : "no") << " | " << (p.insertion_bit_identical ? "yes" : "no") << " |\n";
}

void write_oclosure_json(const OClosureReport& r, std::ostream& out) {
  const auto& o = r.options;
  out << "{\"tokens\": " << o.tokens << ", \"zeros\": " << o.zeros << ", \"dim\": " << o.dim
      << ", \"seed\": " << o.seed << ", \"tau\": 1, \"eps_den\": 1e-12, \"score_scale\": "
      << json::number(1.0 / std::sqrt(static_cast<double>(o.dim)))
      << ", \"precision_max_score\": " << json::number(r.precision_max_score)
      << ", \"precision_max_output\": " << json::number(r.precision_max_output) << ",\n \"ablation\": [";
  for (std::size_t k = 0; k < r.ablation.size(); ++k) {
    const auto& a = r.ablation[k];
    out << (k ? ",\n  " : "\n  ") << "{\"host\": " << json::quoted(a.host)
        << ", \"components\": " << json::quoted(a.components)
        << ", \"front_end_shift\": " << (a.has_front_end ? json::number(a.front_end_shift) : "null")
        << ", \"block1_shift\": " << json::number(a.block1_shift)
        << ", \"output_shift\": " << json::number(a.output_shift)
        << ", \"zero_token_output_max\": " << json::number(a.zero_output_max) << "}";
  }
  out << "],\n \"precision\": [";
  for (std::size_t k = 0; k < r.precision.size(); ++k) {
    const auto& p = r.precision[k];
    out << (k ? ",\n  " : "\n  ") << "{\"inputs\": " << json::quoted(p.inputs)
        << ", \"accumulate\": " << json::quoted(p.accumulate) << ", \"linf_error\": " << json::number(p.error)
        << ", \"relative_error\": " << json::number(p.relative_error)
        << ", \"arithmetic_error\": " << json::number(p.arithmetic_error)
        << ", \"zero_rows_exactly_zero\": " << (p.null_rows_zero ? "true" : "false")
        << ", \"insertion_bit_identical\": " << (p.insertion_bit_identical ? "true" : "false") << "}";
  }
  out << "]}\n";
}

std::string oclosure_usage() {
  std::ostringstream s;
  s << "usage: mfattn oclosure [--tokens N] [--zeros Z] [--dim D] [--seed S] [--json]\n"
    << "  zero-token insertion ablation (standard, attention-only, O-blocks, OTransformer) and\n"
    << "  OAttention precision (float64, float32, float16 and bfloat16 inputs) against float64\n"
    << "  --tokens N   active tokens, 1.." << kMaxTokens << " (32)\n"
    << "  --zeros Z    zero tokens inserted, 1.." << kMaxZeros << " (32)\n"
    << "  --dim D      carrier dimension, 2.." << kMaxDim << " (16)\n"
    << "  --seed S     seed of weights, carriers and signals, an integer >= 0 (0)\n"
    << "  --json       one JSON object instead of tables\n";
  return s.str();
}

int oclosure_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& /*err*/) {
  OClosureOptions options;
  // The numeric options, one table: name, range, what a refusal says, and where the value goes.
  struct Numeric {
    const char* name;
    std::uint64_t low, high;
    const char* accepted;
    void (*store)(OClosureOptions&, std::uint64_t);
  };
  const Numeric numerics[] = {
      {"--tokens", 1, kMaxTokens, "an integer in 1..2048",
       [](OClosureOptions& o, std::uint64_t v) { o.tokens = static_cast<std::size_t>(v); }},
      {"--zeros", 1, kMaxZeros, "an integer in 1..2048",
       [](OClosureOptions& o, std::uint64_t v) { o.zeros = static_cast<std::size_t>(v); }},
      {"--dim", 2, kMaxDim, "an integer in 2..256",
       [](OClosureOptions& o, std::uint64_t v) { o.dim = static_cast<std::size_t>(v); }},
      {"--seed", 0, std::numeric_limits<std::uint64_t>::max(), "an integer in 0..18446744073709551615",
       [](OClosureOptions& o, std::uint64_t v) { o.seed = v; }},
  };
  namespace po = boost::program_options;
  po::options_description table("mfattn oclosure");
  std::vector<std::string> values(std::size(numerics));
  for (std::size_t k = 0; k < std::size(numerics); ++k)
    table.add_options()(numerics[k].name + 2, po::value(&values[k]), numerics[k].accepted);
  table.add_options()("json", po::bool_switch(&options.json), "one JSON object instead of tables");
  po::variables_map vm;
  const std::vector<std::string> operands = parse_command_options(args, table, vm);
  if (!operands.empty()) throw UsageError("unexpected word '" + operands.front() + "' (oclosure takes options only)");
  for (std::size_t k = 0; k < std::size(numerics); ++k) {
    const Numeric& numeric = numerics[k];
    if (!vm.count(numeric.name + 2)) continue;
    const auto parsed = parse_unsigned(values[k], numeric.low, numeric.high);
    if (!parsed) throw UsageError(std::string(numeric.name) + " " + values[k] + ": expected " + numeric.accepted);
    numeric.store(options, *parsed);
  }
  const OClosureReport report = run_oclosure_experiment(options);
  if (options.json) write_oclosure_json(report, out);
  else write_oclosure_text(report, out);
  out.flush();
  return kExitOk;
}

}  // namespace mfattn
