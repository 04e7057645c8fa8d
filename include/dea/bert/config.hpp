// dea/bert/config.hpp: the configuration of a Hugging Face BERT (the fields of its config.json that the model
// needs), parsed and validated field by field.
//
// A hub checkpoint's config.json (docs/bert.md, model directories) gives the sizes (vocab_size V, hidden_size H,
// num_hidden_layers L, num_attention_heads A with d = H / A, intermediate_size I, max_position_embeddings P,
// type_vocab_size), hidden_act (gelu | gelu_new = gelu_pytorch_tanh | relu), layer_norm_eps, pad_token_id,
// position_embedding_type (only "absolute"), the dropouts, and for a classifier id2label and classifier_dropout.
// A field that is absent takes the default of transformers' BertConfig (bert-base-uncased's sizes), as
// `from_pretrained` does; a field that is present must have the right JSON type and range, and every violation
// is a dea::Error naming the file and the field ("config.json 'DIR/config.json': hidden_size (30) must be
// divisible by num_attention_heads (4)"). Informative fields (architectures, torch_dtype, initializer_range,
// transformers_version, use_cache, label2id, ...) are read where they are useful and otherwise ignored.
//
// This header needs nlohmann_json (as io/ does); the model headers of this room include it through this one.
#pragma once

#include "../core/error.hpp"
#include "../core/files.hpp"
#include "../core/tensor.hpp"
#include "../io/json_limits.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace dea {
namespace bert {

/// The activation of the feed-forward block (config.json "hidden_act").
enum class HiddenAct {
  gelu,       ///< "gelu": x Phi(x), the exact erf form (BERT, MiniLM)
  gelu_tanh,  ///< "gelu_new" / "gelu_pytorch_tanh": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  relu,       ///< "relu"
};

inline const char* to_string(HiddenAct a) {
  switch (a) {
    case HiddenAct::gelu: return "gelu";
    case HiddenAct::gelu_tanh: return "gelu_new";
    case HiddenAct::relu: return "relu";
  }
  return "?";
}

/// "gelu", "gelu_new", "gelu_pytorch_tanh" or "relu"; false for any other name.
inline bool parse_hidden_act(const std::string& s, HiddenAct& out) {
  if (s == "gelu") out = HiddenAct::gelu;
  else if (s == "gelu_new" || s == "gelu_pytorch_tanh") out = HiddenAct::gelu_tanh;
  else if (s == "relu") out = HiddenAct::relu;
  else return false;
  return true;
}

/// The sizes and settings of a BERT (defaults: transformers' BertConfig, i.e. bert-base-uncased).
struct BertConfig {
  Index vocab_size = 30522;             ///< V
  Index hidden_size = 768;              ///< H
  Index num_hidden_layers = 12;         ///< L (0 allowed: embeddings straight into the pooler)
  Index num_attention_heads = 12;       ///< A (H must be a multiple)
  Index intermediate_size = 3072;       ///< I
  Index max_position_embeddings = 512;  ///< P, the longest sequence
  Index type_vocab_size = 2;            ///< token types (segments)
  HiddenAct hidden_act = HiddenAct::gelu;
  double layer_norm_eps = 1e-12;
  Index pad_token_id = 0;               ///< the padding row of the word embeddings (no gradient); -1: none
  double hidden_dropout_prob = 0.1;     ///< embeddings, attention output, feed-forward output
  double attention_probs_dropout_prob = 0.1;
  std::optional<double> classifier_dropout;  ///< nullopt: hidden_dropout_prob (BertForSequenceClassification)
  std::vector<std::string> id2label{"LABEL_0", "LABEL_1"};  ///< label names by id; num_labels = its size
  double initializer_range = 0.02;      ///< std of fresh weights (informative at inference)
  std::vector<std::string> architectures;  ///< informative, e.g. {"BertForPreTraining"}
  std::string torch_dtype;                 ///< informative ("float32", "float16", "bfloat16"), "" when absent

  /// Largest sizes accepted (a corrupt or hostile config is refused before anything is sized from it).
  static constexpr Index kMaxHidden = 65536, kMaxLayers = 1024, kMaxIntermediate = Index(1) << 20,
                         kMaxVocab = Index(1) << 24, kMaxPositions = Index(1) << 20, kMaxTypes = 65536,
                         kMaxLabels = 65536;

  Index head_dim() const { return hidden_size / num_attention_heads; }
  Index num_labels() const { return static_cast<Index>(id2label.size()); }
  /// The dropout of the classifier head: classifier_dropout, or hidden_dropout_prob when it is null.
  double classifier_dropout_or_hidden() const { return classifier_dropout ? *classifier_dropout : hidden_dropout_prob; }

  /// Throws dea::Error naming the first bad field (prefixed with `source`, e.g. the file).
  void validate(const std::string& source = "BertConfig") const {
    auto range = [&](const char* field, Index v, Index lo, Index hi) {
      check(v >= lo && v <= hi, source, ": ", field, ": expected an integer in [", lo, ", ", hi, "], got ", v);
    };
    range("vocab_size", vocab_size, 1, kMaxVocab);
    range("hidden_size", hidden_size, 1, kMaxHidden);
    range("num_hidden_layers", num_hidden_layers, 0, kMaxLayers);
    range("num_attention_heads", num_attention_heads, 1, kMaxHidden);
    check(hidden_size % num_attention_heads == 0, source, ": hidden_size (", hidden_size,
          ") must be divisible by num_attention_heads (", num_attention_heads, ")");
    range("intermediate_size", intermediate_size, 1, kMaxIntermediate);
    range("max_position_embeddings", max_position_embeddings, 1, kMaxPositions);
    range("type_vocab_size", type_vocab_size, 1, kMaxTypes);
    check(std::isfinite(layer_norm_eps) && layer_norm_eps > 0, source,
          ": layer_norm_eps: expected a finite number > 0, got ", layer_norm_eps);
    check(pad_token_id >= -1 && pad_token_id < vocab_size, source, ": pad_token_id: expected an id in [0, ",
          vocab_size, ") (or null), got ", pad_token_id);
    auto prob = [&](const char* field, double p) {
      check(p >= 0 && p < 1, source, ": ", field, ": expected a probability in [0, 1), got ", p);
    };
    prob("hidden_dropout_prob", hidden_dropout_prob);
    prob("attention_probs_dropout_prob", attention_probs_dropout_prob);
    if (classifier_dropout) prob("classifier_dropout", *classifier_dropout);
    check(!id2label.empty() && num_labels() <= kMaxLabels, source, ": id2label: expected 1 to ", kMaxLabels,
          " labels, got ", id2label.size());
  }
};

namespace detail {

inline const char* json_type(const nlohmann::json& j) { return j.type_name(); }

/// An integer field (a JSON integer; 768.0 is refused), or `fallback` when absent.
inline Index json_index_field(const nlohmann::json& j, const char* field, Index fallback, const std::string& source) {
  const auto it = j.find(field);
  if (it == j.end()) return fallback;
  check(it->is_number_integer(), source, ": ", field, ": expected an integer, got ",
        it->is_number() ? it->dump() : std::string(json_type(*it)));
  if (it->is_number_unsigned()) {
    const std::uint64_t v = it->get<std::uint64_t>();
    check(v <= static_cast<std::uint64_t>(std::numeric_limits<Index>::max() / 4), source, ": ", field,
          ": the value ", v, " is too large");
    return static_cast<Index>(v);
  }
  const std::int64_t v = it->get<std::int64_t>();
  check(v >= -(std::int64_t(1) << 40), source, ": ", field, ": the value ", v, " is too small");
  return static_cast<Index>(v);
}

/// A number field, or `fallback` when absent.
inline double json_number_field(const nlohmann::json& j, const char* field, double fallback, const std::string& source) {
  const auto it = j.find(field);
  if (it == j.end()) return fallback;
  check(it->is_number(), source, ": ", field, ": expected a number, got ", json_type(*it));
  const double v = it->get<double>();
  check(std::isfinite(v), source, ": ", field, ": expected a finite number, got ", it->dump());
  return v;
}

/// A string field, or `fallback` when absent.
inline std::string json_string_field(const nlohmann::json& j, const char* field, const std::string& fallback,
                                     const std::string& source) {
  const auto it = j.find(field);
  if (it == j.end()) return fallback;
  check(it->is_string(), source, ": ", field, ": expected a string, got ", json_type(*it));
  return it->get<std::string>();
}

}  // namespace detail

/// Parses a config.json object (`source` names it in messages) and validates it.
inline BertConfig parse_bert_config(const nlohmann::json& j, const std::string& source = "config.json") {
  using namespace detail;
  check(j.is_object(), source, ": expected a JSON object, got ", json_type(j));
  BertConfig c;
  const std::string model_type = json_string_field(j, "model_type", "bert", source);
  check(model_type == "bert", source, ": model_type: expected \"bert\" (this loader builds BERT only), got \"",
        model_type, "\"");
  c.vocab_size = json_index_field(j, "vocab_size", c.vocab_size, source);
  c.hidden_size = json_index_field(j, "hidden_size", c.hidden_size, source);
  c.num_hidden_layers = json_index_field(j, "num_hidden_layers", c.num_hidden_layers, source);
  c.num_attention_heads = json_index_field(j, "num_attention_heads", c.num_attention_heads, source);
  c.intermediate_size = json_index_field(j, "intermediate_size", c.intermediate_size, source);
  c.max_position_embeddings = json_index_field(j, "max_position_embeddings", c.max_position_embeddings, source);
  c.type_vocab_size = json_index_field(j, "type_vocab_size", c.type_vocab_size, source);
  const std::string act = json_string_field(j, "hidden_act", "gelu", source);
  check(parse_hidden_act(act, c.hidden_act), source, ": hidden_act: expected \"gelu\", \"gelu_new\", ",
        "\"gelu_pytorch_tanh\" or \"relu\", got \"", act, "\"");
  c.layer_norm_eps = json_number_field(j, "layer_norm_eps", c.layer_norm_eps, source);
  if (j.contains("pad_token_id") && j["pad_token_id"].is_null())
    c.pad_token_id = -1;
  else
    c.pad_token_id = json_index_field(j, "pad_token_id", c.pad_token_id, source);
  const std::string pos = json_string_field(j, "position_embedding_type", "absolute", source);
  check(pos == "absolute", source, ": position_embedding_type: expected \"absolute\" (relative position ",
        "embeddings are not supported), got \"", pos, "\"");
  for (const char* flag : {"is_decoder", "add_cross_attention"}) {
    const auto it = j.find(flag);
    if (it == j.end() || it->is_null()) continue;
    check(it->is_boolean(), source, ": ", flag, ": expected true or false, got ", json_type(*it));
    check(!it->get<bool>(), source, ": ", flag, ": expected false (BERT as an encoder), got true");
  }
  c.hidden_dropout_prob = json_number_field(j, "hidden_dropout_prob", c.hidden_dropout_prob, source);
  c.attention_probs_dropout_prob =
      json_number_field(j, "attention_probs_dropout_prob", c.attention_probs_dropout_prob, source);
  if (j.contains("classifier_dropout") && !j["classifier_dropout"].is_null())
    c.classifier_dropout = json_number_field(j, "classifier_dropout", 0.0, source);
  c.initializer_range = json_number_field(j, "initializer_range", c.initializer_range, source);
  c.torch_dtype = j.contains("torch_dtype") && j["torch_dtype"].is_string() ? j["torch_dtype"].get<std::string>() : "";
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const auto& a : j["architectures"])
      if (a.is_string()) c.architectures.push_back(a.get<std::string>());

  // id2label: {"0": "contradiction", "1": "entailment", ...}: the keys are the ids 0..n-1 as strings
  const auto lab = j.find("id2label");
  if (lab != j.end() && !lab->is_null()) {
    check(lab->is_object(), source, ": id2label: expected an object {\"0\": label, ...}, got ", json_type(*lab));
    const std::size_t n = lab->size();
    check(n >= 1 && n <= static_cast<std::size_t>(BertConfig::kMaxLabels), source, ": id2label: expected 1 to ",
          BertConfig::kMaxLabels, " labels, got ", n);
    std::vector<std::string> names(n);
    std::vector<char> seen(n, 0);
    for (auto it = lab->begin(); it != lab->end(); ++it) {
      const std::string& key = it.key();
      std::size_t id = 0;
      bool digits = !key.empty() && key.size() <= 6;
      for (char ch : key) digits = digits && ch >= '0' && ch <= '9';
      if (digits) id = static_cast<std::size_t>(std::stoul(key));
      check(digits && id < n && !(key.size() > 1 && key[0] == '0'), source, ": id2label: key \"", key,
            "\": expected the ids 0 to ", n - 1, " as strings");
      check(!seen[id], source, ": id2label: id ", id, " appears twice");
      check(it.value().is_string(), source, ": id2label[\"", key, "\"]: expected a string, got ", json_type(it.value()));
      seen[id] = 1;
      names[id] = it.value().get<std::string>();
    }
    c.id2label = std::move(names);
  }
  const auto nl = j.find("num_labels");
  if (nl != j.end()) {
    const Index n = json_index_field(j, "num_labels", 0, source);
    if (lab == j.end() || lab->is_null()) {
      check(n >= 1 && n <= BertConfig::kMaxLabels, source, ": num_labels: expected an integer in [1, ",
            BertConfig::kMaxLabels, "], got ", n);
      c.id2label.clear();
      for (Index k = 0; k < n; ++k) c.id2label.push_back("LABEL_" + std::to_string(k));
    } else {
      check(n == c.num_labels(), source, ": num_labels (", n, ") disagrees with id2label (", c.num_labels(),
            " labels)");
    }
  }
  c.validate(source);
  return c;
}

/// The configuration as a Hugging Face config.json object (model_type "bert", architectures when known); parsing it
/// gives `c` back.
inline nlohmann::json bert_config_json(const BertConfig& c) {
  nlohmann::json j;
  j["model_type"] = "bert";
  if (!c.architectures.empty()) j["architectures"] = c.architectures;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["intermediate_size"] = c.intermediate_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["type_vocab_size"] = c.type_vocab_size;
  j["hidden_act"] = to_string(c.hidden_act);
  j["layer_norm_eps"] = c.layer_norm_eps;
  if (c.pad_token_id >= 0)
    j["pad_token_id"] = c.pad_token_id;
  else
    j["pad_token_id"] = nullptr;
  j["position_embedding_type"] = "absolute";
  j["hidden_dropout_prob"] = c.hidden_dropout_prob;
  j["attention_probs_dropout_prob"] = c.attention_probs_dropout_prob;
  if (c.classifier_dropout)
    j["classifier_dropout"] = *c.classifier_dropout;
  else
    j["classifier_dropout"] = nullptr;
  j["initializer_range"] = c.initializer_range;
  nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
  for (std::size_t k = 0; k < c.id2label.size(); ++k) {
    id2label[std::to_string(k)] = c.id2label[k];
    label2id[c.id2label[k]] = k;
  }
  j["id2label"] = std::move(id2label);
  j["label2id"] = std::move(label2id);
  if (!c.torch_dtype.empty()) j["torch_dtype"] = c.torch_dtype;
  return j;
}

/// Maximum size of a config.json read from disk.
constexpr std::size_t kMaxConfigBytes = std::size_t(1) << 20;

/// Reads and parses the config.json at `path` (at most 1 MiB, JSON nested at most 64 levels).
inline BertConfig load_bert_config(const std::string& path) {
  const std::string source = "config.json '" + path + "'";
  const std::string text = read_file(path, kMaxConfigBytes);
  return parse_bert_config(io::parse_json_limited(text, source), source);
}

}  // namespace bert
}  // namespace dea
