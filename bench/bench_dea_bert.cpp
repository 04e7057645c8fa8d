// bench_dea_bert: speed and memory of one DualExpertBert fine-tuning step, printed as one JSON line per thread count.
//
//   bench_dea_bert [--config base|tiny] [--threads 1,2] [--steps 3] [--warmup 1] [--batch 32] [--tokens 64]
//                  [--gamma 0.5] [--kernel tiled|reference] [--seed 42] [--no-yardstick] [--precision fp32|bf16]
//
// The step is what `dea train --model dea_bert` runs each step (train::Trainer::step on the family of
// train/dea_bert.hpp): a training-mode forward of bert::DualExpertBert<float> (dropout on: hidden and attention
// 0.1, head 0.1; masks from Rng(stream_seed(seed, kDropoutStream, step))) with the oracle block at gamma_mix
// --gamma, task cross-entropy + gate loss, zero_grad, one backward, per-group gradient clipping (1.0) and the step
// of the reference's two AdamW groups (make_optimizer(): main lr 2e-5 with weight decay 0.01, gate lr 1e-3). The
// adapters run the tiled kernel, as training does (--kernel picks). Data loading, logging and checkpoints are left
// out.
//
// The model: a BertModel with random weights (HF init from Rng(seed)) converted to DualExpertBert (2 classes).
//   base  bert-base-uncased's configuration: hidden 768, 12 layers, 12 heads, intermediate 3072, vocab 30522,
//         max positions 512 (110 M parameters)
//   tiny  hidden 128, 2 layers, 2 heads, intermediate 512, the same vocabulary (a smoke test runs it in a second)
// The batch (the same on every step, and the same as bench/torch_dea_bert.py builds): --batch rows of exactly
// --tokens tokens laid out as collate_pairs lays out an encoded pair, [CLS] premise [SEP] hypothesis [SEP] with
// na = (T - 3) / 2 premise tokens, token types 0 up to the first [SEP] and 1 after it, no padding; token ids
// 1000 + (7919 b + 104729 t) mod 29000; label b mod 2; the oracle NaN except the block premise rows x hypothesis
// columns of row b, which holds alpha_b = 0.05 + 0.9 ((37 b) mod 32) / 31.
//
// Matrix-product FLOP of a step (N = B T rows, H hidden, I intermediate, A heads of d, L layers): every Linear of
// the step counted 6 N K M for forward and backward (2 forward, 2 for the input gradient, 2 for the weight
// gradient): per layer W_q, W_k, W_v and attention.output.dense (K = M = H), intermediate (H -> I) and output
// (I -> H), and the head (B rows, H -> 2); the attention core per (b, head) forward Q K^T, the relational Q W_rel^T
// and R K^T and P V, 6 T^2 d + 2 T d^2, and its backward twice that, as bench_dea counts them. The embedding
// lookups, LayerNorms, GELU, softmax, the gate and AdamW are not products and are not counted.
//
// Each line: configuration, sizes, parameters, threads, the median s/step over --steps steps after --warmup steps
// (and min / max), the median CPU time of the process per step, the median of each phase (forward, backward =
// zero_grad + backward, optim = clipping + AdamW step), the step's GFLOP (linear and attention parts), GFLOP/s, the
// same-run GEMM yardstick (bench_util::yardstick_gflops: Eigen's float 256 x 256 product, one per thread, measured
// just before the steps) and the step's fraction of it, the losses of the first step, the process's peak RSS so far
// (getrusage; run one thread count per process for a clean figure, as bench/compare_dea_bert.py does) and the
// 1-minute load average before and after. Progress goes to stderr.
// --precision bf16 runs the steps under dea::ScopedPrecision(Precision::bf16) (the float products read bf16
// copies of their operands and accumulate in float; everything else, the weights and AdamW's state included, stays
// float). Each line has "precision" and the peak of that precision on its thread count (bench/peak.hpp: FP32 fused
// multiply-adds or bf16 dot products, measured before the steps) with peak_fraction = gflops / peak_gflops.
// Exit status: 0 done; 1 a failure (e.g. a non-finite loss); 2 a bad command line.
#include <dea/bert/dual_expert_bert.hpp>
#include <dea/core/allocator.hpp>
#include <dea/core/parallel.hpp>
#include <dea/cli/flags.hpp>
#include <dea/train/seeds.hpp>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "bench_util.hpp"
#include "peak.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include <time.h>

using namespace dea;

namespace {

struct BenchConfig {
  std::string name;
  Index hidden, layers, heads, intermediate;
};

const std::vector<BenchConfig> kConfigs = {
    {"base", 768, 12, 12, 3072},
    {"tiny", 128, 2, 2, 512},
};

struct Options {
  std::string config = "base";
  std::vector<int> threads = {1, 2};
  int steps = 3, warmup = 1;
  Index batch = 32, tokens = 64;
  double gamma = 0.5;
  DeaKernel kernel = DeaKernel::tiled;
  std::uint64_t seed = 42;
  bool yardstick = true;
  Precision precision = Precision::fp32;
};

constexpr const char* kUsage =
    "usage: bench_dea_bert [--config base|tiny] [--threads 1,2] [--steps 3] [--warmup 1] [--batch 32] "
    "[--tokens 64] [--gamma 0.5] [--kernel tiled|reference] [--seed 42] [--no-yardstick]\n"
    "                      [--precision fp32|bf16]\n";

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

/// CPU time of the whole process (all threads) in seconds.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

bert::BertConfig bert_config(const BenchConfig& bc) {
  bert::BertConfig c;  // transformers' BertConfig defaults (bert-base-uncased), dropout 0.1
  c.hidden_size = bc.hidden;
  c.num_hidden_layers = bc.layers;
  c.num_attention_heads = bc.heads;
  c.intermediate_size = bc.intermediate;
  return c;
}

/// The benchmark's batch (see the file comment; bench/torch_dea_bert.py builds the same one).
bert::DualExpertBert<float>::Batch make_batch(Index B, Index T) {
  bert::DualExpertBert<float>::Batch b;
  b.input_ids = Tensor<std::int64_t>({B, T});
  b.token_type_ids = Tensor<std::int64_t>({B, T});
  b.attention_mask = Tensor<std::uint8_t>({B, T}, 1);
  b.labels = Tensor<std::int64_t>({B});
  b.alpha_oracle = Tensor<float>({B, T, T}, std::numeric_limits<float>::quiet_NaN());
  const Index na = (T - 3) / 2, sep1 = 1 + na;  // [CLS] premise(na) [SEP] hypothesis [SEP]
  for (Index r = 0; r < B; ++r) {
    for (Index t = 0; t < T; ++t) {
      std::int64_t id = 1000 + (7919 * r + 104729 * t) % 29000;
      if (t == 0) id = 101;                       // [CLS]
      if (t == sep1 || t == T - 1) id = 102;      // [SEP]
      b.input_ids[r * T + t] = id;
      b.token_type_ids[r * T + t] = t > sep1 ? 1 : 0;
    }
    b.labels[r] = r % 2;
    const float a = static_cast<float>(0.05 + 0.9 * double((37 * r) % 32) / 31.0);
    for (Index i = 1; i < sep1; ++i)            // premise tokens as queries
      for (Index j = sep1 + 1; j < T - 1; ++j)  // hypothesis tokens as keys
        b.alpha_oracle[(r * T + i) * T + j] = a;
  }
  return b;
}

/// Matrix-product GFLOP of one step (see the file comment): {linear, attention}.
std::pair<double, double> step_gflop(const BenchConfig& bc, Index B, Index T, Index n_classes) {
  const double N = double(B) * double(T), H = double(bc.hidden), I = double(bc.intermediate);
  const double d = H / double(bc.heads), t = double(T);
  const double linear = double(bc.layers) * 6 * N * (4 * H * H + 2 * H * I) + 6 * double(B) * H * double(n_classes);
  const double attention = double(bc.layers) * 3 * double(B) * double(bc.heads) * (6 * t * t * d + 2 * t * d * d);
  return {linear / 1e9, attention / 1e9};
}

int run(const Options& opt) {
  const BenchConfig& bc = *std::find_if(kConfigs.begin(), kConfigs.end(),
                                        [&](const BenchConfig& k) { return k.name == opt.config; });
  const bert::BertConfig cfg = bert_config(bc);
  check(opt.tokens <= cfg.max_position_embeddings, "--tokens ", opt.tokens, " exceeds max_position_embeddings ",
        cfg.max_position_embeddings);
  const auto gflop = step_gflop(bc, opt.batch, opt.tokens, 2);
  const auto gamma = static_cast<float>(opt.gamma);
  for (int th : opt.threads) {
    set_num_threads(th);
    const auto t0 = Clock::now();
    Rng init_rng(opt.seed);
    bert::DualExpertBertOptions mo;
    mo.kernel = opt.kernel;
    bert::DualExpertBert<float> model(cfg, init_rng, mo);
    optim::AdamW<float> adamw = model.make_optimizer();
    std::size_t n_params = 0;
    for (auto* p : model.parameters()) n_params += static_cast<std::size_t>(p->numel());
    fmt::print(stderr, "[{} threads={}] model built: {} parameters ({:.2f} s)\n", bc.name, th, n_params,
               secs(t0, Clock::now()));
    const double yard = opt.yardstick ? bench_util::yardstick_gflops(th, 3) : 0.0;
    const bench_peak::Peak peak = bench_peak::measure_peak(
        opt.precision == Precision::bf16 ? bench_peak::Kind::bf16 : bench_peak::Kind::fp32, th);
    const ScopedPrecision precision(opt.precision);  // the float products of the steps
    bert::DualExpertBert<float>::Cache cache;
    std::vector<double> t_total, t_cpu, t_fwd, t_bwd, t_opt;
    double first_task = NAN, first_gate = NAN;
    const double load_before = bench_util::load1();
    const int total = opt.warmup + opt.steps;
    for (int s = 1; s <= total; ++s) {
      // the batch is built outside the timed step (the same every step; collation is not what is measured)
      const bert::DualExpertBert<float>::Batch b = make_batch(opt.batch, opt.tokens);
      const double c0 = cpu_seconds();
      const auto a = Clock::now();
      Rng drng(train::stream_seed(opt.seed, train::kDropoutStream, static_cast<std::uint64_t>(s)));
      const auto out = model.forward(b, gamma, true, &drng, cache);
      const auto ft = Clock::now();
      check(std::isfinite(static_cast<double>(out.task_loss)) && std::isfinite(static_cast<double>(out.loss_gate)),
            "bench_dea_bert: non-finite loss at step ", s);
      adamw.zero_grad();
      model.backward(cache);
      const auto bw = Clock::now();
      const optim::GradNorms norms = adamw.clip_grad_norms();
      check(norms.all_finite(), "bench_dea_bert: non-finite gradient norm at step ", s);
      adamw.step();
      const auto e = Clock::now();
      const double c1 = cpu_seconds();
      if (s == 1) {
        first_task = static_cast<double>(out.task_loss);
        first_gate = static_cast<double>(out.loss_gate);
      }
      fmt::print(stderr, "[{} threads={}] step {}/{}{}: {:.3f} s (forward {:.3f}, backward {:.3f}, optim {:.3f}; "
                 "task {:.4f}, gate {:.4f})\n", bc.name, th, s, total, s <= opt.warmup ? " (warm-up)" : "",
                 secs(a, e), secs(a, ft), secs(ft, bw), secs(bw, e), static_cast<double>(out.task_loss),
                 static_cast<double>(out.loss_gate));
      if (s <= opt.warmup) continue;
      t_total.push_back(secs(a, e));
      t_cpu.push_back(c1 - c0);
      t_fwd.push_back(secs(a, ft));
      t_bwd.push_back(secs(ft, bw));
      t_opt.push_back(secs(bw, e));
    }
    const double med = median(t_total), gf = gflop.first + gflop.second;
    nlohmann::json j;
    j["bench"] = "dea_bert_step";
    j["impl"] = "dea";
    j["precision"] = precision_name(opt.precision);
    j["config"] = bc.name;
    j["hidden"] = bc.hidden;
    j["layers"] = bc.layers;
    j["heads"] = bc.heads;
    j["intermediate"] = bc.intermediate;
    j["vocab_size"] = cfg.vocab_size;
    j["batch"] = opt.batch;
    j["tokens"] = opt.tokens;
    j["params"] = n_params;
    j["threads"] = th;
    j["steps"] = opt.steps;
    j["warmup"] = opt.warmup;
    j["gamma"] = opt.gamma;
    j["kernel"] = opt.kernel == DeaKernel::tiled ? "tiled" : "reference";
    j["s_per_step"] = med;
    j["s_min"] = *std::min_element(t_total.begin(), t_total.end());
    j["s_max"] = *std::max_element(t_total.begin(), t_total.end());
    j["cpu_s_per_step"] = median(t_cpu);
    j["phase_s"] = {{"forward", median(t_fwd)}, {"backward", median(t_bwd)}, {"optim", median(t_opt)}};
    j["gflop"] = std::round(gf * 1000) / 1000;
    j["gflop_linear"] = std::round(gflop.first * 1000) / 1000;
    j["gflop_attention"] = std::round(gflop.second * 1000) / 1000;
    j["gflops"] = gf / med;
    j["yardstick_gflops"] = yard;
    j["frac_yardstick"] = yard > 0 ? gf / med / yard : 0.0;
    j["peak_gflops"] = peak.gflops;
    j["peak_fraction"] = peak.gflops > 0 ? gf / med / peak.gflops : 0.0;
    j["first_task_loss"] = first_task;
    j["first_loss_gate"] = first_gate;
    j["peak_rss_mb"] = std::round(bench_util::peak_rss_mb());
    j["load1_before"] = load_before;
    j["load1_after"] = bench_util::load1();
    fmt::print("{}\n", j.dump());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  try {
    cli::Args args(argc, argv);
    while (args.next()) {
      if (args.is("-h") || args.is("--help")) {
        fmt::print("{}", kUsage);
        return 0;
      }
      if (args.is("--config")) {
        const std::string v = args.value();
        if (std::none_of(kConfigs.begin(), kConfigs.end(), [&](const BenchConfig& k) { return k.name == v; }))
          cli::bad_value("--config", v, "base or tiny");
        opt.config = v;
      } else if (args.is("--threads")) {
        opt.threads.clear();
        for (const std::int64_t t : cli::parse_int_list("--threads", args.value(), 1, cli::kMaxThreads))
          opt.threads.push_back(static_cast<int>(t));
      } else if (args.is("--steps")) {
        opt.steps = static_cast<int>(args.int_value(1, 1000000));
      } else if (args.is("--warmup")) {
        opt.warmup = static_cast<int>(args.int_value(0, 1000000));
      } else if (args.is("--batch")) {
        opt.batch = static_cast<Index>(args.int_value(1, 1 << 16));
      } else if (args.is("--tokens")) {
        opt.tokens = static_cast<Index>(args.int_value(5, 512));  // [CLS] a [SEP] b [SEP]: at least one of each
      } else if (args.is("--gamma")) {
        opt.gamma = args.double_value(cli::Range::closed(0, 1));
      } else if (args.is("--kernel")) {
        const std::string v = args.value();
        if (v == "tiled") opt.kernel = DeaKernel::tiled;
        else if (v == "reference") opt.kernel = DeaKernel::reference;
        else cli::bad_value("--kernel", v, "tiled or reference");
      } else if (args.is("--seed")) {
        opt.seed = static_cast<std::uint64_t>(args.int_value(0, std::numeric_limits<std::int64_t>::max()));
      } else if (args.is("--no-yardstick")) {
        opt.yardstick = false;
      } else if (args.is("--precision")) {
        const std::string v = args.value();
        if (v != "fp32" && v != "bf16") cli::bad_value("--precision", v, "fp32 or bf16");
        opt.precision = v == "bf16" ? Precision::bf16 : Precision::fp32;
      } else {
        args.unknown();
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_dea_bert: {}\n{}", dea::without_error_prefix(e.what()), kUsage);
    return 2;
  }
  dea::retain_freed_memory();  // as `dea train`: reuse freed activations instead of faulting pages in every step
  try {
    return run(opt);
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "bench_dea_bert: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_dea_bert: error: {}\n", dea::without_error_prefix(e.what()));
    return 1;
  }
}
