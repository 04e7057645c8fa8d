// dea/io/pipeline.hpp: the pieces of the training and evaluation programs (examples/train, examples/eval) that
// the programs and the tests share: the run configuration (the reference's train.py flags, parsing, JSON),
// building the data from a configuration, the evaluation loop (eval.py), checkpoints and the Paris probe.
//
// Determinism and resuming. Everything random in a run is a function of (seed, step):
//   * the model's initial weights come from Rng(seed);
//   * the training order is epoch-wise: epoch e = (step-1) / n_batches is a permutation of the training split
//     drawn from Rng(stream(seed, kOrderStream, e)), batch k = (step-1) % n_batches of it is the step's batch;
//   * the dropout masks of step s come from Rng(stream(seed, kDropoutStream, s)) (the MLM masking of step s from
//     kMaskStream);
// so a run resumed from the checkpoint of step k (parameters, AdamW moments and step counts, all stored exactly)
// continues bit for bit as the uninterrupted run.
//
// Checkpoint directory (out_dir):
//   checkpoint.safetensors  parameters under the reference's state_dict names (F32), the AdamW state under
//                           "optim." (exp_avg.<name>, exp_avg_sq.<name>, step.<group>), "train.step" (I64 []),
//                           "train.rng_state" (I64 [4], the xoshiro state of the next step's dropout Rng, a
//                           consistency check) and metadata {format, step}
//   config.json             every flag of the run
//   tokenizer.txt           the vocabulary (one token per line)
// Each file is written to a temporary file and renamed. A fresh run refuses a directory that holds another run's
// files unless TrainOptions::overwrite (train --overwrite), which deletes them first: a directory never mixes runs.
#pragma once

#include "../core/error.hpp"
#include "../core/parallel.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../data/collate.hpp"
#include "../data/dalpha.hpp"
#include "../data/files.hpp"
#include "../data/mlm.hpp"
#include "../data/tokenizer.hpp"
#include "../eval/metrics.hpp"
#include "../nn/transformer.hpp"
#include "../optim/adamw.hpp"
#include "../optim/schedule.hpp"
#include "cli.hpp"
#include "json_limits.hpp"
#include "jsonl.hpp"
#include "plots.hpp"
#include "safetensors.hpp"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <array>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

namespace dea::pipeline {

using Scalar = float;
using Model = nn::TransformerModel<Scalar>;
using Batch = nn::ModelBatch<Scalar>;

// ------------------------------------------------------------------------------------------------------------
// Configuration
// ------------------------------------------------------------------------------------------------------------

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

[[noreturn]] inline void bad_flag(const std::string& flag, const std::string& value, const std::string& expected) {
  ::dea::detail::raise("--" + flag + ": expected " + expected + ", got '" + value + "'");
}

inline std::int64_t parse_int(const std::string& flag, const std::string& v, std::int64_t lo) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || !end || *end || errno == ERANGE || x < lo)
    bad_flag(flag, v, lo == 0 ? "a non-negative integer" : ::dea::detail::concat("an integer >= ", lo));
  return static_cast<std::int64_t>(x);
}

inline double parse_double(const std::string& flag, const std::string& v, double lo, double hi, bool lo_open,
                           const char* expected) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || !end || *end || !std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
    bad_flag(flag, v, expected);
  return x;
}

inline std::vector<Index> parse_layer_list(const std::string& flag, const std::string& v) {
  std::vector<Index> out;
  std::size_t i = 0;
  while (i <= v.size()) {
    const std::size_t j = std::min(v.find(',', i), v.size());
    const std::string item = v.substr(i, j - i);
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(item.c_str(), &end, 10);
    // |index| <= 1024 and at most 1024 entries: what config.json may hold (ConfigLimits::max_layers)
    if (item.empty() || !end || *end || errno == ERANGE || x < -1024 || x > 1024 || out.size() >= 1024)
      bad_flag(flag, v, "'all' or a comma-separated list of at most 1024 layer indices in [-1024, 1024]");
    out.push_back(static_cast<Index>(x));
    i = j + 1;
  }
  return out;
}

inline bool is_switch(const std::string& flag) { return flag == "quick" || flag == "resume"; }

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

/// The machine's physical memory in GB (0 where it cannot be read).
inline double physical_memory_gb() {
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGE_SIZE)
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) return double(pages) * double(page) / 1e9;
#endif
  return 0;
}

/// The flags of set_flag (each takes a value).
inline bool is_value_flag(const std::string& flag) {
  static const char* const kFlags[] = {
      "d_model", "n_heads", "n_layers", "d_ff", "dropout", "max_len", "batch_size", "lr_main", "lr_gate",
      "weight_decay", "grad_clip", "steps", "gamma_steps", "log_every", "eval_every", "seed", "out_dir",
      "data_source", "text", "oracle", "n_per_source", "supervise_layers", "threads", "eval_batches"};
  for (const char* f : kFlags)
    if (flag == f) return true;
  return false;
}

}  // namespace detail

/// The result of parsing a command line: the configuration and the flags given explicitly.
struct ParsedArgs {
  TrainConfig config;
  std::set<std::string> explicit_flags;
  bool help = false;
};

/// Sets one flag (name without "--") of `c` from its text value; dea::Error naming the flag and value.
inline void set_flag(TrainConfig& c, const std::string& f, const std::string& v) {
  using detail::parse_double;
  using detail::parse_int;
  if (f == "d_model") c.d_model = parse_int(f, v, 1);
  else if (f == "n_heads") c.n_heads = parse_int(f, v, 1);
  else if (f == "n_layers") c.n_layers = parse_int(f, v, 0);
  else if (f == "d_ff") c.d_ff = parse_int(f, v, 1);
  else if (f == "dropout") c.dropout = parse_double(f, v, 0, 0.999999, false, "a number in [0, 1)");
  else if (f == "max_len") c.max_len = parse_int(f, v, 3);
  else if (f == "batch_size") c.batch_size = parse_int(f, v, 1);
  else if (f == "lr_main") c.lr_main = parse_double(f, v, 0, 1e9, true, "a positive number");
  else if (f == "lr_gate") c.lr_gate = parse_double(f, v, 0, 1e9, true, "a positive number");
  else if (f == "weight_decay") c.weight_decay = parse_double(f, v, 0, 1e9, false, "a non-negative number");
  else if (f == "grad_clip") c.grad_clip = parse_double(f, v, 0, 1e300, true, "a positive number");
  else if (f == "steps") c.steps = parse_int(f, v, 1);
  else if (f == "gamma_steps") c.gamma_steps = parse_int(f, v, 0);
  else if (f == "log_every") c.log_every = parse_int(f, v, 1);
  else if (f == "eval_every") c.eval_every = parse_int(f, v, 1);
  else if (f == "seed") c.seed = static_cast<std::uint64_t>(parse_int(f, v, 0));
  else if (f == "out_dir") {
    if (v.empty()) detail::bad_flag(f, v, "a directory path");
    c.out_dir = v;
  } else if (f == "data_source") {
    if (v != "dalpha" && v != "text") detail::bad_flag(f, v, "'dalpha' or 'text'");
    c.data_source = v;
  } else if (f == "text") c.text = v;
  else if (f == "oracle") {
    if (v.empty()) detail::bad_flag(f, v, "'mock' or the path of an alpha cache (.jsonl)");
    c.oracle = v;
  } else if (f == "n_per_source") c.n_per_source = parse_int(f, v, 1);
  else if (f == "supervise_layers") {
    if (v == "all") c.supervise_layers.reset();
    else c.supervise_layers = detail::parse_layer_list(f, v);
  } else if (f == "threads") {
    const std::int64_t n = parse_int(f, v, 0);  // checked before narrowing: 2^32 + 1 must not become 1
    if (n > cli::kMaxThreads)
      detail::bad_flag(f, v, ::dea::detail::concat("an integer in [0, ", cli::kMaxThreads, "]"));
    c.threads = static_cast<int>(n);
  }
  else if (f == "eval_batches") c.eval_batches = parse_int(f, v, 1);
  else ::dea::detail::raise("unknown flag --" + f);
}

/// Parses train's command line (argv[1..]) on top of `base`. "--flag value" and "--flag=value" are accepted;
/// --quick fills the preset into every field not given explicitly (apply_quick = false skips that, for a resumed
/// run whose base is the saved configuration).
inline ParsedArgs parse_args(const std::vector<std::string>& args, const TrainConfig& base = {},
                             bool apply_quick = true) {
  ParsedArgs p;
  p.config = base;
  std::vector<std::pair<std::string, std::string>> kv;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      p.help = true;
      continue;
    }
    check(a.size() > 2 && a.compare(0, 2, "--") == 0, "unexpected argument '", a, "' (flags start with --)");
    std::string f = a.substr(2), v;
    const std::size_t eq = f.find('=');
    const bool has_eq = eq != std::string::npos;
    if (has_eq) {
      v = f.substr(eq + 1);
      f = f.substr(0, eq);
    }
    if (detail::is_switch(f)) {
      check(!has_eq || v == "1" || v == "true", "--", f, ": takes no value, got '", v, "'");
      (f == "quick" ? p.config.quick : p.config.resume) = true;
      p.explicit_flags.insert(f);
      continue;
    }
    if (!has_eq) {
      // an unknown flag is reported as such, not as "missing value" at the end of the line
      check(detail::is_value_flag(f), "unknown flag --", f);
      check(i + 1 < args.size() && args[i + 1].compare(0, 2, "--") != 0, "--", f, ": missing value",
            i + 1 < args.size() ? ::dea::detail::concat(" (the next argument is the flag '", args[i + 1], "')") : "");
      v = args[++i];
    }
    kv.emplace_back(f, v);
    p.explicit_flags.insert(f);
  }
  for (const auto& [f, v] : kv) set_flag(p.config, f, v);
  if (p.config.quick && apply_quick) apply_quick_preset(p.config, p.explicit_flags);
  return p;
}

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
inline TrainConfig config_from_json(const nlohmann::json& j, const std::string& source = "config") {
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
    validate(c);
  } catch (const Error& e) {
    std::string m = e.what();
    if (m.compare(0, 5, "dea: ") == 0) m.erase(0, 5);
    ::dea::detail::raise(source + ": " + m);
  }
  return c;
}

inline void write_config(const std::string& path, const TrainConfig& c) {
  data::write_file_atomic(path, to_json(c).dump(2) + "\n");
}

/// Largest config.json accepted (a real one is under 1 KiB).
constexpr std::size_t kMaxConfigBytes = 1 << 20;

/// Reads and checks config.json (see config_from_json); dea::Error naming the file on any problem.
inline TrainConfig read_config(const std::string& path) {
  const std::string text = data::read_file(path, kMaxConfigBytes);
  return config_from_json(io::parse_json_limited(text, path), path);
}

inline nn::ModelConfig model_config(const TrainConfig& c, Index vocab_size, nn::Task task) {
  nn::ModelConfig m;
  m.vocab_size = vocab_size;
  m.d_model = c.d_model;
  m.n_heads = c.n_heads;
  m.n_layers = c.n_layers;
  m.d_ff = c.d_ff;
  m.max_len = c.max_len;
  m.dropout = c.dropout;
  m.n_classes = 2;
  m.pad_id = data::SimpleTokenizer::pad_id;
  m.task = task;
  m.supervise_layers = c.supervise_layers;
  return m;
}

/// The attention options of the models train() builds: the model's dropout, and the Dual-Expert kernel. The tiled
/// kernel (the default) keeps O(T) per layer in a training step instead of every [B, H, T, T] map; the model's
/// evaluation-mode forwards still run the reference kernel and keep the maps (TransformerModel::set_map_policy).
/// Both kernels give the same results to round-off and draw the same dropout masks.
inline Model::AttentionOptionsFn attention_options(const TrainConfig& c, DeaKernel kernel = DeaKernel::tiled) {
  return [dropout = c.dropout, n_layers = c.n_layers, kernel](Index layer) {
    auto o = nn::default_attention_options<DualExpertAttention<Scalar>>(dropout, layer, n_layers);
    o.kernel = kernel;
    return o;
  };
}

// ------------------------------------------------------------------------------------------------------------
// Seed streams
// ------------------------------------------------------------------------------------------------------------

constexpr std::uint64_t kOrderStream = 1, kDropoutStream = 2, kMaskStream = 3, kEvalMaskStream = 4;
/// Subsampling of the training histograms' cells (plots only; no effect on training).
constexpr std::uint64_t kPlotStream = 5;

/// A 64-bit seed for (seed, stream, index) (splitmix64 finaliser over a mix of the three).
inline std::uint64_t stream_seed(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  auto mix = [](std::uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  return mix(mix(mix(seed) ^ (stream * 0xd1b54a32d192ed03ULL)) ^ index);
}

// ------------------------------------------------------------------------------------------------------------
// Data
// ------------------------------------------------------------------------------------------------------------

enum class Split { train, val, test };

inline Split parse_split(const std::string& s) {
  if (s == "train") return Split::train;
  if (s == "val") return Split::val;
  if (s == "test") return Split::test;
  ::dea::detail::raise("--split: expected 'train', 'val' or 'test', got '" + s + "'");
}
inline const char* split_name(Split s) { return s == Split::train ? "train" : (s == Split::val ? "val" : "test"); }

/// The data of a run: D_alpha records (cls) or masked-LM chunks (text), and the tokenizer.
struct RunData {
  std::string source;
  nn::Task task = nn::Task::cls;
  data::SimpleTokenizer tok;
  data::Splits recs;                                        // dalpha
  std::vector<std::vector<std::int64_t>> chunks[3];         // text: train, val, test
  bool mock_mlm_oracle = true;

  std::size_t size(Split s) const {
    const int k = static_cast<int>(s);
    if (task == nn::Task::mlm) return chunks[k].size();
    return (s == Split::train ? recs.train : s == Split::val ? recs.val : recs.test).size();
  }
};

/// Builds the data of a configuration. With `tok` (a saved tokenizer) it is used instead of building one.
inline RunData build_data(const TrainConfig& c, const data::SimpleTokenizer* tok = nullptr) {
  validate(c);
  RunData d;
  d.source = c.data_source;
  if (c.data_source == "dalpha") {
    data::DalphaOptions opt;
    opt.n_per_source = static_cast<std::size_t>(c.n_per_source);
    opt.seed = c.seed;
    std::vector<data::Record> all = data::build_dalpha_synthetic(opt);
    if (c.oracle == "mock") {
      data::attach_mock_oracle(all, c.seed);
    } else {
      detail::with_context("--oracle '" + c.oracle + "': ", [&] {
        const data::AlphaCache cache = io::read_alpha_cache(c.oracle);
        cache.attach(all, true);
      });
    }
    d.recs = data::split_records(all);
    d.task = nn::Task::cls;
    if (tok) {
      d.tok = *tok;
    } else {
      std::vector<std::string> texts;
      texts.reserve(2 * d.recs.train.size());
      for (const auto& r : d.recs.train) {
        texts.push_back(r.q_text);
        texts.push_back(r.k_text);
      }
      d.tok = data::SimpleTokenizer::from_texts(texts);
    }
  } else {
    data::TextSplits ts = detail::with_context("--text '" + c.text + "': ", [&] {
      return data::split_texts(data::read_text_corpus(c.text), c.seed);
    });
    d.task = nn::Task::mlm;
    d.tok = tok ? *tok : data::SimpleTokenizer::from_texts(ts.train);
    d.chunks[0] = data::make_mlm_chunks(ts.train, d.tok, c.max_len);
    d.chunks[1] = data::make_mlm_chunks(ts.val, d.tok, c.max_len);
    d.chunks[2] = data::make_mlm_chunks(ts.test, d.tok, c.max_len);
    d.mock_mlm_oracle = c.oracle == "mock";
  }
  check(d.size(Split::train) > 0, "the training split is empty (raise --n_per_source)");
  return d;
}

/// Collates records / chunks `idx` of a split into a model batch; `mask_rng` draws the MLM masking (text).
inline Batch make_batch(const RunData& d, Split s, const std::vector<std::size_t>& idx, Index max_len,
                        Rng* mask_rng) {
  Batch b;
  if (d.task == nn::Task::cls) {
    const auto& recs = s == Split::train ? d.recs.train : s == Split::val ? d.recs.val : d.recs.test;
    data::PairBatch<Scalar> p = data::collate_pairs<Scalar>(recs, idx, d.tok, max_len);
    b.input_ids = std::move(p.input_ids);
    b.token_type_ids = std::move(p.token_type_ids);
    b.attention_mask = std::move(p.attention_mask);
    b.labels = std::move(p.labels);
    bool any = false;
    for (Index i = 0; i < p.alpha_oracle.numel() && !any; ++i) any = !std::isnan(p.alpha_oracle[i]);
    if (any) b.alpha_oracle = std::move(p.alpha_oracle);
  } else {
    check(mask_rng != nullptr, "make_batch: masked-LM batches need an Rng");
    data::MlmOptions o;
    o.mock_oracle = d.mock_mlm_oracle;
    data::MlmBatch<Scalar> m =
        data::collate_mlm<Scalar>(d.chunks[static_cast<int>(s)], idx, d.tok.vocab_size(), *mask_rng, o);
    b.input_ids = std::move(m.input_ids);
    b.token_type_ids = std::move(m.token_type_ids);
    b.attention_mask = std::move(m.attention_mask);
    b.labels = std::move(m.labels);
    b.alpha_oracle = std::move(m.alpha_oracle);
  }
  return b;
}

/// The training batch order: batch `step` (1-based) is batch (step-1) % n of the permutation of epoch
/// (step-1) / n, drawn from Rng(stream_seed(seed, kOrderStream, epoch)).
class BatchOrder {
public:
  BatchOrder(std::size_t n, std::size_t batch_size, std::uint64_t seed) : n_(n), bs_(batch_size), seed_(seed) {
    check(n > 0 && batch_size > 0, "BatchOrder: empty split or batch size 0");
    per_epoch_ = (n + batch_size - 1) / batch_size;
  }
  std::size_t batches_per_epoch() const { return per_epoch_; }
  const std::vector<std::size_t>& at(std::int64_t step) {
    check(step >= 1, "BatchOrder::at: step must be >= 1, got ", step);
    const std::uint64_t s0 = static_cast<std::uint64_t>(step - 1);
    const std::uint64_t epoch = s0 / per_epoch_;
    if (!have_ || epoch != epoch_) {
      Rng rng(stream_seed(seed_, kOrderStream, epoch));
      batches_ = data::make_batches(n_, bs_, true, &rng);
      epoch_ = epoch;
      have_ = true;
    }
    return batches_[static_cast<std::size_t>(s0 % per_epoch_)];
  }

private:
  std::size_t n_, bs_, per_epoch_ = 0;
  std::uint64_t seed_;
  std::uint64_t epoch_ = 0;
  bool have_ = false;
  std::vector<std::vector<std::size_t>> batches_;
};

// ------------------------------------------------------------------------------------------------------------
// Evaluation
// ------------------------------------------------------------------------------------------------------------

struct EvalResult {
  std::string split;
  std::size_t n_batches = 0;
  std::size_t n_examples = 0;
  double accuracy = 0;
  double task_loss = 0;
  eval::AlphaMetrics alpha;
  double decision_side_acc = eval::kNaN;
  std::size_t n_decision_pairs = 0;
  /// The pooled labelled cells of the last layer (alpha-hat, oracle), in batch order, for the histogram plots.
  std::vector<double> alpha_hat_points, alpha_oracle_points;
};

inline nlohmann::json to_json(const EvalResult& r) {
  auto num = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); };
  nlohmann::json j;
  j["split"] = r.split;
  j["n_batches"] = r.n_batches;
  j["n_examples"] = r.n_examples;
  j["accuracy"] = num(r.accuracy);
  j["task_loss"] = num(r.task_loss);
  j["alpha_mae"] = num(r.alpha.mae);
  j["alpha_pearson"] = num(r.alpha.pearson);
  j["alpha_spearman"] = num(r.alpha.spearman);
  j["band_agreement"] = num(r.alpha.band_agreement);
  j["alpha_hat_mean"] = num(r.alpha.alpha_hat_mean);
  j["alpha_oracle_mean"] = num(r.alpha.alpha_oracle_mean);
  j["alpha_n_points"] = r.alpha.n_points;
  j["decision_side_acc"] = num(r.decision_side_acc);
  j["n_decision_pairs"] = r.n_decision_pairs;
  return j;
}

/// Appends the labelled cells (oracle not NaN, key real) of the last layer's alpha-hat in a forward cache.
inline void collect_last_layer(const Model::Cache& c, const Batch& b, std::vector<double>& ah,
                               std::vector<double>& ao) {
  if (c.layers.empty() || b.alpha_oracle.dim() == 0) return;
  const auto& a = c.layers.back().attn;
  const Index H = a.alpha_hat.size() / std::max<Index>(1, c.B * c.T * c.T);
  Tensor<Scalar> t({c.B, H, c.T, c.T});
  check(static_cast<Index>(a.alpha_hat.size()) == t.numel(), "collect_last_layer: alpha-hat size mismatch");
  std::copy(a.alpha_hat.begin(), a.alpha_hat.end(), t.data.data());
  eval::collect_labelled_cells(t, b.alpha_oracle, b.attention_mask.dim() ? &b.attention_mask : nullptr, ah, ao);
}

/// Arg-max predictions of logits rows.
inline std::vector<std::int64_t> predictions(const Mat<Scalar>& logits) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(logits.rows()));
  for (Index r = 0; r < logits.rows(); ++r) {
    Index k = 0;
    logits.row(r).maxCoeff(&k);
    p[static_cast<std::size_t>(r)] = k;
  }
  return p;
}

/// eval.py's evaluate: eval mode, gamma = 0, batches in order (at most max_batches, 0 = all). The alpha metrics
/// pool the last layer's labelled cells. The MLM masking of batch k is drawn from stream kEvalMaskStream.
inline EvalResult evaluate(Model& model, const RunData& d, Split s, Index batch_size, Index max_len,
                           std::uint64_t seed, std::size_t max_batches = 0) {
  EvalResult r;
  r.split = split_name(s);
  const std::size_t n = d.size(s);
  if (n == 0) return r;
  auto batches = data::make_batches(n, static_cast<std::size_t>(batch_size), false);
  if (max_batches && batches.size() > max_batches) batches.resize(max_batches);
  eval::AccuracyCounter acc;
  eval::DecisionSideAccumulator side;
  std::vector<double> ah, ao;
  double loss_sum = 0;
  Model::Cache cache;
  for (std::size_t k = 0; k < batches.size(); ++k) {
    Rng mrng(stream_seed(seed, kEvalMaskStream, k));
    const Batch b = make_batch(d, s, batches[k], max_len, &mrng);
    const auto out = model.forward(b, Scalar(0), false, nullptr, cache);
    loss_sum += static_cast<double>(out.task_loss);
    const std::vector<std::int64_t> lab(b.labels.ptr(), b.labels.ptr() + b.labels.numel());
    acc.add(predictions(out.logits), lab);
    if (!out.layer_stats.empty() && out.layer_supervised.back())
      side.add(out.layer_stats.back().decision_side_acc, static_cast<std::size_t>(out.layer_stats.back().n_decision_pairs));
    collect_last_layer(cache, b, ah, ao);
    r.n_examples += batches[k].size();
  }
  r.n_batches = batches.size();
  r.accuracy = acc.value();
  r.task_loss = loss_sum / static_cast<double>(batches.size());
  r.alpha = eval::alpha_metrics(ah, ao);
  r.decision_side_acc = side.value();
  r.n_decision_pairs = side.n_pairs;
  r.alpha_hat_points = std::move(ah);
  r.alpha_oracle_points = std::move(ao);
  return r;
}

// ------------------------------------------------------------------------------------------------------------
// Paris probe
// ------------------------------------------------------------------------------------------------------------

struct ParisProbe {
  bool ok = false;
  std::string error;             ///< why it did not run (a token is missing)
  Index qi = -1, ki = -1;
  std::vector<double> per_layer;  ///< mean over heads of alpha-hat[qi -> ki]
};

/// "Paris is capital of France" as one segment (max_len 32); eval mode, no oracle, gamma 0.
inline ParisProbe paris_probe(Model& model, const data::SimpleTokenizer& tok) {
  ParisProbe p;
  const data::Encoding e = tok.encode("Paris is capital of France", 32);
  for (Index t = 0; t < e.size(); ++t) {
    const std::string& s = e.tokens[static_cast<std::size_t>(t)];
    if (s == "paris") p.qi = t;                // the last sub-token of "paris"
    if (s == "france" && p.ki < 0) p.ki = t;   // the first sub-token of "france"
  }
  for (const char* w : {"paris", "france"})
    if (!tok.contains(w)) p.error = std::string("token '") + w + "' is not in the vocabulary";
  if (p.qi < 0 || p.ki < 0 || !p.error.empty()) {
    if (p.error.empty()) p.error = "token not found in the encoding";
    return p;
  }
  const Index T = e.size();
  if (T > model.config().max_len) {
    p.error = ::dea::detail::concat("the probe sentence has ", T, " tokens, more than the model's max_len ",
                                    model.config().max_len);
    return p;
  }
  Batch b;
  b.input_ids = Tensor<std::int64_t>({1, T});
  for (Index t = 0; t < T; ++t) b.input_ids[t] = e.input_ids[static_cast<std::size_t>(t)];
  b.attention_mask = Tensor<std::uint8_t>({1, T}, 1);
  b.token_type_ids = Tensor<std::int64_t>({1, T}, 0);
  Model::Cache c;
  model.forward(b, Scalar(0), false, nullptr, c);
  for (Index l = 0; l < model.n_layers(); ++l) {
    const auto& a = c.layers[static_cast<std::size_t>(l)].attn;
    const Index H = model.config().n_heads;
    double s = 0;
    for (Index h = 0; h < H; ++h) s += static_cast<double>(a.alpha_hat[static_cast<std::size_t>(a.cell(0, h, p.qi, p.ki, H))]);
    p.per_layer.push_back(s / static_cast<double>(H));
  }
  p.ok = true;
  return p;
}

inline void print_paris_probe(const ParisProbe& p) {
  if (!p.ok) {
    fmt::print("Paris probe skipped: {}\n", p.error);
    return;
  }
  fmt::print("Paris probe (eval mode, no oracle): alpha_hat[paris(pos {}) -> france(pos {})], mean over heads\n", p.qi,
             p.ki);
  for (std::size_t l = 0; l < p.per_layer.size(); ++l)
    fmt::print("  layer {}: {:.4f}   (paper target ~0.9)\n", l, p.per_layer[l]);
}

// ------------------------------------------------------------------------------------------------------------
// Checkpoints
// ------------------------------------------------------------------------------------------------------------

inline std::string checkpoint_path(const std::string& dir) { return (std::filesystem::path(dir) / "checkpoint.safetensors").string(); }
inline std::string config_path(const std::string& dir) { return (std::filesystem::path(dir) / "config.json").string(); }
inline std::string tokenizer_path(const std::string& dir) { return (std::filesystem::path(dir) / "tokenizer.txt").string(); }

/// The Rng state stored in a checkpoint of step `step` (that of the next step's dropout Rng).
inline std::array<std::uint64_t, 4> checkpoint_rng_state(std::uint64_t seed, std::int64_t step) {
  return Rng(stream_seed(seed, kDropoutStream, static_cast<std::uint64_t>(step + 1))).state();
}

/// Writes tokenizer.txt, config.json and checkpoint.safetensors into cfg.out_dir (each atomically).
inline void save_checkpoint(const std::string& dir, const TrainConfig& cfg, const data::SimpleTokenizer& tok,
                            Model& model, const optim::AdamW<Scalar>* opt, std::int64_t step) {
  std::filesystem::create_directories(dir);
  tok.save(tokenizer_path(dir));
  write_config(config_path(dir), cfg);
  io::SafeTensors st(checkpoint_path(dir));
  io::put_parameters(st, model.parameters(), io::DType::F32);
  if (opt)
    for (const auto& kv : opt->state("optim.")) st.put("optim." + kv.first.substr(6), kv.second, io::DType::F32);
  st.put("train.step", Tensor<std::int64_t>(Shape{}, step), io::DType::I64);
  Tensor<std::int64_t> rs({4});
  const auto s = checkpoint_rng_state(cfg.seed, step);
  for (int i = 0; i < 4; ++i) std::memcpy(&rs[i], &s[static_cast<std::size_t>(i)], sizeof(std::uint64_t));
  st.put("train.rng_state", rs, io::DType::I64);
  st.set_metadata({{"format", "dea-train-checkpoint"}, {"step", std::to_string(step)}});
  st.save(checkpoint_path(dir));
}

/// Loads checkpoint.safetensors of `dir` into `model` (and `opt` when given). Returns the step stored (0 for a
/// checkpoint exported from the reference, which has no "train.step"). Everything is validated first; any
/// problem is a dea::Error naming the file. `seed` (when given) is checked against the stored Rng state.
inline std::int64_t load_checkpoint(const std::string& dir, Model& model, optim::AdamW<Scalar>* opt,
                                    std::optional<std::uint64_t> seed = std::nullopt) {
  const std::string path = checkpoint_path(dir);
  const io::SafeTensors st = io::SafeTensors::load(path);
  std::int64_t step = 0;
  if (st.has("train.step")) {
    const Tensor<std::int64_t> t = st.get<std::int64_t>("train.step");
    check(t.numel() == 1 && t[0] >= 0, path, ": 'train.step' must hold one non-negative value");
    step = t[0];
  }
  if (seed && st.has("train.rng_state")) {
    const Tensor<std::int64_t> t = st.get<std::int64_t>("train.rng_state");
    check(t.numel() == 4, path, ": 'train.rng_state' must hold 4 values");
    const auto want = checkpoint_rng_state(*seed, step);
    for (int i = 0; i < 4; ++i) {
      std::uint64_t u;
      std::memcpy(&u, &t[i], sizeof(u));
      check(u == want[static_cast<std::size_t>(i)], path, ": the stored Rng state does not match seed ", *seed,
            " at step ", step, " (checkpoint of another run?)");
    }
  }
  std::map<std::string, Tensor<Scalar>> ost;
  if (opt) {
    for (const std::string& name : st.names())
      if (name.compare(0, 6, "optim.") == 0) ost.emplace(name, st.get<Scalar>(name));
    check(!ost.empty() || step == 0, path, ": no optimiser state ('optim.*') to resume from");
  }
  // A state_dict exported from the reference also holds its positional table, a buffer [1, max_len, D] whose
  // name ends in "pe". When there is one it replaces ours (the reference's float32 sin/cos differ from ours by
  // an ulp in a few cells): its first max_len rows, so a longer table (the reference's default 512) fits.
  std::string pe_name;
  for (const std::string& name : st.names()) {
    if (name.compare(0, 6, "optim.") == 0 || name.compare(0, 6, "train.") == 0) continue;
    if (name == "pe" || (name.size() > 3 && name.compare(name.size() - 3, 3, ".pe") == 0)) {
      check(pe_name.empty(), path, ": two positional tables ('", pe_name, "' and '", name, "')");
      pe_name = name;
    }
  }
  Mat<Scalar> pe_table;
  if (!pe_name.empty()) {
    const Shape shp = st.shape(pe_name);
    const Index L = model.positional().table().rows(), D = model.positional().table().cols();
    const bool ok = (shp.size() == 3 && shp[0] == 1 && shp[1] >= L && shp[2] == D) ||
                    (shp.size() == 2 && shp[0] >= L && shp[1] == D);
    check(ok, path, ": positional table '", pe_name, "': expected shape [1, >=", L, ", ", D, "] or [>=", L, ", ",
          D, "], got ", shape_str(shp));
    const Tensor<Scalar> t = st.get<Scalar>(pe_name);
    pe_table = Eigen::Map<const Mat<Scalar>>(t.ptr(), shp[shp.size() - 2], D).topRows(L);
  }
  // Parameters must be finite: NaN or Inf in a checkpoint would only turn every later result into NaN.
  for (const Param<Scalar>* p : model.parameters())
    if (st.has(p->name) && io::dtype_is_floating(st.dtype(p->name))) {
      const Tensor<Scalar> v = st.get<Scalar>(p->name);
      for (Index i = 0; i < v.numel(); ++i)
        check(std::isfinite(v[i]), path, ": parameter '", p->name, "' holds a non-finite value (", v[i],
              ") at flat index ", i);
    }
  check(pe_table.allFinite(), path, ": positional table '", pe_name, "' holds a non-finite value");
  // All or nothing: load_parameters and load_state each check everything before they change anything; when
  // the optimiser state is refused after the parameters were loaded, the parameters are put back.
  std::vector<std::string> ignore = {"optim.", "train.", "mlm_head.weight"};
  if (!pe_name.empty()) ignore.push_back(pe_name);
  std::vector<Vec<Scalar>> saved;
  for (const Param<Scalar>* p : model.parameters()) saved.push_back(p->value);
  io::load_parameters(model.parameters(), st, true, ignore);
  try {
    if (opt && !ost.empty()) opt->load_state(ost, "optim.");
  } catch (...) {
    const ParamList<Scalar> ps = model.parameters();
    for (std::size_t i = 0; i < ps.size(); ++i) ps[i]->value = std::move(saved[i]);
    throw;
  }
  if (!pe_name.empty()) model.positional().set_table(pe_table);
  return step;
}

// ------------------------------------------------------------------------------------------------------------
// Training
// ------------------------------------------------------------------------------------------------------------

/// Builds the reference's optimiser for a configuration.
inline optim::AdamW<Scalar> make_optimizer(Model& model, const TrainConfig& c) {
  optim::GroupConfig gm = optim::main_group_defaults(), gg = optim::gate_group_defaults();
  gm.lr = c.lr_main;
  gm.weight_decay = c.weight_decay;
  gm.max_grad_norm = c.grad_clip;
  gg.lr = c.lr_gate;
  gg.max_grad_norm = c.grad_clip;
  return optim::build_optimizer(model.parameters(), gm, gg);
}

struct TrainOptions {
  bool verbose = true;          ///< progress line, log lines, isolation report
  bool write_log = true;        ///< out_dir/train_log.jsonl
  bool evaluate = true;         ///< periodic validation
  bool checkpoint = true;       ///< checkpoints at each evaluation and at the end
  /// Where the plots go (empty: none): at each evaluation alpha_hist_train_step<N>.svg (alpha-hat against the
  /// oracle on up to 4,000 labelled cells of the last layer per step since the previous evaluation),
  /// alpha_hist_val_step<N>.svg and training_curves.svg (from train_log.jsonl).
  std::string plot_dir;
  /// A fresh run (not cfg.resume) into an out_dir that holds another run's files (run_files): false refuses it
  /// (dea::Error, nothing touched), true deletes those files first, so the directory never mixes two runs.
  bool overwrite = false;
  /// Called after every optimiser step with (step, task_loss, loss_gate, model) (progress hooks, tests).
  std::function<void(std::int64_t, double, double, Model&)> on_step;
};

struct TrainResult {
  std::int64_t start_step = 0;   ///< step of the checkpoint resumed from (0 = fresh)
  std::int64_t last_step = 0;
  double last_task_loss = 0, last_loss_gate = 0;
  std::optional<EvalResult> last_eval;
  nn::ModelIsolationReport isolation;
  double seconds = 0;
  double seconds_per_step = 0;
  bool stopped_nonfinite = false;
  std::string message;
};

namespace detail {

inline bool stdout_is_tty() {
#if defined(__unix__) || defined(__APPLE__)
  return ::isatty(::fileno(stdout)) != 0;
#else
  return false;
#endif
}

inline std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = static_cast<long>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, static_cast<int>((t % 3600) / 60));
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, static_cast<int>(t % 60));
  return fmt::format("{}s", t);
}

inline nlohmann::json num(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

}  // namespace detail

/// The files of a run in its out_dir that a fresh run would replace: checkpoint, config, tokenizer, log, the
/// evaluation results and the plots.
inline std::vector<std::filesystem::path> run_files(const std::string& out_dir) {
  std::vector<std::filesystem::path> found;
  std::error_code ec;
  for (const char* f : {"checkpoint.safetensors", "config.json", "tokenizer.txt", "train_log.jsonl", "eval_train.json",
                        "eval_val.json", "eval_test.json", "training_curves.svg"}) {
    const std::filesystem::path p = std::filesystem::path(out_dir) / f;
    if (std::filesystem::exists(p, ec)) found.push_back(p);
  }
  // the α̂ histograms of train (alpha_hist_<split>_step<N>.svg) and eval (alpha_hist_<split>.svg)
  if (std::filesystem::is_directory(out_dir, ec))
    for (const auto& e : std::filesystem::directory_iterator(out_dir, ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("alpha_hist_", 0) == 0 && n.size() > 4 && n.compare(n.size() - 4, 4, ".svg") == 0)
        found.push_back(e.path());
    }
  return found;
}

/// Refuses (dea::Error naming the directory and a file) a fresh run into a directory holding another run's files,
/// unless `overwrite`.
inline void check_fresh_run_dir(const std::string& out_dir, bool overwrite) {
  const auto old = run_files(out_dir);
  check(old.empty() || overwrite, "--out_dir '", out_dir, "' already holds a run (",
        old.empty() ? std::string() : old.front().filename().string(),
        "): pass --resume to continue it, --overwrite to replace it with a new run, or another --out_dir");
}

/// train.py's loop (see the file comment for the seed streams). With cfg.resume, the checkpoint in cfg.out_dir is
/// loaded (its tokenizer too) and the run continues from its step. Throws dea::Error on bad input, on a failed
/// isolation check and on a non-finite loss or gradient (after printing a message; the last good checkpoint on
/// disk is left as it was).
inline TrainResult run_training(const TrainConfig& cfg, const TrainOptions& o = {}) {
  validate(cfg);
  const bool fresh_dir = !cfg.resume && (o.write_log || o.checkpoint || o.evaluate);
  if (fresh_dir) check_fresh_run_dir(cfg.out_dir, o.overwrite);
  if (cfg.threads > 0) set_num_threads(cfg.threads);
  const auto t_start = std::chrono::steady_clock::now();
  TrainResult res;

  std::optional<data::SimpleTokenizer> saved_tok;
  if (cfg.resume) {
    check(std::filesystem::exists(checkpoint_path(cfg.out_dir)), "--resume: no checkpoint at ",
          checkpoint_path(cfg.out_dir));
    saved_tok = data::SimpleTokenizer::load(tokenizer_path(cfg.out_dir));
  }
  const RunData d = build_data(cfg, saved_tok ? &*saved_tok : nullptr);
  Rng init_rng(cfg.seed);
  Model model(model_config(cfg, d.tok.vocab_size(), d.task), init_rng, attention_options(cfg));
  optim::AdamW<Scalar> opt = make_optimizer(model, cfg);
  if (fresh_dir)  // --overwrite: the old run's files go only now that the new run's data and model exist
    for (const auto& p : run_files(cfg.out_dir)) {
      std::error_code ec;
      std::filesystem::remove(p, ec);
      check(!ec, "--overwrite: cannot delete '", p.string(), "': ", ec.message());
    }
  std::int64_t step0 = 0;
  if (cfg.resume) {
    step0 = load_checkpoint(cfg.out_dir, model, &opt, cfg.seed);
    check(step0 <= cfg.steps, "--resume: the checkpoint is at step ", step0, ", beyond --steps ", cfg.steps);
  }
  res.start_step = step0;

  std::size_t n_params = 0;
  for (auto* p : model.parameters()) n_params += static_cast<std::size_t>(p->numel());
  if (o.verbose)
    fmt::print("data: {} train / {} val / {} test ({}), vocab {}, model {:.2f}M parameters (D={} H={} L={} d_ff={}), "
               "{} steps, batch {}, gamma_steps {}{}\n",
               d.size(Split::train), d.size(Split::val), d.size(Split::test), d.source, d.tok.vocab_size(),
               static_cast<double>(n_params) / 1e6, cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.d_ff, cfg.steps,
               cfg.batch_size, cfg.gamma_steps, step0 ? fmt::format(", resumed at step {}", step0) : std::string());

  BatchOrder order(d.size(Split::train), static_cast<std::size_t>(cfg.batch_size), cfg.seed);

  // isolation check on the first batch
  {
    Rng mrng(stream_seed(cfg.seed, kMaskStream, 1));
    const Batch b0 = make_batch(d, Split::train, order.at(1), cfg.max_len, &mrng);
    if (b0.alpha_oracle.dim() && cfg.n_layers > 0) {
      res.isolation = model.verify_gradient_isolation(b0, Scalar(0.5), cfg.seed);
      const auto& r = res.isolation;
      if (o.verbose)
        fmt::print("gradient isolation: task->gate {:.3g}  task->W_rel {:.3g}  gate->main {:.3g}  gate->gate {:.3g}  {}\n",
                   r.task_gate_grad, r.task_rel_grad, r.gate_main_grad, r.gate_gate_grad, r.ok ? "OK" : "FAILED");
      check(r.ok, "gradient isolation check failed on the first batch (task->gate ", r.task_gate_grad, ", task->W_rel ",
            r.task_rel_grad, ", gate->main ", r.gate_main_grad, ", gate->gate ", r.gate_gate_grad, ")");
    } else if (o.verbose) {
      fmt::print("gradient isolation: skipped (no oracle on the first batch)\n");
    }
  }

  std::ofstream log;
  if (o.write_log) {
    std::filesystem::create_directories(cfg.out_dir);
    const std::string lp = (std::filesystem::path(cfg.out_dir) / "train_log.jsonl").string();
    if (step0 && std::filesystem::exists(lp)) {
      // A run killed after its last checkpoint logged steps that the resumed run repeats: keep the lines up to
      // the checkpoint's step (and drop a line cut short by the kill), so every step is logged once.
      std::string kept;
      for (const std::string& line : data::split_lines(data::read_file(lp))) {
        if (io::detail::json_nesting_depth(line) > io::kMaxJsonDepth) continue;
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
            j["step"].get<std::int64_t>() <= step0)
          kept += line + "\n";
      }
      data::write_file_atomic(lp, kept);
    } else if (step0 > 0) {
      fmt::print(stderr, "warning: {} is missing; the resumed run's log starts at step {} (the earlier steps are not "
                 "in it)\n", lp, step0 + 1);
    }
    log.open(lp, step0 ? std::ios::app : std::ios::trunc);
    check(static_cast<bool>(log), "cannot open ", lp, " for writing");
  }
  auto write_log = [&](const nlohmann::json& j) {
    if (o.write_log) {
      log << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
      log.flush();
    }
  };

  const bool tty = o.verbose && detail::stdout_is_tty();
  std::vector<double> hist_hat, hist_oracle;  // training cells for the next alpha_hist_train_step<N>.svg
  auto plot = [&](const std::string& name, const auto& draw) {  // a failed plot warns and training goes on
    try {
      std::filesystem::create_directories(o.plot_dir);
      draw().save((std::filesystem::path(o.plot_dir) / name).string());
    } catch (const std::exception& e) {
      fmt::print(stderr, "warning: plot {} not written: {}\n", name, e.what());
    }
  };
  auto do_eval_and_checkpoint = [&](std::int64_t step) {
    if (o.evaluate && d.size(Split::val) > 0) {
      EvalResult er = evaluate(model, d, Split::val, cfg.batch_size, cfg.max_len, cfg.seed,
                               static_cast<std::size_t>(cfg.eval_batches));
      if (o.verbose) {
        if (tty) fmt::print("\n");
        fmt::print("[eval step {}] val: acc {:.4f}  task_loss {:.4f}  alpha_mae {:.4f}  pearson {:.4f}  side_acc {:.4f} "
                   "({} pairs)\n",
                   step, er.accuracy, er.task_loss, er.alpha.mae, er.alpha.pearson, er.decision_side_acc,
                   er.n_decision_pairs);
      }
      nlohmann::json j = to_json(er);
      j["step"] = step;
      j["event"] = "eval";
      write_log(j);
      if (!o.plot_dir.empty()) {
        const double g = static_cast<double>(optim::gamma_mix<Scalar>(std::max<std::int64_t>(0, step - 1), cfg.gamma_steps));
        if (!hist_hat.empty())
          plot("alpha_hist_train_step" + std::to_string(step) + ".svg", [&] {
            return plots::alpha_histogram(hist_hat, hist_oracle,
                                          fmt::format("train step {}: alpha_hat vs oracle (g_mix={:.2f})", step, g));
          });
        plot("alpha_hist_val_step" + std::to_string(step) + ".svg", [&] {
          return plots::alpha_histogram(er.alpha_hat_points, er.alpha_oracle_points, fmt::format("val step {}", step));
        });
      }
      hist_hat.clear();
      hist_oracle.clear();
      er.alpha_hat_points = {};
      er.alpha_oracle_points = {};
      res.last_eval = std::move(er);
    }
    if (!o.plot_dir.empty() && o.write_log)
      plot("training_curves.svg", [&] {
        return plots::training_curves(data::read_file((std::filesystem::path(cfg.out_dir) / "train_log.jsonl").string()),
                                      "training: " + cfg.out_dir);
      });
    if (o.checkpoint) save_checkpoint(cfg.out_dir, cfg, d.tok, model, &opt, step);
  };

  Model::Cache cache;
  std::int64_t done = 0;
  const auto t_loop = std::chrono::steady_clock::now();
  for (std::int64_t step = step0 + 1; step <= cfg.steps; ++step) {
    const Scalar gamma = optim::gamma_mix<Scalar>(step - 1, cfg.gamma_steps);
    Rng mrng(stream_seed(cfg.seed, kMaskStream, static_cast<std::uint64_t>(step)));
    const Batch b = make_batch(d, Split::train, order.at(step), cfg.max_len, &mrng);
    Rng drng(stream_seed(cfg.seed, kDropoutStream, static_cast<std::uint64_t>(step)));
    const auto out = model.forward(b, gamma, true, &drng, cache);
    const double task = static_cast<double>(out.task_loss), gate = static_cast<double>(out.loss_gate);
    if (!std::isfinite(task) || !std::isfinite(gate)) {
      res.stopped_nonfinite = true;
      res.message = fmt::format("non-finite loss at step {} (task_loss {}, loss_gate {}); stopping. The last good "
                                "checkpoint in {} is kept.",
                                step, task, gate, cfg.out_dir);
      if (tty) fmt::print("\n");
      ::dea::detail::raise(res.message);
    }
    opt.zero_grad();
    model.backward(cache);
    const optim::GradNorms norms = opt.clip_grad_norms();
    if (!norms.all_finite()) {
      res.stopped_nonfinite = true;
      res.message = fmt::format("non-finite gradient norm at step {} (main {}, gate {}); stopping. The last good "
                                "checkpoint in {} is kept.",
                                step, norms.at("main"), norms.at("gate"), cfg.out_dir);
      if (tty) fmt::print("\n");
      ::dea::detail::raise(res.message);
    }
    opt.step();
    ++done;
    res.last_step = step;
    res.last_task_loss = task;
    res.last_loss_gate = gate;
    if (!o.plot_dir.empty()) {
      // train.py's histogram sample: the last layer's labelled cells, at most 4,000 per step (a uniform subset)
      std::vector<double> ah, ao;
      collect_last_layer(cache, b, ah, ao);
      const std::size_t k = std::min<std::size_t>(ah.size(), 4000);
      const std::vector<std::size_t> idx =
          k < ah.size() ? eval::subsample_indices(ah.size(), k, stream_seed(cfg.seed, kPlotStream, static_cast<std::uint64_t>(step)))
                        : std::vector<std::size_t>();
      for (std::size_t i = 0; i < k; ++i) {
        hist_hat.push_back(ah[idx.empty() ? i : idx[i]]);
        hist_oracle.push_back(ao[idx.empty() ? i : idx[i]]);
      }
    }
    if (o.on_step) o.on_step(step, task, gate, model);

    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_loop).count();
    const double rate = static_cast<double>(done) / std::max(el, 1e-9);
    // logged steps depend on the step number alone (a resumed run logs what an uninterrupted one does); the
    // console also shows the first step of a resumed run
    const bool log_now = step % cfg.log_every == 0 || step == 1 || step == cfg.steps;
    const bool show_now = log_now || step == step0 + 1;
    if (log_now) {
      std::vector<double> ah, ao;
      collect_last_layer(cache, b, ah, ao);
      const GateStats gs = out.layer_stats.empty() ? GateStats{} : out.layer_stats.back();
      nlohmann::json j;
      j["step"] = step;
      j["gamma"] = static_cast<double>(gamma);
      j["task_loss"] = detail::num(task);
      j["loss_gate"] = detail::num(gate);
      j["grad_norm_main"] = detail::num(norms.at("main"));
      j["grad_norm_gate"] = detail::num(norms.at("gate"));
      j["loss_reg"] = detail::num(gs.loss_reg);
      j["loss_spot"] = detail::num(gs.loss_spot);
      j["loss_decision"] = detail::num(gs.loss_decision);
      j["decision_side_acc"] = detail::num(gs.decision_side_acc);
      j["n_decision_pairs"] = gs.n_decision_pairs;
      j["n_labelled"] = gs.n_labelled;
      j["alpha_hat_mean"] = detail::num(eval::mean(ah));
      j["alpha_mae"] = detail::num(eval::alpha_mae(ah, ao));
      j["steps_per_s"] = rate;
      write_log(j);
    }
    if (o.verbose && (tty || show_now)) {
      const double eta = static_cast<double>(cfg.steps - step) / rate;
      fmt::print("{}step {:>6}/{}  gamma {:.3f}  task {:.4f}  gate {:.4f}  |g| main {:.3f} gate {:.3f}  {:.2f} it/s  "
                 "ETA {}{}",
                 tty ? "\r" : "", step, cfg.steps, static_cast<double>(gamma), task, gate, norms.at("main"),
                 norms.at("gate"), rate, detail::fmt_duration(eta), tty ? (show_now ? "\n" : "   ") : "\n");
      std::fflush(stdout);
    }
    if (step % cfg.eval_every == 0 || step == cfg.steps) do_eval_and_checkpoint(step);
  }
  if (done == 0 && o.checkpoint && !cfg.resume) do_eval_and_checkpoint(step0);
  const auto t_end = std::chrono::steady_clock::now();
  res.seconds = std::chrono::duration<double>(t_end - t_start).count();
  res.seconds_per_step =
      done ? std::chrono::duration<double>(t_end - t_loop).count() / static_cast<double>(done) : 0.0;
  if (o.verbose) {
    fmt::print("done: {} steps in {:.1f} s ({:.4f} s/step incl. evaluation)\n", done, res.seconds,
               res.seconds_per_step);
    print_paris_probe(paris_probe(model, d.tok));
  }
  return res;
}

/// The eval program's work: loads checkpoint + config + tokenizer of `dir`, rebuilds the data from the saved
/// configuration and evaluates `split` at gamma = 0 (all batches). Optionally returns the Paris probe.
inline EvalResult evaluate_checkpoint(const std::string& dir, Split split, ParisProbe* probe = nullptr) {
  const TrainConfig cfg = read_config(config_path(dir));
  const data::SimpleTokenizer tok = data::SimpleTokenizer::load(tokenizer_path(dir));
  // a data file the run's config.json names (--text, --oracle) is reported with that origin
  const RunData d = detail::with_context(config_path(dir) + ": ", [&] { return build_data(cfg, &tok); });
  Rng init_rng(cfg.seed);
  Model model(model_config(cfg, tok.vocab_size(), d.task), init_rng);
  // with the seed: a config.json whose seed is not the run's (its splits would differ) is refused
  load_checkpoint(dir, model, nullptr, cfg.seed);
  EvalResult r = evaluate(model, d, split, cfg.batch_size, cfg.max_len, cfg.seed, 0);
  if (probe) *probe = paris_probe(model, tok);
  return r;
}

}  // namespace dea::pipeline
