// dea/dist/tree_sum.hpp: the fixed-order sum of M gradient buffers (M a power of two), the reduction that makes
// data-parallel training give the same bits for any number of ranks.
//
// The M micro-batch buffers are the leaves 0 .. M-1 of one complete binary tree; node (l, j) covers the leaves
// [j 2^l, (j+1) 2^l) and holds left + right, element by element (left the child of the lower leaves). The sum of an
// aligned range [a, b) (b - a a power of two, a a multiple of it) is the node over that range, so a rank that owns
// the micro-batches [r M/R, (r+1) M/R) computes exactly the node the single process computes over them
// (TreeAccumulator), and the R node sums finish the same tree (tree_sum over R leaves). IEEE addition is
// commutative (a + b and b + a give the same bits), so only the shape of the tree fixes the result; the order in
// which a rank visits its leaves and the threads an addition runs on change nothing.
//
//   dist::TreeAccumulator<float> acc(n);          // buffers of n elements
//   for (int k = k1 - 1; k >= k0; --k) {          // leaves of [k0, k1), either direction, one by one
//     float* leaf = acc.leaf();                   // fill it (flatten_grads) ...
//     acc.push(k);                                // ... and hand it over
//   }
//   const float* subtree = acc.result();          // the node over [k0, k1)
//   dist::tree_sum(subtree_sums_of_every_rank, n, out);   // the root
#pragma once

#include "../core/error.hpp"
#include "../core/parallel.hpp"
#include "../core/tensor.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace dea::dist {

inline bool is_power_of_two(std::int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

namespace detail {

/// Element blocks of the additions (a fixed split: each element is one addition, so any split gives the same bits).
constexpr std::size_t kAddBlock = std::size_t(1) << 15;

/// out[i] = left[i] + right[i] for i < n (out may alias left or right); on the library's threads when `parallel`
/// and n is large enough.
template <class S>
void add(const S* left, const S* right, S* out, std::size_t n, bool parallel = true) {
  const Index blocks = static_cast<Index>((n + kAddBlock - 1) / kAddBlock);
  parallel_for(
      blocks,
      [&](Index bi) {
        const std::size_t i0 = static_cast<std::size_t>(bi) * kAddBlock, i1 = std::min(n, i0 + kAddBlock);
        for (std::size_t i = i0; i < i1; ++i) out[i] = left[i] + right[i];
      },
      parallel && n >= 2 * kAddBlock);
}

}  // namespace detail

/// The root of the tree over `leaves` (their count a power of two, each n elements), into `out` (n elements; may
/// be one of the leaves). Level by level: leaves 2j and 2j+1 are added, then their sums, and so on. `parallel`
/// false keeps the additions on the calling thread (the same bits: each element is the same additions).
template <class S>
void tree_sum(const std::vector<const S*>& leaves, std::size_t n, S* out, bool parallel = true) {
  const std::size_t m = leaves.size();
  check(is_power_of_two(static_cast<std::int64_t>(m)), "dist::tree_sum: expected a power of two of leaves, got ", m);
  if (m == 1) {
    if (out != leaves[0]) std::copy(leaves[0], leaves[0] + n, out);
    return;
  }
  // level 1 into m/2 buffers, then in place
  std::vector<std::vector<S>> level(m / 2, std::vector<S>(n));
  for (std::size_t j = 0; j < m / 2; ++j)
    detail::add(leaves[2 * j], leaves[2 * j + 1], level[j].data(), n, parallel);
  for (std::size_t w = m / 2; w > 1; w /= 2)
    for (std::size_t j = 0; j < w / 2; ++j)
      detail::add(level[2 * j].data(), level[2 * j + 1].data(), level[j].data(), n, parallel);
  std::copy(level[0].begin(), level[0].end(), out);
}

/// The micro-batches [first, last) rank `rank` of `ranks` owns out of `micro_batches` (ranks dividing it).
struct LeafRange {
  std::int64_t first = 0, last = 1;
  std::int64_t size() const { return last - first; }
};
inline LeafRange leaf_range(std::int64_t micro_batches, int ranks, int rank) {
  check(is_power_of_two(micro_batches), "dist::leaf_range: the micro-batch count must be a power of two, got ",
        micro_batches);
  check(ranks >= 1 && micro_batches % ranks == 0, "dist::leaf_range: ", ranks, " ranks do not divide ", micro_batches,
        " micro-batches");
  check(rank >= 0 && rank < ranks, "dist::leaf_range: rank ", rank, " outside [0, ", ranks, ")");
  const std::int64_t per = micro_batches / ranks;
  return {rank * per, (rank + 1) * per};
}

/// The node over an aligned range of leaves, built one leaf at a time in ascending or descending order with
/// O(log n) buffers: a stack of finished nodes; a new node joins the one below it when the two are siblings (equal
/// size, adjacent, and their union aligned).
template <class S>
class TreeAccumulator {
public:
  explicit TreeAccumulator(std::size_t n) : n_(n) {}

  std::size_t size() const { return n_; }

  /// Forgets the leaves pushed so far (the buffers are kept), and ends an open push.
  void clear() {
    end_push();
    for (Node& nd : stack_) free_.push_back(std::move(nd.buf));
    stack_.clear();
    count_ = 0;
  }

  /// A buffer of size() elements for the next leaf (valid until push).
  S* leaf() {
    if (!next_) {
      if (!free_.empty()) {
        next_ = std::move(free_.back());
        free_.pop_back();
      } else {
        next_ = std::make_unique<S[]>(n_);
      }
    }
    return next_.get();
  }

  /// Takes the buffer of leaf() as leaf `index`. Leaves must come in a contiguous run, ascending or descending.
  void push(std::int64_t index) {
    begin_push(index);
    push_range(0, n_);
    end_push();
  }

  /// push(index) in three parts, so that its additions can run range by range as the leaf's elements become
  /// known: begin_push(index) takes leaf()'s buffer (whose elements may still be written until push_range covers
  /// them) and fixes the additions the leaf makes; push_range(a, b) runs them on the elements [a, b) (each element
  /// once, ranges in any order); end_push() ends the push. The additions are push's, element by element, so the
  /// bits are push's. pending_result() is the buffer that holds the node over every leaf once the ranges are run
  /// (when the leaves then form one aligned range).
  void begin_push(std::int64_t index) {
    check(ops_.empty() && held_.empty(), "dist::TreeAccumulator::begin_push: the push of a leaf is still open");
    leaf();
    if (count_ > 0)
      check(index == lo_ - 1 || index == hi_, "dist::TreeAccumulator::push: leaf ", index,
            " does not extend the run [", lo_, ", ", hi_, ")");
    lo_ = count_ ? std::min(lo_, index) : index;
    hi_ = count_ ? std::max(hi_, index + 1) : index + 1;
    ++count_;
    stack_.push_back(Node{index, index + 1, std::move(next_)});
    while (stack_.size() >= 2) {
      Node& a = stack_[stack_.size() - 1];
      Node& b = stack_[stack_.size() - 2];
      const std::int64_t w = a.hi - a.lo;
      if (b.hi - b.lo != w) break;
      Node& left = a.lo < b.lo ? a : b;
      Node& right = a.lo < b.lo ? b : a;
      if (left.hi != right.lo || left.lo % (2 * w) != 0) break;
      ops_.push_back(Op{left.buf.get(), right.buf.get(), b.buf.get()});  // into the lower stack entry
      const std::int64_t lo = left.lo, hi = right.hi;
      held_.push_back(std::move(a.buf));  // read by the additions until end_push
      stack_.pop_back();
      stack_.back().lo = lo;
      stack_.back().hi = hi;
    }
  }
  void push_range(std::size_t a, std::size_t b, bool parallel = true) {
    check(a <= b && b <= n_, "dist::TreeAccumulator::push_range: [", a, ", ", b, ") outside [0, ", n_, ")");
    for (const Op& op : ops_) detail::add(op.left + a, op.right + a, op.out + a, b - a, parallel);
  }
  void end_push() {
    ops_.clear();
    for (auto& buf : held_) free_.push_back(std::move(buf));
    held_.clear();
  }
  const S* pending_result() const { return stack_.empty() ? nullptr : stack_.front().buf.get(); }

  /// The node over the leaves pushed (dea::Error unless they form one aligned power-of-two range).
  const S* result() const {
    check(stack_.size() == 1, "dist::TreeAccumulator::result: the ", count_, " leaves [", lo_, ", ", hi_,
          ") are not one aligned power-of-two range");
    return stack_[0].buf.get();
  }
  S* result() { return const_cast<S*>(static_cast<const TreeAccumulator&>(*this).result()); }

private:
  struct Node {
    std::int64_t lo, hi;
    std::unique_ptr<S[]> buf;
  };
  std::size_t n_;
  struct Op {
    const S* left;
    const S* right;
    S* out;
  };
  std::vector<Node> stack_;
  std::vector<Op> ops_;                      // the additions of the open push
  std::vector<std::unique_ptr<S[]>> held_;   // buffers they read, freed by end_push
  std::vector<std::unique_ptr<S[]>> free_;
  std::unique_ptr<S[]> next_;
  std::int64_t lo_ = 0, hi_ = 0, count_ = 0;
};

}  // namespace dea::dist
