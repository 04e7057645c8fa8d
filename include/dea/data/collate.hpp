// dea/data/collate.hpp: batches of D_alpha pairs (the reference's collate_pairs) and batch index lists.
//
// A batch of B records is encoded as [CLS] q [SEP] k [SEP] (truncated to max_len), right-padded with [PAD] to
// the longest sequence T of the batch, and carries the oracle tensor [B, T, T]: NaN everywhere ("unlabelled")
// except the block rows = q tokens (queries) x columns = k tokens (keys), which holds the record's alpha. The
// block is asymmetric: CLS, SEP, q x q, k x q, k x k and padding stay NaN. No target index is produced, so
// the gate loss uses the oracle winner. A record whose alpha is NaN (no oracle attached) leaves its block NaN,
// and a batch in which no record labels a cell has no oracle at all (alpha_oracle absent, dim() == 0: the one
// spelling of "no oracle" that nn::ModelBatch and the attention inputs use).
#pragma once

#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "dalpha.hpp"
#include "random.hpp"
#include "../text/simple_tokenizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

namespace dea::data {

/// One collated batch of pairs. S is the scalar type of the oracle tensor.
template <class S>
struct PairBatch {
  Tensor<std::int64_t> input_ids;       ///< [B, T], right-padded with pad_id
  Tensor<std::int64_t> token_type_ids;  ///< [B, T], 0 over [CLS] q [SEP], 1 over k [SEP], 0 on padding
  Tensor<std::uint8_t> attention_mask;  ///< [B, T], 1 = real token (the key mask: AttnInputs::set_key_mask)
  Tensor<std::int64_t> labels;          ///< [B], the records' 0/1 labels
  Tensor<S> alpha_oracle;               ///< [B, T, T], NaN = unlabelled; absent when no cell is labelled
  std::vector<std::pair<Index, Index>> span_a, span_b;  ///< per row, half-open token ranges of q and k
  Index batch() const { return input_ids.dim() ? input_ids.size(0) : 0; }
  Index seq_len() const { return input_ids.dim() ? input_ids.size(1) : 0; }
};

/// Collates the records `recs[idx[0]], recs[idx[1]], ...` (idx must be non-empty and in range). `tok` is a
/// SimpleTokenizer or a RunTokenizer (run_tokenizer.hpp): its encode_pair gives the tokens and spans, and rows are
/// padded with its padding id.
template <class S, class Tok>
PairBatch<S> collate_pairs(const std::vector<Record>& recs, const std::vector<std::size_t>& idx, const Tok& tok,
                           Index max_len) {
  check(!idx.empty(), "collate_pairs: empty batch");
  std::vector<Encoding> enc;
  enc.reserve(idx.size());
  Index T = 0;
  for (std::size_t i : idx) {
    check(i < recs.size(), "collate_pairs: record index ", i, " out of range (", recs.size(), " records)");
    enc.push_back(tok.encode_pair(recs[i].q_text, recs[i].k_text, max_len));
    T = std::max(T, enc.back().size());
  }
  const Index B = static_cast<Index>(idx.size());
  PairBatch<S> out;
  out.input_ids = Tensor<std::int64_t>({B, T}, pad_id_of(tok));
  out.token_type_ids = Tensor<std::int64_t>({B, T}, 0);
  out.attention_mask = Tensor<std::uint8_t>({B, T}, 0);
  out.labels = Tensor<std::int64_t>({B}, 0);
  out.alpha_oracle = Tensor<S>({B, T, T}, std::numeric_limits<S>::quiet_NaN());
  bool labelled = false;
  for (Index b = 0; b < B; ++b) {
    const Encoding& e = enc[static_cast<std::size_t>(b)];
    const Record& r = recs[idx[static_cast<std::size_t>(b)]];
    for (Index t = 0; t < e.size(); ++t) {
      out.input_ids[b * T + t] = e.input_ids[static_cast<std::size_t>(t)];
      out.token_type_ids[b * T + t] = e.token_type_ids[static_cast<std::size_t>(t)];
      out.attention_mask[b * T + t] = 1;
    }
    out.labels[b] = r.label;
    const auto [a0, a1] = e.span_a;
    const auto [b0, b1] = e.span_b;
    if (a1 > a0 && b1 > b0) {
      // alpha_oracle[b, i, j] = alpha for i in q's tokens (queries), j in k's tokens (keys)
      for (Index i = a0; i < a1; ++i)
        for (Index j = b0; j < b1; ++j) out.alpha_oracle[(b * T + i) * T + j] = static_cast<S>(r.alpha);
      labelled = labelled || !std::isnan(static_cast<S>(r.alpha));
    }
    out.span_a.push_back(e.span_a);
    out.span_b.push_back(e.span_b);
  }
  if (!labelled) out.alpha_oracle = Tensor<S>();  // no labelled cell: no oracle
  return out;
}

/// Collates a whole list of records (in order).
template <class S, class Tok>
PairBatch<S> collate_pairs(const std::vector<Record>& recs, const Tok& tok, Index max_len) {
  std::vector<std::size_t> idx(recs.size());
  std::iota(idx.begin(), idx.end(), std::size_t(0));
  return collate_pairs<S>(recs, idx, tok, max_len);
}

/// Splits [0, n) into batches of batch_size (the last one may be smaller). With `shuffle`, the order is a
/// permutation drawn from `rng` (as a DataLoader with shuffle=True does each epoch); otherwise it is 0..n-1.
inline std::vector<std::vector<std::size_t>> make_batches(std::size_t n, std::size_t batch_size, bool shuffle_order,
                                                          Rng* rng = nullptr) {
  check(batch_size > 0, "make_batches: batch_size must be positive");
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t(0));
  if (shuffle_order) {
    check(rng != nullptr, "make_batches: shuffling needs an Rng");
    shuffle(order, *rng);
  }
  std::vector<std::vector<std::size_t>> batches;
  for (std::size_t s = 0; s < n; s += batch_size)
    batches.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(s),
                         order.begin() + static_cast<std::ptrdiff_t>(std::min(n, s + batch_size)));
  return batches;
}

}  // namespace dea::data
