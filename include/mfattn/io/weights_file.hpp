#pragma once
/// \file weights_file.hpp
/// The weights of a whole layer from an HDF5 file (`--weights`, docs/model.md section 2b),
/// float64 datasets, each with an optional leading layer axis L:
///   /attention/query [H, r, d]   /attention/key [H, r, d]   /attention/value [H, rv, d]
///   /attention/output [d, H rv]  head h's V_h = output[:, h rv:(h+1) rv] value[h]
/// (rv = r for PyTorch's layers; a head that keeps a d x d value has rv = d and output I)
///   /mlp/w1 [W, d]  /mlp/b1 [W]  /mlp/w2 [d, W]  /mlp/b2 [d], attribute /mlp activation
/// (the layouts of torch.nn.MultiheadAttention's in_proj split per head and its out_proj, and
/// of a TransformerEncoderLayer's linear1 and linear2).
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace mfattn {

/// One float64 dataset: its shape and its numbers in row-major order.
struct WeightArray {
  std::vector<std::size_t> shape;
  std::vector<double> values;
  bool present() const { return !shape.empty(); }
};

/// Every dataset the file holds of the layout above (an absent one: no shape), and the
/// activation attribute ("" when absent).
struct WeightsFile {
  WeightArray query, key, value, output, w1, b1, w2, b2;
  std::string activation;
};

/// The heads' value space rv: /attention/value's next-to-last extent, r where it has none.
inline std::size_t value_dim_of(const WeightsFile& file, std::size_t r) {
  const std::size_t rank = file.value.shape.size();
  return rank >= 2 ? file.value.shape[rank - 2] : r;
}

/// Reads path. Throws std::invalid_argument naming the dataset when the file is not HDF5,
/// a dataset is not float64, or a number is not finite; shapes are the caller's to check.
WeightsFile read_weights_file(const std::string& path);

/// What a weights file may hold beside the layout (`mfattn fit`'s record), or a file of
/// arrays alone (`mfattn keys`): float64 arrays at the paths given ("/fit/loss"), of the
/// shape given (none: one axis of all the values), and string attributes of the group
/// `attributes_of`.
struct ArrayRecord {
  struct Array {
    std::string path;
    std::vector<double> values;
    std::vector<std::size_t> shape = {};  ///< row-major; its product is values.size()
  };
  std::vector<Array> arrays;
  std::string attributes_of;
  std::vector<std::pair<std::string, std::string>> attributes;
};

/// Writes `file` (every present dataset, /mlp's activation where the file has w1) and
/// `record` to `path` whole or not at all: into a hidden temporary file beside it, renamed
/// over `path` once closed (an earlier file there is replaced). Throws IoError (nothing left
/// behind) when a write fails.
void write_weights_file(const std::string& path, const WeightsFile& file,
                        const ArrayRecord& record = {});

/// A file of the record alone, written as write_weights_file writes one.
inline void write_array_file(const std::string& path, const ArrayRecord& record) {
  write_weights_file(path, WeightsFile{}, record);
}

}  // namespace mfattn
