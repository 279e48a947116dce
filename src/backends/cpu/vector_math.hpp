#pragma once
// Eight SIMD lanes of doubles for the CPU kernels, held as native registers, and the
// vectorised exponential of the pair loops.
//
// Every kernel works on 8 logical lanes (kLanes) whatever the ISA: AVX-512 holds them in one
// register, AVX2 in two, SSE2 and NEON in four (kRegisterLanes doubles per register). The
// lanes are what the summation order is written in (a sum "in lanes" adds source j to lane
// j mod 8, then the lanes are reduced in a fixed pairwise order), so every ISA takes every
// sum in the same order; only the contraction of a multiply and an add into one FMA (none on
// SSE2) may change last bits between ISAs, and within one build nothing depends on the
// thread count. Lanes is a struct of native GCC vectors rather than one 64-byte GCC vector:
// GCC lowered the 64-byte vector to AVX2 as a stream of extracts, inserts and stack moves
// (a tenth of the native speed for the exponential); each operation here is one native
// instruction per register.
//
// The functions are compiled for the target of the including translation unit
// (kernels/compile_target.hpp): each target has its own copy, in its own inline namespace.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <type_traits>

#include "kernels/compile_target.hpp"
#include "kernels/exp2_polynomial.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

// Lanes are passed by value between inline functions only, never across a library boundary:
// GCC's note that vector arguments pass differently under other ISAs does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

MFATTN_CPU_TARGET_BEGIN
namespace mfattn::simd {
inline namespace MFATTN_CPU_NAMESPACE {

inline constexpr std::size_t kLanes = 8;
#if defined(MFATTN_CPU_ISA_AVX512)
inline constexpr std::size_t kRegisterLanes = 8;
inline constexpr std::size_t kVectorRegisters = 32;
inline constexpr const char* kInstructionSet = "avx512";
#elif defined(MFATTN_CPU_ISA_AVX2)
inline constexpr std::size_t kRegisterLanes = 4;
inline constexpr std::size_t kVectorRegisters = 16;
inline constexpr const char* kInstructionSet = "avx2";
#elif defined(MFATTN_CPU_ISA_AVX)
inline constexpr std::size_t kRegisterLanes = 4;
inline constexpr std::size_t kVectorRegisters = 16;
inline constexpr const char* kInstructionSet = "avx";
#elif defined(MFATTN_CPU_ISA_NEON)
inline constexpr std::size_t kRegisterLanes = 2;
inline constexpr std::size_t kVectorRegisters = 32;
inline constexpr const char* kInstructionSet = "neon";
#elif defined(MFATTN_CPU_ISA_SSE42)
inline constexpr std::size_t kRegisterLanes = 2;
inline constexpr std::size_t kVectorRegisters = 16;
inline constexpr const char* kInstructionSet = "sse4.2";
#elif defined(MFATTN_CPU_ISA_SSE2)
inline constexpr std::size_t kRegisterLanes = 2;
inline constexpr std::size_t kVectorRegisters = 16;
inline constexpr const char* kInstructionSet = "sse2";
#else
// No SIMD known to this header: GCC lowers the 2-double vectors to scalar code.
inline constexpr std::size_t kRegisterLanes = 2;
inline constexpr std::size_t kVectorRegisters = 16;
inline constexpr const char* kInstructionSet = "generic";
#endif
inline constexpr std::size_t kRegistersPerLanes = kLanes / kRegisterLanes;
static_assert(kLanes % kRegisterLanes == 0);

typedef double Register __attribute__((vector_size(kRegisterLanes * sizeof(double))));
typedef std::int64_t RegisterInts __attribute__((vector_size(kRegisterLanes * sizeof(std::int64_t))));

/// Eight doubles. Lanes{} is all zeros. The alignment is explicit: GCC derives a vector
/// type's alignment from the ISA in force where the type is used, and code compiled without
/// the target pragma (std::vector's allocation of a struct holding Lanes) took 16 bytes for
/// a type whose AVX-512 loads and stores assume 64.
struct alignas(kLanes * sizeof(double)) Lanes {
  Register part[kRegistersPerLanes];
  double operator[](std::size_t lane) const {
    return part[lane / kRegisterLanes][lane % kRegisterLanes];
  }
  void set(std::size_t lane, double value) { part[lane / kRegisterLanes][lane % kRegisterLanes] = value; }
};

/// The result of a lane-wise comparison: all bits set where it holds.
struct alignas(kLanes * sizeof(double)) LaneMask {
  RegisterInts part[kRegistersPerLanes];
};

#define MFATTN_SIMD_INLINE [[gnu::always_inline]] inline
#define MFATTN_SIMD_PARTS for (std::size_t k_ = 0; k_ < kRegistersPerLanes; ++k_)

/// A register's worth of doubles at any address (8-byte aligned), read or written as one
/// unaligned move: a memcpy of the whole struct went through the stack 16 bytes at a time.
typedef double UnalignedRegister
    __attribute__((vector_size(kRegisterLanes * sizeof(double)), aligned(alignof(double)), may_alias));

MFATTN_SIMD_INLINE Lanes load(const double* p) {
  Lanes v;
  MFATTN_SIMD_PARTS v.part[k_] = *reinterpret_cast<const UnalignedRegister*>(p + k_ * kRegisterLanes);
  return v;
}
MFATTN_SIMD_INLINE void store(double* p, Lanes v) {
  MFATTN_SIMD_PARTS *reinterpret_cast<UnalignedRegister*>(p + k_ * kRegisterLanes) = v.part[k_];
}
/// A plain splat: x - 0.0 is x for every x, so GCC drops the subtraction and keeps the
/// scalar-to-vector conversion, one broadcast (x + 0.0 it must keep, for x = -0; lane-wise
/// stores became one masked insert per lane).
MFATTN_SIMD_INLINE Lanes broadcast(double x) {
  const Register r = x - Register{};
  Lanes v;
  MFATTN_SIMD_PARTS v.part[k_] = r;
  return v;
}

#define MFATTN_SIMD_BINARY(op)                                                               \
  MFATTN_SIMD_INLINE Lanes operator op(Lanes a, Lanes b) {                                   \
    MFATTN_SIMD_PARTS a.part[k_] = a.part[k_] op b.part[k_];                                \
    return a;                                                                                \
  }                                                                                          \
  MFATTN_SIMD_INLINE Lanes operator op(Lanes a, double b) {                                  \
    MFATTN_SIMD_PARTS a.part[k_] = a.part[k_] op b;                                         \
    return a;                                                                                \
  }                                                                                          \
  MFATTN_SIMD_INLINE Lanes operator op(double a, Lanes b) {                                  \
    MFATTN_SIMD_PARTS b.part[k_] = a op b.part[k_];                                         \
    return b;                                                                                \
  }                                                                                          \
  MFATTN_SIMD_INLINE Lanes& operator op##=(Lanes& a, Lanes b) {                              \
    MFATTN_SIMD_PARTS a.part[k_] = a.part[k_] op b.part[k_];                                \
    return a;                                                                                \
  }                                                                                          \
  MFATTN_SIMD_INLINE Lanes& operator op##=(Lanes& a, double b) {                             \
    MFATTN_SIMD_PARTS a.part[k_] = a.part[k_] op b;                                         \
    return a;                                                                                \
  }
MFATTN_SIMD_BINARY(+)
MFATTN_SIMD_BINARY(-)
MFATTN_SIMD_BINARY(*)
MFATTN_SIMD_BINARY(/)
#undef MFATTN_SIMD_BINARY

MFATTN_SIMD_INLINE Lanes operator-(Lanes a) {
  MFATTN_SIMD_PARTS a.part[k_] = -a.part[k_];
  return a;
}

#define MFATTN_SIMD_COMPARE(op)                                                              \
  MFATTN_SIMD_INLINE LaneMask operator op(Lanes a, Lanes b) {                                \
    LaneMask m;                                                                              \
    MFATTN_SIMD_PARTS m.part[k_] = a.part[k_] op b.part[k_];                                \
    return m;                                                                                \
  }                                                                                          \
  MFATTN_SIMD_INLINE LaneMask operator op(Lanes a, double b) {                               \
    LaneMask m;                                                                              \
    MFATTN_SIMD_PARTS m.part[k_] = a.part[k_] op b;                                         \
    return m;                                                                                \
  }
MFATTN_SIMD_COMPARE(<)
MFATTN_SIMD_COMPARE(>)
MFATTN_SIMD_COMPARE(>=)
MFATTN_SIMD_COMPARE(!=)
#undef MFATTN_SIMD_COMPARE

/// where ? a : b, lane by lane.
MFATTN_SIMD_INLINE Lanes select(LaneMask where, Lanes a, Lanes b) {
  Lanes out;
  MFATTN_SIMD_PARTS out.part[k_] = where.part[k_] ? a.part[k_] : b.part[k_];
  return out;
}
/// where ? a : 0, lane by lane.
MFATTN_SIMD_INLINE Lanes select_or_zero(LaneMask where, Lanes a) { return select(where, a, Lanes{}); }

/// Bit l set where lane l of the mask holds (a movemask: one instruction per register on
/// x86, a loop over the lanes elsewhere).
MFATTN_SIMD_INLINE unsigned mask_bits(LaneMask where) {
  unsigned bits = 0;
#if defined(MFATTN_CPU_ISA_AVX512)
  bits = _mm512_movepi64_mask(reinterpret_cast<__m512i>(where.part[0]));
#elif defined(MFATTN_CPU_ISA_AVX2) || defined(MFATTN_CPU_ISA_AVX)
  MFATTN_SIMD_PARTS bits |= static_cast<unsigned>(_mm256_movemask_pd(reinterpret_cast<__m256d>(where.part[k_])))
                            << (k_ * kRegisterLanes);
#elif (defined(MFATTN_CPU_ISA_SSE42) || defined(MFATTN_CPU_ISA_SSE2)) && defined(__SSE2__)
  MFATTN_SIMD_PARTS bits |= static_cast<unsigned>(_mm_movemask_pd(reinterpret_cast<__m128d>(where.part[k_])))
                            << (k_ * kRegisterLanes);
#else
  for (std::size_t lane = 0; lane < kLanes; ++lane)
    bits |= static_cast<unsigned>(where.part[lane / kRegisterLanes][lane % kRegisterLanes] != 0) << lane;
#endif
  return bits;
}

/// mask_bits(a > b), the comparison straight into a bit mask where the ISA has one (an
/// AVX-512 compare writes a mask register; the lane mask would be made and read back).
MFATTN_SIMD_INLINE unsigned greater_bits(Lanes a, Lanes b) {
#if defined(MFATTN_CPU_ISA_AVX512)
  return _mm512_cmp_pd_mask(reinterpret_cast<__m512d>(a.part[0]), reinterpret_cast<__m512d>(b.part[0]),
                            _CMP_GT_OQ);
#else
  return mask_bits(a > b);
#endif
}

MFATTN_SIMD_INLINE Lanes max(Lanes a, Lanes b) { return select(a > b, a, b); }
MFATTN_SIMD_INLINE Lanes min(Lanes a, Lanes b) { return select(a < b, a, b); }

/// The correctly rounded square root of each lane (one instruction per register where the
/// build lets sqrt skip errno: -fno-math-errno on the kernel files).
MFATTN_SIMD_INLINE Lanes sqrt(Lanes v) {
  for (std::size_t lane = 0; lane < kLanes; ++lane) v.set(lane, std::sqrt(v[lane]));
  return v;
}

/// The cosine of each lane (the C library's, lane by lane: the same bits as in double).
inline Lanes cos(Lanes v) {
  for (std::size_t lane = 0; lane < kLanes; ++lane) v.set(lane, std::cos(v[lane]));
  return v;
}

/// The sine of each lane (the C library's, lane by lane: a Toeplitz factor's derivatives).
inline Lanes sin(Lanes v) {
  for (std::size_t lane = 0; lane < kLanes; ++lane) v.set(lane, std::sin(v[lane]));
  return v;
}

/// log(1 + v) of each lane (the C library's, lane by lane: the same bits as in double).
inline Lanes log1p(Lanes v) {
  for (std::size_t lane = 0; lane < kLanes; ++lane) v.set(lane, std::log1p(v[lane]));
  return v;
}

/// where ? -inf : otherwise, lane by lane: the log-term of hidden pairs (kernels/pair_terms.hpp).
MFATTN_SIMD_INLINE Lanes hide_where(LaneMask where, Lanes otherwise) {
  return select(where, broadcast(-std::numeric_limits<double>::infinity()), otherwise);
}

/// A no-op that makes the compiler hold the values in registers: GCC otherwise folds each
/// use of a loaded vector into its FMA as a memory operand, so a micro-kernel that reuses a
/// load for several receivers turns load-bound (one load per FMA instead of one per row).
MFATTN_SIMD_INLINE void keep_in_registers([[maybe_unused]] Register& value) {
#if defined(__GNUC__) && defined(MFATTN_CPU_ISA_AVX512)
  asm("" : "+v"(value));
#endif
}

/// Largest lane, in a fixed pairwise order.
inline double horizontal_max(Lanes v) {
  double m01 = v[0] > v[1] ? v[0] : v[1], m23 = v[2] > v[3] ? v[2] : v[3];
  double m45 = v[4] > v[5] ? v[4] : v[5], m67 = v[6] > v[7] ? v[6] : v[7];
  double a = m01 > m23 ? m01 : m23, b = m45 > m67 ? m45 : m67;
  return a > b ? a : b;
}

/// Sum of the lanes, in a fixed pairwise order.
inline double horizontal_sum(Lanes v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// One native register as a kernel's vector (see exp2_nonpositive): GCC's own operators, and
// these for what Lanes spells as functions.
MFATTN_SIMD_INLINE Register load_register(const double* p) {
  return *reinterpret_cast<const UnalignedRegister*>(p);
}
MFATTN_SIMD_INLINE void store(double* p, Register v) { *reinterpret_cast<UnalignedRegister*>(p) = v; }
MFATTN_SIMD_INLINE Register select(RegisterInts where, Register a, Register b) { return where ? a : b; }

/// A kernel's vector type V (Lanes or Register) from memory or from one number.
template <class V>
MFATTN_SIMD_INLINE V load_as(const double* p) {
  if constexpr (std::is_same_v<V, Lanes>)
    return load(p);
  else
    return load_register(p);
}
template <class V>
MFATTN_SIMD_INLINE V splat(double x) {
  if constexpr (std::is_same_v<V, Lanes>)
    return broadcast(x);
  else
    return x - Register{};  // see broadcast
}

/// 2^n from the low mantissa bits of t + kShifter (see exp2_nonpositive).
MFATTN_SIMD_INLINE Register exponent_bits(Register shifted) {
  return __builtin_bit_cast(Register, __builtin_bit_cast(RegisterInts, shifted) << 52);
}
MFATTN_SIMD_INLINE Lanes exponent_bits(Lanes shifted) {
  MFATTN_SIMD_PARTS shifted.part[k_] = exponent_bits(shifted.part[k_]);
  return shifted;
}

/// kCount coefficients, each repeated over a register's lanes.
template <std::size_t kCount>
struct WideCoefficients {
  double values[kCount][kRegisterLanes];
};
template <std::size_t kCount>
constexpr WideCoefficients<kCount> widen(const double (&coefficients)[kCount]) {
  WideCoefficients<kCount> table{};
  for (std::size_t c = 0; c < kCount; ++c)
    for (std::size_t l = 0; l < kRegisterLanes; ++l) table.values[c][l] = coefficients[c];
  return table;
}

/// 2^t for t <= 0, to about 1 ulp (2 ulp at worst); exactly 0 for t < -1022 (and for -inf),
/// NaN stays NaN. exp(x) = 2^(x log2 e): callers fold log2(e) into their operands once.
/// the reduction t = n + r, n = round(t), |r| <= 1/2, is exact (r = t - n is
/// exact by Sterbenz), so it costs two adds and a subtraction instead of three FMAs, and
/// only the input's own rounding matters. kCount vectors are taken in lockstep, so that the
/// out-of-order core finds independent FMAs next to each other along the polynomial's long
/// dependency chain. Always inlined: GCC otherwise calls it out of line from some pair
/// loops, which costs more than the call saves.
/// kMayUnderflow = false: the caller guarantees t >= -1022 (or NaN), and the select that
/// makes smaller inputs exactly 0 is skipped; the results are the same bits.
/// kEveryVectorLoads = true: every multiply-add reads its coefficient from memory (see below).
/// V: Lanes, or one native Register (kernels that walk the lanes one register at a time).
template <std::size_t kCount, bool kMayUnderflow = true, bool kEveryVectorLoads = false, class V>
MFATTN_SIMD_INLINE void exp2_nonpositive(const V (&t)[kCount], V (&out)[kCount]) {
  // 1.5 * 2^52 + 1023: adding it rounds t to an integer n and leaves n + 1023 in the low
  // mantissa bits (bits 0-10 for n in [-1022, 0]; bit 51 is shifted out below).
  // The base-2 exponential of kernels/exp2_polynomial.hpp (its scalar form serves the CUDA
  // backend): 2^r by a degree-11 Chebyshev fit on [-1/2, 1/2], 2^n from the exponent bits.
  constexpr double kShifter = kernels::kExp2Shifter;
  constexpr double kUnderflow = kernels::kExp2Underflow;
  constexpr double kPoly[] = {
      kernels::exp2_coefficient(0), kernels::exp2_coefficient(1), kernels::exp2_coefficient(2),
      kernels::exp2_coefficient(3), kernels::exp2_coefficient(4), kernels::exp2_coefficient(5),
      kernels::exp2_coefficient(6), kernels::exp2_coefficient(7), kernels::exp2_coefficient(8),
      kernels::exp2_coefficient(9), kernels::exp2_coefficient(10), kernels::exp2_coefficient(11)};
  static_assert(std::size(kPoly) == kernels::kExp2Coefficients);
  // The coefficients are read from memory by each multiply-add (an embedded broadcast): held
  // in registers, the 12 of them crowded out the pair loops' sums, which GCC then spilled
  // (measured: 5 % faster for the symmetric loop, 25 % for the one-sided one at d = 3). The
  // empty asm hides that the pointer is constant, so GCC cannot hoist the broadcasts out of
  // the loops. Within one call GCC still broadcasts each coefficient once for the kCount
  // vectors; kEveryVectorLoads repeats the asm per vector so that none is held in a register
  // (4 % faster for the symmetric loop's eight vectors; slower for the one-sided loop and the
  // exp alone, which keep the default).
  static constexpr double kPolyStored[] = {kPoly[0], kPoly[1], kPoly[2], kPoly[3],
                                           kPoly[4], kPoly[5], kPoly[6], kPoly[7],
                                           kPoly[8], kPoly[9], kPoly[10], kPoly[11]};
  const double* coefficients = kPolyStored;
  asm("" : "+r"(coefficients));
  // Without embedded broadcasts (AVX2, SSE2, NEON) the coefficients are stored as whole
  // registers, so that each multiply-add still reads its coefficient as a memory operand
  // instead of a broadcast per use.
  alignas(64) static constexpr WideCoefficients<std::size(kPoly)> kPolyWide =
      widen<std::size(kPoly)>(kPolyStored);
  const double* wide = kPolyWide.values[0];
  asm("" : "+r"(wide));
  auto coefficient_of = [&](std::size_t c, [[maybe_unused]] const double* scalar) -> V {
    if constexpr (kRegisterLanes == kLanes) {
      return splat<V>(*scalar);
    } else {
      const Register coefficient = *reinterpret_cast<const Register*>(wide + c * kRegisterLanes);
      if constexpr (std::is_same_v<V, Lanes>) {
        Lanes out;
        MFATTN_SIMD_PARTS out.part[k_] = coefficient;
        return out;
      } else {
        return coefficient;
      }
    }
  };
  V shifted[kCount], r[kCount], p[kCount];
  for (std::size_t k = 0; k < kCount; ++k) {
    shifted[k] = t[k] + kShifter;
    r[k] = t[k] - (shifted[k] - kShifter);
    p[k] = splat<V>(coefficients[0]);
  }
  for (std::size_t c = 1; c < std::size(kPoly); ++c)
    for (std::size_t k = 0; k < kCount; ++k) {
      const double* coefficient = coefficients + c;
      if constexpr (kEveryVectorLoads) asm("" : "+r"(coefficient));
      p[k] = p[k] * r[k] + coefficient_of(c, coefficient);
    }
  for (std::size_t k = 0; k < kCount; ++k) {
    const V two_to_n = exponent_bits(shifted[k]);
    if constexpr (kMayUnderflow)
      out[k] = select(t[k] < kUnderflow, V{}, p[k] * two_to_n);
    else
      out[k] = p[k] * two_to_n;
  }
}

/// out[i] = 2^in[i] for a multiple of 4 kLanes numbers, in [-1022, 0], four vectors in
/// lockstep and without the underflow select, as the symmetric loop takes its exps: the pass
/// that the exp roofline times (kernel_set.cpp's exp_rate, bench/exp_peers.cpp).
inline void exp2_nonpositive_array(const double* in, double* out, std::size_t count) {
  for (std::size_t i = 0; i < count; i += 4 * kLanes) {
    Lanes t[4], e[4];
    for (std::size_t k = 0; k < 4; ++k) t[k] = load(in + i + k * kLanes);
    exp2_nonpositive<4, false>(t, e);
    for (std::size_t k = 0; k < 4; ++k) store(out + i + k * kLanes, e[k]);
  }
}

#undef MFATTN_SIMD_PARTS

}  // namespace MFATTN_CPU_NAMESPACE
}  // namespace mfattn::simd
MFATTN_CPU_TARGET_END
