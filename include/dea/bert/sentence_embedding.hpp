// dea/bert/sentence_embedding.hpp: sentence embeddings as sentence-transformers' all-MiniLM-L6-v2 computes them
// (docs/bert.md, the NLI oracle): mean pooling of BertModel's last_hidden_state over the attention mask, then L2
// normalisation. The pooler is not used.
//
// Shapes: h [B*T, H] (row b*T + t), mask [B, T] (non-zero = real; absent = all real) -> e [B, H]:
//   s_b = sum_t h_{b,t} m_{b,t}                 n_b = max(sum_t m_{b,t}, 1e-9)
//   e_b = (s_b / n_b) / max(||s_b / n_b||_2, 1e-12)
// Padding a batch changes no embedding: padded keys get attention weight 0 and padded rows are not summed.
#pragma once

#include "../core/error.hpp"
#include "../core/tensor.hpp"
#include "model.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace dea {
namespace bert {

/// e [B, H]: the masked mean of h over each sequence's real tokens, L2-normalised (see the file comment).
template <class S>
Mat<S> mean_pool_normalize(const Mat<S>& h, const Tensor<std::uint8_t>& mask, Index B, Index T) {
  check(B > 0 && T > 0 && h.rows() == B * T, "mean_pool_normalize: h: expected ", B * T, " rows (B = ", B, ", T = ", T,
        "), got ", h.rows());
  const bool masked = mask.dim() > 0;
  if (masked) check_shape(mask, {B, T}, "mean_pool_normalize: mask");
  Mat<S> e = Mat<S>::Zero(B, h.cols());
  for (Index b = 0; b < B; ++b) {
    S count = 0;
    for (Index t = 0; t < T; ++t) {
      if (masked && mask[b * T + t] == 0) continue;
      e.row(b) += h.row(b * T + t);                                   // s_b = sum_t h_{b,t} m_{b,t}
      count += S(1);
    }
    e.row(b) /= std::max(count, static_cast<S>(1e-9));                // / max(sum_t m_{b,t}, 1e-9)
    const S norm = e.row(b).norm();
    e.row(b) /= std::max(norm, static_cast<S>(1e-12));                // / max(||.||_2, 1e-12)
  }
  return e;
}

/// Sentence embeddings [B, H] of a batch: an evaluation-mode forward of `model`, then mean_pool_normalize.
template <class S, class SelfAttention>
Mat<S> sentence_embedding(BertModel<S, SelfAttention>& model, const BertBatch<S>& batch,
                          BertOutput<S>* outputs = nullptr) {
  typename BertModel<S, SelfAttention>::Cache cache;
  BertOutput<S> out = model.forward(batch, false, nullptr, cache);
  Mat<S> e = mean_pool_normalize(out.last_hidden_state, batch.attention_mask, cache.B, cache.T);
  if (outputs) *outputs = std::move(out);
  return e;
}

}  // namespace bert
}  // namespace dea
