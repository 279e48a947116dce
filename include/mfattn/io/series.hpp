#pragma once
/// \file series.hpp
/// Read-only access to the time series of an mfattn H5MD file (layout: h5md.hpp,
/// docs/output.md), for analysis of finished runs and of runs still being written or killed.
///
/// - The file is opened read-only with HDF5 file locking off (the effect of
///   HDF5_USE_FILE_LOCKING=FALSE), so a file that a running `mfattn run` holds open for writing
///   can be read; the writer flushes after every frame, so every flushed frame is complete.
/// - frames() is the number of complete frames: the shortest of position/step, position/time
///   and the position/value of every replica (a writer killed between two writes may leave
///   them one frame apart). Observables are cut to the same length (or shorter, if theirs is).
///   A file written with --save-positions ends or none (it has /run/checkpoint) keeps its
///   frame clock in /observables/<name>/{step, time} instead: frames() is the shorter of
///   those, and the positions are separate rows, position_frames() of them (2 or more for
///   ends, 0 for none) with their own position_times().
/// - Every failure is an IoError naming the file and the problem; a file that is missing or is
///   not a readable mfattn H5MD file at all (not HDF5, cannot be opened, no mfattn creator, the
///   position datasets missing or of the wrong shape) is a NotMfattnFile, which the commands
///   report as a usage error (exit 2); any other failure is I/O (exit 4).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mfattn/io/h5md.hpp"

namespace mfattn {


class SeriesFile {
 public:
  /// Opens `path`; throws NotMfattnFile when it is missing, a directory, not HDF5, cannot be
  /// opened by HDF5 (truncated or damaged), or is not an mfattn file (no /h5md/creator name
  /// "mfattn", /particles/tokens/position/{step, time, value} missing or not [T], [T],
  /// [T, n, d], n or d zero, d unlike /parameters d, a dataset of another type than the
  /// float64 or int64 the writer stores, frame times not finite and increasing); IoError
  /// when reading a dataset fails.
  explicit SeriesFile(const std::string& path);
  ~SeriesFile();
  SeriesFile(const SeriesFile&) = delete;
  SeriesFile& operator=(const SeriesFile&) = delete;

  const std::string& path() const;
  std::size_t n() const;         ///< tokens per frame (moving and null tokens)
  std::size_t d() const;
  std::size_t replicas() const;  ///< particle groups tokens, tokens_r1, ...
  std::size_t frames() const;    ///< complete frames (see above)
  /// Rows of positions every replica holds: frames() with --save-positions all, else fewer.
  std::size_t position_frames() const;
  /// "all", "ends" or "none": /parameters save-positions, or what the layout shows when the
  /// file lacks it ("all" for files from before the option).
  const std::string& save_positions() const;

  std::vector<double> times() const;          ///< [frames]
  std::vector<std::int64_t> steps() const;    ///< [frames]
  std::vector<double> position_times() const; ///< [position_frames], the rows' frame times

  /// Names of the groups under /observables.
  std::vector<std::string> observable_names() const;
  bool has_observable(const std::string& name) const;
  /// Values of one observable for one replica, row-major [rows, components], where rows is
  /// min(frames(), the observable's own length). Shapes: [T] or [T, c] for one replica,
  /// [T, R] or [T, R, c] for R > 1. Throws IoError when absent or malformed.
  std::vector<double> observable(const std::string& name, std::size_t replica,
                                 std::size_t* components = nullptr) const;

  /// Positions of one row of one replica, n rows of d numbers: row < position_frames(), the
  /// frame index when the file keeps every frame's positions (IoError otherwise).
  std::vector<double> positions(std::size_t row, std::size_t replica) const;
  /// The presence p_i of the replica's tokens ([n]); empty when the file has none.
  std::vector<double> presence(std::size_t replica) const;

  /// /run/status (nullopt when absent).
  std::optional<std::string> run_status() const;
  /// A numeric (integer, float, int8 flag) attribute of /parameters, as a double.
  std::optional<double> parameter_number(const std::string& name) const;
  /// A string attribute of /parameters.
  std::optional<std::string> parameter_string(const std::string& name) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mfattn
