// dea/core/init.hpp: parameter initialisers (uniform, normal, Xavier, orthogonal), drawn from an Rng.
//
// uniform, normal and xavier_uniform fill a matrix, vector or Map element by element in row-major order, and
// orthogonal draws its Gaussian matrix in that order too, so a seed gives the same values on every platform.
#pragma once

#include "config.hpp"
#include "rng.hpp"
#include "tensor.hpp"

#include <Eigen/QR>
#include <cmath>
#include <type_traits>
#include <utility>

namespace dea {

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
