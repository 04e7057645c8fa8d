// dea/train/config.hpp: the run configuration of training (the reference's train.py flags): the options every run has
// and those of each family (encoder, dea_bert, lm) with their defaults, the --quick preset, the flag table
// (config_flags(): each flag declared once, with its range or choices, help, resume rule and implications), the one
// validate(), JSON (config.json) and the rule for what a resumed run may change.
//
// A configuration is checked once, where it enters: ValidConfig runs validate() when it is built (from the command
// line or from code), read_config() when it reads a file; the trainer and the data take a ValidConfig.
#pragma once

#include "../core/error.hpp"
#include "../core/files.hpp"
#include "../core/parallel.hpp"
#include "../core/tensor.hpp"
#include "../io/json_limits.hpp"
#include "../cli/flags.hpp"
#include "../dist/reducer.hpp"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

namespace dea::train {

/// The options every run has, whatever it trains (the reference's train.py defaults; model sizes from its CONFIG).
/// With --model dea_bert the size fields (d_model, n_heads, n_layers, d_ff) are recorded from hf_model's config.json.
struct RunOptions {
  /// encoder (the Dual-Expert encoder, nn::TransformerModel) | dea_bert (DualExpertBert fine-tuned from the Hugging
  /// Face BERT directory hf_model; train/dea_bert.hpp) | lm (the byte-level decoder language model; train/lm.hpp)
  std::string model = "encoder";
  Index d_model = 512;
  Index n_heads = 8;
  Index n_layers = 6;
  Index d_ff = 2048;
  Index max_len = 64;
  Index batch_size = 128;
  double lr_main = 3e-4;
  double weight_decay = 0.01;
  double grad_clip = 1.0;
  std::int64_t steps = 12000;
  std::int64_t log_every = 50;
  std::int64_t eval_every = 1000;
  std::uint64_t seed = 42;
  std::string out_dir = "runs/dea";
  std::string data_source = "dalpha";  ///< dalpha | text
  std::string text;                    ///< corpus file for data_source text
  int threads = 0;                     ///< 0 = library default
  bool resume = false;
  std::int64_t eval_batches = 50;      ///< at most this many validation batches per periodic evaluation
  /// Micro-batches per step (a power of two dividing batch_size): each one's gradient is computed alone and the M
  /// gradients are summed in a fixed binary tree (dist/tree_sum.hpp), so that the step gives the same bits on any
  /// number of ranks dividing M (`mpirun -np R dea train`). 1 = the whole batch at once.
  std::int64_t micro_batches = 1;
  /// allgather | reduce_scatter: how the ranks exchange their gradients (dist/reducer.hpp; the same bits either
  /// way). reduce_scatter cuts the gradient into buckets of about bucket_mb MB (10^6 bytes), exchanged while
  /// backward runs.
  std::string exchange = "reduce_scatter";
  double bucket_mb = 4;
  /// fp32 | bf16: the precision of the matrix products of training and of its evaluations (mixed precision: bf16
  /// operands with fp32 accumulation; the gate, normalisations, softmax, losses, gradients and AdamW's master
  /// weights and state stay fp32). Recorded in config.json and in the checkpoint; a resumed run keeps it.
  std::string precision = "fp32";
  /// The fingerprint of the run's data (a data::Fingerprint of its records or sentences, 16 hex digits), recorded in
  /// config.json when a run starts; a run rebuilt from config.json must find the same data. Empty: not recorded
  /// (a configuration from code, or a run imported from the reference). Not a flag.
  std::string data_hash;
};

/// The options of the Dual-Expert families (the encoder, and DualExpertBert on the same data): the gate, the oracle,
/// D_alpha and its files, the word tokenizers, the text corpus's mock oracle.
struct EncoderOptions {
  bool quick = false;
  double dropout = 0.1;
  double lr_gate = 1e-3;
  std::int64_t gamma_steps = 10000;
  std::string oracle = "mock";           ///< mock | path of an alpha cache (.jsonl)
  std::string oracle_fallback = "none";  ///< none | mock: the alpha of a record the cache lacks (mock) or an error
  std::int64_t n_per_source = 2000;
  std::optional<std::vector<Index>> supervise_layers;  ///< nullopt = all layers
  // D_alpha from local copies of the real data sets (dalpha_source files)
  std::string dalpha_source = "synthetic";  ///< synthetic | files
  std::string babi;                    ///< a bAbI directory (its qa16 / qa17 / qa18 *_train.txt files) or one task file
  std::string clutrr;                  ///< a CLUTRR CSV file
  std::string conceptnet;              ///< a ConceptNet assertion dump (uncompressed)
  std::string capitals;                ///< a capitals list (capital<TAB>country lines)
  bool synthetic_fallback = false;     ///< a source without its file uses its synthetic generator (else an error)
  // tokenizer and text data
  std::string tokenizer = "simple";    ///< simple (the reference's SimpleTokenizer) | wordpiece (BERT's, needs vocab)
  std::string vocab;                   ///< vocab.txt of tokenizer wordpiece
  std::string text_alpha = "mock";     ///< mock | none: the oracle of data_source text (the reference's wiki_alpha)
  std::int64_t n_docs = 0;             ///< data_source text: only the first n_docs lines (documents); 0 = all
  bool no_isolation_check = false;     ///< skip the gradient-isolation check of the first batch
};

/// The options of --model dea_bert: the pretrained directory (its sizes, dropout and tokenizer come from it).
struct BertOptions {
  std::string hf_model;  ///< the Hugging Face model directory (config.json, model.safetensors, vocab.txt)
};

/// The options of --model lm (the decoder-only byte-level language model, train/lm.hpp).
struct LmOptions {
  std::string attention = "gqa";       ///< mha | gqa | tr_mha | tr_mha_v2 | dea
  std::string mlp = "swiglu";          ///< swiglu (dense) | tr_moe (the TR-MoE MLP)
  bool shared_expert = false;          ///< mlp tr_moe: add the shared expert
  Index kv_heads = 0;                  ///< attention gqa: KV heads (0 = max(1, n_heads / 4))
  Index experts = 4;                   ///< mlp tr_moe: E (1, 2, 4, 8 or 16)
  Index top_k = 1;                     ///< mlp tr_moe: k (1, 2 or 4, at most E)
  Index shared_d_ff = 0;               ///< mlp tr_moe, shared_expert: the shared expert's width (0 = d_ff)
  std::string routing = "modulo_cyclic";  ///< mlp tr_moe: modulo_cyclic | balanced_hash (token_id_balanced_hash)
  double label_smoothing = 0.0;        ///< label smoothing of the training loss (evaluation NLL is plain)
  std::string lr_schedule = "constant";  ///< constant | cosine (linear warmup, cosine decay to 10% of lr_main)
  std::int64_t warmup_steps = 0;       ///< linear warmup steps of either schedule
};

/// Every option of dea train: the run's and each family's (a field is `cfg.name` whatever struct holds it). The
/// flags are declared once, in config_flags().
struct TrainConfig : RunOptions, EncoderOptions, BertOptions, LmOptions {};

/// The --quick preset of the reference (applied to every field not given explicitly).
inline void apply_quick_preset(TrainConfig& c, const std::set<std::string>& explicit_flags) {
  auto set = [&](const char* flag, auto& field, auto value) {
    if (!explicit_flags.count(flag)) field = value;
  };
  set("d_model", c.d_model, Index(128));
  set("n_heads", c.n_heads, Index(4));
  set("n_layers", c.n_layers, Index(2));
  set("d_ff", c.d_ff, Index(256));
  set("batch_size", c.batch_size, Index(32));
  set("steps", c.steps, std::int64_t(300));
  set("gamma_steps", c.gamma_steps, std::int64_t(200));
  set("eval_every", c.eval_every, std::int64_t(150));
  set("log_every", c.log_every, std::int64_t(25));
  set("n_per_source", c.n_per_source, std::int64_t(500));
  set("n_docs", c.n_docs, std::int64_t(200));
}

namespace detail {

/// The machine's physical memory in GB (0 where it cannot be read).
inline double physical_memory_gb() {
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGE_SIZE)
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) return double(pages) * double(page) / 1e9;
#endif
  return 0;
}

inline std::vector<Index> parse_layer_list(const std::string& flag, const std::string& v) {
  std::vector<Index> out;
  // |index| <= 1024 and at most 1024 entries: what config.json may hold (ConfigLimits::max_layers)
  const char* expected = "'all' or a comma-separated list of at most 1024 layer indices in [-1024, 1024]";
  const std::vector<std::string> items = cli::split(v, ',');
  if (items.size() > 1024) cli::bad_value(flag, v, expected);
  for (const std::string& item : items) {
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || !end || *end || errno == ERANGE || x < -1024 || x > 1024) cli::bad_value(flag, v, expected);
    out.push_back(static_cast<Index>(x));
  }
  return out;
}

/// Why a value of the reference's train.py that dea cannot rebuild is refused (config.json of a run imported from
/// the reference may hold one): the text after "--flag 'value': ".
inline std::string reference_value_hint(const std::string& flag, const std::string& v) {
  if (flag == "data_source" && v == "wikipedia")
    return "the reference's Wikipedia stream cannot be rebuilt here (a local corpus trains with --data_source text "
           "--text FILE)";
  if (flag == "data_source" && v == "hf")
    return "the reference's DualExpertBert fine-tuning is not a data source of this program: it is --model dea_bert "
           "--hf_model DIR (a local Hugging Face BERT directory) on --data_source dalpha";
  if (flag == "dalpha_source")
    return "the reference's Hugging Face downloads (each source silently replaced by its synthetic generator when "
           "a download failed) cannot be rebuilt here; local copies of the data sets train with --dalpha_source files "
           "--babi DIR --clutrr FILE --conceptnet FILE --capitals FILE";
  if (flag == "tokenizer")
    return "a Hugging Face tokenizer by name cannot be rebuilt here; the tokenizers are 'simple' and 'wordpiece' "
           "(with --vocab FILE, e.g. that model's vocab.txt). A reference run whose tokenizer fell back to its "
           "SimpleTokenizer (its tokenizer.txt starts with [PAD] [UNK] [CLS] [SEP] [MASK]) is 'simple'";
  if (flag == "oracle" && v == "deberta")
    return "the reference's NLI oracle, computed during its run, cannot be rebuilt here; the alpha cache it wrote "
           "trains with --oracle FILE.jsonl";
  return {};
}

/// Runs f(); a dea::Error it throws is thrown again with `context` before its message (the file a flag named).
template <class F>
auto with_context(const std::string& context, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    const std::string m = without_error_prefix(e.what());
    if (m.find(context) != std::string::npos) throw;  // the message names the file already
    ::dea::detail::raise(context + m);
  }
}

}  // namespace detail

/// Largest values accepted for the size flags: far beyond any model this CPU library trains, small enough that a
/// corrupt or hostile config.json cannot make the programs try to allocate terabytes.
struct ConfigLimits {
  static constexpr Index max_d_model = Index(1) << 16;
  static constexpr Index max_d_ff = Index(1) << 20;
  static constexpr Index max_layers = 1024;
  static constexpr Index max_len = Index(1) << 16;
  static constexpr Index max_batch = Index(1) << 20;
  static constexpr std::int64_t max_n_per_source = 1000000;  // 5 sources x 2 (negatives): 10 million pairs
  static constexpr int max_threads = static_cast<int>(cli::kMaxThreads);
};

/// The flags of dea train, each declared once: its name, its default (TrainConfig's initialiser), its range or choices,
/// its help, whether a resumed run may change it and what giving it implies. Parsing and the help
/// (add_config_flags), the ranges and choices of validate(), the resume rule (resumable_flags, resume_config) and the
/// implied values (apply_implications) all come from here.
inline const cli::FlagTable<TrainConfig>& config_flags() {
  using cli::Choices;
  using cli::Empty;
  using cli::IntRange;
  using cli::Range;
  using C = TrainConfig;
  static const cli::FlagTable<C> t = [] {
    cli::FlagTable<C> f;
    f.set_value_hint(detail::reference_value_hint);
    // every run
    f.choice("model", &C::model, {"encoder", "dea_bert", "lm"},
             "the Dual-Expert encoder (sizes from the flags below), DualExpertBert fine-tuned from --hf_model "
             "(sizes, tokenizer and weights from the directory; the reference's hf defaults: lr_main 2e-5, "
             "batch_size 32, max_len 64), or the byte-level decoder language model (lm, on a text corpus)")
        .implies_when("lm", "data_source", "text");
    f.text("hf_model", &C::hf_model, "DIR",
           "--model dea_bert: a Hugging Face BERT directory (config.json, model.safetensors, vocab.txt)",
           Empty::refused, "a directory path")
        .implies("model", "dea_bert");
    f.toggle("quick", &C::quick,
             "the reference's quick preset: D=128 H=4 2 layers d_ff 256 batch 32, 300 steps, gamma_steps 200, "
             "eval_every 150, log_every 25, n_per_source 500 (flags given explicitly win)");
    f.integer("d_model", &C::d_model, IntRange::closed(1, ConfigLimits::max_d_model),
              "model width (a multiple of --n_heads)");
    f.integer("n_heads", &C::n_heads, IntRange::closed(1, ConfigLimits::max_d_model), "attention heads");
    f.integer("n_layers", &C::n_layers, IntRange::closed(0, ConfigLimits::max_layers), "layers");
    f.integer("d_ff", &C::d_ff, IntRange::closed(1, ConfigLimits::max_d_ff), "feed-forward width");
    f.real("dropout", &C::dropout, Range::closed_open(0, 1), "dropout probability", "P");
    f.integer("max_len", &C::max_len, IntRange::closed(3, ConfigLimits::max_len),
              "longest sequence in tokens (--model dea_bert: 64 unless given, at most the max_position_embeddings "
              "of --hf_model)");
    f.integer("batch_size", &C::batch_size, IntRange::closed(1, ConfigLimits::max_batch),
              "examples per step (--model dea_bert: 32 unless given)");
    f.real("lr_main", &C::lr_main, Range::open_closed(0, 1e9),
           "learning rate of the main group (--model dea_bert: 2e-5 unless given)");
    f.real("lr_gate", &C::lr_gate, Range::open_closed(0, 1e9), "learning rate of the gate group (W_gate, c_gate)");
    f.real("weight_decay", &C::weight_decay, Range::closed(0, 1e9), "AdamW weight decay of the main group");
    f.real("grad_clip", &C::grad_clip, Range::open_closed(0, 1e300), "per-group gradient-norm clip");
    f.integer("steps", &C::steps, IntRange::at_least(1), "optimiser steps of the run").resumable();
    f.integer("gamma_steps", &C::gamma_steps, IntRange::at_least(0),
              "steps over which gamma_mix falls from 1 to 0");
    f.integer("log_every", &C::log_every, IntRange::at_least(1), "steps between lines of train_log.jsonl").resumable();
    f.integer("eval_every", &C::eval_every, IntRange::at_least(1),
              "steps between validations (each writes a checkpoint)")
        .resumable();
    f.integer("seed", &C::seed, IntRange::at_least(0),
              "seed of the data, the initial weights, the order and the dropout masks");
    f.text("out_dir", &C::out_dir, "DIR", "the run directory (checkpoint, config.json, log, plots)", Empty::refused,
           "a directory path");
    f.choice("data_source", &C::data_source, {"dalpha", "text"},
             "D_alpha pairs (classification) or a text corpus (masked LM, or the decoder LM's bytes; needs --text)");
    f.text("text", &C::text, "FILE", "the corpus of --data_source text", Empty::allowed)
        .implies("data_source", "text");
    // the Dual-Expert families: the oracle, D_alpha, the tokenizers
    f.text("oracle", &C::oracle, "mock|FILE.jsonl", "the oracle alpha of D_alpha: mock, or an alpha cache",
           Empty::refused, "'mock' or the path of an alpha cache (.jsonl)");
    f.choice("oracle_fallback", &C::oracle_fallback, {"none", "mock"},
             "a D_alpha pair the --oracle cache lacks: an error (none), or the mock oracle's alpha (mock, counted)");
    f.integer("n_per_source", &C::n_per_source, IntRange::closed(1, ConfigLimits::max_n_per_source),
              "D_alpha pairs per source");
    f.choice("dalpha_source", &C::dalpha_source, {"synthetic", "files"},
             "D_alpha from the synthetic generators, or from local copies of the data sets (--babi, --clutrr, "
             "--conceptnet, --capitals)");
    f.text("babi", &C::babi, "DIR", "bAbI: a directory with the qa16 / qa17 / qa18 *_train.txt task files, or one file")
        .implies("dalpha_source", "files");
    f.text("clutrr", &C::clutrr, "FILE", "CLUTRR: a CSV file of the public data set").implies("dalpha_source", "files");
    f.text("conceptnet", &C::conceptnet, "FILE",
           "ConceptNet: an (uncompressed) assertion dump; IsA and PartOf are read")
        .implies("dalpha_source", "files");
    f.text("capitals", &C::capitals, "FILE", "ConceptNet's capitals: capital<TAB>country lines (none: the 47 built in)")
        .implies("dalpha_source", "files");
    f.toggle("synthetic_fallback", &C::synthetic_fallback,
             "--dalpha_source files: a source without its file uses its synthetic generator (said on stdout)")
        .implies("dalpha_source", "files");
    f.choice("tokenizer", &C::tokenizer, {"simple", "wordpiece"},
             "the reference's word-level SimpleTokenizer, or BERT's WordPiece (needs --vocab)");
    f.text("vocab", &C::vocab, "FILE", "the vocab.txt of --tokenizer wordpiece (its size is the model's vocabulary)")
        .implies("tokenizer", "wordpiece");
    f.choice("text_alpha", &C::text_alpha, {"mock", "none"},
             "--data_source text: a random mock oracle on every batch, or none (no gate loss, no isolation check)")
        .alias("wiki_alpha", "the reference's name of --text_alpha")
        .implies("data_source", "text");
    f.integer("n_docs", &C::n_docs, IntRange::at_least(0),
              "--data_source text: read only the first N documents (non-blank lines) of --text; 0 = all")
        .implies("data_source", "text");
    f.toggle("no_isolation_check", &C::no_isolation_check, "skip the gradient-isolation check on the first batch")
        .resumable();
    f.custom("supervise_layers", &C::supervise_layers, "all|i,j,...", "all",
             "indices in [-1024, 1024], negative from the last", "the layers whose gate receives the oracle",
             [](C& c, const std::string& flag, const std::string& v) {
               if (v == "all") c.supervise_layers.reset();
               else c.supervise_layers = detail::parse_layer_list(flag, v);
             });
    // every run: evaluation, data parallelism, threads, resuming
    f.integer("eval_batches", &C::eval_batches, IntRange::at_least(1),
              "at most this many validation batches per evaluation")
        .resumable();
    f.integer("micro_batches", &C::micro_batches, IntRange::closed(1, ConfigLimits::max_batch),
              "micro-batches per step, a power of two dividing --batch_size: their gradients are summed in a fixed "
              "tree, so `mpirun -np R` gives the same bits for any R dividing it (docs/scale.md)");
    f.choice("exchange", &C::exchange, {"reduce_scatter", "allgather"},
             "how the ranks exchange their gradients: by bucket, each rank summing its slice, during backward; or "
             "every rank's whole sum to every rank after backward (the same bits; docs/scale.md)")
        .resumable();
    f.real("bucket_mb", &C::bucket_mb, Range::closed(1e-6, 1024),
           "--exchange reduce_scatter: the size of a bucket of the gradient exchange, in MB", "MB")
        .resumable();
    f.integer("threads", &C::threads, IntRange::closed(0, ConfigLimits::max_threads),
              "OpenMP threads (0 = the library default)")
        .resumable();
    f.toggle("resume", &C::resume, "continue the run in --out_dir from its checkpoint (bit for bit)");
    f.choice("precision", &C::precision, {"fp32", "bf16"},
             "the matrix products: fp32, or bf16 operands accumulated in fp32 (mixed precision; the gate, norms, "
             "softmax, losses, gradients and AdamW's weights and state stay fp32; docs/training.md)");
    // --model lm
    f.choice("attention", &C::attention, {"mha", "gqa", "tr_mha", "tr_mha_v2", "dea"},
             "--model lm: causal attention (multi-head, grouped-query, token-routed v1 / v2, causal Dual-Expert)");
    f.choice("mlp", &C::mlp, {"swiglu", "tr_moe"}, "--model lm: the dense SwiGLU MLP, or the TR-MoE MLP");
    f.toggle("shared_expert", &C::shared_expert, "--model lm --mlp tr_moe: add the shared (always active) expert")
        .implies("mlp", "tr_moe");
    f.integer("kv_heads", &C::kv_heads, IntRange::closed(0, ConfigLimits::max_d_model),
              "--model lm --attention gqa: KV heads (0 = max(1, n_heads / 4))");
    f.integer("experts", &C::experts, IntRange::closed(1, 16), "--model lm --mlp tr_moe: experts (1, 2, 4, 8 or 16)")
        .implies("mlp", "tr_moe");
    f.integer("top_k", &C::top_k, IntRange::closed(1, 4),
              "--model lm --mlp tr_moe: experts per token (1, 2 or 4, at most --experts)")
        .implies("mlp", "tr_moe");
    f.integer("shared_d_ff", &C::shared_d_ff, IntRange::closed(0, ConfigLimits::max_d_ff),
              "--model lm --mlp tr_moe --shared_expert: the shared expert's width (0 = --d_ff)")
        .implies("shared_expert", "true");
    f.choice("routing", &C::routing, {"modulo_cyclic", "balanced_hash"},
             "--model lm --mlp tr_moe: the route table (the framework's modulo_cyclic or token_id_balanced_hash)")
        .implies("mlp", "tr_moe");
    f.real("label_smoothing", &C::label_smoothing, Range::closed_open(0, 1),
           "--model lm: label smoothing of the training loss (the validation NLL is always plain)", "EPS");
    f.choice("lr_schedule", &C::lr_schedule, {"constant", "cosine"},
             "--model lm: constant, or cosine decay to 10% of --lr_main at --steps (after --warmup_steps)");
    f.integer("warmup_steps", &C::warmup_steps, IntRange::at_least(0),
              "--model lm: linear learning-rate warmup steps (at most --steps)");
    return f;
  }();
  return t;
}

/// Range and cross-field checks of every field (dea::Error naming the flag): the ranges and choices of
/// config_flags() (the command line's, with the maxima of ConfigLimits), then what one field asks of another
/// (d_model a multiple of n_heads, the data / oracle choice, each family's rules).
inline void validate(const TrainConfig& c) {
  config_flags().check(c);  // the range or choice of every flag
  check((c.micro_batches & (c.micro_batches - 1)) == 0, "--micro_batches: expected a power of two (1, 2, 4, ...), got ",
        c.micro_batches);
  check(c.batch_size % c.micro_batches == 0, "--micro_batches ", c.micro_batches, " must divide --batch_size ",
        c.batch_size, " (each micro-batch is batch_size / micro_batches examples)");
  check(!c.out_dir.empty(), "--out_dir: must not be empty");
  check(c.warmup_steps <= c.steps, "--warmup_steps: expected 0 .. --steps (", c.steps, "), got ", c.warmup_steps);
  if (c.model == "lm") {
    check(c.data_source == "text", "--model lm trains on a text corpus (--data_source text), but --data_source is '",
          c.data_source, "'");
    check(!c.text.empty(), "--model lm trains on a text corpus: it needs --text FILE");
    check(c.n_layers > 0, "--n_layers: --model lm needs at least one layer");
    check(c.kv_heads == 0 || c.n_heads % c.kv_heads == 0, "--kv_heads ", c.kv_heads, " must divide --n_heads ",
          c.n_heads);
    check((c.d_model / c.n_heads) % 2 == 0, "--d_model / --n_heads (the head width, ", c.d_model / c.n_heads,
          ") must be even for --model lm (rotary position embeddings)");
    check(c.experts == 1 || c.experts == 2 || c.experts == 4 || c.experts == 8 || c.experts == 16,
          "--experts: expected 1, 2, 4, 8 or 16, got ", c.experts);
    check(c.top_k == 1 || c.top_k == 2 || c.top_k == 4, "--top_k: expected 1, 2 or 4, got ", c.top_k);
    check(c.top_k <= c.experts, "--top_k (", c.top_k, ") cannot exceed --experts (", c.experts, ")");
    check(c.mlp != "tr_moe" || c.d_ff % c.experts == 0, "--d_ff (", c.d_ff, ") must be a multiple of --experts (",
          c.experts, ") with --mlp tr_moe (each expert is d_ff / experts wide)");
    check(c.shared_d_ff == 0 || (c.mlp == "tr_moe" && c.shared_expert), "--shared_d_ff ", c.shared_d_ff,
          " applies to --mlp tr_moe --shared_expert only (the shared expert's width)");
    check(c.routing == "modulo_cyclic" || c.mlp == "tr_moe", "--routing ", c.routing,
          " applies to --mlp tr_moe only (the TR-MoE route table)");
  }
  check(!c.oracle.empty(), "--oracle: expected 'mock' or the path of an alpha cache (.jsonl), got ''");
  {
    const std::string hint = detail::reference_value_hint("oracle", c.oracle);
    check(hint.empty(), "--oracle '", c.oracle, "': ", hint);
  }
  check(c.oracle_fallback == "none" || c.oracle != "mock", "--oracle_fallback ", c.oracle_fallback,
        ": applies to an alpha cache (--oracle FILE.jsonl), but --oracle is 'mock'");
  // D_alpha sources: files only with --dalpha_source files, and there every source has its file or leave to use
  // its synthetic generator
  const std::pair<const char*, const std::string*> files[] = {
      {"babi", &c.babi}, {"clutrr", &c.clutrr}, {"conceptnet", &c.conceptnet}, {"capitals", &c.capitals}};
  if (c.dalpha_source == "synthetic") {
    for (const auto& [flag, path] : files)
      check(path->empty(), "--", flag, " '", *path, "' is given, but --dalpha_source is 'synthetic' (add "
            "--dalpha_source files to read it)");
    check(!c.synthetic_fallback, "--synthetic_fallback applies to --dalpha_source files only");
  } else {
    check(c.data_source == "dalpha", "--dalpha_source files: applies to --data_source dalpha, but --data_source is '",
          c.data_source, "'");
    std::string missing;
    if (c.babi.empty()) missing += "--babi DIR (bAbI)";
    if (c.clutrr.empty()) missing += std::string(missing.empty() ? "" : ", ") + "--clutrr FILE (CLUTRR)";
    if (c.conceptnet.empty() && c.capitals.empty())
      missing += std::string(missing.empty() ? "" : ", ") + "--conceptnet FILE or --capitals FILE (ConceptNet)";
    check(missing.empty() || c.synthetic_fallback, "--dalpha_source files: no file for ", missing,
          ": give it, or --synthetic_fallback to use the synthetic generator of each source without a file");
  }
  if (c.model == "dea_bert") {
    check(!c.hf_model.empty(), "--model dea_bert needs --hf_model DIR (a Hugging Face BERT model directory with "
          "config.json, model.safetensors and vocab.txt)");
    check(c.data_source == "dalpha", "--data_source ", c.data_source, ": --model dea_bert fine-tunes on D_alpha pairs "
          "only (--data_source dalpha)");
    check(c.tokenizer == "wordpiece", "--model dea_bert: the tokenizer is the WordPiece of --hf_model's vocab.txt, "
          "but --tokenizer is '", c.tokenizer, "'");
    check(!c.supervise_layers, "--supervise_layers: --model dea_bert supervises every layer (as the reference's "
          "DualExpertBert)");
  } else {
    check(c.hf_model.empty(), "--hf_model '", c.hf_model, "' is given, but --model is '", c.model,
          "' (add --model dea_bert to fine-tune it)");
  }
  check(c.tokenizer != "wordpiece" || !c.vocab.empty(), "--tokenizer wordpiece needs --vocab FILE (a BERT vocab.txt)");
  check(c.tokenizer == "wordpiece" || c.vocab.empty(), "--vocab '", c.vocab,
        "' is given, but --tokenizer is 'simple' (add --tokenizer wordpiece to use it)");
  {
    bool hex = c.data_hash.size() == 16;
    for (char ch : c.data_hash) hex = hex && ((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'));
    check(c.data_hash.empty() || hex, "data_hash: expected 16 lower-case hex digits, got '", c.data_hash, "'");
  }
  check(!c.supervise_layers || c.supervise_layers->empty() || c.n_layers > 0,
        "--supervise_layers: given for a model without layers (--n_layers 0)");
  check(c.d_model % c.n_heads == 0, "--d_model (", c.d_model, ") must be a multiple of --n_heads (", c.n_heads, ")");
  check(c.data_source != "text" || !c.text.empty(), "--data_source text needs --text FILE");
  check(c.data_source == "text" || c.text.empty(), "--text '", c.text,
        "' is given, but --data_source is 'dalpha' (add --data_source text to train on the corpus)");
  // the parameters, their gradients and AdamW's two moments (float): refuse a model this machine cannot hold
  // before allocating any of it (the embeddings, which need the vocabulary, are left out of the estimate)
  const double params = double(c.n_layers) * (4.0 * double(c.d_model) * double(c.d_model) +
                                              2.0 * double(c.d_model) * double(c.d_ff)) +
                        double(c.d_model) * double(c.d_model);
  const double need_gb = params * 4.0 * sizeof(float) / 1e9, have_gb = detail::physical_memory_gb();
  check(have_gb <= 0 || need_gb <= have_gb, "--d_model ", c.d_model, " --d_ff ", c.d_ff, " --n_layers ", c.n_layers,
        ": the model's parameters, gradients and optimiser state alone need about ", fmt::format("{:.1f}", need_gb),
        " GB, more than this machine's ", fmt::format("{:.1f}", have_gb), " GB of memory");
  check(c.data_source == "dalpha" || c.oracle == "mock", "--oracle '", c.oracle,
        "': an alpha cache applies only to --data_source dalpha");
}

/// The product precision of a configuration's --precision.
inline Precision run_precision(const TrainConfig& c) { return c.precision == "bf16" ? Precision::bf16 : Precision::fp32; }

/// A configuration that passed validate(): built from a TrainConfig (validating it, dea::Error naming the flag),
/// read only afterwards. What the data and the trainer take.
class ValidConfig {
public:
  ValidConfig(TrainConfig c) : c_(std::move(c)) { validate(c_); }  // NOLINT: implicit, so code passes a TrainConfig
  const TrainConfig& get() const { return c_; }
  const TrainConfig* operator->() const { return &c_; }
  operator const TrainConfig&() const { return c_; }  // NOLINT

  /// The same configuration with --text and --oracle by absolute path (eval and --resume then find them from any
  /// working directory); still valid, so not checked again.
  ValidConfig with_absolute_paths() const;

private:
  struct Checked {};
  ValidConfig(TrainConfig c, Checked) : c_(std::move(c)) {}
  TrainConfig c_;
};

/// Declares the configuration's flags on `fs`, stored into `c` (the defaults shown are c's values now).
inline void add_config_flags(cli::FlagSet& fs, TrainConfig& c) { config_flags().bind(fs, c); }

/// Fills in what the flags given on a fresh run's command line imply, where nothing else is possible: --text FILE
/// (and --text_alpha, --n_docs) imply --data_source text, --model lm implies --data_source text, a D_alpha file flag
/// implies --dalpha_source files, --vocab implies --tokenizer wordpiece, --hf_model implies --model dea_bert, a
/// TR-MoE flag implies --mlp tr_moe and --shared_d_ff implies --shared_expert. A flag given explicitly is never
/// changed: a contradiction is left to validate(), which names both flags. Returns the flags it set.
inline std::set<std::string> apply_implications(TrainConfig& c, const std::set<std::string>& given) {
  return config_flags().apply_implications(c, given);
}

/// The result of parsing a command line: the configuration and the flags given explicitly.
struct ParsedArgs {
  TrainConfig config;
  std::set<std::string> explicit_flags;
  bool help = false;
};

/// Parses the configuration's flags (argv[1..], no other flags) on top of `base`; --quick fills the preset into
/// every field not given explicitly (apply_quick = false skips that). The values are range-checked; the
/// cross-field checks are validate()'s.
inline ParsedArgs parse_args(const std::vector<std::string>& args, const TrainConfig& base = {},
                             bool apply_quick = true) {
  ParsedArgs p;
  p.config = base;
  cli::FlagSet fs("dea train [flags]");
  add_config_flags(fs, p.config);
  const cli::FlagSet::Parsed r = fs.parse(args);
  p.explicit_flags = r.flags;
  p.help = r.help;
  if (p.config.quick && apply_quick) apply_quick_preset(p.config, p.explicit_flags);
  return p;
}

/// The gradient exchange of a data-parallel run (--exchange, --bucket_mb).
inline dist::ExchangeOptions exchange_options(const TrainConfig& c) {
  dist::ExchangeOptions o;
  o.exchange = dist::parse_exchange(c.exchange);
  o.bucket_mb = c.bucket_mb;
  return o;
}

/// The flags that name files (--text, --oracle unless 'mock', --babi, --clutrr, --conceptnet, --capitals,
/// --vocab, --hf_model) by absolute path, for a configuration not yet checked.
inline TrainConfig with_absolute_paths(TrainConfig c) {
  auto abs = [](std::string& p) {
    if (!p.empty()) p = std::filesystem::absolute(p).lexically_normal().string();
  };
  for (std::string* p : {&c.text, &c.babi, &c.clutrr, &c.conceptnet, &c.capitals, &c.vocab, &c.hf_model}) abs(*p);
  if (c.oracle != "mock") abs(c.oracle);
  return c;
}

inline ValidConfig ValidConfig::with_absolute_paths() const {
  return ValidConfig(::dea::train::with_absolute_paths(c_), Checked{});
}

/// Flags that apply only to --data_source text (--text_alpha, --n_docs): given on a command line for D_alpha they
/// would be ignored, so they are refused there (dea::Error naming the flag). A config.json may hold them (the
/// reference's cfg records every flag), so validate() does not refuse them. Likewise the encoder's own flags
/// (--quick, --d_model, --n_heads, --n_layers, --d_ff, --dropout, --supervise_layers, --tokenizer, --vocab) are
/// refused with --model dea_bert, whose sizes, dropout and tokenizer come from --hf_model.
inline void check_flag_scope(const TrainConfig& c, const std::set<std::string>& given) {
  if (c.model == "dea_bert")
    for (const char* f : {"quick", "d_model", "n_heads", "n_layers", "d_ff", "dropout", "supervise_layers", "tokenizer",
                          "vocab"}) {
      const std::string flag = f;
      const char* why = flag == "quick" ? "the --quick preset sets the encoder's sizes; give --steps and the other "
                                          "flags instead"
                        : flag == "dropout" ? "the dropout comes from --hf_model's config.json (hidden_dropout_prob, "
                                              "attention_probs_dropout_prob) and is 0.1 in the head"
                        : flag == "supervise_layers" ? "the oracle supervises every layer, as in the reference"
                        : flag == "tokenizer" || flag == "vocab"
                            ? "the tokenizer is the WordPiece of --hf_model's vocab.txt"
                            : "the sizes come from --hf_model's config.json";
      check(!given.count(flag), "--", flag, " applies to --model encoder only: with --model dea_bert ", why);
    }
  if (c.model == "lm") {
    for (const char* f : {"quick", "dropout", "lr_gate", "gamma_steps", "oracle", "oracle_fallback", "n_per_source",
                          "dalpha_source", "babi", "clutrr", "conceptnet", "capitals", "synthetic_fallback",
                          "tokenizer", "vocab", "text_alpha", "n_docs", "supervise_layers", "no_isolation_check"})
      check(!given.count(f), "--", f, " does not apply to --model lm (the byte-level decoder language model has no "
            "Dual-Expert gate, oracle, dropout or word tokenizer; its flags are the sizes, --attention, --mlp, "
            "--shared_expert, --kv_heads, --experts, --top_k, --shared_d_ff, --routing, --label_smoothing, --lr_schedule, "
            "--warmup_steps, the lr / steps / log flags and --text)");
  } else {
    for (const char* f : {"attention", "mlp", "shared_expert", "kv_heads", "experts", "top_k", "shared_d_ff", "routing",
                          "label_smoothing", "lr_schedule", "warmup_steps"})
      check(!given.count(f), "--", f, " applies to --model lm only, but --model is '", c.model, "'");
  }
  if (c.model == "lm" || c.data_source == "text") return;
  for (const char* f : {"text_alpha", "n_docs"})
    check(!given.count(f), "--", f, " applies to --data_source text only, but --data_source is '", c.data_source, "'");
}

inline nlohmann::json to_json(const TrainConfig& c) {
  nlohmann::json j;
  j["model"] = c.model;
  j["hf_model"] = c.hf_model;
  j["quick"] = c.quick;
  j["d_model"] = c.d_model;
  j["n_heads"] = c.n_heads;
  j["n_layers"] = c.n_layers;
  j["d_ff"] = c.d_ff;
  j["dropout"] = c.dropout;
  j["max_len"] = c.max_len;
  j["batch_size"] = c.batch_size;
  j["lr_main"] = c.lr_main;
  j["lr_gate"] = c.lr_gate;
  j["weight_decay"] = c.weight_decay;
  j["grad_clip"] = c.grad_clip;
  j["steps"] = c.steps;
  j["gamma_steps"] = c.gamma_steps;
  j["log_every"] = c.log_every;
  j["eval_every"] = c.eval_every;
  j["seed"] = c.seed;
  j["out_dir"] = c.out_dir;
  j["data_source"] = c.data_source;
  j["text"] = c.text;
  j["oracle"] = c.oracle;
  j["n_per_source"] = c.n_per_source;
  j["supervise_layers"] = c.supervise_layers ? nlohmann::json(*c.supervise_layers) : nlohmann::json(nullptr);
  j["threads"] = c.threads;
  j["resume"] = c.resume;
  j["eval_batches"] = c.eval_batches;
  j["micro_batches"] = c.micro_batches;
  j["exchange"] = c.exchange;
  j["bucket_mb"] = c.bucket_mb;
  j["precision"] = c.precision;
  j["oracle_fallback"] = c.oracle_fallback;
  j["dalpha_source"] = c.dalpha_source;
  j["babi"] = c.babi;
  j["clutrr"] = c.clutrr;
  j["conceptnet"] = c.conceptnet;
  j["capitals"] = c.capitals;
  j["synthetic_fallback"] = c.synthetic_fallback;
  j["tokenizer"] = c.tokenizer;
  j["vocab"] = c.vocab;
  j["text_alpha"] = c.text_alpha;
  j["n_docs"] = c.n_docs;
  j["no_isolation_check"] = c.no_isolation_check;
  j["data_hash"] = c.data_hash;
  if (c.model == "lm") {
    j["attention"] = c.attention;
    j["mlp"] = c.mlp;
    j["shared_expert"] = c.shared_expert;
    j["kv_heads"] = c.kv_heads;
    j["experts"] = c.experts;
    j["top_k"] = c.top_k;
    j["shared_d_ff"] = c.shared_d_ff;
    j["routing"] = c.routing;
    j["label_smoothing"] = c.label_smoothing;
    j["lr_schedule"] = c.lr_schedule;
    j["warmup_steps"] = c.warmup_steps;
  }
  return j;
}

/// Reads a configuration written by to_json; absent keys keep their defaults, a key of the wrong type is a
/// dea::Error naming it (and `source`).
inline ValidConfig config_from_json(const nlohmann::json& j, const std::string& source = "config") {
  check(j.is_object(), source, ": expected a JSON object, got ", j.type_name());
  TrainConfig c;
  auto wrong = [&](const char* key, const nlohmann::json& v, const char* expected) {
    ::dea::detail::raise(source + ": key '" + key + "' must be " + expected + ", got " + v.type_name() +
                         (v.is_primitive() ? " " + v.dump() : std::string()));
  };
  // Integers must be JSON integers (a float such as 1e300 is refused before any conversion) within int64.
  auto integer = [&](const char* key, const nlohmann::json& v) -> std::int64_t {
    if (v.is_number_unsigned()) {
      const std::uint64_t u = v.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) wrong(key, v, "an int64 integer");
      return static_cast<std::int64_t>(u);
    }
    if (!v.is_number_integer()) wrong(key, v, "an integer");
    return v.get<std::int64_t>();
  };
  auto get = [&](const char* key, auto& field) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return;
    const nlohmann::json& v = *it;
    using T = std::decay_t<decltype(field)>;
    if constexpr (std::is_same_v<T, bool>) {
      if (!v.is_boolean()) wrong(key, v, "true or false");
      field = v.get<bool>();
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!v.is_string()) wrong(key, v, "a string");
      field = v.get<std::string>();
    } else if constexpr (std::is_same_v<T, double>) {
      if (!v.is_number()) wrong(key, v, "a number");
      field = v.get<double>();
    } else if constexpr (std::is_same_v<T, std::uint64_t>) {
      // a parsed file gives unsigned; a json built in code may hold a non-negative signed integer
      if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0))
        wrong(key, v, "a non-negative integer");
      field = v.get<std::uint64_t>();
    } else if constexpr (std::is_same_v<T, int>) {
      const std::int64_t x = integer(key, v);
      if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max()) wrong(key, v, "an int");
      field = static_cast<int>(x);
    } else {
      static_assert(std::is_same_v<T, std::int64_t> || std::is_same_v<T, Index>, "config field type");
      field = static_cast<T>(integer(key, v));
    }
  };
  get("model", c.model);
  // the reference's cfg records hf_model (its default "bert-base-uncased") for every run: read for dea_bert only
  if (c.model == "dea_bert") get("hf_model", c.hf_model);
  get("quick", c.quick);
  get("d_model", c.d_model);
  get("n_heads", c.n_heads);
  get("n_layers", c.n_layers);
  get("d_ff", c.d_ff);
  get("dropout", c.dropout);
  get("max_len", c.max_len);
  get("batch_size", c.batch_size);
  get("lr_main", c.lr_main);
  get("lr_gate", c.lr_gate);
  get("weight_decay", c.weight_decay);
  get("grad_clip", c.grad_clip);
  get("steps", c.steps);
  get("gamma_steps", c.gamma_steps);
  get("log_every", c.log_every);
  get("eval_every", c.eval_every);
  get("seed", c.seed);
  get("out_dir", c.out_dir);
  get("data_source", c.data_source);
  get("text", c.text);
  get("oracle", c.oracle);
  get("n_per_source", c.n_per_source);
  get("threads", c.threads);
  get("resume", c.resume);
  get("eval_batches", c.eval_batches);
  get("micro_batches", c.micro_batches);
  get("exchange", c.exchange);    // absent (a run from before the bucketed exchange): reduce_scatter
  get("bucket_mb", c.bucket_mb);
  get("precision", c.precision);  // absent (a run from before mixed precision, or the reference's): fp32
  get("oracle_fallback", c.oracle_fallback);
  get("dalpha_source", c.dalpha_source);
  get("babi", c.babi);
  get("clutrr", c.clutrr);
  get("conceptnet", c.conceptnet);
  get("capitals", c.capitals);
  get("synthetic_fallback", c.synthetic_fallback);
  get("tokenizer", c.tokenizer);
  get("vocab", c.vocab);
  // the reference's cfg names it wiki_alpha
  get("wiki_alpha", c.text_alpha);
  if (j.contains("text_alpha") && j.contains("wiki_alpha") && j["text_alpha"] != j["wiki_alpha"] &&
      !j["wiki_alpha"].is_null())
    ::dea::detail::raise(source + ": keys 'text_alpha' (" + j["text_alpha"].dump() + ") and 'wiki_alpha' (" +
                         j["wiki_alpha"].dump() + ") disagree (they are one setting)");
  get("text_alpha", c.text_alpha);
  get("n_docs", c.n_docs);
  get("no_isolation_check", c.no_isolation_check);
  get("data_hash", c.data_hash);
  if (c.model == "lm") {
    get("attention", c.attention);
    get("mlp", c.mlp);
    get("shared_expert", c.shared_expert);
    get("kv_heads", c.kv_heads);
    get("experts", c.experts);
    get("top_k", c.top_k);
    get("shared_d_ff", c.shared_d_ff);
    get("routing", c.routing);
    get("label_smoothing", c.label_smoothing);
    get("lr_schedule", c.lr_schedule);
    get("warmup_steps", c.warmup_steps);
  }
  auto it = j.find("supervise_layers");
  if (it != j.end() && !it->is_null()) {
    if (!it->is_array()) wrong("supervise_layers", *it, "null or an array of layer indices");
    check(it->size() <= static_cast<std::size_t>(ConfigLimits::max_layers), source, ": key 'supervise_layers' has ",
          it->size(), " entries, more than the maximum ", ConfigLimits::max_layers);
    std::vector<Index> v;
    for (const nlohmann::json& x : *it) v.push_back(static_cast<Index>(integer("supervise_layers", x)));
    c.supervise_layers = v;
  }
  // The same ranges as on the command line: a config.json is outside input like the flags are.
  try {
    return ValidConfig(std::move(c));
  } catch (const Error& e) {
    ::dea::detail::raise(source + ": " + without_error_prefix(e.what()));
  }
}

inline void write_config(const std::string& path, const TrainConfig& c) {
  ::dea::write_file_atomic(path, to_json(c).dump(2) + "\n");
}

/// Largest config.json accepted (a real one is under 1 KiB).
constexpr std::size_t kMaxConfigBytes = 1 << 20;

/// Reads and checks config.json (see config_from_json); dea::Error naming the file on any problem.
inline ValidConfig read_config(const std::string& path) {
  const std::string text = ::dea::read_file(path, kMaxConfigBytes);
  return config_from_json(io::parse_json_limited(text, path), path);
}

/// The flags a resumed run may change (declared so in config_flags()): how long it runs, how often it logs and
/// evaluates, its threads, whether the isolation check runs and how the ranks exchange gradients (these change no
/// result). Every other field comes from
/// the run's config.json.
inline const std::set<std::string>& resumable_flags() {
  static const std::set<std::string> k = config_flags().resumable_names();
  return k;
}

/// The configuration of a resumed run: `saved` (the run's config.json) with the values of the flags given on the
/// command line (`given`, parsed without the --quick preset; `flags` the names given). A resumable flag takes the
/// new value; any other flag must repeat the saved value (the flags that name files compared by absolute path),
/// else a dea::Error names it. Names in `flags` that are not configuration flags (a program's own, such as
/// --plot_dir) are left to the program. out_dir is the one given; resume is set.
inline TrainConfig resume_config(const TrainConfig& saved, const TrainConfig& given, const std::set<std::string>& flags) {
  const nlohmann::json a = to_json(with_absolute_paths(saved)), b = to_json(with_absolute_paths(given));
  TrainConfig c = saved;
  for (const std::string& f : flags) {
    if (f == "out_dir" || f == "resume" || f == "quick" || !a.contains(f)) continue;  // (not a config flag)
    if (resumable_flags().count(f)) {
      config_flags().copy_resumable(f, given, c);
      continue;
    }
    check(b.at(f) == a.at(f), "--", f, ": ", b.at(f).dump(), " differs from the checkpoint's ", a.at(f).dump(),
          " (a resumed run keeps its configuration; it may change --", [] {
            std::string s;
            for (const auto& k : resumable_flags()) s += (s.empty() ? "" : ", --") + k;
            return s;
          }(), ")");
  }
  c.out_dir = given.out_dir;
  c.resume = true;
  return c;
}

}  // namespace dea::train
