#pragma once
// The instruction set the CPU kernels of one translation unit are compiled for.
//
// A dispatching build (CMake MFATTN_CPU_DISPATCH, the default with GCC on x86-64) compiles
// the kernel sources once per target, with MFATTN_CPU_TARGET_AVX512 or MFATTN_CPU_TARGET_AVX2
// defined, and once with neither (the build's own flags: SSE2 on x86-64, NEON on aarch64);
// cpu_dispatch.cpp picks one set at run time. A build for one machine (MFATTN_ARCH=native or
// x86-64-v3, ...) compiles them once, with the build's flags.
//
// The ISA is switched by a target pragma that kernel code opens after its standard headers
// (MFATTN_CPU_TARGET_BEGIN), not by -m flags on the file: inline library functions (a
// std::vector member, std::sort) are emitted in every object that uses them and the linker
// keeps one copy, so a copy compiled with AVX-512 could end up serving the SSE2 kernels. Under
// the pragma only mfattn's kernel functions take the target; they also live in a namespace of
// their own per target (MFATTN_CPU_NAMESPACE), so no two targets share a symbol.
//
// Pragma-selected targets keep the build's -mtune (generic unless set) and its other flags.
//
// The pragma does not redefine __AVX2__ and the like for C++ (GCC preprocesses the whole file
// before it parses the pragma), so kernel code asks MFATTN_CPU_ISA_* instead: one of
// MFATTN_CPU_ISA_AVX512, _AVX2, _AVX, _NEON, _SSE42, _SSE2 or _GENERIC is defined.

#if defined(MFATTN_CPU_TARGET_AVX512) && defined(MFATTN_CPU_TARGET_AVX2)
#error "one CPU kernel target per translation unit"
#endif

#if defined(MFATTN_CPU_TARGET_AVX512)
// x86-64-v4: AVX-512 F/VL/BW/DQ/CD with everything x86-64-v3 has.
#define MFATTN_CPU_NAMESPACE avx512
#define MFATTN_CPU_TARGET_BEGIN                                                              \
  _Pragma("GCC push_options")                                                                \
  _Pragma("GCC target(\"avx2,fma,bmi,bmi2,lzcnt,popcnt,f16c,movbe,avx512f,avx512vl,avx512bw,avx512dq,avx512cd\")")
#define MFATTN_CPU_TARGET_END _Pragma("GCC pop_options")
#define MFATTN_CPU_ISA_AVX512 1
#elif defined(MFATTN_CPU_TARGET_AVX2)
// x86-64-v3: AVX2 and FMA (Haswell and later, AMD Zen 1-3, Intel client CPUs).
#define MFATTN_CPU_NAMESPACE avx2
#define MFATTN_CPU_TARGET_BEGIN   \
  _Pragma("GCC push_options")    \
  _Pragma("GCC target(\"avx2,fma,bmi,bmi2,lzcnt,popcnt,f16c,movbe\")")
#define MFATTN_CPU_TARGET_END _Pragma("GCC pop_options")
#define MFATTN_CPU_ISA_AVX2 1
#else
// The build's own flags.
#define MFATTN_CPU_NAMESPACE build_flags
#define MFATTN_CPU_TARGET_BEGIN
#define MFATTN_CPU_TARGET_END
#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define MFATTN_CPU_ISA_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define MFATTN_CPU_ISA_AVX2 1
#elif defined(__AVX__)
#define MFATTN_CPU_ISA_AVX 1
#elif defined(__aarch64__)
#define MFATTN_CPU_ISA_NEON 1
#elif defined(__SSE4_2__)
#define MFATTN_CPU_ISA_SSE42 1
#elif defined(__SSE2__)
#define MFATTN_CPU_ISA_SSE2 1
#else
#define MFATTN_CPU_ISA_GENERIC 1
#endif
#endif

// Functions of the kernels layer that a CUDA device runs too (pair_terms.hpp,
// exp2_polynomial.hpp, backends/cuda/receiver_sums.hpp) carry this; g++ sees nothing.
#if defined(__CUDACC__)
#define MFATTN_HOST_DEVICE __host__ __device__
#else
#define MFATTN_HOST_DEVICE
#endif
// Keeps a large device function out of line: called from several places, it is compiled once
// instead of once per call site (the resident kernel's evaluation; host compilers choose alone).
#if defined(__CUDA_ARCH__)
#define MFATTN_DEVICE_NOINLINE __noinline__
#else
#define MFATTN_DEVICE_NOINLINE
#endif
// Unrolls a loop of constant trip count in device code (registers instead of local memory for
// the per-thread arrays); host compilers unroll such loops by themselves.
#if defined(__CUDA_ARCH__)
#define MFATTN_UNROLL _Pragma("unroll")
#else
#define MFATTN_UNROLL
#endif
