// tests/same_results.hpp: the check the fixed-against-dynamic tests share: two runs of the same work (the output,
// the input gradient and every parameter gradient, in the same order) are identical bit for bit, and each result
// is non-zero (so a test that computes nothing cannot pass).
#pragma once

#include <catch2/catch.hpp>
#include <dea/core/tensor.hpp>

#include <cstddef>
#include <vector>

namespace dea_tests {

inline void require_same_results(const std::vector<dea::Mat<float>>& a, const std::vector<dea::Mat<float>>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t k = 0; k < a.size(); ++k) {
    INFO("result " << k);
    REQUIRE(a[k].cwiseAbs().maxCoeff() > 0);
    REQUIRE(a[k] == b[k]);
  }
}

}  // namespace dea_tests
