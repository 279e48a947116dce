#pragma once
/// \file info.hpp
/// `mfattn info FILE`: what an mfattn file holds (sizes, frames, time span, status, parameters).
#include <iosfwd>
#include <string>
#include <vector>

namespace mfattn {

/// Prints the summary of one file; returns an exit code (4 for a missing or foreign file).
int info_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace mfattn
