// dea/deberta/hf_dir.hpp: loading a Hugging Face DeBERTa-v2/v3 directory (config.json with model_type
// "deberta-v2" + model.safetensors, as the hub ships them) into a DebertaV2Model or a
// DebertaV2ForSequenceClassification (docs/deberta.md, model directories).
//
// What the loader accepts, and what it does with it:
//   - dtypes F32, F16, BF16 (and F64), upcast exactly to the model's Scalar (io/safetensors.hpp);
//   - names: a task model's (deberta.embeddings..., pooler.*, classifier.*) or a bare base model's (embeddings...);
//     a base model takes either, stripping one leading "deberta.";
//   - extras, listed in the report and otherwise ignored: the *position_ids buffers, the position table of a model
//     without position_biased_input, heads the model does not use (lm_predictions.*, mask_predictions.*, cls.*, and
//     pooler.* / classifier.* for a base model).
// The directory is validated completely before the model is allocated (bert/hf_dir.hpp's match_checkpoint: every
// parameter present once, floating, of its exact shape, finite; a truncated file fails when it is read); every
// problem is a dea::Error naming the file and the tensor or field. A relative embedding table whose row count is not
// 2 S is reported against the configuration's position_buckets / max_relative_positions.
#pragma once

#include "../bert/hf_dir.hpp"
#include "../core/error.hpp"
#include "../io/safetensors.hpp"
#include "config.hpp"
#include "model.hpp"
#include "seq_cls.hpp"

#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace dea {
namespace deberta {

/// What a load found: tensors per dtype, ignored tensors, whether a "deberta." prefix was handled.
struct LoadReport : bert::HfLoadReport {
  /// One line: tensors and dtypes, the prefix, ignored tensors.
  std::string str() const {
    bert::HfLoadReport plain = *this;
    plain.stripped_prefix = false;
    std::string s = plain.str();
    if (stripped_prefix) {
      const std::size_t at = s.find(')');
      s.insert(at + 1, ", 'deberta.' prefix stripped");
    }
    return s;
  }
};

/// A DeBERTa directory, opened: its configuration parsed and its weights read and validated as a container.
struct DebertaDir {
  std::string dir, config_path, weights_path;
  DebertaConfig config;
  io::SafeTensors weights;
};

/// True when `dir/config.json` names model_type "deberta-v2" (false for any other content or a missing file;
/// callers that pick a loader by architecture use it, then load with the loader's full validation).
inline bool is_deberta_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p = fs::path(dir) / "config.json";
  if (!fs::is_regular_file(p, ec)) return false;
  try {
    const auto j = io::parse_json_limited(read_file(p.string(), bert::kMaxConfigBytes), p.string());
    return j.is_object() && j.contains("model_type") && j["model_type"] == "deberta-v2";
  } catch (const std::exception&) {
    return false;
  }
}

/// Opens `dir`: a directory with config.json (model_type "deberta-v2", every field validated) and model.safetensors
/// (header, offsets and sizes validated).
inline DebertaDir open_deberta_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string what = "DeBERTa model directory '" + dir + "'";
  check(fs::exists(dir, ec), what, " does not exist");
  check(fs::is_directory(dir, ec), "'", dir, "' is not a directory (a DeBERTa model directory holds config.json and "
        "model.safetensors)");
  DebertaDir d;
  d.dir = dir;
  d.config_path = (fs::path(dir) / "config.json").string();
  d.weights_path = (fs::path(dir) / "model.safetensors").string();
  check(fs::is_regular_file(d.config_path, ec), what, " has no config.json (expected '", d.config_path, "')");
  d.config = load_deberta_config(d.config_path);
  if (!fs::is_regular_file(d.weights_path, ec)) {
    const fs::path p(dir);
    check(!fs::exists(p / "model.safetensors.index.json", ec), what, ": sharded checkpoints "
          "(model.safetensors.index.json) are not supported; merge the shards into one model.safetensors");
    check(!fs::exists(p / "pytorch_model.bin", ec), what, " holds pytorch_model.bin but no model.safetensors; this "
          "loader reads safetensors only (convert the checkpoint with save_pretrained(..., safe_serialization=True))");
    ::dea::detail::raise(::dea::detail::concat(what, " has no model.safetensors (expected '", d.weights_path, "')"));
  }
  d.weights = io::SafeTensors::load(d.weights_path);
  return d;
}

namespace detail {

/// Refuses a relative table whose rows disagree with the configuration, naming the fields that size it.
inline void check_relative_table(const io::SafeTensors& st, const std::string& name, const DebertaConfig& cfg,
                                 const std::string& file) {
  if (!cfg.relative_attention || !st.has(name)) return;
  const Shape& sh = st.shape(name);
  const Index S = cfg.att_span();
  if (sh.size() == 2 && sh[0] != 2 * S)
    ::dea::detail::raise(::dea::detail::concat(
        file, ": tensor '", name, "' has ", sh[0], " rows but the configuration implies 2 S = ", 2 * S, " (",
        cfg.position_buckets > 0 ? ::dea::detail::concat("position_buckets = ", cfg.position_buckets)
                                 : ::dea::detail::concat("no buckets: the relative range ", cfg.relative_range()),
        "): the position buckets do not fit the relative embeddings"));
}

/// match_checkpoint with the expected names spelt as the file spells them (`file_prefix` + name), the map's keys
/// then turned back into the model's names.
inline bert::HfNameMap match_prefixed(const io::SafeTensors& st, std::vector<std::pair<std::string, Shape>> expected,
                                      const std::string& file_prefix, const std::string& file,
                                      const std::vector<std::string>& skip = {}) {
  if (file_prefix.empty()) return bert::match_checkpoint(st, expected, "", file, {}, skip);
  std::vector<std::pair<std::string, Shape>> renamed = expected;
  for (auto& e : renamed) e.first = file_prefix + e.first;
  bert::HfNameMap m = bert::match_checkpoint(st, renamed, "", file, {}, skip);
  bert::HfNameMap out = m;
  out.source.clear();
  for (const auto& [name, fname] : m.source) out.source[name.substr(file_prefix.size())] = fname;
  out.prefix_handled = true;
  return out;
}

inline void fill_report(LoadReport* r, const DebertaDir& d, const bert::HfNameMap& m) {
  if (!r) return;
  *r = LoadReport{};
  r->config_path = d.config_path;
  r->weights_path = d.weights_path;
  for (const auto& [name, fname] : m.source) ++r->dtypes[io::dtype_name(d.weights.dtype(fname))];
  r->stripped_prefix = m.prefix_handled;
  r->ignored = m.ignored;
  r->n_parameters = static_cast<Index>(m.source.size());
}

}  // namespace detail

/// The DebertaV2Model of an opened directory (names bare or with "deberta.").
template <class S>
DebertaV2Model<S> load_deberta_model(const DebertaDir& d, LoadReport* report = nullptr) {
  const std::string file = "model.safetensors '" + d.weights_path + "'";
  const bool prefixed = d.weights.has("deberta.embeddings.word_embeddings.weight");
  const std::string pre = prefixed ? "deberta." : "";
  detail::check_relative_table(d.weights, pre + "encoder.rel_embeddings.weight", d.config, file);
  const bert::HfNameMap m = detail::match_prefixed(d.weights, deberta_parameter_shapes(d.config), pre, file);
  DebertaV2Model<S> model(d.config);  // allocated only now
  bert::copy_matched(model.parameters(), d.weights, m);
  detail::fill_report(report, d, m);
  return model;
}

template <class S>
DebertaV2Model<S> load_deberta_model(const std::string& dir, LoadReport* report = nullptr) {
  return load_deberta_model<S>(open_deberta_dir(dir), report);
}

/// The DebertaV2ForSequenceClassification of an opened directory (num_labels = len(id2label) of its config.json).
template <class S>
DebertaV2ForSequenceClassification<S> load_deberta_for_sequence_classification(const DebertaDir& d,
                                                                               LoadReport* report = nullptr) {
  const std::string file = "model.safetensors '" + d.weights_path + "'";
  detail::check_relative_table(d.weights, "deberta.encoder.rel_embeddings.weight", d.config, file);
  const bert::HfNameMap m =
      bert::match_checkpoint(d.weights, deberta_seq_cls_parameter_shapes(d.config), "", file);
  DebertaV2ForSequenceClassification<S> model(d.config);
  bert::copy_matched(model.parameters(), d.weights, m);
  detail::fill_report(report, d, m);
  return model;
}

template <class S>
DebertaV2ForSequenceClassification<S> load_deberta_for_sequence_classification(const std::string& dir,
                                                                               LoadReport* report = nullptr) {
  return load_deberta_for_sequence_classification<S>(open_deberta_dir(dir), report);
}

}  // namespace deberta
}  // namespace dea
