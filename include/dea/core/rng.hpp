// dea/core/rng.hpp: the library's seeded random number generator and parameter initialisers.
//
// xoshiro256** seeded through splitmix64, so a seed gives the same stream on every platform and compiler
// (std::normal_distribution does not). Normals use the Box-Muller transform.
#pragma once

#include "param.hpp"

#include <Eigen/QR>
#include <cmath>
#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace dea {

class Rng {
public:
  explicit Rng(std::uint64_t seed = 42) { reseed(seed); }

  void reseed(std::uint64_t seed) {
    std::uint64_t x = seed;
    for (auto& s : s_) s = splitmix(x);
    has_spare_ = false;
  }

  /// Next 64 random bits.
  std::uint64_t next_u64() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

  /// Uniform integer in [0, n).
  std::uint64_t below(std::uint64_t n) {
    check(n > 0, "Rng::below: n must be positive");
    const std::uint64_t limit = ~std::uint64_t(0) - (~std::uint64_t(0) % n);
    std::uint64_t r;
    do r = next_u64();
    while (r >= limit);
    return r % n;
  }

  /// Standard normal N(0, 1).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1;
    do u1 = uniform();
    while (u1 <= 0.0);
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double th = 6.283185307179586 * u2;
    spare_ = r * std::sin(th);
    has_spare_ = true;
    return r * std::cos(th);
  }
  double normal(double mean, double stddev) { return mean + stddev * normal(); }

  /// State of the generator (to save it in a checkpoint and restore it bit for bit).
  std::array<std::uint64_t, 4> state() const { return s_; }
  void set_state(const std::array<std::uint64_t, 4>& s) {
    s_ = s;
    has_spare_ = false;
  }

private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static std::uint64_t splitmix(std::uint64_t& x) {
    std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  std::array<std::uint64_t, 4> s_{};
  double spare_ = 0.0;
  bool has_spare_ = false;
};

namespace init {

/// Fills a matrix, vector or Map (lvalue or temporary) with U(lo, hi).
template <class M>
void uniform(M&& m, Rng& rng, double lo, double hi) {
  using S = typename std::decay_t<M>::Scalar;
  for (Index r = 0; r < m.rows(); ++r)
    for (Index c = 0; c < m.cols(); ++c) m(r, c) = static_cast<S>(rng.uniform(lo, hi));
}

/// Fills with N(mean, std^2).
template <class M>
void normal(M&& m, Rng& rng, double mean, double stddev) {
  using S = typename std::decay_t<M>::Scalar;
  for (Index r = 0; r < m.rows(); ++r)
    for (Index c = 0; c < m.cols(); ++c) m(r, c) = static_cast<S>(rng.normal(mean, stddev));
}

/// Xavier (Glorot) uniform: U(-b, b), b = sqrt(6 / (fan_in + fan_out)).
template <class M>
void xavier_uniform(M&& m, Rng& rng, Index fan_in, Index fan_out) {
  const double b = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  uniform(std::forward<M>(m), rng, -b, b);
}

namespace detail {
/// The work of orthogonal(), in double whatever the scalar type: one instance serves every type. The project's
/// programs compile it once (cmake/instances/init.cpp, under DEA_EXTERN_TEMPLATES): HouseholderQR and its Q cost
/// g++ about 6 s of front-end time in every translation unit that instantiates it.
template <class Unused = void>
Eigen::MatrixXd orthogonal_double(Index n, Rng& rng) {
  Eigen::MatrixXd g(n, n);
  for (Index r = 0; r < n; ++r)
    for (Index c = 0; c < n; ++c) g(r, c) = rng.normal();
  Eigen::HouseholderQR<Eigen::MatrixXd> qr(g);
  Eigen::MatrixXd q = qr.householderQ();
  const Eigen::MatrixXd& rr = qr.matrixQR();
  for (Index c = 0; c < n; ++c)
    if (rr(c, c) < 0) q.col(c) = -q.col(c);
  return q;
}
#ifdef DEA_EXTERN_TEMPLATES
extern template Eigen::MatrixXd orthogonal_double<void>(Index n, Rng& rng);
#endif
}  // namespace detail

/// An orthogonal n x n matrix: Q of the QR decomposition of a Gaussian matrix, with the signs of R's
/// diagonal folded into Q so the distribution is uniform (Haar), as PyTorch's orthogonal_ does.
template <class S>
Mat<S> orthogonal(Index n, Rng& rng) {
  return detail::orthogonal_double(n, rng).cast<S>();
}

}  // namespace init
}  // namespace dea
