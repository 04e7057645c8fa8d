// bench_peak: the machine's arithmetic limit for products (bench/peak.hpp): the FP32 and FP64 fused multiply-add
// peaks and the bf16 dot-product peak (vdpbf16ps, fp32 accumulation), in GFLOP/s, on each thread count.
//
//   bench_peak [--threads 1,2] [--reps 10] [--seconds 0.02]
//
// One JSON line per (precision, threads) on stdout: {"bench": "peak", "precision", "threads", "available", "isa",
// "gflops", "gflops_per_thread", "reps", "seconds"} (gflops: the best of --reps rounds of about --seconds each,
// summed over the threads); a precision the CPU has no instruction for is "available": false. A table of the same
// figures goes to stderr.
// Exit status: 0 done, 1 failure, 2 bad command line.
#include <dea/cli/flags.hpp>
#include <dea/core/error.hpp>

#include <fmt/core.h>

#include "peak.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace {

constexpr const char* kUsage = "usage: bench_peak [--threads 1,2] [--reps 10] [--seconds 0.02]\n";

}  // namespace

int main(int argc, char** argv) try {
  using namespace dea;
  std::vector<int> threads = {1, 2};
  int reps = 10;
  double seconds = 0.02;
  try {
    cli::Args args(argc, argv);
    while (args.next()) {
      if (args.is("-h") || args.is("--help")) {
        fmt::print("{}", kUsage);
        return 0;
      }
      if (args.is("--threads")) {
        threads.clear();
        for (const std::int64_t t : cli::parse_int_list("--threads", args.value(), 1, cli::kMaxThreads))
          threads.push_back(static_cast<int>(t));
      } else if (args.is("--reps")) {
        reps = static_cast<int>(args.int_value(1, 1000));
      } else if (args.is("--seconds")) {
        const std::string v = args.value();
        double s = 0;
        try {
          std::size_t used = 0;
          s = std::stod(v, &used);
          if (used != v.size()) s = 0;
        } catch (const std::exception&) {
          s = 0;
        }
        if (!(s >= 0.001 && s <= 10)) cli::bad_value("--seconds", v, "a number of seconds in [0.001, 10]");
        seconds = s;
      } else {
        args.unknown();
      }
    }
  } catch (const Error& e) {
    fmt::print(stderr, "bench_peak: {}\n{}", without_error_prefix(e.what()), kUsage);
    return 2;
  }
  using bench_peak::Kind;
  const Kind kinds[3] = {Kind::fp32, Kind::fp64, Kind::bf16};
  std::vector<std::string> rows;
  for (const Kind k : kinds)
    for (const int t : threads) {
      const bench_peak::Peak p = bench_peak::measure_peak(k, t, reps, seconds);
      fmt::print("{{\"bench\": \"peak\", \"precision\": \"{}\", \"threads\": {}, \"available\": {}, \"isa\": \"{}\", "
                 "\"gflops\": {:.1f}, \"gflops_per_thread\": {:.1f}, \"reps\": {}, \"seconds\": {}}}\n",
                 bench_peak::kind_name(k), t, p.available ? "true" : "false", p.isa, p.gflops, p.gflops / t, reps,
                 seconds);
      std::fflush(stdout);
      rows.push_back(p.available ? fmt::format("| {} | {} | {:.0f} | {:.0f} | {} |", bench_peak::kind_name(k), t,
                                               p.gflops, p.gflops / t, p.isa)
                                 : fmt::format("| {} | {} | absent | absent | no instruction on this CPU |",
                                               bench_peak::kind_name(k), t));
    }
  fmt::print(stderr, "\n| precision | threads | GFLOP/s | per thread | instruction |\n"
                     "| --- | --- | --- | --- | --- |\n");
  for (const auto& r : rows) fmt::print(stderr, "{}\n", r);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_peak: {}\n", dea::without_error_prefix(e.what()));
  return 1;
}
