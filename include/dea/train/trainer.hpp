// dea/train/trainer.hpp: the training loop, generic over the model: one optimiser step, the evaluation pass and
// the loop that calls the program's hooks (logging, the progress line, plots, probes, checkpoints).
//
// The model type provides what TransformerModel provides:
//   using Scalar; struct Cache;
//   Output forward(const Batch&, Scalar gamma_mix, bool training, Rng* dropout_rng, Cache&);  // Output has
//                                                                     // task_loss and loss_gate
//   void backward(Cache&);            // adds d(task_loss + loss_gate) into the parameters' gradients
//   parameters()                      // the ParamList the optimiser was built on
// Step s (1-based) draws its dropout masks from Rng(stream_seed(seed, kDropoutStream, s)) and mixes the oracle with
// gamma_mix(s - 1, gamma_steps), so a run resumed at step k continues as the uninterrupted run does.
//
// A program's loop, written with it:
//   train::Trainer<Model> t(model, opt, seed, gamma_steps);
//   for (std::int64_t s = step0 + 1; s <= steps; ++s) {
//     const auto st = t.step(batch_of(s), s);       // forward, backward, clip, AdamW
//     fmt::print("step {} loss {}\n", s, st.task_loss);
//   }
// or t.run(step0, steps, batch_of, hooks), which calls hooks.on_step after each step and hooks.on_eval every
// eval_every steps and at the last.
//
// Micro-batches and ranks (docs/scale.md): after t.set_micro_batches(comm, M), step_micro() runs a step as M
// micro-batches, this rank's share of them (dist/reducer.hpp): micro-batch k's gradient alone (its dropout masks
// from Rng(micro_stream_seed(seed, kDropoutStream, s, k))), weighted by its share of the batch's examples, summed
// in the fixed tree, then clipping and AdamW as in step(). The step's task_loss and loss_gate are the weighted
// sums of the micro-batches' losses in micro-batch order; the cache and output are those of the rank's first
// micro-batch (micro-batch 0 on rank 0). run() then calls micro(s, k) for the batch of micro-batch k and rows(s, k)
// for its example count.
#pragma once

#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "../dist/comm.hpp"
#include "../dist/grad_buffer.hpp"
#include "../dist/reducer.hpp"
#include "../nn/transformer.hpp"
#include "../optim/adamw.hpp"
#include "../optim/schedule.hpp"
#include "seeds.hpp"

#include <fmt/core.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
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

/// Fault injection, for testing the failure paths end to end: with the environment variable
/// DEA_INJECT_NONFINITE_LOSS=STEP:MICRO, the loss of micro-batch MICRO (0 when a step is one batch) at step STEP
/// reads as NaN on whichever rank computes it, as if that micro-batch's data had driven it there; the run then stops
/// as a genuine non-finite loss stops it. Unset (the normal case) it costs one comparison per micro-batch.
struct InjectedFault {
  std::int64_t step = -1, micro = -1;
};

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

/// The loss of micro-batch `micro` at step `step`, or NaN where DEA_INJECT_NONFINITE_LOSS names them.
inline double with_injected_fault(double loss, std::int64_t step, std::int64_t micro) {
  static const char* const kName = "DEA_INJECT_NONFINITE_LOSS";
  static const InjectedFault f = parse_injected_fault(kName, std::getenv(kName));
  return f.step == step && f.micro == micro ? std::nan("") : loss;
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

/// Evaluation mode (gamma 0, no dropout) over batches 0 .. n-1 of `model`: batch(k) gives batch k, and
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

template <class Model, class Batch = nn::ModelBatch<typename Model::Scalar>>
class Trainer {
public:
  using Scalar = typename Model::Scalar;
  using Cache = typename Model::Cache;
  using Output = decltype(std::declval<Model&>().forward(std::declval<const Batch&>(), Scalar(), true,
                                                         static_cast<Rng*>(nullptr), std::declval<Cache&>()));

  /// What one step did.
  struct Step {
    std::int64_t step = 0;
    Scalar gamma = 0;
    double task_loss = 0, loss_gate = 0;
    optim::GradNorms norms;
  };

  /// What the loop calls (each may be empty).
  struct Hooks {
    std::int64_t eval_every = 0;                                   ///< 0: on_eval only after the last step
    std::function<void(const Step&, const Batch&)> on_step;       ///< after every step
    std::function<void(std::int64_t step)> on_eval;                ///< every eval_every steps and after the last
  };

  Trainer(Model& model, optim::AdamW<Scalar>& opt, std::uint64_t seed, std::int64_t gamma_steps)
      : model_(model), opt_(opt), seed_(seed), gamma_steps_(gamma_steps) {}

  /// One optimiser step on `b`, the batch of step `step` (1-based). NonFiniteError when the loss or a gradient
  /// norm is not finite (before the optimiser step).
  Step step(const Batch& b, std::int64_t step) {
    Step s;
    s.step = step;
    s.gamma = optim::gamma_mix<Scalar>(step - 1, gamma_steps_);
    Rng drng(stream_seed(seed_, kDropoutStream, static_cast<std::uint64_t>(step)));
    out_ = model_.forward(b, s.gamma, true, &drng, cache_);
    s.task_loss = with_injected_fault(static_cast<double>(out_.task_loss), step, 0);
    s.loss_gate = static_cast<double>(out_.loss_gate);
    if (!std::isfinite(s.task_loss) || !std::isfinite(s.loss_gate))
      throw NonFiniteError(fmt::format("dea: non-finite loss at step {} (task_loss {}, loss_gate {}); stopping.", step,
                                       s.task_loss, s.loss_gate));
    opt_.zero_grad();
    model_.backward(cache_);
    s.norms = opt_.clip_grad_norms();
    if (!s.norms.all_finite()) {
      std::string groups;
      for (const auto& kv : s.norms.norm) groups += fmt::format("{}{} {}", groups.empty() ? "" : ", ", kv.first, kv.second);
      throw NonFiniteError(fmt::format("dea: non-finite gradient norm at step {} ({}); stopping.", step, groups));
    }
    opt_.step();
    return s;
  }

  /// Steps first+1 .. last; batch(step) gives each step's batch. Returns the number of steps run.
  template <class BatchFn>
  std::int64_t run(std::int64_t first, std::int64_t last, BatchFn&& batch, const Hooks& h) {
    std::int64_t done = 0;
    for (std::int64_t s = first + 1; s <= last; ++s) {
      const Batch b = batch(s);
      const Step st = step(b, s);
      ++done;
      if (h.on_step) h.on_step(st, b);
      if (h.on_eval && ((h.eval_every > 0 && s % h.eval_every == 0) || s == last)) h.on_eval(s);
    }
    return done;
  }

  /// Steps run as `micro_batches` micro-batches on the ranks of `comm` (see the file comment).
  void set_micro_batches(dist::Comm& comm, std::int64_t micro_batches) {
    comm_ = &comm;
    reducer_ = std::make_unique<dist::GradientReducer<Scalar>>(model_.parameters(), comm, micro_batches);
  }
  bool micro_batched() const { return reducer_ != nullptr; }
  /// Seconds the last step spent in the transport.
  double comm_seconds() const { return reducer_ ? reducer_->comm_seconds() : 0.0; }

  /// One optimiser step of step `step` as micro-batches: rows(k) gives micro-batch k's example count (0: empty),
  /// micro(k) its batch (called for this rank's micro-batches only). `first` receives the batch of this rank's
  /// first micro-batch (whose cache and output the trainer keeps). NonFiniteError on every rank when a loss is not
  /// finite on any rank, or the gradient norm is not; dist::RankFailed on every rank when micro() threw on one.
  template <class RowsFn, class MicroFn>
  Step step_micro(std::int64_t step, RowsFn&& rows, MicroFn&& micro, Batch* first = nullptr) {
    check(reducer_ != nullptr, "Trainer::step_micro: set_micro_batches first");
    dist::GradientReducer<Scalar>& red = *reducer_;
    const std::int64_t M = red.micro_batches();
    Step s;
    s.step = step;
    s.gamma = optim::gamma_mix<Scalar>(step - 1, gamma_steps_);
    std::vector<double> weight(static_cast<std::size_t>(M));
    double total = 0;
    for (std::int64_t k = 0; k < M; ++k) total += static_cast<double>(weight[static_cast<std::size_t>(k)] =
                                                                          static_cast<double>(rows(k)));
    check(total > 0, "Trainer::step_micro: the batch of step ", step, " is empty");
    for (double& w : weight) w /= total;
    const dist::LeafRange lr = red.local();
    std::vector<double> mine(static_cast<std::size_t>(lr.size()) * 2, 0.0);
    int status = 0;
    std::string message;
    try {
      red.begin();
      for (const std::int64_t k : red.local_order()) {
        const double w = weight[static_cast<std::size_t>(k)];
        if (w == 0) {
          red.add_zero(k);
          continue;
        }
        Batch b = micro(k);
        Rng drng(micro_stream_seed(seed_, kDropoutStream, static_cast<std::uint64_t>(step), static_cast<std::uint64_t>(k)));
        out_ = model_.forward(b, s.gamma, true, &drng, cache_);
        const double task = with_injected_fault(static_cast<double>(out_.task_loss), step, k);
        const double gate = static_cast<double>(out_.loss_gate);
        if (!std::isfinite(task) || !std::isfinite(gate))
          throw NonFiniteError(fmt::format("dea: non-finite loss at step {}, micro-batch {} of {}{} (task_loss {}, "
                                           "loss_gate {}); stopping.", step, k, M,
                                           comm_->size() > 1 ? fmt::format(" (rank {} of {})", comm_->rank(),
                                                                           comm_->size())
                                                             : std::string(),
                                           task, gate));
        opt_.zero_grad();
        model_.backward(cache_);
        red.add(k, static_cast<Scalar>(w));
        mine[static_cast<std::size_t>(k - lr.first) * 2] = task;
        mine[static_cast<std::size_t>(k - lr.first) * 2 + 1] = gate;
        if (first && k == lr.first) *first = std::move(b);
      }
    } catch (const std::exception& e) {
      if (comm_->size() == 1) throw;
      status = dynamic_cast<const NonFiniteError*>(&e) ? 3 : 1;
      message = status == 1 ? dist::rank_message(*comm_, e.what()) : std::string(e.what());
    }
    if (comm_->size() > 1) {
      const dist::Agreement a = comm_->agree(status, message);
      if (!a.ok) {
        if (a.status == 3) throw NonFiniteError(a.message);
        throw dist::RankFailed(a);
      }
    }
    const std::vector<double> all = red.gather(mine, 2);
    red.finish();
    for (std::int64_t k = 0; k < M; ++k) {  // in micro-batch order
      s.task_loss += weight[static_cast<std::size_t>(k)] * all[static_cast<std::size_t>(k) * 2];
      s.loss_gate += weight[static_cast<std::size_t>(k)] * all[static_cast<std::size_t>(k) * 2 + 1];
    }
    s.norms = opt_.clip_grad_norms();
    if (!s.norms.all_finite()) {
      std::string groups;
      for (const auto& kv : s.norms.norm) groups += fmt::format("{}{} {}", groups.empty() ? "" : ", ", kv.first, kv.second);
      throw NonFiniteError(fmt::format("dea: non-finite gradient norm at step {} ({}); stopping.", step, groups));
    }
    opt_.step();
    return s;
  }

  /// Steps first+1 .. last as micro-batches (set_micro_batches): rows(step, k) and micro(step, k) give micro-batch
  /// k's example count and batch; hooks.on_step sees the batch of this rank's first micro-batch.
  template <class RowsFn, class MicroFn>
  std::int64_t run_micro(std::int64_t first, std::int64_t last, RowsFn&& rows, MicroFn&& micro, const Hooks& h) {
    std::int64_t done = 0;
    for (std::int64_t s = first + 1; s <= last; ++s) {
      Batch b;
      const Step st = step_micro(
          s, [&](std::int64_t k) { return rows(s, k); }, [&](std::int64_t k) { return micro(s, k); }, &b);
      ++done;
      if (h.on_step) h.on_step(st, b);
      if (h.on_eval && ((h.eval_every > 0 && s % h.eval_every == 0) || s == last)) h.on_eval(s);
    }
    return done;
  }

  /// Evaluation mode over batches 0 .. n-1 (see evaluation_pass).
  template <class BatchFn, class Visit>
  void evaluate(std::size_t n, BatchFn&& batch, Visit&& visit) {
    evaluation_pass(model_, n, std::forward<BatchFn>(batch), std::forward<Visit>(visit));
  }

  Model& model() { return model_; }
  optim::AdamW<Scalar>& optimizer() { return opt_; }
  /// The forward cache and output of the last step (hooks read the attention maps from it).
  const Cache& cache() const { return cache_; }
  const Output& output() const { return out_; }

private:
  Model& model_;
  optim::AdamW<Scalar>& opt_;
  std::uint64_t seed_;
  std::int64_t gamma_steps_;
  Cache cache_;
  Output out_{};
  dist::Comm* comm_ = nullptr;
  std::unique_ptr<dist::GradientReducer<Scalar>> reducer_;
};

/// The console's progress line: on a terminal one line rewritten in place (and kept at the steps asked for),
/// elsewhere only the kept lines.
class ProgressLine {
public:
  explicit ProgressLine(bool enabled) : on_(enabled), tty_(enabled && stdout_is_tty()) {}
  bool tty() const { return tty_; }
  /// Shows `text`; `keep` ends the line (on a terminal the next one starts below it).
  void show(const std::string& text, bool keep) {
    if (!on_ || (!tty_ && !keep)) return;
    fmt::print("{}{}{}", tty_ ? "\r" : "", text, tty_ ? (keep ? "\n" : "   ") : "\n");
    std::fflush(stdout);
    open_ = tty_ && !keep;
  }
  /// Ends a rewritten line before other output.
  void finish_line() {
    if (open_) fmt::print("\n");
    open_ = false;
  }

  static bool stdout_is_tty() {
#if defined(__unix__) || defined(__APPLE__)
    return ::isatty(::fileno(stdout)) != 0;
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

}  // namespace dea::train
