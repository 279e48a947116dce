// The differentiated numbers as Python dicts (field_numbers.hpp).
#include "field_numbers.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

namespace py = pybind11;

namespace mfattn::python {
namespace {

/// Where each key's numbers live in FieldNumbers: a visitor of (key, shape, numbers in
/// row-major order) over every number, in number_keys' order. The matrices of the heads are
/// stacked as the weights file stacks them; `at` gives a pointer to the number of flat index e.
struct KeyNumbers {
  NumberKey key;
  std::function<double&(std::size_t)> at;
  std::size_t size() const {
    std::size_t count = 1;
    for (auto extent : key.shape) count *= std::size_t(extent);
    return count;
  }
};

std::vector<KeyNumbers> key_numbers(const Model& model, FieldNumbers& numbers) {
  std::vector<KeyNumbers> keys;
  const bool per_replica = model.matrices.size() > 1;
  const std::size_t sets = numbers.sets.size();
  const LayerNumbers& first = numbers.sets.front();
  const auto H = first.heads.size();
  const auto r = std::size_t(first.heads.front().query.rows()), rv = std::size_t(first.heads.front().value.rows());
  const std::size_t d = model.d;
  auto shaped = [&](std::vector<py::ssize_t> shape) {
    if (per_replica) shape.insert(shape.begin(), py::ssize_t(sets));
    return shape;
  };
  // Flat index e of [sets?][rest]: the set and the index within one set of `per_set` numbers.
  auto split = [](std::size_t e, std::size_t per_set) { return std::pair{e / per_set, e % per_set}; };
  auto head_matrix = [&](const char* key, Matrix HeadNumbers::*member, std::size_t rows) {
    keys.push_back({{key, shaped({py::ssize_t(H), py::ssize_t(rows), py::ssize_t(d)})},
                    [&numbers, member, rows, d, split, H](std::size_t e) -> double& {
                      const auto [s, rest] = split(e, H * rows * d);
                      const std::size_t h = rest / (rows * d), a = rest / d % rows, b = rest % d;
                      return (numbers.sets[s].heads[h].*member)(Eigen::Index(a), Eigen::Index(b));
                    }});
  };
  head_matrix("attention/query", &HeadNumbers::query, r);
  head_matrix("attention/key", &HeadNumbers::key, r);
  head_matrix("attention/value", &HeadNumbers::value, rv);
  keys.push_back({{"attention/output", shaped({py::ssize_t(d), py::ssize_t(H * rv)})},
                  [&numbers, split, H, rv, d](std::size_t e) -> double& {
                    const auto [s, rest] = split(e, d * H * rv);
                    const std::size_t a = rest / (H * rv), column = rest % (H * rv);
                    return numbers.sets[s].heads[column / rv].output(Eigen::Index(a), Eigen::Index(column % rv));
                  }});
  if (first.w1.size()) {
    const auto W = std::size_t(first.w1.rows());
    keys.push_back({{"mlp/w1", shaped({py::ssize_t(W), py::ssize_t(d)})}, [&numbers, split, W, d](std::size_t e) -> double& {
                      const auto [s, rest] = split(e, W * d);
                      return numbers.sets[s].w1.data()[rest];
                    }});
    keys.push_back({{"mlp/b1", shaped({py::ssize_t(W)})}, [&numbers, split, W](std::size_t e) -> double& {
                      const auto [s, rest] = split(e, W);
                      return numbers.sets[s].b1.data()[rest];
                    }});
    keys.push_back({{"mlp/w2", shaped({py::ssize_t(d), py::ssize_t(W)})}, [&numbers, split, W, d](std::size_t e) -> double& {
                      const auto [s, rest] = split(e, W * d);
                      return numbers.sets[s].w2.data()[rest];
                    }});
    keys.push_back({{"mlp/b2", shaped({py::ssize_t(d)})}, [&numbers, split, d](std::size_t e) -> double& {
                      const auto [s, rest] = split(e, d);
                      return numbers.sets[s].b2.data()[rest];
                    }});
  }
  keys.push_back({{"beta", {}}, [&numbers](std::size_t) -> double& { return numbers.beta; }});
  if (!numbers.prefix.empty())
    keys.push_back({{"prefix_init", {py::ssize_t(numbers.prefix.size() / d), py::ssize_t(d)}},
                    [&numbers](std::size_t e) -> double& { return numbers.prefix[e]; }});
  keys.push_back({{"presence", {py::ssize_t(model.n)}}, [&numbers](std::size_t e) -> double& { return numbers.presence[e]; }});
  for (const FactorNumberName& name : factor_number_names(model.pair_terms)) {
    std::vector<py::ssize_t> shape;
    if (model.pair_terms.factor == AuxFactor::Toeplitz) shape.push_back(py::ssize_t(name.count));
    const std::size_t first_number = name.first;
    keys.push_back({{name.name, shape}, [&numbers, first_number](std::size_t e) -> double& {
                      return numbers.factor[first_number + e];
                    }});
  }
  return keys;
}

std::string shape_text(const std::vector<py::ssize_t>& shape) {
  std::string text = "(";
  for (std::size_t a = 0; a < shape.size(); ++a) text += (a ? ", " : "") + std::to_string(shape[a]);
  return text + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace

py::array_t<double, py::array::c_style> real_array(const py::handle& value, const std::string& what) {
  py::array array = py::array::ensure(value);
  if (!array || (array.dtype().kind() != 'f' && array.dtype().kind() != 'i' && array.dtype().kind() != 'u'))
    throw py::type_error(what + ": not an array of real numbers");
  return py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(array);
}

std::shared_ptr<const WeightsFile> weights_from_dict(const py::handle& values, const std::string& activation) {
  auto file = std::make_shared<WeightsFile>();
  const std::pair<const char*, WeightArray WeightsFile::*> datasets[] = {
      {"attention/query", &WeightsFile::query}, {"attention/key", &WeightsFile::key},
      {"attention/value", &WeightsFile::value}, {"attention/output", &WeightsFile::output},
      {"mlp/w1", &WeightsFile::w1},             {"mlp/b1", &WeightsFile::b1},
      {"mlp/w2", &WeightsFile::w2},             {"mlp/b2", &WeightsFile::b2}};
  for (const auto& [name, value] : py::reinterpret_borrow<py::dict>(values)) {
    const std::string key = py::str(name).cast<std::string>();
    const auto found = std::find_if(std::begin(datasets), std::end(datasets), [&](const auto& d) { return key == d.first; });
    if (found == std::end(datasets)) {
      std::string taken;
      for (const auto& d : datasets) taken += (taken.empty() ? "" : ", ") + std::string(d.first);
      throw py::value_error("weights: unknown key " + py::repr(name).cast<std::string>() + " (a weights dict takes " + taken + ")");
    }
    const auto numbers = real_array(value, "weights[\"" + key + "\"]");
    WeightArray& array = (*file).*(found->second);
    array.shape.assign(numbers.shape(), numbers.shape() + numbers.ndim());
    array.values.assign(numbers.data(), numbers.data() + numbers.size());
    for (std::size_t e = 0; e < array.values.size(); ++e)
      if (!std::isfinite(array.values[e]))
        throw py::value_error("weights[\"" + key + "\"]: element " + std::to_string(e) + " is not finite");
  }
  if (file->w1.present() || file->b1.present() || file->w2.present() || file->b2.present()) file->activation = activation;
  return file;
}

std::vector<NumberKey> number_keys(const Model& model) {
  FieldNumbers zero = zero_numbers(model);
  std::vector<NumberKey> keys;
  for (const KeyNumbers& entry : key_numbers(model, zero)) keys.push_back(entry.key);
  return keys;
}

py::dict numbers_dict(const Model& model, const FieldNumbers& numbers) {
  FieldNumbers copy = numbers;
  py::dict out;
  for (const KeyNumbers& entry : key_numbers(model, copy)) {
    if (entry.key.shape.empty()) {
      out[py::str(entry.key.key)] = py::float_(entry.at(0));
      continue;
    }
    py::array_t<double> array(entry.key.shape);
    double* data = array.mutable_data();
    for (std::size_t e = 0; e < entry.size(); ++e) data[e] = entry.at(e);
    out[py::str(entry.key.key)] = array;
  }
  return out;
}

FieldNumbers numbers_from_dict(const Model& model, const py::handle& values, const std::string& what) {
  if (!py::isinstance<py::dict>(values))
    throw py::type_error(what + ": expected a dict of arrays keyed as model.vjp's result, got " +
                         py::str(py::type::of(values).attr("__name__")).cast<std::string>());
  FieldNumbers numbers = zero_numbers(model);
  std::vector<KeyNumbers> keys = key_numbers(model, numbers);
  for (const auto& [name, value] : py::reinterpret_borrow<py::dict>(values)) {
    const std::string key = py::str(name).cast<std::string>();
    const auto found = std::find_if(keys.begin(), keys.end(), [&](const KeyNumbers& k) { return k.key.key == key; });
    if (found == keys.end()) {
      std::string taken;
      for (const KeyNumbers& k : keys) taken += (taken.empty() ? "" : ", ") + k.key.key;
      throw py::value_error(what + ": unknown key " + py::repr(name).cast<std::string>() + " (this model takes " + taken + ")");
    }
    const auto numbers_in = real_array(value, what + "[\"" + key + "\"]");
    std::vector<py::ssize_t> shape(numbers_in.shape(), numbers_in.shape() + numbers_in.ndim());
    if (shape != found->key.shape)
      throw py::value_error(what + "[\"" + key + "\"]: shape " + shape_text(shape) + "; expected " +
                            shape_text(found->key.shape));
    const double* data = numbers_in.data();
    for (std::size_t e = 0; e < found->size(); ++e) {
      if (!std::isfinite(data[e]))
        throw py::value_error(what + "[\"" + key + "\"]: element " + std::to_string(e) + " is not finite");
      found->at(e) = data[e];
    }
  }
  return numbers;
}

}  // namespace mfattn::python
