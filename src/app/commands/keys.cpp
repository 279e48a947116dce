// mfattn keys (include/mfattn/app/keys.hpp): one query against n keys, the plan's statistics
// streamed key by key (kernels/attention_statistics.hpp) for every beta at once, samples
// spread over the threads.
#include "mfattn/app/keys.hpp"

#include <omp.h>

#include <boost/program_options.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include "kernels/attention_statistics.hpp"
#include "mfattn/app/command_errors.hpp"
#include "mfattn/app/config.hpp"
#include "mfattn/app/run.hpp"
#include "mfattn/core/init.hpp"
#include "mfattn/core/input_file.hpp"
#include "mfattn/core/number_text.hpp"
#include "mfattn/core/rng.hpp"
#include "mfattn/io/h5md.hpp"
#include "mfattn/io/weights_file.hpp"

namespace mfattn {

namespace {

constexpr std::uint64_t kMaxKeys = 1000000000000;  // 1e12: a sample's keys
constexpr std::size_t kMaxDim = kernels::PlanStatistics::kMaxDim;
constexpr std::size_t kMaxSamples = 1000000, kMaxListLength = 64;
// The records the report keeps (samples x n values x betas, a few hundred bytes each).
constexpr std::size_t kMaxRecords = 10000000;
constexpr std::uint64_t kQueryKey = std::uint64_t{1} << 62;  // the query's stream: no key's

KeysStatistics statistics_of(const kernels::PlanStatistics& plan, const double* query,
                             std::size_t d, std::size_t top) {
  KeysStatistics s;
  s.largest_weight = plan.largest_weight();
  s.entropy = plan.entropy();
  s.participation = plan.participation();
  double norm2 = 0.0, along = 0.0;
  for (std::size_t c = 0; c < d; ++c) {
    const double o = plan.output_component(c);
    norm2 += o * o;
    along += o * query[c];
  }
  s.output_norm = std::sqrt(norm2);
  s.output_along_query = along;
  for (std::size_t k = 0; k < top; ++k) s.top_weights.push_back(plan.top_weight(k));
  return s;
}

}  // namespace

KeysReport run_keys(const KeysOptions& options, const std::vector<double>& file_keys) {
  const std::size_t d = options.d, samples = options.samples;
  if (d < 2 || d > kMaxDim || samples < 1 || options.n.empty() || options.beta.empty() ||
      options.top < 1 || options.top > kernels::PlanStatistics::kMaxTop)
    throw std::invalid_argument("run_keys: options out of range");
  const bool from_file = !file_keys.empty();
  if (from_file && (options.n.size() != 1 || file_keys.size() != options.n[0] * d))
    throw std::invalid_argument("run_keys: the keys file's rows are the one n");
  KeysReport report;
  report.options = options;
  report.queries.assign(samples, std::vector<double>(d));
  report.samples.assign(samples, {});
  std::atomic<bool> failed{false};
  std::string failure;
  const int threads = options.threads > 0 ? options.threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (std::int64_t sample = 0; sample < std::int64_t(samples); ++sample) {
    if (failed) continue;
    try {
      const auto s = std::uint64_t(sample);
      std::vector<double>& query = report.queries[s];
      RandomStream query_stream(options.seed, std::uint64_t(StreamTag::Keys), s, kQueryKey);
      gaussian_unit(query_stream, query.data(), d);
      std::vector<kernels::PlanStatistics> plans(options.beta.size(),
                                                 kernels::PlanStatistics(d, options.top));
      std::vector<double> key(d);
      auto& rows = report.samples[s];
      std::uint64_t j = 0;
      for (std::uint64_t until : options.n) {
        for (; j < until; ++j) {
          const double* k = key.data();
          if (from_file) {
            k = file_keys.data() + j * d;
          } else {
            RandomStream stream(options.seed, std::uint64_t(StreamTag::Keys), s, j);
            gaussian_unit(stream, key.data(), d);
          }
          double score = 0.0;
          for (std::size_t c = 0; c < d; ++c) score += query[c] * k[c];
          for (std::size_t b = 0; b < plans.size(); ++b) plans[b].add(options.beta[b] * score, k);
        }
        std::vector<KeysStatistics> row;
        for (const kernels::PlanStatistics& plan : plans)
          row.push_back(statistics_of(plan, query.data(), d, options.top));
        rows.push_back(std::move(row));
      }
    } catch (const std::exception& error) {
#pragma omp critical(mfattn_keys_failure)
      if (!failed.exchange(true)) failure = error.what();
    }
  }
  if (failed) throw std::runtime_error(failure);
  return report;
}

namespace {

/// Mean and standard error (sample standard deviation / sqrt(S); 0 for one sample).
std::pair<double, double> mean_and_error(const std::vector<double>& values) {
  double mean = 0.0;
  for (double v : values) mean += v;
  mean /= double(values.size());
  if (values.size() < 2) return {mean, 0.0};
  double squares = 0.0;
  for (double v : values) squares += (v - mean) * (v - mean);
  return {mean, std::sqrt(squares / double(values.size() - 1) / double(values.size()))};
}

struct Statistic {
  const char* name;
  double (*of)(const KeysStatistics&);
};
constexpr Statistic kStatistics[] = {
    {"largest_weight", [](const KeysStatistics& s) { return s.largest_weight; }},
    {"entropy", [](const KeysStatistics& s) { return s.entropy; }},
    {"participation", [](const KeysStatistics& s) { return s.participation; }},
    {"output_norm", [](const KeysStatistics& s) { return s.output_norm; }},
    {"output_along_query", [](const KeysStatistics& s) { return s.output_along_query; }},
};

/// The values of one statistic over the samples at (n index, beta index).
std::vector<double> over_samples(const KeysReport& report, std::size_t ni, std::size_t bi,
                                 double (*of)(const KeysStatistics&)) {
  std::vector<double> values;
  for (const auto& sample : report.samples) values.push_back(of(sample[ni][bi]));
  return values;
}

void write_keys_file(const KeysReport& report, const std::string& command_line) {
  const KeysOptions& o = report.options;
  const std::size_t S = o.samples, N = o.n.size(), B = o.beta.size(), d = o.d, K = o.top;
  ArrayRecord record;
  record.arrays.push_back({"/keys/n", std::vector<double>(o.n.begin(), o.n.end())});
  record.arrays.push_back({"/keys/beta", o.beta});
  std::vector<double> queries;
  for (const auto& q : report.queries) queries.insert(queries.end(), q.begin(), q.end());
  record.arrays.push_back({"/keys/query", queries, {S, d}});
  for (const Statistic& statistic : kStatistics) {
    std::vector<double> all, means, errors;
    for (const auto& sample : report.samples)
      for (std::size_t ni = 0; ni < N; ++ni)
        for (std::size_t bi = 0; bi < B; ++bi) all.push_back(statistic.of(sample[ni][bi]));
    for (std::size_t ni = 0; ni < N; ++ni)
      for (std::size_t bi = 0; bi < B; ++bi) {
        const auto [mean, error] = mean_and_error(over_samples(report, ni, bi, statistic.of));
        means.push_back(mean);
        errors.push_back(error);
      }
    const std::string name = statistic.name;
    record.arrays.push_back({"/keys/samples/" + name, all, {S, N, B}});
    record.arrays.push_back({"/keys/mean/" + name, means, {N, B}});
    record.arrays.push_back({"/keys/standard_error/" + name, errors, {N, B}});
  }
  std::vector<double> top;
  for (const auto& sample : report.samples)
    for (std::size_t ni = 0; ni < N; ++ni)
      for (std::size_t bi = 0; bi < B; ++bi)
        top.insert(top.end(), sample[ni][bi].top_weights.begin(), sample[ni][bi].top_weights.end());
  record.arrays.push_back({"/keys/samples/top_weights", top, {S, N, B, K}});
  record.attributes_of = "/keys";
  record.attributes = {{"d", std::to_string(d)},
                       {"samples", std::to_string(S)},
                       {"seed", std::to_string(o.seed)},
                       {"top", std::to_string(K)},
                       {"keys", o.keys_file.empty() ? "uniform" : o.keys_file},
                       {"command_line", command_line}};
  write_array_file(o.out, record);
}

void print_table(const KeysReport& report, std::ostream& out) {
  const KeysOptions& o = report.options;
  out << "| n | beta | largest weight | entropy | participation | |o| | <o, q> |\n"
      << "| --- | --- | --- | --- | --- | --- | --- |\n";
  for (std::size_t ni = 0; ni < o.n.size(); ++ni)
    for (std::size_t bi = 0; bi < o.beta.size(); ++bi) {
      out << "| " << o.n[ni] << " | " << format_number(o.beta[bi]) << " |";
      for (const Statistic& statistic : kStatistics) {
        const auto [mean, error] = mean_and_error(over_samples(report, ni, bi, statistic.of));
        out << " " << format_significant(mean, 6) << " +- " << format_significant(error, 2) << " |";
      }
      out << "\n";
    }
}

std::uint64_t key_count(const std::string& option, double value) {
  if (!(value >= 1 && value <= double(kMaxKeys) && std::floor(value) == value))
    throw UsageError(option + " " + format_number(value) + ": expected whole numbers in 1..1e12");
  return std::uint64_t(value);
}

}  // namespace

std::string keys_usage() {
  return "usage: mfattn keys --d D --n LIST --beta LIST [--samples S] [--seed K] [--top K]\n"
         "                   [--keys FILE [--normalize-keys]] [--threads T] [--quiet] --out FILE.h5 [--overwrite]\n"
         "  one query against n keys uniform on S^{d-1}: the statistics of P_j = exp(beta <q, k_j>) / Z\n"
         "  (largest weight, the top K weights, entropy, participation 1 / sum P_j^2, the output\n"
         "  o = sum P_j k_j's norm and <o, q>) over S samples, their means and standard errors\n"
         "  --d D            the dimension, 2..64 (3)\n"
         "  --n LIST         key counts, comma separated, 1..1e12 each (1e8 is fine: the keys are streamed)\n"
         "  --beta LIST      inverse temperatures, comma separated, finite (negative too)\n"
         "  --samples S      samples (a query and its keys each), 1..1000000 (16)\n"
         "  --seed K         the seed of the queries and keys, an integer >= 0 (0)\n"
         "  --top K          the K largest weights kept, 1..16 (4)\n"
         "  --keys FILE      the keys: rows of d numbers of norm 1, the same for every sample (n: its rows)\n"
         "  --normalize-keys normalise the rows of --keys\n"
         "  --threads T      threads, each taking whole samples (0: every core)\n"
         "  --quiet          no table\n"
         "  --out FILE.h5    the statistics of every sample, their means and standard errors\n"
         "  --overwrite      replace an existing --out\n";
}

int keys_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& /*err*/) {
  namespace po = boost::program_options;
  KeysOptions o;
  std::string n_text, beta_text;
  std::int64_t d = 3, samples = 16, top = 4, threads = 0;
  std::string seed_text = "0";
  po::options_description table("mfattn keys");
  table.add_options()("d", po::value(&d)->default_value(3), "the dimension, 2..64")(
      "n", po::value(&n_text), "key counts, comma separated, 1..1e12 each")(
      "beta", po::value(&beta_text), "inverse temperatures, comma separated, finite")(
      "samples", po::value(&samples)->default_value(16), "samples, 1..1000000")(
      "seed", po::value(&seed_text)->default_value("0"), "an integer >= 0")(
      "top", po::value(&top)->default_value(4), "the largest weights kept, 1..16")(
      "keys", po::value(&o.keys_file), "a file of rows of d numbers")(
      "normalize-keys", po::bool_switch(&o.normalize), "normalise the rows of --keys")(
      "threads", po::value(&threads)->default_value(0), "threads, >= 0 (0: every core)")(
      "quiet", po::bool_switch(&o.quiet), "no table")("out", po::value(&o.out), "FILE.h5")(
      "overwrite", po::bool_switch(&o.overwrite), "replace an existing --out");
  po::variables_map vm;
  const std::vector<std::string> operands = parse_command_options(args, table, vm);
  if (!operands.empty())
    throw UsageError("unexpected word '" + operands.front() + "' (keys takes options only)");
  if (d < 2 || d > std::int64_t(kMaxDim))
    throw UsageError("--d " + std::to_string(d) + ": expected an integer in 2..64");
  o.d = std::size_t(d);
  if (samples < 1 || samples > std::int64_t(kMaxSamples))
    throw UsageError("--samples " + std::to_string(samples) +
                     ": expected an integer in 1..1000000");
  o.samples = std::size_t(samples);
  const auto records = [&] { return o.samples * o.n.size() * o.beta.size(); };
  if (top < 1 || top > std::int64_t(kernels::PlanStatistics::kMaxTop))
    throw UsageError("--top " + std::to_string(top) + ": expected an integer in 1..16");
  o.top = std::size_t(top);
  if (threads < 0 || threads > 4096)
    throw UsageError("--threads " + std::to_string(threads) + ": expected an integer in 0..4096");
  o.threads = int(threads);
  const char* seed_end = seed_text.data() + seed_text.size();
  const auto [seed_at, seed_error] = std::from_chars(seed_text.data(), seed_end, o.seed);
  if (seed_error != std::errc() || seed_at != seed_end)
    throw UsageError("--seed " + seed_text + ": expected an integer in 0..18446744073709551615");
  if (beta_text.empty())
    throw UsageError("--beta: required (inverse temperatures, comma separated)");
  if (!parse_number_list(beta_text, o.beta) || o.beta.size() > kMaxListLength)
    throw UsageError("--beta " + beta_text + ": expected 1 to 64 finite numbers, comma separated");
  if (o.normalize && o.keys_file.empty()) throw UsageError("--normalize-keys: needs --keys FILE");
  std::vector<double> file_keys;
  if (!o.keys_file.empty()) {
    if (!n_text.empty())
      throw UsageError("--n " + n_text + ": not with --keys (n is the file's row count)");
    std::size_t rows = 0;
    try {
      check_input_file(o.keys_file);
      file_keys = read_text_rows(o.keys_file, o.d, rows);
    } catch (const std::exception& error) {
      throw UsageError("--keys " + o.keys_file + ": " + error.what());
    }
    if (rows == 0) throw UsageError("--keys " + o.keys_file + ": no rows");
    for (std::size_t r = 0; r < rows; ++r) {
      double* row = file_keys.data() + r * o.d;
      double norm2 = 0.0;
      for (std::size_t c = 0; c < o.d; ++c) norm2 += row[c] * row[c];
      const double norm = std::sqrt(norm2);
      if (o.normalize && !(norm > 0.0 && std::isfinite(norm))) {
        throw UsageError("--keys " + o.keys_file + ": row " + std::to_string(r + 1) +
                         " is zero and cannot be normalised");
      } else if (o.normalize) {
        for (std::size_t c = 0; c < o.d; ++c) row[c] /= norm;
      } else if (!(std::fabs(norm - 1.0) <= 1e-10)) {
        throw UsageError("--keys " + o.keys_file + ": row " + std::to_string(r + 1) + " has norm " +
                         format_number(norm) + ", not 1 (tolerance 1e-10); pass --normalize-keys");
      }
    }
    o.n = {rows};
  } else {
    if (n_text.empty())
      throw UsageError("--n: required (key counts, comma separated), or --keys FILE");
    std::vector<double> counts;
    if (!parse_number_list(n_text, counts) || counts.size() > kMaxListLength)
      throw UsageError("--n " + n_text +
                       ": expected 1 to 64 whole numbers in 1..1e12, comma separated");
    o.n.clear();
    for (double count : counts) o.n.push_back(key_count("--n", count));
    std::sort(o.n.begin(), o.n.end());
    o.n.erase(std::unique(o.n.begin(), o.n.end()), o.n.end());
  }
  if (records() > kMaxRecords)
    throw UsageError(
        "--samples " + std::to_string(o.samples) + ": " + std::to_string(records()) +
        " records (samples x n values x betas), more than the 10000000 a report keeps");
  if (o.out.empty()) throw UsageError("--out: required (FILE.h5)");
  namespace fs = std::filesystem;
  std::error_code ignored;
  if (fs::exists(o.out, ignored) && !o.overwrite)
    throw OutputExists(o.out + " exists (give --overwrite to replace it)");
  const fs::path folder = fs::path(o.out).parent_path();
  if (!folder.empty() && !fs::is_directory(folder, ignored))
    throw UsageError("--out " + o.out + ": the folder " + folder.string() + " does not exist");
  const KeysReport report = run_keys(o, file_keys);
  std::string command_line = "mfattn keys";
  for (const std::string& word : args) command_line += " " + word;
  write_keys_file(report, command_line);
  if (!o.quiet) print_table(report, out);
  out.flush();
  return kExitOk;
}

}  // namespace mfattn
