#pragma once
/// \file bench.hpp
/// `mfattn bench`: interaction throughput. One evaluation of every velocity costs n^2 pairs
/// per replica; pairs per second = replicas * n^2 * evaluations / seconds.
#include <iosfwd>
#include <string>
#include <vector>

namespace mfattn {

/// Runs the bench subcommand; returns an exit code.
int bench_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace mfattn
