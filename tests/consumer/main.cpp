// A user's program: one Dual-Expert Attention layer, forward and backward, through <dea/dea.hpp> alone.
#include <dea/dea.hpp>

#include <iostream>

int main() {
  dea::Rng rng(7);
  dea::DualExpertAttention<float, 4, 16> attn(64, 4, rng);  // compile-time heads and head size
  dea::Mat<float> x(2 * 10, 64);                            // B = 2 sequences of T = 10 tokens
  dea::init::normal(x, rng, 0, 1);
  dea::AttnContext<float> ctx;
  decltype(attn)::Cache cache;
  const dea::Mat<float> y = attn.forward(x, 2, ctx, cache);
  const dea::Mat<float> dx = attn.backward(y, cache);  // d(0.5 |y|^2)/dy = y
  const bool ok = y.allFinite() && dx.allFinite() && attn.W_rel().grad.cwiseAbs().sum() > 0;
  std::cout << "consumer: y " << y.rows() << "x" << y.cols() << ", |dx| " << dx.norm() << (ok ? " OK" : " FAILED")
            << "\n";
  return ok ? 0 : 1;
}
