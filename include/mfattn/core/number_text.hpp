#pragma once
/// \file number_text.hpp
/// Numbers as text. format_number: the one text of a double that mfattn writes wherever a
/// number must read back exactly (option defaults in --help, /parameters as describe_file and
/// --resume compare them, a sweep's case values and manifest, JSON, the values quoted in
/// error messages). format_significant: a number for people (analyze's summary). format_seconds:
/// a duration for people (run's progress, sweep's lines).
#include <string>

namespace mfattn {

/// What format_number writes for a NaN: std::to_chars writes "-nan" for a NaN whose sign bit
/// is set, which means nothing; text that people read in a table or a message says "nan".
enum class NanSign { Kept, Dropped };

/// The shortest decimal text that reads back (std::from_chars, strtod, Python's float) as
/// exactly `value`: std::to_chars's shortest round-trip form, fixed or scientific, whichever
/// is shorter ("0.1", "100", "1e+22", "1e-300", "5e-324", "0.3333333333333333", "-0").
/// Infinities are "inf" and "-inf"; a NaN is "nan", or "-nan" when its sign bit is set
/// unless nan_sign is Dropped.
std::string format_number(double value, NanSign nan_sign = NanSign::Kept);

/// A number for people, to `digits` significant digits in printf's %g form ("0.0123",
/// "1.5e+07", "inf", "-inf"; a NaN is "nan" whatever its sign): tables and summaries, where
/// the value need not read back exactly.
std::string format_significant(double value, int digits = 6);

/// A duration for people: "0.42 s" below 10 s (two decimals: a sweep's short cases), "12.3 s"
/// below a minute, then hours, minutes and seconds, "0:01:05", "12:00:00" (whole seconds).
std::string format_seconds(double seconds);

}  // namespace mfattn
