// dea/train/config.hpp: the run configuration of the encoder's training (the reference's train.py flags): the
// fields and their defaults, the --quick preset, the command-line flags (declared once, on a cli::FlagSet), the
// one validate(), JSON (config.json) and the rule for what a resumed run may change.
//
// A configuration is checked once, where it enters: ValidConfig runs validate() when it is built (from the command
// line or from code), read_config() when it reads a file; the trainer and the data take a ValidConfig.
#pragma once

#include "../core/error.hpp"
#include "../core/files.hpp"
#include "../core/tensor.hpp"
#include "../io/json_limits.hpp"
#include "flags.hpp"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

namespace dea::train {

/// Every flag of train (the reference's train.py defaults; model sizes from its CONFIG).
struct TrainConfig {
  bool quick = false;
  Index d_model = 512;
  Index n_heads = 8;
  Index n_layers = 6;
  Index d_ff = 2048;
  double dropout = 0.1;
  Index max_len = 64;
  Index batch_size = 128;
  double lr_main = 3e-4;
  double lr_gate = 1e-3;
  double weight_decay = 0.01;
  double grad_clip = 1.0;
  std::int64_t steps = 12000;
  std::int64_t gamma_steps = 10000;
  std::int64_t log_every = 50;
  std::int64_t eval_every = 1000;
  std::uint64_t seed = 42;
  std::string out_dir = "runs/dea";
  std::string data_source = "dalpha";  ///< dalpha | text
  std::string text;                    ///< corpus file for data_source text
  std::string oracle = "mock";         ///< mock | path of an alpha cache (.jsonl)
  std::int64_t n_per_source = 2000;
  std::optional<std::vector<Index>> supervise_layers;  ///< nullopt = all layers
  int threads = 0;                     ///< 0 = library default
  bool resume = false;
  std::int64_t eval_batches = 50;      ///< at most this many validation batches per periodic evaluation
};

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

/// Runs f(); a dea::Error it throws is thrown again with `context` before its message (the file a flag named).
template <class F>
auto with_context(const std::string& context, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    std::string m = e.what();
    if (m.compare(0, 5, "dea: ") == 0) m = m.substr(5);
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

/// Range and cross-field checks of every field (dea::Error naming the flag): the ranges set_flag enforces on
/// the command line, the maxima of ConfigLimits, d_model a multiple of n_heads, and the data / oracle choice.
inline void validate(const TrainConfig& c) {
  auto in = [](const char* flag, std::int64_t v, std::int64_t lo, std::int64_t hi) {
    check(v >= lo && v <= hi, "--", flag, ": ", v, " is outside [", lo, ", ", hi, "]");
  };
  auto real = [](const char* flag, double v, double lo, double hi, bool lo_open) {
    check(std::isfinite(v) && v >= lo && v <= hi && !(lo_open && v == lo), "--", flag, ": ", v, " is outside ",
          lo_open ? "(" : "[", lo, ", ", hi, "]");
  };
  in("d_model", c.d_model, 1, ConfigLimits::max_d_model);
  in("n_heads", c.n_heads, 1, ConfigLimits::max_d_model);
  in("n_layers", c.n_layers, 0, ConfigLimits::max_layers);
  in("d_ff", c.d_ff, 1, ConfigLimits::max_d_ff);
  in("max_len", c.max_len, 3, ConfigLimits::max_len);
  in("batch_size", c.batch_size, 1, ConfigLimits::max_batch);
  in("steps", c.steps, 1, std::numeric_limits<std::int64_t>::max() / 2);
  in("gamma_steps", c.gamma_steps, 0, std::numeric_limits<std::int64_t>::max() / 2);
  in("log_every", c.log_every, 1, std::numeric_limits<std::int64_t>::max());
  in("eval_every", c.eval_every, 1, std::numeric_limits<std::int64_t>::max());
  in("n_per_source", c.n_per_source, 1, ConfigLimits::max_n_per_source);
  in("threads", c.threads, 0, ConfigLimits::max_threads);
  in("eval_batches", c.eval_batches, 1, std::numeric_limits<std::int64_t>::max());
  real("dropout", c.dropout, 0, 0.999999, false);
  real("lr_main", c.lr_main, 0, 1e9, true);
  real("lr_gate", c.lr_gate, 0, 1e9, true);
  real("weight_decay", c.weight_decay, 0, 1e9, false);
  real("grad_clip", c.grad_clip, 0, 1e300, true);
  check(!c.out_dir.empty(), "--out_dir: must not be empty");
  check(c.data_source == "dalpha" || c.data_source == "text", "--data_source: expected 'dalpha' or 'text', got '",
        c.data_source, "'");
  check(!c.oracle.empty(), "--oracle: expected 'mock' or the path of an alpha cache (.jsonl), got ''");
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
  ValidConfig with_absolute_paths() const {
    TrainConfig c = c_;
    if (!c.text.empty()) c.text = std::filesystem::absolute(c.text).lexically_normal().string();
    if (c.oracle != "mock") c.oracle = std::filesystem::absolute(c.oracle).lexically_normal().string();
    return ValidConfig(std::move(c), Checked{});
  }

private:
  struct Checked {};
  ValidConfig(TrainConfig c, Checked) : c_(std::move(c)) {}
  TrainConfig c_;
};

/// Declares the configuration's flags on `fs`, stored into `c` (the defaults shown are c's values now).
inline void add_config_flags(cli::FlagSet& fs, TrainConfig& c) {
  using cli::kNoMax;
  fs.toggle("quick", c.quick,
            "the reference's quick preset: D=128 H=4 2 layers d_ff 256 batch 32, 300 steps, gamma_steps 200, "
            "eval_every 150, log_every 25, n_per_source 500 (flags given explicitly win)");
  fs.integer("d_model", c.d_model, 1, kNoMax, "model width (a multiple of --n_heads; at most 65536)");
  fs.integer("n_heads", c.n_heads, 1, kNoMax, "attention heads");
  fs.integer("n_layers", c.n_layers, 0, kNoMax, "encoder layers (at most 1024)");
  fs.integer("d_ff", c.d_ff, 1, kNoMax, "feed-forward width (at most 1048576)");
  fs.real("dropout", c.dropout, 0, 1, false, true, "dropout probability", "P");
  fs.integer("max_len", c.max_len, 3, kNoMax, "longest sequence in tokens (at most 65536)");
  fs.integer("batch_size", c.batch_size, 1, kNoMax, "examples per step (at most 1048576)");
  fs.real("lr_main", c.lr_main, 0, 1e9, true, false, "learning rate of the main group");
  fs.real("lr_gate", c.lr_gate, 0, 1e9, true, false, "learning rate of the gate group (W_gate, c_gate)");
  fs.real("weight_decay", c.weight_decay, 0, 1e9, false, false, "AdamW weight decay of the main group");
  fs.real("grad_clip", c.grad_clip, 0, 1e300, true, false, "per-group gradient-norm clip");
  fs.integer("steps", c.steps, 1, kNoMax, "optimiser steps of the run");
  fs.integer("gamma_steps", c.gamma_steps, 0, kNoMax, "steps over which gamma_mix falls from 1 to 0");
  fs.integer("log_every", c.log_every, 1, kNoMax, "steps between lines of train_log.jsonl");
  fs.integer("eval_every", c.eval_every, 1, kNoMax, "steps between validations (each writes a checkpoint)");
  fs.integer("seed", c.seed, 0, kNoMax, "seed of the data, the initial weights, the order and the dropout masks");
  fs.text("out_dir", c.out_dir, "DIR", "the run directory (checkpoint, config.json, log, plots)", true,
          "a directory path");
  fs.choice("data_source", c.data_source, {"dalpha", "text"},
            "D_alpha pairs (classification) or a text corpus (masked LM, needs --text)");
  fs.text("text", c.text, "FILE", "the corpus of --data_source text", false);
  fs.text("oracle", c.oracle, "mock|FILE.jsonl", "the oracle alpha of D_alpha: mock, or an alpha cache", true,
          "'mock' or the path of an alpha cache (.jsonl)");
  fs.integer("n_per_source", c.n_per_source, 1, kNoMax, "D_alpha pairs per source (at most 1000000)");
  fs.custom("supervise_layers", "all|i,j,...", "all", "indices in [-1024, 1024], negative from the last",
            "the layers whose gate receives the oracle", [&c](const std::string& flag, const std::string& v) {
              if (v == "all") c.supervise_layers.reset();
              else c.supervise_layers = detail::parse_layer_list(flag, v);
            });
  fs.integer("eval_batches", c.eval_batches, 1, kNoMax, "at most this many validation batches per evaluation");
  fs.integer("threads", c.threads, 0, cli::kMaxThreads, "OpenMP threads (0 = the library default)");
  fs.toggle("resume", c.resume, "continue the run in --out_dir from its checkpoint (bit for bit)");
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

/// --text and --oracle by absolute path (as ValidConfig::with_absolute_paths, for a configuration not yet checked).
inline TrainConfig with_absolute_paths(TrainConfig c) {
  if (!c.text.empty()) c.text = std::filesystem::absolute(c.text).lexically_normal().string();
  if (c.oracle != "mock") c.oracle = std::filesystem::absolute(c.oracle).lexically_normal().string();
  return c;
}

inline nlohmann::json to_json(const TrainConfig& c) {
  nlohmann::json j;
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
    std::string m = e.what();
    if (m.compare(0, 5, "dea: ") == 0) m.erase(0, 5);
    ::dea::detail::raise(source + ": " + m);
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

/// The flags a resumed run may change: how long it runs, how often it logs and evaluates, and its threads. Every
/// other field comes from the run's config.json.
inline const std::set<std::string>& resumable_flags() {
  static const std::set<std::string> k = {"steps", "log_every", "eval_every", "eval_batches", "threads"};
  return k;
}

/// The configuration of a resumed run: `saved` (the run's config.json) with the values of the flags given on the
/// command line (`given`, parsed without the --quick preset; `flags` the names given). A resumable flag takes the
/// new value; any other flag must repeat the saved value (--text and --oracle compared by absolute path), else a
/// dea::Error names it. out_dir is the one given; resume is set.
inline TrainConfig resume_config(const TrainConfig& saved, const TrainConfig& given, const std::set<std::string>& flags) {
  const nlohmann::json a = to_json(with_absolute_paths(saved)), b = to_json(with_absolute_paths(given));
  nlohmann::json merged = to_json(saved);
  for (const std::string& f : flags) {
    if (f == "out_dir" || f == "resume" || f == "quick") continue;
    if (resumable_flags().count(f)) {
      merged[f] = to_json(given)[f];
      continue;
    }
    check(b.at(f) == a.at(f), "--", f, ": ", b.at(f).dump(), " differs from the checkpoint's ", a.at(f).dump(),
          " (a resumed run keeps its configuration; it may change --", [] {
            std::string s;
            for (const auto& k : resumable_flags()) s += (s.empty() ? "" : ", --") + k;
            return s;
          }(), ")");
  }
  TrainConfig c = saved;
  // the resumable fields are plain integers: copied from the merged JSON one by one
  c.steps = merged["steps"].get<std::int64_t>();
  c.log_every = merged["log_every"].get<std::int64_t>();
  c.eval_every = merged["eval_every"].get<std::int64_t>();
  c.eval_batches = merged["eval_batches"].get<std::int64_t>();
  c.threads = merged["threads"].get<int>();
  c.out_dir = given.out_dir;
  c.resume = true;
  return c;
}

}  // namespace dea::train
