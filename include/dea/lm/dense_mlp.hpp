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
#include "bf16_weights.hpp"

#include <cstdint>
#include <memory>
#include <type_traits>

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

  /// Stores the three weights as bf16 (lm/bf16_weights.hpp) and frees their float values and gradients: forward then
  /// runs bf16 products and backward throws. float models only. Returns the bytes of the bf16 weights.
  std::size_t store_bf16_weights() {
    if constexpr (std::is_same<S, float>::value) {
      if (!w16_) {
        auto w = std::make_shared<W16>();
        w->gate = pack_linear_bf16(gate_.value.data(), I_, D_);
        w->up = pack_linear_bf16(up_.value.data(), I_, D_);
        w->down = pack_linear_bf16(down_.value.data(), D_, I_);
        w16_ = std::move(w);
        for (Param<S>* p : {&gate_, &up_, &down_}) release_float(*p);
      }
      return w16_->gate.bytes() + w16_->up.bytes() + w16_->down.bytes();
    } else {
      check(false, "DenseSwiGLU::store_bf16_weights: float models only");
      return 0;
    }
  }
  bool has_bf16_weights() const { return w16_ != nullptr; }
  /// Bytes of the weights kept: float values and bf16 copies.
  std::size_t weight_bytes() const {
    std::size_t n = value_bytes(gate_) + value_bytes(up_) + value_bytes(down_);
    if (w16_) n += w16_->gate.bytes() + w16_->up.bytes() + w16_->down.bytes();
    return n;
  }
  void zero_grad() { dea::zero_grad(parameters()); }

  /// x [N, D] -> y [N, D]. token_ids (N entries or nullptr) are not used by the dense MLP.
  Mat<S> forward(const Mat<S>& x, const std::int64_t* token_ids, Cache& c) {
    (void)token_ids;
    check(x.cols() == D_, "DenseSwiGLU::forward: x expected ", D_, " columns (d_model), got ", x.cols());
    if constexpr (std::is_same<S, float>::value) {
      if (w16_) {  // bf16 weights: inference only, nothing kept for backward
        Mat<S> g, u, h(x.rows(), I_), y;
        linear_bf16(x, w16_->gate, g);                     // g = x W_g^T
        linear_bf16(x, w16_->up, u);                       // u = x W_u^T
        ops::swiglu_forward(g, u, h);                      // h = silu(g) .* u
        linear_bf16(h, w16_->down, y);                     // y = h W_d^T
        c.x.resize(0, D_);
        return y;
      }
    }
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
    check(!w16_, "DenseSwiGLU::backward: the weights are stored as bf16 for inference");
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
  struct W16 {
    ops::packed::Bf16Matrix gate, up, down;
  };
  std::shared_ptr<const W16> w16_;  ///< the weights as bf16 (store_bf16_weights), shared by copies
};

}  // namespace lm
}  // namespace dea
