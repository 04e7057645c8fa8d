// The bf16 storage type and the mixed-precision product (core/bf16.hpp, ops/packed_bf16.hpp).
//
// The product's rule is a chain of bf16 dot-product steps per element and block of k. The tests check: the rounding
// float -> bf16 on its edge cases and against the branch-free form the packing uses; the scalar model of one step
// against the vdpbf16ps instruction itself, on raw bit patterns (NaN, infinities, denormals, tiny and huge values),
// where the CPU has it, and against the emulated kernel, where the CPU has AVX-512; the whole product, every path,
// bit for bit against the model computed element by element, over shapes that cut tiles and blocks of k and views
// that are transposed or strided; the same bits for 1 and 2 threads and for any split of the rows or columns; the
// products of ops/gemm.hpp under ScopedPrecision; and, independently, the values against a double product of the
// rounded operands.
#include <catch2/catch.hpp>

#include <dea/core/bf16.hpp>
#include <dea/core/init.hpp>
#include <dea/core/parallel.hpp>
#include <dea/ops/gemm.hpp>
#include <dea/ops/linear.hpp>
#include <dea/ops/packed_bf16.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace test_bf16 {

using namespace dea;
using ops::packed::Bf16Path;
using ops::packed::View;
using u32 = std::uint32_t;

namespace {

bool same_bits(float a, float b) { return float_bits(a) == float_bits(b); }
// The rule's equality: the same bits, or both NaN (a NaN's sign and payload are not part of the rule).
bool same_value(float a, float b) { return same_bits(a, b) || (std::isnan(a) && std::isnan(b)); }

// Sets the process's bf16 path for the scope.
struct ForcePath {
  Bf16Path saved;
  explicit ForcePath(Bf16Path p) : saved(ops::packed::bf16_path()) { ops::packed::bf16_path() = p; }
  ~ForcePath() { ops::packed::bf16_path() = saved; }
};

// The paths this CPU can run.
std::vector<Bf16Path> paths() {
  std::vector<Bf16Path> v{Bf16Path::scalar_model};
  if (ops::packed::bf16_detail::cpu_has_avx2_fma()) v.push_back(Bf16Path::emulated_avx2);
  if (ops::packed::bf16_detail::cpu_has_avx512()) v.push_back(Bf16Path::emulated);
  if (ops::packed::bf16_instruction_available()) v.push_back(Bf16Path::instruction);
  return v;
}

// A strided float matrix: rows x cols, row-major or column-major, padded lines.
struct Strided {
  Index rows, cols, ld;
  bool row_major;
  std::vector<float> v;
  Strided(Index r, Index c, bool rm, std::mt19937& g, float scale = 1.0f)
      : rows(r), cols(c), ld((rm ? c : r) + 5), row_major(rm) {
    v.assign(std::size_t(ld * (rm ? r : c) + 1), 0.0f);
    std::normal_distribution<float> d(0.0f, scale);
    for (Index i = 0; i < r; ++i)
      for (Index j = 0; j < c; ++j) at(i, j) = d(g);
  }
  float& at(Index i, Index j) { return row_major ? v[std::size_t(i * ld + j)] : v[std::size_t(j * ld + i)]; }
  View<float> view() const { return row_major ? View<float>{v.data(), ld, 1} : View<float>{v.data(), 1, ld}; }
};

std::vector<float> product(Index M, Index N, Index K, View<float> A, View<float> B, bool accumulate, const float* bias,
                           bool model, const std::vector<float>& c0) {
  std::vector<float> c = c0;
  if (model)
    ops::packed::gemm_bf16_model(M, N, K, A, B, c.data(), N, accumulate, bias);
  else
    ops::packed::gemm_bf16(M, N, K, A, B, c.data(), N, accumulate, bias);
  return c;
}

void require_same(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!same_bits(a[i], b[i]) && bad++ == 0) first = i;
  INFO("first difference at " << first << ": " << (bad ? a[first] : 0.0f) << " vs " << (bad ? b[first] : 0.0f));
  REQUIRE(bad == 0);
}

}  // namespace

TEST_CASE("to_bf16 rounds to nearest even and keeps NaN", "[bf16]") {
  auto r = [](u32 bits) { return to_bf16(bits_float(bits)).bits; };
  CHECK(r(0x3f800000u) == 0x3f80);  // 1 exactly
  CHECK(r(0x3f808000u) == 0x3f80);  // a tie, even below
  CHECK(r(0x3f818000u) == 0x3f82);  // a tie, even above
  CHECK(r(0x3f808001u) == 0x3f81);  // just above the tie
  CHECK(r(0x3f807fffu) == 0x3f80);  // just below it
  CHECK(r(0xbf818000u) == 0xbf82);  // the sign does not matter
  CHECK(r(0x7f7fffffu) == 0x7f80);  // the largest float overflows to infinity
  CHECK(r(0x7f800000u) == 0x7f80);
  CHECK(r(0xff800000u) == 0xff80);
  CHECK(r(0x00000001u) == 0x0000);  // the smallest denormal rounds to zero
  CHECK(r(0x00008000u) == 0x0000);  // a tie at zero, even
  CHECK(r(0x00018000u) == 0x0002);
  CHECK(r(0x7f800001u) == 0x7fc0);  // a signalling NaN whose payload is all in the lower half: quiet, not infinity
  CHECK(r(0xffc12345u) == 0xffc1);
  CHECK(r(0x7fffffffu) == 0x7fff);  // rounding would carry into the sign: kept as the NaN it is
  // every bf16 value converts back to itself (NaNs made quiet)
  int wrong = 0;
  for (u32 h = 0; h < 65536; ++h) {
    const bool nan = (h & 0x7fffu) > 0x7f80u;
    wrong += to_bf16(to_float(bf16{std::uint16_t(h)})).bits != (nan ? (h | 0x40u) : h);
  }
  CHECK(wrong == 0);
  // the branch-free form the packing uses agrees with to_bf16 everywhere it was tried
  std::mt19937 g(7);
  int differ = 0;
  for (int i = 0; i < 1000000; ++i) {
    const u32 u = g();
    differ += ops::packed::bf16_detail::bf16_bits(u) != to_bf16(bits_float(u)).bits;
  }
  CHECK(differ == 0);
}

TEST_CASE("the kernels compute the scalar model's chain bit for bit, special values included", "[bf16]") {
  namespace d = ops::packed::bf16_detail;
  std::mt19937 g(11);
  constexpr Index pairs = 37;
  std::array<u32, pairs * d::MR> a;
  alignas(64) std::array<u32, pairs * d::NR> b;  // a packed B is aligned as a vector
  alignas(64) float want[d::MR * d::NR], got[d::MR * d::NR];
  // raw patterns: a random sign and mantissa with an exponent drawn from a regime
  auto element = [&](int regime) -> std::uint16_t {
    const u32 sm = g() & 0x807fu;
    switch (regime) {
      case 0: return std::uint16_t(sm | ((120 + g() % 16) << 7));   // ordinary values around 1
      case 1: return std::uint16_t(g());                             // anything: NaN, infinities, denormals
      case 2: return std::uint16_t(sm | ((g() % 60) << 7));          // tiny: products underflow, denormal inputs
      default: return std::uint16_t(sm | ((190 + g() % 65) << 7));   // huge: products overflow, infinities
    }
  };
  // the same operands as a packed A ([pairs][MR]) and as rows read in place ([MR][pairs])
  std::array<u32, pairs * d::MR> rows;
  using Kernel = void (*)(const d::TileArgs&);
  auto run = [&](Kernel packed, Kernel direct, float* out, float* out_direct) {
    for (Index p = 0; p < pairs; ++p)
      for (int i = 0; i < d::MR; ++i) rows[std::size_t(i * pairs + p)] = a[std::size_t(p * d::MR + i)];
    packed({pairs, a.data(), 0, b.data(), out, d::NR, d::MR, d::NR, true, nullptr});
    direct({pairs, rows.data(), pairs, b.data(), out_direct, d::NR, d::MR, d::NR, true, nullptr});
  };
  alignas(64) float want_direct[d::MR * d::NR], got_direct[d::MR * d::NR];
  auto compare = [&](const char* what, int regime) {
    for (int i = 0; i < d::MR * d::NR; ++i) {
      INFO(what << ", regime " << regime << ", element " << i << ": " << got[i] << " vs the model's " << want[i]);
      REQUIRE(same_value(got[i], want[i]));
      REQUIRE(same_value(got_direct[i], want[i]));
    }
  };
  int checked = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int regime = trial % 4;
    for (auto& x : a) x = element(regime) | (u32(element(regime)) << 16);
    for (auto& x : b) x = element(trial % 3 == 0 ? 1 : regime) | (u32(element(regime)) << 16);
    run(d::tile_model<false>, d::tile_model<true>, want, want_direct);
    for (int i = 0; i < d::MR * d::NR; ++i) REQUIRE(same_bits(want_direct[i], want[i]));
#if DEA_BF16_X86
    if (d::cpu_has_bf16_dot()) {
      run(d::tile_instruction<false>, d::tile_instruction<true>, got, got_direct);
      compare("instruction", regime);
      ++checked;
    }
    if (d::cpu_has_avx512()) {
      run(d::tile_emulated<false>, d::tile_emulated<true>, got, got_direct);
      compare("emulated", regime);
      ++checked;
    }
    if (d::cpu_has_avx2_fma()) {
      run(d::tile_emulated_avx2<false>, d::tile_emulated_avx2<true>, got, got_direct);
      compare("emulated with AVX2", regime);
      ++checked;
    }
#endif
  }
  if (checked == 0) WARN("this CPU has neither AVX512_BF16, AVX-512 nor AVX2: only the scalar model runs here");
}

TEST_CASE("gemm_bf16 equals the rule element by element on every path, view and shape", "[bf16]") {
  std::mt19937 g(3);
  struct Shape {
    Index M, N, K;
  };
  const Shape shapes[] = {{1, 1, 1},   {13, 33, 7},    {12, 32, 2}, {50, 70, 513},
                           {25, 97, 1100}, {3, 200, 64}, {2, 50, 40}, {4, 420, 1030}, {1, 900, 33}};
  for (const Shape s : shapes)
    for (int layout = 0; layout < 4; ++layout) {
      const Strided A(s.M, s.K, layout & 1, g), B(s.K, s.N, layout & 2, g);
      std::vector<float> bias(std::size_t(s.N)), c0(std::size_t(s.M * s.N));
      for (auto& x : bias) x = float(g() % 1000) / 250.0f - 2.0f;
      for (auto& x : c0) x = float(g() % 1000) / 100.0f - 5.0f;
      for (int mode = 0; mode < 3; ++mode) {  // written, written with a bias, accumulated
        const bool acc = mode == 2;
        const float* bp = mode == 1 ? bias.data() : nullptr;
        const std::vector<float> want = product(s.M, s.N, s.K, A.view(), B.view(), acc, bp, true, c0);
        for (const Bf16Path path : paths()) {
          const ForcePath force(path);
          INFO("M " << s.M << " N " << s.N << " K " << s.K << " layout " << layout << " mode " << mode << " path "
                    << int(path));
          require_same(product(s.M, s.N, s.K, A.view(), B.view(), acc, bp, false, c0), want);
        }
      }
    }
}

TEST_CASE("gemm_bf16 with bf16 weights equals it with the float weights they round", "[bf16]") {
  std::mt19937 g(5);
  const Index M = 40, N = 45, K = 77;
  const Strided A(M, K, true, g), W(N, K, true, g);  // y = x W^T: B = W^T
  std::vector<bf16> Wb(W.v.size());
  for (std::size_t i = 0; i < Wb.size(); ++i) Wb[i] = to_bf16(W.v[i]);
  const View<bf16> Bb{Wb.data(), 1, W.ld};
  std::vector<float> want(std::size_t(M * N)), got(want.size());
  ops::packed::gemm_bf16(M, N, K, A.view(), W.view().t(), want.data(), N, false);
  ops::packed::gemm_bf16(M, N, K, A.view(), Bb, got.data(), N, false);
  require_same(got, want);
}

TEST_CASE("a right-hand side packed once (Bf16Matrix) gives the bits of the product on its view", "[bf16]") {
  std::mt19937 g(17);
  for (const Index K : {Index(1), Index(9), Index(600), Index(1301)}) {
    const Index N = 75;
    const Strided W(N, K, true, g);  // B = W^T, the inference layout
    std::vector<bf16> Wb(W.v.size());
    for (std::size_t i = 0; i < Wb.size(); ++i) Wb[i] = to_bf16(W.v[i]);
    const ops::packed::Bf16Matrix from_float(K, N, W.view().t()), from_bf16(K, N, View<bf16>{Wb.data(), 1, W.ld});
    CHECK(from_float.bytes() >= std::size_t(2 * K * N));
    CHECK(from_float.bytes() <= std::size_t(2 * (K + 1) * (N + 31)));
    for (const Index M : {Index(1), Index(13), Index(100)}) {
      const Strided A(M, K, true, g);
      std::vector<float> bias(std::size_t(N), 0.5f), want(std::size_t(M * N)), got(want.size()), got2(want.size());
      ops::packed::gemm_bf16(M, N, K, A.view(), W.view().t(), want.data(), N, false, bias.data());
      ops::packed::gemm_bf16(M, A.view(), from_float, got.data(), N, false, bias.data());
      ops::packed::gemm_bf16(M, A.view(), from_bf16, got2.data(), N, false, bias.data());
      INFO("M " << M << " K " << K);
      require_same(got, want);
      require_same(got2, want);
    }
  }
}

TEST_CASE("gemm_bf16 gives the same bits on 1 and 2 threads and for any split of rows and columns", "[bf16]") {
  std::mt19937 g(9);
  const Index M = 300, N = 700, K = 1030;  // several blocks of k and of columns, tiles cut at both edges
  const Strided A(M, K, true, g), B(K, N, false, g);
  std::vector<float> one(std::size_t(M * N)), two(one.size()), split(one.size());
  const int saved = num_threads();
  set_num_threads(1);
  ops::packed::gemm_bf16(M, N, K, A.view(), B.view(), one.data(), N, false);
  set_num_threads(2);
  ops::packed::gemm_bf16(M, N, K, A.view(), B.view(), two.data(), N, false);
  require_same(one, two);
  // rows [0, 101) and [101, M), then columns [0, 333) and [333, N) of the lower part
  const View<float> a = A.view(), b = B.view();
  ops::packed::gemm_bf16(101, N, K, a, b, split.data(), N, false);
  ops::packed::gemm_bf16(M - 101, 333, K, {a.p + 101 * a.rs, a.rs, a.cs}, b, split.data() + 101 * N, N, false);
  ops::packed::gemm_bf16(M - 101, N - 333, K, {a.p + 101 * a.rs, a.rs, a.cs}, {b.p + 333 * b.cs, b.rs, b.cs},
                         split.data() + 101 * N + 333, N, false);
  require_same(split, one);
  set_num_threads(saved);
}

TEST_CASE("the products of ops/gemm.hpp follow ScopedPrecision, in the library's parallel loops too", "[bf16]") {
  Rng rng(1);
  Mat<float> x(70, 90), W(40, 90), dy(70, 40);
  for (Index i = 0; i < x.size(); ++i) x.data()[i] = float(rng.normal());
  for (Index i = 0; i < W.size(); ++i) W.data()[i] = float(rng.normal());
  for (Index i = 0; i < dy.size(); ++i) dy.data()[i] = float(rng.normal());
  std::vector<float> b(40, 0.25f);
  Mat<float> y32, y16;
  ops::linear_forward<float>(x, W, b.data(), y32);
  {
    const ScopedPrecision bf(Precision::bf16);
    ops::linear_forward<float>(x, W, b.data(), y16);
  }
  std::vector<float> want(std::size_t(70 * 40));
  ops::packed::gemm_bf16(70, 40, 90, {x.data(), 90, 1}, {W.data(), 1, 90}, want.data(), 40, false, b.data());
  require_same(std::vector<float>(y16.data(), y16.data() + y16.size()), want);
  REQUIRE((y32 - y16).cwiseAbs().maxCoeff() > 0.0f);  // the policy changed the product
  // the weight gradient dW += dy^T x and the input gradient dx = dy W
  Mat<float> dW = Mat<float>::Zero(40, 90), dx;
  {
    const ScopedPrecision bf(Precision::bf16);
    ops::linear_backward<float>(dy, x, W, MatMap<float>(dW.data(), 40, 90), nullptr, &dx);
  }
  std::vector<float> dw_want(std::size_t(40 * 90), 0.0f), dx_want(std::size_t(70 * 90));
  ops::packed::gemm_bf16(40, 90, 70, {dy.data(), 1, 40}, {x.data(), 90, 1}, dw_want.data(), 90, true);
  ops::packed::gemm_bf16(70, 90, 40, {dy.data(), 40, 1}, {W.data(), 90, 1}, dx_want.data(), 90, false);
  require_same(std::vector<float>(dW.data(), dW.data() + dW.size()), dw_want);
  require_same(std::vector<float>(dx.data(), dx.data() + dx.size()), dx_want);
  // a loop's worker threads see the caller's precision
  std::vector<int> seen(8, -1);
  {
    const ScopedPrecision bf(Precision::bf16);
    parallel_for(8, [&](Index i) { seen[std::size_t(i)] = int(thread_settings().product_precision); });
  }
  for (int s : seen) CHECK(s == int(Precision::bf16));
  CHECK(thread_settings().product_precision == Precision::fp32);
}

TEST_CASE("gemm_bf16's values: within bf16-rounding of a double product of the rounded operands", "[bf16]") {
  std::mt19937 g(13);
  const Index M = 64, N = 80, K = 600;
  const Strided A(M, K, true, g), B(K, N, true, g);
  std::vector<float> c(std::size_t(M * N));
  ops::packed::gemm_bf16(M, N, K, A.view(), B.view(), c.data(), N, false);
  Strided& a = const_cast<Strided&>(A);
  Strided& b = const_cast<Strided&>(B);
  double worst = 0;
  for (Index i = 0; i < M; ++i)
    for (Index j = 0; j < N; ++j) {
      double s = 0, mag = 0;
      for (Index k = 0; k < K; ++k) {
        const double p = double(round_bf16(a.at(i, k))) * double(round_bf16(b.at(k, j)));
        s += p;
        mag += std::fabs(p);
      }
      worst = std::max(worst, std::fabs(c[std::size_t(i * N + j)] - s) / mag);
    }
  // float accumulation over K terms: a few K ulps of the sum of magnitudes at worst
  CHECK(worst < 2e-6);
  CHECK(worst > 0.0);
}

}  // namespace test_bf16
