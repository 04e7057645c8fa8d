// dea/lm/dense_mlp.hpp: the dense SwiGLU MLP of the decoder (mlp_type dense_deterministic), forward and backward.
//
// Shapes: x [N, D]; gate_proj.weight, up_proj.weight [I, D]; down_proj.weight [D, I] (nn.Linear layout, no biases).
//   g = x W_g^T,  u = x W_u^T   [N, I]
//   h = silu(g) .* u            [N, I]    (ops/swiglu.hpp)
//   y = h W_d^T                 [N, D]
// The interface is the one every MLP of the decoder has (DecoderLM's MLP slot): forward(x, token_ids, cache) (the
// ids are unused here), backward(dy, cache), parameters() under names relative to `layers.{l}.mlp.`.
#pragma once

#include "../core/param.hpp"
#include "../core/tensor.hpp"
#include "../ops/linear.hpp"
#include "../ops/swiglu.hpp"

#include <cstdint>

namespace dea {
namespace lm {

template <class S>
class DenseSwiGLU {
public:
  using Scalar = S;

  struct Cache {
    Mat<S> x;     ///< [N, D] input
    Mat<S> g, u;  ///< [N, I] gate and up projections
    Mat<S> h;     ///< [N, I] silu(g) .* u
  };

  /// Weights start at zero; the owner draws the init.
  DenseSwiGLU(Index d_model, Index intermediate) : D_(d_model), I_(intermediate) {
    check(d_model > 0, "DenseSwiGLU: d_model must be positive, got ", d_model);
    check(intermediate > 0, "DenseSwiGLU: intermediate_size must be positive, got ", intermediate);
    gate_ = Param<S>("gate_proj.weight", "main", {I_, D_});
    up_ = Param<S>("up_proj.weight", "main", {I_, D_});
    down_ = Param<S>("down_proj.weight", "main", {D_, I_});
  }

  Index d_model() const { return D_; }
  Index intermediate_size() const { return I_; }

  ParamList<S> parameters() { return {&gate_, &up_, &down_}; }
  void zero_grad() { dea::zero_grad(parameters()); }

  /// x [N, D] -> y [N, D]. token_ids (N entries or nullptr) are not used by the dense MLP.
  Mat<S> forward(const Mat<S>& x, const std::int64_t* token_ids, Cache& c) {
    (void)token_ids;
    check(x.cols() == D_, "DenseSwiGLU::forward: x expected ", D_, " columns (d_model), got ", x.cols());
    c.x = x;
    ops::linear_forward<S>(x, gate_.mat(), nullptr, c.g);  // g = x W_g^T
    ops::linear_forward<S>(x, up_.mat(), nullptr, c.u);    // u = x W_u^T
    c.h.resize(x.rows(), I_);
    ops::swiglu_forward(c.g, c.u, c.h);                    // h = silu(g) .* u
    Mat<S> y;
    ops::linear_forward<S>(c.h, down_.mat(), nullptr, y);  // y = h W_d^T
    return y;
  }

  /// ADDS into the parameter gradients, returns dx [N, D].
  Mat<S> backward(const Mat<S>& dy, const Cache& c) {
    check_matrix(dy, c.x.rows(), D_, "DenseSwiGLU::backward dy");
    Mat<S> dh;
    ops::linear_backward<S>(dy, c.h, down_.mat(), down_.grad_mat(), nullptr, &dh);  // y = h W_d^T
    Mat<S> dg(dh.rows(), I_);
    ops::swiglu_backward(dh, c.g, c.u, dg, dh);                                      // h = silu(g) .* u (dh <- du)
    Mat<S> dx;
    ops::linear_backward<S>(dg, c.x, gate_.mat(), gate_.grad_mat(), nullptr, &dx);       // g = x W_g^T
    ops::linear_backward<S>(dh, c.x, up_.mat(), up_.grad_mat(), nullptr, &dx, true);     // u = x W_u^T
    return dx;
  }

private:
  Index D_ = 0, I_ = 0;
  Param<S> gate_, up_, down_;
};

}  // namespace lm
}  // namespace dea
