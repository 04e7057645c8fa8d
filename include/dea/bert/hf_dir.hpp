// dea/bert/hf_dir.hpp: loading a Hugging Face model directory (config.json + model.safetensors, as the hub ships
// them) into a BertModel or a BertForSequenceClassification (docs/bert.md, model directories).
//
// What a hub checkpoint may hold, and what the loader does with it:
//   - dtypes F32, F16 and BF16 (and F64): upcast exactly to the model's Scalar (io/safetensors.hpp: BF16 = bits << 16,
//     F16 with subnormals; F64 into a float model rounds to nearest);
//   - names: bare (BertModel.save_pretrained: "embeddings.…") or with one leading "bert." (task models and
//     BertForPreTraining). A BertModel strips one leading "bert."; a task model takes "bert.X" or the bare "X" for its
//     base. The legacy LayerNorm names "LayerNorm.gamma" / "LayerNorm.beta" (old TF conversions) stand for
//     "LayerNorm.weight" / "LayerNorm.bias";
//   - extras: the buffer embeddings.position_ids, the pre-training heads cls.* (cls.predictions.decoder.weight tied to
//     the word embeddings or absent), a classifier when a BertModel is loaded, anything else: ignored and listed in
//     the HfLoadReport.
// The directory is validated completely before the model is allocated: config.json (every field, config.hpp), the
// safetensors container (header, offsets, truncation), then every parameter the configuration implies: present
// exactly once, of a floating dtype, of exactly the shape the configuration gives it, and finite. Every mismatch
// is a dea::Error naming the file, the tensor and the expected and found shape or dtype; a missing config.json or
// model.safetensors, a directory that is not one, a sharded or PyTorch-pickle checkpoint are clear errors too.
//
//   dea::bert::HfLoadReport rep;
//   auto model = dea::bert::load_bert_model<float>("models/all-MiniLM-L6-v2", &rep);
//   // rep.str(): ".../model.safetensors: 103 tensors (F32), ignored 1: embeddings.position_ids"
#pragma once

#include "../core/error.hpp"
#include "../core/param.hpp"
#include "../core/rng.hpp"
#include "../io/safetensors.hpp"
#include "config.hpp"
#include "model.hpp"
#include "seq_cls.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace dea {
namespace bert {

/// What a load found in the directory.
struct HfLoadReport {
  std::string config_path, weights_path;
  std::map<std::string, Index> dtypes;   ///< dtype name -> number of parameter tensors stored in it
  bool stripped_prefix = false;          ///< a leading "bert." was removed (BertModel) or bare names were taken
  Index legacy_names = 0;                ///< LayerNorm.gamma / .beta tensors mapped to .weight / .bias
  std::vector<std::string> ignored;      ///< file tensors no parameter uses (position_ids, cls.*, ...)
  std::vector<std::string> fresh;        ///< parameters initialised fresh instead of loaded (HfLoadOptions)
  Index n_parameters = 0;                ///< parameter tensors loaded

  /// One line: tensors and dtypes, name variants, ignored and fresh tensors.
  std::string str() const {
    std::string s = weights_path + ": " + std::to_string(n_parameters) + " tensors (";
    bool first = true;
    for (const auto& [d, n] : dtypes) {
      s += (first ? "" : ", ") + d + (dtypes.size() > 1 ? " " + std::to_string(n) : "");
      first = false;
    }
    s += ")";
    if (stripped_prefix) s += ", 'bert.' prefix handled";
    if (legacy_names > 0) s += ", " + std::to_string(legacy_names) + " legacy LayerNorm gamma/beta names";
    if (!ignored.empty()) {
      s += ", ignored " + std::to_string(ignored.size()) + ":";
      for (std::size_t i = 0; i < ignored.size() && i < 8; ++i) s += " " + ignored[i];
      if (ignored.size() > 8) s += " ...";
    }
    if (!fresh.empty()) {
      s += ", initialised fresh:";
      for (const std::string& f : fresh) s += " " + f;
    }
    return s;
  }
};

/// Options of the task-model loaders.
struct HfLoadOptions {
  /// A checkpoint without the task head (e.g. bert-base-uncased loaded for fine-tuning) gets a fresh head
  /// (N(0, initializer_range^2), bias 0, from an Rng seeded with head_seed) instead of an error; listed in
  /// HfLoadReport::fresh.
  bool init_missing_head = false;
  std::uint64_t head_seed = 0;
};

/// How a file's tensors map onto a model's parameters (match_checkpoint).
struct HfNameMap {
  std::map<std::string, std::string> source;  ///< parameter name -> file tensor name
  std::vector<std::string> ignored;           ///< file tensors no parameter uses
  std::vector<std::string> missing_optional;  ///< optional parameters the file does not hold
  bool prefix_handled = false;
  Index legacy_names = 0;
};

namespace detail {

inline bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
inline bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

/// The parameter name a file tensor stands for: one leading "bert." stripped (base model) or added to a bare base
/// name (task model, base_prefix "bert."), LayerNorm.gamma / .beta renamed.
inline std::string canonical_tensor_name(const std::string& file_name, const std::string& base_prefix,
                                         bool& prefix_handled, bool& legacy) {
  std::string n = file_name;
  legacy = false;
  for (const auto& [old_suffix, new_suffix] :
       {std::pair<const char*, const char*>{"LayerNorm.gamma", "LayerNorm.weight"}, {"LayerNorm.beta", "LayerNorm.bias"}})
    if (ends_with(n, old_suffix)) {
      n = n.substr(0, n.size() - std::char_traits<char>::length(old_suffix)) + new_suffix;
      legacy = true;
    }
  prefix_handled = false;
  if (base_prefix.empty()) {
    if (starts_with(n, "bert.")) {
      n = n.substr(5);
      prefix_handled = true;
    }
  } else if (!starts_with(n, base_prefix)) {
    for (const char* root : {"embeddings.", "encoder.", "pooler."})
      if (starts_with(n, root)) {
        n = base_prefix + n;
        prefix_handled = true;
        break;
      }
  }
  return n;
}

template <class... Args>
[[noreturn]] void hf_fail(const std::string& file, const Args&... args) {
  ::dea::detail::raise(::dea::detail::concat(file, ": ", args...));
}

}  // namespace detail

/// Matches the tensors of `st` against the parameters `expected` (name, shape) of a model whose base names carry
/// `base_prefix` ("" for BertModel, "bert." for a task model), and validates every match: present once, a floating
/// dtype, exactly the expected shape, finite values. Names in `optional` may be absent. Names starting with one of
/// `skip_prefixes` are neither matched nor listed (the in./out./grad. tensors of a golden case). `file` names the
/// file in messages. Throws dea::Error on the first problem: a doubled tensor, then a wrong dtype or shape (in
/// parameter order), then the missing tensors (all listed), then a non-finite value.
inline HfNameMap match_checkpoint(const io::SafeTensors& st, const std::vector<std::pair<std::string, Shape>>& expected,
                                  const std::string& base_prefix, const std::string& file,
                                  const std::vector<std::string>& optional = {},
                                  const std::vector<std::string>& skip_prefixes = {}) {
  std::map<std::string, const Shape*> want;
  for (const auto& [name, shape] : expected) want[name] = &shape;
  HfNameMap m;
  for (const std::string& fname : st.names()) {
    bool skip = false;
    for (const std::string& p : skip_prefixes) skip = skip || detail::starts_with(fname, p);
    if (skip) continue;
    bool pre = false, legacy = false;
    const std::string canon = detail::canonical_tensor_name(fname, base_prefix, pre, legacy);
    if (!want.count(canon)) {
      m.ignored.push_back(fname);
      continue;
    }
    const auto it = m.source.find(canon);
    if (it != m.source.end())
      detail::hf_fail(file, "tensors '", it->second, "' and '", fname, "' both stand for parameter '", canon, "'");
    m.source[canon] = fname;
    m.prefix_handled = m.prefix_handled || pre;
    m.legacy_names += legacy ? 1 : 0;
  }
  Index largest = 0;
  for (const auto& [name, shape] : expected) {
    const auto it = m.source.find(name);
    if (it == m.source.end()) continue;
    const std::string& fname = it->second;
    const std::string what = fname == name ? "tensor '" + fname + "'" : "tensor '" + fname + "' (parameter '" + name + "')";
    const io::DType d = st.dtype(fname);
    if (!io::dtype_is_floating(d))
      detail::hf_fail(file, what, ": expected a floating-point dtype (F32, F16, BF16 or F64), found ", io::dtype_name(d));
    if (st.shape(fname) != shape)
      detail::hf_fail(file, what, ": expected shape ", shape_str(shape), ", found ", shape_str(st.shape(fname)));
    largest = std::max(largest, st.numel(fname));
  }
  std::vector<std::string> missing;
  for (const auto& [name, shape] : expected) {
    if (m.source.count(name)) continue;
    if (std::find(optional.begin(), optional.end(), name) != optional.end()) {
      m.missing_optional.push_back(name);
      continue;
    }
    missing.push_back("'" + name + "' " + shape_str(shape));
  }
  if (!missing.empty()) {
    std::string list;
    for (std::size_t i = 0; i < missing.size() && i < 12; ++i) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 12) list += ::dea::detail::concat(" and ", missing.size() - 12, " more");
    detail::hf_fail(file, missing.size(), " required tensor(s) missing: ", list);
  }
  std::vector<double> scratch(static_cast<std::size_t>(largest));
  for (const auto& [name, fname] : m.source) {
    const Index n = st.numel(fname);
    st.get_into<double>(fname, scratch.data(), n);
    for (Index k = 0; k < n; ++k)
      if (!std::isfinite(scratch[static_cast<std::size_t>(k)]))
        detail::hf_fail(file, "tensor '", fname, "': non-finite value ", scratch[static_cast<std::size_t>(k)],
                        " at flat index ", k);
  }
  return m;
}

/// Copies every matched tensor into its parameter (the map comes from match_checkpoint on the same file and
/// shapes); parameters the map does not cover are left as they are.
template <class S>
void copy_matched(const ParamList<S>& params, const io::SafeTensors& st, const HfNameMap& m) {
  for (Param<S>* p : params) {
    const auto it = m.source.find(p->name);
    if (it == m.source.end()) continue;
    check(st.shape(it->second) == p->shape, st.source(), ": internal: tensor '", it->second, "' changed shape");
    st.get_into<S>(it->second, p->value.data(), p->numel());
  }
}

/// A Hugging Face model directory, opened: its configuration parsed and its weights file read and validated as a
/// safetensors container (no model built yet).
struct HfModelDir {
  std::string dir, config_path, weights_path;
  BertConfig config;
  io::SafeTensors weights;
};

/// Opens `dir`: checks that it is a directory holding config.json and model.safetensors, parses the configuration
/// and reads the weights file (header, offsets and sizes validated; a truncated file is an error).
inline HfModelDir open_hf_model_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string what = "Hugging Face model directory '" + dir + "'";
  check(fs::exists(dir, ec), what, " does not exist");
  check(fs::is_directory(dir, ec), "'", dir, "' is not a directory (a Hugging Face model directory holds config.json "
        "and model.safetensors)");
  HfModelDir d;
  d.dir = dir;
  d.config_path = (fs::path(dir) / "config.json").string();
  d.weights_path = (fs::path(dir) / "model.safetensors").string();
  check(fs::is_regular_file(d.config_path, ec), what, " has no config.json (expected '", d.config_path, "')");
  d.config = load_bert_config(d.config_path);
  if (!fs::is_regular_file(d.weights_path, ec)) {
    const fs::path p(dir);
    using ::dea::detail::concat;
    using ::dea::detail::raise;
    if (fs::exists(p / "model.safetensors.index.json", ec))
      raise(concat(what, ": sharded checkpoints (model.safetensors.index.json) are not supported; merge the shards "
                   "into one model.safetensors"));
    if (fs::exists(p / "pytorch_model.bin", ec))
      raise(concat(what, " holds pytorch_model.bin but no model.safetensors; this loader reads safetensors only "
                   "(convert the checkpoint, e.g. with save_pretrained(..., safe_serialization=True))"));
    raise(concat(what, " has no model.safetensors (expected '", d.weights_path, "')"));
  }
  d.weights = io::SafeTensors::load(d.weights_path);
  return d;
}

namespace detail {

inline void fill_report(HfLoadReport* r, const HfModelDir& d, const HfNameMap& m) {
  if (!r) return;
  *r = HfLoadReport{};
  r->config_path = d.config_path;
  r->weights_path = d.weights_path;
  for (const auto& [name, fname] : m.source) ++r->dtypes[io::dtype_name(d.weights.dtype(fname))];
  r->stripped_prefix = m.prefix_handled;
  r->legacy_names = m.legacy_names;
  r->ignored = m.ignored;
  r->n_parameters = static_cast<Index>(m.source.size());
}

}  // namespace detail

/// The BertModel of an opened directory (validated completely first; see the file comment).
template <class S>
BertModel<S> load_bert_model(const HfModelDir& d, HfLoadReport* report = nullptr) {
  const std::string file = "model.safetensors '" + d.weights_path + "'";
  const HfNameMap m = match_checkpoint(d.weights, bert_parameter_shapes(d.config), "", file);
  BertModel<S> model(d.config);  // allocated only now
  copy_matched(model.parameters(), d.weights, m);
  detail::fill_report(report, d, m);
  return model;
}

/// The BertModel of the Hugging Face model directory `dir`.
template <class S>
BertModel<S> load_bert_model(const std::string& dir, HfLoadReport* report = nullptr) {
  return load_bert_model<S>(open_hf_model_dir(dir), report);
}

/// The parameter names and shapes of a BertForSequenceClassification built from `cfg`, in state_dict order.
inline std::vector<std::pair<std::string, Shape>> seq_cls_parameter_shapes(const BertConfig& cfg) {
  auto out = bert_parameter_shapes(cfg);
  for (auto& e : out) e.first = "bert." + e.first;
  out.push_back({"classifier.weight", {cfg.num_labels(), cfg.hidden_size}});
  out.push_back({"classifier.bias", {cfg.num_labels()}});
  return out;
}

/// The BertForSequenceClassification of an opened directory (num_labels = len(id2label) of its config.json).
template <class S>
BertForSequenceClassification<S> load_bert_for_sequence_classification(const HfModelDir& d,
                                                                       HfLoadReport* report = nullptr,
                                                                       const HfLoadOptions& opt = {}) {
  const std::string file = "model.safetensors '" + d.weights_path + "'";
  std::vector<std::string> optional;
  if (opt.init_missing_head) optional = {"classifier.weight", "classifier.bias"};
  const HfNameMap m = match_checkpoint(d.weights, seq_cls_parameter_shapes(d.config), "bert.", file, optional);
  check(m.missing_optional.empty() || m.missing_optional.size() == 2, file, ": the classifier is half there (",
        m.missing_optional.empty() ? std::string() : m.missing_optional.front(), " is missing)");
  BertForSequenceClassification<S> model(d.config);
  copy_matched(model.parameters(), d.weights, m);
  detail::fill_report(report, d, m);
  if (!m.missing_optional.empty()) {
    Rng rng(opt.head_seed);
    detail::hf_init_linear(model.classifier(), rng, d.config.initializer_range);
    if (report) report->fresh = m.missing_optional;
  }
  return model;
}

/// The BertForSequenceClassification of the Hugging Face model directory `dir`.
template <class S>
BertForSequenceClassification<S> load_bert_for_sequence_classification(const std::string& dir,
                                                                       HfLoadReport* report = nullptr,
                                                                       const HfLoadOptions& opt = {}) {
  return load_bert_for_sequence_classification<S>(open_hf_model_dir(dir), report, opt);
}

}  // namespace bert
}  // namespace dea
