// bench_dea: speed and memory of DualExpertAttention, printed as one JSON line per measurement.
//
//   bench_dea [--shape BxTxDxH ...] [--threads 1,2] [--reps 5] [--mode forward,train] [--sizes fixed,dynamic]
//             [--kernel tiled,reference] [--block-q N] [--oracle dense|none] [--no-check] [--max-ref-gb 6]
//             [--no-yardstick] [--no-retain]
//
// Kernels (DualExpertAttention::Options::kernel): `tiled` (query blocks, O(T) memory) and `reference` (every
// [B, H, T, T] map kept). Before any timing, a child process (fork, so the parent's peak RSS stays clean) runs a
// training step and an inference forward with both kernels on the same inputs and parameters and prints
// {"bench": "dea_kernel_check", "max_rel_diff": ...}: the largest difference of the outputs, the input gradient,
// every parameter gradient and the gate loss, each relative to its tensor's largest magnitude. Above the float
// round-off bound 1e-3 the program fails (exit 3) before timing anything. When the reference kernel would need more
// than --max-ref-gb GB at a shape (1x8192x512x8 needs ~30 GB) it is refused there with a message on stderr, and the
// check runs at the same D and H with B = 1, T = 1024 instead (check_T says which).
// For each shape the tiled kernel runs first, so its peak_rss_mb is not raised by the reference kernel's maps;
// for clean per-shape peaks run one shape and one kernel per process (README, "Speed and memory of the attention
// layer").
// When both kernels are timed, a "dea_kernel_ratio" line gives reference_ms / tiled_ms.
// Like examples/train, the program calls dea::retain_freed_memory() first (freed step buffers are reused instead
// of being faulted in again on every step); --no-retain keeps glibc's defaults. The peak RSS is about the same.
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
//
// Values: --shape BxTxDxH with B in [1, 2^20], T in [2, 2^20], D in [1, 65536], H dividing D, B*T*D <= 2^48 and
// B*H*T*T <= 2^60 (so no size computation can overflow); --threads integers in [1, 4096]; --reps 1..100000;
// --mode a list of forward, train; --sizes of fixed, dynamic; --kernel of tiled, reference; --block-q 0..2^20
// (0: the layer's default); --max-ref-gb a number in [0, 1e6].
// Exit status: 0 done; 1 a failure, e.g. out of memory (the message names the shape, kernel and thread count);
// 2 bad command line; 3 the kernels disagree (or the check process crashed).
#include <dea/attention/dual_expert.hpp>
#include <dea/core/allocator.hpp>
#include <dea/cli/flags.hpp>

#include <fmt/core.h>

#include "bench_util.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace dea;

using bench_util::peak_rss_mb;

namespace {

struct Shape4 {
  Index B, T, D, H;
};

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

double forward_gflop(const Shape4& s) {
  const double N = double(s.B) * s.T, D = double(s.D), Dh = double(s.D / s.H), T = double(s.T);
  return (8 * N * D * D + double(s.B) * s.H * (6 * T * T * Dh + 2 * T * Dh * Dh)) / 1e9;
}

const char* kernel_name(DeaKernel k) { return k == DeaKernel::tiled ? "tiled" : "reference"; }

/// Bytes the reference kernel's [B, H, T, T] maps take in a training step (14 scalar maps and one byte map).
double reference_bytes(const Shape4& s, std::size_t scalar) {
  return double(s.B) * s.H * double(s.T) * double(s.T) * (14.0 * double(scalar) + 1.0);
}

/// The benchmark's inputs: x ~ N(0, 1) [B*T, D] and an oracle block (rows 1..T/2-1, keys T/2..T-2 labelled).
template <class S>
void make_inputs(const Shape4& s, Rng& rng, Mat<S>& x, Tensor<S>& oracle) {
  x.resize(s.B * s.T, s.D);
  init::normal(x, rng, 0, 1);
  oracle = Tensor<S>({s.B, s.T, s.T}, std::numeric_limits<S>::quiet_NaN());
  const Index half = s.T / 2;
  for (Index b = 0; b < s.B; ++b)
    for (Index i = 1; i < half; ++i)
      for (Index j = half; j < s.T - 1; ++j) oracle[(b * s.T + i) * s.T + j] = S(rng.uniform(0, 0.95));
}

template <class Layer>
Layer make_layer(const Shape4& s, DeaKernel kernel, Index block_q) {
  Rng rng(0);
  typename Layer::Options opt;
  opt.kernel = kernel;
  opt.block_q = block_q;
  return Layer(s.D, s.H, rng, opt);
}

/// A training step (forward with the oracle and gamma_mix = 0.5, backward of mean(y^2), backward of the gate loss)
/// and an inference forward; returns every result as one list of tensors.
template <class Layer>
std::vector<Vec<double>> check_step(Layer& layer, const Shape4& s, const Mat<typename Layer::Scalar>& x,
                                    const Tensor<typename Layer::Scalar>& oracle, double& loss_gate) {
  using S = typename Layer::Scalar;
  std::vector<Vec<double>> out;
  typename Layer::Cache cache;
  AttnInputs<S> in(s.B, s.T);
  in.set_oracle(oracle).set_gamma_mix(S(0.5)).set_training(true);
  layer.zero_grad();
  const Mat<S> y = layer.forward(x, in, cache);
  const Mat<S> dx = layer.backward((S(2) / S(y.size())) * y, cache);
  layer.backward_gate(cache);
  loss_gate = double(cache.loss_gate);
  auto flat = [](const S* p, Index n) { return Eigen::Map<const Eigen::Matrix<S, Eigen::Dynamic, 1>>(p, n).template cast<double>().eval(); };
  out.push_back(flat(y.data(), y.size()));
  out.push_back(flat(dx.data(), dx.size()));
  for (Param<S>* p : layer.parameters()) out.push_back(flat(p->grad.data(), p->numel()));
  typename Layer::Cache c2;
  const Mat<S> yi = layer.forward(x, AttnInputs<S>(s.B, s.T), c2);
  out.push_back(flat(yi.data(), yi.size()));
  return out;
}

/// Runs both kernels on the same inputs (in a child process) and returns the largest relative difference.
template <class Layer>
double kernel_agreement(const Shape4& s, Index block_q) {
  using S = typename Layer::Scalar;
  Rng rng(1);
  Mat<S> x;
  Tensor<S> oracle;
  make_inputs(s, rng, x, oracle);
  Layer ref = make_layer<Layer>(s, DeaKernel::reference, block_q);
  Layer til = make_layer<Layer>(s, DeaKernel::tiled, block_q);
  double lr = 0, lt = 0;
  const auto a = check_step(ref, s, x, oracle, lr);
  const auto b = check_step(til, s, x, oracle, lt);
  double worst = std::abs(lr - lt) / std::max(std::abs(lr), 1e-30);
  for (std::size_t k = 0; k < a.size(); ++k) {
    const double scale = a[k].cwiseAbs().maxCoeff();
    const double d = (a[k] - b[k]).cwiseAbs().maxCoeff();
    if (scale > 0) worst = std::max(worst, d / scale);
    else worst = std::max(worst, d > 0 ? 1.0 : 0.0);  // exact zeros (isolation) must stay exact
  }
  return worst;
}

template <class Layer>
void run_shape(const Shape4& s, DeaKernel kernel, Index block_q, int threads, int reps, bool fwd, bool train,
               bool oracle_on, const char* sizes, double yard, double* ms_out) {
  using S = typename Layer::Scalar;
  set_num_threads(threads);
  Rng rng(1);
  Mat<S> x;
  Tensor<S> oracle;
  if (oracle_on && train) {
    make_inputs(s, rng, x, oracle);
  } else {
    x.resize(s.B * s.T, s.D);
    init::normal(x, rng, 0, 1);
  }
  Layer layer = make_layer<Layer>(s, kernel, block_q);
  typename Layer::Cache cache;
  const double gf = forward_gflop(s);
  auto emit = [&](const char* what, double ms, double gflop) {
    fmt::print(
        "{{\"bench\": \"dea_{}\", \"kernel\": \"{}\", \"block_q\": {}, \"B\": {}, \"T\": {}, \"D\": {}, \"H\": {}, "
        "\"threads\": {}, \"scalar\": \"{}\", \"sizes\": \"{}\", \"ms\": {:.2f}, \"reps\": {}, \"gflop\": {:.3f}, "
        "\"gflops\": {:.1f}, \"frac_yardstick\": {:.3f}, \"oracle_mb\": {:.0f}, \"peak_rss_mb\": {:.0f}}}\n",
        what, kernel_name(kernel), kernel == DeaKernel::tiled ? cache.block_q : 0, s.B, s.T, s.D, s.H, threads,
        sizeof(S) == 4 ? "float" : "double", sizes, ms, reps, gflop, gflop / (ms / 1e3),
        yard > 0 ? gflop / (ms / 1e3) / yard : 0.0, double(oracle.numel()) * sizeof(S) / 1048576.0, peak_rss_mb());
    std::fflush(stdout);
  };
  if (fwd) {
    const AttnInputs<S> in(s.B, s.T);
    const double ms = median_ms(reps, [&] { layer.forward(x, in, cache); });
    emit("forward", ms, gf);
    ms_out[0] = ms;
  }
  if (train) {
    // the inputs of one training forward: built, validated and (with the oracle) copied once, as a model does
    AttnInputs<S> in(s.B, s.T);
    if (oracle_on) in.set_oracle(oracle).set_gamma_mix(S(0.5));
    in.set_training(true);
    const double ms = median_ms(reps, [&] {
      layer.zero_grad();
      const Mat<S> y = layer.forward(x, in, cache);
      layer.backward((S(2) / S(y.size())) * y, cache);  // d mean(y^2) / dy
      layer.backward_gate(cache);
    });
    emit(oracle_on ? "train_step" : "train_step_no_oracle", ms, 3 * gf);
    ms_out[1] = ms;
  }
}

constexpr const char* kUsage =
    "usage: bench_dea [--shape BxTxDxH ...] [--threads 1,2] [--reps 5] [--mode forward,train] [--sizes fixed,dynamic] "
    "[--kernel tiled,reference] [--block-q N] [--oracle dense|none] [--no-check] [--max-ref-gb 6] [--no-yardstick] "
    "[--no-retain]\n";

/// The largest sizes --shape takes, and the largest products: every index the layer computes (up to B H T T)
/// fits in 64 bits with room to spare, so a large shape fails by running out of memory, never by overflowing.
constexpr std::int64_t kMaxB = 1 << 20, kMaxT = 1 << 20, kMaxD = 1 << 16;
constexpr double kMaxBTD = 1LL << 48, kMaxBHTT = 1LL << 60;

/// --shape BxTxDxH: four integers, T >= 2, H dividing D, within the bounds above.
Shape4 parse_shape(const std::string& v) {
  const std::string expected = fmt::format(
      "BxTxDxH with B in [1, {}], T in [2, {}], D in [1, {}], H dividing D, B*T*D <= 2^48 and B*H*T*T <= 2^60", kMaxB,
      kMaxT, kMaxD);
  const std::vector<std::string> p = cli::split(v, 'x');
  if (p.size() != 4) cli::bad_value("--shape", v, expected);
  const std::int64_t lo[4] = {1, 2, 1, 1}, hi[4] = {kMaxB, kMaxT, kMaxD, kMaxD};
  std::int64_t n[4];
  for (int k = 0; k < 4; ++k) {
    try {
      n[k] = cli::parse_int("--shape", p[static_cast<std::size_t>(k)], lo[k], hi[k]);
    } catch (const Error&) {
      cli::bad_value("--shape", v, expected);
    }
  }
  const Shape4 s{n[0], n[1], n[2], n[3]};
  if (s.D % s.H != 0 || double(s.B) * double(s.T) * double(s.D) > kMaxBTD ||
      double(s.B) * double(s.H) * double(s.T) * double(s.T) > kMaxBHTT)
    cli::bad_value("--shape", v, expected);
  return s;
}

/// A comma-separated list of words from `allowed` (at least one); `pick(word)` is called for each.
template <class F>
void parse_words(const std::string& flag, const std::string& v, const std::vector<std::string>& allowed, F&& pick) {
  std::string expected = "a comma-separated list of";
  for (std::size_t k = 0; k < allowed.size(); ++k) expected += (k ? ", " : " ") + allowed[k];
  for (const std::string& w : cli::split(v, ',')) {
    if (std::find(allowed.begin(), allowed.end(), w) == allowed.end()) cli::bad_value(flag, v, expected);
    pick(w);
  }
}

std::string shape_text(const Shape4& s) { return fmt::format("{}x{}x{}x{}", s.B, s.T, s.D, s.H); }

}  // namespace

int main(int argc, char** argv) try {
  std::vector<Shape4> shapes;
  std::vector<int> threads = {1, 2};
  int reps = 5;
  bool fwd = true, train = true, fixed = true, dynamic = true, yard = true, check = true, oracle_on = true;
  bool retain = true;
  std::vector<DeaKernel> kernels = {DeaKernel::tiled, DeaKernel::reference};
  Index block_q = 0;
  double max_ref_gb = 6.0;
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
      } else if (args.is("--reps")) {
        reps = static_cast<int>(args.int_value(1, 100000));
      } else if (args.is("--mode")) {
        fwd = train = false;
        parse_words("--mode", args.value(), {"forward", "train"}, [&](const std::string& w) {
          (w == "forward" ? fwd : train) = true;
        });
      } else if (args.is("--sizes")) {
        fixed = dynamic = false;
        parse_words("--sizes", args.value(), {"fixed", "dynamic"}, [&](const std::string& w) {
          (w == "fixed" ? fixed : dynamic) = true;
        });
      } else if (args.is("--no-yardstick")) {
        yard = false;
      } else if (args.is("--kernel")) {
        bool tiled = false, reference = false;
        parse_words("--kernel", args.value(), {"tiled", "reference"}, [&](const std::string& w) {
          (w == "tiled" ? tiled : reference) = true;
        });
        kernels.clear();
        if (tiled) kernels.push_back(DeaKernel::tiled);  // tiled first: clean peak RSS
        if (reference) kernels.push_back(DeaKernel::reference);
      } else if (args.is("--block-q")) {
        block_q = static_cast<Index>(args.int_value(0, kMaxT));
      } else if (args.is("--oracle")) {
        const std::string m = args.value();
        if (m != "dense" && m != "none") cli::bad_value("--oracle", m, "dense or none");
        oracle_on = m == "dense";
      } else if (args.is("--no-check")) {
        check = false;
      } else if (args.is("--no-retain")) {
        retain = false;
      } else if (args.is("--max-ref-gb")) {
        max_ref_gb = args.double_value(cli::Range::closed(0, 1e6));
      } else {
        args.unknown();
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_dea: {}\n{}", dea::without_error_prefix(e.what()), kUsage);
    return 2;
  }
  if (shapes.empty()) shapes.push_back({32, 128, 512, 8});
  if (retain) dea::retain_freed_memory();  // as examples/train: reuse freed step buffers (no page faults per step)
  auto ref_ok = [&](const Shape4& s) { return reference_bytes(s, sizeof(float)) <= max_ref_gb * 1e9; };
  // ---- agreement of the kernels, before any timing, in a child process (the parent has not started OpenMP yet,
  // and its peak RSS stays that of the timed runs)
  if (check)
    for (const Shape4& s : shapes) {
      Shape4 cs = s;
      if (!ref_ok(s)) cs = Shape4{1, std::min<Index>(s.T, 1024), s.D, s.H};
      std::fflush(stdout);
      const pid_t pid = fork();
      if (pid < 0) {
        fmt::print(stderr, "bench_dea: fork failed for the kernel check\n");
        return 3;
      }
      if (pid == 0) {
        set_num_threads(threads.empty() ? 1 : *std::max_element(threads.begin(), threads.end()));
        const bool fx = fixed && cs.D == 512 && cs.H == 8;
        double d = 0;
        try {
          d = fx ? kernel_agreement<DualExpertAttention<float, 8, 64>>(cs, block_q)
                 : kernel_agreement<DualExpertAttention<float>>(cs, block_q);
        } catch (const std::bad_alloc&) {
          fmt::print(stderr, "bench_dea: out of memory in the kernel check at shape {}\n", shape_text(cs));
          std::fflush(stderr);
          _exit(1);
        } catch (const std::exception& e) {
          fmt::print(stderr, "bench_dea: the kernel check at shape {} failed: {}\n", shape_text(cs),
                     dea::without_error_prefix(e.what()));
          std::fflush(stderr);
          _exit(1);
        }
        const double bound = 1e-3;
        fmt::print("{{\"bench\": \"dea_kernel_check\", \"B\": {}, \"T\": {}, \"D\": {}, \"H\": {}, \"check_B\": {}, "
                   "\"check_T\": {}, \"sizes\": \"{}\", \"max_rel_diff\": {:.3e}, \"bound\": {:.0e}, \"ok\": {}}}\n",
                   s.B, s.T, s.D, s.H, cs.B, cs.T, fx ? "fixed" : "dynamic", d, bound, d <= bound ? "true" : "false");
        std::fflush(stdout);
        _exit(d <= bound ? 0 : 3);
      }
      int status = 0;
      waitpid(pid, &status, 0);
      if (WIFEXITED(status) && WEXITSTATUS(status) == 1) return 1;  // the child said why: nothing was compared
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fmt::print(stderr, "bench_dea: FAILED: the tiled and reference kernels disagree (or the check crashed) at "
                   "{}x{}x{}x{}; nothing was timed\n", s.B, s.T, s.D, s.H);
        return 3;
      }
    }
  for (int t : threads) {
    const double y = yard ? bench_util::yardstick_gflops(t, 3) : 0.0;
    if (yard)
      fmt::print("{{\"bench\": \"yardstick_gemm\", \"threads\": {}, \"n\": 256, \"gflops\": {:.1f}}}\n", t, y);
    for (const Shape4& s : shapes) {
      for (int sz = 0; sz < 2; ++sz) {
        const bool fx = sz == 0;
        if (fx ? !(fixed && s.D == 512 && s.H == 8) : !dynamic) continue;
        double ms[2][2] = {{0, 0}, {0, 0}};  // [kernel][forward, train]
        for (DeaKernel k : kernels) {
          if (k == DeaKernel::reference && !ref_ok(s)) {
            fmt::print(stderr, "bench_dea: refusing the reference kernel at {}x{}x{}x{}: its [B, H, T, T] maps would need "
                       "~{:.1f} GB (limit --max-ref-gb {}); the tiled kernel runs this shape in O(T) memory\n",
                       s.B, s.T, s.D, s.H, reference_bytes(s, sizeof(float)) / 1e9, max_ref_gb);
            continue;
          }
          double* out = ms[k == DeaKernel::tiled ? 1 : 0];
          try {
            if (fx)
              run_shape<DualExpertAttention<float, 8, 64>>(s, k, block_q, t, reps, fwd, train, oracle_on, "fixed", y,
                                                           out);
            else
              run_shape<DualExpertAttention<float>>(s, k, block_q, t, reps, fwd, train, oracle_on, "dynamic", y, out);
          } catch (const std::bad_alloc&) {
            fmt::print(stderr, "bench_dea: out of memory at shape {} ({} kernel, {} sizes, {} threads)\n",
                       shape_text(s), kernel_name(k), fx ? "fixed" : "dynamic", t);
            return 1;
          }
        }
        for (int m = 0; m < 2; ++m)
          if (ms[0][m] > 0 && ms[1][m] > 0)
            fmt::print("{{\"bench\": \"dea_kernel_ratio\", \"mode\": \"{}\", \"B\": {}, \"T\": {}, \"D\": {}, \"H\": {}, "
                       "\"threads\": {}, \"sizes\": \"{}\", \"reference_ms\": {:.2f}, \"tiled_ms\": {:.2f}, "
                       "\"reference_over_tiled\": {:.3f}}}\n",
                       m == 0 ? "forward" : "train_step", s.B, s.T, s.D, s.H, t, fx ? "fixed" : "dynamic", ms[0][m],
                       ms[1][m], ms[0][m] / ms[1][m]);
        std::fflush(stdout);
      }
    }
  }
  return 0;
} catch (const std::bad_alloc&) {
  fmt::print(stderr, "bench_dea: out of memory\n");
  return 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_dea: {}\n", dea::without_error_prefix(e.what()));
  return 1;
}
