// dea/nn/linear.hpp: PyTorch's nn.Linear as a module: parameters, default initialisation, forward, backward.
//
// Shapes: x [N, in], weight [out, in] (PyTorch layout), bias [out], y [N, out].
//   y = x weight^T + bias                               (ops::linear_forward)
// Initialisation (PyTorch's default reset_parameters): weight ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform with
// a = sqrt(5)), then bias ~ U(-1/sqrt(in), 1/sqrt(in)); weight drawn first, row-major.
// Parameter names are "weight" and "bias"; the owner prefixes them ("ff.0.", "cls_head.3.").
#pragma once

#include "../core/init.hpp"
#include "../core/param.hpp"
#include "../core/rng.hpp"
#include "../ops/linear.hpp"

#include <cmath>
#include <string>

namespace dea {
namespace nn {

template <class S>
class Linear {
public:
  Linear() = default;
  Linear(Index in_features, Index out_features, Rng& rng, bool bias = true)
      : in_(in_features), out_(out_features), has_bias_(bias) {
    check(in_features > 0, "Linear: in_features must be positive, got ", in_features);
    check(out_features > 0, "Linear: out_features must be positive, got ", out_features);
    weight = Param<S>("weight", "main", {out_, in_});
    if (has_bias_) this->bias = Param<S>("bias", "main", {out_});
    reset_parameters(rng);
  }

  /// PyTorch's default: U(+-1/sqrt(in)) for the weight, then for the bias.
  void reset_parameters(Rng& rng) {
    const double b = 1.0 / std::sqrt(static_cast<double>(in_));
    init::uniform(weight.mat(), rng, -b, b);
    if (has_bias_) init::uniform(bias.value, rng, -b, b);
  }

  Index in_features() const { return in_; }
  Index out_features() const { return out_; }
  bool has_bias() const { return has_bias_; }

  /// weight, bias (state_dict order).
  ParamList<S> parameters() {
    ParamList<S> out{&weight};
    if (has_bias_) out.push_back(&bias);
    return out;
  }
  void zero_grad() { dea::zero_grad(parameters()); }

  /// y [N, out] = x [N, in] weight^T + bias.
  template <class DX>
  void forward(const Eigen::MatrixBase<DX>& x, Mat<S>& y) const {
    check(x.cols() == in_, "Linear::forward: x: expected ", in_, " columns, got ", x.cols());
    ops::linear_forward<S>(x, weight.mat(), has_bias_ ? bias.value.data() : nullptr, y);
  }

  /// Adds dweight += dy^T x and dbias += colsum(dy); writes dx = dy weight when dx is non-null.
  template <class DY, class DX>
  void backward(const Eigen::MatrixBase<DY>& dy, const Eigen::MatrixBase<DX>& x, Mat<S>* dx) {
    check_matrix(dy, x.rows(), out_, "Linear::backward: dy");
    ops::linear_backward<S>(dy, x, weight.mat(), weight.grad_mat(), has_bias_ ? bias.grad.data() : nullptr, dx);
  }

  Param<S> weight, bias;

private:
  Index in_ = 0, out_ = 0;
  bool has_bias_ = true;
};

}  // namespace nn
}  // namespace dea
