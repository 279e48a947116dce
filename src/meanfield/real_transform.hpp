#pragma once
// One length's FFTW plans and buffers, for the circle's convolutions and heat semigroup.
// Plans are made once, at construction. FFTW's planner (plan creation and destruction) is not
// thread-safe: solvers built by several threads at once (mfattn.meanfield from a Python
// thread pool) make and destroy their plans under one process-wide lock. Executing a plan on
// its own buffers is thread-safe and takes no lock.
#include <fftw3.h>

#include <algorithm>
#include <complex>
#include <cstddef>
#include <mutex>
#include <new>

namespace mfattn::meanfield {

using Complex = std::complex<double>;

/// The one lock of FFTW's planner in this process (an inline function's static: one object
/// across translation units).
inline std::mutex& fftw_planner_mutex() {
  static std::mutex mutex;
  return mutex;
}

class RealTransform {
 public:
  explicit RealTransform(std::size_t m)
      : m_(m), real_(fftw_alloc_real(m)), spectrum_(fftw_alloc_complex(m / 2 + 1)) {
    if (!real_ || !spectrum_) {
      fftw_free(real_);
      fftw_free(spectrum_);
      throw std::bad_alloc();
    }
    const std::lock_guard<std::mutex> planner(fftw_planner_mutex());
    forward_ = fftw_plan_dft_r2c_1d(int(m), real_, spectrum_, FFTW_ESTIMATE);
    backward_ = fftw_plan_dft_c2r_1d(int(m), spectrum_, real_, FFTW_ESTIMATE);
  }
  ~RealTransform() {
    {
      const std::lock_guard<std::mutex> planner(fftw_planner_mutex());
      fftw_destroy_plan(forward_);
      fftw_destroy_plan(backward_);
    }
    fftw_free(real_);
    fftw_free(spectrum_);
  }
  RealTransform(const RealTransform&) = delete;
  RealTransform& operator=(const RealTransform&) = delete;
  std::size_t modes() const { return m_ / 2 + 1; }
  /// out[k] = sum_j in[j] e^{-2 pi i j k / M}, k = 0..M/2.
  void forward(const double* in, Complex* out) {
    std::copy(in, in + m_, real_);
    fftw_execute(forward_);
    for (std::size_t k = 0; k < modes(); ++k) out[k] = Complex(spectrum_[k][0], spectrum_[k][1]);
  }
  /// out[j] = sum_k in[k] e^{2 pi i j k / M} over all M modes (the upper half conjugate).
  void backward(const Complex* in, double* out) {
    for (std::size_t k = 0; k < modes(); ++k) {
      spectrum_[k][0] = in[k].real();
      spectrum_[k][1] = in[k].imag();
    }
    fftw_execute(backward_);
    std::copy(real_, real_ + m_, out);
  }

 private:
  std::size_t m_;
  double* real_;
  fftw_complex* spectrum_;
  fftw_plan forward_ = nullptr, backward_ = nullptr;
};

}  // namespace mfattn::meanfield
