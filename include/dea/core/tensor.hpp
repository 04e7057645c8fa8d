// dea/core/tensor.hpp: dense row-major tensors and the matrix aliases the library computes with.
//
// Activations are row-major [rows, features] Eigen matrices (rows = B*T). A Tensor is a shape plus a flat
// row-major buffer; it carries the inputs that are not matrices (masks [B,T], oracle [B,T,T] or [B,H,T,T],
// target indices, per-head score tensors [B,H,Tq,Tk]) and what safetensors files hold.
#pragma once

#include <type_traits>

#include "config.hpp"
#include "error.hpp"

#include <Eigen/Core>
#include <initializer_list>
#include <string>
#include <vector>

namespace dea {

template <class S>
using Mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using Vec = Eigen::Matrix<S, Eigen::Dynamic, 1>;
template <class S>
using RowVec = Eigen::Matrix<S, 1, Eigen::Dynamic>;
template <class S>
using MatMap = Eigen::Map<Mat<S>>;
template <class S>
using ConstMatMap = Eigen::Map<const Mat<S>>;

using Shape = std::vector<Index>;

/// A std::vector whose buffer is aligned as Eigen's own matrices are (EIGEN_MAX_ALIGN_BYTES). Kernels map
/// slices of such buffers; with a fixed alignment the vectorised reductions over them run in the same order on
/// every call, which keeps results bitwise reproducible.
template <class T>
using AlignedVec = std::vector<T, Eigen::aligned_allocator<T>>;

/// "[2, 6, 32]"
inline std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

/// Number of elements of a shape; a scalar (empty shape) has one. Throws on a negative extent.
inline Index shape_numel(const Shape& s) {
  Index n = 1;
  for (Index d : s) {
    check(d >= 0, "shape ", shape_str(s), " has a negative extent");
    n *= d;
  }
  return n;
}

/// A dense row-major tensor: shape and a flat buffer of shape_numel(shape) elements.
template <class T>
struct Tensor {
  Shape shape;
  Eigen::Matrix<T, Eigen::Dynamic, 1> data;

  Tensor() = default;
  explicit Tensor(Shape s) : shape(std::move(s)), data(shape_numel(shape)) {}
  Tensor(Shape s, const T& fill) : shape(std::move(s)), data(shape_numel(shape)) { data.setConstant(fill); }

  Index numel() const { return data.size(); }
  Index dim() const { return static_cast<Index>(shape.size()); }
  Index size(Index axis) const { return shape.at(static_cast<std::size_t>(axis)); }
  T* ptr() { return data.data(); }
  const T* ptr() const { return data.data(); }
  T& operator[](Index i) { return data[i]; }
  const T& operator[](Index i) const { return data[i]; }

  /// View as a row-major matrix with `cols` columns (all leading axes folded into rows).
  Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> matrix(Index cols) {
    check(cols > 0 && numel() % cols == 0, "tensor of shape ", shape_str(shape), " cannot be viewed with ", cols,
          " columns");
    return {data.data(), numel() / cols, cols};
  }
  Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> matrix(Index cols) const {
    check(cols > 0 && numel() % cols == 0, "tensor of shape ", shape_str(shape), " cannot be viewed with ", cols,
          " columns");
    return {data.data(), numel() / cols, cols};
  }
};

/// Throws unless `t` has exactly `expected` shape; the message names `what`.
template <class T>
void check_shape(const Tensor<T>& t, const Shape& expected, const char* what) {
  check(t.shape == expected, what, ": expected shape ", shape_str(expected), ", got ", shape_str(t.shape));
}

/// check_shape against a braced list ({B, T}): compares without building a Shape (no allocation unless it fails).
template <class T>
void check_shape(const Tensor<T>& t, std::initializer_list<Index> expected, const char* what) {
  bool same = t.shape.size() == expected.size();
  std::size_t k = 0;
  for (Index e : expected) same = same && t.shape[k++] == e;
  if (!same) check_shape(t, Shape(expected), what);
}

/// Throws unless the matrix has the expected size.
template <class Derived>
void check_matrix(const Eigen::MatrixBase<Derived>& m, Index rows, Index cols, const char* what) {
  check(m.rows() == rows && m.cols() == cols, what, ": expected shape [", rows, ", ", cols, "], got [", m.rows(),
        ", ", m.cols(), "]");
}

/// Throws if any element of `m` is NaN or infinite; the message names `what` and the first bad position.
template <class Derived>
void check_finite(const Eigen::DenseBase<Derived>& m, const char* what) {
  using S = typename Derived::Scalar;
  // x * 0 is (signed) zero for every finite x and NaN for an infinity or a NaN, so this vectorised sum is zero
  // exactly when every value is finite; only then is the element-wise search below (which names the first bad
  // value) skipped
  if constexpr (std::is_floating_point<S>::value)
    if ((m.derived().array() * S(0)).sum() == S(0)) return;
  for (Index r = 0; r < m.rows(); ++r)
    for (Index c = 0; c < m.cols(); ++c) {
      const auto v = m(r, c);
      if (!(v == v) || v - v != v - v)
        detail::raise(detail::concat(what, ": non-finite value ", v, " at row ", r, ", column ", c));
    }
}

}  // namespace dea
