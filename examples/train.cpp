// train: the reference's train.py on this library (spec section 5): Dual-Expert transformer on D_alpha (or masked-LM
// on a local text corpus), AdamW with the main / gate groups, the gamma_mix schedule, periodic validation,
// atomic checkpoints, bit-exact --resume and the Paris probe at the end.
//
//   train [--quick] [--d_model 512] [--n_heads 8] [--n_layers 6] [--d_ff 2048] [--dropout 0.1] [--max_len 64]
//         [--batch_size 128] [--lr_main 3e-4] [--lr_gate 1e-3] [--weight_decay 0.01] [--grad_clip 1.0]
//         [--steps 12000] [--gamma_steps 10000] [--log_every 50] [--eval_every 1000] [--seed 42]
//         [--out_dir runs/dea] [--data_source dalpha|text] [--text FILE] [--oracle mock|FILE.jsonl]
//         [--n_per_source 2000] [--supervise_layers all|i,j,...] [--eval_batches 50] [--threads N] [--resume]
//         [--plot_dir DIR] [--no-plots] [--overwrite]
//
// Plots (SVG, into --plot_dir, default out_dir; --no-plots turns them off): at each evaluation
// alpha_hist_train_step<N>.svg and alpha_hist_val_step<N>.svg (alpha-hat against the oracle alpha) and
// training_curves.svg (losses, gamma_mix, accuracy, alpha-hat against the oracle, from train_log.jsonl).
// --quick sets D=128 H=4 2 layers d_ff 256 batch 32 300 steps gamma_steps 200 eval_every 150 log_every 25
// n_per_source 500, except for flags given explicitly. With --resume, the run continues from out_dir's checkpoint
// with the saved configuration; only --steps, --log_every, --eval_every, --eval_batches and --threads may change.
// A fresh run refuses an out_dir that holds another run's files (checkpoint, config, log, ...) unless --overwrite,
// which deletes them first. config.json records --text and --oracle files by absolute path.
// Exit status: 0 done, 1 error (bad input, failed isolation check, non-finite loss), 2 bad command line.
#include <dea/core/allocator.hpp>
#include <dea/io/pipeline.hpp>

#include <fmt/core.h>

#include <exception>
#include <filesystem>
#include <new>
#include <optional>
#include <string>
#include <vector>

using namespace dea;

namespace {

/// --text and --oracle by absolute path (eval and --resume then find them from any working directory).
void absolute_data_paths(pipeline::TrainConfig& c) {
  if (!c.text.empty()) c.text = std::filesystem::absolute(c.text).lexically_normal().string();
  if (c.oracle != "mock") c.oracle = std::filesystem::absolute(c.oracle).lexically_normal().string();
}

const char* kUsage =
    "usage: train [--quick] [--d_model N] [--n_heads N] [--n_layers N] [--d_ff N] [--dropout P] [--max_len N]\n"
    "             [--batch_size N] [--lr_main X] [--lr_gate X] [--weight_decay X] [--grad_clip X] [--steps N]\n"
    "             [--gamma_steps N] [--log_every N] [--eval_every N] [--seed N] [--out_dir DIR]\n"
    "             [--data_source dalpha|text] [--text FILE] [--oracle mock|FILE.jsonl] [--n_per_source N]\n"
    "             [--supervise_layers all|i,j,...] [--eval_batches N] [--threads N] [--resume]\n"
    "             [--plot_dir DIR (default: out_dir)] [--no-plots] [--overwrite]\n";

}  // namespace

int main(int argc, char** argv) {
  dea::retain_freed_memory();  // reuse freed activations instead of faulting pages in every step
  // --no-plots, --plot_dir DIR and --overwrite are not part of the run's configuration (config.json): taken out here
  std::vector<std::string> args;
  std::string plot_dir;
  bool plots = true, overwrite = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-plots") plots = false;
    else if (a == "--overwrite") overwrite = true;
    else if (a.compare(0, 11, "--plot_dir=") == 0) plot_dir = a.substr(11);
    else if (a == "--plot_dir") {
      if (i + 1 >= argc || std::string(argv[i + 1]).compare(0, 2, "--") == 0) {
        fmt::print(stderr, "train: --plot_dir: missing value\n{}", kUsage);
        return 2;
      }
      plot_dir = argv[++i];
    } else args.push_back(a);
  }
  pipeline::ParsedArgs p;
  try {
    p = pipeline::parse_args(args);
  } catch (const std::exception& e) {
    fmt::print(stderr, "train: {}\n{}", e.what(), kUsage);
    return 2;
  }
  if (p.help) {
    fmt::print("{}", kUsage);
    return 0;
  }
  if (p.config.resume && overwrite) {
    fmt::print(stderr, "train: --resume and --overwrite contradict each other (continue the run, or replace it)\n{}",
               kUsage);
    return 2;
  }
  std::optional<pipeline::TrainConfig> saved;
  if (p.config.resume) {
    try {  // the saved configuration: a bad file is bad input (1), not a bad command line (2)
      saved = pipeline::read_config(pipeline::config_path(p.config.out_dir));
    } catch (const std::exception& e) {
      fmt::print(stderr, "train: --resume: {}\n", e.what());
      return 1;
    }
  }
  pipeline::TrainConfig cfg;
  try {
    cfg = p.config;
    if (cfg.resume) {
      pipeline::TrainConfig merged = pipeline::parse_args(args, *saved, false).config;
      merged.out_dir = cfg.out_dir;
      merged.resume = true;
      absolute_data_paths(merged);
      pipeline::TrainConfig saved_abs = *saved;
      absolute_data_paths(saved_abs);
      const nlohmann::json a = pipeline::to_json(saved_abs), b = pipeline::to_json(merged);
      for (auto it = a.begin(); it != a.end(); ++it) {
        const std::string& k = it.key();
        if (k == "steps" || k == "log_every" || k == "eval_every" || k == "eval_batches" || k == "threads" ||
            k == "out_dir" || k == "resume" || k == "quick")
          continue;
        check(b.at(k) == it.value(), "--", k, ": ", b.at(k).dump(), " differs from the checkpoint's ",
              it.value().dump(), " (a resumed run keeps its configuration)");
      }
      cfg = merged;
    }
    pipeline::validate(cfg);
    if (!cfg.resume) {
      pipeline::check_fresh_run_dir(cfg.out_dir, overwrite);
      absolute_data_paths(cfg);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "train: {}\n{}", e.what(), kUsage);
    return 2;
  }
  try {
    pipeline::TrainOptions opts;
    opts.overwrite = overwrite;
    if (plots) opts.plot_dir = plot_dir.empty() ? cfg.out_dir : plot_dir;
    const pipeline::TrainResult r = pipeline::run_training(cfg, opts);
    if (r.last_eval)
      fmt::print("final val: {}\n", pipeline::to_json(*r.last_eval).dump());
    fmt::print("checkpoint: {}\n", pipeline::checkpoint_path(cfg.out_dir));
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "train: out of memory (--d_model {} --d_ff {} --n_layers {} --batch_size {} --max_len {} "
                       "--n_per_source {}): choose smaller sizes\n",
               cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.batch_size, cfg.max_len, cfg.n_per_source);
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "train: {}\n", e.what());
    return 1;
  }
  return 0;
}
