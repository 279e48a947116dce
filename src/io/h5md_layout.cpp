/// \file h5md_layout.cpp
/// The layout writer's making of an mfattn H5MD file (h5md_writer.hpp; docs/output.md,
/// "Layout"): its groups, datasets and links, created for a new file or opened again for
/// --resume (its last complete frame or checkpoint slot), the labels and parameters written
/// once, and a realization's record.
///
/// Choices made here:
/// - The file uses HDF5's oldest compatible format and no SWMR: after flush() a writer killed
///   with SIGKILL leaves a file that plain h5py opens. Above kOldestFormatLargestD it uses the
///   1.8 format (readable by every HDF5 since 1.8, 2008), which stores an attribute of more
///   than 64 KiB (the box's boundary names d strings: d = 4096 did not fit in the oldest).
///   Not for every file: the 1.8 format's metadata checksums make a reader beside a running
///   writer fail now and then on metadata the writer is rewriting (5 of 1500 `info` calls),
///   which the oldest format's readers never did.
/// - All growing elements are sampled together, so /particles/tokens/position/{step,time} are
///   the only step and time datasets; every other replica group and every observable holds hard
///   links to them (H5MD 1.1 allows this), and one append extends each of them once.
/// - PositionFrames Ends and None (docs/output.md, "What --save-positions writes") move the
///   frame clock to /observables, give the positions their own step and time (Ends) or empty
///   datasets (None), and hard-link replica r >= 1's labels to replica 0's (every replica has
///   the same); the last flushed frame's whole state goes to /run/checkpoint
///   (h5md_storage.cpp).
#include "mfattn/io/h5md.hpp"

#include <hdf5.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "io/h5md_writer.hpp"

#include <algorithm>
#include <filesystem>
#include <limits>

#include "io/h5md_objects.hpp"

namespace mfattn {
namespace h5md_internal {

/// The setup's own rules (a programming error of the caller: std::invalid_argument).
void Hdf5H5mdWriter::check_setup() const {
  const WriterSetup& setup = setup_;
  if (setup.n == 0 || setup.d == 0 || setup.replicas == 0) {
    throw std::invalid_argument("H5mdWriter: n, d and replicas must be positive");
  }
  for (const auto& [name, components] : setup.observables) {
    if (components == 0) throw std::invalid_argument("observable " + name + " has no components");
  }
  if (keeps_checkpoint() && setup.observables.empty())
    throw std::invalid_argument("H5mdWriter: without every frame's positions the frame clock "
                                "lives in /observables, so at least one observable is needed");
  if (setup.position_frames == PositionFrames::None && setup.velocity)
    throw std::invalid_argument("H5mdWriter: velocities follow the positions' frames, and "
                                "PositionFrames::None keeps none");
  if (!setup.field_shape.empty()) {
    std::size_t size = 1;
    for (std::size_t extent : setup.field_shape) size *= extent;
    if (setup.n != size || setup.d != 1 || setup.replicas != 1 || setup.velocity ||
        setup.position_frames != PositionFrames::All)
      throw std::invalid_argument("H5mdWriter: a density file has n = the shape's size, d = 1, one replica, "
                                  "every frame and no velocities");
  }
}

Hdf5H5mdWriter::Hdf5H5mdWriter(const WriterSetup& setup)
    : storage_(setup, setup.overwrite ? OutputStorage::Purpose::Replace : OutputStorage::Purpose::Create),
      setup_(setup),
      check_(setup.path) {
  check_setup();
  clock_group_ = frame_clock_path(setup);
  QuietHdf5Errors quiet;
  Handle creation = check_.own(H5Pcreate(H5P_FILE_CREATE), H5Pclose, "creating properties");
  // Every chunked dataset has a B-tree node of 2K entries, 3 KiB at HDF5's K = 32: more
  // than the two position rows of a replica with Ends. Files meant to be small take K = 4.
  if (keeps_checkpoint())
    check_(H5Pset_istore_k(creation.get(), kSmallFileChunkIndexK), "setting the chunk index size");
  Handle access = check_.own(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "creating properties");
  if (setup.d > kOldestFormatLargestD)
    check_(H5Pset_libver_bounds(access.get(), H5F_LIBVER_V18, H5F_LIBVER_V18), "choosing the file format");
  file_ = check_.own(H5Fcreate(storage_.write_path().c_str(),
                               setup.atomic_publish ? H5F_ACC_EXCL : H5F_ACC_TRUNC,
                               creation.get(), access.get()),
                     H5Fclose, "creating the file");
  storage_.reserve(file_.get(), kMetadataMargin);
  write_h5md_group();
  if (is_field_file())
    create_field_group();
  else
    create_particle_groups();
  create_observables();
  create_group(check_, file_.get(), "parameters");
  run_ = create_group(check_, file_.get(), "run");
  step_size_ = grow(run_.get(), "step_size", H5T_IEEE_F64LE, {}, kSeriesChunkBytes,
                    {false, setup_.fletcher32});
  if (keeps_checkpoint()) checkpoint_.create(check_, run_.get(), state_shape());
  write_run_info("running", 0.0, 0, 0);
  flush_file();
}

/// Reopens a file for --resume (see H5mdWriter::open_for_resume).
Hdf5H5mdWriter::Hdf5H5mdWriter(const WriterSetup& setup, ResumePoint& point)
    : storage_(setup, OutputStorage::Purpose::Resume), setup_(setup), check_(setup.path) {
  QuietHdf5Errors quiet;
  file_ = check_.own(H5Fopen(setup.path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose,
                     "opening the file for --resume");
  if (keeps_checkpoint() && setup.observables.empty())
    throw std::invalid_argument("H5mdWriter: a file without every frame's positions keeps its "
                                "frame clock in /observables, so at least one observable is needed");
  clock_group_ = frame_clock_path(setup);
  // A file written with another --save-positions has its clock elsewhere (check_resumable
  // refuses that first; a file edited by hand meets this).
  if (H5Lexists(file_.get(), "/run", H5P_DEFAULT) > 0 &&
      (H5Lexists(file_.get(), "/run/checkpoint", H5P_DEFAULT) > 0) != keeps_checkpoint())
    throw IoError(setup.path + ": --resume needs the --save-positions the file was written with");
  auto open = [&](const std::string& name) {
    Handle dataset = hdf5::open_dataset(file_.get(), name);
    if (!dataset.valid()) check_.fail("opening", name);
    return dataset;
  };
  step_ = open(clock_group_ + "step");
  time_ = open(clock_group_ + "time");
  run_ = check_.own(H5Gopen2(file_.get(), "/run", H5P_DEFAULT), H5Gclose, "opening", "/run");
  step_size_ = open("/run/step_size");
  auto length = [&](hid_t dataset, const char* what, std::size_t rank) {
    const auto dims = dataset_dims(check_, dataset, what);
    if (dims.size() != rank)
      throw IoError(setup.path + ": " + what + " has rank " + std::to_string(dims.size()) +
                    ", an mfattn file has " + std::to_string(rank));
    return dims[0];
  };
  hsize_t frames = std::min(length(step_.get(), "frame step", 1),
                            length(time_.get(), "frame time", 1));
  frames = std::min(frames, length(step_size_.get(), "run/step_size", 1));
  // Rows of the position element that every position dataset holds (Ends).
  hsize_t position_rows = std::numeric_limits<hsize_t>::max();
  const bool ends = setup.position_frames == PositionFrames::Ends;
  if (ends) {
    position_step_ = open("/particles/tokens/position/step");
    position_time_ = open("/particles/tokens/position/time");
    position_rows = std::min(length(position_step_.get(), "position/step", 1),
                             length(position_time_.get(), "position/time", 1));
  }
  if (is_field_file()) {
    Handle value = open(kFieldGroup + "value");
    const auto dims = dataset_dims(check_, value.get(), "fields/density/value");
    if (std::vector<std::size_t>(dims.begin() + std::min<std::size_t>(dims.size(), 1), dims.end()) != setup.field_shape)
      throw IoError(setup.path + ": --resume needs the same grid as the file");
    frames = std::min(frames, dims[0]);
    positions_.push_back(std::move(value));
  }
  for (std::size_t r = 0; r < setup.replicas && !is_field_file(); ++r) {
    const std::string group = "/particles/" + particle_group_name(r);
    particle_groups_.push_back(check_.own(H5Gopen2(file_.get(), group.c_str(), H5P_DEFAULT),
                                          H5Gclose, "opening", group));
    Handle value = open(group + "/position/value");
    const auto dims = dataset_dims(check_, value.get(), "position/value");
    if (dims.size() != 3 || dims[1] != setup.n || dims[2] != setup.d)
      throw IoError(setup.path + ": --resume needs the same n and d as the file");
    if (setup.position_frames == PositionFrames::None) continue;  // empty, never written
    hsize_t& rows = ends ? position_rows : frames;
    rows = std::min(rows, dims[0]);
    positions_.push_back(std::move(value));
    if (setup.velocity) {
      velocities_.push_back(open(group + "/velocity/value"));
      rows = std::min(rows, length(velocities_.back().get(), "velocity/value", 3));
    }
  }
  for (const auto& [name, components] : setup.observables) {
    observable_values_.push_back(open("/observables/" + name + "/value"));
    const std::size_t rank = 1 + (setup.replicas > 1) + (components > 1);
    frames = std::min(frames, length(observable_values_.back().get(), name.c_str(), rank));
  }
  if (frames == 0) throw IoError(setup.path + ": --resume found no complete frame");
  const std::size_t frame_size = setup.n * setup.d;
  point.x.resize(setup.replicas * frame_size);
  if (keeps_checkpoint()) {
    // The state comes from the checkpoint's latest complete slot; frames after it are
    // rewritten (a writer killed after a frame's rows but before its mark leaves them).
    frames = resume_from_checkpoint(frames, point);
  } else {
    read_row(check_, step_size_.get(), frames - 1, H5T_NATIVE_DOUBLE, &point.step_size, "step_size");
    for (std::size_t r = 0; r < setup.replicas; ++r)
      read_row(check_, positions_[r].get(), frames - 1, H5T_NATIVE_DOUBLE,
               point.x.data() + r * frame_size, "position/value");
  }
  frames_ = frames;
  flushed_frames_ = frames;
  point.frames = frames;
  read_row(check_, step_.get(), frames - 1, H5T_NATIVE_INT64, &point.step, "step");
  read_row(check_, time_.get(), frames - 1, H5T_NATIVE_DOUBLE, &point.time, "time");
  if (ends) {
    // Position rows up to the resumed frame stay; one of a frame after it (the final frame
    // of a part killed before its checkpoint was marked) is rewritten.
    std::vector<std::int64_t> steps(position_rows);
    if (position_rows > 0)
      check_(H5Dread(position_step_.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                     steps.data()),
             "reading", "position/step");
    position_rows_ = static_cast<hsize_t>(
        std::count_if(steps.begin(), steps.end(), [&](std::int64_t s) { return s <= point.step; }));
    flushed_position_rows_ = position_rows_;
  }
  storage_.reserve(file_.get(), kMetadataMargin);
  auto read_attribute = [&](const char* name, hid_t type, void* out) {
    if (H5Aexists(run_.get(), name) > 0) {
      Handle attribute(H5Aopen(run_.get(), name, H5P_DEFAULT), H5Aclose);
      H5Aread(attribute.get(), type, out);
    }
  };
  read_attribute("steps", H5T_NATIVE_INT64, &point.steps);
  read_attribute("rejected_steps", H5T_NATIVE_INT64, &point.rejected_steps);
  read_attribute("wall_time_s", H5T_NATIVE_DOUBLE, &point.wall_seconds);
}

/// --resume of a file with a checkpoint: the state of its latest complete slot below
/// `frames` goes to point (x, step size); returns the frames up to and including that
/// slot's, which the run continues after.
hsize_t Hdf5H5mdWriter::resume_from_checkpoint(hsize_t frames, ResumePoint& point) {
  std::int64_t step = 0, clock_step = 0;
  double time = 0.0, clock_time = 0.0;
  const std::int64_t frame = checkpoint_.open_latest(check_, file_.get(), state_shape(), frames, point, step, time);
  const hsize_t resumed = static_cast<hsize_t>(frame) + 1;
  read_row(check_, step_.get(), resumed - 1, H5T_NATIVE_INT64, &clock_step, "frame step");
  read_row(check_, time_.get(), resumed - 1, H5T_NATIVE_DOUBLE, &clock_time, "frame time");
  if (step != clock_step || time != clock_time)
    throw IoError(setup_.path + ": /run/checkpoint's slot of frame " + std::to_string(frame) + " holds step " +
                  std::to_string(step) + " but that frame has step " + std::to_string(clock_step) +
                  " (the file was changed by hand?)");
  return resumed;
}

void Hdf5H5mdWriter::write_parameters(const std::vector<Parameter>& parameters) {
  QuietHdf5Errors quiet;
  Handle group = check_.own(H5Gopen2(file_.get(), "parameters", H5P_DEFAULT), H5Gclose, "opening",
                            "/parameters");
  for (const auto& [name, value] : parameters) {
    const hid_t g = group.get();
    if (const auto* integer = std::get_if<std::int64_t>(&value)) {
      write_attribute(check_, g, name, H5T_STD_I64LE, H5T_NATIVE_INT64, {}, integer);
    } else if (const auto* real = std::get_if<double>(&value)) {
      write_attribute(check_, g, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {}, real);
    } else if (const auto* flag = std::get_if<bool>(&value)) {
      // HDF5 has no boolean type: a flag is an int8 scalar, 0 = false, 1 = true.
      const std::int8_t stored = *flag ? 1 : 0;
      write_attribute(check_, g, name, H5T_STD_I8LE, H5T_NATIVE_INT8, {}, &stored);
    } else if (const auto* text = std::get_if<std::string>(&value)) {
      write_string_attribute(check_, g, name, *text);
    } else {
      // A 1-D double array; an empty list is a 1-D attribute of size 0 (HDF5 1.10 accepts
      // it and h5py reads it as an empty array).
      const auto& list = std::get<std::vector<double>>(value);
      write_attribute(check_, g, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {list.size()},
                      list.data());
    }
  }
}

void Hdf5H5mdWriter::write_labels(const TokenLabels& labels) {
  const std::size_t n = setup_.n, k = setup_.position_dim;
  if (labels.aux_position.size() != n * k || labels.prompt_id.size() != n ||
      labels.presence.size() != n || labels.id.size() != n) {
    throw std::invalid_argument("write_labels: label sizes do not match n and position_dim");
  }
  QuietHdf5Errors quiet;
  for (std::size_t r = 0; r < particle_groups_.size(); ++r) {
    const hid_t g = particle_groups_[r].get();
    if (r > 0 && keeps_checkpoint()) {
      // Every replica has the same labels: one copy, as the frame clock is one copy.
      link_labels_of_replica_0(g, labels.generator_count > 0);
      continue;
    }
    write_label_datasets(g, n, k, labels.aux_position.data(), labels.prompt_id.data(),
                         labels.presence.data(), labels.id.data());
    if (labels.generator_count > 0) {
      const std::size_t d = setup_.d;
      if (labels.gauge_generators.size() != labels.generator_count * d * d)
        throw std::invalid_argument("write_labels: gauge_generators needs k * d * d numbers");
      write_fixed_dataset(check_, g, "gauge_generators", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
                          {labels.generator_count, d, d}, labels.gauge_generators.data());
    }
  }
  if (labels.prefix_count > 0) write_prefix(labels);
  if (labels.matrix_sets > 0) write_attention_matrices(labels);
}

/// A growing dataset with a row per frame, chunked by at most expected_frames rows.
Handle Hdf5H5mdWriter::grow(hid_t parent, const std::string& name, hid_t file_type,
                            const std::vector<hsize_t>& row_shape, std::size_t target_chunk_bytes,
                            Filters filters) {
  ChunkPlan plan;
  Handle dataset = create_growing_dataset(check_, parent, name, file_type, row_shape,
                                          target_chunk_bytes, filters, setup_.expected_frames,
                                          plan);
  return dataset;
}

/// A dataset of the position element (position and velocity step, time and value): a row
/// per frame (All, as grow), a row per kept frame (Ends: chunks of kEndsPositionRows rows,
/// so that 512 replicas do not take 512 chunks of a whole run's frames), or none (None: a
/// fixed, empty dataset, which keeps the element's shape [0, n, d] for readers). An invalid
/// handle for None.
Handle Hdf5H5mdWriter::position_dataset(hid_t parent, const std::string& name, hid_t file_type,
                                        const std::vector<hsize_t>& row_shape,
                                        std::size_t target_chunk_bytes, Filters filters) {
  switch (setup_.position_frames) {
    case PositionFrames::All:
      return grow(parent, name, file_type, row_shape, target_chunk_bytes, filters);
    case PositionFrames::Ends: {
      ChunkPlan plan;
      Handle dataset = create_growing_dataset(check_, parent, name, file_type, row_shape,
                                              target_chunk_bytes, filters, kEndsPositionRows,
                                              plan);
      return dataset;
    }
    case PositionFrames::None:
      break;
  }
  std::vector<hsize_t> dims{0};
  dims.insert(dims.end(), row_shape.begin(), row_shape.end());
  // No element is written, so the memory type is never used.
  write_fixed_dataset(check_, parent, name, file_type, file_type, dims, nullptr);
  return {};
}

void Hdf5H5mdWriter::write_h5md_group() {
  Handle h5md = create_group(check_, file_.get(), "h5md");
  write_int32_array_attribute(check_, h5md.get(), "version", {1, 1});
  Handle author = create_group(check_, h5md.get(), "author");
  write_string_attribute(check_, author.get(), "name", setup_.author);
  Handle creator = create_group(check_, h5md.get(), "creator");
  write_string_attribute(check_, creator.get(), "name", "mfattn");
  write_string_attribute(check_, creator.get(), "version", setup_.creator_version);
  Handle modules = create_group(check_, h5md.get(), "modules");
  Handle attention = create_group(check_, modules.get(), "attention");
  write_int32_array_attribute(check_, attention.get(), "version", {1, 0});
}

void Hdf5H5mdWriter::create_particle_groups() {
  Handle particles = create_group(check_, file_.get(), "particles");
  const std::vector<hsize_t> frame_shape{setup_.n, setup_.d};
  const auto dimension = static_cast<std::int32_t>(setup_.d);
  for (std::size_t r = 0; r < setup_.replicas; ++r) {
    Handle group = create_group(check_, particles.get(), particle_group_name(r));
    if (r > 0 && keeps_checkpoint()) {
      // Files meant to be small share what is the same in every replica group: the box, and
      // with None the (empty) position element. A group costs about 1 KiB of metadata.
      link_group_of_replica_0(group.get(), "box");
      if (setup_.position_frames == PositionFrames::None) {
        link_group_of_replica_0(group.get(), "position");
        particle_groups_.push_back(std::move(group));
        continue;
      }
    } else {
      Handle box = create_group(check_, group.get(), "box");
      write_attribute(check_, box.get(), "dimension", H5T_STD_I32LE, H5T_NATIVE_INT32, {},
                      &dimension);
      write_strings_attribute(check_, box.get(), "boundary",
                              std::vector<std::string>(setup_.d, "none"));
    }
    Handle position = create_group(check_, group.get(), "position");
    if (r == 0) {
      // All: the frame clock. Ends: the kept frames' own step and time. None: empty.
      Handle step = position_dataset(position.get(), "step", H5T_STD_I64LE, {},
                                     kSeriesChunkBytes, {false, setup_.fletcher32});
      Handle time = position_dataset(position.get(), "time", H5T_IEEE_F64LE, {},
                                     kSeriesChunkBytes, {false, setup_.fletcher32});
      if (keeps_every_position()) {
        step_ = std::move(step);
        time_ = std::move(time);
      } else {
        position_step_ = std::move(step);
        position_time_ = std::move(time);
      }
    } else {
      link_step_and_time(position.get(), kPositionClockGroup);
    }
    Handle value = position_dataset(position.get(), "value", H5T_IEEE_F64LE, frame_shape,
                                    kPositionChunkBytes, {setup_.deflate, setup_.fletcher32});
    if (value.valid()) positions_.push_back(std::move(value));
    if (setup_.velocity) {
      Handle velocity = create_group(check_, group.get(), "velocity");
      link_step_and_time(velocity.get(), kPositionClockGroup);
      velocities_.push_back(position_dataset(velocity.get(), "value", H5T_IEEE_F64LE,
                                             frame_shape, kPositionChunkBytes,
                                             {setup_.deflate, setup_.fletcher32}));
    }
    particle_groups_.push_back(std::move(group));
  }
}

void Hdf5H5mdWriter::create_field_group() {
  Handle fields = create_group(check_, file_.get(), "fields");
  Handle density = create_group(check_, fields.get(), "density");
  step_ = grow(density.get(), "step", H5T_STD_I64LE, {}, kSeriesChunkBytes, {false, setup_.fletcher32});
  time_ = grow(density.get(), "time", H5T_IEEE_F64LE, {}, kSeriesChunkBytes, {false, setup_.fletcher32});
  const std::vector<hsize_t> frame_shape(setup_.field_shape.begin(), setup_.field_shape.end());
  positions_.push_back(grow(density.get(), "value", H5T_IEEE_F64LE, frame_shape, kPositionChunkBytes,
                            {setup_.deflate, setup_.fletcher32}));
}

void Hdf5H5mdWriter::write_field_dataset(const std::string& name, const std::vector<std::size_t>& shape,
                                         const std::vector<double>& values) {
  if (!is_field_file()) throw std::invalid_argument("write_field_dataset: not a density file");
  std::size_t count = 1;
  for (std::size_t extent : shape) count *= extent;
  if (values.size() != count) throw std::invalid_argument("write_field_dataset: " + name + " does not fill its shape");
  Handle density = check_.own(H5Gopen2(file_.get(), kFieldGroup.c_str(), H5P_DEFAULT), H5Gclose, "opening",
                              kFieldGroup);
  write_fixed_dataset(check_, density.get(), name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
                      std::vector<hsize_t>(shape.begin(), shape.end()), values.data());
}

/// /particles/prefix: the frozen prefix tokens, shared by every replica. Their position is
/// a time-independent H5MD element (a dataset, not a step/time/value group).
void Hdf5H5mdWriter::write_prefix(const TokenLabels& labels) {
  const std::size_t count = labels.prefix_count, d = setup_.d, k = setup_.position_dim;
  if (labels.prefix_position.size() != count * d || labels.prefix_aux_position.size() != count * k ||
      labels.prefix_prompt_id.size() != count || labels.prefix_presence.size() != count ||
      labels.prefix_id.size() != count)
    throw std::invalid_argument("write_labels: prefix label sizes do not match P, d and k");
  Handle particles = check_.own(H5Gopen2(file_.get(), "particles", H5P_DEFAULT), H5Gclose,
                                "opening group", "particles");
  const htri_t exists = H5Lexists(particles.get(), "prefix", H5P_DEFAULT);
  check_(exists, "looking up", "particles/prefix");
  Handle group = exists > 0 ? check_.own(H5Gopen2(particles.get(), "prefix", H5P_DEFAULT),
                                         H5Gclose, "opening group", "particles/prefix")
                            : create_group(check_, particles.get(), "prefix");
  if (exists == 0) {
    Handle box = create_group(check_, group.get(), "box");
    const auto dimension = static_cast<std::int32_t>(d);
    write_attribute(check_, box.get(), "dimension", H5T_STD_I32LE, H5T_NATIVE_INT32, {},
                    &dimension);
    write_strings_attribute(check_, box.get(), "boundary", std::vector<std::string>(d, "none"));
  }
  const hid_t g = group.get();
  write_fixed_dataset(check_, g, "position", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {count, d},
                      labels.prefix_position.data());
  write_label_datasets(g, count, k, labels.prefix_aux_position.data(),
                       labels.prefix_prompt_id.data(), labels.prefix_presence.data(),
                       labels.prefix_id.data());
}

/// aux_position [count, k], prompt_id, presence and id [count] of a particle group.
/// Each matrix set's Q, K, V [L, d, d] and the layers' start times, in its particle group
/// (a shared set in /particles/tokens only).
void Hdf5H5mdWriter::write_attention_matrices(const TokenLabels& labels) {
  const std::size_t layers = labels.matrix_layers, sets = labels.matrix_sets;
  if ((sets != 1 && sets != particle_groups_.size()) || labels.layer_start.size() != layers)
    throw std::invalid_argument("write_labels: attention matrices need 1 or R sets of L layers");
  for (const TokenLabels::LayerArray& array : labels.layer_arrays) {
    std::size_t size = 1;
    for (std::size_t extent : array.shape) size *= extent;
    if (array.values.size() != sets * layers * size)
      throw std::invalid_argument("write_labels: attention matrix " + array.name + " needs sets x layers x its shape");
  }
  for (std::size_t set = 0; set < sets; ++set) {
    // A resumed run rewrites them (a longer horizon may add layers).
    const hid_t parent = particle_groups_[set].get();
    const htri_t exists = H5Lexists(parent, "attention_matrices", H5P_DEFAULT);
    check_(exists, "looking up", "attention_matrices");
    Handle group = exists > 0 ? check_.own(H5Gopen2(parent, "attention_matrices", H5P_DEFAULT),
                                           H5Gclose, "opening group", "attention_matrices")
                              : create_group(check_, parent, "attention_matrices");
    const hid_t g = group.get();
    write_fixed_dataset(check_, g, "layer_start", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {layers},
                        labels.layer_start.data());
    for (const TokenLabels::LayerArray& array : labels.layer_arrays) {
      std::vector<hsize_t> dims{layers};
      for (std::size_t extent : array.shape) dims.push_back(extent);
      write_fixed_dataset(check_, g, array.name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, dims,
                          array.values.data() + set * array.values.size() / sets);
    }
  }
}

void Hdf5H5mdWriter::write_label_datasets(hid_t g, std::size_t count, std::size_t k,
                                          const double* aux_position, const std::int32_t* prompt_id,
                                          const double* presence, const std::int64_t* id) {
  write_fixed_dataset(check_, g, "aux_position", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {count, k},
                      aux_position);
  write_fixed_dataset(check_, g, "prompt_id", H5T_STD_I32LE, H5T_NATIVE_INT32, {count}, prompt_id);
  write_fixed_dataset(check_, g, "presence", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {count}, presence);
  write_fixed_dataset(check_, g, "id", H5T_STD_I64LE, H5T_NATIVE_INT64, {count}, id);
}

void Hdf5H5mdWriter::create_observables() {
  Handle observables = create_group(check_, file_.get(), "observables");
  const hsize_t replicas = setup_.replicas;
  for (const auto& [name, components] : setup_.observables) {
    Handle group = create_group(check_, observables.get(), name);
    if (keeps_every_position() || step_.valid()) {
      link_step_and_time(group.get(), clock_group_);
    } else {
      // The first observable holds the frame clock that every other one links to.
      step_ = grow(group.get(), "step", H5T_STD_I64LE, {}, kSeriesChunkBytes,
                   {false, setup_.fletcher32});
      time_ = grow(group.get(), "time", H5T_IEEE_F64LE, {}, kSeriesChunkBytes,
                   {false, setup_.fletcher32});
    }
    std::vector<hsize_t> row_shape;
    // Without every frame's positions the observables are the bulk of the file, so
    // --deflate compresses them too. Not by default: a compressed chunk is compressed again
    // at every flush, which costs more than a small run's steps.
    if (replicas > 1) row_shape.push_back(replicas);
    if (components > 1) row_shape.push_back(components);
    observable_values_.push_back(
        grow(group.get(), "value", H5T_IEEE_F64LE, row_shape, kSeriesChunkBytes,
             {setup_.deflate && keeps_checkpoint(), setup_.fletcher32}));
  }
}

/// Hard links `step` and `time` in `group` to those in `source_group` (a path ending in '/').
void Hdf5H5mdWriter::link_step_and_time(hid_t group, const std::string& source_group) {
  for (const char* name : {"step", "time"}) {
    const std::string source = source_group + name;
    check_(H5Lcreate_hard(file_.get(), source.c_str(), group, name, H5P_DEFAULT, H5P_DEFAULT),
           "linking", source);
  }
}

/// Replaces the labels of a replica group r >= 1 by hard links to replica 0's (which
/// write_labels has just written); gauge_generators too when the run has a gauge.
void Hdf5H5mdWriter::link_labels_of_replica_0(hid_t group, bool gauge) {
  std::vector<const char*> names{"aux_position", "prompt_id", "presence", "id"};
  if (gauge) names.push_back("gauge_generators");
  for (const char* name : names) {
    const htri_t exists = H5Lexists(group, name, H5P_DEFAULT);
    check_(exists, "looking up", name);
    if (exists > 0) check_(H5Ldelete(group, name, H5P_DEFAULT), "deleting", name);
    const std::string source = std::string("/particles/tokens/") + name;
    check_(H5Lcreate_hard(file_.get(), source.c_str(), group, name, H5P_DEFAULT, H5P_DEFAULT),
           "linking", source);
  }
}

/// Hard links `name` in a replica group r >= 1 to /particles/tokens/<name>.
void Hdf5H5mdWriter::link_group_of_replica_0(hid_t group, const char* name) {
  const std::string source = std::string("/particles/tokens/") + name;
  check_(H5Lcreate_hard(file_.get(), source.c_str(), group, name, H5P_DEFAULT, H5P_DEFAULT),
         "linking", source);
}

/// The group of the frame clock a writer with this setup uses (see frame_clock_group).
std::string Hdf5H5mdWriter::frame_clock_path(const WriterSetup& setup) {
  if (!setup.field_shape.empty()) return kFieldGroup;
  if (setup.position_frames == PositionFrames::All) return kPositionClockGroup;
  return "/observables/" + setup.observables.front().first + "/";
}

}  // namespace h5md_internal

using namespace h5md_internal;

void write_realization(const std::string& path, const RealizationRecord& record) {
  const QuietHdf5Errors quiet;
  const Checker check(path);
  const Handle file = check.own(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose, "opening");
  const Handle group = create_group(check, file.get(), "realization");
  const hsize_t columns = record.columns;
  auto dims = [&](const std::vector<double>& values) {
    return columns > 1 ? std::vector<hsize_t>{values.size() / columns, columns} : std::vector<hsize_t>{values.size()};
  };
  write_fixed_dataset(check, group.get(), "target", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, dims(record.target),
                      record.target.data());
  write_fixed_dataset(check, group.get(), "realized", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, dims(record.realized),
                      record.realized.data());
  write_fixed_dataset(check, group.get(), "u", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {record.u.size()},
                      record.u.data());
  for (const auto& [name, value] : record.texts) write_string_attribute(check, group.get(), name, value);
  for (const auto& [name, value] : record.numbers)
    write_attribute(check, group.get(), name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {}, &value);
  check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "flushing /realization");
}

}  // namespace mfattn
