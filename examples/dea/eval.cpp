// dea eval: the reference's eval.py (docs/training.md). Loads checkpoint.safetensors, config.json and tokenizer.txt
// from a run directory, rebuilds the data from the saved configuration (refused when config.json names data this
// program cannot rebuild, such as the reference's Wikipedia stream, or when the data's fingerprint is not the run's
// data_hash), evaluates a split at gamma_mix = 0 in
// evaluation mode, writes eval_<split>.json next to the checkpoint and alpha_hist_<split>.svg (alpha-hat against
// the oracle alpha on the split's labelled cells) into --plot_dir (default: the run directory), then runs the
// Paris probe. A run of --model dea_bert (config.json's "model") is rebuilt from its directory alone (bert_config.json,
// vocab.txt, the checkpoint) and evaluated the same way. --ckpt takes the run directory or the checkpoint.safetensors
// in it (the reference's usage names the checkpoint file).
// Stdout carries the results (the JSON, then the Paris probe); where the files went goes to stderr. With --json,
// stdout is the JSON document alone and the probe goes to stderr too.
// Exit status: 0 done, 1 error (missing or corrupt files), 2 bad command line.
//
// Under mpirun (docs/scale.md) every rank loads the run and evaluates its share of the split's batches; the
// batches' sums are gathered and added in batch order, so the JSON is one process's, bit for bit, for any rank
// count. Rank 0 alone prints and writes; a failure on one rank stops every rank with one message naming it.
#include "commands.hpp"
#include "paris_probe.hpp"

#include <dea/core/files.hpp>
#include <dea/core/parallel.hpp>
#include <dea/dist/comm.hpp>
#include <dea/dist/reducer.hpp>
#include <dea/plot/figures.hpp>
#include <dea/train/config.hpp>
#include <dea/train/dea_bert.hpp>
#include <dea/train/encoder.hpp>
#include <dea/cli/flags.hpp>
#include <dea/train/lm.hpp>
#if defined(DEA_WITH_MPI)
#include <dea/dist/mpi_comm.hpp>
#endif

#include <fmt/core.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

using namespace dea;

namespace {

/// The run directory that --ckpt names: the directory itself, or the directory of the checkpoint file given.
std::string run_directory(const std::string& ckpt) {
  namespace sfs = std::filesystem;
  std::error_code ec;
  if (!sfs::is_regular_file(ckpt, ec)) return ckpt;  // a directory, or nothing: loading it says what is missing
  const sfs::path p(ckpt);
  check(p.filename() == "checkpoint.safetensors", "--ckpt '", ckpt,
        "': expected a run directory or the checkpoint.safetensors in one, got another file");
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

/// The ranks of the evaluation (MPI when started by mpirun in a program built with it; else none: one process).
std::unique_ptr<dist::Comm> make_comm() {
#if defined(DEA_WITH_MPI)
  if (dist::launched_by_mpirun()) return std::make_unique<dist::MpiComm>();
#endif
  return nullptr;
}

/// The evaluation failed with `e` (message `err`): one process prints it; with several ranks an error that came
/// through the ranks' exchange (every rank has it) is printed by rank 0, one of this rank's alone is printed with
/// its rank and the job is ended, so that no rank waits for this one.
int failed(dist::Comm* comm, int status, const std::exception& e, const std::string& err) {
  if (!comm || comm->size() == 1) {
    fmt::print(stderr, "{}", err);
    return status;
  }
  if (dynamic_cast<const dist::RankFailed*>(&e) != nullptr) {
    if (comm->rank() == 0) fmt::print(stderr, "{}", err);
    return status;
  }
  const std::string head = "dea eval: ";
  const bool headed = err.compare(0, head.size(), head) == 0;
  fmt::print(stderr, "{}{}", head, dist::rank_message(*comm, headed ? err.substr(head.size()) : err));
  std::fflush(stderr);
  comm->abort(status);
  return status;  // (abort does not return)
}

}  // namespace

int dea_eval(int argc, char** argv) {
  using S = float;
  namespace enc = train::encoder;
  std::string dir, split_s = "test", plot_dir;
  bool no_plots = false, json_only = false;
  int threads = 0;
  cli::FlagSet fs("dea eval --ckpt DIR [flags]",
                  "Evaluates a run's checkpoint on one split as the reference's eval.py does; writes\n"
                  "eval_<split>.json into the run directory.");
  fs.text("ckpt", dir, "DIR", "the run directory of dea train, or its checkpoint.safetensors (required)");
  fs.choice("split", split_s, {"test", "val", "train"}, "the split to evaluate");
  fs.integer("threads", threads, 0, cli::kMaxThreads, "OpenMP threads (0 = the library default)");
  fs.text("plot_dir", plot_dir, "DIR", "where alpha_hist_<split>.svg goes (default: --ckpt)");
  fs.toggle("no-plots", no_plots, "write no plot");
  fs.toggle("json", json_only, "stdout carries the JSON alone (the Paris probe goes to stderr)");
  fs.exit_status("0 done, 1 error (missing or corrupt files), 2 bad command line");
  enc::Split split = enc::Split::test;
  bool split_given = false;
  try {
    const auto p = fs.parse(std::vector<std::string>(argv + 1, argv + argc));
    split_given = p.flags.count("split") > 0;
    if (p.help) {
      fmt::print("{}", fs.help());
      return 0;
    }
    check(!dir.empty(), "--ckpt DIR is required");
    dir = run_directory(dir);
    split = enc::parse_split(split_s);
    if (!no_plots && !plot_dir.empty()) {  // checked before the evaluation, not after it
      std::error_code ec;
      std::filesystem::create_directories(plot_dir, ec);
      check(!ec && std::filesystem::is_directory(plot_dir), "--plot_dir: cannot create the directory '", plot_dir, "'",
            ec ? ": " + ec.message() : std::string());
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}(dea eval --help lists the flags)\n", dea::cli::message("dea eval", e));
    return 2;
  }
  const std::unique_ptr<dist::Comm> comm = make_comm();
  dist::SingleProcessComm single;
  dist::Comm& ranks = comm ? *comm : single;
  const bool root = ranks.rank() == 0;
  try {
    if (threads > 0) set_num_threads(threads);
    dea_cli::ParisProbe probe;
    std::string model;
    dist::together(ranks, [&] { model = train::read_config(train::config_path(dir))->model; });
    if (model == "lm") {  // the language model: NLL and perplexity on its validation split (train/lm.hpp)
      if (split_given && split != enc::Split::val) {
        if (root)
          fmt::print(stderr, "dea eval: --split {}: a --model lm run has a validation split only (--split val)\n",
                     enc::split_name(split));
        return 2;
      }
      std::optional<train::lm_run::LoadedRun<S>> run;
      std::optional<train::lm_run::LmData> data;
      dist::together(ranks, [&] {
        run.emplace(train::lm_run::load_run<S>(dir));
        data.emplace(train::detail::with_context(train::config_path(dir) + ": ",
                                                 [&] { return train::lm_run::build_data(*run->cfg); }));
      });
      const train::lm_run::EvalResult r =
          train::lm_run::evaluate(*run->model, *data, (*run->cfg)->batch_size, (*run->cfg)->max_len, 0, &ranks);
      nlohmann::json j = train::lm_run::to_json(r);
      j["step"] = run->step;
      const std::string out = (std::filesystem::path(dir) / "eval_val.json").string();
      dist::together(ranks, [&] {
        if (!root) return;
        write_file_atomic(out, j.dump(2) + "\n");
        fmt::print("{}\n", j.dump(2));
        std::fflush(stdout);
        fmt::print(stderr, "written to {}\n", out);
      });
      return 0;
    }
    const enc::EvalResult r =
        model == "dea_bert"
            ? train::dea_bert::evaluate_checkpoint<S>(
                  dir, split,
                  [&](bert::DualExpertBert<S>& m, const train::dea_bert::LoadedRun<S>& run) {
                    probe = dea_cli::paris_probe(m, run.tok);
                  },
                  comm.get())
            : enc::evaluate_checkpoint<S>(
                  dir, split,
                  [&](nn::TransformerModel<S>& m, const enc::LoadedRun<S>& run) {
                    probe = dea_cli::paris_probe(m, run.tok);
                  },
                  comm.get());
    dist::together(ranks, [&] {
      if (!root) return;
      const std::string name = enc::split_name(split);
      const std::string out = (std::filesystem::path(dir) / ("eval_" + name + ".json")).string();
      const nlohmann::json j = enc::to_json(r);
      write_file_atomic(out, j.dump(2) + "\n");
      fmt::print("{}\n", j.dump(2));
      std::fflush(stdout);
      fmt::print(stderr, "written to {}\n", out);
      if (!no_plots) {
        const std::string pdir = plot_dir.empty() ? dir : plot_dir;
        std::filesystem::create_directories(pdir);
        const std::string path = (std::filesystem::path(pdir) / ("alpha_hist_" + name + ".svg")).string();
        plots::alpha_histogram(r.alpha_hat_points, r.alpha_oracle_points, name + ": alpha_hat vs oracle").save(path);
        fmt::print(stderr, "plot: {}\n", path);
      }
      dea_cli::print_paris_probe(probe, json_only ? stderr : stdout);
    });
  } catch (const std::bad_alloc& e) {
    return failed(comm.get(), 1, e,
                  fmt::format("dea eval: out of memory evaluating the run in '{}' (see its config.json for the "
                              "sizes)\n", dir));
  } catch (const std::exception& e) {
    return failed(comm.get(), 1, e, dea::cli::message("dea eval", e));
  }
  return 0;
}
