// dea/deberta/config.hpp: the configuration of a Hugging Face DeBERTa-v2 / DeBERTa-v3 model (model_type
// "deberta-v2"), parsed from its config.json and validated field by field (docs/deberta.md, configuration).
//
// Every field the model reads takes, when absent, the default of transformers' DebertaV2Config, which is NOT the
// layout of the published v3 checkpoints (relative_attention defaults to false, for one), so a file is never
// assumed to be v3. Fields that change the computation in a way this library does not implement are refused by
// name: a convolution block (conv_kernel_size > 0), talking heads, a position term other than c2p / p2c, an
// attention_head_size other than hidden_size / num_attention_heads, a pooler narrower or wider than the hidden
// size. Log buckets for which the bucket formula is undefined are refused too: fewer than 2 buckets (m =
// position_buckets / 2 = 0), or m = R - 1 with R the relative range (the formula divides by log((R - 1) / m) = 0).
// (m > R - 1 is defined, if odd: the buckets beyond m then shrink; the reference computes it, and so does this
// library.) Every error is a dea::Error naming the file and the field.
//
// This header needs nlohmann_json (as io/ and bert/config.hpp do).
#pragma once

#include "../bert/config.hpp"
#include "../core/error.hpp"
#include "../core/files.hpp"
#include "../core/tensor.hpp"
#include "../io/json_limits.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <vector>

namespace dea {
namespace deberta {

/// An activation of the feed-forward block (hidden_act) or of the classification pooler (pooler_hidden_act).
enum class Activation {
  gelu,       ///< "gelu": x Phi(x), the erf form
  gelu_tanh,  ///< "gelu_new" / "gelu_pytorch_tanh": the tanh approximation
  relu,       ///< "relu"
  tanh,       ///< "tanh"
};

inline const char* to_string(Activation a) {
  switch (a) {
    case Activation::gelu: return "gelu";
    case Activation::gelu_tanh: return "gelu_new";
    case Activation::relu: return "relu";
    case Activation::tanh: return "tanh";
  }
  return "?";
}

/// "gelu", "gelu_new", "gelu_pytorch_tanh", "relu" or "tanh"; false for any other name.
inline bool parse_activation(const std::string& s, Activation& out) {
  if (s == "gelu") out = Activation::gelu;
  else if (s == "gelu_new" || s == "gelu_pytorch_tanh") out = Activation::gelu_tanh;
  else if (s == "relu") out = Activation::relu;
  else if (s == "tanh") out = Activation::tanh;
  else return false;
  return true;
}

/// The sizes and settings of a DeBERTa-v2/v3 (defaults: transformers' DebertaV2Config).
struct DebertaConfig {
  Index vocab_size = 128100;            ///< V, rows of the word embedding
  Index hidden_size = 1536;             ///< H
  Index num_hidden_layers = 24;         ///< L
  Index num_attention_heads = 24;       ///< A (H must be a multiple)
  Index intermediate_size = 6144;       ///< I
  Activation hidden_act = Activation::gelu;
  Index max_position_embeddings = 512;  ///< P: absolute table rows, and the relative range when max_rel < 1
  Index type_vocab_size = 0;            ///< 0: no token-type embedding (token_type_ids are ignored)
  double layer_norm_eps = 1e-7;
  bool relative_attention = false;      ///< disentangled attention on / off
  Index max_relative_positions = -1;    ///< < 1: max_position_embeddings
  Index position_buckets = -1;          ///< k; <= 0: no log buckets
  bool c2p = false, p2c = false;        ///< pos_att_type members
  bool share_att_key = false;           ///< position terms reuse the content query / key projections
  bool norm_rel_ebd = false;            ///< norm_rel_ebd contains "layer_norm"
  bool position_biased_input = true;    ///< absolute position embeddings added to the input
  Index embedding_size = -1;            ///< E; < 0 (absent): H
  Index pad_token_id = 0;               ///< -1: null
  Index pooler_hidden_size = -1;        ///< < 0 (absent): H; must equal H
  Activation pooler_hidden_act = Activation::gelu;
  double pooler_dropout = 0;            ///< informative at inference
  double hidden_dropout_prob = 0.1, attention_probs_dropout_prob = 0.1;  ///< informative at inference
  double initializer_range = 0.02;      ///< informative
  std::vector<std::string> id2label{"LABEL_0", "LABEL_1"};  ///< label names by id; num_labels = its size
  std::string torch_dtype;              ///< informative ("float32", "bfloat16", ...), "" when absent

  /// Largest sizes accepted (a corrupt or hostile config is refused before anything is sized from it).
  static constexpr Index kMaxHidden = 65536, kMaxLayers = 1024, kMaxIntermediate = Index(1) << 20,
                         kMaxVocab = Index(1) << 24, kMaxPositions = Index(1) << 20, kMaxTypes = 65536,
                         kMaxLabels = 65536;

  Index head_dim() const { return hidden_size / num_attention_heads; }
  Index num_labels() const { return static_cast<Index>(id2label.size()); }
  Index embed_size() const { return embedding_size > 0 ? embedding_size : hidden_size; }
  /// R: the range of relative distances the buckets are laid over.
  Index relative_range() const { return max_relative_positions >= 1 ? max_relative_positions : max_position_embeddings; }
  /// S: half the rows of the relative embedding table (the attention span).
  Index att_span() const { return position_buckets > 0 ? position_buckets : relative_range(); }
  /// f = 1 + [c2p] + [p2c]: the attention scale is sqrt(d f).
  int scale_factor() const { return 1 + (c2p ? 1 : 0) + (p2c ? 1 : 0); }
  /// pos_att_type as config.json spells it ("p2c|c2p", "c2p", "p2c" or "").
  std::string pos_att_type_str() const {
    if (c2p && p2c) return "p2c|c2p";
    return c2p ? "c2p" : (p2c ? "p2c" : "");
  }
  /// The id of the first label, in id order, whose lower-cased name contains "entail"; -1 when none does.
  Index entailment_index() const {
    for (std::size_t k = 0; k < id2label.size(); ++k) {
      std::string s = id2label[k];
      std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
      if (s.find("entail") != std::string::npos) return static_cast<Index>(k);
    }
    return -1;
  }

  /// Throws dea::Error naming the first bad field (prefixed with `source`, e.g. the file).
  void validate(const std::string& source = "DebertaConfig") const {
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
    range("type_vocab_size", type_vocab_size, 0, kMaxTypes);
    check(std::isfinite(layer_norm_eps) && layer_norm_eps > 0, source,
          ": layer_norm_eps: expected a finite number > 0, got ", layer_norm_eps);
    check(max_relative_positions <= kMaxPositions, source, ": max_relative_positions: expected at most ",
          kMaxPositions, ", got ", max_relative_positions);
    check(position_buckets <= kMaxPositions, source, ": position_buckets: expected at most ", kMaxPositions, ", got ",
          position_buckets);
    if (relative_attention && position_buckets > 0) {
      const Index m = position_buckets / 2, R = relative_range();
      check(m >= 1, source, ": position_buckets (", position_buckets, ") must be at least 2 (or <= 0 for no buckets)");
      check(m != R - 1, source, ": position_buckets (", position_buckets, ") does not fit the relative range: half "
            "of it (", m, ") equals max_relative_positions - 1 (", R - 1,
            max_relative_positions >= 1 ? "" : ", max_relative_positions < 1 means max_position_embeddings",
            "), where the bucket formula divides by log((R - 1) / m) = 0");
    }
    check(embedding_size == -1 || (embedding_size >= 1 && embedding_size <= kMaxHidden), source,
          ": embedding_size: expected an integer in [1, ", kMaxHidden, "], got ", embedding_size);
    check(pooler_hidden_size == -1 || pooler_hidden_size == hidden_size, source, ": pooler_hidden_size (",
          pooler_hidden_size, ") must equal hidden_size (", hidden_size, "): the classifier reads H features");
    check(pad_token_id >= -1 && pad_token_id < vocab_size, source, ": pad_token_id: expected an id in [0, ",
          vocab_size, ") (or null), got ", pad_token_id);
    check(!id2label.empty() && num_labels() <= kMaxLabels, source, ": id2label: expected 1 to ", kMaxLabels,
          " labels, got ", id2label.size());
  }
};

namespace detail {

inline std::string lower_trim(const std::string& s) {
  std::size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  std::string out = s.substr(a, b - a);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return out;
}

/// The members of a "a|b" string (trimmed, lower-cased, empty members dropped).
inline std::vector<std::string> split_bar(const std::string& s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t bar = s.find('|', start);
    const std::string part = lower_trim(s.substr(start, bar == std::string::npos ? std::string::npos : bar - start));
    if (!part.empty()) out.push_back(part);
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  return out;
}

inline bool json_bool_field(const nlohmann::json& j, const char* field, bool fallback, const std::string& source) {
  const auto it = j.find(field);
  if (it == j.end() || it->is_null()) return fallback;
  check(it->is_boolean(), source, ": ", field, ": expected true or false, got ", it->type_name());
  return it->get<bool>();
}

/// id2label {"0": name, ...} (keys are the ids 0..n-1 as strings) and num_labels, as BertConfig reads them.
inline void parse_labels(const nlohmann::json& j, std::vector<std::string>& id2label, const std::string& source) {
  const auto lab = j.find("id2label");
  if (lab != j.end() && !lab->is_null()) {
    check(lab->is_object(), source, ": id2label: expected an object {\"0\": label, ...}, got ", lab->type_name());
    const std::size_t n = lab->size();
    check(n >= 1 && n <= static_cast<std::size_t>(DebertaConfig::kMaxLabels), source, ": id2label: expected 1 to ",
          DebertaConfig::kMaxLabels, " labels, got ", n);
    std::vector<std::string> names(n);
    std::vector<char> seen(n, 0);
    for (auto it = lab->begin(); it != lab->end(); ++it) {
      const std::string& key = it.key();
      bool digits = !key.empty() && key.size() <= 6;
      for (char ch : key) digits = digits && ch >= '0' && ch <= '9';
      const std::size_t id = digits ? static_cast<std::size_t>(std::stoul(key)) : n;
      check(digits && id < n && !(key.size() > 1 && key[0] == '0'), source, ": id2label: key \"", key,
            "\": expected the ids 0 to ", n - 1, " as strings");
      check(!seen[id], source, ": id2label: id ", id, " appears twice");
      check(it.value().is_string(), source, ": id2label[\"", key, "\"]: expected a string, got ", it.value().type_name());
      seen[id] = 1;
      names[id] = it.value().get<std::string>();
    }
    id2label = std::move(names);
  }
  if (j.find("num_labels") != j.end()) {
    const Index n = bert::detail::json_index_field(j, "num_labels", 0, source);
    if (lab == j.end() || lab->is_null()) {
      check(n >= 1 && n <= DebertaConfig::kMaxLabels, source, ": num_labels: expected an integer in [1, ",
            DebertaConfig::kMaxLabels, "], got ", n);
      id2label.clear();
      for (Index k = 0; k < n; ++k) id2label.push_back("LABEL_" + std::to_string(k));
    } else {
      check(n == static_cast<Index>(id2label.size()), source, ": num_labels (", n, ") disagrees with id2label (",
            id2label.size(), " labels)");
    }
  }
}

}  // namespace detail

/// Parses a config.json object (`source` names it in messages) and validates it. A missing model_type is taken as
/// "deberta-v2" (the golden cases store the configuration without it); any other value is refused.
inline DebertaConfig parse_deberta_config(const nlohmann::json& j, const std::string& source = "config.json") {
  using bert::detail::json_index_field;
  using bert::detail::json_number_field;
  using bert::detail::json_string_field;
  check(j.is_object(), source, ": expected a JSON object, got ", j.type_name());
  DebertaConfig c;
  const std::string model_type = json_string_field(j, "model_type", "deberta-v2", source);
  check(model_type == "deberta-v2", source, ": model_type: expected \"deberta-v2\" (DeBERTa-v2 and v3), got \"",
        model_type, "\"", model_type == "deberta" ? " (DeBERTa v1 is a different architecture)" : "");
  c.vocab_size = json_index_field(j, "vocab_size", c.vocab_size, source);
  c.hidden_size = json_index_field(j, "hidden_size", c.hidden_size, source);
  c.num_hidden_layers = json_index_field(j, "num_hidden_layers", c.num_hidden_layers, source);
  c.num_attention_heads = json_index_field(j, "num_attention_heads", c.num_attention_heads, source);
  c.intermediate_size = json_index_field(j, "intermediate_size", c.intermediate_size, source);
  auto activation = [&](const char* field, Activation& out) {
    const std::string s = json_string_field(j, field, "gelu", source);
    check(parse_activation(s, out), source, ": ", field, ": expected \"gelu\", \"gelu_new\", \"gelu_pytorch_tanh\", "
          "\"relu\" or \"tanh\", got \"", s, "\"");
  };
  activation("hidden_act", c.hidden_act);
  c.max_position_embeddings = json_index_field(j, "max_position_embeddings", c.max_position_embeddings, source);
  c.type_vocab_size = json_index_field(j, "type_vocab_size", c.type_vocab_size, source);
  c.layer_norm_eps = json_number_field(j, "layer_norm_eps", c.layer_norm_eps, source);
  c.relative_attention = detail::json_bool_field(j, "relative_attention", c.relative_attention, source);
  c.max_relative_positions = json_index_field(j, "max_relative_positions", c.max_relative_positions, source);
  c.position_buckets = json_index_field(j, "position_buckets", c.position_buckets, source);

  // pos_att_type: null, "p2c|c2p" (split on '|', trimmed, lower-cased) or ["p2c", "c2p"]
  const auto pat = j.find("pos_att_type");
  if (pat != j.end() && !pat->is_null()) {
    std::vector<std::string> members;
    if (pat->is_string()) {
      members = detail::split_bar(pat->get<std::string>());
    } else {
      check(pat->is_array(), source, ": pos_att_type: expected a string such as \"p2c|c2p\", a list or null, got ",
            pat->type_name());
      for (const auto& m : *pat) {
        check(m.is_string(), source, ": pos_att_type: expected a list of strings, found ", m.type_name());
        const std::string s = detail::lower_trim(m.get<std::string>());
        if (!s.empty()) members.push_back(s);
      }
    }
    for (const std::string& m : members) {
      if (m == "c2p") c.c2p = true;
      else if (m == "p2c") c.p2c = true;
      else if (m == "none") continue;
      else
        ::dea::detail::raise(::dea::detail::concat(source, ": pos_att_type: the position term \"", m,
                                                   "\" is not supported (only c2p and p2c)"));
    }
  }
  c.share_att_key = detail::json_bool_field(j, "share_att_key", c.share_att_key, source);
  for (const std::string& m : detail::split_bar(json_string_field(j, "norm_rel_ebd", "none", source))) {
    if (m == "layer_norm") c.norm_rel_ebd = true;
    else
      check(m == "none", source, ": norm_rel_ebd: \"", m, "\" is not supported (expected \"none\" or \"layer_norm\")");
  }
  c.position_biased_input = detail::json_bool_field(j, "position_biased_input", c.position_biased_input, source);
  if (j.contains("embedding_size") && !j["embedding_size"].is_null())
    c.embedding_size = json_index_field(j, "embedding_size", -1, source);
  if (j.contains("pad_token_id") && j["pad_token_id"].is_null())
    c.pad_token_id = -1;
  else
    c.pad_token_id = json_index_field(j, "pad_token_id", c.pad_token_id, source);
  if (j.contains("pooler_hidden_size") && !j["pooler_hidden_size"].is_null())
    c.pooler_hidden_size = json_index_field(j, "pooler_hidden_size", -1, source);
  activation("pooler_hidden_act", c.pooler_hidden_act);
  c.pooler_dropout = json_number_field(j, "pooler_dropout", c.pooler_dropout, source);
  c.hidden_dropout_prob = json_number_field(j, "hidden_dropout_prob", c.hidden_dropout_prob, source);
  c.attention_probs_dropout_prob =
      json_number_field(j, "attention_probs_dropout_prob", c.attention_probs_dropout_prob, source);
  c.initializer_range = json_number_field(j, "initializer_range", c.initializer_range, source);
  c.torch_dtype = j.contains("torch_dtype") && j["torch_dtype"].is_string() ? j["torch_dtype"].get<std::string>() : "";

  // refused features
  const Index conv = json_index_field(j, "conv_kernel_size", 0, source);
  check(conv <= 0, source, ": conv_kernel_size: ", conv, " asks for the convolution block of DeBERTa-v2 xlarge / "
        "xxlarge, which is not supported (only conv_kernel_size 0)");
  for (const char* flag : {"talking_head", "talking_heads"})
    check(!detail::json_bool_field(j, flag, false, source), source, ": ", flag,
          ": talking-heads attention is not supported (expected false or absent)");
  if (j.contains("attention_head_size") && !j["attention_head_size"].is_null()) {
    const Index ahs = json_index_field(j, "attention_head_size", 0, source);
    const bool divides = c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads == 0;
    check(divides && ahs == c.hidden_size / c.num_attention_heads, source, ": attention_head_size: ", ahs,
          " is not supported (only hidden_size / num_attention_heads",
          divides ? ::dea::detail::concat(" = ", c.hidden_size / c.num_attention_heads) : std::string(), ")");
  }
  for (const char* flag : {"is_decoder", "add_cross_attention"})
    check(!detail::json_bool_field(j, flag, false, source), source, ": ", flag,
          ": expected false (DeBERTa as an encoder), got true");
  detail::parse_labels(j, c.id2label, source);
  c.validate(source);
  return c;
}

/// The configuration as a config.json object (model_type "deberta-v2"); parsing it gives `c` back.
inline nlohmann::json deberta_config_json(const DebertaConfig& c) {
  nlohmann::json j;
  j["model_type"] = "deberta-v2";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["intermediate_size"] = c.intermediate_size;
  j["hidden_act"] = to_string(c.hidden_act);
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["type_vocab_size"] = c.type_vocab_size;
  j["layer_norm_eps"] = c.layer_norm_eps;
  j["relative_attention"] = c.relative_attention;
  j["max_relative_positions"] = c.max_relative_positions;
  j["position_buckets"] = c.position_buckets;
  if (c.c2p || c.p2c)
    j["pos_att_type"] = c.pos_att_type_str();
  else
    j["pos_att_type"] = nullptr;
  j["share_att_key"] = c.share_att_key;
  j["norm_rel_ebd"] = c.norm_rel_ebd ? "layer_norm" : "none";
  j["position_biased_input"] = c.position_biased_input;
  j["embedding_size"] = c.embed_size();
  if (c.pad_token_id >= 0)
    j["pad_token_id"] = c.pad_token_id;
  else
    j["pad_token_id"] = nullptr;
  j["pooler_hidden_size"] = c.hidden_size;
  j["pooler_hidden_act"] = to_string(c.pooler_hidden_act);
  j["pooler_dropout"] = c.pooler_dropout;
  j["hidden_dropout_prob"] = c.hidden_dropout_prob;
  j["attention_probs_dropout_prob"] = c.attention_probs_dropout_prob;
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

/// Reads and parses the config.json at `path` (at most 1 MiB, JSON nested at most 64 levels).
inline DebertaConfig load_deberta_config(const std::string& path) {
  const std::string source = "config.json '" + path + "'";
  const std::string text = read_file(path, bert::kMaxConfigBytes);
  return parse_deberta_config(io::parse_json_limited(text, source), source);
}

}  // namespace deberta
}  // namespace dea
