// dea/nn/layer_norm.hpp: PyTorch's nn.LayerNorm(D) as a module (weight 1, bias 0, eps 1e-5).
//
// Shapes: x [N, D] -> y [N, D]; the cache keeps mean and rstd [N]; the backward takes the forward input x
// again (the owner keeps it), recomputing xhat (ops/layer_norm.hpp has the formulas).
// Parameter names are "weight" and "bias"; the owner prefixes them ("layers.0.ln1.", "ln_f.").
#pragma once

#include "../core/param.hpp"
#include "../ops/layer_norm.hpp"

namespace dea {
namespace nn {

template <class S>
class LayerNorm {
public:
  struct Cache {
    Vec<S> mean, rstd;  ///< [N]
  };

  LayerNorm() = default;
  explicit LayerNorm(Index d, double eps = ops::layer_norm_default_eps) : d_(d), eps_(eps) {
    check(d > 0, "LayerNorm: normalized size must be positive, got ", d);
    check(eps > 0, "LayerNorm: eps must be positive, got ", eps);
    weight = Param<S>("weight", "main", {d});
    bias = Param<S>("bias", "main", {d});
    reset_parameters();
  }

  /// weight = 1, bias = 0.
  void reset_parameters() {
    weight.value.setOnes();
    bias.value.setZero();
  }

  Index size() const { return d_; }
  double eps() const { return eps_; }

  ParamList<S> parameters() { return {&weight, &bias}; }
  void zero_grad() { dea::zero_grad(parameters()); }

  /// y [N, D] = LayerNorm(x [N, D]); fills the cache.
  template <class DX>
  void forward(const Eigen::MatrixBase<DX>& x, Mat<S>& y, Cache& c) const {
    check(x.cols() == d_, "LayerNorm::forward: x: expected ", d_, " columns, got ", x.cols());
    ops::layer_norm_forward<S>(x, weight.value.data(), bias.value.data(), S(eps_), y, c.mean, c.rstd);
  }

  /// dx [N, D] from dy [N, D] and the forward input x; adds into the weight and bias gradients.
  template <class DY, class DX>
  void backward(const Eigen::MatrixBase<DY>& dy, const Eigen::MatrixBase<DX>& x, const Cache& c, Mat<S>& dx) {
    ops::layer_norm_backward<S>(dy, x, c.mean, c.rstd, weight.value.data(), weight.grad.data(), bias.grad.data(), dx);
  }

  Param<S> weight, bias;

private:
  Index d_ = 0;
  double eps_ = ops::layer_norm_default_eps;
};

}  // namespace nn
}  // namespace dea
