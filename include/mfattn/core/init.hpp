#pragma once
/// \file init.hpp
/// Initial token contents on S^{d-1}. Random draws come from RandomStream(seed,
/// StreamTag::InitialState, replica, key), so they are reproducible on any machine and the
/// contents of token i never depend on how many tokens follow it (except Equiangular).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mfattn/core/rng.hpp"
#include "mfattn/core/state.hpp"

namespace mfattn {

/// How the initial contents are placed.
///  - Uniform:     x_i = g_i / |g_i|, g_i ~ N(0, I_d) from stream (seed, InitialState, r, i).
///  - Hemisphere:  as Uniform, then x_{i,d} <- |x_{i,d}| (all tokens in x_d >= 0).
///  - Clustered:   centres c_k = h_k / |h_k|, h_k ~ N(0, I_d) from stream
///                 (seed, InitialState, r, 2^40 + k); x_i = normalize(c_{i mod K} + spread g_i).
///  - Equiangular: <x_i, x_j> = rho for all i != j (needs d >= n): x_i = Q (sqrt(1-rho) e_i +
///                 t (e_1 + ... + e_n)), t = (sqrt(1 - rho + n rho) - sqrt(1-rho)) / n, with
///                 Q Haar-orthogonal from stream (seed, InitialState, r, 2^41).
///  - File:        given rows, identical in every replica.
enum class InitKind { Uniform, Hemisphere, Clustered, Equiangular, File };

struct InitSpec {
  InitKind kind = InitKind::Uniform;
  std::uint64_t seed = 0;
  std::size_t clusters = 3;  ///< Clustered: number of centres K >= 1
  double spread = 0.1;       ///< Clustered: Gaussian spread around each centre before normalising
  double rho = 0.5;          ///< Equiangular: common pairwise inner product, in [-1/(n-1), 1)
  std::vector<double> file_rows{};  ///< File: n*d numbers already read (row-major), validated here
  bool normalize_file_rows = false;  ///< File: x_i <- x_i / |x_i| instead of requiring |x_i| = 1
  bool euclidean = false;  ///< File: states in R^d (docs/model.md section 2c): rows taken as they are
};

/// out = g / |g| with g ~ N(0, I_d) drawn from `stream`: a uniform point of S^{d-1}. A zero
/// draw (probability ~0) is redrawn from the same stream, which keeps the result a
/// deterministic function of the stream (the same bits everywhere: rng.hpp).
void gaussian_unit(RandomStream& stream, double* out, std::size_t d);

/// Fills replica r of `state` (state.n tokens, state.d dims). Token i's contents depend only on
/// (seed, r, i) and the spec, never on state.n, so appending tokens (e.g. null tokens) leaves the
/// first ones unchanged. Exception: Equiangular is a whole-configuration construction, its tokens
/// depend on n. File rows must satisfy | |x_i| - 1 | <= 1e-10 unless normalize_file_rows.
/// Throws std::invalid_argument with a clear message on impossible specs.
void initialize_replica(const InitSpec& spec, State& state, std::size_t replica);

/// initialize_replica for every replica r = 0 .. state.replicas - 1.
void initialize_state(const InitSpec& spec, State& state);

/// Placement of the frozen prefix tokens: prompts x per_prompt rows, prompt g's tokens
/// g * per_prompt .. (g + 1) * per_prompt - 1. Draws come from RandomStream(seed,
/// StreamTag::Prefix, key), never from the streams of the moving tokens.
///  - Random:    y_p = h_p / |h_p|, h_p ~ N(0, I_d) from key p.
///  - Clustered: prompt g has a centre c_g (key 2^40 + g, uniform on the sphere) and
///               y_p = normalize(c_g + spread h_p): one cluster per prompt.
///  - File:      P rows of d numbers, unit norm to 1e-10 unless normalize_file_rows.
enum class PrefixPlacement { Random, Clustered, File };

struct PrefixSpec {
  PrefixPlacement placement = PrefixPlacement::Random;
  std::uint64_t seed = 0;
  std::size_t prompts = 1, per_prompt = 0, d = 3;
  double spread = 0.05;
  std::vector<double> file_rows{};
  bool normalize_file_rows = false;
};

/// The prefix contents (P = prompts * per_prompt rows of d, row-major). Throws
/// std::invalid_argument naming the option on bad input.
std::vector<double> place_prefix(const PrefixSpec& spec);

/// |row|, also for rows whose sum of squares overflows or underflows a double (1e308 stays
/// 1e308, not inf): rows read from files are normalised with it. Equal to the plain
/// sqrt(sum of squares) to the last bit wherever that is finite and positive.
double row_norm(const double* row, std::size_t d);

/// Parses one text line of numbers separated by whitespace or commas ('#' starts a comment, a
/// leading '+' is allowed) into values; returns "" or what is wrong with the line.
std::string parse_number_line(std::string_view line, std::vector<double>& values);

/// Reads a text file of rows of d numbers separated by whitespace or commas ('#' starts a
/// comment, blank lines are skipped); returns them row-major and sets rows_out to the row count.
/// d = kRowsOfAnyWidth takes the first row's width for every row (a grid's values one per
/// line, on one line, or as the rows of NumPy's savetxt of a 2-D array).
/// Throws std::invalid_argument naming the file and the first bad line/row, InputFileRefused
/// (the reason alone: the caller names the option and the file) for a file that is not a
/// readable regular file of at most kMaxNumbersFileBytes.
inline constexpr std::size_t kRowsOfAnyWidth = 0;
std::vector<double> read_text_rows(const std::string& path, std::size_t d, std::size_t& rows_out);

}  // namespace mfattn
