// The model builder: a validated RunConfig (its choices, config.hpp) -> the Model of the run
// (matrices per layer, presences, positions, prefix tokens, the gauge, the pair terms), the
// token labels the file records, and the initial state. Everything the run reads of the
// options after validation goes through here once; the run driver (run.cpp) never reads them
// for the physics.
#include "mfattn/app/model_builder.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>
#include <stdexcept>

#include "mfattn/core/gauge.hpp"
#include "mfattn/io/h5md.hpp"
#include "mfattn/io/weights_file.hpp"
#include "mfattn/core/init.hpp"
#include "mfattn/core/input_file.hpp"
#include "mfattn/core/number_text.hpp"
#include "mfattn/core/rng.hpp"
#include "mfattn/app/run_choices.hpp"
#include "mfattn/backends/backend.hpp"

namespace mfattn {
namespace {

/// A d x d matrix of independent N(0, 1) entries, row by row, from stream.
Matrix standard_gaussian(RandomStream& stream, std::size_t d) {
  Matrix a(d, d);
  for (std::size_t r = 0; r < d; ++r)
    for (std::size_t c = 0; c < d; ++c) a(r, c) = stream.normal();
  return a;
}

/// A random preset's matrix from stream (docs/model.md, "Random matrices").
Matrix random_matrix(MatrixPreset kind, std::size_t d, RandomStream& stream) {
  const double size = double(d);
  const Matrix a = standard_gaussian(stream, d);
  switch (kind) {
    case MatrixPreset::Gaussian: return a / std::sqrt(size);  // entries N(0, 1/d)
    // GOE: symmetric, off-diagonal variance 1/d, diagonal variance 2/d.
    case MatrixPreset::Goe: return (a + a.transpose()) / std::sqrt(2.0 * size);
    case MatrixPreset::GaussianProduct: {
      const Matrix b = standard_gaussian(stream, d);
      return a * b / std::sqrt(size);
    }
    case MatrixPreset::WignerUnit: {
      // (G + G^T) / sqrt(2) off the diagonal, G_aa on it: every entry has variance 1.
      Matrix w = (a + a.transpose()) / std::sqrt(2.0);
      for (std::size_t r = 0; r < d; ++r) w(r, r) = a(r, r);
      return w;
    }
    case MatrixPreset::GoeUnit: return (a + a.transpose()) / std::sqrt(2.0);
    case MatrixPreset::Wishart: return a * a.transpose() / std::sqrt(size);
    default: throw std::logic_error("random_matrix: not a random preset");
  }
}

/// The stream of matrix `which` (0: Q, 1: K, 2: V) of one layer and matrix set: layer 0 of
/// the shared set is the stream (seed, Matrices, which) that runs without these options
/// have always used.
RandomStream matrix_stream(std::uint64_t seed, std::uint64_t which, std::uint64_t layer,
                           std::uint64_t set_key) {
  return RandomStream(seed, static_cast<std::uint64_t>(StreamTag::Matrices), which + 4 * layer, set_key);
}

/// Q, K or V (option "q", "k" or "v") from identity, a random preset or, without one, the
/// file value names; V's products of Q and K are made by the caller.
Matrix matrix_option(const std::string& option, std::optional<MatrixPreset> preset, const std::string& value,
                     std::size_t d, RandomStream stream, bool& identity) {
  identity = preset == MatrixPreset::Identity;
  if (identity) return Matrix::Identity(d, d);
  if (preset == MatrixPreset::Zero) return Matrix::Zero(d, d);
  if (preset) return random_matrix(*preset, d, stream);
  std::size_t rows = 0;
  std::vector<double> numbers;
  try {
    numbers = read_text_rows(value, d, rows);
  } catch (const std::exception& e) {
    throw UsageError("--" + option + " " + value + ": " + e.what());
  }
  if (rows != d)
    throw UsageError("--" + option + " " + value + ": needs d = " + std::to_string(d) +
                     " rows of d numbers, found " + std::to_string(rows) + " rows");
  Matrix m(d, d);
  std::copy(numbers.begin(), numbers.end(), m.data());
  return m;
}

/// The d x d matrices of --q, --k, --v for one layer and matrix set, and which are the identity.
struct DrawnMatrices {
  Matrix q, k, v;
  bool q_identity = true, k_identity = true, v_identity = true;
};

/// The Q, K, V of one layer and matrix set (set_key 0: the shared set, r + 1: replica r's).
DrawnMatrices draw_matrices(const RunConfig& cfg, std::uint64_t layer, std::uint64_t set_key) {
  const auto d = static_cast<std::size_t>(cfg.d);
  const auto seed = static_cast<std::uint64_t>(cfg.seed);
  DrawnMatrices m;
  m.q = matrix_option(std::string(kQueryOption.option), cfg.choices.q, cfg.q, d, matrix_stream(seed, 0, layer, set_key), m.q_identity);
  m.k = matrix_option(std::string(kKeyOption.option), cfg.choices.k, cfg.k, d, matrix_stream(seed, 1, layer, set_key), m.k_identity);
  const std::optional<MatrixPreset> v = cfg.choices.v;
  if (v == MatrixPreset::PlusQk || v == MatrixPreset::MinusQk) {
    m.v = m.q.transpose() * m.k;
    if (v == MatrixPreset::MinusQk) m.v = -m.v;
    m.v_identity = false;
  } else if (v == MatrixPreset::PlusForm || v == MatrixPreset::MinusForm) {
    // The reference code's V = +-B / c applied to row vectors, B = K^T Q its bilinear form:
    // as a matrix acting on columns, V = +-B^T / c = +-(Q^T K)^T / c, with c = 1 for the
    // identity form, sqrt(d + 1) for goe-unit, sqrt(d) otherwise.
    const double c = m.q_identity && m.k_identity ? 1.0
                     : cfg.choices.k == MatrixPreset::GoeUnit ? std::sqrt(double(d) + 1.0)
                                                                         : std::sqrt(double(d));
    m.v = (m.q.transpose() * m.k).transpose() / c;
    if (v == MatrixPreset::MinusForm) m.v = -m.v;
    m.v_identity = false;
  } else {
    m.v = matrix_option(std::string(kValueOption.option), v, cfg.v, d, matrix_stream(seed, 2, layer, set_key), m.v_identity);
  }
  return m;
}

std::size_t head_dim_of(const RunConfig& cfg) {
  return static_cast<std::size_t>(cfg.layer.head_dim ? cfg.layer.head_dim : cfg.d);
}

/// Head h of a layer from the presets of --q, --k, --v (docs/model.md section 2b): the d x d
/// matrices of today's law from the head's own streams (head 0: the streams of the one-head
/// model), Q_h and K_h their first r rows times sqrt(d / r) (so that a Gaussian entry has
/// variance 1 / r), and identity the rows h r, ..., h r + r - 1 of I (mod d): the heads split
/// the coordinates. V_h is the d x d preset (identity: I), or the products of Q_h and K_h.
AttentionHead preset_head(const RunConfig& cfg, std::uint64_t layer, std::uint64_t set_key, std::size_t h) {
  const auto d = static_cast<std::size_t>(cfg.d);
  const std::size_t r = head_dim_of(cfg);
  const DrawnMatrices full = draw_matrices(cfg, layer, h == 0 ? set_key : set_key | (std::uint64_t(h) << 40));
  auto head_rows = [&](const Matrix& m, bool identity) {
    Matrix rows = Matrix::Zero(r, d);
    if (identity) {
      for (std::size_t a = 0; a < r; ++a) rows(a, (h * r + a) % d) = 1.0;
      return rows;
    }
    rows = m.topRows(r);
    if (r != d) rows *= std::sqrt(double(d) / double(r));
    return rows;
  };
  AttentionHead head;
  head.query = head_rows(full.q, full.q_identity);
  head.key = head_rows(full.k, full.k_identity);
  const std::optional<MatrixPreset> v = cfg.choices.v;
  const Matrix form = head.query.transpose() * head.key;  // Q_h^T K_h, d x d
  if (v == MatrixPreset::PlusQk || v == MatrixPreset::MinusQk) {
    head.value = v == MatrixPreset::MinusQk ? Matrix(-form) : form;
  } else if (v == MatrixPreset::PlusForm || v == MatrixPreset::MinusForm) {
    const double c = full.q_identity && full.k_identity ? 1.0
                     : cfg.choices.k == MatrixPreset::GoeUnit ? std::sqrt(double(d) + 1.0)
                                                              : std::sqrt(double(d));
    head.value = form.transpose() / c;
    if (v == MatrixPreset::MinusForm) head.value = -head.value;
  } else {
    head.value = full.v_identity ? Matrix(Matrix::Identity(d, d)) : full.v;
  }
  head.full_value = head.value;
  return head;
}

/// The feed-forward term's preset (docs/model.md section 2b): W1 entries N(0, 1/d), W2
/// entries N(0, 1/W), zero biases, from the layer's and set's stream 3 (Q, K, V take 0 to 2).
FeedForward preset_feed_forward(const RunConfig& cfg, std::uint64_t layer, std::uint64_t set_key) {
  const auto d = static_cast<std::size_t>(cfg.d), width = static_cast<std::size_t>(cfg.layer.mlp_width);
  RandomStream stream = matrix_stream(static_cast<std::uint64_t>(cfg.seed), 3, layer, set_key);
  FeedForward mlp;
  mlp.w1.resize(width, d);
  mlp.w2.resize(d, width);
  for (std::size_t a = 0; a < width; ++a)
    for (std::size_t b = 0; b < d; ++b) mlp.w1(a, b) = stream.normal() / std::sqrt(double(d));
  for (std::size_t a = 0; a < d; ++a)
    for (std::size_t b = 0; b < width; ++b) mlp.w2(a, b) = stream.normal() / std::sqrt(double(width));
  mlp.b1 = Vector::Zero(width);
  mlp.b2 = Vector::Zero(d);
  return mlp;
}

/// Layer `layer` of a --weights file (validated: shapes, one layer or a leading axis of
/// choices.weight_layers; the last layer also serves a frame at its end time).
void weights_file_layer(const RunConfig& cfg, std::size_t layer, AttentionMatrices& m) {
  // Read once by validate() (RunChoices::weights); a RunConfig filled in code reads it here.
  const std::shared_ptr<const WeightsFile> read =
      cfg.choices.weights          ? cfg.choices.weights
      : cfg.weights_in_memory      ? cfg.weights_in_memory
                                   : std::make_shared<const WeightsFile>(read_weights_file(cfg.weights));
  const WeightsFile& file = *read;
  const auto d = static_cast<std::size_t>(cfg.d), heads = static_cast<std::size_t>(cfg.layer.heads);
  const std::size_t r = head_dim_of(cfg), rv = value_dim_of(file, r);
  const std::size_t l = std::min(layer, std::max<std::size_t>(cfg.choices.weight_layers, 1) - 1);
  // The numbers of layer l of an array whose per-layer size is `size`.
  auto of_layer = [l](const WeightArray& array, std::size_t size) {
    const std::size_t first = array.values.size() > size ? l * size : 0;
    return array.values.data() + first;
  };
  auto matrix = [](const double* numbers, std::size_t rows, std::size_t cols) {
    Matrix out(rows, cols);
    std::copy(numbers, numbers + rows * cols, out.data());
    return out;
  };
  if (file.query.present()) {
    m.heads.clear();
    const Matrix output = matrix(of_layer(file.output, d * heads * rv), d, heads * rv);
    for (std::size_t h = 0; h < heads; ++h) {
      AttentionHead head;
      head.query = matrix(of_layer(file.query, heads * r * d) + h * r * d, r, d);
      head.key = matrix(of_layer(file.key, heads * r * d) + h * r * d, r, d);
      head.value = matrix(of_layer(file.value, heads * rv * d) + h * rv * d, rv, d);
      head.output = output.middleCols(Eigen::Index(h * rv), Eigen::Index(rv));
      head.full_value = head.output * head.value;
      m.heads.push_back(std::move(head));
    }
  }
  if (file.w1.present()) {
    const auto width = static_cast<std::size_t>(cfg.layer.mlp_width);
    m.mlp.w1 = matrix(of_layer(file.w1, width * d), width, d);
    m.mlp.b1 = Eigen::Map<const Vector>(of_layer(file.b1, width), Eigen::Index(width));
    m.mlp.w2 = matrix(of_layer(file.w2, d * width), d, width);
    m.mlp.b2 = Eigen::Map<const Vector>(of_layer(file.b2, d), Eigen::Index(d));
  }
}

}  // namespace

namespace {
/// The weights of one layer and matrix set (set_key 0: the shared set, r + 1: replica r's):
/// the one head's Q, K, V, or a whole layer's heads and feed-forward term.
AttentionMatrices layer_set(const RunConfig& cfg, std::size_t layer, std::uint64_t set_key) {
  AttentionMatrices m;
  if (!is_whole_layer(cfg)) {
    DrawnMatrices drawn = draw_matrices(cfg, layer, set_key);
    m.heads.push_back(square_head(std::move(drawn.q), drawn.q_identity, std::move(drawn.k), drawn.k_identity,
                                  std::move(drawn.v), drawn.v_identity));
    return m;
  }
  for (std::int64_t h = 0; h < cfg.layer.heads; ++h)
    m.heads.push_back(preset_head(cfg, layer, set_key, static_cast<std::size_t>(h)));
  if (cfg.layer.mlp_width > 0) {
    m.mlp = preset_feed_forward(cfg, layer, set_key);
    m.mlp.activation = cfg.choices.mlp_activation;
  }
  if (!cfg.weights.empty()) {
    try {
      weights_file_layer(cfg, layer, m);
    } catch (const std::invalid_argument& e) {
      throw UsageError("--weights " + cfg.weights + ": " + e.what());
    }
  }
  return m;
}
}  // namespace

std::vector<AttentionMatrices> layer_matrices(const RunConfig& cfg, std::size_t layer) {
  if (cfg.choices.matrices == MatrixSharing::Shared) return {layer_set(cfg, layer, 0)};
  std::vector<AttentionMatrices> sets;
  for (std::int64_t r = 0; r < cfg.replicas; ++r)
    sets.push_back(layer_set(cfg, layer, static_cast<std::uint64_t>(r) + 1));
  return sets;
}

double layer_period(const RunConfig& cfg) {
  return cfg.regen_period > 0 ? cfg.regen_period : cfg.layer_time;
}

namespace {
/// The number of layers: the l >= 0 with l T <= horizon (1 without --regen-period), from
/// floor(horizon / T) + 1 corrected for its rounding.
std::size_t layer_count(const RunConfig& cfg) {
  const double period = layer_period(cfg);
  if (!(period > 0)) return 1;
  // Every layer whose start the run reaches, one at the horizon included (within the rounding
  // of layer_at): the final frame there is recorded with that layer's matrices, as a longer
  // run records the same frame, so a run resumed from it continues bit-identically.
  const double reached = cfg.horizon + time_resolution(cfg.horizon);
  // validate keeps the count within kMaxLayers (and the period above the time resolution);
  // the bound here keeps a model built without it from a loop of astronomically many starts.
  auto layers = static_cast<std::size_t>(std::clamp(std::floor(reached / period) + 1.0, 1.0, double(kMaxLayers) + 1.0));
  while (layers > 1 && double(layers - 1) * period > reached) --layers;
  while (layers <= std::size_t(kMaxLayers) && double(layers) * period <= reached) ++layers;
  // A --weights file's layers: the last one also serves a frame at its end time.
  if (cfg.choices.weight_layers > 0) layers = std::min(layers, cfg.choices.weight_layers);
  return layers;
}
}  // namespace

std::vector<double> layer_start_times(const RunConfig& cfg) {
  std::vector<double> starts;
  for (std::size_t l = 0, layers = layer_count(cfg); l < layers; ++l)
    starts.push_back(double(l) * layer_period(cfg));
  return starts;
}

std::size_t layer_at(const RunConfig& cfg, double time) {
  if (!(layer_period(cfg) > 0)) return 0;
  // The last layer whose start l T is <= time, a start within rounding (the tolerance at
  // which output_times merges frames) counting as reached: the run lands on a frame time
  // there. The quotient is a first guess; the starts themselves decide (O(1) per call).
  const double reached = time + time_resolution(cfg.horizon), period = layer_period(cfg);
  const std::size_t layers = layer_count(cfg);
  auto l = static_cast<std::size_t>(std::clamp(std::floor(reached / period), 0.0, double(layers - 1)));
  while (l + 1 < layers && double(l + 1) * period <= reached) ++l;
  while (l > 0 && double(l) * period > reached) --l;
  return l;
}

void record_attention_matrices(const RunConfig& cfg, TokenLabels& labels) {
  labels.layer_start = layer_start_times(cfg);
  labels.matrix_layers = labels.layer_start.size();
  std::vector<std::vector<AttentionMatrices>> layers;
  for (std::size_t l = 0; l < labels.matrix_layers; ++l) layers.push_back(layer_matrices(cfg, l));
  labels.matrix_sets = layers.front().size();
  // Each array's entries for every set and layer, in that order, from `of(set's layer)`.
  auto record = [&](const std::string& name, std::vector<std::size_t> shape, auto&& of) {
    TokenLabels::LayerArray array{name, std::move(shape), {}};
    for (std::size_t set = 0; set < labels.matrix_sets; ++set)
      for (const auto& layer : layers) of(layer[set], array.values);
    labels.layer_arrays.push_back(std::move(array));
  };
  // Row-major (Matrix is row-major; a Vector is one row).
  auto append = [](std::vector<double>& to, const auto& m) { to.insert(to.end(), m.data(), m.data() + m.size()); };
  const auto d = static_cast<std::size_t>(cfg.d);
  const AttentionMatrices& first = layers.front().front();
  if (!is_whole_layer(cfg)) {
    // The one head of --q, --k, --v: its d x d Q, K and V (= V_h).
    record("query", {d, d}, [&](const AttentionMatrices& m, auto& to) { append(to, m.heads.front().query); });
    record("key", {d, d}, [&](const AttentionMatrices& m, auto& to) { append(to, m.heads.front().key); });
    record("value", {d, d}, [&](const AttentionMatrices& m, auto& to) { append(to, m.heads.front().full_value); });
    return;
  }
  const std::size_t heads = first.heads.size(), r = head_dim_of(cfg), rv = first.heads.front().value_dim();
  auto each_head = [&](auto&& matrix_of) {
    return [&, matrix_of](const AttentionMatrices& m, auto& to) {
      for (const AttentionHead& head : m.heads) append(to, matrix_of(head));
    };
  };
  record("query", {heads, r, d}, each_head([](const AttentionHead& h) -> const Matrix& { return h.query; }));
  record("key", {heads, r, d}, each_head([](const AttentionHead& h) -> const Matrix& { return h.key; }));
  record("value", {heads, rv, d}, each_head([](const AttentionHead& h) -> const Matrix& { return h.value; }));
  if (first.heads.front().output.size() > 0)
    record("output", {heads, d, rv}, each_head([](const AttentionHead& h) -> const Matrix& { return h.output; }));
  if (!first.mlp.empty()) {
    const std::size_t width = first.mlp.width();
    record("mlp_w1", {width, d}, [&](const AttentionMatrices& m, auto& to) { append(to, m.mlp.w1); });
    record("mlp_b1", {width}, [&](const AttentionMatrices& m, auto& to) { append(to, m.mlp.b1); });
    record("mlp_w2", {d, width}, [&](const AttentionMatrices& m, auto& to) { append(to, m.mlp.w2); });
    record("mlp_b2", {d}, [&](const AttentionMatrices& m, auto& to) { append(to, m.mlp.b2); });
  }
}

namespace {

/// The presences p_i (from --amplitudes; 0 for null tokens) and the SA denominator's guard
/// eps_den (auto: 1e-12 when some presence is not 1).
void set_presences(const RunConfig& cfg, Model& model) {
  const std::size_t active = static_cast<std::size_t>(cfg.n);
  const bool weighted = !cfg.amplitudes.empty() || cfg.null_tokens > 0;
  model.presence.assign(model.n, 1.0);
  if (!cfg.choices.amplitudes.empty())
    for (std::size_t i = 0; i < active; ++i)
      model.presence[i] = presence_from_amplitude(cfg.choices.amplitudes[i], cfg.tau);
  for (std::size_t i = active; i < model.n; ++i) model.presence[i] = 0.0;
  if (model.mass() <= 0.0)
    throw UsageError("--amplitudes " + cfg.amplitudes + ": every presence is 0 (no token moves)");
  // Sinkhorn's rows sum to 1 by construction: it has no denominator to guard (validated).
  model.eps_den = model.normalization == Normalization::Sinkhorn ? 0.0
                  : cfg.eps_den >= 0.0                           ? cfg.eps_den
                                                                 : (weighted ? 1e-12 : 0.0);
}

/// The token positions xi_i (k = position_dim columns: from the file --positions names, or
/// laid out) and the generators a --generators file gives, which the gauge takes: a file's
/// generators fix k, as do 2-D geometries, grid positions and a positions file.
std::vector<Matrix> place_positions(const RunConfig& cfg, Model& model) {
  const std::size_t active = static_cast<std::size_t>(cfg.n);
  const auto seed = static_cast<std::uint64_t>(cfg.seed);
  std::vector<Matrix> file_generators;
  if (!cfg.generators.empty()) {
    try {
      file_generators = read_generators(cfg.generators, 0, model.d);
    } catch (const std::invalid_argument& e) {
      throw UsageError("--generators " + cfg.generators + ": " + e.what());
    }
  }
  std::size_t k = 1;
  const GeometryKind geometry = cfg.choices.geometry;
  const bool planar = is_planar(geometry);
  // No layout: the positions are read from the file --positions names.
  const std::optional<PositionLayout> layout = cfg.choices.positions;
  if (planar || layout == PositionLayout::Grid) k = 2;
  std::vector<double> position_rows;
  const bool positions_from_file = !layout;
  if (positions_from_file) {
    std::size_t rows = 0;
    // The column count is that of the first row: try k = 1, 2, ... (a wrong k fails at once,
    // on the first row).
    for (std::size_t columns = 1; columns <= kMaxPositionColumns && position_rows.empty(); ++columns) {
      try {
        position_rows = read_text_rows(cfg.positions, columns, rows);
        k = columns;
      } catch (const InputFileRefused& e) {
        throw UsageError("--positions " + cfg.positions + ": " + e.what());
      } catch (const std::invalid_argument&) {
      }
    }
    if (position_rows.empty())
      throw UsageError("--positions " + cfg.positions + ": needs n rows of 1 to " +
                       std::to_string(kMaxPositionColumns) + " numbers each");
    if (rows != model.n)
      throw UsageError("--positions " + cfg.positions + ": needs " + std::to_string(model.n) +
                       " rows (n + null tokens), found " + std::to_string(rows));
  }
  if (!file_generators.empty()) {
    if (positions_from_file && file_generators.size() != k)
      throw UsageError("--generators " + cfg.generators + ": " +
                       std::to_string(file_generators.size()) + " generators but positions have k = " +
                       std::to_string(k));
    k = file_generators.size();
  }
  if (planar && k != 2)
    throw UsageError("--geometry " + cfg.geometry + ": needs 2-D positions (k = 2), got k = " +
                     std::to_string(k));
  const AuxFactorChoice aux_factor = cfg.choices.aux_factor;
  if (aux_factor.needs_one_dimensional_positions && k != 1)
    throw UsageError("--aux-factor " + cfg.aux_factor + ": needs 1-D positions (k = 1), got k = " +
                     std::to_string(k));
  model.position_dim = k;
  model.positions.assign(model.n * k, 0.0);
  RandomStream position_stream(seed, static_cast<std::uint64_t>(StreamTag::Positions));
  const auto side = static_cast<std::size_t>(std::ceil(std::sqrt(double(active))));
  for (std::size_t i = 0; i < model.n; ++i) {
    double* xi = model.positions.data() + i * k;
    if (positions_from_file) {
      std::copy(position_rows.begin() + i * k, position_rows.begin() + (i + 1) * k, xi);
    } else if (k == 2 && (layout == PositionLayout::Index || layout == PositionLayout::Grid)) {
      // Grid positions: row-major on a side x side grid (the default for 2-D geometries).
      xi[0] = double(i % side) * cfg.pos_scale;
      xi[1] = double(i / side) * cfg.pos_scale;
    } else if (layout == PositionLayout::Uniform) {
      xi[0] = 2.0 * std::numbers::pi * double(i) / double(active);
      for (std::size_t a = 1; a < k; ++a) xi[a] = 0.0;
    } else if (layout == PositionLayout::Random) {
      for (std::size_t a = 0; a < k; ++a) xi[a] = position_stream.uniform() * double(active) * cfg.pos_scale;
    } else {
      xi[0] = double(i) * cfg.pos_scale;
      for (std::size_t a = 1; a < k; ++a) xi[a] = 0.0;
    }
  }
  for (double xi : model.positions)
    if (!std::isfinite(xi))
      throw UsageError("--pos-scale " + (std::ostringstream() << cfg.pos_scale).str() +
                       ": the token positions overflow double (a smaller scale is needed)");
  return file_generators;
}

/// The prompts of the active tokens and the prefix tokens (--prefix per prompt) with their
/// contents, positions and weight.
void place_prompts_and_prefix(const RunConfig& cfg, Model& model) {
  const std::size_t active = static_cast<std::size_t>(cfg.n), k = model.position_dim;
  const auto seed = static_cast<std::uint64_t>(cfg.seed);
  const std::optional<PositionLayout> layout = cfg.choices.positions;
  // Prompts: active token i belongs to prompt floor(i K / n) (contiguous blocks, as K prompts
  // with their texts one after the other); null tokens carry prompt 0.
  model.prompts = static_cast<std::size_t>(cfg.prompts);
  model.prompt_id.assign(model.n, 0);
  for (std::size_t i = 0; i < active; ++i)
    model.prompt_id[i] = static_cast<int>(i * model.prompts / active);
  // Prefix tokens precede their prompt's text: token t of m sits at position (t - m) times the
  // position step (pos-scale, or 2 pi / n for uniform positions) on the first axis.
  const auto per_prompt = static_cast<std::size_t>(cfg.prefix);
  const std::size_t prefix_count = per_prompt * model.prompts;
  if (prefix_count > 0) {
    PrefixSpec spec;
    spec.seed = seed;
    spec.prompts = model.prompts;
    spec.per_prompt = per_prompt;
    spec.d = model.d;
    spec.spread = cfg.prefix_spread;
    spec.normalize_file_rows = cfg.normalize_init;
    // No placement of the table: the prefix contents are read from the file it names.
    if (const std::optional<PrefixPlacement> placement = cfg.choices.prefix_init) {
      spec.placement = *placement;
    } else {
      spec.placement = PrefixPlacement::File;
      std::size_t rows = 0;
      try {
        spec.file_rows = read_text_rows(cfg.prefix_init, model.d, rows);
      } catch (const std::exception& e) {
        throw UsageError("--prefix-init " + cfg.prefix_init + ": " + e.what());
      }
      if (rows != prefix_count)
        throw UsageError("--prefix-init " + cfg.prefix_init + ": needs prompts * prefix = " +
                         std::to_string(prefix_count) + " rows of d numbers, found " +
                         std::to_string(rows));
    }
    try {
      model.prefix = place_prefix(spec);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    const double step = layout == PositionLayout::Uniform ? 2.0 * std::numbers::pi / double(active)
                                                          : cfg.pos_scale;
    model.prefix_positions.assign(prefix_count * k, 0.0);
    for (std::size_t p = 0; p < prefix_count; ++p) {
      model.prefix_prompt_id.push_back(static_cast<int>(p / per_prompt));
      model.prefix_positions[p * k] = (double(p % per_prompt) - double(per_prompt)) * step;
    }
    model.prefix_weight = cfg.prefix_weight;
  }
}

/// The positional gauge G(xi) over the moving and the prefix tokens (and, for heads of r < d,
/// the same family in dimension r).
void attach_gauge(const RunConfig& cfg, const std::vector<Matrix>& file_generators, Model& model) {
  const GeometryKind geometry = cfg.choices.geometry;
  const std::size_t k = model.position_dim, prefix_count = model.prefix_count();
  const auto seed = static_cast<std::uint64_t>(cfg.seed);
  if (geometry != GeometryKind::None) {
    GaugeSpec spec;
    spec.kind = geometry;
    spec.d = model.d;
    spec.position_dim = k;
    spec.base = cfg.rope_base;
    spec.seed = seed;
    spec.generators = file_generators;
    spec.frequencies = cfg.choices.rope_frequencies;
    try {
      // The gauge covers the moving tokens, then the prefix tokens (sources n .. n + P - 1).
      std::vector<double> all_positions = model.positions;
      all_positions.insert(all_positions.end(), model.prefix_positions.begin(),
                           model.prefix_positions.end());
      model.gauge = make_gauge(spec, all_positions, model.n + prefix_count);
      // The scores of heads of r < d: the same family and frequencies computed for dimension
      // r (heads of r = d take the gauge itself).
      const std::size_t r = head_dim_of(cfg);
      if (r != model.d) {
        spec.d = r;
        model.head_gauge = make_gauge(spec, all_positions, model.n + prefix_count);
      }
    } catch (const std::invalid_argument& e) {
      throw UsageError("--geometry " + cfg.geometry + ": " + e.what());
    }
  }
}

}  // namespace

/// --usa-denominator factor-rows: s_i = M / D_i, D_i = sum_j m_ij c_ij p_j (0 where no source
/// is visible). D_i is the weight sum of the same model at beta = 0, where every exp(beta
/// <q_i, k_j>) is 1, so the CPU backend's pair loops take it once, with the kernels' own mask
/// and factor (pair_terms.hpp): one O(n^2) pass, the cost of one velocity.
void set_row_denominators(Model& model) {
  Model weights_alone = model;
  weights_alone.beta = 0.0;
  weights_alone.time_scale = TimeScale::Natural;
  weights_alone.receiver_scale.clear();
  const std::size_t n = model.n, d = model.d;
  std::vector<double> x(n * d, 0.0), velocity(n * d), row_sums(n);
  for (std::size_t i = 0; i < n; ++i) x[i * d] = 1.0;  // any unit contents: the logits are 0
  make_backend("cpu", weights_alone, BackendOptions{})
      ->velocity(1, x.data(), velocity.data(), row_sums.data());
  const double mass = model.mass();
  model.receiver_scale.resize(n);
  for (std::size_t i = 0; i < n; ++i)
    model.receiver_scale[i] = row_sums[i] > 0.0 ? mass / row_sums[i] : 0.0;
}

Model build_model(const RunConfig& cfg) {
  Model model;
  model.n = static_cast<std::size_t>(cfg.n) + static_cast<std::size_t>(cfg.null_tokens);
  model.d = static_cast<std::size_t>(cfg.d);
  model.beta = cfg.beta;
  model.normalization = cfg.choices.kernel;
  model.time_scale = cfg.choices.time_scale;
  model.matrices = layer_matrices(cfg, 0);
  set_presences(cfg, model);
  const std::vector<Matrix> file_generators = place_positions(cfg, model);
  place_prompts_and_prefix(cfg, model);
  attach_gauge(cfg, file_generators, model);
  const AuxFactorChoice aux_factor = cfg.choices.aux_factor;
  model.values = cfg.choices.values;
  // The option table's numbers as they are (kNumberOptions), then the choices and lists.
  model.pair_terms = cfg.pair_terms;
  model.pair_terms.factor = aux_factor.factor;
  // The rule validate() applies, so a RunConfig built in code meets it too.
  if (aux_factor.factor == AuxFactor::Toeplitz) model.pair_terms.toeplitz = cfg.choices.toeplitz;
  model.pair_terms.mask = cfg.choices.mask.kind;
  model.pair_terms.per_prompt = cfg.choices.mask.per_prompt;
  model.noise_kappa = cfg.noise_kappa;
  model.common_noise = cfg.common_noise;
  // The layer's shape as the option table sets it (kNumberOptions), r resolved.
  model.layer = cfg.layer;
  model.layer.head_dim = static_cast<std::int64_t>(head_dim_of(cfg));
  model.placement = cfg.choices.placement;
  model.ngpt_alpha = cfg.ngpt_alpha;
  model.sinkhorn = cfg.sinkhorn;
  if (cfg.choices.usa_denominator == UsaDenominator::FactorRows) set_row_denominators(model);
  return model;
}

TokenLabels token_labels(const Model& model) {
  TokenLabels labels;
  labels.aux_position = model.positions;
  labels.prompt_id.assign(model.prompt_id.begin(), model.prompt_id.end());
  labels.presence = model.presence;
  for (std::size_t i = 0; i < model.n; ++i) labels.id.push_back(static_cast<std::int64_t>(i));
  // Every gauge says what to record (Gauge::recorded_generators), so a new kind of gauge
  // cannot be left out of the file by a cast that does not know it.
  if (model.gauge) {
    const std::vector<Matrix> generators = model.gauge->recorded_generators();
    for (const Matrix& generator : generators) {
      if (static_cast<std::size_t>(generator.rows()) != model.d ||
          static_cast<std::size_t>(generator.cols()) != model.d)
        throw std::logic_error("Gauge::recorded_generators: a generator is " + std::to_string(generator.rows()) +
                               " x " + std::to_string(generator.cols()) + ", not d x d = " +
                               std::to_string(model.d) + " x " + std::to_string(model.d));
      labels.gauge_generators.insert(labels.gauge_generators.end(), generator.data(),
                                     generator.data() + generator.size());
    }
    labels.generator_count = generators.size();
  }
  labels.prefix_count = model.prefix_count();
  labels.prefix_position = model.prefix;
  labels.prefix_aux_position = model.prefix_positions;
  labels.prefix_prompt_id.assign(model.prefix_prompt_id.begin(), model.prefix_prompt_id.end());
  labels.prefix_presence.assign(labels.prefix_count, model.prefix_weight);
  for (std::size_t p = 0; p < labels.prefix_count; ++p)
    labels.prefix_id.push_back(static_cast<std::int64_t>(model.n + p));
  return labels;
}

State build_initial_state(const RunConfig& cfg, const Model& model) {
  State state(static_cast<std::size_t>(cfg.replicas), model.n, model.d);
  InitSpec spec;
  spec.seed = static_cast<std::uint64_t>(cfg.seed);
  spec.clusters = static_cast<std::size_t>(cfg.init_clusters);
  spec.spread = cfg.init_spread;
  spec.rho = cfg.init_rho;
  spec.normalize_file_rows = cfg.normalize_init;
  spec.euclidean = !placement_on_sphere(cfg.choices.placement);
  spec.kind = cfg.choices.init;
  if (spec.kind == InitKind::File) {
    std::size_t rows = 0;
    try {
      // A regular file before HDF5 opens it by name (it would wait on a FIFO).
      check_input_file(cfg.init_file);
      if (is_mfattn_file(cfg.init_file)) {
        const Frame frame = read_last_frame(cfg.init_file);
        if (frame.d != model.d)
          throw std::invalid_argument("has d = " + std::to_string(frame.d) + ", this run d = " +
                                      std::to_string(model.d));
        spec.file_rows = frame.x;
        rows = frame.n;
      } else {
        spec.file_rows = read_text_rows(cfg.init_file, model.d, rows);
      }
    } catch (const std::exception& e) {
      throw UsageError("--init-file " + cfg.init_file + ": " + e.what());
    }
    if (rows != model.n && (state.replicas == 1 || rows != state.replicas * model.n))
      throw UsageError("--init-file " + cfg.init_file + ": needs " + std::to_string(model.n) +
                       " rows (n + null tokens)" +
                       (state.replicas > 1
                            ? ", or " + std::to_string(state.replicas * model.n) + " (" +
                                  std::to_string(model.n) + " for each of the " +
                                  std::to_string(state.replicas) + " replicas)"
                            : std::string()) +
                       ", found " + std::to_string(rows));
  }
  try {
    initialize_state(spec, state);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--init ") + cfg.init + ": " + e.what());
  }
  // States in R^d (docs/model.md section 2c) start at radius --init-radius.
  if (!model.on_sphere() && cfg.init_radius != 1.0)
    for (double& value : state.x) value *= cfg.init_radius;
  return state;
}

}  // namespace mfattn
