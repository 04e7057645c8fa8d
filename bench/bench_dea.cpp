// bench_dea: speed and memory of DualExpertAttention, printed as one JSON line per measurement.
//
//   bench_dea [--shape BxTxDxH ...] [--threads 1,2] [--reps 5] [--mode forward,train] [--sizes fixed,dynamic]
//             [--no-yardstick]
//
// Measurements:
//  - yardstick: single-thread float GEMM (Eigen, 256x256x256) run concurrently on every thread, summed GFLOP/s:
//    the machine's compute ceiling measured in the same run;
//  - forward: inference (no oracle, eval mode);
//  - train: forward with an oracle block and gamma_mix = 0.5, backward of mean(output^2) and of the gate loss.
// FLOPs are counted as the anchor counts them: projections 8 N D^2 forward (N = B T), attention core
// B H (6 T^2 Dh + 2 T Dh^2) forward; a training step is three times the forward.
// Each line carries the median of --reps runs (after one warm-up), GFLOP/s, the fraction of the yardstick with
// the same thread count, and the process's peak RSS so far (run one shape per process for a clean figure).
#include <dea/attention/dual_expert.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <sys/resource.h>

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace dea;

namespace {

struct Shape4 {
  Index B, T, D, H;
};

double peak_rss_mb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;
}

template <class F>
double median_ms(int reps, F&& f) {
  f();  // warm-up
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// Summed GFLOP/s of independent single-thread 256^3 float GEMMs, one per thread.
double yardstick(int threads, int reps) {
  const Index n = 256;
  const int iters = 40;
  std::vector<double> rates;
  for (int r = 0; r < reps + 1; ++r) {
    double total = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) reduction(+ : total)
#endif
    {
      Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n), b = Eigen::MatrixXf::Random(n, n), c(n, n);
      c.noalias() = a * b;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) {
        c.noalias() = a * b;
        a(0, 0) += c(1, 1) * 1e-30f;
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      total += 2.0 * double(n) * n * n * iters / s / 1e9;
    }
    if (r > 0) rates.push_back(total);
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

double forward_gflop(const Shape4& s) {
  const double N = double(s.B) * s.T, D = double(s.D), Dh = double(s.D / s.H), T = double(s.T);
  return (8 * N * D * D + double(s.B) * s.H * (6 * T * T * Dh + 2 * T * Dh * Dh)) / 1e9;
}

template <class Layer>
void run_shape(const Shape4& s, int threads, int reps, bool fwd, bool train, const char* sizes, double yard) {
  using S = typename Layer::Scalar;
  set_num_threads(threads);
  Rng rng(0);
  Layer layer(s.D, s.H, rng);
  Mat<S> x(s.B * s.T, s.D);
  init::normal(x, rng, 0, 1);
  Tensor<S> oracle({s.B, s.T, s.T}, std::numeric_limits<S>::quiet_NaN());
  const Index half = s.T / 2;
  for (Index b = 0; b < s.B; ++b)
    for (Index i = 1; i < half; ++i)
      for (Index j = half; j < s.T - 1; ++j) oracle[(b * s.T + i) * s.T + j] = S(rng.uniform(0, 0.95));
  typename Layer::Cache cache;
  const double gf = forward_gflop(s);
  auto emit = [&](const char* what, double ms, double gflop) {
    fmt::print(
        "{{\"bench\": \"dea_{}\", \"B\": {}, \"T\": {}, \"D\": {}, \"H\": {}, \"threads\": {}, \"scalar\": \"{}\", "
        "\"sizes\": \"{}\", \"ms\": {:.2f}, \"reps\": {}, \"gflop\": {:.3f}, \"gflops\": {:.1f}, \"frac_yardstick\": "
        "{:.3f}, \"peak_rss_mb\": {:.0f}}}\n",
        what, s.B, s.T, s.D, s.H, threads, sizeof(S) == 4 ? "float" : "double", sizes, ms, reps, gflop,
        gflop / (ms / 1e3), yard > 0 ? gflop / (ms / 1e3) / yard : 0.0, peak_rss_mb());
    std::fflush(stdout);
  };
  if (fwd) {
    AttnContext<S> ctx;
    const double ms = median_ms(reps, [&] { layer.forward(x, s.B, ctx, cache); });
    emit("forward", ms, gf);
  }
  if (train) {
    AttnContext<S> ctx;
    ctx.alpha_oracle = &oracle;
    ctx.gamma_mix = S(0.5);
    ctx.training = true;
    const double ms = median_ms(reps, [&] {
      layer.zero_grad();
      const Mat<S> y = layer.forward(x, s.B, ctx, cache);
      layer.backward((S(2) / S(y.size())) * y, cache);  // d mean(y^2) / dy
      layer.backward_gate(cache);
    });
    emit("train_step", ms, 3 * gf);
  }
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

[[noreturn]] void usage(const std::string& why) {
  fmt::print(stderr,
             "bench_dea: {}\nusage: bench_dea [--shape BxTxDxH ...] [--threads 1,2] [--reps 5] [--mode forward,train] "
             "[--sizes fixed,dynamic] [--no-yardstick]\n",
             why);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Shape4> shapes;
  std::vector<int> threads = {1, 2};
  int reps = 5;
  bool fwd = true, train = true, fixed = true, dynamic = true, yard = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value after " + a);
      return argv[++i];
    };
    if (a == "--shape") {
      const auto p = split(next(), 'x');
      if (p.size() != 4) usage("--shape expects BxTxDxH");
      Shape4 s{std::atol(p[0].c_str()), std::atol(p[1].c_str()), std::atol(p[2].c_str()), std::atol(p[3].c_str())};
      if (s.B < 1 || s.T < 2 || s.D < 1 || s.H < 1 || s.D % s.H) usage("--shape: bad sizes " + a);
      shapes.push_back(s);
    } else if (a == "--threads") {
      threads.clear();
      for (const auto& t : split(next(), ',')) threads.push_back(std::max(1, std::atoi(t.c_str())));
    } else if (a == "--reps") {
      reps = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--mode") {
      const std::string m = next();
      fwd = m.find("forward") != std::string::npos;
      train = m.find("train") != std::string::npos;
    } else if (a == "--sizes") {
      const std::string m = next();
      fixed = m.find("fixed") != std::string::npos;
      dynamic = m.find("dynamic") != std::string::npos;
    } else if (a == "--no-yardstick") {
      yard = false;
    } else {
      usage("unknown flag " + a);
    }
  }
  if (shapes.empty()) shapes.push_back({32, 128, 512, 8});
  for (int t : threads) {
    const double y = yard ? yardstick(t, 3) : 0.0;
    if (yard)
      fmt::print("{{\"bench\": \"yardstick_gemm\", \"threads\": {}, \"n\": 256, \"gflops\": {:.1f}}}\n", t, y);
    for (const Shape4& s : shapes) {
      if (fixed && s.D == 512 && s.H == 8) run_shape<DualExpertAttention<float, 8, 64>>(s, t, reps, fwd, train, "fixed", y);
      if (dynamic) run_shape<DualExpertAttention<float>>(s, t, reps, fwd, train, "dynamic", y);
    }
  }
  return 0;
}
