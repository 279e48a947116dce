// Compiled by nvcc in CTest (Kernels.PairTermsCompileUnderNvcc, where nvcc is found): the
// kernels layer's pair terms are the formulas a CUDA backend evaluates, so they must build as
// device code with no host-only call. The kernel is what such a backend's pair loop would
// call per pair.
#include "kernels/pair_terms.hpp"

namespace kernels = mfattn::kernels;

__global__ void pair_weight_factors(kernels::PairTermParameters parameters, const double* positions,
                                    const double* prompts, double* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  double sum = 0.0;
  for (int j = 0; j < n; ++j) {
    const kernels::ScalarPair pair{positions + i, positions + j, 1, prompts[i], prompts[j]};
    const kernels::PairWeightTerms<double> terms = kernels::pair_weight_terms(parameters, pair, true);
    if (kernels::visible(terms)) sum += kernels::weight_factor(terms);
  }
  out[i] = sum;
}
