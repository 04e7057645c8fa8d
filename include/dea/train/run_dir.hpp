// dea/train/run_dir.hpp: the run directory (out_dir): its files, the fresh-directory rule, atomic checkpoints and
// the training log.
//
//   checkpoint.safetensors  parameters under the reference's state_dict names (F32), the AdamW state under
//                           "optim." (exp_avg.<name>, exp_avg_sq.<name>, step.<group>), "train.step" (I64 []),
//                           "train.rng_state" (I64 [4], the xoshiro state of the next step's dropout Rng, a
//                           consistency check) and metadata {format, step, precision} (precision: the run's
//                           --precision, fp32 or bf16; a checkpoint without it was trained in fp32)
//   config.json             every flag of the run (train/config.hpp)
//   tokenizer.txt           the vocabulary (one token per line); a dea_bert run has instead:
//   vocab.txt               --model dea_bert: --hf_model's vocab.txt, copied byte for byte (the WordPiece vocabulary)
//   bert_config.json        --model dea_bert: --hf_model's config.json, copied byte for byte (the BERT's sizes)
//   train_log.jsonl         one JSON object per logged step and per evaluation
// Each file is written to a temporary file and renamed, so a crash never loses a checkpoint. A fresh run refuses
// a directory that holds another run's files unless told to overwrite it, and then deletes them first: a
// directory never mixes runs.
#pragma once

#include "../core/error.hpp"
#include "../core/files.hpp"
#include "../core/param.hpp"
#include "../core/parallel.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../io/json_limits.hpp"
#include "../io/safetensors.hpp"
#include "../optim/adamw.hpp"
#include "seeds.hpp"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace dea::train {

inline std::string checkpoint_path(const std::string& dir) { return (std::filesystem::path(dir) / "checkpoint.safetensors").string(); }
inline std::string config_path(const std::string& dir) { return (std::filesystem::path(dir) / "config.json").string(); }
inline std::string tokenizer_path(const std::string& dir) { return (std::filesystem::path(dir) / "tokenizer.txt").string(); }
inline std::string vocab_path(const std::string& dir) { return (std::filesystem::path(dir) / "vocab.txt").string(); }
inline std::string bert_config_path(const std::string& dir) {
  return (std::filesystem::path(dir) / "bert_config.json").string();
}
inline std::string log_path(const std::string& dir) { return (std::filesystem::path(dir) / "train_log.jsonl").string(); }

/// The files of a run in its out_dir that a fresh run would replace: checkpoint, config, tokenizer (vocab.txt and
/// bert_config.json of a dea_bert run), log, the evaluation results and the plots.
inline std::vector<std::filesystem::path> run_files(const std::string& out_dir) {
  std::vector<std::filesystem::path> found;
  std::error_code ec;
  for (const char* f : {"checkpoint.safetensors", "config.json", "tokenizer.txt", "vocab.txt", "bert_config.json",
                        "train_log.jsonl", "eval_train.json", "eval_val.json", "eval_test.json",
                        "training_curves.svg"}) {
    const std::filesystem::path p = std::filesystem::path(out_dir) / f;
    if (std::filesystem::exists(p, ec)) found.push_back(p);
  }
  // the α̂ histograms of train (alpha_hist_<split>_step<N>.svg) and eval (alpha_hist_<split>.svg)
  if (std::filesystem::is_directory(out_dir, ec))
    for (const auto& e : std::filesystem::directory_iterator(out_dir, ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("alpha_hist_", 0) == 0 && n.size() > 4 && n.compare(n.size() - 4, 4, ".svg") == 0)
        found.push_back(e.path());
    }
  return found;
}

/// Refuses (dea::Error naming the directory and a file) a fresh run into a directory holding another run's files,
/// unless `overwrite`.
inline void check_fresh_run_dir(const std::string& out_dir, bool overwrite) {
  const auto old = run_files(out_dir);
  check(old.empty() || overwrite, "--out_dir '", out_dir, "' already holds a run (",
        old.empty() ? std::string() : old.front().filename().string(),
        "): pass --resume to continue it, --overwrite to replace it with a new run, or another --out_dir");
}

/// Deletes the files of run_files(out_dir) (a fresh run given leave to overwrite, once its data and model exist).
inline void remove_run_files(const std::string& out_dir) {
  for (const auto& p : run_files(out_dir)) {
    std::error_code ec;
    std::filesystem::remove(p, ec);
    check(!ec, "--overwrite: cannot delete '", p.string(), "': ", ec.message());
  }
}

/// The Rng state stored in a checkpoint of step `step` (that of the next step's dropout Rng).
inline std::array<std::uint64_t, 4> checkpoint_rng_state(std::uint64_t seed, std::int64_t step) {
  return Rng(stream_seed(seed, kDropoutStream, static_cast<std::uint64_t>(step + 1))).state();
}

/// The product precision a checkpoint's metadata records (its "precision": "fp32" or "bf16"); a checkpoint without
/// it (written before mixed precision, or exported from the reference) was trained in fp32. Any other value is a
/// dea::Error naming `path`.
inline Precision checkpoint_precision(const io::SafeTensors& st, const std::string& path) {
  const auto it = st.metadata().find("precision");
  if (it == st.metadata().end() || it->second == "fp32") return Precision::fp32;
  check(it->second == "bf16", path, ": metadata 'precision' must be 'fp32' or 'bf16', got '", it->second, "'");
  return Precision::bf16;
}

/// Writes checkpoint.safetensors of `dir` (atomically): the parameters, the optimiser state (when given), the
/// step and the Rng state check of `seed`, then what `extra` adds (a model family's buffers), under the metadata
/// format `format` and the run's product precision `precision`.
template <class Model>
void save_checkpoint(const std::string& dir, Model& model, const optim::AdamW<typename Model::Scalar>* opt,
                     std::int64_t step, std::uint64_t seed,
                     const std::function<void(io::SafeTensors&)>& extra = nullptr,
                     const std::string& format = "dea-train-checkpoint", Precision precision = Precision::fp32) {
  std::filesystem::create_directories(dir);
  io::SafeTensors st(checkpoint_path(dir));
  io::put_parameters(st, model.parameters(), io::DType::F32);
  if (opt)
    for (const auto& kv : opt->state("optim.")) st.put("optim." + kv.first.substr(6), kv.second, io::DType::F32);
  st.put("train.step", Tensor<std::int64_t>(Shape{}, step), io::DType::I64);
  Tensor<std::int64_t> rs({4});
  const auto s = checkpoint_rng_state(seed, step);
  for (int i = 0; i < 4; ++i) std::memcpy(&rs[i], &s[static_cast<std::size_t>(i)], sizeof(std::uint64_t));
  st.put("train.rng_state", rs, io::DType::I64);
  if (extra) extra(st);
  st.set_metadata({{"format", format}, {"step", std::to_string(step)}, {"precision", precision_name(precision)}});
  st.save(checkpoint_path(dir));
}

namespace detail {
template <class M, class = void>
struct has_positional_table : std::false_type {};
template <class M>
struct has_positional_table<M, std::void_t<decltype(std::declval<M&>().positional().table())>> : std::true_type {};
}  // namespace detail

/// Loads checkpoint.safetensors of `dir` into `model` (and `opt` when given). Returns the step stored (0 for a
/// checkpoint exported from the reference, which has no "train.step"). Everything is validated first; any
/// problem is a dea::Error naming the file. `seed` (when given) is checked against the stored Rng state.
/// `extra_tensors`: names (prefixes) of the model's other tensors in the file, which the caller loads itself (the
/// TR-MoE route tables of an LM run). `precision` (when given: the run configuration's) must be the one the
/// checkpoint records (checkpoint_precision), else a dea::Error names both and the flag.
template <class Model>
std::int64_t load_checkpoint(const std::string& dir, Model& model, optim::AdamW<typename Model::Scalar>* opt,
                                    std::optional<std::uint64_t> seed = std::nullopt,
                                    const std::vector<std::string>& extra_tensors = {},
                                    std::optional<Precision> precision = std::nullopt) {
  using Scalar = typename Model::Scalar;
  const std::string path = checkpoint_path(dir);
  const io::SafeTensors st = io::SafeTensors::load(path);
  if (precision) {
    const Precision saved = checkpoint_precision(st, path);
    check(saved == *precision, path, ": the checkpoint was trained with --precision ", precision_name(saved),
          ", but the run's configuration says --precision ", precision_name(*precision),
          " (a run keeps the precision it started with)");
  }
  std::int64_t step = 0;
  if (st.has("train.step")) {
    const Tensor<std::int64_t> t = st.get<std::int64_t>("train.step");
    check(t.numel() == 1 && t[0] >= 0, path, ": 'train.step' must hold one non-negative value");
    step = t[0];
  }
  if (seed && st.has("train.rng_state")) {
    const Tensor<std::int64_t> t = st.get<std::int64_t>("train.rng_state");
    check(t.numel() == 4, path, ": 'train.rng_state' must hold 4 values");
    const auto want = checkpoint_rng_state(*seed, step);
    for (int i = 0; i < 4; ++i) {
      std::uint64_t u;
      std::memcpy(&u, &t[i], sizeof(u));
      check(u == want[static_cast<std::size_t>(i)], path, ": the stored Rng state does not match seed ", *seed,
            " at step ", step, " (checkpoint of another run?)");
    }
  }
  std::map<std::string, Tensor<Scalar>> ost;
  if (opt) {
    for (const std::string& name : st.names())
      if (name.compare(0, 6, "optim.") == 0) ost.emplace(name, st.get<Scalar>(name));
    check(!ost.empty() || step == 0, path, ": no optimiser state ('optim.*') to resume from");
  }
  // A state_dict exported from the reference also holds its positional table, a buffer [1, max_len, D] whose
  // name ends in "pe". When there is one it replaces ours (the reference's float32 sin/cos differ from ours by
  // an ulp in a few cells): its first max_len rows, so a longer table (the reference's default 512) fits.
  std::string pe_name;
  for (const std::string& name : st.names()) {
    if (name.compare(0, 6, "optim.") == 0 || name.compare(0, 6, "train.") == 0) continue;
    if (name == "pe" || (name.size() > 3 && name.compare(name.size() - 3, 3, ".pe") == 0)) {
      check(pe_name.empty(), path, ": two positional tables ('", pe_name, "' and '", name, "')");
      pe_name = name;
    }
  }
  Mat<Scalar> pe_table;
  if (!pe_name.empty()) {
    if constexpr (detail::has_positional_table<Model>::value) {
      const Shape shp = st.shape(pe_name);
      const Index L = model.positional().table().rows(), D = model.positional().table().cols();
      const bool ok = (shp.size() == 3 && shp[0] == 1 && shp[1] >= L && shp[2] == D) ||
                      (shp.size() == 2 && shp[0] >= L && shp[1] == D);
      check(ok, path, ": positional table '", pe_name, "': expected shape [1, >=", L, ", ", D, "] or [>=", L, ", ",
            D, "], got ", shape_str(shp));
      const Tensor<Scalar> t = st.get<Scalar>(pe_name);
      pe_table = Eigen::Map<const Mat<Scalar>>(t.ptr(), shp[shp.size() - 2], D).topRows(L);
    } else {
      ::dea::detail::raise(::dea::detail::concat(path, ": holds a positional table '", pe_name, "', the model has none"));
    }
  }
  // Parameters must be finite: NaN or Inf in a checkpoint would only turn every later result into NaN.
  for (const Param<Scalar>* p : model.parameters())
    if (st.has(p->name) && io::dtype_is_floating(st.dtype(p->name))) {
      const Tensor<Scalar> v = st.get<Scalar>(p->name);
      for (Index i = 0; i < v.numel(); ++i)
        check(std::isfinite(v[i]), path, ": parameter '", p->name, "' holds a non-finite value (", v[i],
              ") at flat index ", i);
    }
  check(pe_table.allFinite(), path, ": positional table '", pe_name, "' holds a non-finite value");
  // All or nothing: load_parameters and load_state each check everything before they change anything; when
  // the optimiser state is refused after the parameters were loaded, the parameters are put back.
  std::vector<std::string> ignore = {"optim.", "train.", "mlm_head.weight"};
  ignore.insert(ignore.end(), extra_tensors.begin(), extra_tensors.end());
  if (!pe_name.empty()) ignore.push_back(pe_name);
  std::vector<Vec<Scalar>> saved;
  for (const Param<Scalar>* p : model.parameters()) saved.push_back(p->value);
  io::load_parameters(model.parameters(), st, true, ignore);
  try {
    if (opt && !ost.empty()) opt->load_state(ost, "optim.");
  } catch (...) {
    const auto ps = model.parameters();
    for (std::size_t i = 0; i < ps.size(); ++i) ps[i]->value = std::move(saved[i]);
    throw;
  }
  if constexpr (detail::has_positional_table<Model>::value)
    if (!pe_name.empty()) model.positional().set_table(pe_table);
  return step;
}

/// train_log.jsonl of a run: one JSON object a line, flushed after each. A resumed run (step0 > 0) keeps the lines up
/// to its checkpoint's step and appends (a run killed after its last checkpoint logged steps that the resumed run
/// repeats; a line cut short by the kill is dropped), so every step is logged once.
class TrainLog {
public:
  TrainLog() = default;
  TrainLog(const std::string& dir, std::int64_t step0) : path_(log_path(dir)) {
    std::filesystem::create_directories(dir);
    if (step0 && std::filesystem::exists(path_)) {
      std::string kept;
      for (const std::string& line : split_lines(read_file(path_))) {
        if (io::detail::json_nesting_depth(line) > io::kMaxJsonDepth) continue;
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
            j["step"].get<std::int64_t>() <= step0)
          kept += line + "\n";
      }
      write_file_atomic(path_, kept);
    } else if (step0 > 0) {
      fmt::print(stderr, "warning: {} is missing; the resumed run's log starts at step {} (the earlier steps are not "
                 "in it)\n", path_, step0 + 1);
    }
    out_.open(path_, step0 ? std::ios::app : std::ios::trunc);
    check(static_cast<bool>(out_), "cannot open ", path_, " for writing");
  }
  bool is_open() const { return out_.is_open(); }
  const std::string& path() const { return path_; }
  /// Appends one line (no-op when not open). Non-finite numbers must be given as null (see json_number).
  void write(const nlohmann::json& j) {
    if (!out_.is_open()) return;
    out_ << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    out_.flush();
  }

private:
  std::string path_;
  std::ofstream out_;
};

/// x, or null when it is not finite (JSON has no NaN).
inline nlohmann::json json_number(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

}  // namespace dea::train
