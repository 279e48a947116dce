#include "mfattn/core/init.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

#include "mfattn/core/input_file.hpp"
#include "mfattn/core/number_text.hpp"
#include "mfattn/core/rng.hpp"

namespace mfattn {

namespace {

constexpr std::uint64_t kTag = static_cast<std::uint64_t>(StreamTag::InitialState);
// Keys of the whole-replica draws sit far above any token index, so they never share a stream
// with a token.
constexpr std::uint64_t kCentreKeyBase = std::uint64_t{1} << 40;
constexpr std::uint64_t kRotationKey = std::uint64_t{1} << 41;
constexpr double kFileNormTolerance = 1e-10;

double norm(const double* x, std::size_t d) {
  double s = 0.0;
  for (std::size_t j = 0; j < d; ++j) s += x[j] * x[j];
  return std::sqrt(s);
}

// out = normalize(centre + spread g), g ~ N(0, I_d) from rs; redrawn only if the sum is
// exactly 0.
void point_near(RandomStream& rs, const double* centre, double spread, double* out, std::size_t d) {
  for (;;) {
    for (std::size_t j = 0; j < d; ++j) out[j] = centre[j] + spread * rs.normal();
    const double nr = norm(out, d);
    if (nr > 0.0) {
      for (std::size_t j = 0; j < d; ++j) out[j] /= nr;
      return;
    }
  }
}

void fill_uniform(const InitSpec& spec, State& st, std::size_t r, bool hemisphere) {
  for (std::size_t i = 0; i < st.n; ++i) {
    RandomStream rs(spec.seed, kTag, r, i);
    double* x = st.token(r, i);
    gaussian_unit(rs, x, st.d);
    if (hemisphere) x[st.d - 1] = std::fabs(x[st.d - 1]);
  }
}

void fill_clustered(const InitSpec& spec, State& st, std::size_t r) {
  if (spec.clusters < 1)
    throw std::invalid_argument("--init-clusters must be >= 1 (got 0)");
  if (!std::isfinite(spec.spread) || spec.spread < 0.0)
    throw std::invalid_argument("--init-spread must be finite and >= 0 (got " + format_number(spec.spread) +
                                ")");
  const std::size_t d = st.d;
  const std::size_t used = std::min(spec.clusters, st.n);
  std::vector<double> centres(used * d);
  for (std::size_t k = 0; k < used; ++k) {
    RandomStream rs(spec.seed, kTag, r, kCentreKeyBase + k);
    gaussian_unit(rs, centres.data() + k * d, d);
  }
  for (std::size_t i = 0; i < st.n; ++i) {
    RandomStream rs(spec.seed, kTag, r, i);
    point_near(rs, centres.data() + (i % spec.clusters) * d, spec.spread, st.token(r, i), d);
  }
}

void fill_equiangular(const InitSpec& spec, State& st, std::size_t r) {
  const std::size_t n = st.n, d = st.d;
  if (d < n)
    throw std::invalid_argument("--init equiangular needs d >= n (n = " + std::to_string(n) +
                                ", d = " + std::to_string(d) + ")");
  const double rho = spec.rho;
  // 1 + (n-1) rho >= 0 is the Gram matrix being positive semidefinite; a rounding-level
  // undershoot (rho typed as -0.3333333333333333 for n = 4) is accepted and clamped.
  const double gram_min = 1.0 + static_cast<double>(n - 1) * rho;
  if (!std::isfinite(rho) || rho >= 1.0 || (n > 1 && gram_min < -1e-12)) {
    const std::string lo = n > 1 ? format_number(-1.0 / static_cast<double>(n - 1)) : "-inf";
    throw std::invalid_argument("--init-rho must be in [-1/(n-1), 1) = [" + lo + ", 1) for n = " +
                                std::to_string(n) + " (got " + format_number(rho) + ")");
  }
  if (n == 0) return;
  const double nd = static_cast<double>(n);
  const double a = std::sqrt(1.0 - rho);
  // |x_i|^2 = a^2 + 2 a t + n t^2 = 1 and <x_i, x_j> = 2 a t + n t^2 = rho.
  const double t = (std::sqrt(std::max(0.0, 1.0 - rho + nd * rho)) - a) / nd;

  // Haar rotation: Gram-Schmidt on the columns of a Gaussian d x d matrix is its QR with
  // diag(R) > 0, which makes Q Haar-distributed. Each column is orthogonalised twice
  // ("twice is enough") so Q is orthogonal to rounding level.
  RandomStream rs(spec.seed, kTag, r, kRotationKey);
  std::vector<double> q(d * d);  // column k at q[k * d]
  for (std::size_t k = 0; k < d; ++k) {
    double* qk = q.data() + k * d;
    for (;;) {
      for (std::size_t j = 0; j < d; ++j) qk[j] = rs.normal();
      for (int pass = 0; pass < 2; ++pass)
        for (std::size_t l = 0; l < k; ++l) {
          const double* ql = q.data() + l * d;
          double c = 0.0;
          for (std::size_t j = 0; j < d; ++j) c += ql[j] * qk[j];
          for (std::size_t j = 0; j < d; ++j) qk[j] -= c * ql[j];
        }
      const double nr = norm(qk, d);
      if (nr > 1e-8) {  // redraw a (measure-zero) dependent column from the same stream
        for (std::size_t j = 0; j < d; ++j) qk[j] /= nr;
        break;
      }
    }
  }

  // x_i = Q (a e_i + t sum_k e_k) = a Q_{:,i} + t sum_{k<n} Q_{:,k}.
  std::vector<double> col_sum(d, 0.0);
  for (std::size_t k = 0; k < n; ++k)
    for (std::size_t j = 0; j < d; ++j) col_sum[j] += q[k * d + j];
  for (std::size_t i = 0; i < n; ++i) {
    double* x = st.token(r, i);
    for (std::size_t j = 0; j < d; ++j) x[j] = a * q[i * d + j] + t * col_sum[j];
  }
}

void fill_file(const InitSpec& spec, State& st, std::size_t r,
               const std::string& option = "--init-file") {
  const std::size_t n = st.n, d = st.d;
  // n rows for every replica, or R n rows: replica r's from row r n on.
  const bool per_replica = st.replicas > 1 && spec.file_rows.size() == st.replicas * n * d;
  if (spec.file_rows.size() != n * d && !per_replica) {
    const std::size_t sz = spec.file_rows.size();
    const std::string replicas = st.replicas > 1 ? " (or R n = " + std::to_string(st.replicas * n) +
                                                       ", one set a replica)"
                                                 : "";
    throw std::invalid_argument(
        sz % d == 0
            ? option + " has " + std::to_string(sz / d) + " rows of d = " + std::to_string(d) +
                  " numbers, but n = " + std::to_string(n) + replicas + " are needed"
            : option + " has " + std::to_string(sz) +
                  " numbers, not a whole number of rows of d = " + std::to_string(d));
  }
  const std::size_t first_row = per_replica ? r * n : 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double* row = spec.file_rows.data() + (first_row + i) * d;
    const std::string where = option + " row " + std::to_string(first_row + i + 1);
    for (std::size_t j = 0; j < d; ++j)
      if (!std::isfinite(row[j])) throw std::invalid_argument(where + " has a non-finite entry");
    const double nr = row_norm(row, d);
    double* x = st.token(r, i);
    if (spec.euclidean && !spec.normalize_file_rows) {
      for (std::size_t j = 0; j < d; ++j) x[j] = row[j];
    } else if (spec.normalize_file_rows) {
      if (!(nr > 0.0)) throw std::invalid_argument(where + " is zero and cannot be normalised");
      for (std::size_t j = 0; j < d; ++j) x[j] = row[j] / nr;
    } else {
      if (!(std::fabs(nr - 1.0) <= kFileNormTolerance))
        throw std::invalid_argument(where + " has norm " + format_number(nr) +
                                    ", not 1 (tolerance 1e-10); pass --normalize-init to "
                                    "normalise the rows");
      for (std::size_t j = 0; j < d; ++j) x[j] = row[j];
    }
  }
}

}  // namespace

void gaussian_unit(RandomStream& rs, double* out, std::size_t d) {
  for (;;) {
    for (std::size_t j = 0; j < d; ++j) out[j] = rs.normal();
    const double nr = norm(out, d);
    if (nr > 0.0) {
      for (std::size_t j = 0; j < d; ++j) out[j] /= nr;
      return;
    }
  }
}

void initialize_replica(const InitSpec& spec, State& state, std::size_t replica) {
  if (replica >= state.replicas)
    throw std::invalid_argument("initialize_replica: replica " + std::to_string(replica) +
                                " out of range (replicas = " + std::to_string(state.replicas) +
                                ")");
  if (state.d < 1) throw std::invalid_argument("initialize_replica: d must be >= 1");
  if (state.x.size() != state.replicas * state.n * state.d)
    throw std::invalid_argument("initialize_replica: state storage does not match R*n*d");
  switch (spec.kind) {
    case InitKind::Uniform: fill_uniform(spec, state, replica, false); break;
    case InitKind::Hemisphere: fill_uniform(spec, state, replica, true); break;
    case InitKind::Clustered: fill_clustered(spec, state, replica); break;
    case InitKind::Equiangular: fill_equiangular(spec, state, replica); break;
    case InitKind::File: fill_file(spec, state, replica); break;
  }
}

void initialize_state(const InitSpec& spec, State& state) {
  for (std::size_t r = 0; r < state.replicas; ++r) initialize_replica(spec, state, r);
}

std::vector<double> place_prefix(const PrefixSpec& spec) {
  const std::size_t count = spec.prompts * spec.per_prompt, d = spec.d;
  State prefix(1, count, d);
  constexpr auto kPrefixTag = static_cast<std::uint64_t>(StreamTag::Prefix);
  switch (spec.placement) {
    case PrefixPlacement::Random:
      for (std::size_t p = 0; p < count; ++p) {
        RandomStream rs(spec.seed, kPrefixTag, p);
        gaussian_unit(rs, prefix.token(0, p), d);
      }
      break;
    case PrefixPlacement::Clustered: {
      if (!std::isfinite(spec.spread) || spec.spread < 0.0)
        throw std::invalid_argument("--prefix-spread must be finite and >= 0 (got " +
                                    format_number(spec.spread) + ")");
      std::vector<double> centre(d);
      for (std::size_t g = 0; g < spec.prompts; ++g) {
        RandomStream centre_stream(spec.seed, kPrefixTag, kCentreKeyBase + g);
        gaussian_unit(centre_stream, centre.data(), d);
        for (std::size_t t = 0; t < spec.per_prompt; ++t) {
          const std::size_t p = g * spec.per_prompt + t;
          RandomStream rs(spec.seed, kPrefixTag, p);
          point_near(rs, centre.data(), spec.spread, prefix.token(0, p), d);
        }
      }
      break;
    }
    case PrefixPlacement::File: {
      InitSpec rows;
      rows.kind = InitKind::File;
      rows.file_rows = spec.file_rows;
      rows.normalize_file_rows = spec.normalize_file_rows;
      fill_file(rows, prefix, 0, "--prefix-init");
      break;
    }
  }
  return prefix.x;
}

double row_norm(const double* row, std::size_t d) {
  const double plain = norm(row, d);
  if (std::isfinite(plain) && plain > 0.0) return plain;
  // The sum of squares overflowed (entries near 1e308) or underflowed (near 1e-170): the same
  // norm taken with the row scaled by its largest entry, which cannot.
  double largest = 0.0;
  for (std::size_t j = 0; j < d; ++j) largest = std::max(largest, std::fabs(row[j]));
  if (!(largest > 0.0) || !std::isfinite(largest)) return plain;
  double sum = 0.0;
  for (std::size_t j = 0; j < d; ++j) sum += (row[j] / largest) * (row[j] / largest);
  return largest * std::sqrt(sum);
}

std::string parse_number_line(std::string_view line, std::vector<double>& values) {
  values.clear();
  // Built by appending: GCC 12 gives a false -Wrestrict on "'" + std::string(...).
  auto quoted = [](std::string_view t) {
    std::string q(1, '\'');
    q.append(t).push_back('\'');
    return q;
  };
  auto is_space = [](char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
  };
  std::string_view s = line;
  if (const auto hash = s.find('#'); hash != std::string_view::npos) s = s.substr(0, hash);
  std::size_t pos = 0;
  bool after_comma = false;  // a comma needs a number on each side: "1,,2" is an error
  while (pos < s.size()) {
    const char c = s[pos];
    if (is_space(c)) {
      ++pos;
    } else if (c == ',') {
      if (values.empty() || after_comma) return "empty field between commas";
      after_comma = true;
      ++pos;
    } else {
      std::size_t end = pos;
      while (end < s.size() && !is_space(s[end]) && s[end] != ',') ++end;
      std::string_view tok = s.substr(pos, end - pos);
      std::string_view num = tok.size() > 1 && tok[0] == '+' ? tok.substr(1) : tok;
      double v = 0.0;
      const auto res = std::from_chars(num.data(), num.data() + num.size(), v);
      if (res.ec == std::errc::result_out_of_range) return quoted(tok) + " is out of the range of double";
      if (res.ec != std::errc() || res.ptr != num.data() + num.size()) return quoted(tok) + " is not a number";
      if (!std::isfinite(v)) return quoted(tok) + " is not finite";
      values.push_back(v);
      after_comma = false;
      pos = end;
    }
  }
  if (after_comma) return "trailing comma";
  return "";
}

std::vector<double> read_text_rows(const std::string& path, std::size_t d, std::size_t& rows_out) {
  rows_out = 0;
  const bool any_width = d == kRowsOfAnyWidth;
  std::istringstream in(read_input_file(path, kMaxNumbersFileBytes));
  std::vector<double> out;
  std::string line;
  std::size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    const auto fail = [&](const std::string& what) {
      throw std::invalid_argument(path + ":" + std::to_string(lineno) + " (row " +
                                  std::to_string(rows_out + 1) + "): " + what);
    };
    std::vector<double> values;
    if (const std::string error = parse_number_line(line, values); !error.empty()) fail(error);
    const std::size_t count = values.size();
    out.insert(out.end(), values.begin(), values.end());
    if (count == 0) continue;  // blank or comment-only line
    if (any_width && rows_out == 0) d = count;
    if (count != d)
      fail(any_width ? "expected " + std::to_string(d) + " numbers, as on the first row, found " + std::to_string(count)
                     : "expected d = " + std::to_string(d) + " numbers, found " + std::to_string(count));
    ++rows_out;
  }
  if (rows_out == 0) throw std::invalid_argument("'" + path + "' contains no rows");
  return out;
}

}  // namespace mfattn
