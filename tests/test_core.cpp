// Tests of dea/core: errors, tensors, parameters, the RNG and initialisers, the gradient checker itself.
#include <catch2/catch.hpp>
#include <dea/core/init.hpp>
#include <dea/dea.hpp>
#include <dea/testing/gradcheck.hpp>
#include <dea/ops/dropout.hpp>

#include <cstring>
#include <limits>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_core {

using namespace dea;

TEST_CASE("check throws dea::Error naming the argument", "[core]") {
  Tensor<double> t({2, 3});
  REQUIRE_THROWS_AS(check_shape(t, {3, 2}, "oracle"), Error);
  try {
    check_shape(t, {3, 2}, "oracle");
  } catch (const Error& e) {
    const std::string m = e.what();
    REQUIRE(m.find("oracle") != std::string::npos);
    REQUIRE(m.find("[3, 2]") != std::string::npos);
    REQUIRE(m.find("[2, 3]") != std::string::npos);
  }
  Mat<double> m = Mat<double>::Zero(2, 2);
  m(1, 0) = std::numeric_limits<double>::quiet_NaN();
  REQUIRE_THROWS_WITH(check_finite(m, "x"), Catch::Contains("row 1, column 0"));
}

TEST_CASE("Rng is deterministic and has the right moments", "[core]") {
  Rng a(7), b(7), c(8);
  for (int i = 0; i < 10; ++i) REQUIRE(a.next_u64() == b.next_u64());
  REQUIRE(a.next_u64() != c.next_u64());
  Rng r(1);
  double s = 0, s2 = 0, u = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = r.normal();
    s += x;
    s2 += x * x;
    u += r.uniform();
  }
  REQUIRE(std::abs(s / n) < 0.01);
  REQUIRE(std::abs(s2 / n - 1) < 0.01);
  REQUIRE(std::abs(u / n - 0.5) < 0.005);
}

TEST_CASE("orthogonal initialiser gives Q with QtQ = I", "[core]") {
  Rng r(3);
  Mat<double> q = init::orthogonal<double>(16, r);
  REQUIRE((q.transpose() * q - Mat<double>::Identity(16, 16)).cwiseAbs().maxCoeff() < 1e-12);
}

TEST_CASE("GradCheck finds a wrong gradient and accepts a right one", "[core][gradcheck]") {
  // f(w) = <tanh(A w), R>; gradient A^T (R .* (1 - tanh^2)).
  Rng rng(5);
  Mat<double> A(4, 3);
  init::normal(A, rng, 0, 1);
  Vec<double> w(3), g(3), R(4);
  init::normal(w, rng, 0, 1);
  init::normal(R, rng, 0, 1);
  auto objective = [&] { return (A * w).array().tanh().matrix().dot(R); };
  auto good = [&] {
    const Vec<double> t = (A * w).array().tanh();
    g = A.transpose() * (R.array() * (1 - t.array().square())).matrix();
  };
  testing::GradCheck gc;
  gc.add("w", w.data(), g.data(), 3);
  auto rep = gc.run(objective, good);
  INFO(rep.str());
  REQUIRE(rep.ok);
  REQUIRE(rep.worst_rel_error < 1e-8);
  auto bad = [&] {
    good();
    g[1] *= 1.001;
  };
  REQUIRE_FALSE(gc.run(objective, bad).ok);
}

// AddressSanitizer replaces malloc, and its mallopt refuses every setting.
#if defined(__SANITIZE_ADDRESS__)
#define DEA_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DEA_TEST_ASAN 1
#endif
#endif

TEST_CASE("retain_freed_memory takes effect under glibc and is harmless elsewhere", "[core]") {
#if defined(__GLIBC__) && !defined(DEA_TEST_ASAN)
  REQUIRE(retain_freed_memory());
  // allocations keep working after the change, including ones above glibc's 32 MiB cap on the threshold, and
  // those come from the heap too: no block is mapped on its own (mallinfo2's hblks counts such blocks)
#if __GLIBC_PREREQ(2, 33)
  const std::size_t mapped_before = mallinfo2().hblks;
#endif
  std::vector<float> big(std::size_t(48) << 20 >> 2, 1.0f), mid(std::size_t(8) << 20 >> 2, 2.0f);
  REQUIRE(big.back() == 1.0f);
  REQUIRE(mid.back() == 2.0f);
#if __GLIBC_PREREQ(2, 33)
  REQUIRE(mallinfo2().hblks == mapped_before);
#endif
#elif defined(DEA_TEST_ASAN)
  (void)retain_freed_memory();  // refused by the sanitizer's allocator: must still be harmless
  std::vector<float> big(std::size_t(48) << 20 >> 2, 1.0f);
  REQUIRE(big.back() == 1.0f);
#else
  REQUIRE_FALSE(retain_freed_memory());
#endif
}

TEMPLATE_TEST_CASE("masked softmax: masked and -inf keys get exactly 0, an all-masked row gives zeros", "[core][softmax]",
                   float, double) {
  // Eigen's vectorised exp returns a tiny positive number for -inf (about 1e-308 / 1e-39 with SSE and AVX): the
  // softmax must still give exact zeros there, and a row with no real key must not become uniform.
  using S = TestType;
  const S inf = std::numeric_limits<S>::infinity();
  const Index tq = 4, tk = 37;  // long rows: several full vector packets
  Rng rng(5);
  Mat<S> s(tq, tk);
  for (Index i = 0; i < s.size(); ++i) s.data()[i] = S(rng.uniform(-3, 3));
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(tk), 1);
  for (Index j = 0; j < tk; j += 3) mask[static_cast<std::size_t>(j)] = 0;
  for (Index j = 20; j < tk; ++j) s(1, j) = -inf;  // row 1: causal-style -inf scores beyond key 19
  for (Index j = 0; j < tk; ++j)
    if (mask[static_cast<std::size_t>(j)]) s(2, j) = -inf;  // row 2: every real key -inf, so no key is left
  s(3, 0) = S(-800);  // row 3: a masked key with an ordinary score
  for (int alias = 0; alias < 2; ++alias) {
    Mat<S> p(tq, tk);
    if (alias) {
      p = s;
      ops::masked_softmax_rows<S>(p, mask.data(), p);
    } else {
      ops::masked_softmax_rows<S>(s, mask.data(), p);
    }
    for (Index i = 0; i < tq; ++i) {
      S sum = 0;
      for (Index j = 0; j < tk; ++j) {
        CAPTURE(alias, i, j);
        REQUIRE(p(i, j) >= S(0));
        if (!mask[static_cast<std::size_t>(j)] || s(i, j) == -inf) REQUIRE(p(i, j) == S(0));
        sum += p(i, j);
      }
      if (i == 2)
        REQUIRE(sum == S(0));
      else
        REQUIRE(sum == Approx(1.0).epsilon(1e-5));
    }
  }
  // no mask, one row of -inf scores only: zeros
  Mat<S> q = Mat<S>::Constant(2, tk, -inf);
  q.row(1).setZero();
  ops::masked_softmax_rows<S>(q, nullptr, q);
  REQUIRE(q.row(0).cwiseAbs().maxCoeff() == S(0));
  REQUIRE(q.row(1).sum() == Approx(1.0).epsilon(1e-5));
}

TEMPLATE_TEST_CASE("dropout bit masks: applying the stored bits gives counter_dropout_apply's values bit for bit",
                   "[core][dropout]", float, double) {
  using S = TestType;
  using Bits = ops::detail::SameWidthBits<S>;
  const S inf = std::numeric_limits<S>::infinity();
  for (const double p : {0.0, 0.1, 0.5, 0.9}) {
    for (const Index n : {Index(1), Index(31), Index(32), Index(33), Index(1000)}) {
      for (const std::uint64_t first : {std::uint64_t(0), std::uint64_t(64), std::uint64_t(7)}) {
        std::vector<S> x(static_cast<std::size_t>(n));
        for (Index k = 0; k < n; ++k) x[static_cast<std::size_t>(k)] = S(k % 13) - S(6) + S(0.25);
        x[0] = -S(0);
        if (n > 3) {
          x[1] = std::numeric_limits<S>::quiet_NaN();
          x[2] = -inf;
          x[3] = inf;
        }
        std::vector<S> hashed = x, with_bits = x, from_bits = x;
        const std::size_t words = static_cast<std::size_t>((n + 31) / 32);
        std::vector<std::uint32_t> kept(words + 1, 0xdeadbeefu);  // one word past the end must stay untouched
        ops::counter_dropout_apply(hashed.data(), n, 1234, first, p);
        ops::counter_dropout_apply_bits(with_bits.data(), n, 1234, first, p, kept.data());
        ops::dropout_apply_bits(from_bits.data(), n, kept.data(), p);
        INFO("p " << p << " n " << n << " first " << first);
        CHECK(kept[words] == 0xdeadbeefu);
        bool same = true, bits_right = true;
        for (Index k = 0; k < n; ++k) {
          const std::size_t u = static_cast<std::size_t>(k);
          Bits a, b, c;
          std::memcpy(&a, &hashed[u], sizeof a);
          std::memcpy(&b, &with_bits[u], sizeof b);
          std::memcpy(&c, &from_bits[u], sizeof c);
          same = same && a == b && a == c;
          const bool bit = (kept[u / 32] >> (u % 32)) & 1u;
          bits_right = bits_right && bit == (ops::counter_uniform(1234, first + u) >= p);
        }
        CHECK(same);
        CHECK(bits_right);
        // the unused high bits of the last word are 0
        if (n % 32 != 0) CHECK((kept[words - 1] >> (n % 32)) == 0u);
      }
    }
  }
}

}  // namespace test_core
