// bench_gemm: the library's packed matrix product (dea/ops/packed_gemm.hpp, behind ops::linear and ops::gemm)
// against Eigen's product run on fixed row blocks (how ops/gemm.hpp computed them before), on the products of a
// Linear layer, one JSON line per (shape, product, threads).
//
//   bench_gemm [--shape MxNxK ...] [--threads 1,2] [--rounds 5] [--scalar float|double]
//
// A shape is M rows (batch x tokens), N outputs, K inputs. Products: forward y = x W^T (x [M, K], W [N, K]),
// input_grad dx = dy W (dy [M, N]), weight_grad dW += dy^T x. Each round times one call of each side (best of
// three), the two sides alternating, so both see the same machine state; a line gives the median over the rounds
// of each side's GFLOP/s and of the per-round ratio packed / eigen (above 1: the packed product is faster).
// Before timing, both sides' results are compared (max difference relative to the largest |value|; above 1e-4 in
// float or 1e-12 in double the program fails with exit status 3).
// Defaults: the shapes of a 32x128x512x8 attention layer's projections (4096x512x512) and of the quick, mid and paper
// training configurations' FFN (2048x256x128, 2048x1024x256, 4096x2048x512); threads 1,2; 5 rounds; float.
// Exit status: 0 done, 1 failure, 2 bad command line, 3 the two products disagree.
#include <dea/core/allocator.hpp>
#include <dea/core/init.hpp>
#include <dea/core/rng.hpp>
#include <dea/cli/flags.hpp>
#include <dea/ops/gemm.hpp>
#include <dea/ops/linear.hpp>

#include <fmt/core.h>

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

constexpr const char* kUsage = "usage: bench_gemm [--shape MxNxK ...] [--threads 1,2] [--rounds 5] [--scalar float|double]\n";

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
int run(const Shape3& s, int threads, int rounds, const char* scalar) {
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
               "\"packed_over_eigen\": {:.3f}, \"max_rel_diff\": {:.2e}}}\n",
               names[k], s.M, s.N, s.K, threads, scalar, rounds, median(ge), median(gp), median(ratio), diffs[k]);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<Shape3> shapes;
  std::vector<int> threads = {1, 2};
  int rounds = 5;
  bool dbl = false;
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
      } else if (args.is("--scalar")) {
        const std::string v = args.value();
        if (v != "float" && v != "double") cli::bad_value("--scalar", v, "float or double");
        dbl = v == "double";
      } else {
        args.unknown();
      }
    }
  } catch (const Error& e) {
    fmt::print(stderr, "bench_gemm: {}\n{}", dea::without_error_prefix(e.what()), kUsage);
    return 2;
  }
  if (shapes.empty()) shapes = {{4096, 512, 512}, {2048, 256, 128}, {2048, 1024, 256}, {4096, 2048, 512}};
  retain_freed_memory();
  for (int t : threads)
    for (const Shape3& s : shapes) {
      const int rc = dbl ? run<double>(s, t, rounds, "double") : run<float>(s, t, rounds, "float");
      if (rc != 0) return rc;
    }
  return 0;
} catch (const std::bad_alloc&) {
  fmt::print(stderr, "bench_gemm: out of memory\n");
  return 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_gemm: {}\n", dea::without_error_prefix(e.what()));
  return 1;
}
