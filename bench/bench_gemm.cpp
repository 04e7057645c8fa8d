// bench_gemm: the library's packed matrix product (dea/ops/packed_gemm.hpp, behind ops::linear and ops::gemm)
// against Eigen's product run on fixed row blocks (how ops/gemm.hpp computed them before), on the products of a
// Linear layer, one JSON line per (shape, product, threads); with --scalar bf16, the mixed-precision product
// (dea/ops/packed_bf16.hpp) against the float packed product.
//
//   bench_gemm [--shape MxNxK ...] [--set train,lm,bert] [--threads 1,2] [--rounds 5] [--scalar float|double|bf16]
//              [--peak-reps 10]
//
// A shape is M rows (batch x tokens), N outputs, K inputs. Products: forward y = x W^T (x [M, K], W [N, K]),
// input_grad dx = dy W (dy [M, N]), weight_grad dW += dy^T x. Each round times one call of each side (best of
// three), the two sides alternating, so both see the same machine state; a line gives the median over the rounds
// of each side's GFLOP/s and of the per-round ratio packed / eigen (above 1: the packed product is faster).
// Before timing, both sides' results are compared (max difference relative to the largest |value|; above 1e-4 in
// float or 1e-12 in double the program fails with exit status 3).
//
// Every line also gives the peak of its precision on its thread count, measured by the peak probe (bench/peak.hpp,
// the best of --peak-reps short rounds) before the thread count's shapes: peak_gflops (FP32 fused multiply-adds for
// float, FP64 for double, bf16 dot products for bf16; 0 when the CPU has no instruction for it) and
// peak_fraction = packed_gflops / peak_gflops.
//
// --scalar bf16 times the float products of a training step run in bf16: the same three ops:: calls under
// dea::ScopedPrecision(Precision::bf16) (float operands rounded to bf16 as they are packed, float accumulation),
// against the same calls in float (fp32_gflops, packed_over_fp32: above 1 the bf16 product is faster); and, as a
// line of its own ("weights": "bf16"), the forward product of inference with the weight stored in bf16
// (ops::packed::gemm_bf16 with a bf16 B), and one more ("weights": "bf16_packed") with the weight packed once
// (ops::packed::Bf16Matrix, as an inference model keeps it). Before timing, each bf16 result is compared with the
// float product's on the same inputs (above 2e-2 of the largest |value| the program fails with exit status 3: bf16
// keeps 8 bits, so this only catches a broken product), and the bf16-weight forwards must equal the float-operand
// one bit for bit.
//
// Shape sets (--set, used when no --shape is given; default train,lm,bert):
//   train  a 32x128x512x8 attention layer's projections (4096x512x512) and the quick, mid and paper training
//          configurations' FFN (2048x256x128, 2048x1024x256, 4096x2048x512)
//   lm     bench_lm's decoder (2048 tokens, D 384, SwiGLU 1792): a projection 2048x384x384, the FFN's up and gate
//          products 2048x1792x384 and its down product 2048x384x1792
//   bert   bert-base at batch 32 x 64 tokens (D 768, FFN 3072): a projection 2048x768x768, the FFN's 2048x3072x768
//          and 2048x768x3072
// Defaults: threads 1,2; 5 rounds; float.
// Exit status: 0 done, 1 failure, 2 bad command line, 3 the two products disagree.
#include <dea/core/allocator.hpp>
#include <dea/core/init.hpp>
#include <dea/core/rng.hpp>
#include <dea/cli/flags.hpp>
#include <dea/core/bf16.hpp>
#include <dea/core/parallel.hpp>
#include <dea/ops/gemm.hpp>
#include <dea/ops/linear.hpp>
#include <dea/ops/packed_bf16.hpp>

#include <fmt/core.h>

#include "peak.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

using namespace dea;

namespace {

struct Shape3 {
  Index M, N, K;
};

constexpr const char* kUsage =
    "usage: bench_gemm [--shape MxNxK ...] [--set train,lm,bert] [--threads 1,2] [--rounds 5]\n"
    "                  [--scalar float|double|bf16] [--peak-reps 10]\n";

/// The shape sets of --set (see the file comment).
std::vector<Shape3> shape_set(const std::string& name) {
  if (name == "train") return {{4096, 512, 512}, {2048, 256, 128}, {2048, 1024, 256}, {4096, 2048, 512}};
  if (name == "lm") return {{2048, 384, 384}, {2048, 1792, 384}, {2048, 384, 1792}};
  if (name == "bert") return {{2048, 768, 768}, {2048, 3072, 768}, {2048, 768, 3072}};
  return {};
}

Shape3 parse_shape(const std::string& v) {
  const std::string expected = "MxNxK: three integers in [1, 65536] with M*N*K <= 2^40";
  const std::vector<std::string> p = cli::split(v, 'x');
  if (p.size() != 3) cli::bad_value("--shape", v, expected);
  std::int64_t n[3];
  for (int k = 0; k < 3; ++k) {
    try {
      n[k] = cli::parse_int("--shape", p[static_cast<std::size_t>(k)], 1, 65536);
    } catch (const Error&) {
      cli::bad_value("--shape", v, expected);
    }
  }
  if (double(n[0]) * double(n[1]) * double(n[2]) > double(std::int64_t(1) << 40)) cli::bad_value("--shape", v, expected);
  return {n[0], n[1], n[2]};
}

template <class F>
double best_ms(F&& f) {
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

template <class S>
double max_rel_diff(const Mat<S>& a, const Mat<S>& b) {
  const double scale = std::max<double>(double(b.cwiseAbs().maxCoeff()), 1e-300);
  return double((a - b).cwiseAbs().maxCoeff()) / scale;
}

/// Returns 0, or 3 when the two sides disagree.
template <class S>
int run(const Shape3& s, int threads, int rounds, const char* scalar, double peak) {
  set_num_threads(threads);
  Rng rng(3);
  Mat<S> x(s.M, s.K), W(s.N, s.K), dy(s.M, s.N);
  init::normal(x, rng, 0, 1);
  init::normal(W, rng, 0, 1);
  init::normal(dy, rng, 0, 1);
  Mat<S> y_e(s.M, s.N), y_p(s.M, s.N), dx_e(s.M, s.K), dx_p(s.M, s.K);
  Mat<S> dW_e = Mat<S>::Zero(s.N, s.K), dW_p = Mat<S>::Zero(s.N, s.K);
  MatMap<S> dW_pm(dW_p.data(), s.N, s.K);

  // Eigen on the fixed row blocks the library used before the packed product
  auto eigen_forward = [&] {
    ops::for_row_blocks(s.M, [&](Index r0, Index nr) { y_e.middleRows(r0, nr).noalias() = x.middleRows(r0, nr) * W.transpose(); });
  };
  auto eigen_input_grad = [&] {
    ops::for_row_blocks(s.M, [&](Index r0, Index nr) { dx_e.middleRows(r0, nr).noalias() = dy.middleRows(r0, nr) * W; });
  };
  auto eigen_weight_grad = [&] {
    ops::for_blocks(s.N, ops::gemm_tn_row_blocks(s.N), [&](Index r0, Index nr) {
      dW_e.middleRows(r0, nr).noalias() += dy.middleCols(r0, nr).transpose() * x;
    });
  };
  auto packed_forward = [&] { ops::linear_forward_into<S>(x, W, static_cast<const S*>(nullptr), y_p); };
  auto packed_input_grad = [&] { ops::gemm_into(dy, W, dx_p); };
  auto packed_weight_grad = [&] { ops::gemm_tn_add<S>(dy, x, dW_pm); };

  eigen_forward();
  packed_forward();
  eigen_input_grad();
  packed_input_grad();
  eigen_weight_grad();
  packed_weight_grad();
  const double bound = sizeof(S) == 4 ? 1e-4 : 1e-12;
  const double diffs[3] = {max_rel_diff(y_p, y_e), max_rel_diff(dx_p, dx_e), max_rel_diff(dW_p, dW_e)};
  const char* names[3] = {"forward", "input_grad", "weight_grad"};
  for (int k = 0; k < 3; ++k)
    if (!(diffs[k] <= bound)) {
      fmt::print(stderr, "bench_gemm: the packed and Eigen {} products disagree at {}x{}x{}: {:.3e} > {:.0e}\n",
                 names[k], s.M, s.N, s.K, diffs[k], bound);
      return 3;
    }

  const double gflop = 2.0 * double(s.M) * double(s.N) * double(s.K) / 1e9;
  for (int k = 0; k < 3; ++k) {
    std::vector<double> ge, gp, ratio;
    for (int r = 0; r < rounds; ++r) {
      double me, mp;
      if (k == 0) {
        me = best_ms(eigen_forward);
        mp = best_ms(packed_forward);
      } else if (k == 1) {
        mp = best_ms(packed_input_grad);
        me = best_ms(eigen_input_grad);
      } else {
        me = best_ms(eigen_weight_grad);
        mp = best_ms(packed_weight_grad);
      }
      ge.push_back(gflop / (me / 1e3));
      gp.push_back(gflop / (mp / 1e3));
      ratio.push_back(me / mp);
    }
    fmt::print("{{\"bench\": \"gemm\", \"product\": \"{}\", \"M\": {}, \"N\": {}, \"K\": {}, \"threads\": {}, "
               "\"scalar\": \"{}\", \"rounds\": {}, \"eigen_gflops\": {:.1f}, \"packed_gflops\": {:.1f}, "
               "\"packed_over_eigen\": {:.3f}, \"max_rel_diff\": {:.2e}, \"peak_gflops\": {:.1f}, "
               "\"peak_fraction\": {:.3f}}}\n",
               names[k], s.M, s.N, s.K, threads, scalar, rounds, median(ge), median(gp), median(ratio), diffs[k], peak,
               peak > 0 ? median(gp) / peak : 0.0);
    std::fflush(stdout);
  }
  return 0;
}

/// --scalar bf16 (see the file comment). Returns 0, or 3 when a bf16 result is not the product it should be.
int run_bf16(const Shape3& s, int threads, int rounds, double peak) {
  using S = float;
  set_num_threads(threads);
  Rng rng(3);
  Mat<S> x(s.M, s.K), W(s.N, s.K), dy(s.M, s.N);
  init::normal(x, rng, 0, 1);
  init::normal(W, rng, 0, 1);
  init::normal(dy, rng, 0, 1);
  std::vector<bf16> Wb(static_cast<std::size_t>(s.N * s.K));
  for (std::size_t i = 0; i < Wb.size(); ++i) Wb[i] = to_bf16(W.data()[i]);
  Mat<S> y_f(s.M, s.N), y_b(s.M, s.N), y_w(s.M, s.N), dx_f(s.M, s.K), dx_b(s.M, s.K);
  Mat<S> dW_f = Mat<S>::Zero(s.N, s.K), dW_b = Mat<S>::Zero(s.N, s.K);
  MatMap<S> dW_fm(dW_f.data(), s.N, s.K), dW_bm(dW_b.data(), s.N, s.K);

  auto f32_forward = [&] { ops::linear_forward_into<S>(x, W, static_cast<const S*>(nullptr), y_f); };
  auto f32_input_grad = [&] { ops::gemm_into(dy, W, dx_f); };
  auto f32_weight_grad = [&] { ops::gemm_tn_add<S>(dy, x, dW_fm); };
  auto bf_forward = [&] {
    ScopedPrecision bf(Precision::bf16);
    ops::linear_forward_into<S>(x, W, static_cast<const S*>(nullptr), y_b);
  };
  auto bf_input_grad = [&] {
    ScopedPrecision bf(Precision::bf16);
    ops::gemm_into(dy, W, dx_b);
  };
  auto bf_weight_grad = [&] {
    ScopedPrecision bf(Precision::bf16);
    ops::gemm_tn_add<S>(dy, x, dW_bm);
  };
  // y = x W^T with W [N, K] stored in bf16: B = W^T, a [K, N] view of the row-major W
  const ops::packed::View<S> xv{x.data(), s.K, 1};
  const ops::packed::View<bf16> wtv = ops::packed::View<bf16>{Wb.data(), s.K, 1}.t();
  auto bfw_forward = [&] { ops::packed::gemm_bf16(s.M, s.N, s.K, xv, wtv, y_w.data(), s.N, false, nullptr); };
  // the same weight packed once (ops::packed::Bf16Matrix), as an inference model holds it
  const ops::packed::Bf16Matrix Wp(s.K, s.N, wtv);
  Mat<S> y_p(s.M, s.N);
  auto bfp_forward = [&] { ops::packed::gemm_bf16(s.M, xv, Wp, y_p.data(), s.N, false, nullptr); };

  f32_forward();
  bf_forward();
  bfw_forward();
  bfp_forward();
  f32_input_grad();
  bf_input_grad();
  f32_weight_grad();
  bf_weight_grad();
  const double bound = 2e-2;
  const double diffs[3] = {max_rel_diff(y_b, y_f), max_rel_diff(dx_b, dx_f), max_rel_diff(dW_b, dW_f)};
  const char* names[3] = {"forward", "input_grad", "weight_grad"};
  for (int k = 0; k < 3; ++k)
    if (!(diffs[k] <= bound)) {
      fmt::print(stderr, "bench_gemm: the bf16 and float {} products disagree at {}x{}x{}: {:.3e} > {:.0e}\n",
                 names[k], s.M, s.N, s.K, diffs[k], bound);
      return 3;
    }
  if (!(y_w.array() == y_b.array()).all() || !(y_p.array() == y_b.array()).all()) {
    fmt::print(stderr, "bench_gemm: the forward product with bf16 weights differs from the one with float weights "
               "rounded as it runs at {}x{}x{}\n", s.M, s.N, s.K);
    return 3;
  }

  const double gflop = 2.0 * double(s.M) * double(s.N) * double(s.K) / 1e9;
  auto line = [&](const char* product, const char* weights, const std::vector<double>& gf,
                  const std::vector<double>& gb, const std::vector<double>& ratio, double diff) {
    fmt::print("{{\"bench\": \"gemm\", \"product\": \"{}\", \"M\": {}, \"N\": {}, \"K\": {}, \"threads\": {}, "
               "\"scalar\": \"bf16\", \"weights\": \"{}\", \"rounds\": {}, \"fp32_gflops\": {:.1f}, "
               "\"packed_gflops\": {:.1f}, \"packed_over_fp32\": {:.3f}, \"max_rel_diff\": {:.2e}, "
               "\"peak_gflops\": {:.1f}, \"peak_fraction\": {:.3f}}}\n",
               product, s.M, s.N, s.K, threads, weights, rounds, median(gf), median(gb), median(ratio), diff, peak,
               peak > 0 ? median(gb) / peak : 0.0);
    std::fflush(stdout);
  };
  for (int k = 0; k < 5; ++k) {
    std::vector<double> gf, gb, ratio;
    for (int r = 0; r < rounds; ++r) {
      double mf, mb;
      if (k == 0) {
        mf = best_ms(f32_forward);
        mb = best_ms(bf_forward);
      } else if (k == 1) {
        mb = best_ms(bf_input_grad);
        mf = best_ms(f32_input_grad);
      } else if (k == 2) {
        mf = best_ms(f32_weight_grad);
        mb = best_ms(bf_weight_grad);
      } else if (k == 3) {
        mb = best_ms(bfw_forward);
        mf = best_ms(f32_forward);
      } else {
        mf = best_ms(f32_forward);
        mb = best_ms(bfp_forward);
      }
      gf.push_back(gflop / (mf / 1e3));
      gb.push_back(gflop / (mb / 1e3));
      ratio.push_back(mf / mb);
    }
    if (k < 3)
      line(names[k], "float", gf, gb, ratio, diffs[k]);
    else
      line("forward", k == 3 ? "bf16" : "bf16_packed", gf, gb, ratio, diffs[0]);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<Shape3> shapes;
  std::vector<int> threads = {1, 2};
  int rounds = 5, peak_reps = 10;
  std::string scalar = "float";
  std::vector<std::string> sets = {"train", "lm", "bert"};
  try {
    cli::Args args(argc, argv);
    while (args.next()) {
      if (args.is("-h") || args.is("--help")) {
        fmt::print("{}", kUsage);
        return 0;
      }
      if (args.is("--shape")) {
        shapes.push_back(parse_shape(args.value()));
      } else if (args.is("--threads")) {
        threads.clear();
        for (const std::int64_t t : cli::parse_int_list("--threads", args.value(), 1, cli::kMaxThreads))
          threads.push_back(static_cast<int>(t));
      } else if (args.is("--rounds")) {
        rounds = static_cast<int>(args.int_value(1, 1000));
      } else if (args.is("--set")) {
        const std::string v = args.value();
        sets = cli::split(v, ',');
        if (sets.empty()) cli::bad_value("--set", v, "a comma-separated list of train, lm, bert");
        for (const auto& n : sets)
          if (shape_set(n).empty()) cli::bad_value("--set", v, "a comma-separated list of train, lm, bert");
      } else if (args.is("--peak-reps")) {
        peak_reps = static_cast<int>(args.int_value(1, 1000));
      } else if (args.is("--scalar")) {
        const std::string v = args.value();
        if (v != "float" && v != "double" && v != "bf16") cli::bad_value("--scalar", v, "float, double or bf16");
        scalar = v;
      } else {
        args.unknown();
      }
    }
  } catch (const Error& e) {
    fmt::print(stderr, "bench_gemm: {}\n{}", dea::without_error_prefix(e.what()), kUsage);
    return 2;
  }
  if (shapes.empty())
    for (const auto& n : sets)
      for (const Shape3& s : shape_set(n)) shapes.push_back(s);
  retain_freed_memory();
  const bench_peak::Kind kind = scalar == "double" ? bench_peak::Kind::fp64
                                : scalar == "bf16"   ? bench_peak::Kind::bf16
                                                     : bench_peak::Kind::fp32;
  for (int t : threads) {
    const bench_peak::Peak peak = bench_peak::measure_peak(kind, t, peak_reps);
    fmt::print(stderr, "bench_gemm: {} peak on {} thread(s): {}\n", bench_peak::kind_name(kind), t,
               peak.available ? fmt::format("{:.1f} GFLOP/s ({})", peak.gflops, peak.isa) : std::string("absent"));
    for (const Shape3& s : shapes) {
      const int rc = scalar == "double" ? run<double>(s, t, rounds, "double", peak.gflops)
                     : scalar == "bf16" ? run_bf16(s, t, rounds, peak.gflops)
                                        : run<float>(s, t, rounds, "float", peak.gflops);
      if (rc != 0) return rc;
    }
  }
  return 0;
} catch (const std::bad_alloc&) {
  fmt::print(stderr, "bench_gemm: out of memory\n");
  return 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_gemm: {}\n", dea::without_error_prefix(e.what()));
  return 1;
}
