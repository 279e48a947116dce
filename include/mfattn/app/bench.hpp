#pragma once
/// \file bench.hpp
/// `mfattn bench`: interaction throughput. One evaluation of every velocity costs n^2 pairs
/// per replica; pairs per second = replicas * n^2 * evaluations / seconds.
#include <iosfwd>
#include <string>
#include <vector>

namespace mfattn {

/// Runs the bench subcommand: its line on out; returns an exit code (a failure is an exception,
/// reported by guarded, command_errors.hpp).
int bench_command(const std::vector<std::string>& args, std::ostream& out);

}  // namespace mfattn
