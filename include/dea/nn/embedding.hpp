// dea/nn/embedding.hpp: PyTorch's nn.Embedding (with padding_idx) as a module, with an output scale.
//
// Shapes: ids [N] (int64, each in [0, num_embeddings)), weight [num_embeddings, D], y [N, D].
//   y_n = scale * weight[ids_n]                       (the model uses scale = sqrt(D) for tokens, 1 for segments)
// Backward: dweight[ids_n] += scale * dy_n for every n whose id is not padding_idx (the padding row gets no
// gradient from the lookup, as in PyTorch; a tied output head may still add to it).
// Initialisation: N(0, std^2) over the whole table, padding row included (the reference re-initialises the token
// table with std D^-1/2 after construction, so its padding row starts non-zero).
// The scatter-add of the backward runs over column blocks in parallel, each adding rows in order n = 0..N-1, so
// results are bitwise identical for any thread count.
#pragma once

#include "../core/error.hpp"
#include "../core/init.hpp"
#include "../core/parallel.hpp"
#include "../core/param.hpp"
#include "../core/rng.hpp"

#include <algorithm>
#include <cstdint>

namespace dea {
namespace nn {

template <class S>
class Embedding {
public:
  Embedding() = default;
  /// padding_idx < 0: no padding row.
  Embedding(Index num_embeddings, Index dim, Index padding_idx = -1) : num_(num_embeddings), dim_(dim), pad_(padding_idx) {
    check(num_embeddings > 0, "Embedding: num_embeddings must be positive, got ", num_embeddings);
    check(dim > 0, "Embedding: embedding dim must be positive, got ", dim);
    check(padding_idx < num_embeddings, "Embedding: padding_idx: expected < ", num_embeddings, " (or < 0 for none), got ",
          padding_idx);
    weight = Param<S>("weight", "main", {num_, dim_});
  }

  /// weight ~ N(0, std^2), every row (the padding row too).
  void reset_parameters(Rng& rng, double stddev) { init::normal(weight.mat(), rng, 0.0, stddev); }

  Index num_embeddings() const { return num_; }
  Index dim() const { return dim_; }
  Index padding_idx() const { return pad_; }

  ParamList<S> parameters() { return {&weight}; }
  void zero_grad() { weight.zero_grad(); }

  /// Throws dea::Error naming `what` and the position unless every id lies in [0, num_embeddings).
  void check_ids(const std::int64_t* ids, Index n, const char* what) const {
    for (Index k = 0; k < n; ++k)
      check(ids[k] >= 0 && ids[k] < num_, what, "[", k, "]: expected an id in [0, ", num_, "), got ", ids[k]);
  }

  /// y [n, D] = scale * weight[ids]; with `accumulate`, y += instead (y must then already be [n, D]).
  void forward(const std::int64_t* ids, Index n, S scale, Mat<S>& y, bool accumulate = false) const {
    check_ids(ids, n, "Embedding::forward: ids");
    if (accumulate)
      check_matrix(y, n, dim_, "Embedding::forward: y (accumulate)");
    else
      y.resize(n, dim_);
    const auto W = weight.mat();
    parallel_for(n, [&](Index k) {
      if (accumulate)
        y.row(k) += scale * W.row(ids[k]);  // y_n += scale W[id_n]
      else
        y.row(k) = scale * W.row(ids[k]);   // y_n = scale W[id_n]
    });
  }

  /// dweight[ids_n] += scale * dy_n, skipping padding_idx.
  template <class DY>
  void backward(const Eigen::MatrixBase<DY>& dy, const std::int64_t* ids, Index n, S scale) {
    check_matrix(dy, n, dim_, "Embedding::backward: dy");
    check_ids(ids, n, "Embedding::backward: ids");
    constexpr Index kCols = 64;
    const Index nblk = (dim_ + kCols - 1) / kCols;
    auto G = weight.grad_mat();
    parallel_for(nblk, [&](Index blk) {
      const Index c0 = blk * kCols, nc = std::min(kCols, dim_ - c0);
      for (Index k = 0; k < n; ++k) {
        if (ids[k] == pad_) continue;                                    // padding_idx: no gradient
        G.row(ids[k]).segment(c0, nc) += scale * dy.row(k).segment(c0, nc);  // y_n = scale W[id_n]
      }
    });
  }

  Param<S> weight;

private:
  Index num_ = 0, dim_ = 0, pad_ = -1;
};

}  // namespace nn
}  // namespace dea
