// bench_train: speed and memory of the model's training step, printed as one JSON line per measurement.
//
//   bench_train [--config quick,mid,paper] [--threads 1,2] [--steps 10] [--warmup 2] [--gamma 0.5]
//               [--kernel tiled|reference] [--n_per_source N] [--seed 42] [--dump-batches FILE] [--dump-only]
//               [--precision fp32|bf16]
//
// One training step is what `dea train` runs each step (train::encoder::run_training): collate the step's D_alpha
// batch (train::encoder::build_data + train::encoder::make_batch, batch order train::encoder::BatchOrder), forward of the Dual-Expert
// TransformerModel in training mode (dropout 0.1) with the oracle block at gamma_mix, task cross-entropy + gate
// loss, zero_grad, backward, per-group gradient clipping and the AdamW step (train::encoder::make_optimizer). The
// attention runs the kernel train uses (train::encoder::attention_options: tiled by default; --kernel picks). Logging,
// evaluation and checkpoints are left out. Step s uses the training batch of step s of a run with this seed, so
// the batches are those of a real run; their length T is the longest pair of the batch (at most max_len = 64).
//
// Configurations (the reference's: --quick, the mid run, the reference's CONFIG), all with max_len 64 and
// dropout 0.1:
//   quick  D=128 H=4 L=2 d_ff=256  batch 32   n_per_source 500
//   mid    D=256 H=8 L=4 d_ff=1024 batch 64   n_per_source 2000
//   paper  D=512 H=8 L=6 d_ff=2048 batch 128  n_per_source 2000
//
// Each line: configuration, sizes, parameters, threads, the median s/step over --steps steps after --warmup
// steps (and min / max), examples/s (batch / median), the median CPU time of the process per step (all threads;
// on a loaded machine the 1-thread CPU time is the steadier figure), the median of each phase (batch =
// collation, forward, backward = zero_grad + backward, optim = clipping + AdamW step), the mean padded length T,
// the losses of the first step run, the process's peak RSS so far (getrusage ru_maxrss; run one configuration per
// process for a clean figure, as bench/compare_train.py does), the peak RSS after building the model and optimiser
// and after each phase of step 1 (where the memory goes), and the 1-minute load average before and after
// (/proc/loadavg).
// Progress goes to stderr.
//
// --precision bf16 runs the steps under dea::ScopedPrecision(Precision::bf16): the float products read bf16 copies
// of their operands and accumulate in float; everything else (the weights, the Dual-Expert normalisation and gate,
// softmax, norms, losses, AdamW's state) stays float. Each line has "precision".
//
// --dump-batches FILE writes the batches of steps 1..warmup+steps of each configuration as JSON lines (one header
// line {"config", "vocab_size", ...}, then one line per step with input_ids, token_type_ids, attention_mask,
// labels and the oracle blocks [row, q0, q1, k0, k1, alpha]) so that bench/torch_train.py trains on exactly the
// same batches (torch_train.py reads a file of one configuration); the file is rewritten atomically after each
// configuration, so it never holds half of one. --dump-only writes the file and measures nothing.
#include <dea/core/allocator.hpp>
#include <dea/core/atomic_file.hpp>
#include <dea/cli/flags.hpp>
#include <dea/core/parallel.hpp>
#include <dea/train/encoder.hpp>

#include <fmt/core.h>

#include "bench_util.hpp"
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <time.h>

using namespace dea;

using bench_util::peak_rss_mb;

namespace {

struct BenchConfig {
  std::string name;
  Index d_model, n_heads, n_layers, d_ff, batch;
  std::int64_t n_per_source;
};

const std::vector<BenchConfig> kConfigs = {
    {"quick", 128, 4, 2, 256, 32, 500},
    {"mid", 256, 8, 4, 1024, 64, 2000},
    {"paper", 512, 8, 6, 2048, 128, 2000},
};

/// 1-minute load average (-1 when /proc/loadavg is not readable).
double load1() {
  std::ifstream f("/proc/loadavg");
  double l = -1;
  if (f) f >> l;
  return l;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

[[noreturn]] void usage(const std::string& why) {
  fmt::print(stderr,
             "bench_train: {}\nusage: bench_train [--config quick,mid,paper] [--threads 1,2] [--steps 10] "
             "[--warmup 2] [--gamma 0.5] [--kernel tiled|reference] [--n_per_source N] [--seed 42] "
             "[--dump-batches FILE] [--dump-only] [--precision fp32|bf16]\n",
             why);
  std::exit(2);
}

/// The oracle of a D_alpha batch as blocks [row, q0, q1, k0, k1, alpha]: each row's labelled cells form one
/// rectangle with one value (collate_pairs); anything else is an error, as the dump could not describe it.
nlohmann::json oracle_blocks(const nn::ModelBatch<float>& b) {
  nlohmann::json blocks = nlohmann::json::array();
  if (!b.alpha_oracle.dim()) return blocks;
  const Index B = b.batch(), T = b.seq_len();
  for (Index r = 0; r < B; ++r) {
    Index i0 = T, i1 = -1, j0 = T, j1 = -1, n = 0;
    float a = 0;
    for (Index i = 0; i < T; ++i)
      for (Index j = 0; j < T; ++j) {
        const float v = b.alpha_oracle[(r * T + i) * T + j];
        if (std::isnan(v)) continue;
        i0 = std::min(i0, i), i1 = std::max(i1, i), j0 = std::min(j0, j), j1 = std::max(j1, j);
        a = v;
        ++n;
      }
    if (!n) continue;
    check(n == (i1 - i0 + 1) * (j1 - j0 + 1), "bench_train --dump-batches: row ", r, "'s oracle is not one block");
    for (Index i = i0; i <= i1; ++i)
      for (Index j = j0; j <= j1; ++j)
        check(b.alpha_oracle[(r * T + i) * T + j] == a, "bench_train --dump-batches: row ", r,
              "'s oracle block holds more than one value");
    blocks.push_back({r, i0, i1 + 1, j0, j1 + 1, a});
  }
  return blocks;
}

template <class T>
std::vector<std::int64_t> flat(const Tensor<T>& t) {
  return std::vector<std::int64_t>(t.ptr(), t.ptr() + t.numel());
}

struct Options {
  std::vector<std::string> configs = {"quick", "mid", "paper"};
  std::vector<int> threads = {1, 2};
  int steps = 10, warmup = 2;
  double gamma = 0.5;
  dea::DeaKernel kernel = dea::DeaKernel::tiled;
  std::int64_t n_per_source = 0;  // 0 = the configuration's
  std::uint64_t seed = 42;
  std::string dump;
  bool dump_only = false;
  Precision precision = Precision::fp32;
};

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

/// CPU time of the whole process (all threads) in seconds.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

/// --dump-batches: the lines of every configuration dumped so far. After each configuration the whole file is
/// written again atomically, so it is always complete (never a half-written configuration) and there early.
struct BatchDump {
  std::string path, text;
  void save() const {
    write_file_atomic_with(path, [&](auto&& write) { write(text.data(), text.size()); }, "--dump-batches: ");
  }
};

void run_config(const BenchConfig& bc, const Options& opt, BatchDump* dump) {
  train::TrainConfig cfg;
  cfg.d_model = bc.d_model;
  cfg.n_heads = bc.n_heads;
  cfg.n_layers = bc.n_layers;
  cfg.d_ff = bc.d_ff;
  cfg.batch_size = bc.batch;
  cfg.max_len = 64;
  cfg.dropout = 0.1;
  cfg.seed = opt.seed;
  cfg.n_per_source = opt.n_per_source > 0 ? opt.n_per_source : bc.n_per_source;
  const auto t0 = Clock::now();
  const train::encoder::RunData d = train::encoder::build_data(cfg);
  fmt::print(stderr, "[{}] data: {} train records, vocab {} ({:.2f} s)\n", bc.name, d.size(train::encoder::Split::train),
             d.tok.vocab_size(), secs(t0, Clock::now()));
  const int total = opt.warmup + opt.steps;

  if (dump) {
    nlohmann::json h;
    h["config"] = bc.name;
    h["vocab_size"] = d.tok.vocab_size();
    h["pad_id"] = data::SimpleTokenizer::pad_id;
    h["d_model"] = bc.d_model;
    h["n_heads"] = bc.n_heads;
    h["n_layers"] = bc.n_layers;
    h["d_ff"] = bc.d_ff;
    h["batch_size"] = bc.batch;
    h["max_len"] = cfg.max_len;
    h["dropout"] = cfg.dropout;
    h["n_classes"] = 2;
    h["steps"] = total;
    dump->text += h.dump() + '\n';
    train::encoder::BatchOrder order(d.size(train::encoder::Split::train), static_cast<std::size_t>(bc.batch), opt.seed);
    for (int s = 1; s <= total; ++s) {
      const nn::ModelBatch<float> b = train::encoder::make_batch<float>(d, train::encoder::Split::train, order.at(s), cfg.max_len, nullptr);
      nlohmann::json j;
      j["step"] = s;
      j["B"] = b.batch();
      j["T"] = b.seq_len();
      j["input_ids"] = flat(b.input_ids);
      j["token_type_ids"] = flat(b.token_type_ids);
      j["attention_mask"] = flat(b.attention_mask);
      j["labels"] = flat(b.labels);
      j["oracle_blocks"] = oracle_blocks(b);
      dump->text += j.dump() + '\n';
    }
    dump->save();
  }
  if (opt.dump_only) return;

  for (int th : opt.threads) {
    set_num_threads(th);
    Rng init_rng(opt.seed);
    nn::TransformerModel<float> model(train::encoder::model_config(cfg, d.tok.vocab_size(), d.task), init_rng,
                          train::encoder::attention_options<float>(cfg, opt.kernel));
    optim::AdamW<float> adamw = train::encoder::make_optimizer(model, cfg);
    std::size_t n_params = 0;
    for (auto* p : model.parameters()) n_params += static_cast<std::size_t>(p->numel());
    train::encoder::BatchOrder order(d.size(train::encoder::Split::train), static_cast<std::size_t>(bc.batch), opt.seed);
    nn::TransformerModel<float>::Cache cache;
    const auto gamma = static_cast<float>(opt.gamma);

    std::vector<double> t_cpu, t_total, t_batch, t_fwd, t_bwd, t_opt, seq;
    double first_task = NAN, first_gate = NAN;
    // peak RSS after building the model and optimiser, and after each phase of the first step
    nlohmann::json rss_first = {{"init", std::round(peak_rss_mb())}};
    const double load_before = load1();
    const ScopedPrecision precision(opt.precision);  // the float products of the steps
    for (int s = 1; s <= total; ++s) {
      const double c0 = cpu_seconds();
      const auto a = Clock::now();
      const nn::ModelBatch<float> b = train::encoder::make_batch<float>(d, train::encoder::Split::train, order.at(s), cfg.max_len, nullptr);
      const auto bt = Clock::now();
      Rng drng(train::stream_seed(opt.seed, train::kDropoutStream, static_cast<std::uint64_t>(s)));
      const auto out = model.forward(b, gamma, true, &drng, cache);
      const auto ft = Clock::now();
      if (s == 1) rss_first["forward"] = std::round(peak_rss_mb());
      adamw.zero_grad();
      model.backward(cache);
      const auto bw = Clock::now();
      if (s == 1) rss_first["backward"] = std::round(peak_rss_mb());
      const optim::GradNorms norms = adamw.clip_grad_norms();
      check(norms.all_finite(), "bench_train: non-finite gradient norm at step ", s);
      adamw.step();
      const auto e = Clock::now();
      const double c1 = cpu_seconds();
      if (s == 1) {
        rss_first["optim"] = std::round(peak_rss_mb());
        first_task = static_cast<double>(out.task_loss);
        first_gate = static_cast<double>(out.loss_gate);
      }
      check(std::isfinite(static_cast<double>(out.task_loss)) && std::isfinite(static_cast<double>(out.loss_gate)),
            "bench_train: non-finite loss at step ", s);
      fmt::print(stderr, "[{} threads={}] step {}/{}{}: {:.3f} s (T={}, task {:.4f}, gate {:.4f})\n", bc.name, th, s,
                 total, s <= opt.warmup ? " (warm-up)" : "", secs(a, e), b.seq_len(),
                 static_cast<double>(out.task_loss), static_cast<double>(out.loss_gate));
      if (s <= opt.warmup) continue;
      t_total.push_back(secs(a, e));
      t_cpu.push_back(c1 - c0);
      t_batch.push_back(secs(a, bt));
      t_fwd.push_back(secs(bt, ft));
      t_bwd.push_back(secs(ft, bw));
      t_opt.push_back(secs(bw, e));
      seq.push_back(static_cast<double>(b.seq_len()));
    }
    const double med = median(t_total);
    double mean_T = 0;
    for (double x : seq) mean_T += x / static_cast<double>(seq.size());
    nlohmann::json j;
    j["bench"] = "train_step";
    j["impl"] = "dea";
    j["precision"] = precision_name(opt.precision);
    j["config"] = bc.name;
    j["d_model"] = bc.d_model;
    j["n_heads"] = bc.n_heads;
    j["n_layers"] = bc.n_layers;
    j["d_ff"] = bc.d_ff;
    j["batch"] = bc.batch;
    j["max_len"] = cfg.max_len;
    j["vocab_size"] = d.tok.vocab_size();
    j["params"] = n_params;
    j["threads"] = th;
    j["steps"] = opt.steps;
    j["warmup"] = opt.warmup;
    j["gamma"] = opt.gamma;
    j["kernel"] = opt.kernel == dea::DeaKernel::tiled ? "tiled" : "reference";
    j["mean_T"] = std::round(mean_T * 100) / 100;
    j["s_per_step"] = med;
    j["s_min"] = *std::min_element(t_total.begin(), t_total.end());
    j["s_max"] = *std::max_element(t_total.begin(), t_total.end());
    j["examples_per_s"] = static_cast<double>(bc.batch) / med;
    j["cpu_s_per_step"] = median(t_cpu);
    j["phase_s"] = {{"batch", median(t_batch)}, {"forward", median(t_fwd)}, {"backward", median(t_bwd)},
                    {"optim", median(t_opt)}};
    j["first_task_loss"] = first_task;
    j["first_loss_gate"] = first_gate;
    j["peak_rss_mb"] = std::round(peak_rss_mb());
    j["peak_rss_step1_mb"] = rss_first;
    j["load1_before"] = load_before;
    j["load1_after"] = load1();
    fmt::print("{}\n", j.dump());
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  dea::retain_freed_memory();  // reuse freed activations instead of faulting pages in every step
  Options opt;
  try {
    cli::Args args(argc, argv);
    while (args.next()) {
      if (args.is("-h") || args.is("--help")) usage("help");
      if (args.is("--config")) {
        const std::string v = args.value();
        opt.configs = cli::split(v, ',');
        for (const auto& c : opt.configs)
          if (std::none_of(kConfigs.begin(), kConfigs.end(), [&](const BenchConfig& k) { return k.name == c; }))
            cli::bad_value("--config", v, "a comma-separated list of quick, mid, paper");
      } else if (args.is("--threads")) {
        opt.threads.clear();
        for (const std::int64_t t : cli::parse_int_list("--threads", args.value(), 1, cli::kMaxThreads))
          opt.threads.push_back(static_cast<int>(t));
      } else if (args.is("--steps")) {
        opt.steps = static_cast<int>(args.int_value(1, 1000000));
      } else if (args.is("--warmup")) {
        opt.warmup = static_cast<int>(args.int_value(0, 1000000));
      } else if (args.is("--gamma")) {
        opt.gamma = args.double_value(cli::Range::closed(0, 1));
      } else if (args.is("--kernel")) {
        const std::string v = args.value();
        if (v == "tiled") opt.kernel = dea::DeaKernel::tiled;
        else if (v == "reference") opt.kernel = dea::DeaKernel::reference;
        else cli::bad_value("--kernel", v, "tiled or reference");
      } else if (args.is("--n_per_source")) {  // 0: the configuration's own
        opt.n_per_source = args.int_value(0, train::ConfigLimits::max_n_per_source);
      } else if (args.is("--seed")) {
        opt.seed = static_cast<std::uint64_t>(args.int_value(0, std::numeric_limits<std::int64_t>::max()));
      } else if (args.is("--dump-batches")) {
        opt.dump = args.value();
        if (opt.dump.empty()) cli::bad_value("--dump-batches", opt.dump, "a file path");
      } else if (args.is("--dump-only")) {
        opt.dump_only = true;
      } else if (args.is("--precision")) {
        const std::string v = args.value();
        if (v != "fp32" && v != "bf16") cli::bad_value("--precision", v, "fp32 or bf16");
        opt.precision = v == "bf16" ? Precision::bf16 : Precision::fp32;
      } else {
        args.unknown();
      }
    }
  } catch (const dea::Error& e) {
    usage(dea::without_error_prefix(e.what()));
  }
  if (opt.dump_only && opt.dump.empty()) usage("--dump-only needs --dump-batches FILE");
  try {
    BatchDump dump{opt.dump, {}};
    for (const auto& name : opt.configs)
      for (const auto& bc : kConfigs)
        if (bc.name == name) run_config(bc, opt, opt.dump.empty() ? nullptr : &dump);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_train: error: {}\n", dea::without_error_prefix(e.what()));
    return 1;
  }
  return 0;
}
