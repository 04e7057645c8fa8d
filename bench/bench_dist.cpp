// bench_dist: the data-parallel training step and its gradient exchange (docs/scale.md), printed as one JSON line
// per measurement. Run it as one process or under mpirun (one rank per process; rank 0 prints):
//
//   bench_dist step [--config mid,paper] [--exchange allgather,reduce_scatter] [--bucket_mb 4] [--micro_batches M]
//                   [--threads 1] [--steps 6] [--warmup 1] [--seed 42]
//   mpirun -np 2 --bind-to core bench_dist step --threads 1
//   mpirun -np 4 --bind-to none --oversubscribe bench_dist step --threads 1     (more ranks than cores)
//   mpirun -np 2 --bind-to core bench_dist comm [--sizes 16384,...] [--reps 5]
//
// step: the Dual-Expert encoder's training step as `dea train --micro_batches M` runs it (train::Trainer::step_micro;
// the configurations of bench_train: mid D=256 H=8 L=4 d_ff=1024 batch 64, paper D=512 H=8 L=6 d_ff=2048 batch 128,
// max_len 64, dropout 0.1, D_alpha with the mock oracle; M the rank count unless given). Each exchange of --exchange
// has its own dist::GradientReducer over the same model, and the steps alternate between them (step 1 the first
// exchange, step 2 the second, ...), so that whatever else runs on the machine slows both alike; both give the same
// bits, so the training run is the same whichever exchange a step used. The reduce_scatter steps install the
// model's grads_final report, so their buckets are exchanged during the backward of the rank's last micro-batch;
// the allgather steps do not (as the trainer). The phases of a step, every rank's, from the reducer's ExchangeStats
// and clocks around the calls:
//   compute   begin() .. complete(): collation, forward and backward of the rank's M/R micro-batches, their tree
//   exposed   the exchange the main thread waited for after its backward: reduce_scatter, complete() (the buckets
//             not yet done; the per-slice trees are in it); allgather, the allgather and the whole tree in finish()
//   hidden    exchange time that ran on the communication thread while the main thread computed
//   status    the status exchange after complete() and the gather of the per-micro-batch losses
//   finish    finish() less its exchange: writing the summed gradient into the parameters
//   optim     clipping and AdamW
// A step's line takes, step by step, the phases of the rank whose compute was the longest (the one every other rank
// waits for, so its exposed time is exchange, not waiting), and the step time as the maximum over the ranks; then
// the median over the steps. imbalance_s is the median of (longest - shortest compute): what the faster ranks wait.
// exposed_share = exposed / step; hidden_share = hidden / (hidden + exposed exchange). bytes_sent/bytes_received:
// the gradient bytes one rank sends and receives per step (what the exchange moves). comm_share = (status + exposed
// + finish) / step. With M = 1 on one rank the step is the plain one (no micro-batches, nothing exchanged).
//
// comm: the pieces of both exchanges for a gradient of each size (floats), the median over --reps of the maximum
// over the ranks: allgather (of every rank's whole buffer) and tree (over the R buffers), as the allgather exchange
// runs them; alltoall (slice j of every rank's buffer to rank j), slice_tree (over the R copies of one slice) and
// slice_allgather (the summed slices), as the reduce-scatter runs one bucket; and each exchange whole through
// dist::GradientReducer (reducer_*_s: its ExchangeStats, the reduce-scatter in buckets of --bucket_mb, without a
// backward to overlap with). With the bytes each rank sends and receives for each.
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
  std::vector<dist::Exchange> exchanges = {dist::Exchange::allgather, dist::Exchange::reduce_scatter};
  double bucket_mb = dist::ExchangeOptions{}.bucket_mb;
  std::int64_t micro_batches = 0;  // 0: the rank count
  int threads = 1, steps = 6, warmup = 1, reps = 5;
  std::uint64_t seed = 42;
  std::vector<std::int64_t> sizes = {1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26};
};

[[noreturn]] void usage(const std::string& why) {
  fmt::print(stderr,
             "bench_dist: {}\nusage: bench_dist step [--config mid,paper] [--exchange allgather,reduce_scatter] "
             "[--bucket_mb 4] [--micro_batches M] [--threads N] [--steps 6] [--warmup 1] [--seed 42]\n"
             "       bench_dist comm [--sizes 16384,65536,...] [--reps 5] [--bucket_mb 4]\n"
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

/// One step's phases on one rank (the order of the values exchanged between the ranks).
enum Phase { kStep, kCompute, kExposed, kHidden, kStatus, kFinish, kOptim, kPhases };

/// The phases of the rank with the longest compute, with the step the maximum over the ranks and, last, the
/// imbalance (longest - shortest compute).
std::vector<double> critical_rank(dist::Comm& comm, const std::vector<double>& v) {
  const std::size_t n = v.size(), R = static_cast<std::size_t>(comm.size());
  std::vector<double> all(n * R);
  comm.allgather(v.data(), n, all.data());
  std::size_t slow = 0;
  double lo = all[kCompute], hi = all[kCompute], step = 0;
  for (std::size_t r = 0; r < R; ++r) {
    const double c = all[r * n + kCompute];
    if (c > hi) {
      hi = c;
      slow = r;
    }
    lo = std::min(lo, c);
    step = std::max(step, all[r * n + kStep]);
  }
  std::vector<double> out(all.begin() + static_cast<std::ptrdiff_t>(slow * n),
                          all.begin() + static_cast<std::ptrdiff_t>((slow + 1) * n));
  out[kStep] = step;
  out.push_back(hi - lo);
  return out;
}

struct StepSeries {
  dist::Exchange exchange;
  std::unique_ptr<dist::GradientReducer<float>> red;
  std::vector<std::vector<double>> phases;  // per measured step: kPhases values and the imbalance
  dist::ExchangeStats last;
};

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
  const bool plain = M == 1 && comm.size() == 1;
  if (root)
    fmt::print(stderr, "[{}] {} ranks x {} threads, M = {}: {} parameters\n", bc.name, comm.size(), opt.threads, M,
               n_grad);

  std::vector<StepSeries> series;
  for (const dist::Exchange e : plain ? std::vector<dist::Exchange>{opt.exchanges.front()} : opt.exchanges) {
    dist::ExchangeOptions eo;
    eo.exchange = e;
    eo.bucket_mb = opt.bucket_mb;
    series.push_back({e, std::make_unique<dist::GradientReducer<S>>(model->parameters(), comm, M, eo), {}, {}});
  }
  const std::size_t E = series.size();
  const Index rows = cfg.batch_size / static_cast<Index>(M);
  Model::Cache cache;
  const int total = static_cast<int>(E) * (opt.warmup + opt.steps);
  for (int s = 1; s <= total; ++s) {
    StepSeries& ser = series[static_cast<std::size_t>(s - 1) % E];
    dist::GradientReducer<S>& red = *ser.red;
    const std::vector<std::size_t>& all = order.at(s);
    const S gamma = optim::gamma_mix<S>(s - 1, cfg.gamma_steps);
    std::vector<double> ph(kPhases, 0.0);
    const auto c0 = Clock::now();
    if (plain) {
      Rng mrng(train::stream_seed(cfg.seed, train::kMaskStream, static_cast<std::uint64_t>(s)));
      const auto b = train::encoder::make_batch<S>(d, train::encoder::Split::train, all, cfg.max_len, &mrng);
      Rng drng(train::stream_seed(cfg.seed, train::kDropoutStream, static_cast<std::uint64_t>(s)));
      model->forward(b, gamma, true, &drng, cache);
      opt_.zero_grad();
      model->backward(cache);
      ph[kCompute] = secs(c0, Clock::now());
    } else {
      if (red.uses_grads_final()) model->set_grads_final([&red](std::size_t i) { red.grads_final(i); });
      else model->set_grads_final(nullptr);
      red.begin();
      for (const std::int64_t k : red.local_order()) {
        const std::vector<std::size_t> idx(all.begin() + k * rows, all.begin() + (k + 1) * rows);
        Rng mrng(train::micro_stream_seed(cfg.seed, train::kMaskStream, static_cast<std::uint64_t>(s),
                                          static_cast<std::uint64_t>(k)));
        const auto b = train::encoder::make_batch<S>(d, train::encoder::Split::train, idx, cfg.max_len, &mrng);
        Rng drng(train::micro_stream_seed(cfg.seed, train::kDropoutStream, static_cast<std::uint64_t>(s),
                                          static_cast<std::uint64_t>(k)));
        opt_.zero_grad();
        red.start(k, S(1) / static_cast<S>(M));
        model->forward(b, gamma, true, &drng, cache);
        model->backward(cache);
        red.add(k, S(1) / static_cast<S>(M));
      }
      red.complete();
      const auto c1 = Clock::now();
      dist::agree_or_throw(comm, 0);
      red.gather(std::vector<double>(static_cast<std::size_t>(red.local().size()) * 2, 0.0), 2);
      const auto c2 = Clock::now();
      const double exposed_before = red.stats().exposed_seconds;
      red.finish();
      const double fin = secs(c2, Clock::now());
      const dist::ExchangeStats& st = red.stats();
      ph[kCompute] = st.compute_seconds;
      ph[kExposed] = st.exposed_seconds;
      ph[kHidden] = st.hidden_seconds;
      ph[kStatus] = secs(c1, c2);
      ph[kFinish] = std::max(0.0, fin - (st.exposed_seconds - exposed_before));
      ser.last = st;
    }
    const auto o0 = Clock::now();
    opt_.clip_grad_norms();
    opt_.step();
    ph[kOptim] = secs(o0, Clock::now());
    ph[kStep] = secs(c0, Clock::now());
    const std::vector<double> crit = critical_rank(comm, ph);
    if (s > static_cast<int>(E) * opt.warmup) ser.phases.push_back(crit);
    if (root)
      fmt::print(stderr, "[{}] step {} ({}): {:.3f} s, exposed {:.4f} s, hidden {:.4f} s\n", bc.name, s,
                 plain ? "plain" : dist::exchange_name(ser.exchange), crit[kStep], crit[kExposed], crit[kHidden]);
  }
  model->set_grads_final(nullptr);
  if (!root) return;
  for (const StepSeries& ser : series) {
    auto med = [&](std::size_t i) {
      std::vector<double> v;
      for (const auto& p : ser.phases) v.push_back(p[i]);
      return median(v);
    };
    const double st = med(kStep), exposed = med(kExposed), hidden = med(kHidden);
    nlohmann::json j;
    j["bench"] = "step";
    j["config"] = bc.name;
    j["exchange"] = plain ? "none" : dist::exchange_name(ser.exchange);
    j["ranks"] = comm.size();
    j["threads_per_rank"] = opt.threads;
    j["micro_batches"] = M;
    j["batch"] = bc.batch;
    j["parameters"] = n_grad;
    j["grad_bytes"] = n_grad * sizeof(S);
    j["bucket_mb"] = opt.bucket_mb;
    j["buckets"] = ser.last.buckets;
    j["overlapped"] = ser.last.overlapped;
    j["s_per_step"] = st;
    j["steps_per_s"] = 1.0 / st;
    j["compute_s"] = med(kCompute);
    j["exposed_s"] = exposed;
    j["hidden_s"] = hidden;
    j["status_s"] = med(kStatus);
    j["finish_s"] = med(kFinish);
    j["optim_s"] = med(kOptim);
    j["imbalance_s"] = med(kPhases);
    j["exposed_share"] = exposed / st;
    j["hidden_share"] = hidden + exposed > 0 ? hidden / (hidden + exposed) : 0.0;
    j["comm_share"] = (med(kStatus) + exposed + med(kFinish)) / st;
    j["bytes_sent"] = ser.last.bytes_sent;
    j["bytes_received"] = ser.last.bytes_received;
    j["steps"] = opt.steps;
    fmt::print("{}\n", j.dump());
  }
  std::fflush(stdout);
}

void run_comm(dist::Comm& comm, const Options& opt) {
  using S = float;
  const bool root = comm.rank() == 0;
  const std::size_t R = static_cast<std::size_t>(comm.size());
  for (const std::int64_t n64 : opt.sizes) {
    const std::size_t n = static_cast<std::size_t>(n64), sl = (n + R - 1) / R;
    Param<S> p("g", "main", {n64});
    for (Index i = 0; i < n64; ++i) p.grad[i] = static_cast<S>((i * 7 + comm.rank()) % 13) * 0.125f;
    std::vector<S> mine(R * sl, S(0)), gathered(R * n), recv(R * sl), slice(sl), out(R * sl);
    std::copy(p.grad.data(), p.grad.data() + n64, mine.begin());
    std::vector<const S*> sums(R), slices(R);
    for (std::size_t r = 0; r < R; ++r) {
      sums[r] = gathered.data() + r * n;
      slices[r] = recv.data() + r * sl;
    }
    std::vector<std::unique_ptr<dist::GradientReducer<S>>> reds;
    for (const dist::Exchange e : {dist::Exchange::allgather, dist::Exchange::reduce_scatter}) {
      dist::ExchangeOptions eo;
      eo.exchange = e;
      eo.bucket_mb = opt.bucket_mb;
      reds.push_back(std::make_unique<dist::GradientReducer<S>>(ParamList<S>{&p}, comm, comm.size(), eo));
    }
    enum { kAg, kTree, kA2a, kSliceTree, kSliceAg, kRedAg, kRedRs, kN };
    std::vector<std::vector<double>> t(kN);
    std::size_t buckets = 0;
    for (int rep = 0; rep < opt.reps + 1; ++rep) {  // rep 0: warm-up (first touch of the buffers)
      std::vector<double> v(kN, 0.0);
      auto timed = [&](int i, auto&& f) {
        dist::agree_or_throw(comm, 0);  // start together
        const auto t0 = Clock::now();
        f();
        v[static_cast<std::size_t>(i)] = secs(t0, Clock::now());
      };
      timed(kAg, [&] { comm.allgather_bytes(mine.data(), n * sizeof(S), gathered.data()); });
      timed(kTree, [&] { dist::tree_sum(sums, n, gathered.data()); });
      timed(kA2a, [&] { comm.alltoall_bytes(mine.data(), sl * sizeof(S), recv.data()); });
      timed(kSliceTree, [&] { dist::tree_sum(slices, sl, slice.data(), false); });
      timed(kSliceAg, [&] { comm.allgather_bytes(slice.data(), sl * sizeof(S), out.data()); });
      for (std::size_t e = 0; e < reds.size(); ++e) {
        dist::GradientReducer<S>& red = *reds[e];
        red.begin();
        red.add(comm.rank(), S(1));
        dist::agree_or_throw(comm, 0);
        red.complete();
        red.finish();
        v[kRedAg + e] = red.stats().exchange_seconds;
        if (e == 1) buckets = red.stats().buckets;
      }
      if (rep == 0) continue;
      const std::vector<double> m = max_over_ranks(comm, v);
      for (std::size_t i = 0; i < kN; ++i) t[i].push_back(m[i]);
    }
    if (!root) continue;
    const double ag = median(t[kAg]), a2a = median(t[kA2a]), sag = median(t[kSliceAg]);
    const std::uint64_t ag_bytes = static_cast<std::uint64_t>(n * sizeof(S) * (R - 1));
    const std::uint64_t piece = static_cast<std::uint64_t>(sl * sizeof(S) * (R - 1));
    nlohmann::json j;
    j["bench"] = "comm";
    j["ranks"] = comm.size();
    j["floats"] = n;
    j["bytes_per_rank"] = static_cast<std::uint64_t>(n) * sizeof(S);
    j["bytes_received_per_rank"] = ag_bytes;  // the allgather exchange
    j["allgather_s"] = ag;
    j["tree_s"] = median(t[kTree]);
    j["allgather_GB_per_s"] = ag > 0 ? double(ag_bytes) / ag / 1e9 : 0.0;
    j["rs_bytes_sent_per_rank"] = 2 * piece;  // the reduce-scatter exchange, sent and received alike
    j["alltoall_s"] = a2a;
    j["slice_tree_s"] = median(t[kSliceTree]);
    j["slice_allgather_s"] = sag;
    j["alltoall_GB_per_s"] = a2a > 0 ? double(piece) / a2a / 1e9 : 0.0;
    j["slice_allgather_GB_per_s"] = sag > 0 ? double(piece) / sag / 1e9 : 0.0;
    j["reducer_allgather_s"] = median(t[kRedAg]);
    j["reducer_reduce_scatter_s"] = median(t[kRedRs]);
    j["bucket_mb"] = opt.bucket_mb;
    j["buckets"] = buckets;
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
      } else if (args.is("--exchange")) {
        opt.exchanges.clear();
        for (const std::string& e : cli::split(args.value(), ',')) opt.exchanges.push_back(dist::parse_exchange(e));
        check(!opt.exchanges.empty(), "--exchange: expected allgather, reduce_scatter or both");
      } else if (args.is("--bucket_mb")) {
        opt.bucket_mb = args.double_value(cli::Range::open_closed(0, 1e6));
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
