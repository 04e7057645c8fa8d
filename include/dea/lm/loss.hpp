// dea/lm/loss.hpp: the causal language-model loss of the reference trainer (docs/lm.md, the decoder model), value and
// d loss / d logits.
//
// Shapes: logits [B*S, V] (rows b*S + t), labels [B*S] PRE-SHIFTED: labels[b, t] is the target of position t (token
// t + 1 of the underlying S + 1 token sequence); -100 (ignore_index) = not counted. Position t = S - 1 is dropped,
// as the trainer does (logits[:, :-1] against labels[:, :S-1]); do not shift the labels again.
//   counted rows C = {(b, t): t <= S - 2, labels[b, t] != ignore_index},  M = |C|
//   lse_i = log sum_v exp(z_iv),  lp_iv = z_iv - lse_i
//   CE_i  = (1 - eps) (-lp_i,y_i) + eps mean_v(-lp_iv)               (torch's label_smoothing)
//   ce    = (1 / M) sum_{i in C} CE_i
//   z     = (1 / M) sum_{i in C} lse_i^2   (z-loss; when M = 0 the mean runs over every row t <= S - 2)
//   loss  = ce + c z                                                   (z only when c > 0)
// Gradient: d ce / d z_i = (softmax(z_i) - (1 - eps) onehot(y_i) - eps / V) / M;  d (c z) / d z_i = 2 c lse_i
// softmax(z_i) / M_z. With M = 0 the cross-entropy part is 0 (PyTorch would give NaN) and `count` reports 0.
// Rows are processed independently and summed in row order: the result does not depend on the thread count.
#pragma once

#include "../core/error.hpp"
#include "../core/tensor.hpp"
#include "../ops/gemm.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

namespace dea {
namespace lm {

struct CausalLmLossOptions {
  double label_smoothing = 0.0;  ///< eps in [0, 1]
  double z_loss_coef = 0.0;      ///< c >= 0
  std::int64_t ignore_index = -100;
};

template <class S>
struct CausalLmLossResult {
  S loss = 0;       ///< ce + c z
  S ce = 0;         ///< the cross-entropy part
  S z_loss = 0;     ///< z (before the coefficient; 0 when c = 0)
  Index count = 0;  ///< M, the counted entries
  Mat<S> dlogits;   ///< d loss / d logits [B*S, V] (rows of dropped or ignored positions are 0), when requested
};

/// The loss of `logits` [batch*seq, V] against pre-shifted `labels` (batch*seq entries). Labels must lie in [0, V) or
/// equal ignore_index (dea::Error naming the entry otherwise; the dropped last position is checked too).
template <class S, class DZ>
CausalLmLossResult<S> causal_lm_loss(const Eigen::MatrixBase<DZ>& logits, const std::int64_t* labels, Index batch,
                                     Index seq, const CausalLmLossOptions& opt = {}, bool with_grad = true) {
  const Index N = logits.rows(), V = logits.cols();
  check(batch > 0 && seq > 0, "causal_lm_loss: batch and seq must be positive, got ", batch, " and ", seq);
  check(N == batch * seq, "causal_lm_loss: logits expected batch*seq = ", batch * seq, " rows, got ", N);
  check(V > 0, "causal_lm_loss: logits must have at least one column");
  check(opt.label_smoothing >= 0 && opt.label_smoothing <= 1, "causal_lm_loss: label_smoothing expected in [0, 1], got ",
        opt.label_smoothing);
  check(opt.z_loss_coef >= 0 && std::isfinite(opt.z_loss_coef), "causal_lm_loss: z_loss_coef expected finite >= 0, got ",
        opt.z_loss_coef);
  CausalLmLossResult<S> r;
  std::vector<char> counted(static_cast<std::size_t>(N), 0), scored(static_cast<std::size_t>(N), 0);
  for (Index n = 0; n < N; ++n) {
    const std::int64_t y = labels[n];
    check(y == opt.ignore_index || (y >= 0 && y < V), "causal_lm_loss: labels[", n, "] (batch ", n / seq, ", position ",
          n % seq, "): expected a token in [0, ", V, ") or ", opt.ignore_index, " (ignore), got ", y);
    const bool in_range = n % seq != seq - 1;  // the last position is dropped
    scored[static_cast<std::size_t>(n)] = in_range;
    counted[static_cast<std::size_t>(n)] = in_range && y != opt.ignore_index;
    if (counted[static_cast<std::size_t>(n)]) ++r.count;
  }
  const bool use_z = opt.z_loss_coef > 0;
  Index z_count = r.count;
  if (use_z && r.count == 0) {  // no counted entry: the z mean runs over every scored row
    z_count = 0;
    for (Index n = 0; n < N; ++n) z_count += scored[static_cast<std::size_t>(n)];
  }
  const auto in_z = [&](Index n) {
    return use_z && (r.count > 0 ? counted[static_cast<std::size_t>(n)] : scored[static_cast<std::size_t>(n)]) != 0;
  };
  const S eps = static_cast<S>(opt.label_smoothing), c = static_cast<S>(opt.z_loss_coef);
  const S inv_m = r.count > 0 ? S(1) / S(r.count) : S(0);
  const S inv_mz = z_count > 0 ? S(1) / S(z_count) : S(0);
  std::vector<S> row_ce(static_cast<std::size_t>(N), S(0)), row_z(static_cast<std::size_t>(N), S(0));
  if (with_grad) r.dlogits = Mat<S>::Zero(N, V);
  ops::for_row_blocks(N, [&](Index r0, Index nr) {
    for (Index n = r0; n < r0 + nr; ++n) {
      const bool ce_row = counted[static_cast<std::size_t>(n)] != 0, z_row = in_z(n);
      if (!ce_row && !z_row) continue;
      const S mx = logits.row(n).maxCoeff();
      const S lse = mx + std::log((logits.row(n).array() - mx).exp().sum());  // lse_i
      if (ce_row) {
        const std::int64_t y = labels[n];
        const S nll = lse - logits(n, y);                                      // -lp_i,y
        const S smooth = lse - logits.row(n).mean();                           // mean_v(-lp_iv)
        row_ce[static_cast<std::size_t>(n)] = (S(1) - eps) * nll + eps * smooth;
      }
      if (z_row) row_z[static_cast<std::size_t>(n)] = lse * lse;              // lse_i^2
      if (with_grad) {
        // softmax coefficient: 1/M from ce, 2 c lse / M_z from the z-loss
        const S a = (ce_row ? inv_m : S(0)) + (z_row ? S(2) * c * lse * inv_mz : S(0));
        r.dlogits.row(n) = ((logits.row(n).array() - lse).exp() * a).matrix();
        if (ce_row) {
          if (eps != S(0)) r.dlogits.row(n).array() -= eps * inv_m / static_cast<S>(V);  // eps mean_v(-lp_iv)
          r.dlogits(n, labels[n]) -= (S(1) - eps) * inv_m;                                // (1 - eps)(-lp_i,y)
        }
      }
    }
  });
  S ce = 0, z = 0;
  for (Index n = 0; n < N; ++n) {
    ce += row_ce[static_cast<std::size_t>(n)];
    z += row_z[static_cast<std::size_t>(n)];
  }
  r.ce = ce * inv_m;
  r.z_loss = use_z ? z * inv_mz : S(0);
  r.loss = r.ce + c * r.z_loss;
  return r;
}

}  // namespace lm
}  // namespace dea
