#include "mfattn/app/info.hpp"
#include "mfattn/app/run_choices.hpp"

#include <iostream>
#include <string>

#include "mfattn/io/h5md.hpp"
#include "mfattn/app/run.hpp"

namespace mfattn {

namespace {

/// Which frames the file holds positions of (--save-positions).
std::string positions_text(const FileSummary& summary) {
  const std::string frames = std::to_string(summary.position_frames) + " frame" +
                             (summary.position_frames == 1 ? "" : "s");
  // The name the file records, read through the option's table (an unknown one reads as none).
  const std::optional<PositionFrames> kept = kSavePositionsOption.preset(summary.save_positions);
  if (kept == PositionFrames::All) return "every frame (--save-positions all)";
  if (kept == PositionFrames::Ends)
    return frames + ": t = 0 and the horizon (--save-positions ends); /run/checkpoint holds the last frame";
  return "none (--save-positions " + summary.save_positions + "); /run/checkpoint holds the last frame";
}

/// The value of `key` among the pairs, "?" when absent.
std::string value_of(const std::vector<std::pair<std::string, std::string>>& pairs,
                     const std::string& key) {
  for (const auto& [name, value] : pairs)
    if (name == key) return value;
  return "?";
}

/// The model line: the kernel, beta, time scale, integrator and seed a run was made with, or,
/// for states imported from another model (mfattn import), that it has none of them.
std::string model_text(const FileSummary& summary) {
  auto lookup = [&](const std::string& key) { return value_of(summary.parameters, key); };
  if (lookup("command") == "import")
    return "model      none: states imported from " + lookup("source") + " (state space " +
           lookup("state_space") + "); no kernel, beta, integrator or energy";
  return "model      kernel " + lookup("kernel") + ", beta " + lookup("beta") + ", time-scale " +
         lookup("time-scale") + ", integrator " + lookup("integrator") + ", seed " + lookup("seed");
}

}  // namespace

int info_command(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  if (args.size() != 1 || args[0].empty() || args[0][0] == '-') {
    err << "mfattn info: expected exactly one FILE.h5 (usage: mfattn info FILE.h5)\n";
    return kExitUsage;
  }
  // A missing or foreign file is the caller's mistake (2); a failing read of an mfattn file
  // is I/O (4): NotMfattnFile and IoError, as command_errors.hpp maps them.
  const FileSummary summary = describe_file(args[0]);
  const auto& lookup = value_of;
  if (!summary.field_shape.empty()) {
    // A density file of mfattn meanfield: its grid instead of tokens and positions.
    std::string shape;
    for (std::size_t extent : summary.field_shape) shape += (shape.empty() ? "" : " x ") + std::to_string(extent);
    out << "file       " << args[0] << '\n'
        << "density    " << shape << " grid values per frame (mfattn meanfield; "
        << lookup(summary.parameters, "scheme_used") << ")\n"
        << "frames     " << summary.frames << ", t = " << summary.first_time << " .. " << summary.last_time << '\n'
        << "status     " << lookup(summary.run, "status") << " (steps " << lookup(summary.run, "steps") << ", wall "
        << lookup(summary.run, "wall_time_s") << " s)\n"
        << "parameters\n";
    for (const auto& [name, value] : summary.parameters)
      if (name != "config_text") out << "  " << name << " = " << value << '\n';
    return kExitOk;
  }
  out << "file       " << args[0] << '\n'
      << "tokens     n = " << summary.n << " (active "
      << lookup(summary.parameters, "active_tokens") << "), d = " << summary.d
      << ", replicas = " << summary.replicas << '\n'
      << "frames     " << summary.frames << ", t = " << summary.first_time << " .. "
      << summary.last_time << '\n'
      << "positions  " << positions_text(summary) << '\n'
      << "status     " << lookup(summary.run, "status") << " (steps "
      << lookup(summary.run, "steps") << ", rejected " << lookup(summary.run, "rejected_steps")
      << ", wall " << lookup(summary.run, "wall_time_s") << " s)\n"
      << model_text(summary) << '\n'
      << "parameters\n";
  for (const auto& [name, value] : summary.parameters)
    if (name != "config_text") out << "  " << name << " = " << stored_value_text(name, value) << '\n';
  return kExitOk;
}

}  // namespace mfattn
