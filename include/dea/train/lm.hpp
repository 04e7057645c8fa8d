// dea/train/lm.hpp: training the decoder-only language model (lm::DecoderLM, lm/model.hpp) on a local text corpus:
// `dea train --model lm --text FILE`. The run directory is the trainer's (run_dir.hpp:
// config.json, checkpoint.safetensors written atomically, train_log.jsonl) and the console shows the trainer's
// progress line; there is no tokenizer file, the tokenizer being the byte tokenizer (text/byte_tokenizer.hpp).
//
// Data. The corpus file is read as bytes and encoded one id per byte (vocabulary 256). The byte stream is split
// at floor(0.95 n): the first part trains, the last 5% is the validation split (the reference's 95/5 tail split).
// The file is fingerprinted by streaming it once and then read by offset (data/byte_file.hpp): a batch reads only
// its windows' bytes, so a process never holds the corpus, and a file edited in place during the run is an error.
// With T = max_len, a training window is T + 1 consecutive bytes w; the model sees input_ids = w[:-1] and the
// PRE-SHIFTED labels = w[1:] (lm/loss.hpp drops the last position, so each window scores T - 1 predictions).
// Row b of the batch of step s starts at the b-th draw Rng(stream_seed(seed, kOrderStream, s)).below(n_train - T),
// so a step's batch depends on (seed, step) alone. Validation uses fixed windows starting at 0, T - 1, 2(T - 1),
// ... (every validation byte after the first is scored exactly once); NLL is the mean cross-entropy in nats per
// scored byte over the windows evaluated, perplexity exp(NLL). Periodic evaluations take the first eval_batches
// batches of batch_size windows; the last evaluation of the run also. The batches are the pieces the ranks of a
// data-parallel run (or of `mpirun dea eval`) share; their sums are added in batch order, whatever the rank count.
//
// Model. DecoderConfig from the flags: hidden_size d_model, num_attention_heads n_heads, num_hidden_layers n_layers,
// intermediate_size d_ff, vocab_size 256, attention_type --attention (gqa with --kv_heads, 0 = H / 4), mlp_type
// dense_deterministic (--mlp swiglu) or tr_hash_engine (--mlp tr_moe: --experts, --top_k, --shared_expert,
// --shared_d_ff: the shared expert's width, 0 = d_ff; --routing modulo_cyclic or balanced_hash), tied embeddings, the
// initialisation of docs/lm.md, Rng(seed). The optimiser is the trainer's AdamW (lr_main, weight_decay, grad_clip; every
// LM parameter is in the main group). The learning rate of step s (lr_at): a linear warmup lr_main * s / warmup_steps
// over the first warmup_steps steps, then lr_main (--lr_schedule constant) or a cosine from lr_main down to
// 0.1 lr_main at step `steps` (--lr_schedule cosine). --label_smoothing applies to the training loss; the validation
// NLL is the plain cross-entropy.
//
// Checkpoint. The parameters under the reference names, the AdamW state, train.step and train.rng_state (as every
// run), and per TR-MoE layer l its route table "layers.{l}.mlp.engine.route_table" [k, V] (I64, the framework's
// buffer), installed again on load. A run resumed from the checkpoint of step k continues bit for bit as the
// uninterrupted run.
//
// Log (train_log.jsonl). A training line every log_every steps (and at steps 1 and the last): step, loss (the
// cross-entropy of the step's batch), grad_norm (before clipping), lr, n_tokens (scored predictions), steps_per_s,
// and per layer `layers`: [{layer, tr_moe_expert_share: [...]} (TR-MoE), tr_mha_gate, tr_mha_route_entropy, ...
// (token-routed attention telemetry)]. An evaluation line: event "eval", split "val", step, nll, perplexity,
// n_tokens, n_windows.
#pragma once

#include "../core/error.hpp"
#include "../core/files.hpp"
#include "../core/parallel.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../text/byte_tokenizer.hpp"
#include "../data/byte_file.hpp"
#include "../data/dalpha.hpp"
#include "../dist/comm.hpp"
#include "../dist/grad_buffer.hpp"
#include "../dist/pieces.hpp"
#include "../dist/reducer.hpp"
#include "../io/safetensors.hpp"
#include "../lm/config.hpp"
#include "../lm/model.hpp"
#include "../optim/adamw.hpp"
#include "config.hpp"
#include "run_dir.hpp"
#include "seeds.hpp"
#include "trainer.hpp"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dea::train::lm_run {

template <class S>
using Model = ::dea::lm::DecoderLM<S>;

/// The validation split is the last kValPercent percent of the byte stream.
constexpr std::int64_t kValPercent = 5;

/// The decoder configuration of a run (see the file comment).
inline ::dea::lm::DecoderConfig decoder_config(const TrainConfig& c) {
  ::dea::lm::DecoderConfig m;
  m.hidden_size = c.d_model;
  m.num_hidden_layers = c.n_layers;
  m.num_attention_heads = c.n_heads;
  m.num_key_value_heads = c.kv_heads > 0 ? c.kv_heads : -1;
  m.attention_type = c.attention;
  m.intermediate_size = c.d_ff;
  m.vocab_size = data::ByteTokenizer::vocab_size();
  m.mlp_type = c.mlp == "tr_moe" ? "tr_hash_engine" : "dense_deterministic";
  m.num_experts = c.experts;
  m.top_k = c.top_k;
  m.shared_expert = c.shared_expert;
  m.shared_intermediate_size = c.shared_d_ff > 0 ? c.shared_d_ff : -1;
  m.routing_strategy = c.routing == "balanced_hash" ? "token_id_balanced_hash" : "modulo_cyclic";
  m.tie_word_embeddings = true;
  return m;
}

/// A stretch of the corpus file, one id per byte, read by offset (data/byte_file.hpp): a batch reads only its own
/// windows, so a process holds the file's descriptor and the bytes of the batch at hand, never the corpus.
class ByteStream {
public:
  ByteStream() = default;
  ByteStream(std::shared_ptr<const data::ByteFile> file, std::uint64_t offset, std::uint64_t n)
      : file_(std::move(file)), offset_(offset), n_(n) {}
  std::size_t size() const { return static_cast<std::size_t>(n_); }
  /// Bytes [pos, pos + n) of the stretch as ids (dea::Error beyond its end, or when the file changed since it was
  /// fingerprinted).
  void read_ids(std::uint64_t pos, std::size_t n, std::int64_t* out) const {
    check(pos <= n_ && n <= n_ - pos, "lm_run::ByteStream: bytes [", pos, ", ", pos + n, ") outside a split of ", n_);
    buf_.resize(n);
    if (n) file_->read(offset_ + pos, n, buf_.data());
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<unsigned char>(buf_[i]);
  }

private:
  std::shared_ptr<const data::ByteFile> file_;
  std::uint64_t offset_ = 0, n_ = 0;
  mutable std::vector<char> buf_;
};

/// The byte streams of a run: training and validation split (both read from the corpus file by offset), and the
/// fingerprint of the corpus.
struct LmData {
  ByteStream train, val;
  std::string hash;
};

/// Opens and splits the corpus of `vc` (dea::Error naming --text on a missing file, a split too short for one
/// window of max_len + 1 bytes, or data other than the run's data_hash). The fingerprint is taken by streaming the
/// file once; the bytes are then read by offset as batches need them.
inline LmData build_data(const ValidConfig& vc) {
  const TrainConfig& c = vc;
  check(c.model == "lm", "lm_run::build_data: --model is '", c.model, "'");
  const auto file = ::dea::train::detail::with_context("--text '" + c.text + "': ", [&] {
    return std::make_shared<const data::ByteFile>(c.text);
  });
  const std::size_t n = static_cast<std::size_t>(file->size()), n_val = n * kValPercent / 100, n_train = n - n_val;
  const std::size_t need = static_cast<std::size_t>(c.max_len) + 1;
  check(n_train >= need && n_val >= need, "--text '", c.text, "': ", n, " bytes give a training split of ", n_train,
        " and a validation split (the last 5%) of ", n_val, " bytes; each needs at least --max_len + 1 = ", need,
        " bytes (a longer corpus, or a smaller --max_len)");
  LmData d;
  d.train = ByteStream(file, 0, n_train);
  d.val = ByteStream(file, n_train, n_val);
  data::Fingerprint fp;
  fp.add("lm-bytes");
  ::dea::train::detail::with_context("--text '" + c.text + "': ", [&] { return &file->fingerprint(fp); });
  d.hash = fp.hex();
  check(c.data_hash.empty() || c.data_hash == d.hash, "--text '", c.text, "': the corpus (fingerprint ", d.hash,
        ") is not the run's (data_hash ", c.data_hash, "): the file has changed since the run started");
  return d;
}

/// A batch: input_ids and pre-shifted labels, both [B, T].
struct LmBatch {
  Tensor<std::int64_t> ids, labels;
};

/// The windows starting at `starts` of `stream`: ids = w[:-1], labels = w[1:], w = stream[start .. start + T].
inline LmBatch windows(const std::vector<std::int64_t>& stream, const std::vector<std::size_t>& starts, Index T) {
  const Index B = static_cast<Index>(starts.size());
  LmBatch b{Tensor<std::int64_t>({B, T}), Tensor<std::int64_t>({B, T})};
  for (Index r = 0; r < B; ++r)
    for (Index t = 0; t < T; ++t) {
      const std::size_t p = starts[static_cast<std::size_t>(r)] + static_cast<std::size_t>(t);
      b.ids[r * T + t] = stream[p];
      b.labels[r * T + t] = stream[p + 1];
    }
  return b;
}

/// The same windows read from the corpus file: only their T + 1 bytes each.
inline LmBatch windows(const ByteStream& stream, const std::vector<std::size_t>& starts, Index T) {
  const Index B = static_cast<Index>(starts.size());
  LmBatch b{Tensor<std::int64_t>({B, T}), Tensor<std::int64_t>({B, T})};
  std::vector<std::int64_t> w(static_cast<std::size_t>(T) + 1);
  for (Index r = 0; r < B; ++r) {
    stream.read_ids(starts[static_cast<std::size_t>(r)], w.size(), w.data());
    for (Index t = 0; t < T; ++t) {
      b.ids[r * T + t] = w[static_cast<std::size_t>(t)];
      b.labels[r * T + t] = w[static_cast<std::size_t>(t) + 1];
    }
  }
  return b;
}

/// Rows [row0, row0 + rows) of the training batch of step `step` (1-based; see the file comment): a micro-batch
/// collates only its own windows.
inline LmBatch train_batch_rows(const LmData& d, Index batch_size, Index T, std::uint64_t seed, std::int64_t step,
                                Index row0, Index rows) {
  check(row0 >= 0 && rows >= 0 && row0 + rows <= batch_size, "lm_run::train_batch_rows: rows [", row0, ", ",
        row0 + rows, ") outside the batch of ", batch_size);
  Rng rng(stream_seed(seed, kOrderStream, static_cast<std::uint64_t>(step)));
  const std::uint64_t range = static_cast<std::uint64_t>(d.train.size()) - static_cast<std::uint64_t>(T);
  std::vector<std::size_t> starts(static_cast<std::size_t>(batch_size));
  for (auto& s : starts) s = static_cast<std::size_t>(rng.below(range));
  return windows(d.train, std::vector<std::size_t>(starts.begin() + row0, starts.begin() + row0 + rows), T);
}

/// The training batch of step `step` (1-based; see the file comment).
inline LmBatch train_batch(const LmData& d, Index batch_size, Index T, std::uint64_t seed, std::int64_t step) {
  return train_batch_rows(d, batch_size, T, seed, step, 0, batch_size);
}

/// The validation windows' starts: 0, T - 1, 2 (T - 1), ... while the window fits.
inline std::vector<std::size_t> val_starts(const LmData& d, Index T) {
  std::vector<std::size_t> s;
  const std::size_t stride = static_cast<std::size_t>(T - 1);
  for (std::size_t p = 0; p + static_cast<std::size_t>(T) < d.val.size(); p += stride) s.push_back(p);
  return s;
}

struct EvalResult {
  double nll = 0, perplexity = 0;
  std::int64_t n_tokens = 0, n_windows = 0;
};

inline nlohmann::json to_json(const EvalResult& r) {
  nlohmann::json j;
  j["split"] = "val";
  j["nll"] = json_number(r.nll);
  j["perplexity"] = json_number(r.perplexity);
  j["n_tokens"] = r.n_tokens;
  j["n_windows"] = r.n_windows;
  return j;
}

/// NLL and perplexity of `model` on the validation windows, at most `max_batches` batches (0 = all), shared by the
/// ranks of `comm` (nullptr: this process alone). The pieces are the batches of batch_size windows; each gives its
/// sum of cross-entropies (nats) and its count of scored bytes, and the sums are added in batch order on every rank
/// (dist/pieces.hpp), so every rank count gives one process's bits. Every rank of `comm` calls it; a failure on one
/// stops every rank (dist::RankFailed).
template <class S>
EvalResult evaluate(Model<S>& model, const LmData& d, Index batch_size, Index T, std::size_t max_batches = 0,
                    dist::Comm* comm = nullptr) {
  const std::vector<std::size_t> all = val_starts(d, T);
  std::size_t n = all.size();
  if (max_batches) n = std::min(n, max_batches * static_cast<std::size_t>(batch_size));
  const std::size_t bs = static_cast<std::size_t>(batch_size), n_pieces = (n + bs - 1) / bs;
  typename Model<S>::Cache cache;
  dist::SingleProcessComm single;
  const std::vector<std::string> pieces = dist::gather_pieces(comm ? *comm : single, n_pieces, [&](std::size_t k) {
    const std::size_t i = k * bs;
    const std::vector<std::size_t> starts(all.begin() + static_cast<std::ptrdiff_t>(i),
                                          all.begin() + static_cast<std::ptrdiff_t>(std::min(n, i + bs)));
    const LmBatch b = windows(d.val, starts, T);
    const Mat<S> logits = model.forward(b.ids, cache);
    const auto r = Model<S>::loss(logits, b.labels, {}, false);
    dist::PieceWriter w;
    w.f64(static_cast<double>(r.ce) * static_cast<double>(r.count)).u64(static_cast<std::uint64_t>(r.count));
    return w.take();
  });
  double sum = 0;
  std::int64_t count = 0;
  for (const std::string& p : pieces) {  // in batch order
    dist::PieceReader rd(p);
    sum += rd.f64();
    count += static_cast<std::int64_t>(rd.u64());
  }
  EvalResult e;
  e.n_windows = static_cast<std::int64_t>(n);
  e.n_tokens = count;
  e.nll = count ? sum / static_cast<double>(count) : std::nan("");
  e.perplexity = std::exp(e.nll);
  return e;
}

/// The checkpoint name of layer l's route table.
inline std::string route_table_name(Index l) { return fmt::format("layers.{}.mlp.engine.route_table", l); }

/// Writes checkpoint.safetensors (atomically): the trainer's contents and the route tables.
template <class S>
void save_checkpoint(const std::string& dir, Model<S>& model, const optim::AdamW<S>* opt, std::int64_t step,
                     std::uint64_t seed, Precision precision = Precision::fp32) {
  train::save_checkpoint(dir, model, opt, step, seed, [&](io::SafeTensors& st) {
    for (Index l = 0; l < model.num_layers(); ++l)
      if (const auto* moe = model.tr_moe(l)) {
        const std::vector<std::int64_t> buf = moe->route_table_buffer();
        Tensor<std::int64_t> t({moe->top_k(), moe->vocab_size()});
        std::copy(buf.begin(), buf.end(), t.ptr());
        st.put(route_table_name(l), t, io::DType::I64);
      }
  }, "dea-lm-checkpoint", precision);
}

/// Loads checkpoint.safetensors of `dir` into `model` (and `opt`): the trainer's load_checkpoint, then every TR-MoE
/// layer's route table (a missing or invalid one is a dea::Error naming the file and the tensor). Returns the step.
/// `precision` (when given) must be the one the checkpoint records (train::load_checkpoint).
template <class S>
std::int64_t load_checkpoint(const std::string& dir, Model<S>& model, optim::AdamW<S>* opt, std::uint64_t seed,
                             std::optional<Precision> precision = std::nullopt) {
  std::vector<std::string> tables;
  for (Index l = 0; l < model.num_layers(); ++l)
    if (model.tr_moe(l)) tables.push_back(route_table_name(l));
  const std::int64_t step = ::dea::train::load_checkpoint(dir, model, opt, seed, tables, precision);
  if (tables.empty()) return step;
  const std::string path = checkpoint_path(dir);
  const io::SafeTensors st = io::SafeTensors::load(path);
  for (Index l = 0; l < model.num_layers(); ++l)
    if (auto* moe = model.tr_moe(l)) {
      const std::string name = route_table_name(l);
      check(st.has(name), path, ": the TR-MoE route table '", name, "' is missing");
      ::dea::train::detail::with_context(path + ": '" + name + "': ", [&] {
        moe->load_route_table(st.get<std::int64_t>(name));
        return 0;
      });
    }
  return step;
}

/// The model of a configuration, its weights drawn from Rng(seed).
template <class S>
std::unique_ptr<Model<S>> build_model(const TrainConfig& c) {
  Rng rng(c.seed);
  return std::make_unique<Model<S>>(decoder_config(c), rng);
}

/// The learning rate of step `step` (1-based; see the file comment).
inline double lr_at(const TrainConfig& c, std::int64_t step) {
  const double base = c.lr_main;
  if (c.warmup_steps > 0 && step <= c.warmup_steps)
    return base * static_cast<double>(step) / static_cast<double>(c.warmup_steps);
  if (c.lr_schedule != "cosine" || c.steps <= c.warmup_steps) return base;
  const double progress = static_cast<double>(step - c.warmup_steps) / static_cast<double>(c.steps - c.warmup_steps);
  constexpr double kFloor = 0.1, kPi = 3.14159265358979323846;
  return base * (kFloor + (1 - kFloor) * 0.5 * (1 + std::cos(kPi * progress)));
}

/// The optimiser: the trainer's AdamW groups (every LM parameter is "main").
template <class S>
optim::AdamW<S> make_optimizer(Model<S>& model, const TrainConfig& c) {
  optim::GroupConfig gm = optim::main_group_defaults(), gg = optim::gate_group_defaults();
  gm.lr = c.lr_main;
  gm.weight_decay = c.weight_decay;
  gm.max_grad_norm = c.grad_clip;
  gg.max_grad_norm = c.grad_clip;
  return optim::build_optimizer(model.parameters(), gm, gg);
}

/// Per-layer telemetry of the last forward: TR-MoE expert shares, token-routed attention statistics.
template <class S>
nlohmann::json layer_telemetry(const Model<S>& model) {
  nlohmann::json out = nlohmann::json::array();
  for (Index l = 0; l < model.num_layers(); ++l) {
    nlohmann::json j;
    j["layer"] = l;
    if (const auto* moe = model.tr_moe(l)) j["tr_moe_expert_share"] = moe->telemetry().expert_share;
    if (const auto* tr = model.token_routed(l))
      for (const auto& kv : tr->telemetry().items()) j[kv.first] = json_number(kv.second);
    if (j.size() > 1) out.push_back(std::move(j));
  }
  return out;
}

/// The trainer's family of the decoder LM (trainer.hpp): DecoderLM::forward_backward with the run's label smoothing.
/// Its losses: task = the training loss, extra = the plain cross-entropy, count = the scored predictions. There is
/// no dropout and no gate.
template <class S>
class LmFamily {
public:
  using Scalar = S;
  using Batch = LmBatch;

  LmFamily(Model<S>& model, double label_smoothing) : model_(model) { loss_opt_.label_smoothing = label_smoothing; }

  ParamList<S> parameters() { return model_.parameters(); }
  /// The model's report of final gradients during backward (the trainer's data-parallel exchange; empty: none).
  void set_grads_final(std::function<void(std::size_t)> f) { model_.set_grads_final(std::move(f)); }
  Losses forward_backward(const LmBatch& b, std::int64_t /*step*/, Rng& /*dropout*/) {
    const auto r = model_.forward_backward(b.ids, b.labels, cache_, loss_opt_);
    Losses l;
    l.task = static_cast<double>(r.loss);
    l.extra = static_cast<double>(r.ce);
    l.count = r.count;
    return l;
  }
  std::string describe(const Losses& l) const { return fmt::format("{}", l.task); }
  std::string describe(const optim::GradNorms&) const { return std::string(); }

private:
  Model<S>& model_;
  ::dea::lm::CausalLmLossOptions loss_opt_;
  typename Model<S>::Cache cache_;
};

struct TrainOptions {
  bool verbose = true;
  bool overwrite = false;
  const LmData* data = nullptr;  ///< built beforehand (nullptr: built here)
  /// The ranks of a data-parallel run (dist/comm.hpp; nullptr: one process). Every rank runs run_training with
  /// the same configuration; rank 0 alone prints, logs and writes the run directory.
  dist::Comm* comm = nullptr;
  /// A fault the trainer applies to every micro-batch's loss (trainer.hpp LossFault; none by default).
  LossFault fault;
};

struct TrainResult {
  std::int64_t start_step = 0, last_step = 0;
  double last_loss = 0;
  double step_seconds = 0;  ///< wall time of the training steps of this call (evaluations and checkpoints excluded)
  double comm_seconds = 0;  ///< of which in the transport (allgathers of a data-parallel run)
  std::int64_t step_tokens = 0;  ///< tokens the steps of this call processed (batch_size * max_len per step)
  std::optional<EvalResult> last_eval;
};

namespace detail {

/// The console's "data:" line.
template <class S>
void print_data_line(const TrainConfig& cfg, const LmData& d, Model<S>& model, int ranks, std::int64_t step0) {
  std::size_t n_params = 0;
  for (auto* p : model.parameters()) n_params += static_cast<std::size_t>(p->numel());
  const Index T = cfg.max_len;
  const std::int64_t M = cfg.micro_batches;
  fmt::print("data: {} train / {} val bytes ({} validation windows of {}), vocab 256 (bytes), DecoderLM {:.3f}M "
             "parameters (D={} H={} kv={} L={} d_ff={} attention {} mlp {}{}), {} steps, batch {}{}{}{}\n",
             d.train.size(), d.val.size(), val_starts(d, T).size(), T + 1, static_cast<double>(n_params) / 1e6,
             cfg.d_model, cfg.n_heads, model.num_kv_heads(), cfg.n_layers, cfg.d_ff, cfg.attention, cfg.mlp,
             cfg.mlp == "tr_moe"
                 ? fmt::format(" E={} k={}{}", cfg.experts, cfg.top_k, cfg.shared_expert ? " +shared" : "")
                 : std::string(),
             cfg.steps, cfg.batch_size,
             M > 1 || ranks > 1 ? fmt::format(" ({} micro-batches of {} on {} rank{})", M, cfg.batch_size / M, ranks,
                                              ranks > 1 ? "s" : "")
                                : std::string(),
             cfg.precision == "bf16" ? ", bf16 products" : "",
             step0 ? fmt::format(", resumed at step {}", step0) : std::string());
}

}  // namespace detail

/// The run (see the file comment). With cfg.resume the checkpoint in cfg.out_dir is loaded and the run continues.
/// Throws dea::Error on bad input and NonFiniteError on a non-finite loss or gradient (the last good checkpoint
/// is kept).
///
/// Micro-batches and ranks (cfg.micro_batches = M, o.comm of R ranks; docs/scale.md). With M > 1 micro-batch k is
/// rows [k B/M, (k+1) B/M) of the step's batch; its gradient is computed alone (zero_grad, forward_backward), scaled
/// by 1/M (every window scores T - 1 predictions, so the micro-batches' counts are equal and 1/M, a power of two,
/// makes the sum exactly the gradient of the global batch's mean) and summed in the fixed tree of dist/tree_sum.hpp;
/// then clipping and AdamW as with M = 1 (trainer.hpp). The logged loss (and ce) is the mean of the micro-batches'
/// losses added in micro-batch order, n_tokens their sum, the layer telemetry that of micro-batch 0. Rank r computes
/// the micro-batches [r M/R, (r+1) M/R) and reads and collates only their windows; every rank holds the same
/// parameters, AdamW state and log values for any R dividing M, the bits of one process with the same M. The
/// periodic evaluation is shared by the ranks, batch by batch, its sums added in batch order (evaluate), so its
/// values are one process's for any R. Rank 0 alone prints, logs and writes the run directory. A failure on one rank (bad input, a non-finite loss) stops every rank
/// with that rank's message (NonFiniteError or dist::RankFailed on every rank).
template <class S>
TrainResult run_training(const ValidConfig& vcfg, const TrainOptions& o = {}) {
  const TrainConfig& cfg = vcfg;
  check(cfg.model == "lm", "lm_run::run_training: --model is '", cfg.model, "'");
  dist::SingleProcessComm single;
  dist::Comm& comm = o.comm ? *o.comm : single;
  const bool root = comm.rank() == 0, verbose = o.verbose && root;
  const std::int64_t M = cfg.micro_batches;
  check(M % comm.size() == 0, "--micro_batches ", M, ": must be a multiple of the ", comm.size(),
        " ranks (each rank computes micro_batches / ranks micro-batches)");
  if (cfg.threads > 0) set_num_threads(cfg.threads);
  std::optional<LmData> built;
  dist::together(comm, [&] {
    if (!cfg.resume) check_fresh_run_dir(cfg.out_dir, o.overwrite);
    if (!o.data) built.emplace(build_data(vcfg));
  });
  const LmData& d = o.data ? *o.data : *built;
  TrainConfig saved_cfg = cfg;
  saved_cfg.data_hash = d.hash;
  RunStart start;
  start.out_dir = cfg.out_dir;
  start.resume = cfg.resume;
  start.replace_files = !cfg.resume;
  start.steps = cfg.steps;
  start.config_json = to_json(saved_cfg).dump();
  auto opened = open_run(
      comm, start, [&] { return build_model<S>(cfg); }, [&](Model<S>& m) { return make_optimizer(m, cfg); },
      [&](Model<S>& m, optim::AdamW<S>& opt) {
        return load_checkpoint(cfg.out_dir, m, &opt, cfg.seed, run_precision(cfg));
      });
  Model<S>& model = *opened.model;
  optim::AdamW<S>& opt = *opened.opt;
  const std::int64_t step0 = opened.step0;
  if (verbose) detail::print_data_line(cfg, d, model, comm.size(), step0);
  TrainResult res;
  res.start_step = step0;
  const Index T = cfg.max_len, rows = cfg.batch_size / static_cast<Index>(M);

  LmFamily<S> family(model, cfg.label_smoothing);
  Trainer<LmFamily<S>> trainer(family, opt, cfg.seed, [&cfg](std::int64_t s) { return lr_at(cfg, s); }, o.fault);
  trainer.set_precision(run_precision(cfg));
  if (M > 1 || comm.size() > 1) trainer.set_micro_batches(comm, M, exchange_options(cfg));
  typename Trainer<LmFamily<S>>::Batches batches;
  batches.whole = [&](std::int64_t s) { return train_batch(d, cfg.batch_size, T, cfg.seed, s); };
  batches.rows = [rows](std::int64_t, std::int64_t) { return rows; };
  batches.micro = [&](std::int64_t s, std::int64_t k) {
    return train_batch_rows(d, cfg.batch_size, T, cfg.seed, s, static_cast<Index>(k) * rows, rows);
  };

  TrainLog log;
  dist::together(comm, [&] {
    if (root) log = TrainLog(cfg.out_dir, step0);
  });
  ProgressLine progress(verbose);
  typename Trainer<LmFamily<S>>::Hooks h;
  h.steps = cfg.steps;
  h.log_every = cfg.log_every;
  h.eval_every = cfg.eval_every;
  h.evaluate_when_idle = !cfg.resume;
  h.checkpoint_dir = cfg.out_dir;
  h.log = &log;
  h.progress = &progress;
  auto grad_norm = [](const optim::GradNorms& n) { return n.norm.count("main") ? n.norm.at("main") : 0.0; };
  h.on_step = [&](const auto& st, const LmBatch&) {
    res.step_seconds += st.seconds;
    res.comm_seconds += st.comm_seconds;
    res.step_tokens += static_cast<std::int64_t>(cfg.batch_size) * static_cast<std::int64_t>(T);
    res.last_step = st.step;
    res.last_loss = st.losses.task;
  };
  h.log_fields = [&](const auto& st, const LmBatch&, nlohmann::json& j) {
    j["loss"] = json_number(st.losses.task);
    if (cfg.label_smoothing > 0) j["ce"] = json_number(st.losses.extra);
    j["grad_norm"] = json_number(grad_norm(st.norms));
    j["lr"] = st.lr;
    j["n_tokens"] = st.losses.count;
    j["layers"] = layer_telemetry(model);
  };
  h.progress_fields = [&](const auto& st) {
    return fmt::format("loss {:.4f}  |g| {:.3f}", st.losses.task, grad_norm(st.norms));
  };
  std::optional<EvalResult> eval_now;  // of the evaluation at hand, the same on every rank
  h.evaluate_shared = [&](std::int64_t) {
    eval_now = evaluate(model, d, cfg.batch_size, T, static_cast<std::size_t>(cfg.eval_batches), &comm);
    res.last_eval = eval_now;
  };
  h.evaluate = [&](std::int64_t step) {
    const EvalResult er = *eval_now;
    if (verbose) {
      progress.finish_line();
      fmt::print("[eval step {}] val: nll {:.4f}  perplexity {:.3f}  ({} bytes scored, {} windows)\n", step, er.nll,
                 er.perplexity, er.n_tokens, er.n_windows);
    }
    nlohmann::json j = to_json(er);
    j["step"] = step;
    j["event"] = "eval";
    log.write(j);
  };
  h.checkpoint = [&](std::int64_t step) {
    write_config(config_path(cfg.out_dir), saved_cfg);
    save_checkpoint(cfg.out_dir, model, &opt, step, cfg.seed, run_precision(cfg));
  };

  const auto t_loop = std::chrono::steady_clock::now();
  const std::int64_t done = trainer.run(step0, batches, h);
  if (verbose) {
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_loop).count();
    fmt::print("done: {} steps in {:.1f} s{}\n", done, el,
               comm.size() > 1 ? fmt::format(" ({:.2f} s of the steps in communication)", res.comm_seconds)
                               : std::string());
  }
  return res;
}

/// A trained LM run read back from its directory.
template <class S>
struct LoadedRun {
  std::optional<ValidConfig> cfg;
  std::unique_ptr<Model<S>> model;
  std::int64_t step = 0;
};

/// Loads the LM run in `dir`: config.json (a run of another --model is refused), the model and its checkpoint
/// with the route tables (dea::Error naming the file on any problem). The corpus is not read.
template <class S>
LoadedRun<S> load_run(const std::string& dir) {
  LoadedRun<S> run;
  run.cfg.emplace(read_config(config_path(dir)));
  check((*run.cfg)->model == "lm", config_path(dir), ": the run is a --model ", (*run.cfg)->model,
        " run, not a language model (--model lm)");
  run.model = build_model<S>(*run.cfg);
  run.step = load_checkpoint<S>(dir, *run.model, nullptr, (*run.cfg)->seed, run_precision(*run.cfg));
  return run;
}

}  // namespace dea::train::lm_run
