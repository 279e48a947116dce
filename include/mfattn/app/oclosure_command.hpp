#pragma once
/// \file oclosure_command.hpp
/// `mfattn oclosure [--tokens N] [--zeros Z] [--dim D] [--seed S] [--json]`: the two
/// experiments of seeds 000/001 (docs/oattention.md).
///
/// Ablation: N active carriers (i.i.d. N(0, 1) entries, per-token external signals of the
/// same law) go through each host (oclosure.hpp, two blocks, seeded weights), once alone
/// and once with Z zero tokens inserted between them (zero k, k = 0..Z-1, before active
/// token floor((k + 1) N / (Z + 1)); the zero tokens get signals of their own). Reported
/// per stage: the insertion shift max_{existing i, c} |out'_ic - out_ic| (L-infinity over
/// the existing tokens' outputs), and max |out'| over the zero tokens' final outputs.
///
/// Precision: OAttention (D_head = D_value = D, s_ij = <q_i, k_j> / sqrt(D), tau = 1,
/// eps_den = 1e-12, weights with N(0, 1/D) entries) of the same N + Z carriers, inputs drawn
/// in double and rounded to float32 (so float32 holds them exactly), evaluated with
/// T = float64, float32, float16 and bfloat16 inputs (the last two accumulated in float) and
/// compared with the float64 literal formula (oattention_direct) on
///   error            the float32-exact inputs (input rounding and arithmetic together)
///   arithmetic error the inputs as rounded to T (arithmetic alone)
/// relative error = error / max |reference|. Also: whether every zero token's row is exactly
/// 0, and whether the active rows are bit-identical to an evaluation without the zeros.
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace mfattn {

struct OClosureOptions {
  std::size_t tokens = 32;  ///< N, 1..2048
  std::size_t zeros = 32;   ///< Z, 1..2048 (the batch padded to twice its length)
  std::size_t dim = 16;     ///< D, 2..256
  std::uint64_t seed = 0;
  bool json = false;
};

struct AblationRow {
  std::string host;
  std::string components;
  bool has_front_end = false;
  double front_end_shift = 0.0;  ///< meaningful when has_front_end
  double block1_shift = 0.0;
  double output_shift = 0.0;     ///< after block 2 (the host's output)
  double zero_output_max = 0.0;  ///< max |output| of the inserted zero tokens
};

struct PrecisionRow {
  std::string inputs, accumulate;
  double error = 0.0, relative_error = 0.0, arithmetic_error = 0.0;
  bool null_rows_zero = false;
  bool insertion_bit_identical = false;
};

struct OClosureReport {
  OClosureOptions options;
  std::vector<AblationRow> ablation;
  std::vector<PrecisionRow> precision;
  double precision_max_score = 0.0;   ///< max |s_ij| over the active pairs (float64)
  double precision_max_output = 0.0;  ///< max |OAttention| of the float64 reference
};

/// Both experiments (deterministic for given options).
OClosureReport run_oclosure_experiment(const OClosureOptions& options);

/// Augmented order of N active tokens with Z zeros: entry a is the active token index, or -1
/// for a zero token (see the file comment for the placement).
std::vector<long> insertion_layout(std::size_t tokens, std::size_t zeros);

void write_oclosure_text(const OClosureReport& report, std::ostream& out);
void write_oclosure_json(const OClosureReport& report, std::ostream& out);

/// The usage text of `mfattn oclosure --help`.
std::string oclosure_usage();

/// Parses the options and prints the report; bad options: one line on err, kExitUsage.
int oclosure_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace mfattn
