// A model of your own, composed from library layers, with a forward and a backward written by hand, and one call
// that checks the backward: testing::check_layer compares the gradient of every parameter and of the input with
// central differences (in double, objective L = <y, R> with a fixed random R) and checks that the backward adds
// into the parameter gradients instead of overwriting them.
#include <dea/dea.hpp>
#include <dea/testing/check_layer.hpp>

#include <cstdio>

using dea::Index;
using Mat = dea::Mat<double>;

// x [N, d_in] -> Linear -> h [N, D] -> Dual-Expert attention -> a; r = h + a -> LayerNorm -> n -> Linear -> y [N, C]
// (N = B*T rows: B sequences of T tokens)
class TinyModel {
public:
  TinyModel(Index B, Index T, Index d_in, Index D, Index heads, Index C, dea::Rng& rng)
      : in_(d_in, D, rng), attn_(D, heads, rng), norm_(D), head_(D, C, rng), inputs_(B, T) {
    dea::prefix_names(in_.parameters(), "in.");
    dea::prefix_names(attn_.parameters(), "attn.");
    dea::prefix_names(norm_.parameters(), "norm.");
    dea::prefix_names(head_.parameters(), "head.");
    // The oracle labels every (query, key) cell and gamma_mix is 1 (the start of training): the attention mixes
    // its experts with the oracle's alpha, so the output does not depend on the gate. (The gate learns from its own
    // loss, attn_.backward_gate; the task backward treats the gate's alpha-hat as a constant.)
    inputs_.set_oracle(dea::Tensor<double>({B, T, T}, 0.7)).set_gamma_mix(1.0);
  }

  dea::ParamList<double> parameters() {
    dea::ParamList<double> all;
    for (const dea::ParamList<double>& part :
         {in_.parameters(), attn_.parameters(), norm_.parameters(), head_.parameters()})
      all.insert(all.end(), part.begin(), part.end());
    return all;
  }

  Mat forward(const Mat& x) {
    x_ = x;
    in_.forward(x_, h_);                           // h = x W_in^T + b_in
    r_ = h_ + attn_.forward(h_, inputs_, attn_c_);  // r = h + attention(h)
    norm_.forward(r_, n_, norm_c_);                // n = layer_norm(r)
    Mat y;
    head_.forward(n_, y);                          // y = n W_head^T + b_head
    return y;
  }

  // Every line inverts the forward line it names; the layers add into their parameter gradients.
  Mat backward(const Mat& dy) {
    Mat dn, dr, dx;
    head_.backward(dy, n_, &dn);                           // y = n W_head^T + b_head  ->  dW_head, db_head, dn
    norm_.backward(dn, r_, norm_c_, dr);                   // n = layer_norm(r)        ->  dweight, dbias, dr
    const Mat dh = dr + attn_.backward(dr, attn_c_);       // r = h + attention(h)     ->  dh from both paths
    in_.backward(dh, x_, &dx);                             // h = x W_in^T + b_in      ->  dW_in, db_in, dx
    return dx;
  }

private:
  dea::nn::Linear<double> in_;
  dea::DualExpertAttention<double> attn_;
  dea::nn::LayerNorm<double> norm_;
  dea::nn::Linear<double> head_;
  dea::AttnInputs<double> inputs_;
  // what the backward needs from the last forward
  Mat x_, h_, r_, n_;
  dea::DualExpertAttention<double>::Cache attn_c_;
  dea::nn::LayerNorm<double>::Cache norm_c_;
};

int main() {
  const Index B = 2, T = 4, d_in = 6, D = 8, heads = 2, C = 3;
  dea::Rng rng(7);
  TinyModel model(B, T, d_in, D, heads, C, rng);

  // One call: a random input of B*T rows, every parameter and the input, relative error <= 1e-6.
  const dea::testing::CheckLayerReport report = dea::testing::check_layer(model, B * T, d_in);
  std::printf("%s", report.str().c_str());
  return report.ok ? 0 : 1;
}
