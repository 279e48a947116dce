#pragma once
/// \file validate.hpp
/// The checks of `mfattn run`'s options (validate.cpp), made once before anything is written:
/// every value against its table (run_choices.hpp), the sizes, the layer's shapes and the
/// capabilities of the chosen backend; each refusal a UsageError naming the option, the value
/// and what is accepted (docs/cli.md).
#include <string>
#include <vector>

#include "mfattn/app/config.hpp"
#include "mfattn/app/run_choices.hpp"

namespace mfattn {

/// The parts of a --mask value joined by '+' ("causal+per-prompt" -> {causal, per-prompt}).
std::vector<std::string> mask_parts(const std::string& mask);

/// Validates values once, before anything is written, and returns what the choice options
/// select (parse_run_arguments stores it in cfg.choices). Throws UsageError.
RunChoices validate(const RunConfig& cfg);

}  // namespace mfattn
