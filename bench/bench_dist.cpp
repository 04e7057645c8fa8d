// bench_dist: the data-parallel training step (docs/scale.md), printed as one JSON line per measurement. Run it as
// one process or under mpirun (one rank per process; rank 0 prints):
//
//   bench_dist step [--config mid,paper] [--micro_batches 2] [--threads 1] [--steps 6] [--warmup 1] [--seed 42]
//   mpirun -np 2 --bind-to core bench_dist step --threads 1 --micro_batches 2
//   mpirun -np 2 --bind-to core bench_dist comm [--sizes 16384,...] [--reps 5]
//
// step: the Dual-Expert encoder's training step as `dea train --micro_batches M` runs it (train::Trainer::step_micro;
// the configurations of bench_train: mid D=256 H=8 L=4 d_ff=1024 batch 64, paper D=512 H=8 L=6 d_ff=2048 batch 128,
// max_len 64, dropout 0.1, D_alpha with the mock oracle), its phases timed on every rank: compute (collation,
// forward and backward of the rank's M/R micro-batches, each gradient flattened into its subtree), wait (the status
// exchange: the time a rank waits for the slowest), transfer (the allgathers of the losses and of the subtree sums),
// tree (finishing the tree and writing the gradients back), optim (clipping and AdamW). Each line: configuration,
// ranks, threads per rank, M, parameters, gradient bytes, the median s/step and steps/s, the median of each phase
// (the maximum over the ranks), and comm_share = (wait + transfer + tree) / step. With M = 1 on one rank the step is
// the plain one (no micro-batches, nothing exchanged).
//
// comm: allgather + tree over the ranks for gradient buffers of each size (floats), as finish() runs it: the median
// over --reps of the allgather and of the tree, and the bytes each rank receives.
//
// Progress goes to stderr.
#include <dea/core/allocator.hpp>
#include <dea/core/parallel.hpp>
#include <dea/dist/comm.hpp>
#include <dea/dist/mpi_comm.hpp>
#include <dea/dist/reducer.hpp>
#include <dea/train/encoder.hpp>
#include <dea/cli/flags.hpp>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

using namespace dea;

namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

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

struct Options {
  std::string mode;
  std::vector<std::string> configs = {"mid", "paper"};
  std::int64_t micro_batches = 0;  // 0: the rank count
  int threads = 1, steps = 6, warmup = 1, reps = 5;
  std::uint64_t seed = 42;
  std::vector<std::int64_t> sizes = {1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26};
};

[[noreturn]] void usage(const std::string& why) {
  fmt::print(stderr,
             "bench_dist: {}\nusage: bench_dist step [--config mid,paper] [--micro_batches M] [--threads N] "
             "[--steps 6] [--warmup 1] [--seed 42]\n       bench_dist comm [--sizes 16384,65536,...] [--reps 5]\n"
             "(under mpirun -np R for R ranks; rank 0 prints one JSON line per measurement)\n",
             why);
  std::exit(2);
}

/// The maximum over the ranks of each value of `v` (the slowest rank's phase).
std::vector<double> max_over_ranks(dist::Comm& comm, const std::vector<double>& v) {
  std::vector<double> all(v.size() * static_cast<std::size_t>(comm.size()));
  comm.allgather(v.data(), v.size(), all.data());
  std::vector<double> m(v.size(), 0.0);
  for (int r = 0; r < comm.size(); ++r)
    for (std::size_t i = 0; i < v.size(); ++i) m[i] = std::max(m[i], all[static_cast<std::size_t>(r) * v.size() + i]);
  return m;
}

void run_step(dist::Comm& comm, const BenchConfig& bc, const Options& opt) {
  using S = float;
  using Model = nn::TransformerModel<S>;
  const bool root = comm.rank() == 0;
  const std::int64_t M = opt.micro_batches > 0 ? opt.micro_batches : comm.size();
  check(M % comm.size() == 0 && dist::is_power_of_two(M), "--micro_batches ", M, ": a power of two, a multiple of the ",
        comm.size(), " ranks");
  train::TrainConfig cfg;
  cfg.d_model = bc.d_model;
  cfg.n_heads = bc.n_heads;
  cfg.n_layers = bc.n_layers;
  cfg.d_ff = bc.d_ff;
  cfg.batch_size = bc.batch;
  cfg.max_len = 64;
  cfg.dropout = 0.1;
  cfg.seed = opt.seed;
  cfg.n_per_source = bc.n_per_source;
  cfg.micro_batches = M;
  const train::ValidConfig vc(cfg);
  const train::encoder::RunData d = train::encoder::build_data(vc);
  auto model = train::encoder::encoder_family<S>(cfg).build(d);
  optim::AdamW<S> opt_ = train::encoder::make_optimizer(*model, cfg);
  train::encoder::BatchOrder order(d.size(train::encoder::Split::train), static_cast<std::size_t>(cfg.batch_size),
                                   cfg.seed);
  const std::size_t n_grad = dist::grad_size(model->parameters());
  if (root)
    fmt::print(stderr, "[{}] {} ranks x {} threads, M = {}: {} parameters\n", bc.name, comm.size(), opt.threads, M,
               n_grad);

  dist::GradientReducer<S> red(model->parameters(), comm, M);
  const Index rows = cfg.batch_size / static_cast<Index>(M);
  std::vector<double> t_step, t_compute, t_wait, t_transfer, t_tree, t_optim;
  Model::Cache cache;
  for (int s = 1; s <= opt.warmup + opt.steps; ++s) {
    const auto c0 = Clock::now();
    const std::vector<std::size_t>& all = order.at(s);
    const S gamma = optim::gamma_mix<S>(s - 1, cfg.gamma_steps);
    double compute = 0, wait = 0, transfer = 0, tree = 0;
    if (M == 1 && comm.size() == 1) {
      Rng mrng(train::stream_seed(cfg.seed, train::kMaskStream, static_cast<std::uint64_t>(s)));
      const auto b = train::encoder::make_batch<S>(d, train::encoder::Split::train, all, cfg.max_len, &mrng);
      Rng drng(train::stream_seed(cfg.seed, train::kDropoutStream, static_cast<std::uint64_t>(s)));
      model->forward(b, gamma, true, &drng, cache);
      opt_.zero_grad();
      model->backward(cache);
      compute = secs(c0, Clock::now());
    } else {
      red.begin();
      for (const std::int64_t k : red.local_order()) {
        const std::vector<std::size_t> idx(all.begin() + k * rows, all.begin() + (k + 1) * rows);
        Rng mrng(train::micro_stream_seed(cfg.seed, train::kMaskStream, static_cast<std::uint64_t>(s),
                                          static_cast<std::uint64_t>(k)));
        const auto b = train::encoder::make_batch<S>(d, train::encoder::Split::train, idx, cfg.max_len, &mrng);
        Rng drng(train::micro_stream_seed(cfg.seed, train::kDropoutStream, static_cast<std::uint64_t>(s),
                                          static_cast<std::uint64_t>(k)));
        model->forward(b, gamma, true, &drng, cache);
        opt_.zero_grad();
        model->backward(cache);
        red.add(k, S(1) / static_cast<S>(M));
      }
      const auto c1 = Clock::now();
      compute = secs(c0, c1);
      dist::agree_or_throw(comm, 0);
      const auto c2 = Clock::now();
      wait = secs(c1, c2);
      red.gather(std::vector<double>(static_cast<std::size_t>(red.local().size()) * 2, 0.0), 2);
      red.finish();
      transfer = red.comm_seconds();
      tree = secs(c2, Clock::now()) - transfer;
    }
    const auto o0 = Clock::now();
    opt_.clip_grad_norms();
    opt_.step();
    const double optim_s = secs(o0, Clock::now()), step_s = secs(c0, Clock::now());
    if (s > opt.warmup) {
      const std::vector<double> m = max_over_ranks(comm, {step_s, compute, wait, transfer, tree, optim_s});
      t_step.push_back(m[0]);
      t_compute.push_back(m[1]);
      t_wait.push_back(m[2]);
      t_transfer.push_back(m[3]);
      t_tree.push_back(m[4]);
      t_optim.push_back(m[5]);
    }
    if (root) fmt::print(stderr, "[{}] step {}: {:.3f} s\n", bc.name, s, step_s);
  }
  if (!root) return;
  const double st = median(t_step);
  nlohmann::json j;
  j["bench"] = "step";
  j["config"] = bc.name;
  j["ranks"] = comm.size();
  j["threads_per_rank"] = opt.threads;
  j["micro_batches"] = M;
  j["batch"] = bc.batch;
  j["parameters"] = n_grad;
  j["grad_bytes"] = n_grad * sizeof(S);
  j["s_per_step"] = st;
  j["steps_per_s"] = 1.0 / st;
  j["compute_s"] = median(t_compute);
  j["wait_s"] = median(t_wait);
  j["transfer_s"] = median(t_transfer);
  j["tree_s"] = median(t_tree);
  j["optim_s"] = median(t_optim);
  j["comm_share"] = (median(t_wait) + median(t_transfer) + median(t_tree)) / st;
  j["steps"] = opt.steps;
  fmt::print("{}\n", j.dump());
}

void run_comm(dist::Comm& comm, const Options& opt) {
  using S = float;
  const bool root = comm.rank() == 0;
  for (const std::int64_t n : opt.sizes) {
    Param<S> p("g", "main", {n});
    for (Index i = 0; i < n; ++i) p.grad[i] = static_cast<S>((i * 7 + comm.rank()) % 13) * 0.125f;
    dist::GradientReducer<S> red({&p}, comm, comm.size());
    std::vector<double> t_transfer, t_tree;
    for (int rep = 0; rep < opt.reps + 1; ++rep) {
      red.begin();
      red.add(comm.rank(), S(1));
      dist::agree_or_throw(comm, 0);  // start together
      const auto t0 = Clock::now();
      red.finish();
      const double total = secs(t0, Clock::now());
      if (rep == 0) continue;  // warm-up (first touch of the buffers)
      const std::vector<double> m = max_over_ranks(comm, {red.comm_seconds(), total - red.comm_seconds()});
      t_transfer.push_back(m[0]);
      t_tree.push_back(m[1]);
    }
    if (!root) continue;
    nlohmann::json j;
    j["bench"] = "comm";
    j["ranks"] = comm.size();
    j["floats"] = n;
    j["bytes_per_rank"] = static_cast<std::uint64_t>(n) * sizeof(S);
    j["bytes_received_per_rank"] = static_cast<std::uint64_t>(n) * sizeof(S) * static_cast<std::uint64_t>(comm.size() - 1);
    j["allgather_s"] = median(t_transfer);
    j["tree_s"] = median(t_tree);
    j["allgather_GB_per_s"] =
        median(t_transfer) > 0 ? double(n) * sizeof(S) * double(comm.size() - 1) / median(t_transfer) / 1e9 : 0.0;
    j["reps"] = opt.reps;
    fmt::print("{}\n", j.dump());
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  dea::retain_freed_memory();
  std::unique_ptr<dist::Comm> comm;
  if (dist::launched_by_mpirun()) comm = std::make_unique<dist::MpiComm>();
  else comm = std::make_unique<dist::SingleProcessComm>();
  Options opt;
  try {
    cli::Args args(argc, argv);
    while (args.next()) {
      if (args.is("--config")) {
        opt.configs = cli::split(args.value(), ',');
      } else if (args.is("--micro_batches")) {
        opt.micro_batches = args.int_value(1, 1 << 20);
      } else if (args.is("--threads")) {
        opt.threads = static_cast<int>(args.int_value(1, cli::kMaxThreads));
      } else if (args.is("--steps")) {
        opt.steps = static_cast<int>(args.int_value(1, 100000));
      } else if (args.is("--warmup")) {
        opt.warmup = static_cast<int>(args.int_value(0, 100000));
      } else if (args.is("--reps")) {
        opt.reps = static_cast<int>(args.int_value(1, 100000));
      } else if (args.is("--seed")) {
        opt.seed = static_cast<std::uint64_t>(args.int_value(0, cli::kNoMax));
      } else if (args.is("--sizes")) {
        opt.sizes.clear();
        for (const std::string& s : cli::split(args.value(), ',')) opt.sizes.push_back(cli::parse_int("--sizes", s, 1, 1LL << 30));
      } else if (args.is("--help") || args.is("-h")) {
        usage("help");
      } else if (args.arg().compare(0, 1, "-") != 0 && opt.mode.empty()) {
        opt.mode = args.arg();
      } else {
        args.unknown();
      }
    }
  } catch (const std::exception& e) {
    if (comm->rank() == 0) usage(dea::without_error_prefix(e.what()));
    return 2;
  }
  if (opt.mode != "step" && opt.mode != "comm") {
    if (comm->rank() == 0) usage("expected the mode 'step' or 'comm'");
    return 2;
  }
  set_num_threads(opt.threads);
  try {
    if (opt.mode == "comm") {
      run_comm(*comm, opt);
    } else {
      for (const std::string& name : opt.configs) {
        const auto it = std::find_if(kConfigs.begin(), kConfigs.end(), [&](const BenchConfig& c) { return c.name == name; });
        check(it != kConfigs.end(), "--config: unknown configuration '", name, "' (quick, mid, paper)");
        run_step(*comm, *it, opt);
      }
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_dist (rank {}): {}\n", comm->rank(), dea::without_error_prefix(e.what()));
    comm->abort(1);
  }
  return 0;
}
