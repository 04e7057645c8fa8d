// dea/lm/bf16_weights.hpp: the decoder's weights stored as bf16 for inference, and the products that read them.
//
// An inference model may keep each product weight once, packed as bf16 (ops::packed::Bf16Matrix: 2 bytes a weight),
// instead of its float value and gradient (8 bytes a weight). Its products are then ops/packed_bf16.hpp's: bf16
// operands, float accumulation, the same bits as the float model's products under ScopedPrecision(Precision::bf16),
// which round the same weights to bf16 on the fly. Everything else (norms, RoPE, softmax, SwiGLU, the residual
// stream, the embedding lookup) stays float.
#pragma once

#include "../core/param.hpp"
#include "../core/tensor.hpp"
#include "../ops/packed_bf16.hpp"

#include <cstddef>
#include <type_traits>

namespace dea {
namespace lm {

/// A weight W [out, in] (nn.Linear layout, row-major) packed for y = x W^T.
inline ops::packed::Bf16Matrix pack_linear_bf16(const float* W, Index out, Index in) {
  return ops::packed::Bf16Matrix(in, out, ops::packed::View<float>{W, 1, in});
}

/// A right-hand side B [K, N] (row-major) packed for y = x B.
inline ops::packed::Bf16Matrix pack_rhs_bf16(const float* B, Index K, Index N) {
  return ops::packed::Bf16Matrix(K, N, ops::packed::View<float>{B, N, 1});
}

/// y [rows, W.cols()] = x W (the packed weight), x [rows, W.rows()] with contiguous rows: a Mat or its middleRows.
/// y is resized when it is a Mat.
template <class DX>
void linear_bf16(const Eigen::MatrixBase<DX>& x, const ops::packed::Bf16Matrix& W, Mat<float>& y) {
  static_assert(std::is_same<typename DX::Scalar, float>::value, "linear_bf16: float inputs");
  static_assert(int(DX::IsRowMajor) != 0 || int(DX::ColsAtCompileTime) == 1, "linear_bf16: row-major x");
  check(x.cols() == W.rows(), "linear_bf16: x has ", x.cols(), " columns, the weight expects ", W.rows());
  y.resize(x.rows(), W.cols());
  const auto& xd = x.derived();
  ops::packed::gemm_bf16(x.rows(), ops::packed::View<float>{xd.data(), Index(xd.outerStride()), 1}, W, y.data(),
                         y.cols(), false);
}

/// Frees a parameter's float value and gradient (its weight now lives in a bf16 copy). Its name and shape stay.
template <class S>
void release_float(Param<S>& p) {
  p.value = Vec<S>();
  p.grad = Vec<S>();
}

/// Bytes of a parameter's float value (what a float inference model keeps of it).
template <class S>
std::size_t value_bytes(const Param<S>& p) {
  return static_cast<std::size_t>(p.value.size()) * sizeof(S);
}

}  // namespace lm
}  // namespace dea
