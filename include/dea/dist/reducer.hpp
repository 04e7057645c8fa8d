// dea/dist/reducer.hpp: one data-parallel optimiser step's gradient, as a trainer uses it.
//
// The global batch of a step is M micro-batches (M a power of two); rank r of R computes the micro-batches
// [r M/R, (r+1) M/R). For each, the trainer zeroes the gradients, runs forward and backward on the micro-batch
// alone and hands the gradients to add(k, weight) (weight w_k: the micro-batch's share of the global mean, 1/M
// when the micro-batches are equal). The rank's micro-batches are summed in the fixed tree (dist/tree_sum.hpp) into
// its subtree sum; the R subtree sums are then exchanged and the tree finished, so that every rank holds the same
// bits, which are the bits one process computes for the same M:
//
//   dist::GradientReducer<float> red(model.parameters(), comm, M);     // ExchangeOptions: see below
//   model.set_grads_final([&](std::size_t i) { red.grads_final(i); }); // optional: overlap with backward
//   red.begin();
//   for (std::int64_t k : red.local_order()) {            // this rank's micro-batches, last to first
//     opt.zero_grad();
//     red.start(k, 1.0f / M);                             // optional: announces micro-batch k
//     model.forward_backward(micro_batch(k), ...);        // (its backward may call grads_final)
//     red.add(k, 1.0f / M);
//   }
//   red.complete();                                       // every rank, also one that failed: the exchange ends
//   dist::agree_or_throw(comm, status, message);          // a rank that failed stops every rank
//   red.finish();                                         // the gradients of the global batch, on every rank
//   opt.clip_grad_norms(); opt.step();
//
// The local order is last to first, so that the model's caches and telemetry end on the rank's first micro-batch:
// rank 0's is micro-batch 0 for every R, and what a program logs from them is the same for every R.
//
// Two exchanges (ExchangeOptions::exchange), the same bits:
//   allgather       finish() allgathers the R subtree sums (each rank receives 4P bytes for P float
//                   gradients) and finishes the tree on every rank, after the rank's last backward.
//   reduce_scatter  (the default) the flat gradient is cut into buckets of about bucket_mb MB, from its end (the
//                   last parameters, whose gradients backward finishes first) to its start; each bucket into R
//                   slices of equal length (the last ones padded), slice j owned by rank j. When a bucket of the
//                   rank's subtree sum is final, each rank sends slice j to rank j (alltoall), rank j finishes the
//                   tree over the R subtree sums of its slice (tree_sum, so the bits of one process), and the summed
//                   slices are allgathered into every rank's copy of the gradient: about 2 (R-1)/R 4P bytes sent and
//                   received per rank.
// A bucket is final when the rank's last micro-batch (the first of its range) has its gradients in that range:
// at add() at the latest, earlier when the backward reports with grads_final(i) that the gradients of parameters
// [i, end) will not change any more (after each layer, the models' set_grads_final hook). Then the rank's last leaf
// is added into its subtree range by range (TreeAccumulator::begin_push / push_range: the same additions) and the
// bucket's exchange runs on a communication thread while backward computes the next layer's gradients, when the
// transport allows calls from that thread (Comm::any_thread) and ExchangeOptions::overlap; otherwise complete()
// runs every bucket's exchange after the backward. A rank that failed still takes part in every bucket's exchange
// at complete() (with whatever its buffer holds), so that no rank waits forever; the status exchange after it stops
// every rank.
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
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dea::dist {

/// How the subtree sums of the ranks are exchanged (see the file comment); both give the same bits.
enum class Exchange { allgather, reduce_scatter };

inline const char* exchange_name(Exchange e) { return e == Exchange::allgather ? "allgather" : "reduce_scatter"; }
/// "allgather" or "reduce_scatter" (dea::Error otherwise).
inline Exchange parse_exchange(const std::string& s) {
  if (s == "allgather") return Exchange::allgather;
  check(s == "reduce_scatter", "exchange: expected allgather or reduce_scatter, got '", s, "'");
  return Exchange::reduce_scatter;
}

struct ExchangeOptions {
  Exchange exchange = Exchange::reduce_scatter;
  double bucket_mb = 4;  ///< reduce_scatter: about this many MB (10^6 bytes) per bucket (at least one element)
  bool overlap = true;   ///< reduce_scatter: exchange on a communication thread during backward (when allowed)
};

/// What one step's gradient exchange cost this rank (GradientReducer::stats(); reset by begin()).
struct ExchangeStats {
  double compute_seconds = 0;   ///< begin() .. complete(): this rank's micro-batches (forward, backward, its tree)
  double exposed_seconds = 0;   ///< the main thread waiting for the gradient exchange after its backward ended
  double hidden_seconds = 0;    ///< exchange time that ran while the main thread computed (overlapped)
  double exchange_seconds = 0;  ///< the whole gradient exchange (alltoall, slice trees, allgather; or allgather, tree)
  std::uint64_t bytes_sent = 0;      ///< gradient bytes this rank sent (what the exchange moves, not the wire's)
  std::uint64_t bytes_received = 0;  ///< gradient bytes this rank received
  std::size_t buckets = 0;           ///< buckets exchanged (reduce_scatter; 1 for allgather)
  bool overlapped = false;           ///< the exchange ran on the communication thread
};

template <class S>
class GradientReducer {
public:
  GradientReducer(ParamList<S> params, Comm& comm, std::int64_t micro_batches, ExchangeOptions opts = {})
      : params_(std::move(params)),
        comm_(comm),
        m_(micro_batches),
        range_(leaf_range(micro_batches, comm.size(), comm.rank())),
        opts_(opts),
        n_(grad_size(params_)),
        acc_(n_) {
    check(opts_.bucket_mb > 0, "GradientReducer: bucket_mb must be positive, got ", opts_.bucket_mb);
    if (bucketed()) out_.resize(n_);
    off_.assign(params_.size() + 1, 0);
    for (std::size_t i = 0; i < params_.size(); ++i)
      off_[i + 1] = off_[i] + static_cast<std::size_t>(params_[i]->grad.size());
    const double per = opts_.bucket_mb * 1e6 / static_cast<double>(sizeof(S));
    const std::size_t b = per >= static_cast<double>(n_) ? std::max<std::size_t>(n_, 1)
                                                           : std::max<std::size_t>(1, static_cast<std::size_t>(per));
    for (std::size_t hi = n_; hi > 0; hi -= std::min(hi, b)) buckets_.push_back({hi - std::min(hi, b), hi});
  }
  ~GradientReducer() { stop_worker(); }
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

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
  const ExchangeOptions& options() const { return opts_; }
  /// The reduce_scatter buckets as element ranges [first, second) of the gradient buffer, in exchange order (from
  /// the end of the buffer to its start).
  const std::vector<std::pair<std::size_t, std::size_t>>& buckets() const { return buckets_; }
  /// True when grads_final() can start exchanges early (reduce_scatter on more than one rank): only then is a
  /// model's hook worth installing.
  bool uses_grads_final() const { return bucketed(); }

  /// Starts a step.
  void begin() {
    acc_.clear();
    armed_ = false;
    completed_ = false;
    next_bucket_ = 0;
    src_ = nullptr;
    intervals_.clear();
    stats_ = ExchangeStats{};
    comm_seconds_ = 0;
    t_begin_ = Clock::now();
  }

  /// Announces micro-batch k (weight as add() will get it) before its forward and backward, so that grads_final()
  /// can hand the gradients of the rank's last micro-batch over range by range. Optional.
  void start(std::int64_t k, S weight) {
    check_local(k, "start");
    if (!bucketed() || k != range_.first) return;
    leaf_ = acc_.leaf();
    acc_.begin_push(k);
    src_ = acc_.pending_result();
    weight_ = weight;
    final_param_ = params_.size();
    armed_ = true;
  }

  /// The backward's report: the gradients of parameters [first_param, end) are final for the running micro-batch.
  /// Ignored except during the rank's last micro-batch (after start()) of a reduce_scatter step.
  void grads_final(std::size_t first_param) {
    if (!armed_ || first_param >= final_param_) return;
    for (std::size_t i = first_param; i < final_param_; ++i) {
      const Param<S>& p = *params_[i];
      S* o = leaf_ + off_[i];
      if (weight_ == S(1)) {
        if (p.grad.size()) std::memcpy(o, p.grad.data(), sizeof(S) * static_cast<std::size_t>(p.grad.size()));
      } else {
        for (Index k = 0; k < p.grad.size(); ++k) o[k] = weight_ * p.grad[k];
      }
    }
    final_param_ = first_param;
    release(off_[first_param]);
  }

  /// The parameters' gradients now, scaled by `weight`, as micro-batch k's leaf.
  void add(std::int64_t k, S weight) {
    check_local(k, "add");
    if (armed_ && k == range_.first) {
      check(weight == weight_, "GradientReducer::add: micro-batch ", k, " was started with another weight");
      grads_final(0);
      release(0);
      acc_.end_push();
      armed_ = false;
      return;
    }
    flatten_grads(params_, acc_.leaf(), weight);
    acc_.push(k);
  }
  /// An empty micro-batch k (a short last batch of an epoch): a leaf of zeros.
  void add_zero(std::int64_t k) {
    check_local(k, "add_zero");
    if (armed_ && k == range_.first) {
      std::fill(leaf_, leaf_ + n_, S(0));
      final_param_ = 0;
      release(0);
      acc_.end_push();
      armed_ = false;
      return;
    }
    std::fill(acc_.leaf(), acc_.leaf() + n_, S(0));
    acc_.push(k);
  }

  /// The end of the rank's micro-batches, on every rank (also on one whose micro-batch failed: it then sends what
  /// its buffers hold). reduce_scatter: every bucket's exchange done when it returns. allgather: nothing (finish()).
  void complete() {
    if (completed_) return;
    completed_ = true;
    const auto t_end = Clock::now();
    stats_.compute_seconds = seconds(t_begin_, t_end);
    if (!bucketed()) return;
    if (armed_) {  // the last micro-batch failed: the buckets not yet final go as they are
      acc_.end_push();
      armed_ = false;
    }
    if (!src_) src_ = acc_.pending_result();
    if (!src_) {
      zeros_.assign(n_, S(0));
      src_ = zeros_.data();
    }
    for (; next_bucket_ < buckets_.size(); ++next_bucket_) enqueue(next_bucket_);
    if (threaded()) {
      std::unique_lock<std::mutex> lock(mu_);
      done_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
    } else {
      for (std::size_t i = 0; i < buckets_.size(); ++i) exchange_bucket(i);
    }
    const auto t_done = Clock::now();
    stats_.exposed_seconds = seconds(t_end, t_done);
    for (const auto& iv : intervals_) {
      stats_.exchange_seconds += seconds(iv.first, iv.second);
      if (iv.first < t_end) stats_.hidden_seconds += seconds(iv.first, std::min(iv.second, t_end));
    }
    stats_.buckets = buckets_.size();
    stats_.overlapped = threaded();
    comm_seconds_ += stats_.exposed_seconds;
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }

  /// The sum of every rank's micro-batches, the tree finished in its fixed order, written into the parameters'
  /// gradients (on every rank).
  void finish() {
    complete();
    if (comm_.size() == 1) {
      unflatten_grads(params_, acc_.result());
      return;
    }
    if (bucketed()) {
      unflatten_grads(params_, out_.data());
      return;
    }
    const S* mine = acc_.result();
    const std::size_t R = static_cast<std::size_t>(comm_.size());
    gathered_.resize(n_ * R);
    const auto t0 = Clock::now();
    comm_.allgather_bytes(mine, n_ * sizeof(S), gathered_.data());
    std::vector<const S*> sums;
    for (std::size_t r = 0; r < R; ++r) sums.push_back(gathered_.data() + n_ * r);
    tree_sum(sums, n_, gathered_.data());  // the root into rank 0's slot
    const double t = seconds(t0, Clock::now());
    comm_seconds_ += t;
    stats_.exposed_seconds += t;
    stats_.exchange_seconds += t;
    stats_.bytes_sent += (R - 1) * n_ * sizeof(S);
    stats_.bytes_received += (R - 1) * n_ * sizeof(S);
    stats_.buckets = 1;
    unflatten_grads(params_, gathered_.data());
  }

  /// Every rank's per-micro-batch scalars (`mine`: per_micro values for each of this rank's micro-batches, in
  /// micro-batch order first to last), as M * per_micro values in micro-batch order. (Ends the gradient exchange
  /// first: complete().)
  std::vector<double> gather(const std::vector<double>& mine, std::size_t per_micro) {
    const std::size_t local = static_cast<std::size_t>(range_.size()) * per_micro;
    check(mine.size() == local, "GradientReducer::gather: expected ", local, " values, got ", mine.size());
    complete();
    std::vector<double> all(local * static_cast<std::size_t>(comm_.size()));
    const auto t0 = Clock::now();
    comm_.allgather(mine.data(), local, all.data());
    comm_seconds_ += seconds(t0, Clock::now());
    return all;
  }

  /// Seconds this step's main thread spent in the transport or waiting for it (0 on one rank).
  double comm_seconds() const { return comm_seconds_; }
  /// This step's exchange: compute, exposed and hidden exchange seconds, bytes (see ExchangeStats).
  const ExchangeStats& stats() const { return stats_; }

private:
  using Clock = std::chrono::steady_clock;
  static double seconds(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }

  bool bucketed() const { return opts_.exchange == Exchange::reduce_scatter && comm_.size() > 1; }
  bool threaded() const { return opts_.overlap && comm_.any_thread(); }

  void check_local(std::int64_t k, const char* what) const {
    check(k >= range_.first && k < range_.last, "GradientReducer::", what, ": micro-batch ", k,
          " is not this rank's [", range_.first, ", ", range_.last, ")");
  }

  /// The buckets that lie in [from, n) (their leaf elements final): their additions into the subtree, then their
  /// exchange.
  void release(std::size_t from) {
    while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].first >= from) {
      const auto& bk = buckets_[next_bucket_];
      acc_.push_range(bk.first, bk.second);
      enqueue(next_bucket_++);
    }
  }

  void enqueue(std::size_t i) {
    if (!threaded()) return;  // complete() runs them
    if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(i);
    }
    cv_.notify_one();
  }

  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_
      const std::size_t i = queue_.front();
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      try {
        if (!error_) exchange_bucket(i);
      } catch (...) {
        error_ = std::current_exception();
      }
      lock.lock();
      busy_ = false;
      if (queue_.empty()) done_cv_.notify_all();
    }
  }

  void stop_worker() {
    if (!worker_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  /// Bucket i: slice j of this rank's subtree sum to rank j, the tree over the R sums of this rank's slice, the
  /// summed slices gathered into out_ (on the communication thread, or the main thread without one).
  void exchange_bucket(std::size_t i) {
    const auto t0 = Clock::now();
    const std::size_t R = static_cast<std::size_t>(comm_.size());
    const std::size_t b0 = buckets_[i].first, len = buckets_[i].second - b0, s = (len + R - 1) / R;
    send_.assign(R * s, S(0));
    std::copy(src_ + b0, src_ + b0 + len, send_.begin());  // slice j at [j s, (j+1) s), the tail padded with 0
    recv_.resize(R * s);
    comm_.alltoall_bytes(send_.data(), s * sizeof(S), recv_.data());  // recv_[r s ..]: rank r's sum of my slice
    std::vector<const S*> sums;
    for (std::size_t r = 0; r < R; ++r) sums.push_back(recv_.data() + r * s);
    slice_.resize(s);
    tree_sum(sums, s, slice_.data(), false);
    send_.resize(R * s);  // the gathered slices, in rank order: the bucket, then the padding
    comm_.allgather_bytes(slice_.data(), s * sizeof(S), send_.data());
    std::copy(send_.begin(), send_.begin() + static_cast<std::ptrdiff_t>(len),
              out_.begin() + static_cast<std::ptrdiff_t>(b0));
    const auto t1 = Clock::now();
    std::lock_guard<std::mutex> lock(stats_mu_);
    intervals_.push_back({t0, t1});
    stats_.bytes_sent += 2 * (R - 1) * s * sizeof(S);
    stats_.bytes_received += 2 * (R - 1) * s * sizeof(S);
  }

  ParamList<S> params_;
  Comm& comm_;
  std::int64_t m_;
  LeafRange range_;
  ExchangeOptions opts_;
  std::size_t n_;
  TreeAccumulator<S> acc_;
  std::vector<std::size_t> off_;                                 // parameter i's gradient at [off_[i], off_[i+1])
  std::vector<std::pair<std::size_t, std::size_t>> buckets_;     // exchange order
  std::vector<S> gathered_;                                      // allgather: every rank's subtree sum
  std::vector<S> out_;                                           // reduce_scatter: the summed gradient
  std::vector<S> send_, recv_, slice_, zeros_;                   // the exchange's buffers
  // the rank's last micro-batch while its buckets become final
  bool armed_ = false, completed_ = false;
  S* leaf_ = nullptr;
  const S* src_ = nullptr;  // the subtree sum the buckets are sent from
  S weight_ = S(1);
  std::size_t final_param_ = 0, next_bucket_ = 0;
  // the communication thread
  std::thread worker_;
  std::mutex mu_, stats_mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::size_t> queue_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> intervals_;
  ExchangeStats stats_;
  Clock::time_point t_begin_ = Clock::now();
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
