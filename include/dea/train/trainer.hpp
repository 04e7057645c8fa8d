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
#pragma once

#include "../core/error.hpp"
#include "../core/rng.hpp"
#include "../nn/transformer.hpp"
#include "../optim/adamw.hpp"
#include "../optim/schedule.hpp"
#include "seeds.hpp"

#include <fmt/core.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

namespace dea::train {

/// A training step met a non-finite loss or gradient norm (the parameters were not changed by it).
class NonFiniteError : public Error {
public:
  explicit NonFiniteError(const std::string& what) : Error(what) {}
};

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
    s.task_loss = static_cast<double>(out_.task_loss);
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
