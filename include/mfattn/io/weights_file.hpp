#pragma once
/// \file weights_file.hpp
/// The weights of a whole layer from an HDF5 file (`--weights`, docs/model.md section 2b),
/// float64 datasets, each with an optional leading layer axis L:
///   /attention/query [H, r, d]   /attention/key [H, r, d]   /attention/value [H, r, d]
///   /attention/output [d, H r]   head h's V_h = output[:, h r:(h+1) r] value[h]
///   /mlp/w1 [W, d]  /mlp/b1 [W]  /mlp/w2 [d, W]  /mlp/b2 [d], attribute /mlp activation
/// (the layouts of torch.nn.MultiheadAttention's in_proj split per head and its out_proj, and
/// of a TransformerEncoderLayer's linear1 and linear2).
#include <cstddef>
#include <string>
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

/// Reads path. Throws std::invalid_argument naming the dataset when the file is not HDF5,
/// a dataset is not float64, or a number is not finite; shapes are the caller's to check.
WeightsFile read_weights_file(const std::string& path);

}  // namespace mfattn
