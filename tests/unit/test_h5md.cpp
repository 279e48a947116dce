// H5MD writer and reader: exact round trips, the layout contract of docs/output.md ("Layout")
// (checked through the HDF5 C API, independently of the writer's own code), refusal to
// overwrite, rejection of foreign files, and survival of flushed frames across SIGKILL.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "mfattn/io/h5md.hpp"

namespace {

namespace fs = std::filesystem;
using mfattn::H5mdWriter;
using mfattn::IoError;
using mfattn::WriterSetup;

/// A test-side HDF5 handle, closed with the matching H5*close.
class Id {
 public:
  Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;
  ~Id() {
    if (id_ >= 0) close_(id_);
  }
  operator hid_t() const { return id_; }  // NOLINT: reads naturally in HDF5 calls

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

Id open_read_only(const std::string& path) {
  return Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
}

std::vector<hsize_t> dims_of(hid_t file, const std::string& dataset_path) {
  Id dataset(H5Dopen2(file, dataset_path.c_str(), H5P_DEFAULT), H5Dclose);
  EXPECT_GE(dataset, 0) << dataset_path;
  Id space(H5Dget_space(dataset), H5Sclose);
  std::vector<hsize_t> dims(
      static_cast<std::size_t>(std::max(0, H5Sget_simple_extent_ndims(space))));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return dims;
}

template <class T>
std::vector<T> read_all(hid_t file, const std::string& dataset_path, hid_t memory_type) {
  std::size_t count = 1;
  for (hsize_t extent : dims_of(file, dataset_path)) count *= extent;
  std::vector<T> values(count);
  Id dataset(H5Dopen2(file, dataset_path.c_str(), H5P_DEFAULT), H5Dclose);
  EXPECT_GE(H5Dread(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
  return values;
}

Id open_attribute(hid_t file, const std::string& object, const std::string& name) {
  const hid_t attribute =
      H5Aopen_by_name(file, object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
  EXPECT_GE(attribute, 0) << object << " @" << name;
  return Id(attribute, H5Aclose);
}

/// Shape of an attribute; empty for a scalar.
std::vector<hsize_t> attribute_dims(hid_t file, const std::string& object,
                                    const std::string& name) {
  Id attribute = open_attribute(file, object, name);
  Id space(H5Aget_space(attribute), H5Sclose);
  std::vector<hsize_t> dims(
      static_cast<std::size_t>(std::max(0, H5Sget_simple_extent_ndims(space))));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  return dims;
}

template <class T>
std::vector<T> read_attribute(hid_t file, const std::string& object, const std::string& name,
                              hid_t memory_type) {
  std::size_t count = 1;
  for (hsize_t extent : attribute_dims(file, object, name)) count *= extent;
  std::vector<T> values(count);
  Id attribute = open_attribute(file, object, name);
  EXPECT_GE(H5Aread(attribute, memory_type, values.data()), 0);
  return values;
}

/// Reads a variable-length string attribute (scalar or 1-D) and checks that it is UTF-8.
std::vector<std::string> read_strings(hid_t file, const std::string& object,
                                      const std::string& name) {
  Id attribute = open_attribute(file, object, name);
  Id type(H5Aget_type(attribute), H5Tclose);
  EXPECT_EQ(H5Tget_class(type), H5T_STRING);
  EXPECT_GT(H5Tis_variable_str(type), 0);
  EXPECT_EQ(H5Tget_cset(type), H5T_CSET_UTF8);
  std::size_t count = 1;
  for (hsize_t extent : attribute_dims(file, object, name)) count *= extent;
  std::vector<char*> texts(count, nullptr);
  EXPECT_GE(H5Aread(attribute, type, texts.data()), 0);
  std::vector<std::string> values;
  for (char* text : texts) {
    values.emplace_back(text != nullptr ? text : "");
    H5free_memory(text);
  }
  return values;
}

std::string read_string(hid_t file, const std::string& object, const std::string& name) {
  auto values = read_strings(file, object, name);
  return values.size() == 1 ? values[0] : "<not one string>";
}

/// Class and byte size of an attribute's stored type.
std::pair<H5T_class_t, std::size_t> attribute_type(hid_t file, const std::string& object,
                                                   const std::string& name) {
  Id attribute = open_attribute(file, object, name);
  Id type(H5Aget_type(attribute), H5Tclose);
  return {H5Tget_class(type), H5Tget_size(type)};
}

struct StorageLayout {
  std::vector<hsize_t> chunk;
  std::vector<H5Z_filter_t> filters;
  std::vector<unsigned> deflate_parameters;
};

StorageLayout storage_of(hid_t file, const std::string& dataset_path) {
  Id dataset(H5Dopen2(file, dataset_path.c_str(), H5P_DEFAULT), H5Dclose);
  Id properties(H5Dget_create_plist(dataset), H5Pclose);
  StorageLayout layout;
  if (H5Pget_layout(properties) == H5D_CHUNKED) {
    layout.chunk.resize(8);
    layout.chunk.resize(static_cast<std::size_t>(H5Pget_chunk(properties, 8, layout.chunk.data())));
  }
  for (int i = 0; i < H5Pget_nfilters(properties); ++i) {
    unsigned flags = 0, config = 0;
    std::size_t count = 4;
    std::vector<unsigned> parameters(count);
    char name[64];
    const H5Z_filter_t filter = H5Pget_filter2(properties, static_cast<unsigned>(i), &flags, &count,
                                               parameters.data(), sizeof name, name, &config);
    layout.filters.push_back(filter);
    if (filter == H5Z_FILTER_DEFLATE)
      layout.deflate_parameters.assign(parameters.begin(), parameters.begin() + count);
  }
  return layout;
}

/// Positions with no short binary expansion, so exactness is a real check.
std::vector<double> positions_for(std::size_t frame, std::size_t count) {
  std::vector<double> x(count);
  for (std::size_t i = 0; i < count; ++i)
    x[i] = std::sin(0.7 * static_cast<double>(i + 1) + 1.3 * static_cast<double>(frame));
  return x;
}

mfattn::TokenLabels labels_with_wrong_sizes() { return {{1.0}, {0}, {1.0}, {0}}; }

class H5md : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::path(::testing::TempDir()) / "mfattn_h5md_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    folder_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(folder_, ignored);
  }
  std::string file(const std::string& name) const { return (folder_ / name).string(); }

  static WriterSetup setup_for(const std::string& path, std::size_t replicas) {
    WriterSetup setup;
    setup.path = path;
    setup.n = 3;
    setup.d = 2;
    setup.replicas = replicas;
    setup.position_dim = 2;
    setup.author = "Test Author";
    setup.creator_version = "0.1.0-test";
    setup.observables = {{"energy", 1}, {"moment_eigenvalues", 2}};
    return setup;
  }

  /// Observable arrays of frame `frame`: R * components numbers each.
  static std::vector<std::vector<double>> observables_for(std::size_t frame, std::size_t replicas) {
    return {positions_for(frame + 100, replicas), positions_for(frame + 200, replicas * 2)};
  }

  fs::path folder_;
};

TEST_F(H5md, WritesFramesThatReadBackExactly) {
  const std::string path = file("run.h5");
  const auto setup = setup_for(path, 2);
  const std::size_t frame_size = setup.replicas * setup.n * setup.d;
  {
    auto writer = H5mdWriter::create(setup);
    for (std::size_t f = 0; f < 5; ++f) {
      writer->append_frame(static_cast<std::int64_t>(10 * f), 0.1 * static_cast<double>(f),
                           positions_for(f, frame_size).data(), observables_for(f, 2));
    }
    writer->flush();
  }
  const mfattn::Frame last = mfattn::read_last_frame(path);
  EXPECT_EQ(last.n, 3u);
  EXPECT_EQ(last.d, 2u);
  EXPECT_EQ(last.step, 40);
  EXPECT_EQ(last.time, 0.1 * 4.0);
  const auto expected_last = positions_for(4, frame_size);
  EXPECT_EQ(last.x, std::vector<double>(expected_last.begin(), expected_last.begin() + 6));

  Id h5(open_read_only(path));
  ASSERT_GE(h5, 0);
  const auto replica0 = read_all<double>(h5, "/particles/tokens/position/value", H5T_NATIVE_DOUBLE);
  const auto replica1 =
      read_all<double>(h5, "/particles/tokens_r1/position/value", H5T_NATIVE_DOUBLE);
  const auto energy = read_all<double>(h5, "/observables/energy/value", H5T_NATIVE_DOUBLE);
  const auto moments =
      read_all<double>(h5, "/observables/moment_eigenvalues/value", H5T_NATIVE_DOUBLE);
  ASSERT_EQ(replica0.size(), 5u * 6u);
  ASSERT_EQ(moments.size(), 5u * 4u);
  for (std::size_t f = 0; f < 5; ++f) {
    const auto x = positions_for(f, frame_size);
    const auto observables = observables_for(f, 2);
    for (std::size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(replica0[f * 6 + i], x[i]);
      EXPECT_EQ(replica1[f * 6 + i], x[6 + i]);
    }
    for (std::size_t i = 0; i < 2; ++i) EXPECT_EQ(energy[f * 2 + i], observables[0][i]);
    for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(moments[f * 4 + i], observables[1][i]);
  }
  // Every element sampled with the positions carries the same step and time.
  const std::vector<std::int64_t> steps{0, 10, 20, 30, 40};
  for (const char* group : {"/particles/tokens/position", "/particles/tokens_r1/position",
                            "/observables/energy", "/observables/moment_eigenvalues"}) {
    EXPECT_EQ(read_all<std::int64_t>(h5, std::string(group) + "/step", H5T_NATIVE_INT64), steps)
        << group;
    const auto times = read_all<double>(h5, std::string(group) + "/time", H5T_NATIVE_DOUBLE);
    ASSERT_EQ(times.size(), 5u) << group;
    for (std::size_t f = 0; f < 5; ++f) EXPECT_EQ(times[f], 0.1 * static_cast<double>(f));
  }
}

TEST_F(H5md, WritesTheH5mdLayoutOfTheSpec) {
  const std::string path = file("layout.h5");
  { H5mdWriter::create(setup_for(path, 2))->flush(); }
  EXPECT_TRUE(mfattn::is_mfattn_file(path));
  Id h5(open_read_only(path));
  ASSERT_GE(h5, 0);
  EXPECT_EQ(read_attribute<std::int32_t>(h5, "/h5md", "version", H5T_NATIVE_INT32),
            (std::vector<std::int32_t>{1, 1}));
  EXPECT_EQ(read_string(h5, "/h5md/author", "name"), "Test Author");
  EXPECT_EQ(read_string(h5, "/h5md/creator", "name"), "mfattn");
  EXPECT_EQ(read_string(h5, "/h5md/creator", "version"), "0.1.0-test");
  EXPECT_EQ(
      read_attribute<std::int32_t>(h5, "/h5md/modules/attention", "version", H5T_NATIVE_INT32),
      (std::vector<std::int32_t>{1, 0}));
  for (const std::string group : {"/particles/tokens", "/particles/tokens_r1"}) {
    EXPECT_TRUE(attribute_dims(h5, group + "/box", "dimension").empty()) << "scalar dimension";
    EXPECT_EQ(read_attribute<std::int32_t>(h5, group + "/box", "dimension", H5T_NATIVE_INT32),
              std::vector<std::int32_t>{2});
    EXPECT_EQ(read_strings(h5, group + "/box", "boundary"),
              (std::vector<std::string>{"none", "none"}));
    EXPECT_EQ(dims_of(h5, group + "/position/step"), std::vector<hsize_t>{0});
    EXPECT_EQ(dims_of(h5, group + "/position/time"), std::vector<hsize_t>{0});
    EXPECT_EQ(dims_of(h5, group + "/position/value"), (std::vector<hsize_t>{0, 3, 2}));
  }
  EXPECT_LT(H5Lexists(h5, "/particles/tokens_r2", H5P_DEFAULT), 1);
  EXPECT_EQ(read_string(h5, "/run", "status"), "running");
  EXPECT_GT(H5Lexists(h5, "/parameters", H5P_DEFAULT), 0);
  // Several replicas: observables get a replica axis [T, R] / [T, R, c].
  EXPECT_EQ(dims_of(h5, "/observables/energy/value"), (std::vector<hsize_t>{0, 2}));
  EXPECT_EQ(dims_of(h5, "/observables/moment_eigenvalues/value"), (std::vector<hsize_t>{0, 2, 2}));

  const std::string single = file("single.h5");
  { H5mdWriter::create(setup_for(single, 1))->flush(); }
  Id one(open_read_only(single));
  EXPECT_EQ(dims_of(one, "/observables/energy/value"), std::vector<hsize_t>{0});
  EXPECT_EQ(dims_of(one, "/observables/moment_eigenvalues/value"), (std::vector<hsize_t>{0, 2}));
  EXPECT_EQ(dims_of(one, "/observables/energy/step"), std::vector<hsize_t>{0});
}

TEST_F(H5md, ChunksWholeFramesAndFiltersOnlyOnRequest) {
  const std::string plain = file("plain.h5"), filtered = file("filtered.h5");
  { H5mdWriter::create(setup_for(plain, 1)); }
  auto setup = setup_for(filtered, 1);
  setup.deflate = true;
  setup.fletcher32 = true;
  { H5mdWriter::create(setup); }

  Id h5(open_read_only(plain));
  const auto positions = storage_of(h5, "/particles/tokens/position/value");
  ASSERT_EQ(positions.chunk.size(), 3u);
  EXPECT_GE(positions.chunk[0], 1u);
  EXPECT_EQ(positions.chunk[1], 3u);
  EXPECT_EQ(positions.chunk[2], 2u);
  const hsize_t chunk_bytes = positions.chunk[0] * 3 * 2 * sizeof(double);
  EXPECT_GE(chunk_bytes, 64u * 1024u);
  EXPECT_LE(chunk_bytes, 1024u * 1024u);
  EXPECT_TRUE(positions.filters.empty());
  EXPECT_EQ(storage_of(h5, "/observables/energy/value").chunk.size(), 1u);
  EXPECT_TRUE(storage_of(h5, "/observables/energy/value").filters.empty());
  EXPECT_TRUE(storage_of(h5, "/particles/tokens/position/step").filters.empty());

  Id h5f(open_read_only(filtered));
  const auto compressed = storage_of(h5f, "/particles/tokens/position/value");
  EXPECT_EQ(compressed.filters, (std::vector<H5Z_filter_t>{H5Z_FILTER_SHUFFLE, H5Z_FILTER_DEFLATE,
                                                           H5Z_FILTER_FLETCHER32}));
  EXPECT_EQ(compressed.deflate_parameters, std::vector<unsigned>{4});
  EXPECT_EQ(storage_of(h5f, "/observables/energy/value").filters,
            std::vector<H5Z_filter_t>{H5Z_FILTER_FLETCHER32});

  // One frame larger than a chunk's budget still gets a chunk of exactly one frame.
  auto big = setup_for(file("big.h5"), 1);
  big.n = 100000;
  big.d = 3;
  { H5mdWriter::create(big); }
  Id h5b(open_read_only(big.path));
  EXPECT_EQ(storage_of(h5b, "/particles/tokens/position/value").chunk,
            (std::vector<hsize_t>{1, 100000, 3}));
}

TEST_F(H5md, WritesEveryParameterAsATypedAttribute) {
  const std::string path = file("parameters.h5");
  {
    auto writer = H5mdWriter::create(setup_for(path, 1));
    writer->write_parameters({{"seed", std::int64_t{1}}, {"beta", 0.5}});
    // A later write replaces earlier values, even with another type.
    writer->write_parameters({{"seed", std::int64_t{-1234567890123}},
                              {"beta", 2.5},
                              {"gradient_flow", true},
                              {"resume", false},
                              {"config_text", std::string("beta = 2.5 # θ → ∞")},
                              {"save_times", std::vector<double>{0.0, 0.5, 1.25}},
                              {"empty_list", std::vector<double>{}}});
  }
  Id h5(open_read_only(path));
  EXPECT_EQ(attribute_type(h5, "/parameters", "seed"), std::make_pair(H5T_INTEGER, std::size_t{8}));
  EXPECT_EQ(read_attribute<std::int64_t>(h5, "/parameters", "seed", H5T_NATIVE_INT64),
            std::vector<std::int64_t>{-1234567890123});
  EXPECT_EQ(attribute_type(h5, "/parameters", "beta"), std::make_pair(H5T_FLOAT, std::size_t{8}));
  EXPECT_EQ(read_attribute<double>(h5, "/parameters", "beta", H5T_NATIVE_DOUBLE),
            std::vector<double>{2.5});
  EXPECT_EQ(attribute_type(h5, "/parameters", "gradient_flow"),
            std::make_pair(H5T_INTEGER, std::size_t{1}));
  EXPECT_EQ(read_attribute<std::int8_t>(h5, "/parameters", "gradient_flow", H5T_NATIVE_INT8),
            std::vector<std::int8_t>{1});
  EXPECT_EQ(read_attribute<std::int8_t>(h5, "/parameters", "resume", H5T_NATIVE_INT8),
            std::vector<std::int8_t>{0});
  EXPECT_EQ(read_string(h5, "/parameters", "config_text"), "beta = 2.5 # θ → ∞");
  EXPECT_EQ(attribute_dims(h5, "/parameters", "save_times"), std::vector<hsize_t>{3});
  EXPECT_EQ(read_attribute<double>(h5, "/parameters", "save_times", H5T_NATIVE_DOUBLE),
            (std::vector<double>{0.0, 0.5, 1.25}));
  EXPECT_EQ(attribute_dims(h5, "/parameters", "empty_list"), std::vector<hsize_t>{0});
  for (const char* scalar : {"seed", "beta", "gradient_flow", "config_text"}) {
    EXPECT_TRUE(attribute_dims(h5, "/parameters", scalar).empty()) << scalar;
  }
}

TEST_F(H5md, WritesLabelsToEveryReplicaGroup) {
  const std::string path = file("labels.h5");
  const mfattn::TokenLabels labels{
      {0.5, -1.0, 0.25, 2.0, 1e-300, 3.5}, {0, 0, 1}, {1.0, 0.5, 0.0}, {7, 8, 9000000000}};
  {
    auto writer = H5mdWriter::create(setup_for(path, 2));
    writer->write_labels(labels);
  }
  Id h5(open_read_only(path));
  for (const std::string group : {"/particles/tokens", "/particles/tokens_r1"}) {
    EXPECT_EQ(dims_of(h5, group + "/aux_position"), (std::vector<hsize_t>{3, 2}));
    EXPECT_EQ(read_all<double>(h5, group + "/aux_position", H5T_NATIVE_DOUBLE),
              labels.aux_position);
    EXPECT_EQ(read_all<std::int32_t>(h5, group + "/prompt_id", H5T_NATIVE_INT32), labels.prompt_id);
    EXPECT_EQ(read_all<double>(h5, group + "/presence", H5T_NATIVE_DOUBLE), labels.presence);
    EXPECT_EQ(read_all<std::int64_t>(h5, group + "/id", H5T_NATIVE_INT64), labels.id);
  }
  // Without auxiliary coordinates (k = 0) aux_position is an empty [n, 0] dataset.
  auto no_aux = setup_for(file("no_aux.h5"), 1);
  no_aux.position_dim = 0;
  { H5mdWriter::create(no_aux)->write_labels({{}, {0, 1, 2}, {1.0, 1.0, 1.0}, {0, 1, 2}}); }
  Id h5k(open_read_only(no_aux.path));
  EXPECT_EQ(dims_of(h5k, "/particles/tokens/aux_position"), (std::vector<hsize_t>{3, 0}));
  EXPECT_THROW(H5mdWriter::create(setup_for(file("bad_labels.h5"), 1))
                   ->write_labels(labels_with_wrong_sizes()),
               std::invalid_argument);
}

TEST_F(H5md, RunInfoStartsRunningAndIsOverwritten) {
  const std::string path = file("run_info.h5");
  {
    auto writer = H5mdWriter::create(setup_for(path, 1));
    writer->write_run_info("failed: non-finite state", 0.5, 3, 1);
    writer->write_run_info("complete", 12.5, 1000, 17);
  }
  Id h5(open_read_only(path));
  EXPECT_EQ(read_string(h5, "/run", "status"), "complete");
  EXPECT_EQ(read_attribute<double>(h5, "/run", "wall_time_s", H5T_NATIVE_DOUBLE),
            std::vector<double>{12.5});
  EXPECT_EQ(read_attribute<std::int64_t>(h5, "/run", "steps", H5T_NATIVE_INT64),
            std::vector<std::int64_t>{1000});
  EXPECT_EQ(read_attribute<std::int64_t>(h5, "/run", "rejected_steps", H5T_NATIVE_INT64),
            std::vector<std::int64_t>{17});
}

TEST_F(H5md, RefusesToOverwriteExistingFile) {
  const std::string path = file("existing.h5");
  const auto setup = setup_for(path, 1);
  {
    auto writer = H5mdWriter::create(setup);
    writer->append_frame(5, 0.5, positions_for(0, 6).data(), observables_for(0, 1));
  }
  try {
    H5mdWriter::create(setup);
    FAIL() << "an existing file was overwritten without --overwrite";
  } catch (const IoError& error) {
    EXPECT_EQ(std::string(error.what()),
              "output file " + path + " exists (use --overwrite to replace it)");
  }
  EXPECT_EQ(mfattn::read_last_frame(path).step, 5) << "the refused create must not touch the file";

  auto replace = setup;
  replace.overwrite = true;
  { H5mdWriter::create(replace); }
  Id h5(open_read_only(path));
  EXPECT_EQ(dims_of(h5, "/particles/tokens/position/value"), (std::vector<hsize_t>{0, 3, 2}));
}

TEST_F(H5md, ReportsAnUncreatableFileAsIoErrorNamingIt) {
  const std::string path = file("no_such_folder/out.h5");
  try {
    H5mdWriter::create(setup_for(path, 1));
    FAIL() << "created a file in a missing folder";
  } catch (const IoError& error) {
    EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
  }
}

TEST_F(H5md, RejectsObservableArraysOfTheWrongSize) {
  auto writer = H5mdWriter::create(setup_for(file("sizes.h5"), 2));
  const auto x = positions_for(0, 12);
  EXPECT_THROW(writer->append_frame(0, 0.0, x.data(), observables_for(0, 1)),
               std::invalid_argument);
  EXPECT_THROW(writer->append_frame(0, 0.0, x.data(), {}), std::invalid_argument);
}

TEST_F(H5md, ReadLastFrameRejectsForeignFile) {
  const std::string text = file("notes.txt"), bare = file("bare.h5"), missing = file("missing.h5");
  std::ofstream(text) << "not an HDF5 file\n";
  { Id created(H5Fcreate(bare.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose); }
  for (const std::string& path : {text, bare}) {
    try {
      mfattn::read_last_frame(path);
      FAIL() << "read a frame from " << path;
    } catch (const IoError& error) {
      EXPECT_NE(std::string(error.what()).find(path + " is not an mfattn H5MD file"),
                std::string::npos)
          << error.what();
    }
    EXPECT_FALSE(mfattn::is_mfattn_file(path));
  }
  try {
    mfattn::read_last_frame(missing);
    FAIL() << "read a frame from a missing file";
  } catch (const IoError& error) {
    EXPECT_NE(std::string(error.what()).find(missing), std::string::npos) << error.what();
  }
  EXPECT_FALSE(mfattn::is_mfattn_file(missing));
  EXPECT_FALSE(mfattn::is_mfattn_file(folder_.string()));
  // A real mfattn file without frames is recognised, but has no last frame to resume from.
  const std::string empty = file("empty.h5");
  { H5mdWriter::create(setup_for(empty, 1)); }
  EXPECT_TRUE(mfattn::is_mfattn_file(empty));
  EXPECT_THROW(mfattn::read_last_frame(empty), IoError);
}

TEST_F(H5md, UnflushedWriterKilledLeavesFlushedFramesReadable) {
  const std::string path = file("killed.h5");
  const auto setup = setup_for(path, 2);
  const std::size_t frame_size = 2 * 3 * 2;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      auto writer = H5mdWriter::create(setup);
      for (std::size_t f = 0; f < 3; ++f) {
        writer->append_frame(static_cast<std::int64_t>(f), 0.5 * static_cast<double>(f),
                             positions_for(f, frame_size).data(), observables_for(f, 2));
      }
      writer->flush();
      writer->append_frame(3, 1.5, positions_for(3, frame_size).data(), observables_for(3, 2));
      raise(SIGKILL);  // no destructor, no close: as if the run were killed
    } catch (...) {
    }
    _exit(3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child failed before the kill";

  EXPECT_TRUE(mfattn::is_mfattn_file(path));
  const mfattn::Frame last = mfattn::read_last_frame(path);
  ASSERT_TRUE(last.step == 2 || last.step == 3) << last.step;
  const auto expected = positions_for(static_cast<std::size_t>(last.step), frame_size);
  EXPECT_EQ(last.x, std::vector<double>(expected.begin(), expected.begin() + 6));
  EXPECT_EQ(last.time, 0.5 * static_cast<double>(last.step));

  Id h5(open_read_only(path));
  ASSERT_GE(h5, 0);
  const auto replica1 =
      read_all<double>(h5, "/particles/tokens_r1/position/value", H5T_NATIVE_DOUBLE);
  const auto energy = read_all<double>(h5, "/observables/energy/value", H5T_NATIVE_DOUBLE);
  ASSERT_GE(replica1.size(), 3u * 6u);
  ASSERT_GE(energy.size(), 3u * 2u);
  for (std::size_t f = 0; f < 3; ++f) {
    const auto x = positions_for(f, frame_size);
    for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(replica1[f * 6 + i], x[6 + i]);
    for (std::size_t i = 0; i < 2; ++i) EXPECT_EQ(energy[f * 2 + i], observables_for(f, 2)[0][i]);
  }
  EXPECT_EQ(read_string(h5, "/run", "status"), "running");
}

// Frames are staged in memory until flush(): a writer killed after appending frames it has
// not flushed leaves exactly the flushed ones (none of the staged rows, not a part of them),
// and one flush writes every frame staged since the last.
TEST_F(H5md, StagedFramesReachTheFileOnlyAtFlush) {
  const std::size_t frame_size = 2 * 3 * 2;
  auto killed_after = [&](const std::string& name, bool flush_the_rest) {
    const std::string path = file(name);
    const pid_t child = fork();
    if (child == 0) {
      try {
        auto writer = H5mdWriter::create(setup_for(path, 2));
        for (std::size_t f = 0; f < 5; ++f) {
          writer->append_frame(static_cast<std::int64_t>(f), 0.5 * static_cast<double>(f),
                               positions_for(f, frame_size).data(), observables_for(f, 2));
          if (f == 1) writer->flush();  // frames 0 and 1
        }
        if (flush_the_rest) writer->flush();
        raise(SIGKILL);
      } catch (...) {
      }
      _exit(3);
    }
    int status = 0;
    EXPECT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child failed before the kill";
    return path;
  };
  for (const bool flush_the_rest : {false, true}) {
    const std::string path = killed_after(flush_the_rest ? "flushed.h5" : "staged.h5", flush_the_rest);
    const std::size_t frames = flush_the_rest ? 5 : 2;
    Id h5(open_read_only(path));
    ASSERT_GE(h5, 0);
    for (const char* dataset : {"/particles/tokens/position/value", "/particles/tokens_r1/position/value",
                                "/particles/tokens/position/step", "/observables/energy/value",
                                "/observables/moment_eigenvalues/value", "/run/step_size"})
      EXPECT_EQ(dims_of(h5, dataset).front(), frames) << dataset;
    const auto replica1 = read_all<double>(h5, "/particles/tokens_r1/position/value", H5T_NATIVE_DOUBLE);
    const auto energy = read_all<double>(h5, "/observables/energy/value", H5T_NATIVE_DOUBLE);
    for (std::size_t f = 0; f < frames; ++f) {
      const auto x = positions_for(f, frame_size);
      for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(replica1[f * 6 + i], x[6 + i]);
      for (std::size_t i = 0; i < 2; ++i) EXPECT_EQ(energy[f * 2 + i], observables_for(f, 2)[0][i]);
    }
  }
}

// A writer destroyed with frames still staged (a caller that never flushed them) writes them
// as it closes, as a stream does.
TEST_F(H5md, DestroyedWriterFlushesItsStagedFrames) {
  const std::string path = file("closed.h5");
  const std::size_t frame_size = 2 * 3 * 2;
  {
    auto writer = H5mdWriter::create(setup_for(path, 2));
    for (std::size_t f = 0; f < 3; ++f)
      writer->append_frame(static_cast<std::int64_t>(f), 0.5 * static_cast<double>(f),
                           positions_for(f, frame_size).data(), observables_for(f, 2));
    EXPECT_GT(writer->staged_bytes(), 0u);
  }
  EXPECT_EQ(mfattn::read_last_frame(path).step, 2);
}

// --save-positions ends: a frame's checkpoint slot counts only once flush() has marked it.
// A writer killed after appending a frame but before flushing it leaves the previous slot
// as the latest complete one; --resume continues from it and rewrites the frame after it.
TEST_F(H5md, EndsCheckpointIsMarkedOnlyByFlushAndResumesFromTheLastFlushedFrame) {
  const std::string path = file("ends.h5");
  auto setup = setup_for(path, 2);
  setup.position_frames = mfattn::PositionFrames::Ends;
  const std::size_t frame_size = 2 * 3 * 2;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      auto writer = H5mdWriter::create(setup);
      for (std::size_t f = 0; f < 3; ++f) {
        writer->append_frame(static_cast<std::int64_t>(f), 0.5 * static_cast<double>(f),
                             positions_for(f, frame_size).data(), observables_for(f, 2), 0.1);
        writer->flush();
      }
      writer->append_frame(3, 1.5, positions_for(3, frame_size).data(), observables_for(3, 2), 0.1);
      raise(SIGKILL);  // no flush, no close
    } catch (...) {
    }
    _exit(3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child failed before the kill";
  {
    Id h5(open_read_only(path));
    ASSERT_GE(h5, 0);
    const auto marks = read_all<std::int64_t>(h5, "/run/checkpoint/frame", H5T_NATIVE_INT64);
    EXPECT_EQ(marks, (std::vector<std::int64_t>{2, 1}));
    EXPECT_EQ(dims_of(h5, "/particles/tokens/position/value"), (std::vector<hsize_t>{1, 3, 2}));
  }
  const mfattn::Frame last = mfattn::read_last_frame(path);
  EXPECT_EQ(last.step, 2);
  EXPECT_EQ(last.time, 1.0);
  const auto expected = positions_for(2, frame_size);
  EXPECT_EQ(last.x, std::vector<double>(expected.begin(), expected.begin() + 6));

  mfattn::ResumePoint point;
  {
    auto writer = H5mdWriter::open_for_resume(setup, point);
    EXPECT_EQ(point.frames, 3u);
    EXPECT_EQ(point.step, 2);
    EXPECT_EQ(point.step_size, 0.1);
    EXPECT_EQ(point.x, expected);
    writer->append_frame(3, 1.5, positions_for(30, frame_size).data(), observables_for(30, 2), 0.1,
                         nullptr, mfattn::FrameRole::Final);
    writer->flush();
  }
  Id h5(open_read_only(path));
  EXPECT_EQ(read_all<std::int64_t>(h5, "/particles/tokens/position/step", H5T_NATIVE_INT64),
            (std::vector<std::int64_t>{0, 3}));
  EXPECT_EQ(read_all<double>(h5, "/observables/moment_eigenvalues/time", H5T_NATIVE_DOUBLE),
            (std::vector<double>{0.0, 0.5, 1.0, 1.5}));
  const auto replica1 = read_all<double>(h5, "/particles/tokens_r1/position/value", H5T_NATIVE_DOUBLE);
  const auto final_positions = positions_for(30, frame_size);
  EXPECT_EQ(std::vector<double>(replica1.begin() + 6, replica1.end()),
            std::vector<double>(final_positions.begin() + 6, final_positions.end()));
  // The final frame goes to both slots.
  EXPECT_EQ(read_all<std::int64_t>(h5, "/run/checkpoint/frame", H5T_NATIVE_INT64),
            (std::vector<std::int64_t>{3, 3}));
}

}  // namespace
