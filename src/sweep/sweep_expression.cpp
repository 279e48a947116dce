// The [derived] arithmetic of sweep files: a recursive-descent parser to postfix steps, and
// their evaluation in IEEE double.
//
// Grammar (whitespace between tokens is ignored):
//   sum     := product (('+' | '-') product)*
//   product := unary (('*' | '/') unary)*
//   unary   := ('-' | '+') unary | power
//   power   := primary ('^' unary)?          right-associative, binds tighter than a sign
//   primary := number | name | name '(' sum (',' sum)* ')' | '(' sum ')'
//   number  := digits ['.' [digits]] [exponent] | '.' digits [exponent]
//   exponent:= ('e' | 'E') ['+' | '-'] digits
// So -2^2 is -4 and 2^3^2 is 512 and 2^-1 is 0.5, as with Python's **.
#include "sweep/sweep_expression.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <numbers>

#include "mfattn/core/number_text.hpp"

namespace mfattn {
namespace {

/// A value quoted in a message: a NaN without its sign, which means nothing.
std::string number_text(double value) { return format_number(value, NanSign::Dropped); }

struct Function {
  const char* name;
  Expression::Op op;
  std::size_t min_arguments, max_arguments;  ///< max 0: no upper bound
};
constexpr Function kFunctions[] = {
    {"sqrt", Expression::Op::Sqrt, 1, 1},  {"exp", Expression::Op::Exp, 1, 1},
    {"log", Expression::Op::Log, 1, 1},    {"abs", Expression::Op::Abs, 1, 1},
    {"floor", Expression::Op::Floor, 1, 1}, {"ceil", Expression::Op::Ceil, 1, 1},
    {"pow", Expression::Op::Pow, 2, 2},    {"min", Expression::Op::Min, 2, 0},
    {"max", Expression::Op::Max, 2, 0},
};
constexpr const char* kFunctionList = "sqrt exp log abs floor ceil pow min max";

const Function* find_function(std::string_view name) {
  for (const auto& function : kFunctions)
    if (name == function.name) return &function;
  return nullptr;
}

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

class ExpressionParser {
 public:
  explicit ExpressionParser(std::string_view text) : text_(text) {}

  Expression run() {
    skip_space();
    if (at_end()) fail("the expression is empty");
    sum();
    if (!at_end()) {
      if (peek() == ')') fail("')' without a matching '('");
      fail("expected an operator (+ - * / ^) or the end, got '" + std::string(1, peek()) + "'");
    }
    return std::move(result_);
  }

 private:
  std::string_view text_;
  std::size_t at_ = 0;
  Expression result_;
  /// Far more than any formula a person writes, far less than the stack allows.
  static constexpr std::size_t kMaxNesting = 256;
  std::size_t nesting_ = 0;
  struct NestingGuard {
    ExpressionParser& parser;
    explicit NestingGuard(ExpressionParser& p) : parser(p) {
      if (++parser.nesting_ > kMaxNesting)
        parser.fail("the expression nests deeper than " + std::to_string(kMaxNesting) +
                    " levels (parentheses, arguments, signs and exponents)");
    }
    ~NestingGuard() { --parser.nesting_; }
    NestingGuard(const NestingGuard&) = delete;
    NestingGuard& operator=(const NestingGuard&) = delete;
  };

  bool at_end() const { return at_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[at_]; }
  void skip_space() {
    while (!at_end() && std::isspace(static_cast<unsigned char>(text_[at_]))) ++at_;
  }
  [[noreturn]] void fail(const std::string& message, std::size_t position) const {
    throw ExpressionSyntaxError(position + 1, message);
  }
  [[noreturn]] void fail(const std::string& message) const { fail(message, at_); }
  void emit(Expression::Op op, double number = 0.0, std::size_t index = 0) {
    result_.steps_.push_back({op, number, index});
  }

  void sum() {
    product();
    for (skip_space(); peek() == '+' || peek() == '-'; skip_space()) {
      const char sign = peek();
      ++at_;
      product();
      emit(sign == '+' ? Expression::Op::Add : Expression::Op::Subtract);
    }
  }

  void product() {
    unary();
    for (skip_space(); peek() == '*' || peek() == '/'; skip_space()) {
      const char sign = peek();
      ++at_;
      if (peek() == '*') fail("'**' is not an operator: write a power as a ^ b", at_ - 1);
      unary();
      emit(sign == '*' ? Expression::Op::Multiply : Expression::Op::Divide);
    }
  }

  void unary() {
    // Every nesting (a parenthesis, a function's argument, a sign, an exponent) passes here:
    // bounding the depth keeps a crafted expression from overflowing the stack.
    const NestingGuard nested(*this);
    skip_space();
    if (peek() == '-' || peek() == '+') {
      const char sign = peek();
      ++at_;
      unary();
      if (sign == '-') emit(Expression::Op::Negate);
      return;
    }
    power();
  }

  void power() {
    primary();
    skip_space();
    if (peek() == '^') {
      ++at_;
      unary();  // the exponent may carry a sign (2^-1) and is itself a power (right-associative)
      emit(Expression::Op::Power);
    }
  }

  void primary() {
    skip_space();
    if (at_end()) fail("the expression ends where a number, a name or '(' is expected");
    const char c = peek();
    if (c == '(') {
      const std::size_t open = at_;
      ++at_;
      sum();
      skip_space();
      if (peek() != ')') fail(at_end() ? "'(' at column " + std::to_string(open + 1) + " is not closed"
                                       : "expected ')', got '" + std::string(1, peek()) + "'");
      ++at_;
      return;
    }
    if (is_digit(c) || c == '.') return number();
    if (is_name_start(c)) return name();
    fail("expected a number, a name or '(', got '" + std::string(1, c) + "'");
  }

  void number() {
    const std::size_t begin = at_;
    std::size_t digits = 0;
    while (is_digit(peek())) ++at_, ++digits;
    if (peek() == '.') {
      ++at_;
      while (is_digit(peek())) ++at_, ++digits;
    }
    if (digits == 0) fail("a number needs a digit", begin);
    if (peek() == 'e' || peek() == 'E') {
      ++at_;
      if (peek() == '+' || peek() == '-') ++at_;
      if (!is_digit(peek())) fail("the exponent of a number needs a digit");
      while (is_digit(peek())) ++at_;
    }
    if (is_name_char(peek())) fail("a number is followed by '" + std::string(1, peek()) + "' (missing operator?)");
    const std::string_view lexeme = text_.substr(begin, at_ - begin);
    double value = 0.0;
    // from_chars rounds correctly, as Python's float() does: the same double for the same text.
    const auto result = std::from_chars(lexeme.data(), lexeme.data() + lexeme.size(), value);
    if (result.ec != std::errc() || result.ptr != lexeme.data() + lexeme.size() || !std::isfinite(value))
      fail("the number " + std::string(lexeme) + " is out of the range of a double", begin);
    emit(Expression::Op::Number, value);
  }

  void name() {
    const std::size_t begin = at_;
    while (is_name_char(peek())) ++at_;
    const std::string word(text_.substr(begin, at_ - begin));
    skip_space();
    if (peek() == '(') {
      const Function* function = find_function(word);
      if (!function) fail("unknown function '" + word + "' (functions: " + kFunctionList + ")", begin);
      ++at_;
      std::size_t count = 0;
      for (;;) {
        sum();
        ++count;
        skip_space();
        if (peek() == ',') {
          ++at_;
          continue;
        }
        if (peek() == ')') break;
        fail(at_end() ? "the arguments of " + word + "( are not closed with ')'"
                      : "expected ',' or ')' in the arguments of " + word + ", got '" + std::string(1, peek()) + "'");
      }
      ++at_;
      if (count < function->min_arguments || (function->max_arguments && count > function->max_arguments)) {
        const std::string wanted =
            function->max_arguments == 0 ? "at least " + std::to_string(function->min_arguments)
            : function->min_arguments == function->max_arguments ? std::to_string(function->min_arguments)
                                                                 : "";
        fail(word + " takes " + wanted + (function->min_arguments == 1 && function->max_arguments == 1
                                               ? " argument" : " arguments") +
                 ", got " + std::to_string(count),
             begin);
      }
      emit(function->op, 0.0, count);
      return;
    }
    if (word == "pi") return emit(Expression::Op::Number, std::numbers::pi);
    if (word == "e") return emit(Expression::Op::Number, std::numbers::e);
    if (find_function(word)) fail(word + " is a function: write " + word + "(...)", begin);
    auto& names = result_.variables_;
    std::size_t index = 0;
    while (index < names.size() && names[index] != word) ++index;
    if (index == names.size()) names.push_back(word);
    emit(Expression::Op::Variable, 0.0, index);
  }
};

Expression Expression::parse(std::string_view text) { return ExpressionParser(text).run(); }

double Expression::evaluate(const std::vector<double>& variable_values) const {
  // Each step's result goes through the stack in memory on its own, so no multiply-add is
  // fused: every operation rounds once, as Python's float operations do.
  std::vector<double> stack;
  stack.reserve(steps_.size());
  const auto pop = [&stack] {
    const double top = stack.back();
    stack.pop_back();
    return top;
  };
  // The operation's text is made only when its result is not finite.
  const auto refuse = [](const std::string& operation, double value) {
    return ExpressionValueError(operation + " = " + number_text(value) + " is not a finite number");
  };
  for (const Step& step : steps_) {
    switch (step.op) {
      case Op::Number: stack.push_back(step.number); break;
      case Op::Variable: stack.push_back(variable_values.at(step.index)); break;
      case Op::Negate: stack.back() = -stack.back(); break;
      case Op::Add:
      case Op::Subtract:
      case Op::Multiply:
      case Op::Divide:
      case Op::Power:
      case Op::Pow: {
        const double b = pop(), a = pop();
        double value = 0.0;
        const char* symbol = "";
        switch (step.op) {
          case Op::Add: value = a + b, symbol = " + "; break;
          case Op::Subtract: value = a - b, symbol = " - "; break;
          case Op::Multiply: value = a * b, symbol = " * "; break;
          case Op::Divide:
            if (b == 0.0)
              throw ExpressionValueError("division by zero (" + number_text(a) + " / " + number_text(b) + ")");
            value = a / b, symbol = " / ";
            break;
          case Op::Power: value = std::pow(a, b), symbol = " ^ "; break;
          default: value = std::pow(a, b); break;
        }
        if (!std::isfinite(value))
          throw refuse(step.op == Op::Pow ? "pow(" + number_text(a) + ", " + number_text(b) + ")"
                                          : number_text(a) + symbol + number_text(b),
                       value);
        stack.push_back(value);
        break;
      }
      case Op::Sqrt:
      case Op::Exp:
      case Op::Log: {
        const double x = pop();
        const double value = step.op == Op::Sqrt ? std::sqrt(x) : step.op == Op::Exp ? std::exp(x) : std::log(x);
        if (!std::isfinite(value))
          throw refuse(std::string(step.op == Op::Sqrt ? "sqrt(" : step.op == Op::Exp ? "exp(" : "log(") +
                           number_text(x) + ")",
                       value);
        stack.push_back(value);
        break;
      }
      case Op::Abs: stack.back() = std::fabs(stack.back()); break;
      case Op::Floor: stack.back() = std::floor(stack.back()); break;
      case Op::Ceil: stack.back() = std::ceil(stack.back()); break;
      case Op::Min:
      case Op::Max: {
        // In argument order, keeping the first of equal values, as Python's min and max do
        // (which matters only for the sign of a zero).
        const auto first = stack.end() - static_cast<std::ptrdiff_t>(step.index);
        double best = *first;
        for (auto it = first + 1; it != stack.end(); ++it)
          if (step.op == Op::Min ? *it < best : *it > best) best = *it;
        stack.erase(first, stack.end());
        stack.push_back(best);
        break;
      }
    }
  }
  return stack.back();
}

}  // namespace mfattn
