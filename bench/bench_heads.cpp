// bench_heads: what a compile-time head width buys the Dual-Expert kernels and the softmax-attention core (the
// dot-product class), printed as one JSON line per measurement.
//
//   bench_heads [--config d64h4,d128h8,d512h8,inference,dot_d64h4,dot_d128h8,dot_d512h8] [--threads 1] [--reps 15]
//               [--batch B] [--len T]
//
// Each configuration times the same work twice in one run, with the head width fixed at compile time
// (DualExpertAttention<float, Heads, DHead>, nn::InferenceModel<float, Heads, DHead, Layers>) and with
// Eigen::Dynamic sizes (DualExpertAttention<float>, nn::InferenceModel<float>), on the same parameters and inputs.
// The two are timed alternately, one repetition of each in turn (which runs first alternates too), so that a change
// in the machine's load falls on both; each line gives the medians and the ratio fixed / dynamic (below 1: the fixed
// size is faster).
//
// Configurations (float, the tiled kernel, the layer's default query blocks):
//  - d64h4:     d_model 64, 4 heads of 16 (the embedded example's small model), B = 8, T = 64;
//  - d128h8:    d_model 128, 8 heads of 16, B = 8, T = 64;
//  - d512h8:    d_model 512, 8 heads of 64, B = 4, T = 128;
//  - inference: nn::InferenceModel, d_model 64, 4 heads, 2 layers, d_ff 128, one sequence of 32 tokens (cls);
//  - dot_d64h4, dot_d128h8, dot_d512h8: DotProductAttention<float, Heads, DHead> against DotProductAttention<float>
//    at the sizes of the three layer configurations (training step: forward with a key mask, backward of
//    mean(y^2)); not in the default list.
// --batch and --len replace B and T of every layer configuration (the inference model keeps its own).
// Modes of a layer configuration: forward (inference: no oracle) and train_step (forward with an oracle block and
// gamma_mix 0.5, backward of mean(y^2), backward of the gate loss).
//
// Before timing a configuration, a "heads_check" line gives the largest difference between the fixed and the dynamic
// results (output, input gradient, every parameter gradient; logits for the inference model), relative to each
// tensor's largest magnitude: they differ by float round-off only (the order of a head's sums). Above 1e-4 the
// program stops (exit 3) before timing.
// Values: --threads integers in [1, 4096]; --reps 1..100000; --batch 1..4096; --len 2..4096.
// Exit status: 0 done; 1 a failure; 2 bad command line; 3 fixed and dynamic sizes disagree.
#include <dea/attention/dot_product.hpp>
#include <dea/attention/dual_expert.hpp>
#include <dea/nn/inference.hpp>
#include <dea/nn/transformer.hpp>
#include <dea/cli/flags.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <string>
#include <vector>

using namespace dea;

namespace {

constexpr double kBound = 1e-4;

struct Timer {
  std::vector<double> fixed, dynamic;
  static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
};

template <class F>
double time_ms(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// One warm-up call of each, then `reps` rounds of one call of each, the order alternating per round.
template <class F, class G>
Timer alternate(int reps, F&& fixed, G&& dynamic) {
  fixed();
  dynamic();
  Timer t;
  for (int r = 0; r < reps; ++r) {
    if (r % 2 == 0) {
      t.fixed.push_back(time_ms(fixed));
      t.dynamic.push_back(time_ms(dynamic));
    } else {
      t.dynamic.push_back(time_ms(dynamic));
      t.fixed.push_back(time_ms(fixed));
    }
  }
  return t;
}

/// The largest |a - b| relative to max |a| (1 when a is all zeros and b is not).
double rel_diff(const Eigen::Ref<const Eigen::MatrixXf>& a, const Eigen::Ref<const Eigen::MatrixXf>& b) {
  const double scale = a.cwiseAbs().maxCoeff(), d = (a - b).cwiseAbs().maxCoeff();
  return scale > 0 ? d / scale : (d > 0 ? 1.0 : 0.0);
}

struct LayerCase {
  const char* name;
  Index D, H, B, T;
};

/// The layer's work of one mode on fixed inputs: a forward (inference) or a training step.
template <class Layer>
struct LayerRun {
  Layer layer;
  typename Layer::Cache cache;
  AttnInputs<float> infer, train;
  Mat<float> y, dx;

  LayerRun(const LayerCase& c, const Tensor<float>& oracle)
      : layer(make(c)), infer(c.B, c.T), train(c.B, c.T) {
    train.set_oracle(oracle).set_gamma_mix(0.5f).set_training(true);
  }
  static Layer make(const LayerCase& c) {
    Rng rng(3);
    typename Layer::Options opt;
    opt.kernel = DeaKernel::tiled;
    return Layer(c.D, c.H, rng, opt);
  }
  void forward(const Mat<float>& x) { layer.forward(x, infer, cache, y); }
  void step(const Mat<float>& x) {
    layer.zero_grad();
    layer.forward(x, train, cache, y);
    dx = layer.backward((2.0f / float(y.size())) * y, cache);  // d mean(y^2) / dy
    layer.backward_gate(cache);
  }
};

/// Checks that two runs (fixed and dynamic sizes) compute the same function, one training step of each on `x`
/// (the same seed gives the same parameters), then times their forward passes and training steps alternately.
/// False when they disagree (nothing is timed then).
template <class FixedRun, class DynamicRun>
bool compare_and_time(const LayerCase& c, int threads, int reps, const Mat<float>& x, FixedRun& fx, DynamicRun& dy) {
  fx.step(x);
  dy.step(x);
  double worst = std::max(rel_diff(fx.y, dy.y), rel_diff(fx.dx, dy.dx));
  const ParamList<float> pf = fx.layer.parameters(), pd = dy.layer.parameters();
  for (std::size_t k = 0; k < pf.size(); ++k)
    worst = std::max(worst, rel_diff(pf[k]->grad, pd[k]->grad));
  const Index Dh = c.D / c.H;
  fmt::print("{{\"bench\": \"heads_check\", \"config\": \"{}\", \"D\": {}, \"H\": {}, \"Dh\": {}, \"threads\": {}, "
             "\"max_rel_diff\": {:.3e}, \"bound\": {:.0e}, \"ok\": {}}}\n",
             c.name, c.D, c.H, Dh, threads, worst, kBound, worst <= kBound ? "true" : "false");
  std::fflush(stdout);
  if (!(worst <= kBound)) return false;

  for (int mode = 0; mode < 2; ++mode) {
    const Timer t = mode == 0 ? alternate(reps, [&] { fx.forward(x); }, [&] { dy.forward(x); })
                              : alternate(reps, [&] { fx.step(x); }, [&] { dy.step(x); });
    const double mf = Timer::median(t.fixed), md = Timer::median(t.dynamic);
    fmt::print("{{\"bench\": \"heads_{}\", \"config\": \"{}\", \"B\": {}, \"T\": {}, \"D\": {}, \"H\": {}, \"Dh\": {}, "
               "\"threads\": {}, \"reps\": {}, \"fixed_ms\": {:.3f}, \"dynamic_ms\": {:.3f}, "
               "\"fixed_over_dynamic\": {:.3f}}}\n",
               mode == 0 ? "forward" : "train_step", c.name, c.B, c.T, c.D, c.H, Dh, threads, reps, mf, md, mf / md);
    std::fflush(stdout);
  }
  return true;
}

template <class Fixed>
bool run_layer(const LayerCase& c, int threads, int reps) {
  set_num_threads(threads);
  Rng rng(1);
  Mat<float> x(c.B * c.T, c.D);
  init::normal(x, rng, 0, 1);
  // an oracle block: rows 1..T/2-1 against keys T/2..T-2 labelled, the rest unlabelled
  Tensor<float> oracle({c.B, c.T, c.T}, std::numeric_limits<float>::quiet_NaN());
  for (Index b = 0; b < c.B; ++b)
    for (Index i = 1; i < c.T / 2; ++i)
      for (Index j = c.T / 2; j < c.T - 1; ++j) oracle[(b * c.T + i) * c.T + j] = float(rng.uniform(0, 0.95));
  LayerRun<Fixed> fx(c, oracle);
  LayerRun<DualExpertAttention<float>> dy(c, oracle);
  return compare_and_time(c, threads, reps, x, fx, dy);
}

/// The dot-product class: the same comparison over the softmax-attention core (no gate, no oracle).
template <class Layer>
struct DotRun {
  Layer layer;
  typename Layer::Cache cache;
  AttnInputs<float> in;
  Mat<float> y, dx;

  explicit DotRun(const LayerCase& c) : layer(make(c)), in(c.B, c.T) {
    Tensor<std::uint8_t> mask({c.B, c.T}, 1);
    for (Index b = 0; b < c.B; ++b) mask[b * c.T + c.T - 1] = 0;  // one padded key per sequence
    in.set_key_mask(mask);
  }
  static Layer make(const LayerCase& c) {
    Rng rng(3);
    return Layer(c.D, c.H, rng);
  }
  void forward(const Mat<float>& x) { layer.forward(x, in, cache, y); }
  void step(const Mat<float>& x) {
    layer.zero_grad();
    layer.forward(x, in, cache, y);
    dx = layer.backward((2.0f / float(y.size())) * y, cache);  // d mean(y^2) / dy
  }
};

template <class Fixed>
bool run_dot(const LayerCase& c, int threads, int reps) {
  set_num_threads(threads);
  Rng rng(1);
  Mat<float> x(c.B * c.T, c.D);
  init::normal(x, rng, 0, 1);
  DotRun<Fixed> fx(c);
  DotRun<DotProductAttention<float>> dy(c);
  return compare_and_time(c, threads, reps, x, fx, dy);
}

/// nn::InferenceModel with compile-time sizes against dynamic sizes, bound to one TransformerModel's parameters.
bool run_inference(int threads, int reps) {
  set_num_threads(threads);
  nn::ModelConfig mc;
  mc.vocab_size = 200;
  mc.d_model = 64;
  mc.n_heads = 4;
  mc.n_layers = 2;
  mc.d_ff = 128;
  mc.max_len = 32;
  mc.n_classes = 2;
  mc.task = nn::Task::cls;
  Rng rng(5);
  nn::TransformerModel<float> model(mc, rng);
  nn::InferenceModel<float, 4, 16, 2> fixed(nn::InferenceConfig::from(mc));
  nn::InferenceModel<float> dynamic(nn::InferenceConfig::from(mc));
  fixed.bind_parameters(model);
  dynamic.bind_parameters(model);
  const Index B = 1, T = 32;
  fixed.reserve(B, T);
  dynamic.reserve(B, T);
  std::vector<std::int64_t> ids(static_cast<std::size_t>(B * T));
  for (std::size_t k = 0; k < ids.size(); ++k) ids[k] = 1 + std::int64_t(7 * k + 3) % (mc.vocab_size - 1);
  const Mat<float> lf = fixed.forward(ids.data(), B, T), ld = dynamic.forward(ids.data(), B, T);
  const double worst = rel_diff(lf, ld);
  fmt::print("{{\"bench\": \"heads_check\", \"config\": \"inference\", \"D\": 64, \"H\": 4, \"Dh\": 16, "
             "\"threads\": {}, \"max_rel_diff\": {:.3e}, \"bound\": {:.0e}, \"ok\": {}}}\n",
             threads, worst, kBound, worst <= kBound ? "true" : "false");
  std::fflush(stdout);
  if (!(worst <= kBound)) return false;
  float sink = 0;
  const Timer t = alternate(reps, [&] { sink += fixed.forward(ids.data(), B, T)(0, 0); },
                            [&] { sink += dynamic.forward(ids.data(), B, T)(0, 0); });
  const double mf = Timer::median(t.fixed), md = Timer::median(t.dynamic);
  fmt::print("{{\"bench\": \"heads_inference\", \"config\": \"inference\", \"B\": {}, \"T\": {}, \"D\": 64, \"H\": 4, "
             "\"Dh\": 16, \"layers\": 2, \"threads\": {}, \"reps\": {}, \"fixed_ms\": {:.4f}, \"dynamic_ms\": {:.4f}, "
             "\"fixed_over_dynamic\": {:.3f}, \"sink\": {}}}\n",
             B, T, threads, reps, mf, md, mf / md, std::isfinite(sink) ? 1 : 0);
  std::fflush(stdout);
  return true;
}

constexpr const char* kUsage =
    "usage: bench_heads [--config d64h4,d128h8,d512h8,inference,dot_d64h4,dot_d128h8,dot_d512h8] [--threads 1]\n"
    "                   [--reps 15] [--batch B] [--len T]\n";

}  // namespace

int main(int argc, char** argv) try {
  std::vector<std::string> configs = {"d64h4", "d128h8", "d512h8", "inference"};
  std::vector<int> threads = {1};
  int reps = 15;
  Index batch = 0, len = 0;
  const std::vector<std::string> known = {"d64h4",     "d128h8",     "d512h8",    "inference",
                                          "dot_d64h4", "dot_d128h8", "dot_d512h8"};
  try {
    cli::Args args(argc, argv);
    while (args.next()) {
      if (args.is("-h") || args.is("--help")) {
        fmt::print("{}", kUsage);
        return 0;
      }
      if (args.is("--config")) {
        const std::string v = args.value();
        configs = cli::split(v, ',');
        for (const std::string& w : configs)
          if (std::find(known.begin(), known.end(), w) == known.end())
            cli::bad_value("--config", v, "a comma-separated list of d64h4, d128h8, d512h8, inference, dot_d64h4, dot_d128h8, dot_d512h8");
      } else if (args.is("--threads")) {
        threads.clear();
        for (const std::int64_t t : cli::parse_int_list("--threads", args.value(), 1, cli::kMaxThreads))
          threads.push_back(static_cast<int>(t));
      } else if (args.is("--reps")) {
        reps = static_cast<int>(args.int_value(1, 100000));
      } else if (args.is("--batch")) {
        batch = static_cast<Index>(args.int_value(1, 4096));
      } else if (args.is("--len")) {
        len = static_cast<Index>(args.int_value(2, 4096));
      } else {
        args.unknown();
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_heads: {}\n{}", dea::without_error_prefix(e.what()), kUsage);
    return 2;
  }
  for (int t : threads)
    for (const std::string& name : configs) {
      bool ok = true;
      if (name == "inference") {
        ok = run_inference(t, reps);
      } else {
        const bool dot = name.rfind("dot_", 0) == 0;
        const std::string size = dot ? name.substr(4) : name;
        LayerCase c = size == "d64h4"    ? LayerCase{"d64h4", 64, 4, 8, 64}
                      : size == "d128h8" ? LayerCase{"d128h8", 128, 8, 8, 64}
                                         : LayerCase{"d512h8", 512, 8, 4, 128};
        c.name = name.c_str();
        if (batch > 0) c.B = batch;
        if (len > 0) c.T = len;
        if (dot)
          ok = size == "d64h4"    ? run_dot<DotProductAttention<float, 4, 16>>(c, t, reps)
               : size == "d128h8" ? run_dot<DotProductAttention<float, 8, 16>>(c, t, reps)
                                  : run_dot<DotProductAttention<float, 8, 64>>(c, t, reps);
        else
          ok = size == "d64h4"    ? run_layer<DualExpertAttention<float, 4, 16>>(c, t, reps)
               : size == "d128h8" ? run_layer<DualExpertAttention<float, 8, 16>>(c, t, reps)
                                  : run_layer<DualExpertAttention<float, 8, 64>>(c, t, reps);
      }
      if (!ok) {
        fmt::print(stderr, "bench_heads: FAILED: fixed and dynamic sizes disagree in {} (above {:.0e}); nothing "
                   "more was timed\n", name, kBound);
        return 3;
      }
    }
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_heads: {}\n", dea::without_error_prefix(e.what()));
  return 1;
}
