#pragma once
/// \file command_errors.hpp
/// The one mapping of exceptions to exit codes (docs/cli.md, "Errors and exit codes") that every
/// command shares: a command throws, guarded() reports one line and returns the code.
///   UsageError, BackendUnavailable, std::invalid_argument,
///   NotMfattnFile, OutputExists (an --out already there)        2  usage or input
///   NumericalError                                               3  "numerical failure: ..."
///   IoError, DeviceFailure ("device failure: ..."), bad_alloc,
///   std::filesystem::filesystem_error                            4  I/O or resources
///   anything else                                                1  "internal error: ..."
/// A command catches an exception itself only to do something before it ends (record a
/// status, name the last frame its file keeps), and rethrows or returns the code it chooses.
#include <functional>
#include <iosfwd>
#include <string_view>

namespace mfattn {

/// Exit code 1 (docs/cli.md): an unexpected exception, a bug.
inline constexpr int kExitInternal = 1;

/// The exit code of the exception being handled, its one line "mfattn COMMAND: ..." written
/// to err. Call it only inside a catch block.
int report_current_exception(std::string_view command, std::ostream& err);

/// Runs body and returns its exit code; an exception is reported by report_current_exception.
int guarded(std::string_view command, const std::function<int()>& body, std::ostream& err);

}  // namespace mfattn
