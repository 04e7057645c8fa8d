// eval: the reference's eval.py on this library (spec section 6). Loads checkpoint.safetensors, config.json and
// tokenizer.txt from a run directory, rebuilds the data from the saved configuration, evaluates a split at
// gamma_mix = 0 in evaluation mode, writes eval_<split>.json next to the checkpoint, then runs the Paris probe.
//
//   eval --ckpt DIR [--split test|val|train] [--threads N] [--plot_dir DIR] [--no-plots]
//
// Also writes alpha_hist_<split>.svg (alpha-hat against the oracle alpha on the split's labelled cells) into
// --plot_dir (default: the checkpoint directory); --no-plots skips it.
// Exit status: 0 done, 1 error (missing or corrupt files), 2 bad command line.
#include <dea/io/cli.hpp>
#include <dea/io/pipeline.hpp>

#include <fmt/core.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <new>
#include <string>

using namespace dea;

namespace {

const char* kUsage = "usage: eval --ckpt DIR [--split test|val|train] [--threads N] [--plot_dir DIR] [--no-plots]\n";

}  // namespace

int main(int argc, char** argv) {
  std::string dir, split_s = "test", plot_dir;
  bool plots = true;
  int threads = 0;
  pipeline::Split split = pipeline::Split::test;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i], v;
      if (a == "-h" || a == "--help") {
        fmt::print("{}", kUsage);
        return 0;
      }
      if (a == "--no-plots") {
        plots = false;
        continue;
      }
      const auto eq = a.find('=');
      if (eq != std::string::npos) {
        v = a.substr(eq + 1);
        a = a.substr(0, eq);
      }
      // an unknown flag is reported as such, not as a missing value
      check(a == "--ckpt" || a == "--plot_dir" || a == "--split" || a == "--threads",
            a.compare(0, 1, "-") == 0 ? "unknown flag " : "unexpected argument ", a);
      if (eq == std::string::npos) {
        check(i + 1 < argc && std::string(argv[i + 1]).compare(0, 2, "--") != 0, a, ": missing value");
        v = argv[++i];
      }
      if (a == "--ckpt") dir = v;
      else if (a == "--plot_dir") plot_dir = v;
      else if (a == "--split") split_s = v;
      else if (a == "--threads")
        threads = static_cast<int>(cli::parse_int("--threads", v, 0, cli::kMaxThreads));
    }
    check(!dir.empty(), "--ckpt DIR is required");
    split = pipeline::parse_split(split_s);
    if (plots && !plot_dir.empty()) {  // checked before the evaluation, not after it
      std::error_code ec;
      std::filesystem::create_directories(plot_dir, ec);
      check(!ec && std::filesystem::is_directory(plot_dir), "--plot_dir: cannot create the directory '", plot_dir, "'",
            ec ? ": " + ec.message() : std::string());
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "eval: {}\n{}", e.what(), kUsage);
    return 2;
  }
  try {
    if (threads > 0) set_num_threads(threads);
    pipeline::ParisProbe probe;
    const pipeline::EvalResult r = pipeline::evaluate_checkpoint(dir, split, &probe);
    const std::string out = (std::filesystem::path(dir) / ("eval_" + std::string(pipeline::split_name(split)) + ".json")).string();
    const nlohmann::json j = pipeline::to_json(r);
    data::write_file_atomic(out, j.dump(2) + "\n");
    fmt::print("{}\nwritten to {}\n", j.dump(2), out);
    if (plots) {
      const std::string pdir = plot_dir.empty() ? dir : plot_dir;
      std::filesystem::create_directories(pdir);
      const std::string name = std::string(pipeline::split_name(split));
      const std::string path = (std::filesystem::path(pdir) / ("alpha_hist_" + name + ".svg")).string();
      plots::alpha_histogram(r.alpha_hat_points, r.alpha_oracle_points, name + ": alpha_hat vs oracle").save(path);
      fmt::print("plot: {}\n", path);
    }
    pipeline::print_paris_probe(probe);
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "eval: out of memory evaluating the run in '{}' (see its config.json for the sizes)\n", dir);
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "eval: {}\n", e.what());
    return 1;
  }
  return 0;
}
