// dea/train/encoder.hpp: training the Dual-Expert encoder (nn::TransformerModel) as the reference's train.py and
// eval.py do: the model's and the optimiser's configuration, the evaluation loop, and run_training(), which wires
// the generic Trainer to the run's data (train/encoder_data.hpp: D_alpha or a text corpus, its tokenizer, its
// fingerprint and batch order), the run directory, the log, the progress line and the plots.
//
// Other models: the run is generic over the model (run_training_with, load_run_with); a ModelFamily says what is
// model-specific (building the model, the run directory's tokenizer and model files). The encoder's family is
// encoder_family(); DualExpertBert's fine-tuning (--model dea_bert) is train/dea_bert.hpp.
//
// run_training() records the data's fingerprint as config.json's data_hash, and a configuration that holds one is
// refused when its files now give other data, so eval and --resume never use other data.
//
// Determinism and resuming: see train/seeds.hpp. The model's initial weights come from Rng(seed); the training
// order is epoch-wise: epoch e = (step-1) / n_batches is a permutation of the training split drawn from
// Rng(stream_seed(seed, kOrderStream, e)), batch k = (step-1) % n_batches of it is the step's batch. A run resumed
// from the checkpoint of step k (parameters, AdamW moments and step counts, all stored exactly) continues bit for
// bit as the uninterrupted run.
#pragma once

#include "../core/error.hpp"
#include "../core/files.hpp"
#include "../core/parallel.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../data/collate.hpp"
#include "../data/dalpha.hpp"
#include "../data/loaders.hpp"
#include "../data/mlm.hpp"
#include "../text/run_tokenizer.hpp"
#include "../text/simple_tokenizer.hpp"
#include "../dist/comm.hpp"
#include "../dist/pieces.hpp"
#include "../dist/reducer.hpp"
#include "../eval/metrics.hpp"
#include "../io/jsonl.hpp"
#include "../nn/transformer.hpp"
#include "../optim/adamw.hpp"
#include "../optim/schedule.hpp"
#include "../plot/figures.hpp"
#include "config.hpp"
#include "dual_expert_family.hpp"
#include "encoder_data.hpp"
#include "run_dir.hpp"
#include "seeds.hpp"
#include "trainer.hpp"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace dea::train::encoder {

using ::dea::train::detail::with_context;

/// The model of a configuration over a vocabulary of `vocab_size` tokens whose padding token is `pad_id` (the
/// tokenizer's: RunTokenizer::pad_id).
inline nn::ModelConfig model_config(const TrainConfig& c, Index vocab_size, nn::Task task,
                                    std::int64_t pad_id = data::SimpleTokenizer::pad_id) {
  nn::ModelConfig m;
  m.vocab_size = vocab_size;
  m.d_model = c.d_model;
  m.n_heads = c.n_heads;
  m.n_layers = c.n_layers;
  m.d_ff = c.d_ff;
  m.max_len = c.max_len;
  m.dropout = c.dropout;
  m.n_classes = 2;
  m.pad_id = pad_id;
  m.task = task;
  m.supervise_layers = c.supervise_layers;
  return m;
}

/// The attention options of the models train() builds: the model's dropout, and the Dual-Expert kernel. The tiled
/// kernel (the default) keeps O(T) per layer in a training step instead of every [B, H, T, T] map; the model's
/// evaluation-mode forwards still run the reference kernel and keep the maps (TransformerModel::set_map_policy).
/// Both kernels give the same results to round-off and draw the same dropout masks.
template <class S>
typename nn::TransformerModel<S>::AttentionOptionsFn attention_options(const TrainConfig& c,
                                                                    DeaKernel kernel = DeaKernel::tiled) {
  return [dropout = c.dropout, n_layers = c.n_layers, kernel](Index layer) {
    auto o = nn::default_attention_options<DualExpertAttention<S>>(dropout, layer, n_layers);
    o.kernel = kernel;
    return o;
  };
}

// ------------------------------------------------------------------------------------------------------------
// Evaluation
// ------------------------------------------------------------------------------------------------------------

struct EvalResult {
  std::string split;
  std::size_t n_batches = 0;
  std::size_t n_examples = 0;
  double accuracy = 0;
  double task_loss = 0;
  eval::AlphaMetrics alpha;
  double decision_side_acc = eval::kNaN;
  std::size_t n_decision_pairs = 0;
  /// The pooled labelled cells of the last layer (alpha-hat, oracle), in batch order, for the histogram plots.
  std::vector<double> alpha_hat_points, alpha_oracle_points;
};

inline nlohmann::json to_json(const EvalResult& r) {
  auto num = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); };
  nlohmann::json j;
  j["split"] = r.split;
  j["n_batches"] = r.n_batches;
  j["n_examples"] = r.n_examples;
  j["accuracy"] = num(r.accuracy);
  j["task_loss"] = num(r.task_loss);
  j["alpha_mae"] = num(r.alpha.mae);
  j["alpha_pearson"] = num(r.alpha.pearson);
  j["alpha_spearman"] = num(r.alpha.spearman);
  j["band_agreement"] = num(r.alpha.band_agreement);
  j["alpha_hat_mean"] = num(r.alpha.alpha_hat_mean);
  j["alpha_oracle_mean"] = num(r.alpha.alpha_oracle_mean);
  j["alpha_n_points"] = r.alpha.n_points;
  j["decision_side_acc"] = num(r.decision_side_acc);
  j["n_decision_pairs"] = r.n_decision_pairs;
  return j;
}

/// Appends the labelled cells (oracle not NaN, key real) of the last layer's alpha-hat in a forward cache.
template <class Model>
void collect_last_layer(const typename Model::Cache& c, const nn::ModelBatch<typename Model::Scalar>& b,
                        std::vector<double>& ah, std::vector<double>& ao) {
  using Scalar = typename Model::Scalar;
  if (c.layers.empty() || b.alpha_oracle.dim() == 0) return;
  const auto& a = c.layers.back().attn;
  const Index H = a.alpha_hat.size() / std::max<Index>(1, c.B * c.T * c.T);
  Tensor<Scalar> t({c.B, H, c.T, c.T});
  check(static_cast<Index>(a.alpha_hat.size()) == t.numel(), "collect_last_layer: alpha-hat size mismatch");
  std::copy(a.alpha_hat.begin(), a.alpha_hat.end(), t.data.data());
  eval::collect_labelled_cells(t, b.alpha_oracle, b.attention_mask.dim() ? &b.attention_mask : nullptr, ah, ao);
}

/// Arg-max predictions of logits rows.
template <class Scalar>
std::vector<std::int64_t> predictions(const Mat<Scalar>& logits) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(logits.rows()));
  for (Index r = 0; r < logits.rows(); ++r) {
    Index k = 0;
    logits.row(r).maxCoeff(&k);
    p[static_cast<std::size_t>(r)] = k;
  }
  return p;
}

/// eval.py's evaluate: eval mode, gamma = 0, batches in order (at most max_batches, 0 = all). The alpha metrics
/// pool the last layer's labelled cells. The MLM masking of batch k is drawn from stream kEvalMaskStream.
///
/// Shared by the ranks of `comm` (nullptr: this process alone; every rank calls it): the batches are the pieces
/// (dist/pieces.hpp), each rank evaluates its share, and each batch's sums (its mean task loss, correct and counted
/// labels, decision-side accuracy and pairs, labelled cells) are folded in batch order on every rank, the
/// operations one process does: the same bits for any rank count. A failure on one rank stops every rank.
template <class Model>
EvalResult evaluate(Model& model, const RunData& d, Split s, Index batch_size, Index max_len, std::uint64_t seed,
                    std::size_t max_batches = 0, dist::Comm* comm = nullptr) {
  using Scalar = typename Model::Scalar;
  EvalResult r;
  r.split = split_name(s);
  const std::size_t n = d.size(s);
  if (n == 0) return r;
  auto batches = data::make_batches(n, static_cast<std::size_t>(batch_size), false);
  if (max_batches && batches.size() > max_batches) batches.resize(max_batches);
  typename Model::Cache cache;
  dist::SingleProcessComm single;
  const std::vector<std::string> pieces =
      dist::gather_pieces(comm ? *comm : single, batches.size(), [&](std::size_t k) {
        Rng mrng(stream_seed(seed, kEvalMaskStream, k));
        const nn::ModelBatch<Scalar> b = make_batch<Scalar>(d, s, batches[k], max_len, &mrng);
        const auto out = model.forward(b, Scalar(0), false, nullptr, cache);
        eval::AccuracyCounter acc;
        const std::vector<std::int64_t> lab(b.labels.ptr(), b.labels.ptr() + b.labels.numel());
        acc.add(predictions(out.logits), lab);
        double side_acc = 0;
        std::size_t side_pairs = 0;
        if (!out.layer_stats.empty() && out.layer_supervised.back()) {
          side_acc = out.layer_stats.back().decision_side_acc;
          side_pairs = static_cast<std::size_t>(out.layer_stats.back().n_decision_pairs);
        }
        std::vector<double> ah, ao;
        collect_last_layer<Model>(cache, b, ah, ao);
        dist::PieceWriter w;
        w.f64(static_cast<double>(out.task_loss)).u64(acc.correct).u64(acc.total).f64(side_acc).u64(side_pairs);
        w.f64s(ah).f64s(ao);
        return w.take();
      });
  eval::AccuracyCounter acc;
  eval::DecisionSideAccumulator side;
  std::vector<double> ah, ao;
  double loss_sum = 0;
  for (std::size_t k = 0; k < pieces.size(); ++k) {  // in batch order
    dist::PieceReader rd(pieces[k]);
    loss_sum += rd.f64();
    acc.correct += static_cast<std::size_t>(rd.u64());
    acc.total += static_cast<std::size_t>(rd.u64());
    const double side_acc = rd.f64();
    side.add(side_acc, static_cast<std::size_t>(rd.u64()));
    const std::vector<double> h = rd.f64s(), o = rd.f64s();
    ah.insert(ah.end(), h.begin(), h.end());
    ao.insert(ao.end(), o.begin(), o.end());
    r.n_examples += batches[k].size();
  }
  r.n_batches = batches.size();
  r.accuracy = acc.value();
  r.task_loss = loss_sum / static_cast<double>(batches.size());
  r.alpha = eval::alpha_metrics(ah, ao);
  r.decision_side_acc = side.value();
  r.n_decision_pairs = side.n_pairs;
  r.alpha_hat_points = std::move(ah);
  r.alpha_oracle_points = std::move(ao);
  return r;
}

/// Builds the reference's optimiser for a configuration.
template <class Model>
optim::AdamW<typename Model::Scalar> make_optimizer(Model& model, const TrainConfig& c) {
  optim::GroupConfig gm = optim::main_group_defaults(), gg = optim::gate_group_defaults();
  gm.lr = c.lr_main;
  gm.weight_decay = c.weight_decay;
  gm.max_grad_norm = c.grad_clip;
  gg.lr = c.lr_gate;
  gg.max_grad_norm = c.grad_clip;
  return optim::build_optimizer(model.parameters(), gm, gg);
}

/// Writes tokenizer.txt, config.json and checkpoint.safetensors into `dir` (each atomically, in that order).
template <class Model>
void save_run(const std::string& dir, const TrainConfig& cfg, const data::RunTokenizer& tok, Model& model,
              const optim::AdamW<typename Model::Scalar>* opt, std::int64_t step) {
  std::filesystem::create_directories(dir);
  tok.save(tokenizer_path(dir));
  write_config(config_path(dir), cfg);
  save_checkpoint(dir, model, opt, step, cfg.seed, nullptr, "dea-train-checkpoint", run_precision(cfg));
}

// ------------------------------------------------------------------------------------------------------------
// The run, generic over the model
// ------------------------------------------------------------------------------------------------------------

/// What run_training_with and load_run_with need to know about the model of a run; everything else of a run (data,
/// batch order, isolation check, progress line, log, evaluation, plots, checkpoints, resume) is the same for every
/// model. The encoder's family is encoder_family(); DualExpertBert's is in train/dea_bert.hpp. Model provides what
/// Trainer needs (trainer.hpp) and verify_gradient_isolation, its Cache the layers' attention caches (as
/// TransformerModel's) and its Output layer_stats / layer_supervised / logits.
template <class Model>
struct ModelFamily {
  /// The model of a run over `data`: a fresh run's initial weights, or the shell a checkpoint is loaded into.
  std::function<std::unique_ptr<Model>(const RunData& data)> build;
  /// Writes the run directory's files other than config.json and the checkpoint, each atomically: the tokenizer,
  /// and whatever else rebuilds the model from the directory alone.
  std::function<void(const std::string& dir, const RunData& data)> write_files;
  /// The model's name in the console's "data:" line.
  std::string name = "model";
};

/// The encoder's family: nn::TransformerModel of model_config() with its initial weights from Rng(seed), the
/// attention options of attention_options() (the tiled kernel) when `training`, the defaults otherwise (the
/// evaluation-mode forwards run the reference kernel either way); its tokenizer is tokenizer.txt.
template <class S>
ModelFamily<nn::TransformerModel<S>> encoder_family(const TrainConfig& cfg, bool training = true) {
  using Model = nn::TransformerModel<S>;
  ModelFamily<Model> f;
  f.build = [cfg, training](const RunData& d) {
    Rng init_rng(cfg.seed);
    const nn::ModelConfig mc = model_config(cfg, d.tok.vocab_size(), d.task, d.tok.pad_id());
    return training ? std::make_unique<Model>(mc, init_rng, attention_options<S>(cfg))
                    : std::make_unique<Model>(mc, init_rng);
  };
  f.write_files = [](const std::string& dir, const RunData& d) { d.tok.save(tokenizer_path(dir)); };
  return f;
}

/// Writes the family's files (the tokenizer, ...), config.json and checkpoint.safetensors into `dir` (each
/// atomically, in that order).
template <class Model>
void save_run(const std::string& dir, const TrainConfig& cfg, const ModelFamily<Model>& family, const RunData& d,
              Model& model, const optim::AdamW<typename Model::Scalar>* opt, std::int64_t step) {
  std::filesystem::create_directories(dir);
  family.write_files(dir, d);
  write_config(config_path(dir), cfg);
  save_checkpoint(dir, model, opt, step, cfg.seed, nullptr, "dea-train-checkpoint", run_precision(cfg));
}

/// What a run does besides training (TrainOptions<S> for the encoder).
template <class M>
struct BasicTrainOptions {
  using Model = M;
  bool verbose = true;          ///< progress line, log lines, isolation report
  bool write_log = true;        ///< out_dir/train_log.jsonl
  bool evaluate = true;         ///< periodic validation
  bool checkpoint = true;       ///< checkpoints at each evaluation and at the end
  /// Where the plots go (empty: none): at each evaluation alpha_hist_train_step<N>.svg (alpha-hat against the
  /// oracle on up to 4,000 labelled cells of the last layer per step since the previous evaluation),
  /// alpha_hist_val_step<N>.svg and training_curves.svg (from train_log.jsonl).
  std::string plot_dir;
  /// A fresh run (not cfg.resume) into an out_dir that holds another run's files (run_files): false refuses it
  /// (dea::Error, nothing touched), true deletes those files first, so the directory never mixes two runs.
  bool overwrite = false;
  /// Called after every optimiser step with (step, task_loss, loss_gate, model) (progress hooks, tests).
  std::function<void(std::int64_t, double, double, Model&)> on_step;
  /// Called at the end of the run with the trained model and the run's data (e.g. a probe the program prints).
  std::function<void(Model&, const RunData&)> on_finish;
  /// The ranks of a data-parallel run (dist/comm.hpp; nullptr: one process). Every rank runs the run with the same
  /// configuration; the evaluations are shared by the ranks (evaluate); rank 0 alone prints, logs, plots and writes
  /// the run directory, and calls on_finish.
  dist::Comm* comm = nullptr;
  /// The run's data, built beforehand by build_run_data for this configuration (a program that reports bad data
  /// files apart from failures of the run does so); nullptr: run_training builds it, its notices on stdout when
  /// verbose.
  const RunData* data = nullptr;
  /// A fault the trainer applies to every micro-batch's task loss (trainer.hpp LossFault; none by default).
  LossFault fault;
};

/// The encoder's options.
template <class S>
using TrainOptions = BasicTrainOptions<nn::TransformerModel<S>>;

struct TrainResult {
  std::int64_t start_step = 0;   ///< step of the checkpoint resumed from (0 = fresh)
  std::int64_t last_step = 0;
  double last_task_loss = 0, last_loss_gate = 0;
  std::optional<EvalResult> last_eval;
  nn::ModelIsolationReport isolation;
  /// Why the isolation check did not run ("--no_isolation_check", ...); empty when it ran.
  std::string isolation_skipped;
  double seconds = 0;
  double seconds_per_step = 0;
  double comm_seconds = 0;  ///< of the steps, in the transport (allgathers of a data-parallel run)
};

namespace detail {

/// The console's "data:" line.
template <class Model>
void print_data_line(const TrainConfig& cfg, const RunData& d, const std::string& name, Model& model, int ranks,
                     std::int64_t step0) {
  std::size_t n_params = 0;
  for (auto* p : model.parameters()) n_params += static_cast<std::size_t>(p->numel());
  const std::int64_t M = cfg.micro_batches;
  fmt::print("data: {} train / {} val / {} test ({}), vocab {} ({}), {} {:.2f}M parameters (D={} H={} L={} "
             "d_ff={}), {} steps, batch {}{}, gamma_steps {}{}{}\n",
             d.size(Split::train), d.size(Split::val), d.size(Split::test), d.source, d.tok.vocab_size(), d.tok.kind(),
             name, static_cast<double>(n_params) / 1e6, cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.d_ff, cfg.steps,
             cfg.batch_size,
             M > 1 || ranks > 1 ? fmt::format(" ({} micro-batches on {} rank{})", M, ranks, ranks > 1 ? "s" : "")
                                : std::string(),
             cfg.gamma_steps, cfg.precision == "bf16" ? ", bf16 products" : "",
             step0 ? fmt::format(", resumed at step {}", step0) : std::string());
}

/// The training split's batches (see the file comment): the whole batch of a step, or micro-batch k of it (M > 1):
/// n / M of its n examples, one more for the first n % M micro-batches (a short last batch of an epoch leaves the
/// last ones empty, never micro-batch 0), masked from its own stream.
template <class S>
class TrainBatches {
public:
  TrainBatches(const RunData& d, const TrainConfig& cfg)
      : d_(d), cfg_(cfg), order_(d.size(Split::train), static_cast<std::size_t>(cfg.batch_size), cfg.seed) {}

  nn::ModelBatch<S> whole(std::int64_t step) {
    Rng mrng(stream_seed(cfg_.seed, kMaskStream, static_cast<std::uint64_t>(step)));
    return make_batch<S>(d_, Split::train, order_.at(step), cfg_.max_len, &mrng);
  }
  Index rows(std::int64_t step, std::int64_t k) {
    const auto sp = span(step, k);
    return static_cast<Index>(sp.second - sp.first);
  }
  nn::ModelBatch<S> micro(std::int64_t step, std::int64_t k) {
    const auto sp = span(step, k);
    const std::vector<std::size_t>& all = order_.at(step);
    const std::vector<std::size_t> idx(all.begin() + static_cast<std::ptrdiff_t>(sp.first),
                                       all.begin() + static_cast<std::ptrdiff_t>(sp.second));
    Rng mrng(micro_stream_seed(cfg_.seed, kMaskStream, static_cast<std::uint64_t>(step),
                               static_cast<std::uint64_t>(k)));
    return make_batch<S>(d_, Split::train, idx, cfg_.max_len, &mrng);
  }
  /// The trainer's view of them.
  template <class Batches>
  Batches functions() {
    Batches b;
    b.whole = [this](std::int64_t s) { return whole(s); };
    b.rows = [this](std::int64_t s, std::int64_t k) { return rows(s, k); };
    b.micro = [this](std::int64_t s, std::int64_t k) { return micro(s, k); };
    return b;
  }

private:
  std::pair<std::size_t, std::size_t> span(std::int64_t step, std::int64_t k) {
    const std::size_t n = order_.at(step).size(), m = static_cast<std::size_t>(cfg_.micro_batches);
    const std::size_t kk = static_cast<std::size_t>(k);
    const auto start = [&](std::size_t j) { return j * (n / m) + std::min(j, n % m); };
    return std::make_pair(start(kk), start(kk + 1));
  }

  const RunData& d_;
  const TrainConfig& cfg_;
  BatchOrder order_;
};

/// The gradient-isolation check on the first batch `b0` (micro-batch 0 with M > 1; it changes no parameter):
/// res.isolation, or why it was skipped in res.isolation_skipped; a failed check is a dea::Error.
template <class Model>
void check_isolation(Model& model, const RunData& d, const TrainConfig& cfg,
                     const nn::ModelBatch<typename Model::Scalar>& b0, bool verbose, TrainResult& res) {
  using S = typename Model::Scalar;
  if (cfg.no_isolation_check) {
    res.isolation_skipped = "--no_isolation_check";
  } else if (!b0.alpha_oracle.dim()) {
    res.isolation_skipped = d.task == nn::Task::mlm && !d.mock_mlm_oracle
                                ? "--text_alpha none: the batches carry no oracle, so there is no gate loss"
                                : "no oracle on the first batch";
  } else if (cfg.n_layers == 0) {
    res.isolation_skipped = "the model has no layers";
  } else {
    res.isolation = model.verify_gradient_isolation(b0, S(0.5), cfg.seed);
    const auto& r = res.isolation;
    if (verbose)
      fmt::print("gradient isolation: task->gate {:.3g}  task->W_rel {:.3g}  gate->main {:.3g}  gate->gate {:.3g}  "
                 "{}\n", r.task_gate_grad, r.task_rel_grad, r.gate_main_grad, r.gate_gate_grad, r.ok ? "OK" : "FAILED");
    check(r.ok, "gradient isolation check failed on the first batch (task->gate ", r.task_gate_grad, ", task->W_rel ",
          r.task_rel_grad, ", gate->main ", r.gate_main_grad, ", gate->gate ", r.gate_gate_grad, ")");
  }
  if (verbose && !res.isolation_skipped.empty())
    fmt::print("gradient isolation: skipped ({})\n", res.isolation_skipped);
}

/// train.py's histogram sample of the training steps since the last evaluation: the last layer's labelled cells
/// (alpha-hat, oracle), at most 4,000 per step (a uniform subset drawn from stream kPlotStream).
struct AlphaSample {
  std::vector<double> hat, oracle;

  template <class Model>
  void add(const typename Model::Cache& cache, const nn::ModelBatch<typename Model::Scalar>& b, std::int64_t step,
           std::uint64_t seed) {
    std::vector<double> ah, ao;
    collect_last_layer<Model>(cache, b, ah, ao);
    const std::size_t k = std::min<std::size_t>(ah.size(), 4000);
    const std::uint64_t draw = stream_seed(seed, kPlotStream, static_cast<std::uint64_t>(step));
    const std::vector<std::size_t> idx =
        k < ah.size() ? eval::subsample_indices(ah.size(), k, draw) : std::vector<std::size_t>();
    for (std::size_t i = 0; i < k; ++i) {
      hat.push_back(ah[idx.empty() ? i : idx[i]]);
      oracle.push_back(ao[idx.empty() ? i : idx[i]]);
    }
  }
  void clear() {
    hat.clear();
    oracle.clear();
  }
};

/// A training log line's fields: gamma, the losses and norms of the step, the last layer's gate statistics and
/// alpha-hat of its (first) batch.
template <class Family, class Step>
void log_fields(const Family& f, const Step& st, const typename Family::Batch& b, nlohmann::json& j) {
  std::vector<double> ah, ao;
  collect_last_layer<typename Family::ModelType>(f.cache(), b, ah, ao);
  const GateStats gs = f.output().layer_stats.empty() ? GateStats{} : f.output().layer_stats.back();
  j["gamma"] = static_cast<double>(f.gamma(st.step));
  j["task_loss"] = json_number(st.losses.task);
  j["loss_gate"] = json_number(st.losses.gate);
  j["grad_norm_main"] = json_number(st.norms.at("main"));
  j["grad_norm_gate"] = json_number(st.norms.at("gate"));
  j["loss_reg"] = json_number(gs.loss_reg);
  j["loss_spot"] = json_number(gs.loss_spot);
  j["loss_decision"] = json_number(gs.loss_decision);
  j["decision_side_acc"] = json_number(gs.decision_side_acc);
  j["n_decision_pairs"] = gs.n_decision_pairs;
  j["n_labelled"] = gs.n_labelled;
  j["alpha_hat_mean"] = json_number(eval::mean(ah));
  j["alpha_mae"] = json_number(eval::alpha_mae(ah, ao));
}

/// The family's part of the progress line.
template <class Family, class Step>
std::string progress_fields(const Family& f, const Step& st) {
  return fmt::format("gamma {:.3f}  task {:.4f}  gate {:.4f}  |g| main {:.3f} gate {:.3f}",
                     static_cast<double>(f.gamma(st.step)), st.losses.task, st.losses.gate, st.norms.at("main"),
                     st.norms.at("gate"));
}

/// Writes a plot into `dir`; a failed plot warns and training goes on.
template <class Draw>
void plot(const std::string& dir, const std::string& name, const Draw& draw) {
  try {
    std::filesystem::create_directories(dir);
    draw().save((std::filesystem::path(dir) / name).string());
  } catch (const std::exception& e) {
    fmt::print(stderr, "warning: plot {} not written: {}\n", name, e.what());
  }
}

/// The validation pass of an evaluation step, on every rank (each its share of the batches; evaluate): into `now`.
template <class Model>
struct SharedEvaluation {
  const TrainConfig& cfg;
  const BasicTrainOptions<Model>& o;
  const RunData& d;
  Model& model;
  dist::Comm& comm;
  std::optional<EvalResult>& now;

  void operator()(std::int64_t) {
    now.reset();
    if (o.evaluate && d.size(Split::val) > 0)
      now = evaluate(model, d, Split::val, cfg.batch_size, cfg.max_len, cfg.seed,
                     static_cast<std::size_t>(cfg.eval_batches), &comm);
  }
};

/// What rank 0 does at an evaluation step before the checkpoint: the validation pass's console and log lines and
/// histograms (of SharedEvaluation's result `now`), the training curves.
template <class Model>
struct Evaluation {
  const TrainConfig& cfg;
  const BasicTrainOptions<Model>& o;
  TrainLog& log;
  ProgressLine& progress;
  AlphaSample& sample;
  TrainResult& res;
  bool verbose;
  std::optional<EvalResult>& now;

  void operator()(std::int64_t step) {
    if (now) validate(step);
    if (!o.plot_dir.empty() && o.write_log)
      plot(o.plot_dir, "training_curves.svg", [&] {
        return plots::training_curves(read_file(log_path(cfg.out_dir)), "training: " + cfg.out_dir);
      });
  }

  void validate(std::int64_t step) {
    EvalResult er = std::move(*now);
    now.reset();
    if (verbose) {
      progress.finish_line();
      fmt::print("[eval step {}] val: acc {:.4f}  task_loss {:.4f}  alpha_mae {:.4f}  pearson {:.4f}  side_acc {:.4f} "
                 "({} pairs)\n",
                 step, er.accuracy, er.task_loss, er.alpha.mae, er.alpha.pearson, er.decision_side_acc,
                 er.n_decision_pairs);
    }
    nlohmann::json j = to_json(er);
    j["step"] = step;
    j["event"] = "eval";
    log.write(j);
    if (!o.plot_dir.empty()) {
      using S = typename Model::Scalar;
      const double g = static_cast<double>(optim::gamma_mix<S>(std::max<std::int64_t>(0, step - 1), cfg.gamma_steps));
      if (!sample.hat.empty())
        plot(o.plot_dir, "alpha_hist_train_step" + std::to_string(step) + ".svg", [&] {
          return plots::alpha_histogram(sample.hat, sample.oracle,
                                        fmt::format("train step {}: alpha_hat vs oracle (g_mix={:.2f})", step, g));
        });
      plot(o.plot_dir, "alpha_hist_val_step" + std::to_string(step) + ".svg", [&] {
        return plots::alpha_histogram(er.alpha_hat_points, er.alpha_oracle_points, fmt::format("val step {}", step));
      });
    }
    sample.clear();
    er.alpha_hat_points = {};
    er.alpha_oracle_points = {};
    res.last_eval = std::move(er);
  }
};

}  // namespace detail

/// train.py's run of the model `family` builds (see the file comment). With cfg.resume, the checkpoint in
/// cfg.out_dir is loaded (its tokenizer too) and the run continues from its step. Throws dea::Error on bad input, on
/// a failed isolation check and on a non-finite loss or gradient (the last good checkpoint on disk is left as it
/// was). The steps are the Trainer's (trainer.hpp) with the Dual-Expert family (dual_expert_family.hpp).
template <class Model>
TrainResult run_training_with(const ValidConfig& vcfg, const BasicTrainOptions<Model>& o,
                              const ModelFamily<Model>& family) {
  using S = typename Model::Scalar;
  using Steps = DualExpertFamily<Model>;
  const TrainConfig& cfg = vcfg;
  dist::SingleProcessComm single;
  dist::Comm& comm = o.comm ? *o.comm : single;
  const bool root = comm.rank() == 0, verbose = o.verbose && root;
  const std::int64_t M = cfg.micro_batches;
  check(M % comm.size() == 0, "--micro_batches ", M, ": must be a multiple of the ", comm.size(),
        " ranks (each rank computes micro_batches / ranks micro-batches)");
  const bool fresh_dir = !cfg.resume && (o.write_log || o.checkpoint || o.evaluate);
  const bool plain = M == 1 && comm.size() == 1;
  if (cfg.threads > 0) set_num_threads(cfg.threads);
  const auto t_start = std::chrono::steady_clock::now();
  TrainResult res;

  // the data; config.json records its fingerprint, so that eval and --resume rebuild exactly this data
  std::optional<RunData> built;
  dist::together(comm, [&] {
    if (fresh_dir) check_fresh_run_dir(cfg.out_dir, o.overwrite);
    if (!o.data) built.emplace(build_run_data(vcfg, verbose ? &std::cout : nullptr));
  });
  const RunData& d = o.data ? *o.data : *built;
  TrainConfig saved_cfg = cfg;
  saved_cfg.data_hash = d.hash;
  // the model and optimiser (--overwrite deletes the old run's files only once they exist)
  RunStart start;
  start.out_dir = cfg.out_dir;
  start.resume = cfg.resume;
  start.replace_files = fresh_dir;
  start.steps = cfg.steps;
  start.config_json = to_json(saved_cfg).dump();
  auto opened = open_run(
      comm, start, [&] { return family.build(d); }, [&](Model& m) { return make_optimizer(m, cfg); },
      [&](Model& m, optim::AdamW<S>& opt) {
        return load_checkpoint(cfg.out_dir, m, &opt, cfg.seed, {}, run_precision(cfg));
      });
  Model& model = *opened.model;
  optim::AdamW<S>& opt = *opened.opt;
  const std::int64_t step0 = res.start_step = opened.step0;
  if (verbose) detail::print_data_line(cfg, d, family.name, model, comm.size(), step0);

  detail::TrainBatches<S> batches(d, cfg);
  dist::together(comm, [&] {  // on rank 0: it changes no parameter
    const ScopedPrecision precision(run_precision(cfg));  // the isolation of the products the steps run
    if (root) detail::check_isolation(model, d, cfg, plain ? batches.whole(1) : batches.micro(1, 0), verbose, res);
  });
  TrainLog log;
  dist::together(comm, [&] {
    if (o.write_log && root) log = TrainLog(cfg.out_dir, step0);
  });
  ProgressLine progress(verbose);
  detail::AlphaSample sample;

  Steps steps(model, cfg.gamma_steps);
  Trainer<Steps> trainer(steps, opt, cfg.seed, nullptr, o.fault);
  trainer.set_precision(run_precision(cfg));
  if (!plain) trainer.set_micro_batches(comm, M, exchange_options(cfg));
  typename Trainer<Steps>::Hooks h;
  h.steps = cfg.steps;
  h.log_every = cfg.log_every;
  h.eval_every = cfg.eval_every;
  h.evaluate_when_idle = o.checkpoint && !cfg.resume;
  h.checkpoint_dir = cfg.out_dir;
  h.log = &log;
  h.progress = &progress;
  h.on_step = [&](const typename Trainer<Steps>::Step& st, const nn::ModelBatch<S>& b) {
    res.last_step = st.step;
    res.last_task_loss = st.losses.task;
    res.last_loss_gate = st.losses.gate;
    res.comm_seconds += st.comm_seconds;
    if (!o.plot_dir.empty() && root) sample.add<Model>(steps.cache(), b, st.step, cfg.seed);
    if (o.on_step) o.on_step(st.step, st.losses.task, st.losses.gate, model);
  };
  h.log_fields = [&](const auto& st, const nn::ModelBatch<S>& b, nlohmann::json& j) {
    detail::log_fields(steps, st, b, j);
  };
  h.progress_fields = [&](const auto& st) { return detail::progress_fields(steps, st); };
  std::optional<EvalResult> eval_now;  // the evaluation at hand, the same on every rank
  h.evaluate_shared = detail::SharedEvaluation<Model>{cfg, o, d, model, comm, eval_now};
  h.evaluate = detail::Evaluation<Model>{cfg, o, log, progress, sample, res, verbose, eval_now};
  if (o.checkpoint)
    h.checkpoint = [&](std::int64_t step) { save_run(cfg.out_dir, saved_cfg, family, d, model, &opt, step); };

  const auto t_loop = std::chrono::steady_clock::now();
  const std::int64_t done =
      trainer.run(step0, batches.template functions<typename Trainer<Steps>::Batches>(), h);
  const auto t_end = std::chrono::steady_clock::now();
  res.seconds = std::chrono::duration<double>(t_end - t_start).count();
  res.seconds_per_step =
      done ? std::chrono::duration<double>(t_end - t_loop).count() / static_cast<double>(done) : 0.0;
  if (verbose)
    fmt::print("done: {} steps in {:.1f} s ({:.4f} s/step incl. evaluation){}\n", done, res.seconds,
               res.seconds_per_step,
               comm.size() > 1 ? fmt::format(", {:.2f} s of the steps in communication", res.comm_seconds)
                               : std::string());
  if (o.on_finish && root) o.on_finish(model, d);
  return res;
}

/// train.py's run of the encoder (run_training_with and encoder_family); cfg.model must be "encoder" (a dea_bert
/// configuration trains with dea_bert::run_training, train/dea_bert.hpp).
template <class S>
TrainResult run_training(const ValidConfig& vcfg, const TrainOptions<S>& o = {}) {
  check(vcfg->model == "encoder", "encoder::run_training: the configuration's --model is '", vcfg->model,
        "' (train it with its own run_training)");
  return run_training_with(vcfg, o, encoder_family<S>(vcfg));
}

/// A trained run read back from its directory: the configuration, tokenizer, data and model of config.json,
/// the tokenizer file and checkpoint.safetensors (LoadedRun<S> for the encoder).
template <class M>
struct BasicLoadedRun {
  ValidConfig cfg;
  data::RunTokenizer tok;
  RunData data;
  std::unique_ptr<M> model;
  std::int64_t step = 0;
};
template <class S>
using LoadedRun = BasicLoadedRun<nn::TransformerModel<S>>;

/// Loads the run in `dir` with the family `family_of(config)` gives for its configuration (which may refuse it with a
/// dea::Error): config.json, the tokenizer, the data rebuilt (see load_run), the model and its checkpoint, every
/// file validated (dea::Error naming the file).
template <class Model, class FamilyOf>
BasicLoadedRun<Model> load_run_with(const std::string& dir, FamilyOf&& family_of) {
  ValidConfig cfg = read_config(config_path(dir));
  const ModelFamily<Model> family = family_of(cfg);
  data::RunTokenizer tok = load_run_tokenizer(dir, cfg);
  // a data file the run's config.json names (--text, --oracle, --babi, ...) is reported with that origin
  RunData d = with_context(config_path(dir) + ": ", [&] { return build_data(cfg, &tok); });
  std::unique_ptr<Model> model = family.build(d);
  const std::int64_t step = load_checkpoint(dir, *model, nullptr, cfg->seed, {}, run_precision(cfg));
  return BasicLoadedRun<Model>{std::move(cfg), std::move(tok), std::move(d), std::move(model), step};
}

/// eval.py on a loaded run: `split` at gamma = 0, all batches, with the products of the run's --precision; shared by
/// the ranks of `comm` when given (every rank calls it; the result is one process's on every rank).
template <class Model>
EvalResult evaluate_run(BasicLoadedRun<Model>& run, Split split, dist::Comm* comm = nullptr) {
  const ScopedPrecision precision(run_precision(run.cfg));
  return evaluate(*run.model, run.data, split, run.cfg->batch_size, run.cfg->max_len, run.cfg->seed, 0, comm);
}

/// load(dir) on every rank of `comm` (nullptr: this process): a failure on one rank stops every rank with its
/// message (dist::RankFailed); one process sees the error itself.
template <class Run, class Load>
Run load_on_every_rank(dist::Comm* comm, Load&& load) {
  std::optional<Run> run;
  dist::SingleProcessComm single;
  dist::together(comm ? *comm : single, [&] { run.emplace(load()); });
  return std::move(*run);
}

/// Loads the run in `dir` (every file validated; dea::Error naming the file). A config.json whose seed is not the
/// run's (its splits would differ), whose data this program cannot rebuild (a data source of the reference such
/// as its Wikipedia stream or Hugging Face downloads, a tokenizer by Hugging Face name) or whose data_hash the
/// rebuilt data does not match, is refused: the run is never evaluated on other data than its own.
template <class S>
LoadedRun<S> load_run(const std::string& dir) {
  return load_run_with<nn::TransformerModel<S>>(dir, [&dir](const ValidConfig& c) {
    check(c->model == "encoder", config_path(dir), ": the run is a --model ", c->model,
          " run, not the encoder's (dea eval loads either; in code: dea_bert::load_run)");
    return encoder_family<S>(c, false);
  });
}

/// eval.py: the run in `dir` evaluated on `split` at gamma = 0 (all batches). `after` (when given) sees the model
/// and the run afterwards (e.g. a probe). With `comm`, every rank loads the run and evaluates its share of the
/// batches (evaluate), and `after` runs on rank 0 alone.
template <class S>
EvalResult evaluate_checkpoint(const std::string& dir, Split split,
                               const std::function<void(nn::TransformerModel<S>&, const LoadedRun<S>&)>& after = {},
                               dist::Comm* comm = nullptr) {
  LoadedRun<S> run = load_on_every_rank<LoadedRun<S>>(comm, [&] { return load_run<S>(dir); });
  EvalResult r = evaluate_run(run, split, comm);
  if (after && (!comm || comm->rank() == 0)) after(*run.model, run);
  return r;
}

}  // namespace dea::train::encoder
