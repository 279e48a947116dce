// SlotOperands (slot_operands.hpp): every slot's queries, keys, values, biases and offsets.
#include "backends/cpu/slot_operands.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "backends/cpu/lane_pair_terms.hpp"
#include "backends/cpu/vector_math.hpp"
#include "kernels/receiver_finish.hpp"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::cpu {
inline namespace MFATTN_CPU_NAMESPACE {

SourceBiases::SourceBiases(const Model& model)
    : prefix(kernels::log_presence(model.prefix_weight)), all_present(model.every_token_present()) {
  for (double p : model.presence) tokens.push_back(kernels::log_presence(p));
}

SlotOperands::SlotOperands(const Model& model, const SourceBiases& biases, bool biases_rewritten)
    : model_(model), biases_(biases), biases_rewritten_(biases_rewritten) {}

void SlotOperands::set_heads(std::size_t replicas) {
  heads_per_replica_ = model_.matrices_of(0).heads.size();
  heads_.clear();
  for (std::size_t r = 0; r < replicas; ++r)
    for (const AttentionHead& head : model_.matrices_of(r).heads) heads_.emplace_back(model_, head);
}

void SlotOperands::prepare_layout(Prepared& p, std::size_t d) const {
  const std::size_t n = model_.n;
  if (p.d == d && p.queries.size() == n * d) return;
  p.d = d;
  p.first_moving = LanePairTerms::prefix_region(model_);
  p.padded_sources = LanePairTerms::padded_sources(model_);
  p.padded_dim = round_up(d, kLanes);
  p.bias_free_begin = p.first_moving;
  p.bias_free_end = biases_.all_present && !biases_rewritten_ ? p.first_moving + n / kLanes * kLanes : p.first_moving;
  p.source_stride = p.padded_sources + kLanes;
  p.row_stride = p.padded_dim + kLanes;
  p.queries.assign(n * d, 0.0);
  p.offsets.assign(n, 0.0);
  p.key_panels.assign(d * p.padded_sources, 0.0);
  p.bias.assign(p.padded_sources, kNegInf);
  for (std::size_t q = 0; q < model_.prefix_count(); ++q) p.bias[q] = biases_.prefix;
  for (std::size_t j = 0; j < n; ++j) p.bias[p.first_moving + j] = biases_.tokens[j];
  p.bias_log2.resize(p.padded_sources);
  for (std::size_t j = 0; j < p.padded_sources; ++j) p.bias_log2[j] = p.bias[j] * kLog2e;
  if (d <= kSmallDimension)
    p.values_t.assign(d * p.source_stride, 0.0);
  else
    p.values_rows.assign(p.padded_sources * p.row_stride, 0.0);
}

void SlotOperands::prepare(const double* x) {
  const std::size_t n = model_.n, d = operand_dim(), content_dim = model_.d, slots = heads_.size();
#pragma omp single
  {
    prepared_.resize(slots);
    largest_key_.assign(slots, 0.0);
    largest_bias_.assign(slots, 0.0);
    for (std::size_t r = 0; r < slots; ++r) {
      prepare_layout(prepared_[r], d);
      std::vector<double> products(std::max<std::size_t>(heads_[r].product_count, 1));
      for (std::size_t q = 0; q < model_.prefix_count(); ++q) {
        const double* y = model_.prefix.data() + q * content_dim;
        heads_[r].products(y, products.data());
        add_source(prepared_[r], q, n + q, y, largest_key_[r], largest_bias_[r], heads_[r], products.data());
      }
    }
  }
  std::vector<double> key(slots, 0.0), bias(slots, 0.0);
#pragma omp for schedule(static) nowait
  for (std::size_t unit = 0; unit < slots * n; ++unit) {
    const std::size_t r = unit / n, i = unit % n;
    Prepared& p = prepared_[r];
    const double* xi = x + ((r / heads_per_replica_) * n + i) * content_dim;
    Scratch scratch;
    double* work = scratch.rows(d);
    const host::HeadOperands& head = heads_[r];
    thread_local std::vector<double> products;
    // Q_h x, K_h x, A_h x together (those that are not the identity), read by the query here
    // and the key and value below.
    products.resize(std::max<std::size_t>(head.product_count, 1));
    head.products(xi, products.data());
    head.query(i, xi, products.data(), work + d, work);
    for (std::size_t c = 0; c < d; ++c) p.queries[i * d + c] = model_.beta * work[c];
    add_source(p, p.first_moving + i, i, xi, key[r], bias[r], head, products.data());
  }
#pragma omp critical(mfattn_cpu_prepare)
  for (std::size_t r = 0; r < slots; ++r) {
    largest_key_[r] = std::max(largest_key_[r], key[r]);
    largest_bias_[r] = std::max(largest_bias_[r], bias[r]);
  }
#pragma omp barrier
  // The largest key norm from the largest squared norm: sqrt is monotone and correctly
  // rounded, so this is the largest of the norms (one root per slot, not per token).
#pragma omp single
  for (double& largest : largest_key_) largest = std::sqrt(largest);
#pragma omp for schedule(static)
  for (std::size_t unit = 0; unit < slots * n; ++unit) {
    const std::size_t r = unit / n, i = unit % n;
    Prepared& p = prepared_[r];
    double query_norm2 = 0.0;
    for (std::size_t c = 0; c < d; ++c) query_norm2 += p.queries[i * d + c] * p.queries[i * d + c];
    p.offsets[i] = kernels::cauchy_schwarz_offset(query_norm2, largest_key_[r], largest_bias_[r]);
  }
#pragma omp single
  for (Prepared& p : prepared_) {
    const double largest_offset = n ? *std::max_element(p.offsets.begin(), p.offsets.end()) : 0.0;
    p.logits_above_underflow = 2.0 * largest_offset * kLog2e < 1020.0;
  }
}

void SlotOperands::add_source(Prepared& p, std::size_t s, std::size_t token, const double* y,
                              double& largest_key_norm2, double& largest_bias, const host::HeadOperands& head,
                              const double* products) const {
  const std::size_t d = p.d;
  Scratch scratch;
  double* out = scratch.rows(d);
  const double* key = out;
  head.key(token, y, products, out + d, out);
  double key_norm2 = 0.0;
  double* panel = p.key_panels.data() + p.key_index(0, s);
  for (std::size_t c = 0; c < d; ++c) {
    panel[c * kKeyPanel] = key[c];
    key_norm2 += key[c] * key[c];
  }
  const double* z = out;
  head.value(token, y, products, out);
  if (d <= kSmallDimension)
    for (std::size_t c = 0; c < d; ++c) p.values_t[c * p.source_stride + s] = z[c];
  else
    std::copy(z, z + d, p.values_rows.data() + s * p.row_stride);
  if (p.bias[s] > kNegInf) {
    largest_key_norm2 = std::max(largest_key_norm2, key_norm2);
    largest_bias = std::max(largest_bias, p.bias[s]);
  }
}

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::cpu
MFATTN_CPU_TARGET_END
