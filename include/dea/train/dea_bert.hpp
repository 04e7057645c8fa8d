// dea/train/dea_bert.hpp: fine-tuning DualExpertBert (bert/dual_expert_bert.hpp) as the reference's
// `train.py --data_source hf` does: `dea train --model dea_bert --hf_model DIR`. Only the model-specific part lives
// here; the run itself (D_alpha data with its mock or cached oracle, batch order, isolation check, progress line,
// JSONL log, evaluation, plots, atomic checkpoints, bit-exact resume) is encoder.hpp's run_training_with, with the
// family below.
//
// A fresh run: fresh_config() turns the command line into the run's configuration (the encoder's own flags refused,
// the reference's hf defaults lr_main 2e-5, batch_size 32, max_len 64 for the flags not given, max_len checked
// against DIR's max_position_embeddings, the sizes recorded from DIR's config.json, the tokenizer the WordPiece of
// DIR/vocab.txt); load_pretrained() opens DIR and validates it completely (hf_dir.hpp); run_training() converts
// the BertModel (the adapters' and the head's fresh parameters drawn from Rng(seed)) and trains it.
//
// The run directory holds, besides the encoder's config.json, checkpoint.safetensors and train_log.jsonl:
//   bert_config.json   DIR's config.json, byte for byte
//   vocab.txt          DIR's vocab.txt, byte for byte (the run's tokenizer; there is no tokenizer.txt)
// so that --resume and dea eval rebuild the model and the tokenizer from the run directory alone: the pretrained
// weights are read only at step 0, and the checkpoint holds every parameter under the reference's names
// (bert.encoder.layer.i.attention.self.dea.W_q.weight, ..., cls_head.1.weight) and the AdamW state.
#pragma once

#include "../bert/config.hpp"
#include "../bert/dual_expert_bert.hpp"
#include "../bert/hf_dir.hpp"
#include "../bert/model.hpp"
#include "../core/error.hpp"
#include "../core/files.hpp"
#include "../io/json_limits.hpp"
#include "../text/vocab.hpp"
#include "config.hpp"
#include "encoder.hpp"
#include "run_dir.hpp"

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <utility>

namespace dea::train::dea_bert {

template <class S>
using Model = bert::DualExpertBert<S>;
template <class S>
using TrainOptions = encoder::BasicTrainOptions<bert::DualExpertBert<S>>;
template <class S>
using LoadedRun = encoder::BasicLoadedRun<bert::DualExpertBert<S>>;

/// The reference's fine-tuning defaults (train.py --data_source hf --batch_size 32 --lr_main 2e-5; max_len 64).
constexpr double kLrMain = 2e-5;
constexpr Index kBatchSize = 32;
constexpr Index kMaxLen = 64;

inline std::string hf_config_path(const std::string& dir) {
  return (std::filesystem::path(dir) / "config.json").string();
}
inline std::string hf_vocab_path(const std::string& dir) { return (std::filesystem::path(dir) / "vocab.txt").string(); }

/// The configuration of a fresh dea_bert run from a command line (`c` as parsed, `given` the flags on it), not yet
/// validated: --hf_model required, the encoder's flags refused (check_flag_scope), --data_source dalpha only, the
/// reference's hf defaults for lr_main, batch_size and max_len unless given, DIR's config.json read (max_len must
/// not exceed its max_position_embeddings) and vocab.txt present; the size fields record the BERT's (d_model =
/// hidden_size, n_heads, n_layers, d_ff = intermediate_size, dropout = hidden_dropout_prob), tokenizer = wordpiece,
/// vocab = DIR/vocab.txt. dea::Error naming the flag or the file; nothing is written.
inline TrainConfig fresh_config(TrainConfig c, const std::set<std::string>& given) {
  check(c.model == "dea_bert", "dea_bert::fresh_config: --model is '", c.model, "'");
  check(!c.hf_model.empty(), "--model dea_bert needs --hf_model DIR (a Hugging Face BERT model directory with "
        "config.json, model.safetensors and vocab.txt)");
  check_flag_scope(c, given);
  check(c.data_source == "dalpha", "--data_source ", c.data_source, ": --model dea_bert fine-tunes on D_alpha pairs "
        "only (--data_source dalpha)");
  if (!given.count("lr_main")) c.lr_main = kLrMain;
  if (!given.count("batch_size")) c.batch_size = kBatchSize;
  if (!given.count("max_len")) c.max_len = kMaxLen;
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string& dir = c.hf_model;
  check(fs::is_directory(dir, ec), "--hf_model '", dir, "': ",
        fs::exists(dir, ec) ? "not a directory" : "does not exist",
        " (a Hugging Face model directory holds config.json, model.safetensors and vocab.txt)");
  const std::string cfg_path = hf_config_path(dir), vocab = hf_vocab_path(dir);
  check(fs::is_regular_file(cfg_path, ec), "--hf_model '", dir, "' has no config.json (expected '", cfg_path, "')");
  check(fs::is_regular_file(vocab, ec), "--hf_model '", dir, "' has no vocab.txt (expected '", vocab,
        "'): --model dea_bert tokenises with the model's own WordPiece vocabulary");
  const bert::BertConfig bc = detail::with_context("--hf_model: ", [&] { return bert::load_bert_config(cfg_path); });
  check(c.max_len <= bc.max_position_embeddings, "--max_len ", c.max_len, " exceeds the max_position_embeddings (",
        bc.max_position_embeddings, ") of ", cfg_path, given.count("max_len") ? "" : " (--max_len defaults to 64)");
  c.tokenizer = "wordpiece";
  c.vocab = vocab;
  c.d_model = bc.hidden_size;
  c.n_heads = bc.num_attention_heads;
  c.n_layers = bc.num_hidden_layers;
  c.d_ff = bc.intermediate_size;
  c.dropout = bc.hidden_dropout_prob;
  return c;
}

/// The files a dea_bert run copies into its directory (bert_config.json, vocab.txt), as bytes, and the BERT
/// configuration they hold.
struct BertFiles {
  std::string config_json, vocab_txt;
  bert::BertConfig config;
};

/// Reads `config_file` and `vocab_file` (dea::Error naming the file on a missing or malformed one).
inline BertFiles read_bert_files(const std::string& config_file, const std::string& vocab_file) {
  BertFiles f;
  f.config_json = read_file(config_file, bert::kMaxConfigBytes);
  const std::string source = "config.json '" + config_file + "'";
  f.config = bert::parse_bert_config(io::parse_json_limited(f.config_json, source), source);
  f.vocab_txt = read_file(vocab_file, text::Vocab::kMaxFileBytes);
  return f;
}

/// The BERT files of the run directory `dir` (bert_config.json, vocab.txt).
inline BertFiles read_run_files(const std::string& dir) {
  return read_bert_files(bert_config_path(dir), vocab_path(dir));
}

/// The pretrained model of a fresh run: the Hugging Face directory opened and validated completely (hf_dir.hpp),
/// before anything is written.
template <class S>
struct Pretrained {
  BertFiles files;
  std::shared_ptr<std::optional<bert::BertModel<S>>> model;  ///< taken by the run's model (then empty)
  bert::HfLoadReport report;
};

/// Opens and loads the Hugging Face directory `dir` (config.json, model.safetensors, vocab.txt).
template <class S>
Pretrained<S> load_pretrained(const std::string& dir) {
  Pretrained<S> p;
  p.files = read_bert_files(hf_config_path(dir), hf_vocab_path(dir));
  p.model = std::make_shared<std::optional<bert::BertModel<S>>>(bert::load_bert_model<S>(dir, &p.report));
  return p;
}

/// A vocabulary the embeddings can hold: every id of `tok` below the configuration's vocab_size.
inline void check_vocab(const data::RunTokenizer& tok, const bert::BertConfig& cfg, const std::string& where) {
  check(tok.vocab_size() <= cfg.vocab_size, where, ": the vocabulary has ", tok.vocab_size(),
        " tokens, more than the model's vocab_size ", cfg.vocab_size, " (the ids beyond it have no embedding row)");
}

/// DualExpertBert's family (encoder::ModelFamily): a fresh run converts `pretrained` (taken from it; the fresh
/// parameters from Rng(seed)); otherwise the model is built from files.config and its checkpoint loaded into it.
/// `training` selects the tiled kernel (the evaluation forwards run the reference kernel either way). Its files are
/// bert_config.json and vocab.txt.
template <class S>
encoder::ModelFamily<bert::DualExpertBert<S>> family(const TrainConfig& cfg, BertFiles files,
                                                     std::shared_ptr<std::optional<bert::BertModel<S>>> pretrained,
                                                     bool training) {
  using M = bert::DualExpertBert<S>;
  encoder::ModelFamily<M> f;
  f.name = "DualExpertBert";
  auto shared = std::make_shared<const BertFiles>(std::move(files));
  f.build = [seed = cfg.seed, shared, pretrained, training](const encoder::RunData& d) {
    check_vocab(d.tok, shared->config, "--model dea_bert");
    bert::DualExpertBertOptions opt;
    opt.kernel = training ? DeaKernel::tiled : DeaKernel::reference;
    Rng rng(seed);
    if (pretrained && pretrained->has_value()) {
      auto m = std::make_unique<M>(std::move(**pretrained), rng, opt);
      pretrained->reset();
      return m;
    }
    return std::make_unique<M>(shared->config, rng, opt);
  };
  f.write_files = [shared](const std::string& dir, const encoder::RunData&) {
    write_file_atomic(vocab_path(dir), shared->vocab_txt);
    write_file_atomic(bert_config_path(dir), shared->config_json);
  };
  return f;
}

/// The reference's DualExpertBert fine-tuning run (encoder::run_training_with). A fresh run takes `pretrained`
/// (load_pretrained of cfg.hf_model; loaded here when null); a resumed one rebuilds the model from cfg.out_dir.
template <class S>
encoder::TrainResult run_training(const ValidConfig& vcfg, const TrainOptions<S>& o = {},
                                  Pretrained<S>* pretrained = nullptr) {
  check(vcfg->model == "dea_bert", "dea_bert::run_training: the configuration's --model is '", vcfg->model, "'");
  if (vcfg->resume)
    return encoder::run_training_with(vcfg, o, family<S>(vcfg, read_run_files(vcfg->out_dir), nullptr, true));
  std::optional<Pretrained<S>> own;
  if (!pretrained) pretrained = &own.emplace(load_pretrained<S>(vcfg->hf_model));
  return encoder::run_training_with(vcfg, o, family<S>(vcfg, pretrained->files, pretrained->model, true));
}

/// Loads the dea_bert run in `dir` (config.json, bert_config.json, vocab.txt, the data rebuilt, the checkpoint; see
/// encoder::load_run for what is refused).
template <class S>
LoadedRun<S> load_run(const std::string& dir) {
  return encoder::load_run_with<bert::DualExpertBert<S>>(dir, [&dir](const ValidConfig& c) {
    check(c->model == "dea_bert", config_path(dir), ": the run is a --model ", c->model, " run, not a dea_bert one");
    return family<S>(c, read_run_files(dir), nullptr, false);
  });
}

/// eval.py on the dea_bert run in `dir`: `split` at gamma = 0 (all batches); `after` sees the model and the run.
/// With `comm`, every rank loads the run and evaluates its share of the batches, and `after` runs on rank 0 alone
/// (encoder::evaluate_checkpoint).
template <class S>
encoder::EvalResult evaluate_checkpoint(
    const std::string& dir, encoder::Split split,
    const std::function<void(bert::DualExpertBert<S>&, const LoadedRun<S>&)>& after = {},
    dist::Comm* comm = nullptr) {
  LoadedRun<S> run = encoder::load_on_every_rank<LoadedRun<S>>(comm, [&] { return load_run<S>(dir); });
  encoder::EvalResult r = encoder::evaluate_run(run, split, comm);
  if (after && (!comm || comm->rank() == 0)) after(*run.model, run);
  return r;
}

}  // namespace dea::train::dea_bert
