// dea train: the reference's train.py (spec section 5): the Dual-Expert encoder on D_alpha (or masked-LM on a local
// text corpus), AdamW with the main / gate groups, the gamma_mix schedule, periodic validation, atomic checkpoints,
// bit-exact --resume and the Paris probe at the end. `dea train --help` lists every flag with its default and range.
//
// Plots (SVG, into --plot_dir, default out_dir; --no-plots turns them off): at each evaluation
// alpha_hist_train_step<N>.svg and alpha_hist_val_step<N>.svg and training_curves.svg. With --resume the run
// continues from out_dir's checkpoint with the saved configuration; only --steps, --log_every, --eval_every,
// --eval_batches and --threads may change (train::resumable_flags). A fresh run refuses an out_dir that holds
// another run's files unless --overwrite, which deletes them first. config.json records --text and --oracle by
// absolute path (and every other file a flag names: --babi, --clutrr, --conceptnet, --capitals, --vocab).
// --dump_pairs FILE writes the distinct (q_text, k_text) pairs of the run's D_alpha data as JSONL (the input of an
// oracle run) and exits without training; --oracle FILE.jsonl then trains with their alpha.
// --model dea_bert --hf_model DIR fine-tunes the reference's DualExpertBert from a local Hugging Face BERT directory
// (train/dea_bert.hpp) on the same D_alpha data, with the reference's hf defaults (lr_main 2e-5, batch_size 32,
// max_len 64) unless given; the encoder's own flags (--d_model, --n_heads, --n_layers, --d_ff, --dropout, --quick,
// --supervise_layers, --tokenizer, --vocab) are refused with it, and the directory is validated completely before
// anything is written.
// Exit status: 0 done, 1 error (a bad run directory or a resumed run's data, failed isolation check, non-finite
// loss), 2 bad command line or a data file it names that cannot be used (missing, malformed, an alpha cache without a
// pair of the data).
#include "commands.hpp"
#include "paris_probe.hpp"

#include <dea/core/allocator.hpp>
#include <dea/io/jsonl.hpp>
#include <dea/train/config.hpp>
#include <dea/train/dea_bert.hpp>
#include <dea/train/encoder.hpp>
#include <dea/train/flags.hpp>
#include <dea/train/lm.hpp>

#include <fmt/core.h>

#include <exception>
#include <filesystem>
#include <iostream>
#include <new>
#include <optional>
#include <string>
#include <vector>

using namespace dea;

namespace train_cmd {

/// The dea_bert part of dea train, once the configuration and the data are checked: the pretrained directory of a
/// fresh run is loaded and validated (a bad one is 2, nothing written), then the run.
int run_dea_bert(const train::ValidConfig& cfg, const train::encoder::RunData& data, bool overwrite,
                 const std::string& plot_dir) {
  using S = float;
  namespace db = train::dea_bert;
  std::optional<db::Pretrained<S>> pre;
  if (!cfg->resume) {
    try {
      pre.emplace(db::load_pretrained<S>(cfg->hf_model));
      db::check_vocab(data.tok, pre->files.config, "--hf_model '" + cfg->hf_model + "'");
      fmt::print("[model] {}\n", pre->report.str());
    } catch (const std::bad_alloc&) {
      fmt::print(stderr, "dea train: out of memory loading --hf_model '{}'\n", cfg->hf_model);
      return 1;
    } catch (const std::exception& e) {
      fmt::print(stderr, "dea train: --hf_model: {}\n", e.what());
      return 2;
    }
  }
  try {
    db::TrainOptions<S> opts;
    opts.data = &data;
    opts.overwrite = overwrite;
    opts.plot_dir = plot_dir;
    opts.on_finish = [](bert::DualExpertBert<S>& model, const train::encoder::RunData& d) {
      dea_cli::print_paris_probe(dea_cli::paris_probe(model, d.tok));
    };
    const train::encoder::TrainResult r = db::run_training<S>(cfg, opts, pre ? &*pre : nullptr);
    if (r.last_eval) fmt::print("final val: {}\n", train::encoder::to_json(*r.last_eval).dump());
    fmt::print("checkpoint: {}\n", train::checkpoint_path(cfg->out_dir));
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "dea train: out of memory (the model of --hf_model, --batch_size {} --max_len {} "
                       "--n_per_source {}): choose smaller sizes\n",
               cfg->batch_size, cfg->max_len, cfg->n_per_source);
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dea train: {}\n", e.what());
    return 1;
  }
  return 0;
}

/// The --model lm part of dea train (train/lm.hpp), once the configuration is checked: the corpus (a file of the
/// command line that cannot be used is 2, a resumed run's is 1), then the run.
int run_lm(const train::ValidConfig& cfg, bool overwrite) {
  using S = float;
  namespace lr = train::lm_run;
  std::optional<lr::LmData> data;
  try {
    if (cfg->resume)
      check(std::filesystem::exists(train::checkpoint_path(cfg->out_dir)), "no checkpoint at ",
            train::checkpoint_path(cfg->out_dir));
    data.emplace(lr::build_data(cfg));
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "dea train: out of memory reading --text '{}'\n", cfg->text);
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dea train: {}{}\n", cfg->resume ? "--resume: " : "", e.what());
    return cfg->resume ? 1 : 2;
  }
  try {
    lr::TrainOptions opts;
    opts.data = &*data;
    opts.overwrite = overwrite;
    const lr::TrainResult r = lr::run_training<S>(cfg, opts);
    if (r.last_eval) fmt::print("final val: {}\n", lr::to_json(*r.last_eval).dump());
    fmt::print("checkpoint: {}\n", train::checkpoint_path(cfg->out_dir));
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "dea train: out of memory (--d_model {} --d_ff {} --n_layers {} --batch_size {} --max_len {}): "
                       "choose smaller sizes\n",
               cfg->d_model, cfg->d_ff, cfg->n_layers, cfg->batch_size, cfg->max_len);
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dea train: {}\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace train_cmd

int dea_train(int argc, char** argv) {
  using S = float;  // the program trains in float
  dea::retain_freed_memory();  // reuse freed activations instead of faulting pages in every step
  const std::vector<std::string> args(argv + 1, argv + argc);
  train::TrainConfig given;
  std::string plot_dir, dump_pairs;
  bool no_plots = false, overwrite = false;
  cli::FlagSet fs("dea train [flags]",
                  "Trains the Dual-Expert encoder as the reference's train.py does, into --out_dir (checkpoint,\n"
                  "config.json, tokenizer.txt, train_log.jsonl, plots); ends with the Paris probe. With --model\n"
                  "dea_bert --hf_model DIR it fine-tunes the reference's DualExpertBert from a local Hugging Face\n"
                  "BERT directory instead (defaults lr_main 2e-5, batch_size 32, max_len 64; sizes, dropout and\n"
                  "WordPiece vocabulary from DIR; the run directory holds bert_config.json and vocab.txt). With\n"
                  "--model lm --data_source text --text FILE it trains the byte-level decoder language model\n"
                  "(--attention, --mlp, --shared_expert, --kv_heads, --experts, --top_k; last 5% of the bytes\n"
                  "validate, NLL and perplexity); dea generate decodes from its checkpoint.");
  train::add_config_flags(fs, given);
  fs.text("plot_dir", plot_dir, "DIR", "where the plots go (default: --out_dir)");
  fs.toggle("no-plots", no_plots, "write no plots");
  fs.toggle("overwrite", overwrite, "a fresh run replaces the run in --out_dir (its files are deleted first)");
  fs.text("dump_pairs", dump_pairs, "FILE",
          "write the distinct (q_text, k_text) pairs of the run's D_alpha data to FILE (JSONL, the input of dea "
          "oracle) and exit without training");
  auto bad_line = [&](const std::string& why) {
    fmt::print(stderr, "dea train: {}\n(dea train --help lists the flags)\n", why);
    return 2;
  };
  cli::FlagSet::Parsed p;
  try {
    p = fs.parse(args);
  } catch (const std::exception& e) {
    return bad_line(e.what());
  }
  if (p.help) {
    fmt::print("{}", fs.help());
    return 0;
  }
  if (given.quick) train::apply_quick_preset(given, p.flags);
  if (given.resume && overwrite) return bad_line("--resume and --overwrite contradict each other (continue the run, or replace it)");
  std::optional<train::ValidConfig> cfg;
  if (given.resume) {
    std::optional<train::ValidConfig> saved;
    try {  // the saved configuration: a bad file is bad input (1), not a bad command line (2)
      saved = train::read_config(train::config_path(given.out_dir));
    } catch (const std::exception& e) {
      fmt::print(stderr, "dea train: --resume: {}\n", e.what());
      return 1;
    }
    try {
      cfg = train::resume_config(*saved, given, p.flags);
    } catch (const std::exception& e) {
      return bad_line(e.what());
    }
  } else {
    try {
      // --model lm: the flags that do not apply are named before any other check of their values
      if (given.model == "lm") train::check_flag_scope(given, p.flags);
      // --model dea_bert: the encoder's flags refused, the reference's hf defaults, DIR's config.json read
      const train::ValidConfig checked = given.model == "dea_bert" ? train::dea_bert::fresh_config(given, p.flags)
                                                                   : given;  // validated here, once
      if (dump_pairs.empty()) train::check_fresh_run_dir(given.out_dir, overwrite);  // (a dump writes no run)
      cfg = checked.with_absolute_paths();
    } catch (const std::exception& e) {
      return bad_line(e.what());
    }
  }
  try {
    train::check_flag_scope(*cfg, p.flags);
  } catch (const std::exception& e) {
    return bad_line(e.what());
  }
  const train::TrainConfig& c = *cfg;
  if (c.model == "lm") {
    if (!dump_pairs.empty()) return bad_line("--dump_pairs does not apply to --model lm (it has no D_alpha pairs)");
    if (!plot_dir.empty()) return bad_line("--plot_dir does not apply to --model lm (its run writes no plots)");
    return train_cmd::run_lm(*cfg, overwrite);
  }
  if (!dump_pairs.empty()) {
    if (c.data_source != "dalpha")
      return bad_line("--dump_pairs: --data_source " + c.data_source + " has no (q_text, k_text) pairs");
    try {
      const std::vector<data::Record> records = train::encoder::dalpha_records(*cfg, &std::cout);
      const auto pairs = train::encoder::record_pairs(records);
      io::write_pairs(dump_pairs, pairs);
      fmt::print("wrote {} distinct (q_text, k_text) pairs of {} D_alpha records to {}\n", pairs.size(), records.size(),
                 dump_pairs);
    } catch (const std::exception& e) {
      fmt::print(stderr, "dea train: --dump_pairs: {}\n", e.what());
      return 2;
    }
    return 0;
  }
  // the data first: a file the command line names that cannot be used is a bad command line (2), not a failure of
  // the run (1); a resumed run's data comes from its directory (config.json, tokenizer.txt), a bad one is 1
  std::optional<train::encoder::RunData> data;
  try {
    data.emplace(train::encoder::build_run_data(*cfg, &std::cout));
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "dea train: out of memory building the data (--n_per_source {})\n", c.n_per_source);
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dea train: {}{}\n", c.resume ? "--resume: " : "", e.what());
    return c.resume ? 1 : 2;
  }
  if (c.model == "dea_bert")
    return train_cmd::run_dea_bert(*cfg, *data, overwrite,
                                   no_plots ? std::string() : plot_dir.empty() ? c.out_dir : plot_dir);
  try {
    train::encoder::TrainOptions<S> opts;
    opts.data = &*data;
    opts.overwrite = overwrite;
    if (!no_plots) opts.plot_dir = plot_dir.empty() ? c.out_dir : plot_dir;
    opts.on_finish = [](nn::TransformerModel<S>& model, const train::encoder::RunData& d) {
      dea_cli::print_paris_probe(dea_cli::paris_probe(model, d.tok));
    };
    const train::encoder::TrainResult r = train::encoder::run_training<S>(*cfg, opts);
    if (r.last_eval) fmt::print("final val: {}\n", train::encoder::to_json(*r.last_eval).dump());
    fmt::print("checkpoint: {}\n", train::checkpoint_path(c.out_dir));
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "dea train: out of memory (--d_model {} --d_ff {} --n_layers {} --batch_size {} --max_len {} "
                       "--n_per_source {}): choose smaller sizes\n",
               c.d_model, c.d_ff, c.n_layers, c.batch_size, c.max_len, c.n_per_source);
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dea train: {}\n", e.what());
    return 1;
  }
  return 0;
}
