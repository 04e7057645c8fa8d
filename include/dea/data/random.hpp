// dea/data/random.hpp: sampling helpers over dea::Rng used by the data pipeline (choice, sample without
// replacement, Fisher-Yates shuffle). Every random decision of data/ goes through these, so a seed fixes
// the whole pipeline on every platform. (The streams differ from Python's `random`; only determinism per seed
// is promised, not equality with the reference's draws.)
#pragma once

#include "../core/error.hpp"
#include "../core/rng.hpp"

#include <cstddef>
#include <numeric>
#include <utility>
#include <vector>

namespace dea::data {

/// Uniform index in [0, n); n must be positive.
inline std::size_t random_index(Rng& rng, std::size_t n) {
  check(n > 0, "random_index: cannot choose from an empty range");
  return static_cast<std::size_t>(rng.below(static_cast<std::uint64_t>(n)));
}

/// Uniformly chosen element of a non-empty container (arrays, vectors).
template <class C>
const typename C::value_type& choice(Rng& rng, const C& c) {
  check(!c.empty(), "choice: empty container");
  return c[random_index(rng, c.size())];
}

/// In-place Fisher-Yates shuffle (from the back: position i swaps with a uniform j in [0, i]).
template <class T>
void shuffle(std::vector<T>& v, Rng& rng) {
  for (std::size_t i = v.size(); i > 1; --i) {
    const std::size_t j = random_index(rng, i);
    std::swap(v[i - 1], v[j]);
  }
}

/// k distinct indices of [0, n), in random order (partial Fisher-Yates). Requires k <= n.
inline std::vector<std::size_t> sample_indices(Rng& rng, std::size_t n, std::size_t k) {
  check(k <= n, "sample_indices: cannot draw ", k, " distinct items from ", n);
  std::vector<std::size_t> idx(n);
  std::iota(idx.begin(), idx.end(), std::size_t(0));
  for (std::size_t i = 0; i < k; ++i) {
    const std::size_t j = i + random_index(rng, n - i);
    std::swap(idx[i], idx[j]);
  }
  idx.resize(k);
  return idx;
}

/// k distinct elements of c, in random order.
template <class C>
std::vector<typename C::value_type> sample(Rng& rng, const C& c, std::size_t k) {
  std::vector<typename C::value_type> out;
  out.reserve(k);
  for (std::size_t i : sample_indices(rng, c.size(), k)) out.push_back(c[i]);
  return out;
}

}  // namespace dea::data
