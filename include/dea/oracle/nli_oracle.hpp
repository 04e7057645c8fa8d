// dea/oracle/nli_oracle.hpp: the oracle alpha of the DEA reference (data.py precompute_oracle_alpha; docs/bert.md,
// the NLI oracle) computed from two frozen models: an NLI cross-encoder, BERT-architecture (WordPiece) or
// DeBERTa-v2/v3 (SentencePiece; docs/deberta.md), and a BERT-architecture sentence embedder.
//
// For a pair (q_text, k_text):
//   phi       = NLI logits[entailment index] of premise = q_text, hypothesis = k_text, encoded [CLS] q [SEP] k [SEP]
//               with longest_first truncation at nli_max_length (256)
//   sim       = e(q) . e(k), e(t) the mean-pooled, L2-normalised last hidden state of the embedder on [CLS] t [SEP]
//               (t alone, truncated at sim_max_length, 128): the cosine of the two embeddings
//   alpha_raw = sigmoid(phi - 0.3 sim)
//   alpha     = clamp(alpha_raw, 0, 0.95), or clamp(calibrator(alpha_raw), 0, 0.95) with an isotonic calibrator
//               fitted on human labels (oracle/isotonic.hpp; calibrate()).
// The entailment index is the first id, in id2label order, whose label lower-cased contains "entail" (so
// "not_entailment" counts too, as in the reference).
//
// A DeBERTa cross-encoder (load() picks it when the NLI directory's config.json says model_type "deberta-v2", which
// DeBERTa-v3 checkpoints say too) reads [CLS] q [SEP] k [SEP] from the directory's spm.model with the tokenizer mode
// of OracleOptions::nli_tokenizer: fast by default, what the reference's AutoTokenizer loads (text/spm_tokenizer.hpp).
// It gets the token types only when its config has a token-type embedding (v3 has none). Its sequences run through
// deberta::sequence_logits, which gives each sequence the same logits alone or in any batch. Under the bf16
// precision its weight products run in bf16 from the float weights.
//
// Precision: NliOracle<float> is what the reference computes (float32 models, phi taken as float32 by its
// `.float()`): phi and sim are the float results, widened exactly to double. NliOracle<double> runs the float64
// forward of the (upcast) weights, as the golden cases were computed, and keeps phi in double. alpha_raw and alpha
// are computed in double from phi and sim in both. With OracleOptions::precision bf16 (NliOracle<float>), the weight
// products of both models (the attention projections, the FFN, the pooler, the classifier) read bf16 copies of their
// operands and accumulate in float; the attention's per-head products, norms, GELU, softmax, pooling and the scores
// stay float. The oracle then stores both models' product weights once as bf16 (store_bf16_weights: half the memory of
// their float values), which gives the same bits as the float weights with bf16 products. On the golden pairs alpha
// stays within 0.01 of the float oracle's (tests/test_oracle.cpp); the bits still depend on each pair alone.
//
// Batches, threads and determinism. The reference pads each batch to its longest sequence. Here sequences of equal
// length run together (no padding) in forwards of at most OracleOptions::max_batch_tokens tokens, on all threads,
// which gives the same numbers: padding changes nothing in exact arithmetic (padded keys get attention weight 0,
// padded rows are not pooled). The forwards run with batch-invariant products (core/parallel.hpp,
// ScopedBatchInvariantProducts): every row of every product, and every element-wise and per-row step, is computed by
// the same operations whatever the other rows of the batch, and attention runs per sequence. So every result is a
// function of its own text alone, bit for bit, whatever the batch it came in, the batch size, the thread count or
// where an interrupted run resumed (oracle/run.hpp relies on it; tests/test_oracle.cpp checks it).
//
//   auto oracle = dea::bert::NliOracle<float>::load("models/nli-MiniLM2-L6-H768", "models/all-MiniLM-L6-v2");
//   dea::bert::OracleScore s = oracle.score("Paris is the capital of France.", "France");
//   // s.phi, s.sim, s.alpha_raw, s.alpha
//
// The models are frozen: the oracle releases their gradient buffers (half of their memory), so nli() and
// embedder() are for forward passes only.
#pragma once

#include "../core/error.hpp"
#include "../core/parallel.hpp"
#include "../core/param.hpp"
#include "../core/tensor.hpp"
#include "../core/utf8.hpp"
#include "alpha.hpp"
#include "isotonic.hpp"
#include "../text/wordpiece.hpp"
#include "../bert/hf_dir.hpp"
#include "../text/hf_tokenizer.hpp"
#include "../bert/model.hpp"
#include "../bert/sentence_embedding.hpp"
#include "../bert/seq_cls.hpp"
#include "../deberta/hf_dir.hpp"
#include "../deberta/seq_cls.hpp"
#include "../text/spm_tokenizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dea {
namespace bert {

/// The oracle's settings (the reference's defaults).
struct OracleOptions {
  std::size_t nli_max_length = 256;    ///< [CLS] q [SEP] k [SEP] at most this long (longest_first)
  std::size_t sim_max_length = 128;    ///< [CLS] t [SEP] at most this long
  double gamma_nli = data::kGammaNli;  ///< alpha_raw = sigmoid(phi - gamma_nli * sim)
  std::size_t max_batch_tokens = 4096; ///< the most tokens of one forward (sequences of one length run together)
  /// The precision of both models' matrix products (NliOracle<float> only): bf16 rounds both operands of every
  /// product to bf16 and accumulates in float (core/parallel.hpp, ScopedPrecision); everything else stays float.
  Precision precision = Precision::fp32;
  /// The tokenizer mode of a DeBERTa cross-encoder (text/spm_tokenizer.hpp): fast is what the reference's
  /// AutoTokenizer runs; slow is the sentencepiece library's own encoding. A BERT cross-encoder has one tokenizer.
  text::SpmMode nli_tokenizer = text::SpmMode::fast;
};

/// The oracle's numbers for one pair.
struct OracleScore {
  double phi = 0;        ///< the NLI entailment logit
  double sim = 0;        ///< the cosine of the two sentence embeddings
  double alpha_raw = 0;  ///< sigmoid(phi - gamma_nli * sim)
  double alpha = 0;      ///< in [0, 0.95]: clamped alpha_raw, or the calibrated value
};

/// A (premise, hypothesis) = (q_text, k_text) pair.
struct TextPair {
  std::string premise;
  std::string hypothesis;
};

/// The first id, in id2label order, whose lower-cased label contains "entail"; `source` names the configuration in
/// the message when there is none.
inline Index find_entailment_index(const std::vector<std::string>& id2label, const std::string& source) {
  for (std::size_t i = 0; i < id2label.size(); ++i)
    if (utf8::ascii_lower(id2label[i]).find("entail") != std::string::npos) return static_cast<Index>(i);
  std::string labels;
  for (std::size_t i = 0; i < id2label.size(); ++i) labels += ::dea::detail::concat(i ? ", " : "", i, ": \"", id2label[i], "\"");
  ::dea::detail::raise(::dea::detail::concat(source, ": no label of id2label contains \"entail\" (labels ", labels,
                                             "): not an NLI model"));
}

template <class S>
class NliOracle {
  static_assert(std::is_floating_point<S>::value, "NliOracle: Scalar must be float or double");

public:
  using Scalar = S;
  using Nli = BertForSequenceClassification<S>;
  using DebertaNli = deberta::DebertaV2ForSequenceClassification<S>;
  using Embedder = BertModel<S>;

  /// An oracle from models and tokenizers already loaded; `nli_name` / `embedder_name` name them in messages.
  NliOracle(Nli nli, text::WordPieceTokenizer nli_tokenizer, Embedder embedder, text::WordPieceTokenizer embedder_tokenizer,
            OracleOptions opt = {}, std::string nli_name = "the NLI model", std::string embedder_name = "the embedder")
      : nli_(std::move(nli)), emb_(std::move(embedder)), nli_tok_(std::move(nli_tokenizer)),
        emb_tok_(std::move(embedder_tokenizer)), opt_(opt), nli_name_(std::move(nli_name)),
        emb_name_(std::move(embedder_name)) {
    const BertConfig& nc = nli_->config();
    check(nc.type_vocab_size >= 2, nli_name_, ": config.json: type_vocab_size ", nc.type_vocab_size,
          ": a cross-encoder needs token type 1 for the hypothesis");
    check_common(nc.id2label, nc.max_position_embeddings);
    check_tokenizer_fits(*nli_tok_, nc, nli_name_);
    for (Param<S>* p : nli_->parameters()) p->grad = Vec<S>();
    // bf16 products: the product weights stored once as bf16 instead of float (the same bits)
    if constexpr (std::is_same<S, float>::value)
      if (opt_.precision == Precision::bf16) nli_->store_bf16_weights();
  }

  /// The same with a DeBERTa-v2/v3 cross-encoder and its SentencePiece tokenizer.
  NliOracle(DebertaNli nli, text::SpmTokenizer nli_tokenizer, Embedder embedder,
            text::WordPieceTokenizer embedder_tokenizer, OracleOptions opt = {}, std::string nli_name = "the NLI model",
            std::string embedder_name = "the embedder")
      : deb_(std::move(nli)), spm_(std::move(nli_tokenizer)), emb_(std::move(embedder)),
        emb_tok_(std::move(embedder_tokenizer)), opt_(opt), nli_name_(std::move(nli_name)),
        emb_name_(std::move(embedder_name)) {
    const deberta::DebertaConfig& nc = deb_->config();
    check(nc.type_vocab_size == 0 || nc.type_vocab_size >= 2, nli_name_, ": config.json: type_vocab_size ",
          nc.type_vocab_size, ": a cross-encoder with token types needs type 1 for the hypothesis (0: none)");
    // only absolute positions bound the length; relative ones are clamped to their buckets
    check_common(nc.id2label, nc.position_biased_input ? nc.max_position_embeddings : Index(-1));
    check(spm_->vocab_size() <= static_cast<std::size_t>(nc.vocab_size), nli_name_, ": its tokenizer has ",
          spm_->vocab_size(), " tokens (pieces and added tokens), more than config.json's vocab_size ",
          nc.vocab_size, ": the tokenizer is not this model's");
    for (Param<S>* p : deb_->parameters()) p->grad = Vec<S>();
    // fp32 products: the projection weights packed once, not by every product (the same bits), their float values
    // freed (the packed copies hold the same numbers)
    if (!std::is_same<S, float>::value || opt_.precision != Precision::bf16) deb_->pack_weights(true);
  }

  /// Loads both Hugging Face model directories (hf_dir.hpp and hf_tokenizer.hpp; deberta/hf_dir.hpp and
  /// text/spm_tokenizer.hpp): `nli_dir` as a BertForSequenceClassification (config.json, model.safetensors,
  /// vocab.txt), or as a DebertaV2ForSequenceClassification (config.json, model.safetensors, spm.model) when its
  /// config.json says model_type "deberta-v2"; `embedder_dir` as a BertModel.
  static NliOracle load(const std::string& nli_dir, const std::string& embedder_dir, OracleOptions opt = {},
                        HfLoadReport* nli_report = nullptr, HfLoadReport* embedder_report = nullptr) {
    const std::string nli_name = "NLI model '" + nli_dir + "'", emb_name = "embedder '" + embedder_dir + "'";
    if (deberta::is_deberta_dir(nli_dir)) {
      text::SpmTokenizer nt(nli_dir, opt.nli_tokenizer);  // first: it refuses a missing spm.model cheaply
      deberta::LoadReport report;
      DebertaNli nli = deberta::load_deberta_for_sequence_classification<S>(nli_dir, &report);
      if (nli_report) *nli_report = report;
      Embedder emb = load_bert_model<S>(embedder_dir, embedder_report);
      text::WordPieceTokenizer et = load_hf_tokenizer(embedder_dir);
      return NliOracle(std::move(nli), std::move(nt), std::move(emb), std::move(et), opt, nli_name, emb_name);
    }
    Nli nli = load_bert_for_sequence_classification<S>(nli_dir, nli_report);
    text::WordPieceTokenizer nt = load_hf_tokenizer(nli_dir);
    Embedder emb = load_bert_model<S>(embedder_dir, embedder_report);
    text::WordPieceTokenizer et = load_hf_tokenizer(embedder_dir);
    return NliOracle(std::move(nli), std::move(nt), std::move(emb), std::move(et), opt, nli_name, emb_name);
  }

  const OracleOptions& options() const { return opt_; }
  Index entailment_index() const { return entail_; }
  const std::string& entailment_label() const { return id2label()[static_cast<std::size_t>(entail_)]; }
  /// True when the cross-encoder is a DeBERTa model (deberta_nli()), false for a BERT one (nli()).
  bool nli_is_deberta() const { return deb_.has_value(); }
  /// The BERT cross-encoder (a dea::Error for a DeBERTa one).
  Nli& nli() {
    check(nli_.has_value(), nli_name_, " is a DeBERTa model: NliOracle::deberta_nli() is its model");
    return *nli_;
  }
  /// The DeBERTa cross-encoder (a dea::Error for a BERT one).
  const DebertaNli& deberta_nli() const {
    check(deb_.has_value(), nli_name_, " is a BERT model: NliOracle::nli() is its model");
    return *deb_;
  }
  Embedder& embedder() { return emb_; }
  /// Bytes of both models' weights as held (float values; bf16 copies with precision bf16, except a DeBERTa
  /// cross-encoder's, which stay float, their projection weights packed for the products under fp32).
  std::size_t weight_bytes() const {
    std::size_t n = emb_.weight_bytes();
    if (nli_) return n + nli_->weight_bytes();
    return n + deb_->weight_bytes();
  }

  /// [CLS] q [SEP] k [SEP] with token types, longest_first at nli_max_length: the cross-encoder's input.
  text::Encoding nli_encoding(const std::string& premise, const std::string& hypothesis) const {
    return deb_ ? spm_->encode_pair(premise, hypothesis, opt_.nli_max_length)
                : nli_tok_->encode_pair(premise, hypothesis, opt_.nli_max_length);
  }
  /// [CLS] t [SEP] truncated at sim_max_length: the embedder's input.
  text::Encoding sim_encoding(const std::string& text) const { return emb_tok_.encode_single(text, opt_.sim_max_length); }

  /// Installs an isotonic calibrator: alpha = clamp(calibrator(alpha_raw), 0, 0.95) from now on.
  void set_calibrator(eval::IsotonicRegression c) {
    check(c.fitted(), "NliOracle::set_calibrator: the calibrator is not fitted");
    calib_ = std::move(c);
  }
  void clear_calibrator() { calib_.reset(); }
  const eval::IsotonicRegression* calibrator() const { return calib_ ? &*calib_ : nullptr; }

  /// Fits the calibrator on human labels: the oracle's alpha_raw of each pair against its human alpha
  /// (IsotonicRegression(y_min 0, y_max 0.95, out_of_bounds clip) as the reference), installs it and returns it.
  const eval::IsotonicRegression& calibrate(const std::vector<TextPair>& pairs, const std::vector<double>& human_alpha) {
    check(pairs.size() == human_alpha.size(), "NliOracle::calibrate: ", pairs.size(), " pairs and ",
          human_alpha.size(), " labels");
    check(!pairs.empty(), "NliOracle::calibrate: no labelled pairs");
    const std::vector<OracleScore> s = score(pairs);
    std::vector<double> raw(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) raw[i] = s[i].alpha_raw;
    eval::IsotonicRegression iso(0.0, data::kAlphaMax);
    iso.fit(raw, human_alpha);
    calib_ = std::move(iso);
    return *calib_;
  }

  /// The oracle's numbers for one pair (the model's loops on all threads): the same bits as in any batch.
  OracleScore score(const std::string& premise, const std::string& hypothesis) {
    return score(std::vector<TextPair>{{premise, hypothesis}})[0];
  }

  /// The numbers of every pair, in order (see the file comment: sequences of equal length run together, in
  /// forwards of at most OracleOptions::max_batch_tokens tokens on all threads). An error in any pair is a
  /// dea::Error naming the first such pair (by index).
  std::vector<OracleScore> score(const std::vector<TextPair>& pairs) {
    const ScopedBatchInvariantProducts invariant;
    const ScopedPrecision precision(opt_.precision);
    const std::size_t n = pairs.size();
    std::vector<OracleScore> out(n);
    if (n == 0) return out;
    // encodings: nli[i] for pair i; sim[2i], sim[2i + 1] for its premise and hypothesis
    std::vector<text::Encoding> nli(n), sim(2 * n);
    for (std::size_t i = 0; i < n; ++i) {
      try {
        nli[i] = nli_encoding(pairs[i].premise, pairs[i].hypothesis);
        sim[2 * i] = sim_encoding(pairs[i].premise);
        sim[2 * i + 1] = sim_encoding(pairs[i].hypothesis);
      } catch (const std::exception& e) {
        ::dea::detail::raise(::dea::detail::concat("NliOracle: pair ", i, ": ", without_error_prefix(e.what())));
      }
    }
    Work w;
    std::vector<S> phi(n);
    if (deb_) {  // deberta::sequence_logits keeps each sequence's bits in any batch itself
      for_length_groups(nli, true, [&](const std::vector<std::size_t>& idx) {
        const Mat<S> logits = deberta_logits(nli, idx);
        for (std::size_t b = 0; b < idx.size(); ++b) phi[idx[b]] = logits(Index(b), entail_);
      });
    } else {
      for_length_groups(nli, rows_batch_invariant(nli_->config()), [&](const std::vector<std::size_t>& idx) {
        fill_batch(nli, idx, true, w.batch);
        const SeqClsOutput<S> o = nli_->forward(w.batch, nullptr, false, nullptr, w.nli);
        for (std::size_t b = 0; b < idx.size(); ++b) phi[idx[b]] = o.logits(Index(b), entail_);
      });
    }
    Mat<S> emb(Index(2 * n), emb_.config().hidden_size);
    for_length_groups(sim, rows_batch_invariant(emb_.config()), [&](const std::vector<std::size_t>& idx) {
      fill_batch(sim, idx, false, w.batch);
      const BertOutput<S> o = emb_.forward(w.batch, false, nullptr, w.emb);
      const Mat<S> e = mean_pool_normalize(o.last_hidden_state, w.batch.attention_mask, w.emb.B, w.emb.T);
      for (std::size_t b = 0; b < idx.size(); ++b) emb.row(Index(idx[b])) = e.row(Index(b));
    });
    for (std::size_t i = 0; i < n; ++i) {
      OracleScore& r = out[i];
      r.phi = static_cast<double>(phi[i]);
      r.sim = static_cast<double>(emb.row(Index(2 * i)).dot(emb.row(Index(2 * i + 1))));
      check(std::isfinite(r.phi) && std::isfinite(r.sim), "NliOracle: pair ", i, ": non-finite score (phi ", r.phi,
            ", sim ", r.sim, ")");
      r.alpha_raw = data::oracle_alpha_raw(r.phi, r.sim, opt_.gamma_nli);
      r.alpha = alpha_of(r.alpha_raw);
    }
    return out;
  }

  /// alpha from alpha_raw: the calibrator's value or alpha_raw itself, clamped to [0, 0.95].
  double alpha_of(double alpha_raw) const {
    const double a = calib_ ? calib_->predict(alpha_raw) : alpha_raw;
    return std::min(std::max(a, 0.0), data::kAlphaMax);
  }

  /// The entailment logit of one encoded pair (B = 1, no padding).
  S entailment_logit(const text::Encoding& e) {
    const ScopedBatchInvariantProducts invariant;
    const ScopedPrecision precision(opt_.precision);
    if (deb_) return deberta_logits({e}, {0})(0, entail_);
    Work w;
    fill_batch({e}, {0}, true, w.batch);
    return nli_->forward(w.batch, nullptr, false, nullptr, w.nli).logits(0, entail_);
  }
  /// The normalised sentence embedding [1, H] of one encoded text (B = 1, no padding).
  Mat<S> embedding(const text::Encoding& e) {
    const ScopedBatchInvariantProducts invariant;
    const ScopedPrecision precision(opt_.precision);
    Work w;
    fill_batch({e}, {0}, false, w.batch);
    const BertOutput<S> o = emb_.forward(w.batch, false, nullptr, w.emb);
    return mean_pool_normalize(o.last_hidden_state, w.batch.attention_mask, 1, w.emb.T);
  }

private:
  const std::vector<std::string>& id2label() const { return deb_ ? deb_->config().id2label : nli_->config().id2label; }

  /// The checks both cross-encoders share; `nli_positions` < 0: the NLI model has no absolute-position limit.
  void check_common(const std::vector<std::string>& nli_id2label, Index nli_positions) {
    const BertConfig& ec = emb_.config();
    check(opt_.precision == Precision::fp32 || std::is_same<S, float>::value,
          "NliOracle: precision bf16 is a policy of the float oracle (NliOracle<float>), not of double");
    entail_ = find_entailment_index(nli_id2label, nli_name_ + ": config.json");
    check(nli_id2label.size() >= 2, nli_name_, ": config.json: an NLI model needs at least 2 labels, id2label has ",
          nli_id2label.size());
    check(opt_.nli_max_length >= 3, "NliOracle: nli_max_length must be >= 3 ([CLS] and two [SEP]), got ",
          opt_.nli_max_length);
    check(opt_.sim_max_length >= 2, "NliOracle: sim_max_length must be >= 2 ([CLS] and [SEP]), got ",
          opt_.sim_max_length);
    check(nli_positions < 0 || static_cast<Index>(opt_.nli_max_length) <= nli_positions, nli_name_,
          ": nli_max_length ", opt_.nli_max_length, " exceeds its max_position_embeddings (", nli_positions,
          "): give a max length within the model's positions");
    check(static_cast<Index>(opt_.sim_max_length) <= ec.max_position_embeddings, emb_name_, ": sim_max_length ",
          opt_.sim_max_length, " exceeds its max_position_embeddings (", ec.max_position_embeddings,
          "): give a max length within the model's positions");
    check(std::isfinite(opt_.gamma_nli), "NliOracle: gamma_nli must be finite, got ", opt_.gamma_nli);
    check_tokenizer_fits(emb_tok_, ec, emb_name_);
    // frozen models: no gradient buffers (every Param holds one as large as its value)
    for (Param<S>* p : emb_.parameters()) p->grad = Vec<S>();
    if constexpr (std::is_same<S, float>::value)
      if (opt_.precision == Precision::bf16) emb_.store_bf16_weights();
  }

  /// The DeBERTa cross-encoder's logits [idx.size(), labels] of the encodings enc[idx[..]], all of one length (token
  /// types only for a model with a token-type embedding).
  Mat<S> deberta_logits(const std::vector<text::Encoding>& enc, const std::vector<std::size_t>& idx) const {
    std::vector<std::vector<std::int64_t>> ids, types;
    const bool with_types = deb_->config().type_vocab_size > 0;
    for (std::size_t i : idx) {
      ids.push_back(enc[i].input_ids);
      if (with_types) types.push_back(enc[i].token_type_ids);
    }
    return deberta::sequence_logits(*deb_, ids, types);
  }

  /// The buffers of a forward: the batch and both models' caches.
  struct Work {
    BertBatch<S> batch;
    typename Nli::Cache nli;
    typename Embedder::Cache emb;
  };

  /// Calls f(indices) for groups of encodings of one length, in order of length and then of index, each group at
  /// most max_batch_tokens tokens (at least one sequence; exactly one unless `batchable`).
  /// Sequences of one model run together only when its rows ([N, H] and [N, I] matrices) are whole multiples of 64
  /// bytes: then every row of a sequence has the same alignment at any position in the batch, and Eigen's
  /// vectorised per-row steps (LayerNorm, GELU, tanh, the softmax rows) run the same operations on it. Otherwise
  /// (an unusual hidden size) each sequence runs alone, which keeps the bits and costs speed.
  static bool rows_batch_invariant(const BertConfig& c) {
    return (c.hidden_size * Index(sizeof(S))) % 64 == 0 && (c.intermediate_size * Index(sizeof(S))) % 64 == 0;
  }

  template <class F>
  void for_length_groups(const std::vector<text::Encoding>& enc, bool batchable, F&& f) const {
    std::vector<std::size_t> order(enc.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return enc[a].size() < enc[b].size(); });
    std::vector<std::size_t> group;
    for (std::size_t i = 0; i < order.size();) {
      const std::size_t len = enc[order[i]].size();
      const std::size_t cap =
          batchable ? std::max<std::size_t>(1, opt_.max_batch_tokens / std::max<std::size_t>(len, 1)) : 1;
      group.clear();
      while (i < order.size() && enc[order[i]].size() == len && group.size() < cap) group.push_back(order[i++]);
      f(group);
    }
  }

  /// The batch [B, T] of the encodings enc[idx[0..B)], all of length T (no padding).
  static void fill_batch(const std::vector<text::Encoding>& enc, const std::vector<std::size_t>& idx, bool types,
                         BertBatch<S>& b) {
    const Index B = static_cast<Index>(idx.size()), T = static_cast<Index>(enc[idx[0]].size());
    b.input_ids = Tensor<std::int64_t>({B, T});
    if (types) b.token_type_ids = Tensor<std::int64_t>({B, T});
    else b.token_type_ids = Tensor<std::int64_t>();  // absent: all 0
    for (Index r = 0; r < B; ++r) {
      const text::Encoding& e = enc[idx[std::size_t(r)]];
      std::copy(e.input_ids.begin(), e.input_ids.end(), b.input_ids.ptr() + r * T);
      if (types) std::copy(e.token_type_ids.begin(), e.token_type_ids.end(), b.token_type_ids.ptr() + r * T);
    }
    b.attention_mask = Tensor<std::uint8_t>();  // absent: every token is real (no padding)
  }

  std::optional<Nli> nli_;                          // the BERT cross-encoder, or
  std::optional<DebertaNli> deb_;                   // the DeBERTa one
  std::optional<text::SpmTokenizer> spm_;           // the DeBERTa one's tokenizer
  Embedder emb_;
  std::optional<text::WordPieceTokenizer> nli_tok_;  // the BERT one's tokenizer
  text::WordPieceTokenizer emb_tok_;
  OracleOptions opt_;
  std::string nli_name_, emb_name_;
  Index entail_ = 0;
  std::optional<eval::IsotonicRegression> calib_;
};

}  // namespace bert
}  // namespace dea
