// Tests of dea/dist (the MPI-free core of data-parallel training): gradients flattened in parameter order, the
// fixed-order tree sum (any number of ranks dividing M gives the bits of one rank; the tree differs from a naive
// running sum, so the comparison can fail), the accumulator in either leaf order, and the single-process Comm.
#include <catch2/catch.hpp>
#include <dea/core/rng.hpp>
#include <dea/dist/comm.hpp>
#include <dea/dist/grad_buffer.hpp>
#include <dea/dist/tree_sum.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_dist {

using namespace dea;

namespace {

/// M leaves of n floats with a wide spread of magnitudes (so that the order of the additions shows in the bits).
std::vector<std::vector<float>> random_leaves(std::size_t m, std::size_t n, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::vector<float>> leaves(m, std::vector<float>(n));
  for (auto& l : leaves)
    for (float& x : l) x = static_cast<float>(rng.normal() * std::exp(4.0 * rng.normal()));
  return leaves;
}

std::vector<const float*> pointers(const std::vector<std::vector<float>>& v, std::size_t a, std::size_t b) {
  std::vector<const float*> p;
  for (std::size_t i = a; i < b; ++i) p.push_back(v[i].data());
  return p;
}

bool same_bits(const float* a, const float* b, std::size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

/// What rank r of R computes: its subtree over [r M/R, (r+1) M/R), leaves pushed last to first.
std::vector<float> subtree(const std::vector<std::vector<float>>& leaves, int ranks, int r, bool descending) {
  const std::size_t n = leaves[0].size();
  const dist::LeafRange lr = dist::leaf_range(static_cast<std::int64_t>(leaves.size()), ranks, r);
  dist::TreeAccumulator<float> acc(n);
  for (std::int64_t i = 0; i < lr.size(); ++i) {
    const std::int64_t k = descending ? lr.last - 1 - i : lr.first + i;
    std::copy(leaves[static_cast<std::size_t>(k)].begin(), leaves[static_cast<std::size_t>(k)].end(), acc.leaf());
    acc.push(k);
  }
  return std::vector<float>(acc.result(), acc.result() + n);
}

}  // namespace

TEST_CASE("dist: any rank count dividing M gives the bits of one rank", "[dist]") {
  const std::size_t n = 1000;
  for (std::size_t m : {1, 2, 4, 8, 16}) {
    const auto leaves = random_leaves(m, n, 100 + m);
    std::vector<float> one(n);
    dist::tree_sum(pointers(leaves, 0, m), n, one.data());
    for (int ranks = 1; ranks <= static_cast<int>(m); ranks *= 2)
      for (bool descending : {false, true}) {
        std::vector<std::vector<float>> sums;
        for (int r = 0; r < ranks; ++r) sums.push_back(subtree(leaves, ranks, r, descending));
        std::vector<float> root(n);
        dist::tree_sum(pointers(sums, 0, sums.size()), n, root.data());
        INFO("M " << m << " R " << ranks << (descending ? " descending" : " ascending"));
        CHECK(same_bits(root.data(), one.data(), n));
      }
  }
}

TEST_CASE("dist: the tree is not the running sum (the bitwise comparison can fail)", "[dist]") {
  const std::size_t m = 8, n = 1000;
  const auto leaves = random_leaves(m, n, 7);
  std::vector<float> tree(n), naive(leaves[0]);
  dist::tree_sum(pointers(leaves, 0, m), n, tree.data());
  for (std::size_t k = 1; k < m; ++k)
    for (std::size_t i = 0; i < n; ++i) naive[i] += leaves[k][i];
  std::size_t differ = 0;
  for (std::size_t i = 0; i < n; ++i) differ += tree[i] != naive[i];
  CHECK(differ > 10);
  // and the two agree to round-off
  for (std::size_t i = 0; i < n; ++i) {
    double mag = 0;
    for (std::size_t k = 0; k < m; ++k) mag += std::abs(static_cast<double>(leaves[k][i]));
    CHECK(std::abs(static_cast<double>(tree[i]) - naive[i]) <= 1e-5 * mag);
  }
  // addition commutes: swapping two siblings changes nothing ...
  const std::vector<float> right = subtree(leaves, 2, 1, false), left = subtree(leaves, 2, 0, false);
  std::vector<float> root(n);
  dist::tree_sum(std::vector<const float*>{right.data(), left.data()}, n, root.data());
  CHECK(same_bits(root.data(), tree.data(), n));
  std::vector<float> regrouped(n);  // ... but regrouping does: ((0 + 1) + 2) + 3 against (0 + 1) + (2 + 3)
  for (std::size_t i = 0; i < n; ++i) regrouped[i] = ((leaves[0][i] + leaves[1][i]) + leaves[2][i]) + leaves[3][i];
  std::vector<float> four(n);
  dist::tree_sum(pointers(leaves, 0, 4), n, four.data());
  CHECK_FALSE(same_bits(regrouped.data(), four.data(), n));
}

TEST_CASE("dist: the accumulator refuses leaves that are not one aligned run", "[dist]") {
  dist::TreeAccumulator<float> acc(4);
  acc.leaf()[0] = 1;
  acc.push(1);
  acc.leaf()[0] = 2;
  acc.push(2);
  CHECK_THROWS_WITH(acc.result(), Catch::Contains("not one aligned power-of-two range"));
  acc.leaf();
  CHECK_THROWS_WITH(acc.push(5), Catch::Contains("does not extend the run [1, 3)"));
  acc.clear();
  for (int k = 0; k < 4; ++k) {
    std::fill(acc.leaf(), acc.leaf() + 4, static_cast<float>(k + 1));
    acc.push(k);
  }
  CHECK(acc.result()[3] == 10.0f);
  CHECK_THROWS_WITH(dist::leaf_range(6, 2, 0), Catch::Contains("power of two"));
  CHECK_THROWS_WITH(dist::leaf_range(4, 8, 0), Catch::Contains("8 ranks do not divide 4"));
  CHECK(dist::leaf_range(8, 4, 3).first == 6);
  CHECK(dist::leaf_range(8, 4, 3).last == 8);
  CHECK_THROWS_WITH(dist::tree_sum(std::vector<const float*>(3, nullptr), 1, static_cast<float*>(nullptr)),
                    Catch::Contains("power of two"));
}

TEST_CASE("dist: gradients flatten in parameter order and back", "[dist]") {
  Param<float> a("a", "main", {2, 3}), b("b", "gate", {4}), c("c", "main", {0});
  ParamList<float> ps = {&a, &c, &b};
  for (Index i = 0; i < 6; ++i) a.grad[i] = static_cast<float>(i) + 0.1f;
  for (Index i = 0; i < 4; ++i) b.grad[i] = -static_cast<float>(i) - 0.3f;
  REQUIRE(dist::grad_size(ps) == 10);
  std::vector<float> buf(10), half(10);
  dist::flatten_grads(ps, buf.data());
  CHECK(buf[0] == a.grad[0]);
  CHECK(buf[5] == a.grad[5]);
  CHECK(buf[6] == b.grad[0]);
  CHECK(buf[9] == b.grad[3]);
  dist::flatten_grads(ps, half.data(), 0.25f);
  for (std::size_t i = 0; i < 10; ++i) CHECK(half[i] * 4.0f == buf[i]);  // a power of two scales exactly
  a.zero_grad();
  b.zero_grad();
  dist::unflatten_grads(ps, buf.data());
  CHECK(a.grad[4] == 4.1f);
  CHECK(b.grad[2] == -2.3f);
  const std::uint64_t h = dist::parameter_hash(ps);
  CHECK(dist::parameter_hash(ps) == h);
  b.value[3] = 1e-30f;
  CHECK(dist::parameter_hash(ps) != h);
}

TEST_CASE("dist: the single-process Comm", "[dist]") {
  dist::SingleProcessComm comm;
  CHECK(comm.rank() == 0);
  CHECK(comm.size() == 1);
  const double x[2] = {1.5, -2};
  double y[2] = {0, 0};
  comm.allgather(x, 2, y);
  CHECK(y[1] == -2);
  CHECK(comm.agree(0).ok);
  const dist::Agreement bad = comm.agree(2, "--text 'x': cannot open");
  CHECK_FALSE(bad.ok);
  CHECK(bad.rank == 0);
  CHECK(bad.status == 2);
  CHECK(bad.message == "--text 'x': cannot open");
  CHECK_THROWS_WITH(dist::agree_or_throw(comm, 1, "non-finite loss"), "non-finite loss");
  CHECK_NOTHROW(comm.check_same(42, "the initial parameters"));
}

}  // namespace test_dist
