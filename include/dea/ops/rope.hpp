// dea/ops/rope.hpp: rotary position embedding, "rotate-half" (GPT-NeoX) pairing, forward and backward.
//
// Shapes: x [T, d] (d even), one row per position pos0 + t. Dims i and i + d/2 (i < d/2) form a pair rotated by
// the angle phi = pos * f_i with f_i = theta^(-2i/d):
//   out_i       = x_i cos(phi) - x_{i+d/2} sin(phi)
//   out_{i+d/2} = x_{i+d/2} cos(phi) + x_i sin(phi)
// The rotation is orthogonal, so the backward is the rotation by -phi.
#pragma once

#include "../core/tensor.hpp"

#include <cmath>
#include <vector>

namespace dea {
namespace ops {

/// cos/sin table for positions [0, size()), computed in double and stored in S. Grows on demand with
/// reserve(), which is not thread-safe: call it before a parallel region.
template <class S>
class RopeTable {
public:
  RopeTable() = default;
  RopeTable(Index head_dim, double theta) : d_(head_dim), theta_(theta) {
    check(head_dim > 0 && head_dim % 2 == 0, "RopeTable: head_dim must be positive and even, got ", head_dim);
    check(theta > 0, "RopeTable: theta must be positive, got ", theta);
  }

  Index head_dim() const { return d_; }
  double theta() const { return theta_; }
  Index size() const { return n_; }

  /// Makes positions [0, n_pos) available.
  void reserve(Index n_pos) {
    if (n_pos <= n_) return;
    const Index half = d_ / 2;
    cos_.resize(static_cast<std::size_t>(n_pos * half));
    sin_.resize(static_cast<std::size_t>(n_pos * half));
    for (Index i = 0; i < half; ++i) {
      const double f = 1.0 / std::pow(theta_, static_cast<double>(2 * i) / static_cast<double>(d_));  // f_i
      for (Index p = n_; p < n_pos; ++p) {
        const double phi = static_cast<double>(p) * f;
        cos_[static_cast<std::size_t>(p * half + i)] = static_cast<S>(std::cos(phi));
        sin_[static_cast<std::size_t>(p * half + i)] = static_cast<S>(std::sin(phi));
      }
    }
    n_ = n_pos;
  }

  const S* cos_row(Index pos) const { return cos_.data() + pos * (d_ / 2); }
  const S* sin_row(Index pos) const { return sin_.data() + pos * (d_ / 2); }

private:
  Index d_ = 0;
  double theta_ = 10000.0;
  Index n_ = 0;
  std::vector<S> cos_, sin_;
};

}  // namespace ops

namespace detail {
/// Rotates every row of x by sign * phi(pos0 + t).
template <class S, class D>
void rope_rotate(const ops::RopeTable<S>& tab, Index pos0, const Eigen::MatrixBase<D>& x_, S sign) {
  auto& x = const_cast<Eigen::MatrixBase<D>&>(x_);
  const Index d = x.cols(), half = d / 2;
  check(d == tab.head_dim(), "rope: x has ", d, " columns, the table was built for head_dim ", tab.head_dim());
  check(pos0 >= 0 && pos0 + x.rows() <= tab.size(), "rope: positions [", pos0, ", ", pos0 + x.rows(),
        ") exceed the table size ", tab.size());
  for (Index t = 0; t < x.rows(); ++t) {
    const S* c = tab.cos_row(pos0 + t);
    const S* s = tab.sin_row(pos0 + t);
    for (Index i = 0; i < half; ++i) {
      const S a = x(t, i), b = x(t, i + half), sn = sign * s[i];
      x(t, i) = a * c[i] - b * sn;
      x(t, i + half) = b * c[i] + a * sn;
    }
  }
}
}  // namespace detail

namespace ops {

/// In place: x <- RoPE(x) for rows at positions pos0, pos0 + 1, ...
template <class S, class D>
void rope_forward(const RopeTable<S>& tab, Index pos0, const Eigen::MatrixBase<D>& x) {
  dea::detail::rope_rotate(tab, pos0, x, S(1));
}

/// In place: dx <- R(phi)^T dx, the input gradient of rope_forward given its output gradient.
///   dx_i = dout_i cos + dout_{i+d/2} sin,   dx_{i+d/2} = dout_{i+d/2} cos - dout_i sin
template <class S, class D>
void rope_backward(const RopeTable<S>& tab, Index pos0, const Eigen::MatrixBase<D>& dx) {
  dea::detail::rope_rotate(tab, pos0, dx, S(-1));
}

}  // namespace ops
}  // namespace dea
