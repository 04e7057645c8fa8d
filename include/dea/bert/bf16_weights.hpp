// dea/bert/bf16_weights.hpp: the BERT family's product weights stored as bf16 for inference.
//
// A BERT model used for inference only (the NLI oracle's two models) may keep each weight of a matrix product once,
// packed as bf16 (ops::packed::Bf16Matrix: 2 bytes a weight, plus the padding of its last panel of 32 columns),
// instead of its float value and gradient (8 bytes a weight). Such a product is ops/packed_bf16.hpp's, bf16 operands
// and float accumulation, and gives the same bits as the float model's product under
// ScopedPrecision(Precision::bf16): rounding a float weight to bf16 once when it is packed or at every product gives
// the same bf16 number, and the packed product follows the one rule of the unpacked one. The biases stay float and
// are added as the unpacked product adds them.
#pragma once

#include "../core/error.hpp"
#include "../core/param.hpp"
#include "../core/tensor.hpp"
#include "../ops/packed_bf16.hpp"

#include <cstddef>
#include <type_traits>

namespace dea {
namespace bert {
namespace detail {

/// A weight W [out, in] (nn.Linear layout, row-major) packed for y = x W^T.
inline ops::packed::Bf16Matrix pack_linear_bf16(const float* W, Index out, Index in) {
  return ops::packed::Bf16Matrix(in, out, ops::packed::View<float>{W, 1, in});
}

/// y [rows, out] = x W^T + b (b [out] or null) with W packed by pack_linear_bf16; x [rows, in] with contiguous rows
/// (a Mat). y is resized. The bits of ops::linear_forward(x, W, b, y) under ScopedPrecision(Precision::bf16).
inline void linear_bf16(const Mat<float>& x, const ops::packed::Bf16Matrix& W, const float* b, Mat<float>& y) {
  check(x.cols() == W.rows(), "bert::linear_bf16: x has ", x.cols(), " columns, the weight expects ", W.rows());
  y.resize(x.rows(), W.cols());
  ops::packed::gemm_bf16(x.rows(), ops::packed::View<float>{x.data(), Index(x.outerStride()), 1}, W, y.data(),
                         Index(y.outerStride()), false, b);
}

/// Frees a parameter's float value and gradient (its weight now lives in a bf16 copy); its name and shape stay.
template <class S>
void release_value_and_grad(Param<S>& p) {
  p.value = Vec<S>();
  p.grad = Vec<S>();
}

/// Bytes of a parameter's float value as held (0 once released).
template <class S>
std::size_t value_bytes(const Param<S>& p) {
  return static_cast<std::size_t>(p.value.size()) * sizeof(S);
}

/// True when the self-attention class can store its weights as bf16 (has store_bf16_weights() and weight_bytes()).
template <class A, class = void>
struct stores_bf16_weights : std::false_type {};
template <class A>
struct stores_bf16_weights<A, std::void_t<decltype(std::declval<A&>().store_bf16_weights()),
                                          decltype(std::declval<const A&>().weight_bytes())>> : std::true_type {};

}  // namespace detail
}  // namespace bert
}  // namespace dea
