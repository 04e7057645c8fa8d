// A user's program: one multi-head attention layer, forward and backward, through the installed headers. This
// project checks packaging (the installed headers, the exported target, Eigen and OpenMP reaching the user), so
// its program is the baseline layer, which compiles in seconds. (A DualExpertAttention instance costs g++ over a
// minute and a half per build; test_inference and the embedded profile check instantiate it on use, as a user's
// program does.)
#include <dea/attention/dot_product.hpp>
#include <dea/attention/inputs.hpp>
#include <dea/core/init.hpp>
#include <dea/dea.hpp>
#include <dea/version.hpp>

#include <iostream>

int main() {
  std::cout << "consumer: dea " << DEA_VERSION_STRING << " headers\n";
  dea::Rng rng(7);
  dea::DotProductAttention<float> attn(64, 4, rng);
  dea::Mat<float> x(2 * 10, 64);  // B = 2 sequences of T = 10 tokens
  dea::init::normal(x, rng, 0, 1);
  const dea::AttnInputs<float> in(2, 10);
  decltype(attn)::Cache cache;
  const dea::Mat<float> y = attn.forward(x, in, cache);
  const dea::Mat<float> dx = attn.backward(y, cache);  // d(0.5 |y|^2)/dy = y
  const bool ok = y.allFinite() && dx.allFinite() && dx.cwiseAbs().sum() > 0;
  std::cout << "consumer: y " << y.rows() << "x" << y.cols() << ", |dx| " << dx.norm() << (ok ? " OK" : " FAILED")
            << "\n";
  return ok ? 0 : 1;
}
