// dea/dist/reducer.hpp: one data-parallel optimiser step's gradient, as a trainer uses it.
//
// The global batch of a step is M micro-batches (M a power of two); rank r of R computes the micro-batches
// [r M/R, (r+1) M/R). For each, the trainer zeroes the gradients, runs forward and backward on the micro-batch
// alone and hands the gradients to add(k, weight) (weight w_k: the micro-batch's share of the global mean, 1/M
// when the micro-batches are equal). finish() then allgathers the R subtree sums, finishes the tree on every rank
// in the same order and writes the root into the parameters' gradients, so that every rank holds the same bits,
// which are the bits one process computes for the same M:
//
//   dist::GradientReducer<float> red(model.parameters(), comm, M);
//   red.begin();
//   for (std::int64_t k : red.local_order()) {            // this rank's micro-batches, last to first
//     opt.zero_grad();
//     model.forward_backward(micro_batch(k), ...);
//     red.add(k, 1.0f / M);
//   }
//   dist::agree_or_throw(comm, status, message);         // a rank that failed stops every rank
//   red.finish();                                        // the gradients of the global batch, on every rank
//   opt.clip_grad_norms(); opt.step();
//
// The local order is last to first, so that the model's caches and telemetry end on the rank's first micro-batch:
// rank 0's is micro-batch 0 for every R, and what a program logs from them is the same for every R.
//
// Per micro-batch scalars (losses, counts) are gathered in micro-batch order with gather(); the caller sums them
// in that order.
#pragma once

#include "../core/error.hpp"
#include "../core/param.hpp"
#include "comm.hpp"
#include "grad_buffer.hpp"
#include "tree_sum.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace dea::dist {

template <class S>
class GradientReducer {
public:
  GradientReducer(ParamList<S> params, Comm& comm, std::int64_t micro_batches)
      : params_(std::move(params)),
        comm_(comm),
        m_(micro_batches),
        range_(leaf_range(micro_batches, comm.size(), comm.rank())),
        n_(grad_size(params_)),
        acc_(n_) {}

  std::int64_t micro_batches() const { return m_; }
  /// This rank's micro-batches [first, last).
  LeafRange local() const { return range_; }
  /// This rank's micro-batches in the order to run them: last to first.
  std::vector<std::int64_t> local_order() const {
    std::vector<std::int64_t> v;
    for (std::int64_t k = range_.last - 1; k >= range_.first; --k) v.push_back(k);
    return v;
  }
  /// Elements of the gradient buffer (every parameter's gradient).
  std::size_t size() const { return n_; }

  /// Starts a step.
  void begin() {
    acc_.clear();
    comm_seconds_ = 0;
  }

  /// The parameters' gradients now, scaled by `weight`, as micro-batch k's leaf.
  void add(std::int64_t k, S weight) {
    check(k >= range_.first && k < range_.last, "GradientReducer::add: micro-batch ", k, " is not this rank's [",
          range_.first, ", ", range_.last, ")");
    flatten_grads(params_, acc_.leaf(), weight);
    acc_.push(k);
  }
  /// An empty micro-batch k (a short last batch of an epoch): a leaf of zeros.
  void add_zero(std::int64_t k) {
    check(k >= range_.first && k < range_.last, "GradientReducer::add_zero: micro-batch ", k, " is not this rank's");
    std::fill(acc_.leaf(), acc_.leaf() + n_, S(0));
    acc_.push(k);
  }

  /// Every rank's subtree sum gathered, the tree finished in its fixed order, the root written into the parameters'
  /// gradients (on every rank).
  void finish() {
    const S* mine = acc_.result();
    if (comm_.size() == 1) {
      unflatten_grads(params_, mine);
      return;
    }
    gathered_.resize(n_ * static_cast<std::size_t>(comm_.size()));
    const auto t0 = std::chrono::steady_clock::now();
    comm_.allgather_bytes(mine, n_ * sizeof(S), gathered_.data());
    comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::vector<const S*> sums;
    for (int r = 0; r < comm_.size(); ++r) sums.push_back(gathered_.data() + n_ * static_cast<std::size_t>(r));
    tree_sum(sums, n_, gathered_.data());  // the root into rank 0's slot
    unflatten_grads(params_, gathered_.data());
  }

  /// Every rank's per-micro-batch scalars (`mine`: per_micro values for each of this rank's micro-batches, in
  /// micro-batch order first to last), as M * per_micro values in micro-batch order.
  std::vector<double> gather(const std::vector<double>& mine, std::size_t per_micro) {
    const std::size_t local = static_cast<std::size_t>(range_.size()) * per_micro;
    check(mine.size() == local, "GradientReducer::gather: expected ", local, " values, got ", mine.size());
    std::vector<double> all(local * static_cast<std::size_t>(comm_.size()));
    const auto t0 = std::chrono::steady_clock::now();
    comm_.allgather(mine.data(), local, all.data());
    comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return all;
  }

  /// Seconds this step spent in the transport (allgathers; 0 on one rank).
  double comm_seconds() const { return comm_seconds_; }

private:
  ParamList<S> params_;
  Comm& comm_;
  std::int64_t m_;
  LeafRange range_;
  std::size_t n_;
  TreeAccumulator<S> acc_;
  std::vector<S> gathered_;
  double comm_seconds_ = 0;
};

/// Runs f() on every rank of `comm` and then agrees: when f threw on some rank, every rank throws RankFailed with
/// the lowest failing rank's message ("rank r of R: ..."). On one rank f() simply runs (its exceptions unchanged).
template <class F>
void together(Comm& comm, F&& f) {
  if (comm.size() == 1) {
    f();
    return;
  }
  int status = 0;
  std::string message;
  try {
    f();
  } catch (const RankFailed&) {
    throw;
  } catch (const std::exception& e) {
    status = 1;
    message = rank_message(comm, e.what());
  }
  agree_or_throw(comm, status, message);
}

}  // namespace dea::dist
