// dea train: the reference's train.py (docs/training.md): the Dual-Expert encoder on D_alpha (or masked-LM on a local
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
//
// Data parallel (docs/scale.md): `mpirun -np R dea train ... --micro_batches M` (a program built with MPI,
// DEA_WITH_MPI) trains on R ranks, rank r computing micro-batches [r M/R, (r+1) M/R) of every step, with the same
// bits for every R dividing M. Every rank parses the same command line and builds the same data; the phases (command
// line, data, each step) end with an exchange of every rank's status, so that a failure on one rank stops every rank
// with one message, printed by rank 0 (and naming the rank). Rank 0 alone prints and writes the run directory.
#include "commands.hpp"
#include "paris_probe.hpp"

#include <dea/core/allocator.hpp>
#include <dea/dist/comm.hpp>
#include <dea/io/jsonl.hpp>
#include <dea/train/config.hpp>
#include <dea/train/dea_bert.hpp>
#include <dea/train/encoder.hpp>
#include <dea/cli/flags.hpp>
#include <dea/train/lm.hpp>
#if defined(DEA_WITH_MPI)
#include <dea/dist/mpi_comm.hpp>
#endif

#include <fmt/core.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

using namespace dea;

namespace train_cmd {

/// The ranks of the run (MPI when started by mpirun in a program built with it; else none: one process).
std::unique_ptr<dist::Comm> make_comm() {
#if defined(DEA_WITH_MPI)
  if (dist::launched_by_mpirun()) return std::make_unique<dist::MpiComm>();
#endif
  return nullptr;
}

/// Where the program's messages go. One process: printed as they come. Several ranks: rank 0 prints; a failure is
/// exchanged (Comm::agree) at the end of its phase, so that every rank stops with the failing rank's message, which
/// rank 0 prints once.
class Console {
public:
  explicit Console(dist::Comm* comm) : comm_(comm) {}
  bool ranked() const { return comm_ != nullptr && comm_->size() > 1; }
  bool root() const { return comm_ == nullptr || comm_->rank() == 0; }
  dist::Comm* comm() const { return comm_; }

  /// This rank fails its phase with exit status `status` and the text `err` ("dea train: ...\n"); returns the status
  /// every rank returns.
  int fail(int status, const std::string& err) {
    if (!ranked()) {
      fmt::print(stderr, "{}", err);
      return status;
    }
    return settle(status, err);
  }
  /// The end of a phase on a rank that did not fail: 0, or the status of a rank that failed (its message printed by
  /// rank 0).
  int settle() { return ranked() ? settle(0, std::string()) : 0; }

  /// A training run threw `e`: printed as `err` (one process); with several ranks the error came through an
  /// exchange (every rank has it: rank 0 prints it) or, else, is this rank's alone (printed with the rank, and the
  /// job aborted so that no rank waits for it).
  int run_failed(int status, const std::exception& e, const std::string& err) {
    if (!ranked()) {
      fmt::print(stderr, "{}", err);
      return status;
    }
    const bool shared = dynamic_cast<const dist::RankFailed*>(&e) != nullptr ||
                        dynamic_cast<const train::NonFiniteError*>(&e) != nullptr;
    if (shared) {
      if (root()) fmt::print(stderr, "{}", err);
      return status;
    }
    fmt::print(stderr, "{}", with_rank(err));
    std::fflush(stderr);
    comm_->abort(status);
    return status;  // (abort does not return)
  }

private:
  int settle(int status, const std::string& err) {
    const dist::Agreement a = comm_->agree(status, status ? with_rank(err) : std::string());
    if (a.ok) return 0;
    if (root()) fmt::print(stderr, "{}", a.message);
    return a.status;
  }
  /// "dea train: rank r of R: ..." on rank r > 0.
  std::string with_rank(const std::string& err) const {
    if (comm_->rank() == 0) return err;
    const std::string head = "dea train: ";
    const std::string tag = fmt::format("rank {} of {}: ", comm_->rank(), comm_->size());
    if (err.compare(0, head.size(), head) != 0) return tag + err;
    return head + tag + without_error_prefix(err.substr(head.size()));  // (the library's prefix, after the program's)
  }
  dist::Comm* comm_;
};

/// The program's debug option DEA_INJECT_NONFINITE_LOSS=STEP:MICRO (docs/training.md): the trainer's loss fault
/// that makes the loss of micro-batch MICRO (0 without --micro_batches) at step STEP NaN on whichever rank computes
/// it, to rehearse a non-finite stop end to end. None when the variable is unset; a malformed value stops the run at
/// its first step with a message naming the variable.
train::LossFault injected_fault() {
  static const char* const kName = "DEA_INJECT_NONFINITE_LOSS";
  if (!std::getenv(kName)) return nullptr;
  return [](double loss, std::int64_t step, std::int64_t micro) {
    static const train::InjectedFault f = train::parse_injected_fault(kName, std::getenv(kName));
    return f.step == step && f.micro == micro ? std::nan("") : loss;
  };
}

/// The dea_bert part of dea train, once the configuration and the data are checked: the pretrained directory of a
/// fresh run is loaded and validated (a bad one is 2, nothing written), then the run.
int run_dea_bert(Console& con, const train::ValidConfig& cfg, const train::encoder::RunData& data, bool overwrite,
                 const std::string& plot_dir) {
  using S = float;
  namespace db = train::dea_bert;
  std::optional<db::Pretrained<S>> pre;
  if (!cfg->resume) {
    try {
      pre.emplace(db::load_pretrained<S>(cfg->hf_model));
      db::check_vocab(data.tok, pre->files.config, "--hf_model '" + cfg->hf_model + "'");
      if (con.root()) fmt::print("[model] {}\n", pre->report.str());
    } catch (const std::bad_alloc&) {
      return con.fail(1, fmt::format("dea train: out of memory loading --hf_model '{}'\n", cfg->hf_model));
    } catch (const std::exception& e) {
      return con.fail(2, cli::message("dea train", "--hf_model: " + without_error_prefix(e.what())));
    }
  }
  if (const int st = con.settle()) return st;
  try {
    db::TrainOptions<S> opts;
    opts.data = &data;
    opts.overwrite = overwrite;
    opts.plot_dir = plot_dir;
    opts.comm = con.comm();
    opts.fault = injected_fault();
    if (con.root())
      opts.on_finish = [](bert::DualExpertBert<S>& model, const train::encoder::RunData& d) {
        dea_cli::print_paris_probe(dea_cli::paris_probe(model, d.tok));
      };
    const train::encoder::TrainResult r = db::run_training<S>(cfg, opts, pre ? &*pre : nullptr);
    if (con.root()) {
      if (r.last_eval) fmt::print("final val: {}\n", train::encoder::to_json(*r.last_eval).dump());
      fmt::print("checkpoint: {}\n", train::checkpoint_path(cfg->out_dir));
    }
  } catch (const std::bad_alloc& e) {
    return con.run_failed(1, e, fmt::format("dea train: out of memory (the model of --hf_model, --batch_size {} "
                                            "--max_len {} --n_per_source {}): choose smaller sizes\n",
                                            cfg->batch_size, cfg->max_len, cfg->n_per_source));
  } catch (const std::exception& e) {
    return con.run_failed(1, e, fmt::format("dea train: {}\n", without_error_prefix(e.what())));
  }
  return 0;
}

/// The --model lm part of dea train (train/lm.hpp), once the configuration is checked: the corpus (a file of the
/// command line that cannot be used is 2, a resumed run's is 1), then the run.
int run_lm(Console& con, const train::ValidConfig& cfg, bool overwrite) {
  using S = float;
  namespace lr = train::lm_run;
  std::optional<lr::LmData> data;
  try {
    if (cfg->resume)
      check(std::filesystem::exists(train::checkpoint_path(cfg->out_dir)), "no checkpoint at ",
            train::checkpoint_path(cfg->out_dir));
    data.emplace(lr::build_data(cfg));
  } catch (const std::bad_alloc&) {
    return con.fail(1, fmt::format("dea train: out of memory reading --text '{}'\n", cfg->text));
  } catch (const std::exception& e) {
    return con.fail(cfg->resume ? 1 : 2,
                    cli::message("dea train", (cfg->resume ? "--resume: " : "") + without_error_prefix(e.what())));
  }
  if (const int st = con.settle()) return st;
  try {
    lr::TrainOptions opts;
    opts.data = &*data;
    opts.overwrite = overwrite;
    opts.comm = con.comm();
    opts.fault = injected_fault();
    const lr::TrainResult r = lr::run_training<S>(cfg, opts);
    if (con.root()) {
      if (r.last_eval) fmt::print("final val: {}\n", lr::to_json(*r.last_eval).dump());
      fmt::print("checkpoint: {}\n", train::checkpoint_path(cfg->out_dir));
    }
  } catch (const std::bad_alloc& e) {
    return con.run_failed(1, e, fmt::format("dea train: out of memory (--d_model {} --d_ff {} --n_layers {} "
                                            "--batch_size {} --max_len {}): choose smaller sizes\n",
                                            cfg->d_model, cfg->d_ff, cfg->n_layers, cfg->batch_size, cfg->max_len));
  } catch (const std::exception& e) {
    return con.run_failed(1, e, fmt::format("dea train: {}\n", without_error_prefix(e.what())));
  }
  return 0;
}

}  // namespace train_cmd

int dea_train(int argc, char** argv) {
  using S = float;  // the program trains in float
  dea::retain_freed_memory();  // reuse freed activations instead of faulting pages in every step
  const std::vector<std::string> args(argv + 1, argv + argc);
#if !defined(DEA_WITH_MPI)
  if (dist::launcher_world_size() > 1) {
    fmt::print(stderr, "dea train: started by mpirun with {} processes, but this dea was built without MPI "
                       "(DEA_WITH_MPI: install libopenmpi-dev and build again); each would train alone\n",
               dist::launcher_world_size());
    return 2;
  }
#endif
  const std::unique_ptr<dist::Comm> comm = train_cmd::make_comm();
  train_cmd::Console con(comm.get());
  train::TrainConfig given;
  std::string plot_dir, dump_pairs;
  bool no_plots = false, overwrite = false;
  cli::FlagSet fs("dea train [flags]",
                  "Trains the Dual-Expert encoder as the reference's train.py does, into --out_dir (checkpoint,\n"
                  "config.json, tokenizer.txt, train_log.jsonl, plots); ends with the Paris probe. With --model\n"
                  "dea_bert --hf_model DIR it fine-tunes the reference's DualExpertBert from a local Hugging Face\n"
                  "BERT directory instead (defaults lr_main 2e-5, batch_size 32, max_len 64; sizes, dropout and\n"
                  "WordPiece vocabulary from DIR; the run directory holds bert_config.json and vocab.txt). With\n"
                  "--model lm --text FILE it trains the byte-level decoder language model\n"
                  "(--attention, --mlp, --shared_expert, --kv_heads, --experts, --top_k; last 5% of the bytes\n"
                  "validate, NLL and perplexity); dea generate decodes from its checkpoint.\n"
                  "Data parallel: mpirun -np R dea train ... --micro_batches M (M a multiple of R) trains on R\n"
                  "ranks with the bits of one process (docs/scale.md).");
  fs.exit_status("0 done, 1 error (a bad run directory or resumed data, failed isolation check, non-finite loss), "
                 "2 bad command line or an unusable data file");
  train::add_config_flags(fs, given);
  fs.text("plot_dir", plot_dir, "DIR", "where the plots go (default: --out_dir)");
  fs.toggle("no-plots", no_plots, "write no plots");
  fs.toggle("overwrite", overwrite, "a fresh run replaces the run in --out_dir (its files are deleted first)");
  fs.text("dump_pairs", dump_pairs, "FILE",
          "write the distinct (q_text, k_text) pairs of the run's D_alpha data to FILE (JSONL, the input of dea "
          "oracle) and exit without training");
  auto bad_line = [&](const std::string& why) {
    return con.fail(2, cli::message("dea train", why) + "(dea train --help lists the flags)\n");
  };
  cli::FlagSet::Parsed p;
  try {
    p = fs.parse(args);
  } catch (const std::exception& e) {
    return bad_line(e.what());
  }
  if (p.help) {
    if (con.root()) fmt::print("{}", fs.help());
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
      return con.fail(1, cli::message("dea train", "--resume: " + without_error_prefix(e.what())));
    }
    try {
      cfg = train::resume_config(*saved, given, p.flags);
    } catch (const std::exception& e) {
      return bad_line(e.what());
    }
  } else {
    try {
      // what the given flags imply (--text FILE: --data_source text, ...), then, for --model lm, the flags that do
      // not apply, named before any other check of their values
      train::apply_implications(given, p.flags);
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
  if (comm && c.micro_batches % comm->size() != 0)
    return bad_line(fmt::format("--micro_batches {}: must be a multiple of the {} ranks of mpirun -np (each rank "
                                "computes micro_batches / ranks micro-batches of every step)",
                                c.micro_batches, comm->size()));
  if (c.model == "lm") {
    if (!dump_pairs.empty()) return bad_line("--dump_pairs does not apply to --model lm (it has no D_alpha pairs)");
    if (!plot_dir.empty()) return bad_line("--plot_dir does not apply to --model lm (its run writes no plots)");
    if (const int st = con.settle()) return st;
    return train_cmd::run_lm(con, *cfg, overwrite);
  }
  if (!dump_pairs.empty()) {
    if (con.ranked()) return bad_line("--dump_pairs writes a file and trains nothing: run it without mpirun");
    if (c.data_source != "dalpha")
      return bad_line("--dump_pairs: --data_source " + c.data_source + " has no (q_text, k_text) pairs");
    try {
      const std::vector<data::Record> records = train::encoder::dalpha_records(*cfg, &std::cout);
      const auto pairs = train::encoder::record_pairs(records);
      io::write_pairs(dump_pairs, pairs);
      fmt::print("wrote {} distinct (q_text, k_text) pairs of {} D_alpha records to {}\n", pairs.size(), records.size(),
                 dump_pairs);
    } catch (const std::exception& e) {
      fmt::print(stderr, "{}", cli::message("dea train", "--dump_pairs: " + without_error_prefix(e.what())));
      return 2;
    }
    return 0;
  }
  if (const int st = con.settle()) return st;
  // the data first: a file the command line names that cannot be used is a bad command line (2), not a failure of
  // the run (1); a resumed run's data comes from its directory (config.json, tokenizer.txt), a bad one is 1
  std::optional<train::encoder::RunData> data;
  try {
    data.emplace(train::encoder::build_run_data(*cfg, con.root() ? &std::cout : nullptr));
  } catch (const std::bad_alloc&) {
    return con.fail(1, fmt::format("dea train: out of memory building the data (--n_per_source {})\n", c.n_per_source));
  } catch (const std::exception& e) {
    return con.fail(c.resume ? 1 : 2,
                    cli::message("dea train", (c.resume ? "--resume: " : "") + without_error_prefix(e.what())));
  }
  if (c.model == "dea_bert")
    return train_cmd::run_dea_bert(con, *cfg, *data, overwrite,
                                   no_plots ? std::string() : plot_dir.empty() ? c.out_dir : plot_dir);
  if (const int st = con.settle()) return st;
  try {
    train::encoder::TrainOptions<S> opts;
    opts.data = &*data;
    opts.overwrite = overwrite;
    opts.comm = con.comm();
    opts.fault = train_cmd::injected_fault();
    if (!no_plots) opts.plot_dir = plot_dir.empty() ? c.out_dir : plot_dir;
    if (con.root())
      opts.on_finish = [](nn::TransformerModel<S>& model, const train::encoder::RunData& d) {
        dea_cli::print_paris_probe(dea_cli::paris_probe(model, d.tok));
      };
    const train::encoder::TrainResult r = train::encoder::run_training<S>(*cfg, opts);
    if (con.root()) {
      if (r.last_eval) fmt::print("final val: {}\n", train::encoder::to_json(*r.last_eval).dump());
      fmt::print("checkpoint: {}\n", train::checkpoint_path(c.out_dir));
    }
  } catch (const std::bad_alloc& e) {
    return con.run_failed(1, e, fmt::format("dea train: out of memory (--d_model {} --d_ff {} --n_layers {} "
                                            "--batch_size {} --max_len {} --n_per_source {}): choose smaller sizes\n",
                                            c.d_model, c.d_ff, c.n_layers, c.batch_size, c.max_len, c.n_per_source));
  } catch (const std::exception& e) {
    return con.run_failed(1, e, fmt::format("dea train: {}\n", without_error_prefix(e.what())));
  }
  return 0;
}
