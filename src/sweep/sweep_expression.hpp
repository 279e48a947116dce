#pragma once
// The arithmetic of a sweep file's [derived] section (docs/sweeps.md, "Derived values"):
// numbers, + - * / ^, unary signs, parentheses, sqrt exp log abs min max pow floor ceil,
// the constants pi and e, and variables (run options, '-' written as '_'). Parsed once per
// sweep file, evaluated once per case in IEEE double with the C++ standard functions.
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace mfattn {

/// A syntax error: `column` is 1-based within the expression text.
struct ExpressionSyntaxError : std::runtime_error {
  ExpressionSyntaxError(std::size_t column, const std::string& message)
      : std::runtime_error(message), column(column) {}
  std::size_t column;
};

/// An evaluation that cannot give a finite number: a division by zero, or an operation whose
/// result is infinite or NaN (the message shows the operation and its operands).
struct ExpressionValueError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A parsed expression: postfix steps over a value stack.
class Expression {
 public:
  /// Parses `text`. Throws ExpressionSyntaxError.
  static Expression parse(std::string_view text);

  /// The variables as written (e.g. "save_every"), in order of first use; evaluate() takes
  /// their values in this order.
  const std::vector<std::string>& variables() const { return variables_; }

  /// The value for the given variable values. Every intermediate result must be finite.
  /// Throws ExpressionValueError.
  double evaluate(const std::vector<double>& variable_values) const;

  enum class Op { Number, Variable, Negate, Add, Subtract, Multiply, Divide, Power,
                  Sqrt, Exp, Log, Abs, Floor, Ceil, Pow, Min, Max };
  struct Step {
    Op op;
    double number = 0.0;     ///< Number: the value
    std::size_t index = 0;   ///< Variable: its index in variables(); Min / Max: argument count
  };

 private:
  friend class ExpressionParser;
  std::vector<Step> steps_;
  std::vector<std::string> variables_;
};

}  // namespace mfattn
