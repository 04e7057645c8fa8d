// dea oracle: the oracle alpha of every pair of a pairs file, from two local Hugging Face model directories (an NLI
// cross-encoder, BERT-architecture or DeBERTa-v2/v3, and a BERT-architecture sentence embedder), written as an alpha
// cache (docs/bert.md, "The NLI oracle"; docs/deberta.md; the library side is include/dea/oracle/nli_oracle.hpp and
// oracle_run.hpp).
//
//   dea oracle --nli DIR --embedder DIR --pairs PAIRS.jsonl --out CACHE.jsonl [--calibrate LABELS.jsonl]
//              [--batch_size N] [--threads N] [--float | --double] [--precision fp32|bf16] [--nli_max_length N]
//              [--sim_max_length N] [--nli_tokenizer fast|slow] [--quiet]
//
// Input lines {"premise", "hypothesis"} or {"q_text", "k_text"}; output lines {the pair, "alpha", "alpha_raw", "phi",
// "sim"} in the input's order (oracle/files.hpp). An interrupted run continues when started again with the same
// flags (the recovery rule: oracle/run.hpp). Progress and ETA go to standard error.
// Exit status: 0 done, 1 the run failed while writing (the records on disk stay valid and a new run continues from
// them), 2 a bad command line, pairs or labels file, model directory, or an output file that does not continue this
// run; then nothing is written.
#include "commands.hpp"

#include <dea/oracle/nli_oracle.hpp>
#include <dea/oracle/run.hpp>
#include <dea/core/parallel.hpp>
#include <dea/oracle/files.hpp>
#include <dea/cli/flags.hpp>
#include <dea/train/trainer.hpp>

#include <fmt/core.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <system_error>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

using namespace dea;

// Named, not anonymous: the program's files are compiled as one translation unit (examples/CMakeLists.txt).
namespace oracle_cmd {

[[noreturn]] void usage(const std::string& why) {
  fmt::print(stderr, "{}(dea oracle --help lists the flags)\n", dea::cli::message("dea oracle", why));
  std::exit(2);
}

struct Settings {
  std::string nli, embedder, pairs, out, calibrate;
  std::size_t batch_size = 128, nli_max_length = 256, sim_max_length = 128;
  int threads = 0;
  bool use_double = false, quiet = false;
  std::string precision = "fp32";
  std::string nli_tokenizer;  ///< "" (not given: fast), "fast" or "slow"; DeBERTa cross-encoders only
};

bool stderr_is_tty() {
#if defined(__unix__) || defined(__APPLE__)
  return ::isatty(::fileno(stderr)) != 0;
#else
  return false;
#endif
}

/// Refuses an output path that is one of the input files, or whose directory does not exist.
void check_out_path(const Settings& s) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const std::string* in : {&s.pairs, &s.calibrate})
    if (!in->empty() && fs::exists(s.out, ec) && fs::equivalent(s.out, *in, ec))
      ::dea::detail::raise(::dea::detail::concat("--out '", s.out, "' is the input file '", *in, "' itself"));
  check(!fs::is_directory(s.out, ec), "--out '", s.out, "' is a directory");
  const fs::path dir = fs::path(s.out).parent_path();
  check(dir.empty() || fs::is_directory(dir, ec), "--out '", s.out, "': the directory '", dir.string(),
        "' does not exist");
}

template <class S>
int run(const Settings& s) {
  // ---- everything is read and checked before anything is written (exit 2 on a bad input)
  std::vector<io::OraclePair> pairs;
  std::vector<io::LabelledPair> labels;
  bert::OracleOptions opt;
  opt.nli_max_length = s.nli_max_length;
  opt.sim_max_length = s.sim_max_length;
  opt.precision = s.precision == "bf16" ? Precision::bf16 : Precision::fp32;
  opt.nli_tokenizer = s.nli_tokenizer == "slow" ? text::SpmMode::slow : text::SpmMode::fast;
  std::optional<bert::NliOracle<S>> oracle;
  bert::OracleResume resume;
  try {
    check_out_path(s);
    pairs = io::read_oracle_pairs(s.pairs);
    if (!s.calibrate.empty()) labels = io::read_oracle_labels(s.calibrate);
    oracle.emplace(bert::NliOracle<S>::load(s.nli, s.embedder, opt));
    if (!s.nli_tokenizer.empty() && !oracle->nli_is_deberta())
      ::dea::detail::raise(::dea::detail::concat("--nli_tokenizer ", s.nli_tokenizer, ": --nli '", s.nli,
                                                 "' is a BERT model, whose one tokenizer is its vocab.txt (the flag "
                                                 "chooses the mode of a DeBERTa model's spm.model)"));
    if (!s.quiet)
      fmt::print(stderr, "dea oracle: NLI model '{}' ({}; entailment: label {} \"{}\"), embedder '{}'; {} pairs, {}, {} "
                 "thread(s)\n", s.nli, oracle->nli_is_deberta() ? fmt::format("DeBERTa, {} tokenizer",
                 text::to_string(opt.nli_tokenizer)) : std::string("BERT"), oracle->entailment_index(),
                 oracle->entailment_label(), s.embedder, pairs.size(),
                 s.use_double ? "double" : s.precision == "bf16" ? "float, bf16 products" : "float", num_threads());
    if (!s.quiet)
      fmt::print(stderr, "dea oracle: model weights {:.1f} MiB{}\n", double(oracle->weight_bytes()) / (1024.0 * 1024.0),
                 s.precision != "bf16" ? "" : oracle->nli_is_deberta()
                     ? " (the embedder's product weights stored as bf16; the DeBERTa model's stay float)"
                     : " (the product weights stored as bf16)");
    if (!labels.empty()) {
      std::vector<bert::TextPair> lp;
      std::vector<double> human;
      for (const io::LabelledPair& l : labels) {
        lp.push_back({l.pair.premise, l.pair.hypothesis});
        human.push_back(l.alpha);
      }
      const eval::IsotonicRegression& iso = oracle->calibrate(lp, human);
      if (!s.quiet)
        fmt::print(stderr, "dea oracle: isotonic calibration on {} labels of '{}': {} thresholds, alpha_raw clipped to "
                   "[{:.6g}, {:.6g}], alpha from {:.6g} to {:.6g}\n", labels.size(), s.calibrate,
                   iso.x_thresholds().size(), iso.x_min(), iso.x_max(), iso.y_thresholds().front(),
                   iso.y_thresholds().back());
    }
    resume = bert::prepare_oracle_resume(*oracle, pairs, s.pairs, s.out);
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}", dea::cli::message("dea oracle", e));
    return 2;
  }
  if (!s.quiet && resume.exists) {
    std::string torn = resume.dropped_bytes ? fmt::format(", a torn last record of {} bytes dropped", resume.dropped_bytes)
                                            : std::string();
    if (resume.records == pairs.size())
      fmt::print(stderr, "dea oracle: '{}' already holds all {} records{}\n", s.out, pairs.size(), torn);
    else
      fmt::print(stderr, "dea oracle: resuming: '{}' holds the first {} records (verified){}; {} to go\n", s.out,
                 resume.records, torn, pairs.size() - resume.records);
  }

  // ---- the run (exit 1 on a failure: what is on disk stays a valid prefix that a new run continues)
  const bool tty = stderr_is_tty();
  auto last_print = std::chrono::steady_clock::now();
  bool line_open = false;
  bert::OracleRunOptions ro;
  ro.batch_size = s.batch_size;
  bert::OracleProgress done;
  try {
    done = bert::run_oracle(*oracle, pairs, s.out, resume, ro, [&](const bert::OracleProgress& p) {
      if (s.quiet) return;
      const auto now = std::chrono::steady_clock::now();
      const bool last = p.done == p.total;
      if (!tty && !last && std::chrono::duration<double>(now - last_print).count() < 10) return;
      last_print = now;
      const double rate = p.seconds > 0 ? static_cast<double>(p.done - p.resumed) / p.seconds : 0;
      const double eta = rate > 0 ? static_cast<double>(p.total - p.done) / rate : -1;
      fmt::print(stderr, "{}dea oracle: {}/{} pairs ({:.1f}%)  {:.1f} pairs/s  ETA {}{}", tty ? "\r" : "", p.done,
                 p.total, 100.0 * static_cast<double>(p.done) / static_cast<double>(p.total), rate,
                 train::format_duration(eta), tty && !last ? "   " : "\n");
      line_open = tty && !last;
    });
  } catch (const std::exception& e) {
    if (line_open) fmt::print(stderr, "\n");
    fmt::print(stderr, "dea oracle: {}\n(the records written so far are kept; run the same command again to go on)\n",
               without_error_prefix(e.what()));
    return 1;
  }
  fmt::print("dea oracle: {} records in '{}' ({} computed now, {} kept from before) in {:.1f} s\n", done.total, s.out,
             done.done - done.resumed, done.resumed, done.seconds);
  return 0;
}

}  // namespace oracle_cmd

int dea_oracle(int argc, char** argv) {
  oracle_cmd::Settings s;
  bool use_float = false;
  cli::FlagSet fs("dea oracle --nli DIR --embedder DIR --pairs PAIRS.jsonl --out CACHE.jsonl [flags]",
                  "The oracle alpha of every pair (the reference's precompute_oracle_alpha): phi = the entailment logit\n"
                  "of an NLI cross-encoder on [CLS] q [SEP] k [SEP] (premise = q_text, hypothesis = k_text), sim = the\n"
                  "cosine of a sentence embedder's mean-pooled embeddings of q and k, alpha_raw = sigmoid(phi - 0.3 sim),\n"
                  "alpha = clamp(alpha_raw, 0, 0.95) or its isotonic calibration. Both models are local Hugging Face\n"
                  "directories: the NLI model a BERT one (config.json, model.safetensors, vocab.txt) or a DeBERTa-v2/v3\n"
                  "one (config.json with model_type deberta-v2, model.safetensors, spm.model), the embedder a BERT one.\n"
                  "Input lines {\"premise\", \"hypothesis\"} or {\"q_text\", \"k_text\"}; output lines: the pair, alpha,\n"
                  "alpha_raw, phi, sim, in the input's order.\n"
                  "Records are appended batch by batch; run the same command again after an interruption and it goes\n"
                  "on from the records on disk (checked against the pairs and the models first).");
  fs.exit_status("0 done, 1 the run failed (what is on disk is kept), 2 bad flags or a bad file");
  // the required flags: no default shown
  auto required = [&fs](const char* name, std::string& field, const char* value_name, const char* help) {
    fs.custom(name, value_name, "", "", help, [&field](const std::string& flag, const std::string& v) {
      if (v.empty()) cli::bad_value(flag, v, "a non-empty path");
      field = v;
    });
  };
  required("nli", s.nli, "DIR", "the NLI cross-encoder's model directory (BertForSequenceClassification or "
           "DebertaV2ForSequenceClassification; required)");
  required("embedder", s.embedder, "DIR", "the sentence embedder's model directory (BertModel; required)");
  required("pairs", s.pairs, "PAIRS.jsonl", "the pairs, one JSON object per line (required)");
  required("out", s.out, "CACHE.jsonl", "the alpha cache to write or to continue (required)");
  fs.text("calibrate", s.calibrate, "LABELS.jsonl",
          "fit an isotonic calibration of alpha_raw on these human labels (pairs with \"alpha\" in [0, 1]) and apply it");
  fs.integer("batch_size", s.batch_size, 1, 1 << 16, "pairs per batch: scored over all threads, then appended");
  fs.integer("threads", s.threads, 0, cli::kMaxThreads, "OpenMP threads (0 = the library default: all cores)");
  fs.toggle("float", use_float, "compute in float, as the reference's float32 models (the default)");
  fs.toggle("double", s.use_double, "compute in double (the float64 forward the golden cases use)");
  fs.choice("precision", s.precision, {"fp32", "bf16"},
            "float only: bf16 runs the models' matrix products on bf16 operands with float accumulation");
  fs.integer("nli_max_length", s.nli_max_length, 3, 1 << 20, "tokens of [CLS] q [SEP] k [SEP] (longest_first truncation)");
  fs.integer("sim_max_length", s.sim_max_length, 2, 1 << 20, "tokens of [CLS] t [SEP] for the embedder");
  fs.custom("nli_tokenizer", "fast|slow", "fast", "", "a DeBERTa NLI model's tokenizer: fast is what the reference's "
            "AutoTokenizer runs, slow the sentencepiece library's own encoding (refused for a BERT model)",
            [&s](const std::string& flag, const std::string& v) {
              if (v != "fast" && v != "slow") cli::bad_value(flag, v, "fast or slow");
              s.nli_tokenizer = v;
            });
  fs.toggle("quiet", s.quiet, "no progress lines on standard error");
  try {
    const auto p = fs.parse(std::vector<std::string>(argv + 1, argv + argc));
    if (p.help) {
      fmt::print("{}", fs.help());
      return 0;
    }
    for (const auto& [flag, value] : {std::pair<const char*, const std::string*>{"nli", &s.nli},
                                      {"embedder", &s.embedder}, {"pairs", &s.pairs}, {"out", &s.out}})
      if (value->empty()) oracle_cmd::usage(fmt::format("--{} is required", flag));
    if (use_float && s.use_double) oracle_cmd::usage("--float and --double exclude each other");
    if (s.use_double && s.precision == "bf16") oracle_cmd::usage("--precision bf16 applies to float (not --double)");
  } catch (const std::exception& e) {
    oracle_cmd::usage(without_error_prefix(e.what()));
  }
  if (s.threads > 0) set_num_threads(s.threads);
  return s.use_double ? oracle_cmd::run<double>(s) : oracle_cmd::run<float>(s);
}
