#pragma once
// The differentiated numbers of a Model (include/mfattn/backends/derivatives.hpp) as the
// Python module gives and takes them: a dict of NumPy arrays keyed by the --weights file's
// dataset names ("attention/query" [H, r, d], "attention/key", "attention/value" [H, rv, d],
// "attention/output" [d, H rv], "mlp/w1", "mlp/b1", "mlp/w2", "mlp/b2"; a leading replica axis
// for per-replica sets) and the other numbers' keywords ("beta", "prefix_init" [P, d],
// "presence" [n], the factor's: "aux_lambda", ...). docs/python.md, "Derivatives".
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include <memory>

#include "mfattn/backends/derivatives.hpp"
#include "mfattn/core/model.hpp"
#include "mfattn/io/weights_file.hpp"

namespace mfattn::python {

/// The keys of a model's numbers, in order, with each one's shape.
struct NumberKey {
  std::string key;
  std::vector<pybind11::ssize_t> shape;
};
std::vector<NumberKey> number_keys(const Model& model);

/// The numbers as a dict (a gradient, or the weights themselves).
pybind11::dict numbers_dict(const Model& model, const FieldNumbers& numbers);

/// A tangent from a dict whose keys are some of number_keys' (the others: 0). ValueError names
/// an unknown key (with the keys taken), a misshapen one (with its shape) or a non-finite
/// number; TypeError a value that is not an array of real numbers. `what` prefixes the
/// messages ("weight_tangents").
FieldNumbers numbers_from_dict(const Model& model, const pybind11::handle& values, const std::string& what);

/// An array of real numbers (float, int or unsigned dtype) as C-contiguous float64, copied only
/// where it is not one already; TypeError "<what>: not an array of real numbers" otherwise.
pybind11::array_t<double, pybind11::array::c_style> real_array(const pybind11::handle& value, const std::string& what);

/// Model(weights=dict): the dict's arrays as the --weights file's datasets (its keys are the
/// file's: "attention/query", ..., "mlp/b2", each an array of real numbers, a leading layer axis
/// allowed), the activation `activation` (the model's mlp_activation). ValueError names an
/// unknown key (with the keys taken) or a non-finite number; TypeError a value that is not an
/// array of real numbers. The shapes are validate()'s to check, as a file's.
std::shared_ptr<const WeightsFile> weights_from_dict(const pybind11::handle& values, const std::string& activation);

}  // namespace mfattn::python
