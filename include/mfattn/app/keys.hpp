#pragma once
/// \file keys.hpp
/// `mfattn keys`: one query against n keys (docs/cli.md, "mfattn keys"). For each of S samples
/// a query q and n keys k_j, iid uniform on S^{d-1} (or the keys of a file, the same for every
/// sample), and for each beta of a list the plan P_j = exp(beta <q, k_j>) / Z, whose
/// statistics (kernels/attention_statistics.hpp) are reported with their mean and standard
/// error over the samples:
///   largest weight max_j P_j, the k largest weights, the entropy -sum_j P_j log P_j, the
///   participation 1 / sum_j P_j^2, the output o = sum_j P_j k_j's norm |o| and its
///   component <o, q> along the query.
/// The keys are streamed (O(1) memory a sample, n = 1e8 and more); the statistics at every n of
/// the list are those of the first n keys of one stream (each sample's keys for the largest n),
/// so the n values share their keys within a sample and each n's estimate is its own samples'.
/// Key j of sample s is drawn from the counter-based stream (seed, Keys, s, j), the query from
/// (seed, Keys, s, 2^62): the same numbers for any thread count and any list of n.
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace mfattn {

struct KeysOptions {
  std::size_t d = 3;
  std::vector<std::uint64_t> n = {
      1000};  ///< increasing; one value, the file's rows, with keys_file
  std::vector<double> beta = {1.0};
  std::size_t samples = 16;
  std::uint64_t seed = 0;
  std::size_t top = 4;    ///< the k largest weights, 1..16
  std::string keys_file;  ///< rows of d numbers, each of norm 1 (or normalised: normalize)
  bool normalize = false;
  int threads = 0;  ///< 0: every core
  std::string out;
  bool overwrite = false;
  bool quiet = false;
};

/// The statistics of one sample at one n and one beta.
struct KeysStatistics {
  double largest_weight = 0.0, entropy = 0.0, participation = 0.0, output_norm = 0.0,
         output_along_query = 0.0;
  std::vector<double> top_weights;  ///< the `top` largest weights, decreasing
};

struct KeysReport {
  KeysOptions options;
  std::vector<std::vector<double>> queries;  ///< [samples][d]
  /// [sample][n index][beta index]
  std::vector<std::vector<std::vector<KeysStatistics>>> samples;
};

/// Draws and streams every sample (threads take samples). Throws std::invalid_argument for
/// options out of range (keys_command validates them first, naming the option).
KeysReport run_keys(const KeysOptions& options, const std::vector<double>& file_keys = {});

/// The usage text of `mfattn keys --help`.
std::string keys_usage();

/// Parses, validates (one line, exit 2, nothing written), runs, writes --out whole or not at
/// all and prints the table of means and standard errors (unless --quiet).
int keys_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace mfattn
