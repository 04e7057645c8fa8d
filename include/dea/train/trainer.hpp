// dea/train/trainer.hpp: the training loop, the one every model family's run follows. A family says what differs
// between models; the trainer does the rest, once:
//
//   run(step0, batches, hooks)                              // steps step0+1 .. hooks.steps
//     for each step s:
//       step(batch(s), s)  or  step_micro(s, ...)           // forward/backward, clipping, learning rate, AdamW
//       hooks.on_step                                       // the family's bookkeeping (results, plot samples)
//       the log line (every log_every steps, step 1, the last): "step", hooks.log_fields, "steps_per_s"
//       the progress line: "step s/N  <hooks.progress_fields>  r it/s  ETA t"
//       hooks.evaluate_shared on every rank (the evaluation's pieces shared by the ranks), then hooks.evaluate and
//       hooks.checkpoint on rank 0 (every eval_every steps and after the last)
//     a non-finite loss or gradient norm stops every rank with one message naming the step (and micro-batch, rank)
//     and the checkpoint it keeps
//
// A family (DualExpertFamily<Model> for the encoder and DualExpertBert, lm_run::LmFamily for the decoder LM) gives:
//   using Scalar; using Batch;
//   ParamList<Scalar> parameters();
//   Losses forward_backward(const Batch&, std::int64_t step, Rng& dropout);
//       // the gradients of the batch's loss added into the (zeroed) parameters' gradients; on a non-finite loss it
//       // may return without the backward pass
//   std::string describe(const Losses&) const;            // the losses in the non-finite message: "task_loss 0.7, ..."
//   std::string describe(const optim::GradNorms&) const;  // the norms after it (" (main nan, gate 0.2)"), or ""
//
// Around the loop: open_run builds a run's model and optimiser on every rank (and loads a resumed run's checkpoint);
// a LossFault the caller installs sees every task loss before the checks (a program's rehearsal of the failure path;
// the library installs none and reads no environment variable).
//
// Precision: set_precision(Precision::bf16) runs the family's forward/backward passes and the evaluation hooks under
// ScopedPrecision (core/parallel.hpp): their float matrix products take bf16 operands and accumulate in fp32, as
// PyTorch's CPU autocast does; what is not a product of ops/gemm.hpp (the Dual-Expert gate, normalisations, softmax,
// losses), the gradients, clipping and AdamW's master weights and state stay fp32. The default is fp32.
//
// Randomness: step s (1-based) draws its dropout masks from Rng(stream_seed(seed, kDropoutStream, s)) (seeds.hpp),
// so a run resumed at step k continues as the uninterrupted run does.
//
// Micro-batches and ranks (docs/scale.md): after set_micro_batches(comm, M), a step runs as M micro-batches, this
// rank's share of them (dist/reducer.hpp): micro-batch k's gradient alone (its dropout masks from
// Rng(micro_stream_seed(seed, kDropoutStream, s, k))), weighted by its share of the batch's examples, summed in the
// fixed tree, then clipping and AdamW as for one batch. The step's losses are the weighted sums of the micro-batches'
// losses in micro-batch order (Losses::count the plain sum); the family's caches end on the rank's first
// micro-batch, whose batch the hooks see. Every micro-batch phase ends with the exchange of every rank's RankStatus,
// so a failure on one rank stops all of them with its message.
#pragma once

#include "../core/error.hpp"
#include "../core/parallel.hpp"
#include "../core/param.hpp"
#include "../core/rng.hpp"
#include "../dist/comm.hpp"
#include "../dist/grad_buffer.hpp"
#include "../dist/reducer.hpp"
#include "../optim/adamw.hpp"
#include "run_dir.hpp"
#include "seeds.hpp"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

namespace dea::train {

/// A training step met a non-finite loss or gradient norm (the parameters were not changed by it).
class NonFiniteError : public Error {
public:
  explicit NonFiniteError(const std::string& what) : Error(what) {}
};

/// How a rank ended its part of a step, as every rank tells the others (dist::Comm::agree): the lowest failing
/// rank's status and message reach every rank, which then throws NonFiniteError (non_finite) or dist::RankFailed.
enum class RankStatus : int {
  ok = 0,
  failed = 1,      ///< an error (bad input, out of memory, ...): exit status 1
  non_finite = 3,  ///< a non-finite loss
};

/// The loss values of one (micro-)batch, as a family's forward_backward measures them.
struct Losses {
  double task = 0;         ///< the loss the step descends (checked: a non-finite one stops the run)
  double gate = 0;         ///< the Dual-Expert gate loss (checked; 0 for a family without a gate)
  double extra = 0;        ///< a further value the family logs, averaged like task (the LM's plain cross-entropy)
  std::int64_t count = 0;  ///< summed over the micro-batches, not averaged (the LM's scored predictions)
  bool finite() const { return std::isfinite(task) && std::isfinite(gate); }
};

/// A fault the caller installs to rehearse the failure paths end to end: the trainer passes it the task loss of
/// micro-batch `micro` (0 when a step is one batch) of step `step` and uses what it returns.
using LossFault = std::function<double(double loss, std::int64_t step, std::int64_t micro)>;

/// A "STEP:MICRO_BATCH" fault (the `dea train` program's debug variable): the loss of that micro-batch at that step
/// reads as NaN on whichever rank computes it.
struct InjectedFault {
  std::int64_t step = -1, micro = -1;
};

/// Parses `value` of the variable `name` (nullptr: no fault); anything but two non-negative integers is a dea::Error
/// naming the variable.
inline InjectedFault parse_injected_fault(const char* name, const char* value) {
  InjectedFault f;
  if (!value) return f;
  const std::string v(value);
  const auto colon = v.find(':');
  auto number = [&](const std::string& s) {  // -1 when s is not a non-negative integer
    std::size_t used = 0;
    long long n = -1;
    try {
      n = std::stoll(s, &used);
    } catch (const std::exception&) {
      return std::int64_t(-1);
    }
    return used == s.size() && !s.empty() && n >= 0 ? static_cast<std::int64_t>(n) : std::int64_t(-1);
  };
  if (colon != std::string::npos) {
    f.step = number(v.substr(0, colon));
    f.micro = number(v.substr(colon + 1));
  }
  check(f.step >= 0 && f.micro >= 0, "environment variable ", name, "='", v,
        "': expected STEP:MICRO_BATCH, two non-negative integers (for example 3:1)");
  return f;
}

/// A hash of `model`'s parameters and (when given) `opt`'s state: two ranks hold the same model exactly when their
/// hashes agree (data-parallel runs check it after building or loading the model).
template <class Model, class S>
std::uint64_t model_state_hash(Model& model, const optim::AdamW<S>* opt) {
  dist::Hash64 h;
  h.add_u64(dist::parameter_hash(model.parameters()));
  if (opt)
    for (const auto& kv : opt->state("optim.")) {
      h.add(kv.first.data(), kv.first.size());
      h.add(kv.second.ptr(), sizeof(S) * static_cast<std::size_t>(kv.second.numel()));
    }
  return h.value();
}

/// Checks on every rank of `comm` that they hold the same configuration (`config_json`, with the data's fingerprint)
/// and then, by `model_hash`, the same model; dea::Error on every rank naming what differs.
inline void check_ranks_agree(dist::Comm& comm, const std::string& config_json, bool resumed,
                              const std::function<std::uint64_t()>& model_hash) {
  if (comm.size() == 1) return;
  comm.check_same(dist::Hash64().add(config_json.data(), config_json.size()).value(),
                  "the configuration and data (config.json with data_hash)");
  comm.check_same(model_hash(), resumed ? "the parameters and AdamW state loaded from the checkpoint"
                                        : "the initial parameters (built from --seed on every rank)");
}

/// How a run starts (open_run).
struct RunStart {
  std::string out_dir;
  bool resume = false;         ///< load out_dir's checkpoint
  bool replace_files = false;  ///< a fresh run: delete the files of the run in out_dir (rank 0) once the model exists
  std::int64_t steps = 0;      ///< the run's last step: a checkpoint beyond it is refused
  std::string config_json;     ///< the configuration with the data's fingerprint, compared across the ranks
};

/// The model and optimiser open_run gives.
template <class Model>
struct OpenedRun {
  std::unique_ptr<Model> model;
  std::optional<optim::AdamW<typename Model::Scalar>> opt;
  std::int64_t step0 = 0;  ///< the step of the checkpoint resumed from (0: a fresh run)
};

/// Builds a run's model (build()) and its optimiser (make_optimizer(model)) on every rank of `comm`; a resumed run
/// then loads them (load(model, opt) returns the checkpoint's step). A failure on one rank stops every rank; then
/// every rank must hold the same configuration and the same model (check_ranks_agree).
template <class Build, class MakeOptimizer, class Load>
auto open_run(dist::Comm& comm, const RunStart& rs, Build&& build, MakeOptimizer&& make_optimizer, Load&& load) {
  using Model = typename std::decay_t<decltype(build())>::element_type;
  OpenedRun<Model> r;
  dist::together(comm, [&] {
    r.model = build();
    r.opt.emplace(make_optimizer(*r.model));
    if (rs.replace_files && comm.rank() == 0) remove_run_files(rs.out_dir);
    if (rs.resume) {
      r.step0 = load(*r.model, *r.opt);
      check(r.step0 <= rs.steps, "--resume: the checkpoint is at step ", r.step0, ", beyond --steps ", rs.steps);
    }
  });
  check_ranks_agree(comm, rs.config_json, rs.resume, [&] { return model_state_hash(*r.model, &*r.opt); });
  return r;
}

/// Evaluation mode (gamma 0, no dropout) over batches 0 .. n-1 of a Dual-Expert `model`: batch(k) gives batch k, and
/// visit(k, batch, output, cache) after its forward measures what the caller wants.
template <class Model, class BatchFn, class Visit>
void evaluation_pass(Model& model, std::size_t n, BatchFn&& batch, Visit&& visit) {
  using Scalar = typename Model::Scalar;
  typename Model::Cache c;
  for (std::size_t k = 0; k < n; ++k) {
    const auto b = batch(k);
    const auto o = model.forward(b, Scalar(0), false, nullptr, c);
    visit(k, b, o, c);
  }
}

/// The console's progress line, on stderr (stdout keeps the results): on a terminal one line rewritten in place
/// (and kept at the steps asked for), elsewhere only the kept lines. Stdout is flushed first, so that the two
/// streams read together keep their order.
class ProgressLine {
public:
  explicit ProgressLine(bool enabled) : on_(enabled), tty_(enabled && stderr_is_tty()) {}
  bool tty() const { return tty_; }
  /// Shows `text`; `keep` ends the line (on a terminal the next one starts below it).
  void show(const std::string& text, bool keep) {
    if (!on_ || (!tty_ && !keep)) return;
    std::fflush(stdout);
    fmt::print(stderr, "{}{}{}", tty_ ? "\r" : "", text, tty_ ? (keep ? "\n" : "   ") : "\n");
    std::fflush(stderr);
    open_ = tty_ && !keep;
  }
  /// Ends a rewritten line before other output.
  void finish_line() {
    if (open_) fmt::print(stderr, "\n");
    open_ = false;
  }

  static bool stderr_is_tty() {
#if defined(__unix__) || defined(__APPLE__)
    return ::isatty(::fileno(stderr)) != 0;
#else
    return false;
#endif
  }

private:
  bool on_, tty_, open_ = false;
};

/// "1h02m", "3m05s", "42s" ("?" for a negative or non-finite time).
inline std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = static_cast<long>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, static_cast<int>((t % 3600) / 60));
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, static_cast<int>(t % 60));
  return fmt::format("{}s", t);
}

namespace detail {
/// Whether a family reports final gradients during backward: void set_grads_final(std::function<void(size_t)>).
template <class F, class = void>
struct has_grads_final : std::false_type {};
template <class F>
struct has_grads_final<F, std::void_t<decltype(std::declval<F&>().set_grads_final(
                              std::function<void(std::size_t)>()))>> : std::true_type {};
}  // namespace detail

template <class Family>
class Trainer {
public:
  using Scalar = typename Family::Scalar;
  using Batch = typename Family::Batch;

  /// What one step did.
  struct Step {
    std::int64_t step = 0;
    Losses losses;            ///< of the whole batch (micro-batches: weighted by their examples)
    optim::GradNorms norms;   ///< per group, before clipping
    double lr = 0;            ///< the main group's learning rate of the schedule (0 without one)
    double seconds = 0;       ///< wall time: batch, forward/backward, reduction, optimiser
    double comm_seconds = 0;  ///< of which in the transport (allgathers of a data-parallel step)
    /// A data-parallel step's gradient exchange: compute, exposed and hidden exchange seconds, bytes (per rank).
    dist::ExchangeStats exchange;
  };

  /// Where run() takes a step's batch: the whole batch of step s, or (micro-batched) micro-batch k's example count
  /// (0: empty) and its batch (asked for this rank's micro-batches only).
  struct Batches {
    std::function<Batch(std::int64_t step)> whole;
    std::function<Index(std::int64_t step, std::int64_t k)> rows;
    std::function<Batch(std::int64_t step, std::int64_t k)> micro;
  };

  /// What run() does besides the steps; each function may be empty.
  struct Hooks {
    std::int64_t steps = 0;      ///< the run's last step
    std::int64_t log_every = 1;  ///< a log line every log_every steps (and at steps 1 and the last)
    std::int64_t eval_every = 0; ///< evaluate every eval_every steps (0: only after the last)
    /// A run with no step to take still evaluates and writes its checkpoint once, at its first step.
    bool evaluate_when_idle = false;
    std::string checkpoint_dir;  ///< the run directory, named by a non-finite stop's message (its checkpoint stays)
    TrainLog* log = nullptr;           ///< written when open (rank 0)
    ProgressLine* progress = nullptr;  ///< the console's progress line
    std::function<void(const Step&, const Batch& first)> on_step;  ///< after every step, on every rank
    std::function<void(const Step&, const Batch& first, nlohmann::json& line)> log_fields;  ///< a log line's fields
    std::function<std::string(const Step&)> progress_fields;  ///< the family's part of the progress line
    /// On every rank, before evaluate: the evaluation's computation, each rank its share of the pieces and the
    /// metric sums exchanged in a fixed order (dist/pieces.hpp), so that it may use the ranks' collectives (every rank
    /// calls it at the same steps); a failure on one rank stops every rank with its message (dist::RankFailed).
    std::function<void(std::int64_t step)> evaluate_shared;
    std::function<void(std::int64_t step)> evaluate;          ///< on rank 0: evaluation, its log line, plots
    std::function<void(std::int64_t step)> checkpoint;        ///< on rank 0 after evaluate: the run directory
  };

  /// `lr_main(step)` (when given) sets the main group's learning rate of each step before the optimiser step;
  /// `fault` (when given) sees every task loss first (see LossFault).
  Trainer(Family& family, optim::AdamW<Scalar>& opt, std::uint64_t seed,
          std::function<double(std::int64_t step)> lr_main = nullptr, LossFault fault = nullptr)
      : family_(family), opt_(opt), seed_(seed), lr_main_(std::move(lr_main)), fault_(std::move(fault)) {}
  /// Takes back the family's report of final gradients (it points into this trainer's reducer).
  ~Trainer() {
    if constexpr (detail::has_grads_final<Family>::value)
      if (reducer_ && reducer_->uses_grads_final()) family_.set_grads_final(nullptr);
  }
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Steps run as `micro_batches` micro-batches on the ranks of `comm` (see the file comment), their gradients
  /// exchanged as `exchange` says (dist/reducer.hpp; the same bits either way). When the exchange can start during
  /// backward and the family has a set_grads_final hook, the family's backward reports the parameters whose
  /// gradients are final as it goes.
  void set_micro_batches(dist::Comm& comm, std::int64_t micro_batches, dist::ExchangeOptions exchange = {}) {
    comm_ = &comm;
    reducer_ = std::make_unique<dist::GradientReducer<Scalar>>(family_.parameters(), comm, micro_batches, exchange);
    if constexpr (detail::has_grads_final<Family>::value) {
      if (reducer_->uses_grads_final()) {
        dist::GradientReducer<Scalar>* red = reducer_.get();
        family_.set_grads_final([red](std::size_t first_param) { red->grads_final(first_param); });
      } else {
        family_.set_grads_final(nullptr);
      }
    }
  }
  bool micro_batched() const { return reducer_ != nullptr; }

  /// The precision of the products of the family's forward/backward passes and of hooks.evaluate (see the file
  /// comment); fp32 by default.
  void set_precision(Precision p) { precision_ = p; }
  Precision precision() const { return precision_; }

  /// Steps first+1 .. hooks.steps (see the file comment). Returns the number of steps run. NonFiniteError (on every
  /// rank) naming the step and the checkpoint kept; dist::RankFailed on every rank when a rank failed.
  std::int64_t run(std::int64_t first, const Batches& batches, const Hooks& h) {
    const auto t0 = std::chrono::steady_clock::now();
    std::int64_t done = 0;
    try {
      for (std::int64_t s = first + 1; s <= h.steps; ++s) {
        Batch b;
        const Step st = take_step(s, batches, b);
        ++done;
        if (h.on_step) h.on_step(st, b);
        const double rate = static_cast<double>(done) / std::max(seconds_since(t0), 1e-9);
        // logged steps depend on the step number alone (a resumed run logs what an uninterrupted one does); the
        // console also keeps the first step of a resumed run
        const bool log_now = s % h.log_every == 0 || s == 1 || s == h.steps;
        if (log_now && h.log && h.log->is_open()) h.log->write(log_line(st, b, rate, h));
        if (h.progress)
          h.progress->show(fmt::format("step {:>6}/{}  {}  {:.2f} it/s  ETA {}", s, h.steps,
                                       h.progress_fields ? h.progress_fields(st) : std::string(), rate,
                                       format_duration(static_cast<double>(h.steps - s) / rate)),
                           log_now || s == first + 1);
        if ((h.eval_every > 0 && s % h.eval_every == 0) || s == h.steps) evaluate(h, s);
      }
    } catch (const NonFiniteError& e) {
      if (h.progress) h.progress->finish_line();
      throw NonFiniteError("dea: " + without_error_prefix(e.what()) + " The last good checkpoint in " +
                           h.checkpoint_dir + " is kept.");  // (on every rank alike)
    } catch (const dist::RankFailed&) {
      if (h.progress) h.progress->finish_line();
      throw;
    }
    if (done == 0 && h.evaluate_when_idle) evaluate(h, first);
    return done;
  }

  /// One optimiser step on `b`, the batch of step `step` (1-based). NonFiniteError when the loss or a gradient
  /// norm is not finite (before the optimiser step).
  Step step(const Batch& b, std::int64_t step) {
    Step s;
    s.step = step;
    Rng drng(stream_seed(seed_, kDropoutStream, static_cast<std::uint64_t>(step)));
    s.losses = forward_backward(b, step, 0, drng);
    if (!s.losses.finite())
      throw NonFiniteError(fmt::format("dea: non-finite loss at step {} ({}); stopping.", step,
                                       family_.describe(s.losses)));
    update(s);
    return s;
  }

  /// One optimiser step of step `step` as micro-batches (set_micro_batches): rows(k) gives micro-batch k's example
  /// count (0: empty), micro(k) its batch (called for this rank's micro-batches only). `first` receives the batch
  /// of this rank's first micro-batch. NonFiniteError on every rank when a loss is not finite on any rank, or the
  /// gradient norm is not; dist::RankFailed on every rank when micro() or the family threw on one.
  template <class RowsFn, class MicroFn>
  Step step_micro(std::int64_t step, RowsFn&& rows, MicroFn&& micro, Batch* first = nullptr) {
    check(reducer_ != nullptr, "Trainer::step_micro: set_micro_batches first");
    dist::GradientReducer<Scalar>& red = *reducer_;
    const std::int64_t M = red.micro_batches();
    std::vector<double> weight(static_cast<std::size_t>(M));
    double total = 0;
    for (std::int64_t k = 0; k < M; ++k)
      total += static_cast<double>(weight[static_cast<std::size_t>(k)] = static_cast<double>(rows(k)));
    check(total > 0, "Trainer::step_micro: the batch of step ", step, " is empty");
    for (double& w : weight) w /= total;
    const dist::LeafRange lr = red.local();
    std::vector<double> mine(static_cast<std::size_t>(lr.size()) * kGathered, 0.0);
    RankStatus status = RankStatus::ok;
    std::string message;
    try {
      red.begin();
      for (const std::int64_t k : red.local_order()) {  // last to first
        const double w = weight[static_cast<std::size_t>(k)];
        if (w == 0) {
          red.add_zero(k);
          continue;
        }
        Batch b = micro(k);
        Rng drng(micro_stream_seed(seed_, kDropoutStream, static_cast<std::uint64_t>(step),
                                   static_cast<std::uint64_t>(k)));
        red.start(k, static_cast<Scalar>(w));
        const Losses l = forward_backward(b, step, k, drng);
        if (!l.finite())
          throw NonFiniteError(fmt::format("dea: non-finite loss at step {}, micro-batch {} of {}{} ({}); stopping.",
                                           step, k, M, rank_tag(), family_.describe(l)));
        red.add(k, static_cast<Scalar>(w));
        double* v = &mine[static_cast<std::size_t>(k - lr.first) * kGathered];
        v[0] = l.task;
        v[1] = l.gate;
        v[2] = l.extra;
        v[3] = static_cast<double>(l.count);
        if (first && k == lr.first) *first = std::move(b);
      }
    } catch (const std::exception& e) {
      if (comm_->size() == 1) throw;
      const bool non_finite = dynamic_cast<const NonFiniteError*>(&e) != nullptr;
      status = non_finite ? RankStatus::non_finite : RankStatus::failed;
      message = non_finite ? std::string(e.what()) : dist::rank_message(*comm_, e.what());
    }
    if (comm_->size() > 1) red.complete();  // every rank takes part in the exchange, a failed one too
    agree(status, message);
    const std::vector<double> all = red.gather(mine, kGathered);
    red.finish();
    Step s;
    s.step = step;
    for (std::int64_t k = 0; k < M; ++k) {  // in micro-batch order
      const double w = weight[static_cast<std::size_t>(k)];
      const double* v = &all[static_cast<std::size_t>(k) * kGathered];
      s.losses.task += w * v[0];
      s.losses.gate += w * v[1];
      s.losses.extra += w * v[2];
      s.losses.count += static_cast<std::int64_t>(v[3]);
    }
    s.comm_seconds = red.comm_seconds();
    s.exchange = red.stats();
    update(s);
    return s;
  }

  Family& family() { return family_; }
  optim::AdamW<Scalar>& optimizer() { return opt_; }

private:
  static constexpr std::size_t kGathered = 4;  // the values of Losses a micro-batch contributes

  static double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  Step take_step(std::int64_t s, const Batches& batches, Batch& first) {
    const auto t0 = std::chrono::steady_clock::now();
    Step st;
    if (micro_batched()) {
      st = step_micro(
          s, [&](std::int64_t k) { return batches.rows(s, k); }, [&](std::int64_t k) { return batches.micro(s, k); },
          &first);
    } else {
      first = batches.whole(s);
      st = step(first, s);
    }
    st.seconds = seconds_since(t0);
    return st;
  }

  /// zero_grad, the family's forward/backward, and the fault (when installed) on its task loss.
  Losses forward_backward(const Batch& b, std::int64_t step, std::int64_t micro, Rng& dropout) {
    opt_.zero_grad();
    const ScopedPrecision products(precision_);
    Losses l = family_.forward_backward(b, step, dropout);
    if (fault_) l.task = fault_(l.task, step, micro);
    return l;
  }

  /// Clipping, the non-finite norm check, the learning rate of the step and the optimiser step.
  void update(Step& s) {
    s.norms = opt_.clip_grad_norms();
    if (!s.norms.all_finite())
      throw NonFiniteError(fmt::format("dea: non-finite gradient norm at step {}{}; stopping.", s.step,
                                       family_.describe(s.norms)));
    if (lr_main_) {
      s.lr = lr_main_(s.step);
      opt_.set_lr("main", s.lr);
    }
    opt_.step();
  }

  /// Every rank's status exchanged: NonFiniteError or dist::RankFailed on every rank when one failed.
  void agree(RankStatus status, const std::string& message) {
    if (comm_->size() == 1) return;
    const dist::Agreement a = comm_->agree(static_cast<int>(status), message);
    if (a.ok) return;
    if (a.status == static_cast<int>(RankStatus::non_finite)) throw NonFiniteError(a.message);
    throw dist::RankFailed(a);
  }

  /// " (rank r of R)" on several ranks, else "".
  std::string rank_tag() const {
    return comm_->size() > 1 ? fmt::format(" (rank {} of {})", comm_->rank(), comm_->size()) : std::string();
  }

  nlohmann::json log_line(const Step& st, const Batch& b, double rate, const Hooks& h) const {
    nlohmann::json j;
    j["step"] = st.step;
    if (h.log_fields) h.log_fields(st, b, j);
    j["steps_per_s"] = rate;
    return j;
  }

  /// hooks.evaluate_shared on every rank, then hooks.evaluate and hooks.checkpoint on rank 0; a failure stops every
  /// rank.
  void evaluate(const Hooks& h, std::int64_t step) {
    if (h.evaluate_shared) {
      const ScopedPrecision products(precision_);
      h.evaluate_shared(step);
    }
    auto on_root = [&] {
      if (comm_ && comm_->rank() != 0) return;
      if (h.evaluate) {
        const ScopedPrecision products(precision_);
        h.evaluate(step);
      }
      if (h.checkpoint) h.checkpoint(step);
    };
    if (comm_) return dist::together(*comm_, on_root);
    on_root();
  }

  Family& family_;
  optim::AdamW<Scalar>& opt_;
  std::uint64_t seed_;
  std::function<double(std::int64_t)> lr_main_;
  LossFault fault_;
  Precision precision_ = Precision::fp32;
  dist::Comm* comm_ = nullptr;
  std::unique_ptr<dist::GradientReducer<Scalar>> reducer_;
};

}  // namespace dea::train
