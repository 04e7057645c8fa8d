// dea/train/dual_expert_family.hpp: the trainer's family (trainer.hpp) for a model with the Dual-Expert two-loss
// contract: the encoder (nn::TransformerModel) and DualExpertBert. The model provides
//   using Scalar; struct Cache;
//   Output forward(const Batch&, Scalar gamma_mix, bool training, Rng* dropout_rng, Cache&);  // Output has
//                                                                      // task_loss and loss_gate
//   void backward(Cache&);            // adds d(task_loss + loss_gate) into the parameters' gradients
//   parameters()                      // the ParamList the optimiser was built on
// Step s mixes the oracle with gamma_mix(s - 1, gamma_steps) (optim/schedule.hpp). The forward cache and output of
// the last forward stay for the run's hooks (the attention maps of the log and the plots).
#pragma once

#include "../core/param.hpp"
#include "../core/rng.hpp"
#include "../nn/transformer.hpp"
#include "../optim/adamw.hpp"
#include "../optim/schedule.hpp"
#include "trainer.hpp"

#include <fmt/core.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

namespace dea::train {

template <class Model, class BatchT = nn::ModelBatch<typename Model::Scalar>>
class DualExpertFamily {
public:
  using ModelType = Model;
  using Scalar = typename Model::Scalar;
  using Batch = BatchT;
  using Cache = typename Model::Cache;
  using Output = decltype(std::declval<Model&>().forward(std::declval<const Batch&>(), Scalar(), true,
                                                         static_cast<Rng*>(nullptr), std::declval<Cache&>()));

  DualExpertFamily(Model& model, std::int64_t gamma_steps) : model_(model), gamma_steps_(gamma_steps) {}

  ParamList<Scalar> parameters() { return model_.parameters(); }
  /// The model's report of final gradients during backward (the trainer's data-parallel exchange; empty: none).
  void set_grads_final(std::function<void(std::size_t)> f) { model_.set_grads_final(std::move(f)); }

  /// The oracle's share in the mix of step `step` (1-based).
  Scalar gamma(std::int64_t step) const { return optim::gamma_mix<Scalar>(step - 1, gamma_steps_); }

  /// Training forward at gamma(step) and, when both losses are finite, the backward pass.
  Losses forward_backward(const Batch& b, std::int64_t step, Rng& dropout) {
    out_ = model_.forward(b, gamma(step), true, &dropout, cache_);
    Losses l;
    l.task = static_cast<double>(out_.task_loss);
    l.gate = static_cast<double>(out_.loss_gate);
    if (l.finite()) model_.backward(cache_);
    return l;
  }

  std::string describe(const Losses& l) const { return fmt::format("task_loss {}, loss_gate {}", l.task, l.gate); }
  /// " (main 1.2, gate nan)": every group's norm.
  std::string describe(const optim::GradNorms& n) const {
    std::string groups;
    for (const auto& kv : n.norm) groups += fmt::format("{}{} {}", groups.empty() ? "" : ", ", kv.first, kv.second);
    return " (" + groups + ")";
  }

  Model& model() { return model_; }
  /// The forward cache and output of the last forward.
  const Cache& cache() const { return cache_; }
  const Output& output() const { return out_; }

private:
  Model& model_;
  std::int64_t gamma_steps_;
  Cache cache_;
  Output out_{};
};

}  // namespace dea::train
