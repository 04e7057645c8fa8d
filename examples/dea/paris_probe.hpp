// The Paris probe of `dea train` and `dea eval` (the reference's train.py ends with it): "Paris is capital of
// France" as one segment, eval mode, no oracle, gamma 0; the mean over heads of alpha-hat[paris -> france] per layer
// (the paper's target is about 0.9 in a trained model).
#pragma once

#include <dea/bert/dual_expert_bert.hpp>
#include <dea/text/run_tokenizer.hpp>
#include <dea/nn/transformer.hpp>

#include <fmt/core.h>

#include <cstdio>
#include <string>
#include <vector>

namespace dea_cli {

struct ParisProbe {
  bool ok = false;
  std::string error;             ///< why it did not run (a token is missing)
  dea::Index qi = -1, ki = -1;
  std::vector<double> per_layer;  ///< mean over heads of alpha-hat[qi -> ki]
};

/// The longest sequence and the number of heads of the models the probe runs on (the encoder, DualExpertBert).
template <class S, class A>
dea::Index probe_max_len(const dea::nn::TransformerModel<S, A>& m) { return m.config().max_len; }
template <class S, class A>
dea::Index probe_heads(const dea::nn::TransformerModel<S, A>& m) { return m.config().n_heads; }
template <class S>
dea::Index probe_max_len(const dea::bert::DualExpertBert<S>& m) { return m.config().max_position_embeddings; }
template <class S>
dea::Index probe_heads(const dea::bert::DualExpertBert<S>& m) { return m.config().num_attention_heads; }

/// "Paris is capital of France" as one segment (max_len 32); eval mode, no oracle, gamma 0. The query is the last
/// token of "Paris", the key the first token of "France" after it (WordPiece may split a word into pieces).
template <class Model>
ParisProbe paris_probe(Model& model, const dea::data::RunTokenizer& tok) {
  using Scalar = typename Model::Scalar;
  ParisProbe p;
  const dea::data::Encoding e = tok.encode("Paris is capital of France", 32);
  const std::vector<std::string> paris = tok.tokenize("Paris"), france = tok.tokenize("France");
  for (const auto* w : {&paris, &france})
    for (const std::string& piece : *w)
      if (!tok.contains(piece) || piece == tok.vocab()[static_cast<std::size_t>(tok.unk_id())])
        p.error = "'" + std::string(w == &paris ? "Paris" : "France") + "' is not in the vocabulary";
  if (!p.error.empty()) return p;
  const dea::Index qs = dea::data::find_span(e.tokens, paris, 1);
  const dea::Index ks = qs < 0 ? -1 : dea::data::find_span(e.tokens, france, qs + static_cast<dea::Index>(paris.size()));
  if (qs < 0 || ks < 0) {
    p.error = "token not found in the encoding";
    return p;
  }
  p.qi = qs + static_cast<dea::Index>(paris.size()) - 1;
  p.ki = ks;
  const dea::Index T = e.size();
  if (T > probe_max_len(model)) {
    p.error = dea::detail::concat("the probe sentence has ", T, " tokens, more than the model's max_len ",
                                    probe_max_len(model));
    return p;
  }
  dea::nn::ModelBatch<Scalar> b;
  b.input_ids = dea::Tensor<std::int64_t>({1, T});
  for (dea::Index t = 0; t < T; ++t) b.input_ids[t] = e.input_ids[static_cast<std::size_t>(t)];
  b.attention_mask = dea::Tensor<std::uint8_t>({1, T}, 1);
  b.token_type_ids = dea::Tensor<std::int64_t>({1, T}, 0);
  typename Model::Cache c;
  model.forward(b, Scalar(0), false, nullptr, c);
  for (dea::Index l = 0; l < model.n_layers(); ++l) {
    const auto& a = c.layers[static_cast<std::size_t>(l)].attn;
    const dea::Index H = probe_heads(model);
    double s = 0;
    for (dea::Index h = 0; h < H; ++h) s += static_cast<double>(a.alpha_hat[static_cast<std::size_t>(a.cell(0, h, p.qi, p.ki, H))]);
    p.per_layer.push_back(s / static_cast<double>(H));
  }
  p.ok = true;
  return p;
}

/// Prints the probe on `out` (stdout, or stderr where stdout carries a document of its own).
inline void print_paris_probe(const ParisProbe& p, std::FILE* out = stdout) {
  if (!p.ok) {
    fmt::print(out, "Paris probe skipped: {}\n", p.error);
    return;
  }
  fmt::print(out, "Paris probe (eval mode, no oracle): alpha_hat[paris(pos {}) -> france(pos {})], mean over heads\n",
             p.qi, p.ki);
  for (std::size_t l = 0; l < p.per_layer.size(); ++l)
    fmt::print(out, "  layer {}: {:.4f}   (paper target ~0.9)\n", l, p.per_layer[l]);
}

}  // namespace dea_cli
