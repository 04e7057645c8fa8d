// The packed matrix product (ops/packed_gemm.hpp) and the ops::gemm / ops::linear entry points that use it.
//
// Every element of the packed product is, by construction, C0 + s_1 + s_2 + ... with s_b the k-ordered
// multiply-add chain over the b-th block of k (fused when the compiler contracts a * b + c, as GCC does by
// default with FMA hardware; two roundings otherwise). The scalar reference below computes exactly that, both
// ways, and the product must equal one of them bit for bit, whatever the kernel shape, the tile an element falls
// in (full or cut by an edge) and the thread count. A double-precision product checks the values independently.
#include <catch2/catch.hpp>

#include <dea/core/init.hpp>
#include <dea/ops/gemm.hpp>
#include <dea/ops/linear.hpp>
#include <dea/ops/packed_gemm.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_packed_gemm {

using namespace dea;
using ops::packed::View;

namespace {

// A strided matrix owning its values: rows x cols, row-major or column-major, with padding between lines.
template <class S>
struct Strided {
  Index rows, cols;
  bool row_major;
  Index ld;
  std::vector<S> v;
  Strided(Index r, Index c, bool rm, Rng& rng) : rows(r), cols(c), row_major(rm), ld((rm ? c : r) + 3) {
    v.assign(static_cast<std::size_t>(ld * (rm ? r : c) + 1), S(0));
    for (Index i = 0; i < r; ++i)
      for (Index j = 0; j < c; ++j) at(i, j) = static_cast<S>(rng.normal());
  }
  S& at(Index i, Index j) { return v[static_cast<std::size_t>(row_major ? i * ld + j : j * ld + i)]; }
  S get(Index i, Index j) const { return v[static_cast<std::size_t>(row_major ? i * ld + j : j * ld + i)]; }
  View<S> view() const { return row_major ? View<S>{v.data(), ld, 1} : View<S>{v.data(), 1, ld}; }
};

// The packed product's order of operations, one element at a time.
template <class S>
std::vector<S> reference_order(Index M, Index N, Index K, View<S> A, View<S> B, const std::vector<S>& C0, Index ldc,
                               bool accumulate, const S* bias, bool fused) {
  std::vector<S> C = C0;
  const Index kc = ops::packed::k_block(K);
  for (Index i = 0; i < M; ++i)
    for (Index j = 0; j < N; ++j) {
      S& c = C[static_cast<std::size_t>(i * ldc + j)];
      for (Index p = 0; p < K; p += kc) {
        S acc = 0;
        for (Index k = p; k < std::min(K, p + kc); ++k) {
          const S a = A.p[i * A.rs + k * A.cs], b = B.p[k * B.rs + j * B.cs];
          if (fused) {
            acc = std::fma(a, b, acc);
          } else {
            volatile S prod = a * b;  // rounded on its own
            acc = acc + prod;
          }
        }
        if (p == 0 && !accumulate)
          c = bias ? acc + bias[j] : acc;
        else
          c = c + acc;
      }
    }
  return C;
}

template <class S, class Kern>
void check_shapes(Rng& rng) {
  const Index cases[][3] = {{1, 1, 1},    {3, 5, 7},     {12, 32, 16},  {13, 33, 17},   {11, 31, 1},
                            {25, 70, 513}, {40, 17, 1100}, {7, 600, 64}, {130, 129, 200}, {2, 1100, 520},
                            {389, 9, 530}};  // a transposed A: tasks of up to 8 panels packed in one pass, 2 blocks of k
  for (const auto& mnk : cases) {
    const Index M = mnk[0], N = mnk[1], K = mnk[2];
    for (int layout = 0; layout < 4; ++layout)
      for (int mode = 0; mode < 3; ++mode) {  // 0: C = AB, 1: C = AB + bias, 2: C += AB
        const Strided<S> a(M, K, layout & 1, rng), b(K, N, layout & 2, rng);
        const Index ldc = N + 5;
        std::vector<S> c0(static_cast<std::size_t>(M * ldc));
        for (S& x : c0) x = static_cast<S>(rng.normal());
        std::vector<S> bias(static_cast<std::size_t>(N));
        for (S& x : bias) x = static_cast<S>(rng.normal());
        const bool acc = mode == 2;
        const S* bp = mode == 1 ? bias.data() : nullptr;
        std::vector<S> c = c0;
        ops::packed::gemm<S, Kern>(M, N, K, a.view(), b.view(), c.data(), ldc, acc, bp);
        INFO("M " << M << " N " << N << " K " << K << " layout " << layout << " mode " << mode << " kernel "
                  << Kern::MR << "x" << Kern::NR);
        // the values, against a double-precision product
        double worst = 0;
        for (Index i = 0; i < M; ++i)
          for (Index j = 0; j < N; ++j) {
            double r = acc ? double(c0[static_cast<std::size_t>(i * ldc + j)]) : (bp ? double(bias[j]) : 0.0);
            double mag = std::abs(r);
            for (Index k = 0; k < K; ++k) {
              r += double(a.get(i, k)) * double(b.get(k, j));
              mag += std::abs(double(a.get(i, k)) * double(b.get(k, j)));
            }
            worst = std::max(worst, std::abs(double(c[static_cast<std::size_t>(i * ldc + j)]) - r) / (mag + 1e-30));
          }
        CHECK(worst < 4 * double(std::numeric_limits<S>::epsilon()) * std::sqrt(double(K) + 1));
        // the padding between C's rows is untouched
        bool pad_kept = true;
        for (Index i = 0; i < M; ++i)
          for (Index j = N; j < ldc; ++j)
            pad_kept = pad_kept && c[static_cast<std::size_t>(i * ldc + j)] == c0[static_cast<std::size_t>(i * ldc + j)];
        CHECK(pad_kept);
        // the order of operations, bit for bit
        // (the second order is computed only when the first does not match: the sanitizer build runs this at -O0)
        const bool order_kept = c == reference_order<S>(M, N, K, a.view(), b.view(), c0, ldc, acc, bp, true) ||
                                c == reference_order<S>(M, N, K, a.view(), b.view(), c0, ldc, acc, bp, false);
        CHECK(order_kept);
      }
  }
}

}  // namespace

TEST_CASE("packed gemm: every kernel shape, layout and mode against a double product and its own order",
          "[gemm]") {
  Rng rng(11);
  check_shapes<float, ops::packed::DefaultKernel<float>>(rng);
  check_shapes<double, ops::packed::DefaultKernel<double>>(rng);
  check_shapes<float, ops::packed::Kernel<float, 32, 6, 2>>(rng);
  check_shapes<float, ops::packed::Kernel<float, 16, 4, 2>>(rng);
  check_shapes<double, ops::packed::Kernel<double, 16, 4, 2>>(rng);
}

TEST_CASE("packed gemm: the same bits for 1 and 2 threads and for every kernel shape", "[gemm][threads]") {
  Rng rng(12);
  const Index M = 301, N = 257, K = 700;
  Mat<float> A(M, K), B(K, N);
  init::normal(A, rng, 0, 1);
  init::normal(B, rng, 0, 1);
  Mat<float> C1(M, N), C2(M, N), C3(M, N), C4(M, N);
  const View<float> a{A.data(), K, 1}, b{B.data(), N, 1};
  set_num_threads(1);
  ops::packed::gemm<float>(M, N, K, a, b, C1.data(), N, false);
  set_num_threads(2);
  ops::packed::gemm<float>(M, N, K, a, b, C2.data(), N, false);
  ops::packed::gemm<float, ops::packed::Kernel<float, 32, 6, 2>>(M, N, K, a, b, C3.data(), N, false);
  ops::packed::gemm<float, ops::packed::Kernel<float, 16, 4, 2>>(M, N, K, a, b, C4.data(), N, false);
  set_num_threads(1);
  CHECK(C1 == C2);
  CHECK(C1 == C3);  // same k order per element: the shape only decides which elements share registers
  CHECK(C1 == C4);
}

TEST_CASE("packed gemm: several blocks of B on 1, 2 and 3 threads, in place or packed A, with or without a "
          "BufferScope: the same bits", "[gemm][threads]") {
  // K = 1100: two blocks of k; N = 700: two blocks of columns (three threads share every block, packing the next one
  // into the second buffer while the current one is read); under the BufferScope, one buffer of 3 panels: seven
  // blocks of columns, with a barrier before each block is packed
  Rng rng(15);
  const Index M = 150, N = 700, K = 1100;
  Mat<float> A(M, K), At(K, M), B(K, N), Bt(N, K);
  init::normal(A, rng, 0, 1);
  init::normal(B, rng, 0, 1);
  At = A.transpose();
  Bt = B.transpose();
  Vec<float> bias(N);
  init::normal(bias, rng, 0, 1);
  Mat<float> C0(M, N);
  init::normal(C0, rng, 0, 1);
  const View<float> a_rows{A.data(), K, 1}, a_cols{At.data(), 1, M}, b_rows{B.data(), N, 1}, b_cols{Bt.data(), 1, K};
  const Index one_buffer = ops::packed::b_pack_size<float>(K, N, 3);
  AlignedVec<float> buf(static_cast<std::size_t>(one_buffer));
  for (const View<float>& a : {a_rows, a_cols})
    for (const View<float>& b : {b_rows, b_cols})
      for (int mode = 0; mode < 2; ++mode) {  // 0: C = A B + bias, 1: C += A B
        Mat<float> first;
        for (int scoped = 0; scoped < 2; ++scoped)
          for (int threads : {1, 2, 3}) {
            set_num_threads(threads);
            Mat<float> C = C0;
            std::optional<ops::packed::BufferScope<float>> scope;
            if (scoped) scope.emplace(buf.data(), one_buffer);
            ops::packed::gemm<float>(M, N, K, a, b, C.data(), N, mode == 1, mode == 0 ? bias.data() : nullptr);
            if (first.size() == 0) {
              first = C;
              // and it is the product: against a double product
              Eigen::MatrixXd ref = A.cast<double>() * B.cast<double>();
              if (mode == 1) ref += C0.cast<double>();
              Eigen::MatrixXd got = C.cast<double>();
              if (mode == 0) got.rowwise() -= bias.cast<double>().transpose();
              CHECK((got - ref).cwiseAbs().maxCoeff() < 1e-3 * (A.cast<double>().cwiseAbs() *
                                                                B.cast<double>().cwiseAbs()).maxCoeff());
            } else {
              INFO("threads " << threads << ", BufferScope " << scoped << ", mode " << mode << ", A.rs " << a.rs
                              << ", B.rs " << b.rs);
              CHECK(C == first);
            }
          }
      }
  set_num_threads(1);
}

TEST_CASE("ops::gemm_into, gemm_tn_add and linear use the packed product and agree with Eigen", "[gemm]") {
  Rng rng(13);
  Mat<double> x(70, 600), W(80, 600), dy(70, 80);
  init::normal(x, rng, 0, 1);
  init::normal(W, rng, 0, 1);
  init::normal(dy, rng, 0, 1);
  Vec<double> b(80);
  init::normal(b, rng, 0, 1);
  Mat<double> y(70, 80);
  ops::linear_forward_into<double>(x, W, b.data(), y);
  const Mat<double> y_ref = (x * W.transpose()).rowwise() + b.transpose();
  CHECK((y - y_ref).cwiseAbs().maxCoeff() < 1e-11);

  Mat<double> dW = Mat<double>::Ones(80, 600);
  MatMap<double> dWm(dW.data(), 80, 600);
  ops::gemm_tn_add<double>(dy, x, dWm);
  const Mat<double> dW_ref = Mat<double>::Ones(80, 600) + dy.transpose() * x;
  CHECK((dW - dW_ref).cwiseAbs().maxCoeff() < 1e-11);

  Mat<double> dx;
  ops::gemm<double>(dy, W, dx);
  CHECK((dx - dy * W).cwiseAbs().maxCoeff() < 1e-11);

  // fewer rows than packed::kMinRows: Eigen's product, the same values
  Mat<double> ys(10, 80);
  ops::linear_forward_into<double>(x.topRows(10), W, b.data(), ys);
  CHECK((ys - y_ref.topRows(10)).cwiseAbs().maxCoeff() < 1e-11);

  // a column-major result: computed as the transpose
  Eigen::MatrixXd cm(70, 80);
  ops::gemm_into(x, W.transpose(), cm);
  CHECK((cm - x * W.transpose()).cwiseAbs().maxCoeff() < 1e-11);

  // a scalar type the packed product does not handle goes through Eigen
  Eigen::Matrix<long double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> xl = x.cast<long double>(),
                                                                              Wl = W.cast<long double>(), yl(70, 80);
  ops::gemm_into(xl, Wl.transpose(), yl);
  CHECK((yl.cast<double>() - x * W.transpose()).cwiseAbs().maxCoeff() < 1e-11);
}

TEMPLATE_TEST_CASE("ops::linear_backward: the bias gradient has the bits of Eigen's column sums, block by block",
                   "[gemm]", float, double) {
  using S = TestType;
  Rng rng(17);
  // rows x columns of dy: whole packets of columns (the row-by-row sum) and partial ones (Eigen's own), 1 to 4
  // column blocks, row counts around the sum's groups of four
  const Index shapes[][2] = {{70, 80}, {1, 8}, {5, 13}, {9, 33}, {130, 2}, {64, 256}, {203, 512}, {4, 1000}, {7, 64}};
  for (const auto& sh : shapes) {
    const Index n = sh[0], cols = sh[1], in = 3;
    Mat<S> dy(n, cols), x(n, in), W(cols, in);
    init::normal(dy, rng, 0, 1);
    init::normal(x, rng, 0, 1);
    init::normal(W, rng, 0, 1);
    Vec<S> db0(cols);
    init::normal(db0, rng, 0, 1);
    Vec<S> db = db0;
    Mat<S> dW = Mat<S>::Zero(cols, in);
    ops::linear_backward<S>(dy, x, W, MatMap<S>(dW.data(), cols, in), db.data(), nullptr);
    // the reference: db0 + Eigen's colwise sum over the same fixed column blocks
    Vec<S> ref = db0;
    const Index nb = ops::gemm_tn_row_blocks(cols), base = cols / nb, extra = cols % nb;
    for (Index b = 0; b < nb; ++b) {
      const Index c0 = b * base + std::min(b, extra), nc = base + (b < extra ? 1 : 0);
      Eigen::Map<RowVec<S>>(ref.data() + c0, nc) += dy.middleCols(c0, nc).colwise().sum();
    }
    INFO("n " << n << " cols " << cols);
    CHECK((db.array() == ref.array()).all());
  }
}

TEST_CASE("packed gemm: a BufferScope supplies the packing buffer, and one too small is an error", "[gemm]") {
  Rng rng(14);
  Mat<float> x(80, 64), W(48, 64), y(80, 48), y2(80, 48);  // 80 rows: at least packed::kMinRows
  init::normal(x, rng, 0, 1);
  init::normal(W, rng, 0, 1);
  ops::linear_forward_into<float>(x, W, static_cast<const float*>(nullptr), y2);
  const Index need = ops::packed::b_pack_size<float>(64, 48);
  REQUIRE(need >= 64 * 48);
  y.setZero();
  AlignedVec<float> buf(static_cast<std::size_t>(need), -1.0f);
  {
    const ops::packed::BufferScope<float> scope(buf.data(), need);
    ops::linear_forward_into<float>(x, W, static_cast<const float*>(nullptr), y);
    CHECK(y == y2);
    CHECK(buf[0] != -1.0f);  // the product packed into the caller's buffer
  }
  {
    // room for one panel of columns: B is packed in narrower blocks, the results are the same bits
    const Index one = ops::packed::b_pack_size<float>(64, 48, 1);
    REQUIRE(one < need);
    const ops::packed::BufferScope<float> scope(buf.data(), one);
    ops::linear_forward_into<float>(x, W, static_cast<const float*>(nullptr), y);
    CHECK(y == y2);
  }
  {
    const ops::packed::BufferScope<float> scope(buf.data(), ops::packed::b_pack_size<float>(64, 48, 1) - 1);
    CHECK_THROWS_WITH(ops::linear_forward_into<float>(x, W, static_cast<const float*>(nullptr), y),
                      Catch::Contains("BufferScope") && Catch::Contains("at least"));
  }
  CHECK_THROWS_WITH(ops::packed::BufferScope<float>(buf.data() + 1, need - 1), Catch::Contains("aligned"));
  // after the scopes the thread's own buffer is back in use
  ops::linear_forward_into<float>(x, W, static_cast<const float*>(nullptr), y);
  CHECK(y == y2);
}

namespace {

// The first 64-byte-aligned element of v (v has 16 spare elements at its end).
template <class S>
S* aligned64(std::vector<S>& v) {
  const std::uintptr_t p = reinterpret_cast<std::uintptr_t>(v.data());
  return reinterpret_cast<S*>((p + 63) / 64 * 64);
}

// gemm_whole_b (B packed once by pack_b_whole, reused by many products) and gemm_stream_b (B packed a panel at a
// time) against gemm on the same operands.
template <class S, class Kern>
void check_whole_b(Rng& rng) {
  const Index cases[][3] = {{1, 1, 1},   {3, 5, 7},     {12, 32, 16},   {13, 33, 17},  {11, 31, 1},
                            {25, 70, 513}, {40, 17, 1100}, {128, 300, 64}, {66, 64, 1024}, {2, 1100, 520}};
  for (const auto& mnk : cases) {
    const Index M = mnk[0], N = mnk[1], K = mnk[2];
    for (int layout = 0; layout < 4; ++layout)
      for (int acc = 0; acc < 2; ++acc) {
        const Strided<S> a(M, K, layout & 1, rng), b(K, N, layout & 2, rng);
        const Index ldc = N + 5;
        std::vector<S> c0(static_cast<std::size_t>(M * ldc));
        for (S& x : c0) x = static_cast<S>(rng.normal());
        std::vector<S> want = c0, got = c0;
        ops::packed::gemm<S, Kern>(M, N, K, a.view(), b.view(), want.data(), ldc, acc != 0);
        const Index nb = ops::packed::whole_b_size<S, Kern>(K, N), na = ops::packed::whole_a_size<S, Kern>(M, K);
        REQUIRE(nb >= K * N);
        std::vector<S> bbuf(static_cast<std::size_t>(nb + 16), S(-7)), abuf(static_cast<std::size_t>(na + 16), S(-7));
        S* const bp = aligned64(bbuf);  // the panels are read as whole vectors
        S* const ap = aligned64(abuf);
        ops::packed::pack_b_whole<S, Kern>(K, N, b.view(), bp);
        ops::packed::gemm_whole_b<S, Kern>(M, N, K, a.view(), bp, got.data(), ldc, acc != 0, ap);
        INFO("M " << M << " N " << N << " K " << K << " layout " << layout << " accumulate " << acc << " kernel "
                  << Kern::MR << "x" << Kern::NR);
        CHECK(got == want);  // every element and the padding between C's rows
        // the packed B is reusable: a second product with other A rows gives gemm's bits again
        const Strided<S> a2(M, K, layout & 1, rng);
        std::vector<S> want2 = c0, got2 = c0;
        ops::packed::gemm<S, Kern>(M, N, K, a2.view(), b.view(), want2.data(), ldc, acc != 0);
        ops::packed::gemm_whole_b<S, Kern>(M, N, K, a2.view(), bp, got2.data(), ldc, acc != 0, ap);
        CHECK(got2 == want2);
        // B streamed one panel at a time (gemm_stream_b): gemm's bits again
        std::vector<S> pbuf(static_cast<std::size_t>(ops::packed::stream_b_size<S, Kern>(K) + 16), S(-7)), got3 = c0;
        ops::packed::gemm_stream_b<S, Kern>(M, N, K, a2.view(), b.view(), got3.data(), ldc, acc != 0, ap,
                                            aligned64(pbuf));
        CHECK(got3 == want2);
      }
  }
}

}  // namespace

TEST_CASE("packed gemm: B packed once (gemm_whole_b) or a panel at a time (gemm_stream_b) gives gemm's bits",
          "[gemm]") {
  Rng rng(15);
  check_whole_b<float, ops::packed::DefaultKernel<float>>(rng);
  check_whole_b<double, ops::packed::DefaultKernel<double>>(rng);
  check_whole_b<float, ops::packed::Kernel<float, 32, 6, 2>>(rng);
  check_whole_b<float, ops::packed::Kernel<float, 16, 4, 2>>(rng);
  check_whole_b<double, ops::packed::Kernel<double, 16, 4, 2>>(rng);
}

}  // namespace test_packed_gemm
