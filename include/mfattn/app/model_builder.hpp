#pragma once
/// \file model_builder.hpp
/// The model builder of `mfattn run` and of everything that runs a configuration (the module,
/// sweeps, bench, realize): a validated RunConfig -> Model, its token labels and the initial
/// State. It reads the options once, through RunConfig::choices (validate(), config.hpp).
#include <cstddef>
#include <vector>

#include "mfattn/app/config.hpp"
#include "mfattn/io/h5md.hpp"
#include "mfattn/core/model.hpp"
#include "mfattn/core/state.hpp"

namespace mfattn {

/// The Model of a configuration: n active tokens plus null tokens, matrices, presence,
/// positions, mask. Throws UsageError for unreadable or malformed inputs.
Model build_model(const RunConfig& cfg);

/// The Q, K, V of layer `layer` (0 without --regen-period): one set shared by every replica,
/// or one per replica with --matrices per-replica (replica r's from its own stream). Draws
/// depend only on (seed, layer, replica), never on how many replicas or layers there are.
std::vector<AttentionMatrices> layer_matrices(const RunConfig& cfg, std::size_t layer);

/// The time each layer lasts: --regen-period, else --layer-time (0: one layer).
double layer_period(const RunConfig& cfg);
/// The times at which layers start: 0, then every --regen-period before the horizon.
std::vector<double> layer_start_times(const RunConfig& cfg);

/// The layer in force at `time`: the last one that started at or before it.
std::size_t layer_at(const RunConfig& cfg, double time);

/// Fills labels' attention-matrix record: every layer's Q, K, V of every matrix set.
void record_attention_matrices(const RunConfig& cfg, TokenLabels& labels);

/// What a run writes about its tokens: ids, positions, prompts, presences, the prefix tokens
/// and the generators the gauge says to record (Gauge::recorded_generators). Throws
/// std::logic_error when a gauge records a generator that is not d x d.
TokenLabels token_labels(const Model& model);

/// The initial state (all replicas). Throws UsageError for unusable inputs.
State build_initial_state(const RunConfig& cfg, const Model& model);

}  // namespace mfattn
