#pragma once
/// \file h5md.hpp
/// H5MD 1.1 writer and reader for mfattn runs (layout: docs/output.md, "Layout").
/// Replicas: replica 0 is /particles/tokens, replica r >= 1 is
/// /particles/tokens_r<r>; observables live in /observables/<name> with value shape
/// [T] (scalar) or [T, c] (vector) for one replica and [T, R] / [T, R, c] for R > 1.
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace mfattn {

/// An I/O failure (exit code 4).
struct IoError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
/// The file given is missing or is not an mfattn H5MD file that can be read (exit code 2).
struct NotMfattnFile : IoError {
  using IoError::IoError;
};
/// The output file exists and replacing it was not asked for (a usage error, exit code 2).
struct OutputExists : IoError {
  using IoError::IoError;
};
/// The output path names something that --overwrite may not replace: a device node, a FIFO,
/// a socket or a folder (a usage error, exit code 2).
struct OutputNotReplaceable : OutputExists {
  using OutputExists::OutputExists;
};
/// The output file is held open for writing by another process (a running mfattn), so it is
/// neither replaced nor touched (exit code 4: retrying once that process ends can succeed).
struct OutputBusy : IoError {
  using IoError::IoError;
};

/// One typed attribute of /parameters.
using ParameterValue = std::variant<std::int64_t, double, bool, std::string, std::vector<double>>;
struct Parameter {
  std::string name;
  ParameterValue value;
};

/// Which frames keep the particles' positions (and velocities): `--save-positions`
/// (docs/output.md, "What --save-positions writes"). Observables, step size and /run are
/// written at every frame in every mode.
enum class PositionFrames {
  All,   ///< every frame (position/step and time are the frames' clock)
  Ends,  ///< frame 0 (t = 0) and the final frame of every run part that reaches its horizon
  None,  ///< none: position/{step, time, value} are empty
};

/// Whether a frame is the last of the run (at the horizon): with PositionFrames::Ends its
/// positions are kept.
enum class FrameRole { Intermediate, Final };

struct WriterSetup {
  std::string path;
  bool overwrite = false;       ///< false: an existing file is an error (OutputExists)
  /// true: the file is written under a temporary name in the same folder (see
  /// temporary_output_path) and renamed to `path` by the first flush() after the first frame,
  /// so `path` never holds a file without frame 0, an existing file is replaced atomically,
  /// and one that another process is writing is refused untouched (OutputBusy). A writer
  /// destroyed before that removes its temporary file. false: `path` is created at once.
  bool atomic_publish = false;
  /// Frames the run will write (0: unknown). Growing datasets are chunked by at most this
  /// many rows, so a short run's file is not inflated to a whole 256 KiB chunk per dataset.
  std::size_t expected_frames = 0;
  /// All: as ever. Ends and None: the frames' step and time live in /observables (hard links
  /// shared by every observable), positions have their own step and time (Ends) or none, and
  /// /run/checkpoint holds the state of the last flushed frame for --resume.
  PositionFrames position_frames = PositionFrames::All;
  std::size_t n = 0, d = 0, replicas = 1;
  std::size_t position_dim = 1; ///< k, columns of aux_position
  bool deflate = false;         ///< deflate + shuffle on positions (and, with Ends and None, observables)
  bool fletcher32 = false;
  bool velocity = false;        ///< also write velocity/{step, time, value} per replica group
  std::string author = "unknown";
  std::string creator_version;  ///< project version
  /// Observable names and component counts (1 = scalar) written per frame, in order.
  std::vector<std::pair<std::string, std::size_t>> observables;
  /// Not empty: a density file of `mfattn meanfield` (docs/output.md, "Density files"): the
  /// frames' values go to /fields/density/value [T, field_shape...] with their clock in
  /// /fields/density/{step, time}, and there is no /particles. n must be the product of the
  /// shape, d = 1, one replica, every frame kept (PositionFrames::All), no velocities.
  std::vector<std::size_t> field_shape;
};

/// Token labels that never change during a run.
struct TokenLabels {
  std::vector<double> aux_position;   ///< n * k, row-major
  std::vector<std::int32_t> prompt_id; ///< n
  std::vector<double> presence;        ///< n
  std::vector<std::int64_t> id;        ///< n
  /// The k skew generators of the positional gauge (k * d * d, row-major), when there is one:
  /// written as gauge_generators [k, d, d] so a reader can rebuild G(xi) = exp(sum xi_a Omega_a).
  std::vector<double> gauge_generators{};
  std::size_t generator_count = 0;
  /// Frozen prefix tokens, written to /particles/prefix when prefix_count > 0: position [P, d]
  /// (time-independent: they never move), aux_position [P, k], prompt_id, presence, id [P].
  std::size_t prefix_count = 0;
  std::vector<double> prefix_position{};
  std::vector<double> prefix_aux_position{};
  std::vector<std::int32_t> prefix_prompt_id{};
  std::vector<double> prefix_presence{};
  std::vector<std::int64_t> prefix_id{};
  /// The weights in force, per matrix set and layer: sets 1 (shared by every replica,
  /// written to /particles/tokens) or R (one per replica, written to each replica's group),
  /// layers L (one, or one per --regen-period or --layer-time span starting at
  /// layer_start[l]). Each group gets attention_matrices/layer_start [L] and one dataset
  /// [L, shape...] per array: query, key, value [L, d, d] for the one head of Q, K, V; a
  /// whole layer's query, key [L, H, r, d], value [L, H, rv, d], output [L, H, d, rv] (when
  /// its heads have one), mlp_w1 [L, W, d], mlp_b1 [L, W], mlp_w2 [L, d, W], mlp_b2 [L, d]
  /// (docs/output.md). Nothing is written when matrix_sets is 0.
  std::size_t matrix_sets = 0, matrix_layers = 0;
  std::vector<double> layer_start{};
  struct LayerArray {
    std::string name;
    std::vector<std::size_t> shape;  ///< of one layer
    std::vector<double> values;      ///< [set][layer][shape...]
  };
  std::vector<LayerArray> layer_arrays{};
};

/// Where a run stopped: its last complete frame (every dataset holds it), for --resume.
struct ResumePoint {
  std::size_t frames = 0;
  std::int64_t step = 0;
  double time = 0.0;
  double step_size = 0.0;
  std::vector<double> x;  ///< all replicas, R * n * d
  std::int64_t steps = 0, rejected_steps = 0;
  double wall_seconds = 0.0;
};

class H5mdWriter {
 public:
  /// Creates the file and the whole static layout; /run/status = "running".
  static std::unique_ptr<H5mdWriter> create(const WriterSetup& setup);
  /// Reopens an existing file written with the same setup (n, d, replicas, observables),
  /// finds its last complete frame and appends after it; frames that a killed writer left
  /// incomplete are overwritten. Throws IoError when the file does not match.
  static std::unique_ptr<H5mdWriter> open_for_resume(const WriterSetup& setup, ResumePoint& point);
  virtual ~H5mdWriter() = default;
  virtual void write_parameters(const std::vector<Parameter>& parameters) = 0;
  virtual void write_labels(const TokenLabels& labels) = 0;
  /// A density file's fixed dataset /fields/density/<name> of that shape (the grid).
  virtual void write_field_dataset(const std::string& name, const std::vector<std::size_t>& shape,
                                   const std::vector<double>& values) = 0;
  /// Appends one frame: positions of all replicas (R * n * d, replica-major) and one value
  /// array per observable in setup order (R * components numbers each). step_size is the
  /// integrator's next step (/run/step_size), which a resumed run continues with.
  /// velocities (R * n * d) are required when the setup asks for velocity. role says whether
  /// this is the run's final frame (PositionFrames::Ends keeps its positions). Positions are
  /// always given: with Ends and None they also go to /run/checkpoint. The frame is staged
  /// in memory (copied): it reaches the file at the next flush().
  virtual void append_frame(std::int64_t step, double time, const double* positions,
                            const std::vector<std::vector<double>>& observables,
                            double step_size = 0.0, const double* velocities = nullptr,
                            FrameRole role = FrameRole::Intermediate) = 0;
  /// Writes /run: status, wall time, steps, rejected steps.
  virtual void write_run_info(const std::string& status, double wall_seconds, std::int64_t steps,
                              std::int64_t rejected_steps) = 0;
  /// Writes /run's wall time, steps and rejected steps, keeping the status: written with every
  /// frame, so a killed run's counts match its last frame and a resumed run adds to them.
  virtual void write_run_progress(double wall_seconds, std::int64_t steps,
                                  std::int64_t rejected_steps) = 0;
  /// Bytes of the frames staged since the last flush (what a flush would write).
  virtual std::size_t staged_bytes() const = 0;
  /// Writes the staged frames (one block per dataset; IoError, with none of them written,
  /// when the disk space for them cannot be reserved), then H5Fflush: everything appended
  /// so far survives a SIGKILL. With atomic_publish, the
  /// first flush after a frame renames the file to its final name. With a checkpoint
  /// (PositionFrames Ends and None) the frame's checkpoint slot is marked complete after a
  /// first H5Fflush has put its data in the file, and a second one writes the mark.
  virtual void flush() = 0;
  /// The name the file has now (the temporary name until it is published).
  virtual std::string current_path() const = 0;
  /// Frames the file keeps: those of the last successful flush, plus the whole frames a
  /// flush that met a full disk still wrote (resumed frames included).
  virtual std::size_t flushed_frames() const = 0;
};

/// The temporary name a writer with atomic_publish uses for `path`: ".<name>.<pid>.<k>.tmp"
/// in the same folder, k counting the calls in this process (the name shortened when it
/// would exceed 255 bytes).
std::string temporary_output_path(const std::string& path);

/// The last frame of replica 0 of an mfattn file: n rows of d numbers, row-major. Of a file
/// that does not keep every frame's positions (--save-positions ends or none) it is the
/// latest of its last saved positions and its /run/checkpoint.
struct Frame {
  std::size_t n = 0, d = 0;
  double time = 0.0;
  std::int64_t step = 0;
  std::vector<double> x;
};
Frame read_last_frame(const std::string& path);

/// What `mfattn info` shows of a file: sizes, time span, /parameters and /run as text.
struct FileSummary {
  std::size_t n = 0, d = 0, replicas = 0, frames = 0;
  /// Frames whose positions the file holds (frames with --save-positions all) and the
  /// /parameters save-positions it was written with ("all" for files from before the option).
  std::size_t position_frames = 0;
  std::string save_positions = "all";
  double first_time = 0.0, last_time = 0.0;
  std::vector<std::pair<std::string, std::string>> parameters, run;
  /// A density file (`mfattn meanfield`): the shape of one frame of /fields/density/value
  /// (empty for a particle file); n is then its size, d 1 and replicas 1.
  std::vector<std::size_t> field_shape;
};
/// Throws IoError for a missing file or one that is not an mfattn H5MD file (a particle
/// run's or a density file).
FileSummary describe_file(const std::string& path);

/// A parameter as describe_file renders the attribute it is stored in (numbers exactly:
/// integers in full, doubles as the shortest text that reads back as the same double).
std::string parameter_text(const ParameterValue& value);

/// True when the file is HDF5 and carries the H5MD root group with creator "mfattn". Throws
/// NotMfattnFile for an HDF5 file that reaches outside itself (an external link, a virtual
/// dataset) or holds an object that cannot be loaded: no reader opens it.
bool is_mfattn_file(const std::string& path);

/// What `mfattn realize` adds to its run's file as /realization (docs/realization.md):
/// target and realized ([n] or [n, columns]: angles on a circle or torus, points on the
/// sphere), u (the collapse point, d numbers), and attributes (mechanism, target, metric,
/// distance, noise_floor, ...).
struct RealizationRecord {
  std::size_t columns = 1;
  std::vector<double> target, realized, u;
  std::vector<std::pair<std::string, std::string>> texts;
  std::vector<std::pair<std::string, double>> numbers;
};
/// Adds /realization to the finished file at path. Throws IoError.
void write_realization(const std::string& path, const RealizationRecord& record);

}  // namespace mfattn
