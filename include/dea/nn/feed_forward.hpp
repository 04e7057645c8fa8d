// dea/nn/feed_forward.hpp: the position-wise feed-forward block of the encoder layer.
//
// The reference's nn.Sequential(Linear(D, d_ff), GELU(), Dropout(p), Linear(d_ff, D)); parameter names follow
// the Sequential's indices: "0.weight", "0.bias", "3.weight", "3.bias" (the owner prefixes "ff.").
// Shapes: u [N, D] -> a [N, d_ff] -> g [N, d_ff] -> y [N, D]:
//   a = u W0^T + b0                 (Linear 0)
//   g = dropout(gelu(a))            (GELU 1, Dropout 2; exact erf GELU)
//   y = g W3^T + b3                 (Linear 3)
// The cache keeps a (and the dropout mask's bits); the backward recomputes g from a, and takes u again from the
// caller (the encoder layer recomputes it instead of keeping it).
#pragma once

#include "../core/param.hpp"
#include "../core/rng.hpp"
#include "../ops/gelu.hpp"
#include "dropout.hpp"
#include "linear.hpp"

namespace dea {
namespace nn {

template <class S>
class FeedForward {
public:
  struct Cache {
    Mat<S> a;            ///< [N, d_ff] pre-activation
    DropoutState drop;   ///< the hidden dropout's mask (seed and bits)
  };

  FeedForward() = default;
  /// Linear 0 is initialised before Linear 3 (PyTorch defaults, see linear.hpp).
  FeedForward(Index d_model, Index d_ff, double dropout, Rng& rng)
      : lin0_(d_model, d_ff, rng), lin3_(d_ff, d_model, rng), drop_(dropout) {
    prefix_names(lin0_.parameters(), "0.");
    prefix_names(lin3_.parameters(), "3.");
  }

  Index d_model() const { return lin0_.in_features(); }
  Index d_ff() const { return lin0_.out_features(); }
  double dropout() const { return drop_.p(); }

  /// 0.weight, 0.bias, 3.weight, 3.bias.
  ParamList<S> parameters() {
    ParamList<S> out = lin0_.parameters();
    for (Param<S>* p : lin3_.parameters()) out.push_back(p);
    return out;
  }
  void zero_grad() { dea::zero_grad(parameters()); }
  Linear<S>& linear0() { return lin0_; }
  Linear<S>& linear3() { return lin3_; }

  /// y [N, D] from u [N, D]. Dropout is active when `training` (then `rng` is needed if p > 0).
  Mat<S> forward(const Mat<S>& u, bool training, Rng* rng, Cache& c) const {
    lin0_.forward(u, c.a);                       // a = u W0^T + b0
    Mat<S> g;
    ops::gelu_forward<S>(c.a, g);                // g = gelu(a)
    drop_.forward(g, training, rng, c.drop);    // g = dropout(g)
    Mat<S> y;
    lin3_.forward(g, y);                         // y = g W3^T + b3
    return y;
  }

  /// dL/du [N, D] from dy [N, D] and the forward input u; adds into the four parameter gradients.
  Mat<S> backward(const Mat<S>& dy, const Mat<S>& u, const Cache& c) {
    check(c.a.rows() == u.rows(), "FeedForward::backward: the cache does not match u (", c.a.rows(), " vs ", u.rows(),
          " rows)");
    Mat<S> g;
    ops::gelu_forward<S>(c.a, g);                // recompute g = dropout(gelu(a))
    Dropout::apply(g, c.drop);
    Mat<S> dg;
    lin3_.backward(dy, g, &dg);                  // y = g W3^T + b3  ->  dW3, db3, dg = dy W3
    Dropout::backward(dg, c.drop);               // g = dropout(.)   ->  masked
    ops::gelu_backward_inplace<S>(c.a, dg);      // g = gelu(a)      ->  da = dg gelu'(a)
    Mat<S> du;
    lin0_.backward(dg, u, &du);                  // a = u W0^T + b0  ->  dW0, db0, du = da W0
    return du;
  }

private:
  Linear<S> lin0_, lin3_;
  Dropout drop_;
};

}  // namespace nn
}  // namespace dea
