// examples/experiments/lm_compare/lm_compare.cpp: the token-routed seed's comparison, scaled down to a 2-core CPU.
//
// Trains four decoder-only byte-level language models (dea::lm::DecoderLM through train::lm_run::run_training, the
// trainer of `dea train --model lm`) at matched parameter counts, over paired seeds, on one text corpus:
//   mha_dense     multi-head attention + dense SwiGLU of width W (the baseline)
//   mha_trmoe     multi-head attention + TR-MoE: shared expert of width W - I plus I routed (E experts of I / E,
//                 top-k), the framework's "equal stored FFN width" (3 D W parameters per layer either way)
//   trmha2_trmoe  token-routed attention v2 + the same TR-MoE (its adapters' parameters are paid for by a narrower
//                 shared expert)
//   dea_dense     causal Dual-Expert attention + dense SwiGLU (its extra attention parameters are paid for by a
//                 narrower dense width)
// A variant's free width (dense W, or the shared expert's width) is moved in steps of 8 (of 1 where 8 misses by
// more than 0.5%) to the count nearest the baseline's; the report gives every count. Seed s draws the initial weights and the training batches (the batch
// of step k depends on (s, k) alone), so the variants of one seed see the same bytes in the same order.
//
// Per run: the validation curve (periodic evaluations on --eval_batches batches), the final NLL and perplexity on
// the whole validation split (every validation byte after the first scored once, windows of --max_len + 1), and
// the training throughput (tokens of the training steps / their wall time; evaluations excluded). Per comparison
// (idea vs baseline, d_s = NLL_idea,s - NLL_base,s): mean and sd of d, paired t-test, exact sign test, paired
// bootstrap 95% CI (10000 resamples, dea::Rng(0)), the verdict computed by the rule in the report, and for TR-MoE
// vs dense whether the direction agrees with the framework's recorded result. Writes DIR/lm_compare_report.json,
// DIR/lm_compare_val_curves.svg and DIR/lm_compare_paired.svg, and prints a summary table.
//
// Each run lives in DIR/runs/<variant>_s<seed>/ (the trainer's run directory); a run that finished is reused when
// its configuration and corpus are the same (its result.json), an interrupted one resumes from its checkpoint,
// so an experiment stopped part way continues where it was. --fresh retrains everything.
//
// The corpus: any text file (--text). The documented protocol uses the King James Bible from Debian's
// bible-kjv package (public domain): examples/experiments/lm_compare/get_corpus.sh writes it (docs/lm.md).
// Exit status: 0 done; 1 a failure (a training failed, out of memory, a write error); 2 bad command line.
#include <dea/core/atomic_file.hpp>
#include <dea/core/files.hpp>
#include <dea/core/parallel.hpp>
#include <dea/core/rng.hpp>
#include <dea/eval/stats.hpp>
#include <dea/plot/svg.hpp>
#include <dea/cli/flags.hpp>
#include <dea/train/lm.hpp>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <set>
#include <string>
#include <vector>

namespace {

using dea::Index;
using json = nlohmann::json;
namespace fs = std::filesystem;
namespace lm_run = dea::train::lm_run;

struct Variant {
  const char* name;
  const char* attention;
  const char* mlp;
  const char* label;
};
constexpr Variant kVariants[] = {
    {"mha_dense", "mha", "swiglu", "MHA + dense SwiGLU"},
    {"mha_trmoe", "mha", "tr_moe", "MHA + TR-MoE (shared expert)"},
    {"trmha2_trmoe", "tr_mha_v2", "tr_moe", "TR-MHA v2 + TR-MoE (shared expert)"},
    {"dea_dense", "dea", "swiglu", "causal Dual-Expert + dense SwiGLU"},
};

struct ComparisonSpec {
  const char* idea;
  const char* base;
  const char* framework;  ///< the framework's recorded direction, or "" when it recorded none
};
constexpr ComparisonSpec kComparisons[] = {
    {"mha_trmoe", "mha_dense",
     "lower: TR-MoE below dense SwiGLU in all 4 recorded runs (MHA mean paired dNLL -0.118, GQA -0.049; "
     "RESULTS_100M_MPS, 2 seeds, 1.02M tokens)"},
    {"trmha2_trmoe", "mha_trmoe", ""},
    {"trmha2_trmoe", "mha_dense", ""},
    {"dea_dense", "mha_dense", ""},
};

const Variant& variant(const std::string& name) {
  for (const Variant& v : kVariants)
    if (name == v.name) return v;
  ::dea::detail::raise("lm_compare: unknown variant '" + name + "'");
}

struct Args {
  std::string text, out = "lm_compare";
  std::vector<std::string> variants = {"mha_dense", "mha_trmoe", "trmha2_trmoe", "dea_dense"};
  std::vector<std::uint64_t> seeds = {1, 2, 3};
  std::int64_t steps = 500, eval_every = 50, eval_batches = 8, final_windows = 0;
  Index d_model = 128, n_heads = 4, n_layers = 4, d_ff = 512, routed = 128, experts = 4, top_k = 2;
  Index max_len = 128, batch_size = 16;
  std::string routing = "balanced_hash";
  double lr = 3e-4, weight_decay = 0.1;
  int threads = 0;
  bool smoke = false, fresh = false, plots = true;
};

void apply_smoke(Args& a, const std::set<std::string>& given) {
  auto set = [&](const char* flag, auto& field, auto value) {
    if (!given.count(flag)) field = value;
  };
  set("steps", a.steps, std::int64_t(12));
  set("eval_every", a.eval_every, std::int64_t(6));
  set("eval_batches", a.eval_batches, std::int64_t(2));
  set("final_windows", a.final_windows, std::int64_t(32));
  set("d_model", a.d_model, Index(32));
  set("n_heads", a.n_heads, Index(4));
  set("n_layers", a.n_layers, Index(2));
  set("d_ff", a.d_ff, Index(96));
  set("routed", a.routed, Index(32));
  set("max_len", a.max_len, Index(32));
  set("batch_size", a.batch_size, Index(4));
  if (!given.count("seeds")) a.seeds = {1, 2};
}

/// Parses the command line (dea::Error naming the flag on a bad value; `help` set on --help).
Args parse_args(int argc, char** argv, bool& help) {
  Args a;
  std::string variants = "mha_dense,mha_trmoe,trmha2_trmoe,dea_dense", seeds = "1-3";
  dea::cli::FlagSet f("lm_compare --text FILE [flags]",
                      "Trains MHA + dense SwiGLU, MHA + TR-MoE, TR-MHA v2 + TR-MoE and causal Dual-Expert + dense\n"
                      "at matched parameter counts over paired seeds and compares their validation NLL\n"
                      "(examples/experiments/lm_compare/lm_compare.cpp; docs/lm.md).");
  f.text("text", a.text, "FILE", "the corpus (bytes; the last 5% validates); required");
  f.text("out", a.out, "DIR", "the experiment directory: runs/, the report and the plots");
  f.text("variants", variants, "LIST", "comma-separated: mha_dense, mha_trmoe, trmha2_trmoe, dea_dense (the first "
         "given is matched against; comparisons need both of their variants)");
  f.text("seeds", seeds, "LIST", "paired seeds: integers and ranges a-b, at least 2");
  f.integer("steps", a.steps, 1, 10000000, "training steps per run");
  f.integer("eval_every", a.eval_every, 1, dea::cli::kNoMax, "steps between validation-curve evaluations");
  f.integer("eval_batches", a.eval_batches, 1, dea::cli::kNoMax, "batches per validation-curve evaluation");
  f.integer("final_windows", a.final_windows, 0, dea::cli::kNoMax,
            "validation windows of the final evaluation (0 = the whole validation split)");
  f.integer("d_model", a.d_model, 2, 4096, "hidden size D");
  f.integer("n_heads", a.n_heads, 1, 256, "attention heads (D / heads even)");
  f.integer("n_layers", a.n_layers, 1, 64, "decoder blocks");
  f.integer("d_ff", a.d_ff, 8, 65536, "the baseline's dense SwiGLU width W (the stored FFN width of every variant)");
  f.integer("routed", a.routed, 1, 65536, "TR-MoE: the routed width I (experts of I / experts; shared W - I)");
  f.integer("experts", a.experts, 1, 16, "TR-MoE: experts (1, 2, 4, 8 or 16)");
  f.integer("top_k", a.top_k, 1, 4, "TR-MoE: experts per token");
  f.choice("routing", a.routing, {"balanced_hash", "modulo_cyclic"}, "TR-MoE: the route table");
  f.integer("max_len", a.max_len, 3, 4096, "window length T (T + 1 bytes per window)");
  f.integer("batch_size", a.batch_size, 1, 4096, "windows per step");
  f.real("lr", a.lr, dea::cli::Range::open_closed(0, 1), "AdamW learning rate (constant, as the framework's runs)");
  f.real("weight_decay", a.weight_decay, dea::cli::Range::closed(0, 10), "AdamW weight decay");
  f.integer("threads", a.threads, 0, dea::cli::kMaxThreads, "OpenMP threads (0 = the library default)");
  f.toggle("smoke", a.smoke, "a tiny setting for tests (2 seeds, 12 steps, D 32, L 2; flags given still apply)");
  f.toggle("fresh", a.fresh, "retrain every run (by default finished runs of the same setting are reused)");
  bool no_plots = false;
  f.toggle("no_plots", no_plots, "write the report only");
  const auto p = f.parse(argc, argv);
  help = p.help;
  if (help) {
    fmt::print("{}", f.help());
    return a;
  }
  if (a.smoke) apply_smoke(a, p.flags);
  a.plots = !no_plots;
  dea::check(!a.text.empty(), "--text FILE is required (the corpus; examples/experiments/lm_compare/get_corpus.sh "
             "writes the documented one)");
  a.variants = dea::cli::split(variants, ',');
  dea::check(!a.variants.empty() && a.variants.size() <= 4, "--variants: expected 1 to 4 names, got '", variants, "'");
  for (std::size_t i = 0; i < a.variants.size(); ++i) {
    bool known = false;
    for (const Variant& v : kVariants) known = known || a.variants[i] == v.name;
    dea::check(known, "--variants '", variants, "': unknown variant '", a.variants[i],
               "' (expected mha_dense, mha_trmoe, trmha2_trmoe or dea_dense)");
    for (std::size_t j = 0; j < i; ++j)
      dea::check(a.variants[i] != a.variants[j], "--variants '", variants, "': '", a.variants[i], "' given twice");
  }
  if (p.flags.count("seeds") || !a.smoke) {
    a.seeds.clear();
    for (std::int64_t s : dea::cli::parse_int_ranges("--seeds", seeds, 0, std::int64_t(1) << 40, 1000))
      a.seeds.push_back(static_cast<std::uint64_t>(s));
  }
  dea::check(a.seeds.size() >= 2, "--seeds: the paired statistics need at least 2 seeds, got ", a.seeds.size());
  for (std::size_t i = 0; i < a.seeds.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      dea::check(a.seeds[i] != a.seeds[j], "--seeds '", seeds, "': seed ", a.seeds[i], " given twice");
  dea::check(a.routed < a.d_ff, "--routed (", a.routed, ") must be below --d_ff (", a.d_ff,
             "): the shared expert is W - I wide");
  dea::check(a.routed % a.experts == 0, "--routed (", a.routed, ") must be a multiple of --experts (", a.experts, ")");
  dea::check(a.top_k <= a.experts, "--top_k (", a.top_k, ") cannot exceed --experts (", a.experts, ")");
  dea::check(a.d_model % a.n_heads == 0 && (a.d_model / a.n_heads) % 2 == 0, "--d_model (", a.d_model,
             ") / --n_heads (", a.n_heads, ") must be a whole, even head width");
  std::error_code ec;
  dea::check(fs::is_regular_file(a.text, ec), "--text '", a.text, "': not a readable file");
  // where the results go, checked before any training
  fs::create_directories(fs::path(a.out) / "runs", ec);
  dea::check(!ec && fs::is_directory(fs::path(a.out) / "runs"), "--out '", a.out, "': cannot create the directory",
             ec ? ": " + ec.message() : std::string());
  const fs::path probe = fs::path(a.out) / ".lm_compare_write_probe";
  {
    std::ofstream t(probe);
    dea::check(static_cast<bool>(t << "x"), "--out '", a.out, "': cannot write into the directory");
  }
  fs::remove(probe, ec);
  return a;
}

/// The trainer's configuration of one run; `free_width` is the dense width (swiglu) or the shared expert's.
dea::train::TrainConfig run_config(const Args& a, const Variant& v, Index free_width, std::uint64_t seed,
                                   const std::string& dir) {
  dea::train::TrainConfig c;
  c.model = "lm";
  c.data_source = "text";
  c.text = a.text;
  c.attention = v.attention;
  c.mlp = v.mlp;
  c.d_model = a.d_model;
  c.n_heads = a.n_heads;
  c.n_layers = a.n_layers;
  c.max_len = a.max_len;
  c.batch_size = a.batch_size;
  c.steps = a.steps;
  c.eval_every = a.eval_every;
  c.eval_batches = a.eval_batches;
  c.log_every = std::max<std::int64_t>(1, a.eval_every);
  c.lr_main = a.lr;
  c.weight_decay = a.weight_decay;
  c.seed = seed;
  c.threads = a.threads;
  c.out_dir = dir;
  if (std::string(v.mlp) == "tr_moe") {
    c.d_ff = a.routed;
    c.experts = a.experts;
    c.top_k = a.top_k;
    c.shared_expert = true;
    c.shared_d_ff = free_width;
    c.routing = a.routing;
  } else {
    c.d_ff = free_width;
  }
  return c;
}

std::int64_t count_parameters(const dea::train::TrainConfig& c) {
  const auto model = lm_run::build_model<float>(c);
  std::int64_t n = 0;
  for (auto* p : model->parameters()) n += static_cast<std::int64_t>(p->numel());
  return n;
}

struct Sizing {
  Index free_width = 0;
  std::int64_t params = 0;
};

/// The free width of `v` (a multiple of 8 from the baseline's) whose parameter count is nearest `target`.
Sizing match_width(const Args& a, const Variant& v, std::int64_t target) {
  const bool moe = std::string(v.mlp) == "tr_moe";
  const Index w0 = moe ? a.d_ff - a.routed : a.d_ff;
  const std::int64_t p0 = count_parameters(run_config(a, v, w0, 0, ""));
  const double per_unit = 3.0 * static_cast<double>(a.d_model) * static_cast<double>(a.n_layers);  // per width unit
  Index best = w0;
  std::int64_t best_p = p0;
  // steps of 8 keep the products' panels whole; a small model whose step of 8 misses by more than 0.5% moves by 1
  for (const Index unit : {Index(8), Index(1)}) {
    const Index shift = static_cast<Index>(std::llround(static_cast<double>(target - p0) / per_unit / double(unit))) * unit;
    for (Index w : {w0 + shift - unit, w0 + shift, w0 + shift + unit}) {
      if (w < 8) continue;
      const std::int64_t p = count_parameters(run_config(a, v, w, 0, ""));
      if (std::llabs(p - target) < std::llabs(best_p - target)) best = w, best_p = p;
    }
    if (std::llabs(best_p - target) <= target / 200) break;
  }
  return {best, best_p};
}

struct RunResult {
  std::string variant;
  std::uint64_t seed = 0;
  double nll = NAN, perplexity = NAN, tokens_per_s = NAN, step_seconds = 0;
  std::int64_t n_tokens = 0, n_windows = 0;
  std::vector<double> curve_step, curve_nll;
  bool reused = false;
};

json to_json(const RunResult& r) {
  return {{"variant", r.variant}, {"seed", r.seed}, {"val_nll", dea::train::json_number(r.nll)},
          {"val_perplexity", dea::train::json_number(r.perplexity)}, {"val_tokens", r.n_tokens},
          {"val_windows", r.n_windows}, {"train_tokens_per_s", dea::train::json_number(r.tokens_per_s)},
          {"train_step_seconds", r.step_seconds}, {"curve_step", r.curve_step}, {"curve_val_nll", r.curve_nll},
          {"reused", r.reused}};
}

/// The validation curve of a run directory's train_log.jsonl (its "eval" lines).
void read_curve(const std::string& dir, RunResult& r) {
  std::ifstream in(dea::train::log_path(dir));
  std::string line;
  std::map<double, double> pts;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || j.value("event", "") != "eval") continue;
    if (j.contains("step") && j.contains("nll") && j["nll"].is_number())
      pts[j["step"].get<double>()] = j["nll"].get<double>();
  }
  r.curve_step.clear();
  r.curve_nll.clear();
  for (const auto& [s, v] : pts) r.curve_step.push_back(s), r.curve_nll.push_back(v);
}

json config_key(const dea::train::TrainConfig& c) {
  json j = dea::train::to_json(c);
  j.erase("data_hash");
  j.erase("threads");  // results do not depend on the thread count
  j.erase("out_dir");
  return j;
}

/// Trains (or reuses, or resumes) one run and evaluates it on the validation split.
RunResult run_one(const Args& a, const dea::train::TrainConfig& c, const lm_run::LmData& data, const Variant& v) {
  RunResult r;
  r.variant = v.name;
  r.seed = c.seed;
  const std::string result_path = (fs::path(c.out_dir) / "result.json").string();
  const json key = config_key(c);
  std::error_code ec;
  if (!a.fresh && fs::exists(result_path, ec)) try {  // an unreadable or different record: the run trains again
    const json old = json::parse(dea::read_file(result_path), nullptr, false);
    if (!old.is_discarded() && old.is_object() && old.value("config", json()) == key &&
        old.value("data_hash", "") == data.hash && old.contains("result")) {
      const json& j = old["result"];
      r.nll = j.value("val_nll", std::nan(""));
      r.perplexity = j.value("val_perplexity", std::nan(""));
      r.tokens_per_s = j.value("train_tokens_per_s", std::nan(""));
      r.step_seconds = j.value("train_step_seconds", 0.0);
      r.n_tokens = j.value("val_tokens", std::int64_t(0));
      r.n_windows = j.value("val_windows", std::int64_t(0));
      read_curve(c.out_dir, r);
      r.reused = true;
      if (std::isfinite(r.nll)) return r;
    }
  } catch (const std::exception&) {
  }
  r = RunResult{};
  r.variant = v.name;
  r.seed = c.seed;
  dea::train::TrainConfig cfg = c;
  bool resume = false;
  if (!a.fresh && fs::exists(dea::train::config_path(c.out_dir), ec) &&
      fs::exists(dea::train::checkpoint_path(c.out_dir), ec)) {
    try {
      const dea::train::ValidConfig old = dea::train::read_config(dea::train::config_path(c.out_dir));
      resume = config_key(old) == key && old->data_hash == data.hash;
    } catch (const std::exception&) {
      resume = false;
    }
  }
  cfg.resume = resume;
  lm_run::TrainOptions o;
  o.overwrite = true;
  o.data = &data;
  fs::create_directories(c.out_dir);
  const lm_run::TrainResult tr = lm_run::run_training<float>(cfg, o);
  if (tr.step_tokens > 0) r.tokens_per_s = static_cast<double>(tr.step_tokens) / std::max(tr.step_seconds, 1e-9);
  r.step_seconds = tr.step_seconds;
  if (resume) {
    // the steps before the interruption were timed by the first process: keep the rate of this part
    fmt::print(stderr, "lm_compare: {} resumed at step {}; its throughput is that of steps {}..{}\n", c.out_dir,
               tr.start_step, tr.start_step + 1, tr.last_step);
  }
  // the final evaluation: the whole validation split (or --final_windows windows)
  lm_run::LoadedRun<float> run = lm_run::load_run<float>(c.out_dir);
  const Index windows_per_batch = a.batch_size;
  std::size_t max_batches = 0;
  if (a.final_windows > 0)
    max_batches = static_cast<std::size_t>((a.final_windows + windows_per_batch - 1) / windows_per_batch);
  const lm_run::EvalResult e = lm_run::evaluate(*run.model, data, windows_per_batch, a.max_len, max_batches);
  r.nll = e.nll;
  r.perplexity = e.perplexity;
  r.n_tokens = e.n_tokens;
  r.n_windows = e.n_windows;
  read_curve(c.out_dir, r);
  const json record = {{"config", key}, {"data_hash", data.hash}, {"result", to_json(r)}};
  dea::write_file_atomic(result_path, record.dump(2) + "\n");
  return r;
}

struct Summary {
  double mean = NAN, sd = NAN;
};
Summary summarise(const std::vector<double>& v) {
  Summary s;
  if (v.empty()) return s;
  double m = 0;
  for (double x : v) m += x;
  m /= static_cast<double>(v.size());
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  s.mean = m;
  s.sd = v.size() > 1 ? std::sqrt(ss / static_cast<double>(v.size() - 1)) : 0;
  return s;
}

/// "idea lower NLL" iff mean(d) < 0, paired-t p < 0.05 and the bootstrap CI's upper end < 0; "idea higher NLL" iff
/// the mirror image; otherwise "no significant difference".
std::string verdict_of(double mean_d, double p_t, double ci_lo, double ci_hi) {
  if (!std::isfinite(mean_d)) return "no verdict (a run diverged)";
  if (mean_d < 0 && p_t < 0.05 && ci_hi < 0) return "idea lower NLL (significant)";
  if (mean_d > 0 && p_t < 0.05 && ci_lo > 0) return "idea higher NLL (significant)";
  return "no significant difference";
}

void plot_curves(const std::string& path, const Args& a, const std::vector<std::string>& names,
                 const std::map<std::string, std::vector<RunResult>>& runs) {
  namespace svg = dea::svg;
  svg::Figure fig(980, 560, fmt::format("Validation NLL (nats per byte) during training: D={} L={} H={} T={} "
                                        "batch {}, {} seeds", a.d_model, a.n_layers, a.n_heads, a.max_len,
                                        a.batch_size, a.seeds.size()));
  svg::Axes& ax = fig.axes({0, 32, 980, 528});
  for (std::size_t k = 0; k < names.size(); ++k) {
    const char* col = svg::palette::cycle(static_cast<int>(k));
    const std::vector<RunResult>& rs = runs.at(names[k]);
    for (const RunResult& r : rs) ax.line(r.curve_step, r.curve_nll, col, 0.8).set_class("seed-curve");
    // the mean over seeds at the steps every seed evaluated
    std::vector<double> xs = rs.front().curve_step, ys;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      double s = 0;
      for (const RunResult& r : rs) s += i < r.curve_nll.size() ? r.curve_nll[i] : NAN;
      ys.push_back(s / static_cast<double>(rs.size()));
    }
    ax.line(xs, ys, col, 2.4, {}, std::string(variant(names[k]).label) + " (mean)").set_class("mean-curve").radius = 3;
  }
  ax.xlabel = "step";
  ax.ylabel = "validation NLL (nats / byte)";
  ax.title = "thin: one seed; thick: mean over the seeds";
  ax.legend();
  fig.save(path);
}

struct ComparisonResult {
  std::string idea, base, verdict;
  std::vector<double> d;
  double mean = NAN, ci_lo = NAN, ci_hi = NAN;
};

void plot_paired(const std::string& path, const std::vector<std::uint64_t>& seeds,
                 const std::vector<ComparisonResult>& cmp) {
  namespace svg = dea::svg;
  const int n = static_cast<int>(cmp.size());
  svg::Figure fig(420.0 * std::max(1, n), 470, "Paired differences d = NLL(idea) − NLL(baseline) per seed");
  const auto boxes = svg::Figure::grid({0, 32, 420.0 * std::max(1, n), 438}, 1, std::max(1, n), 12);
  std::vector<double> x;
  std::vector<std::string> labels;
  for (std::size_t i = 0; i < seeds.size(); ++i) {
    x.push_back(static_cast<double>(i));
    labels.push_back("seed " + std::to_string(seeds[i]));
  }
  for (int k = 0; k < n; ++k) {
    const ComparisonResult& c = cmp[static_cast<std::size_t>(k)];
    svg::Axes& ax = fig.axes(boxes[static_cast<std::size_t>(k)]);
    std::vector<double> xw, win, xl, lose;
    for (std::size_t i = 0; i < c.d.size(); ++i) (c.d[i] < 0 ? xw : xl).push_back(x[i]), (c.d[i] < 0 ? win : lose).push_back(c.d[i]);
    if (std::isfinite(c.ci_lo) && std::isfinite(c.ci_hi) && c.ci_hi > c.ci_lo)
      ax.hspan(c.ci_lo, c.ci_hi, svg::palette::gray, 0.18, "bootstrap 95% CI of mean(d)").set_class("ci-band");
    if (!xw.empty()) ax.bars(xw, win, 0.6, svg::palette::green, "idea lower (d < 0)").set_class("d-bars");
    if (!xl.empty()) ax.bars(xl, lose, 0.6, svg::palette::red, "idea higher (d > 0)").set_class("d-bars");
    ax.hline(0, "#333333", 1);
    if (std::isfinite(c.mean))
      ax.hline(c.mean, svg::palette::purple, 1.5, "5 4", "mean(d) = " + svg::format_value(c.mean, 3)).set_class("mean-d");
    ax.set_xticks(x, labels);
    ax.set_xlim(-0.6, static_cast<double>(x.size()) - 0.4);
    ax.ylabel = "d (nats / byte)";
    ax.title = c.idea + " vs " + c.base + ": " + c.verdict;
    ax.legend();
  }
  fig.save(path);
}

int run(const Args& a) {
  const auto t0 = std::chrono::steady_clock::now();
  if (a.threads > 0) dea::set_num_threads(a.threads);
  // the corpus, read and split once (the trainer's 95 / 5 tail split)
  const Variant& base_v = variant(a.variants.front());
  dea::train::TrainConfig probe = run_config(a, base_v, base_v.mlp == std::string("tr_moe") ? a.d_ff - a.routed : a.d_ff,
                                            a.seeds.front(), a.out);
  const lm_run::LmData data = lm_run::build_data(dea::train::ValidConfig(probe));

  // matched parameter counts: the first variant at width W sets the target
  std::map<std::string, Sizing> sizing;
  const bool base_moe = std::string(base_v.mlp) == "tr_moe";
  sizing[base_v.name] = {base_moe ? a.d_ff - a.routed : a.d_ff,
                         count_parameters(run_config(a, base_v, base_moe ? a.d_ff - a.routed : a.d_ff, 0, ""))};
  const std::int64_t target = sizing[base_v.name].params;
  for (const std::string& name : a.variants)
    if (!sizing.count(name)) sizing[name] = match_width(a, variant(name), target);
  fmt::print("lm_compare: corpus '{}' ({} train / {} validation bytes, fingerprint {}); {} variants x {} seeds, "
             "{} steps of {} x {} bytes each\n", a.text, data.train.size(), data.val.size(), data.hash,
             a.variants.size(), a.seeds.size(), a.steps, a.batch_size, a.max_len);
  for (const std::string& name : a.variants)
    fmt::print("  {:<13} {:<36} {} parameters ({:+.3f}% of the baseline), free FFN width {}\n", name,
               variant(name).label, sizing[name].params,
               100.0 * static_cast<double>(sizing[name].params - target) / static_cast<double>(target),
               sizing[name].free_width);

  std::map<std::string, std::vector<RunResult>> runs;
  const std::size_t total = a.variants.size() * a.seeds.size();
  std::size_t done = 0;
  for (std::uint64_t seed : a.seeds)
    for (const std::string& name : a.variants) {
      const Variant& v = variant(name);
      const std::string dir = (fs::path(a.out) / "runs" / fmt::format("{}_s{}", name, seed)).string();
      ++done;
      fmt::print("\n== run {}/{}: {} seed {} ({}) ==\n", done, total, name, seed, dir);
      std::fflush(stdout);
      const RunResult r = run_one(a, run_config(a, v, sizing[name].free_width, seed, dir), data, v);
      fmt::print("== {} seed {}: validation NLL {:.4f}, perplexity {:.3f}, {:.0f} training tokens/s{}; {:.0f} s "
                 "elapsed ==\n", name, seed, r.nll, r.perplexity, r.tokens_per_s, r.reused ? " (reused)" : "",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      runs[name].push_back(r);
    }

  // per-variant summaries
  json variants_j = json::array();
  for (const std::string& name : a.variants) {
    std::vector<double> nll, ppl, tps;
    for (const RunResult& r : runs[name]) nll.push_back(r.nll), ppl.push_back(r.perplexity), tps.push_back(r.tokens_per_s);
    const Variant& v = variant(name);
    const dea::train::TrainConfig c = run_config(a, v, sizing[name].free_width, 0, "");
    variants_j.push_back({{"name", name}, {"label", v.label}, {"attention", v.attention}, {"mlp", v.mlp},
                          {"parameters", sizing[name].params},
                          {"parameters_vs_baseline", static_cast<double>(sizing[name].params - target) / static_cast<double>(target)},
                          {"dense_width", std::string(v.mlp) == "swiglu" ? c.d_ff : 0},
                          {"shared_width", std::string(v.mlp) == "tr_moe" ? c.shared_d_ff : 0},
                          {"routed_width", std::string(v.mlp) == "tr_moe" ? c.d_ff : 0},
                          {"val_nll_mean", summarise(nll).mean}, {"val_nll_sd", summarise(nll).sd},
                          {"val_perplexity_mean", summarise(ppl).mean},
                          {"train_tokens_per_s_mean", summarise(tps).mean}});
  }
  // comparisons
  std::vector<ComparisonResult> cmps;
  json cmp_j = json::array();
  for (const ComparisonSpec& cs : kComparisons) {
    if (!runs.count(cs.idea) || !runs.count(cs.base)) continue;
    ComparisonResult c;
    c.idea = cs.idea;
    c.base = cs.base;
    std::vector<double> iv, bv;
    for (const RunResult& r : runs[cs.idea]) iv.push_back(r.nll);
    for (const RunResult& r : runs[cs.base]) bv.push_back(r.nll);
    for (std::size_t i = 0; i < iv.size(); ++i) c.d.push_back(iv[i] - bv[i]);
    const bool finite = std::all_of(c.d.begin(), c.d.end(), [](double x) { return std::isfinite(x); });
    json stats;
    if (finite) {
      const auto tt = dea::eval::paired_t_test(iv, bv);
      const auto st = dea::eval::sign_test(iv, bv);
      const auto ci = dea::eval::paired_bootstrap_ci(iv, bv, 10000, 0, 0.95);
      c.mean = tt.mean_diff;
      c.ci_lo = ci.lo;
      c.ci_hi = ci.hi;
      c.verdict = verdict_of(tt.mean_diff, tt.p_value, ci.lo, ci.hi);
      stats = {{"mean_diff", dea::train::json_number(tt.mean_diff)}, {"sd_diff", dea::train::json_number(tt.sd_diff)},
               {"paired_t", {{"t", dea::train::json_number(tt.t)}, {"df", tt.df}, {"p_two_sided", dea::train::json_number(tt.p_value)}}},
               {"sign_test", {{"idea_lower", st.n_neg}, {"idea_higher", st.n_pos}, {"ties", st.n_ties},
                              {"p_two_sided", dea::train::json_number(st.p_value)}}},
               {"bootstrap_ci95", {{"lo", dea::train::json_number(ci.lo)}, {"hi", dea::train::json_number(ci.hi)},
                                   {"resamples", 10000}, {"rng", "dea::Rng(0), percentile"}}},
               {"relative_perplexity_change", dea::train::json_number(std::exp(tt.mean_diff) - 1)}};
    } else {
      c.verdict = verdict_of(NAN, NAN, NAN, NAN);
    }
    json j = {{"idea", cs.idea}, {"baseline", cs.base}, {"d_per_seed", c.d}, {"seeds", a.seeds},
              {"statistics", stats}, {"verdict", c.verdict}};
    if (*cs.framework) {
      j["framework_direction"] = cs.framework;
      j["direction_here"] = !finite ? "none" : (c.mean < 0 ? "lower" : (c.mean > 0 ? "higher" : "equal"));
      j["agrees_with_framework_direction"] = finite && c.mean < 0;
    }
    const double tps_i = summarise([&] { std::vector<double> v; for (auto& r : runs[cs.idea]) v.push_back(r.tokens_per_s); return v; }()).mean;
    const double tps_b = summarise([&] { std::vector<double> v; for (auto& r : runs[cs.base]) v.push_back(r.tokens_per_s); return v; }()).mean;
    j["throughput_cost"] = dea::train::json_number(tps_b / tps_i - 1);  // > 0: the idea trains slower
    cmp_j.push_back(j);
    cmps.push_back(c);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  json runs_j = json::array();
  for (const std::string& name : a.variants)
    for (const RunResult& r : runs[name]) runs_j.push_back(to_json(r));
  const json report = {
      {"experiment", "lm_compare: the token-routed seed's comparison, scaled down"},
      {"corpus", {{"path", a.text}, {"train_bytes", data.train.size()}, {"val_bytes", data.val.size()},
                  {"fingerprint", data.hash}, {"split", "bytes; the first 95% train, the last 5% validate (tail split)"},
                  {"tokenizer", "bytes (vocabulary 256)"}}},
      {"protocol", {{"d_model", a.d_model}, {"n_heads", a.n_heads}, {"n_layers", a.n_layers}, {"max_len", a.max_len},
                    {"batch_size", a.batch_size}, {"steps", a.steps},
                    {"train_tokens_per_run", a.steps * a.batch_size * a.max_len}, {"lr", a.lr},
                    {"weight_decay", a.weight_decay}, {"optimizer", "AdamW, constant learning rate, clip 1.0"},
                    {"ffn_width", a.d_ff}, {"routed_width", a.routed}, {"experts", a.experts}, {"top_k", a.top_k},
                    {"routing", a.routing}, {"eval_every", a.eval_every}, {"eval_batches", a.eval_batches},
                    {"final_eval", a.final_windows > 0 ? fmt::format("{} windows", a.final_windows) : "the whole validation split"},
                    {"seeds", a.seeds}, {"threads", dea::num_threads()}, {"smoke", a.smoke}}},
      {"variants", variants_j},
      {"runs", runs_j},
      {"comparisons", cmp_j},
      {"verdict_rule", "'idea lower NLL (significant)' iff mean(d) < 0, paired-t p < 0.05 and the bootstrap 95% CI's "
                       "upper end < 0; 'idea higher NLL (significant)' iff mean(d) > 0, p < 0.05 and the CI's lower "
                       "end > 0; otherwise 'no significant difference'"},
      {"seconds", seconds}};
  const std::string report_path = (fs::path(a.out) / "lm_compare_report.json").string();
  dea::write_file_atomic(report_path, report.dump(2) + "\n");
  std::vector<std::string> plots;
  if (a.plots) try {
      plots.push_back((fs::path(a.out) / "lm_compare_val_curves.svg").string());
      plot_curves(plots.back(), a, a.variants, runs);
      if (!cmps.empty()) {
        plots.push_back((fs::path(a.out) / "lm_compare_paired.svg").string());
        plot_paired(plots.back(), a.seeds, cmps);
      }
    } catch (const std::exception& e) {
      fmt::print(stderr, "lm_compare: warning: plots not written: {}\n", dea::without_error_prefix(e.what()));
      plots.clear();
    }

  fmt::print("\n| variant | parameters | ");
  for (std::uint64_t s : a.seeds) fmt::print("NLL s{} | ", s);
  fmt::print("mean NLL | mean ppl | tokens/s |\n|---|---|");
  for (std::size_t i = 0; i < a.seeds.size(); ++i) fmt::print("---|");
  fmt::print("---|---|---|\n");
  for (const std::string& name : a.variants) {
    fmt::print("| {} | {} | ", name, sizing[name].params);
    std::vector<double> nll, ppl, tps;
    for (const RunResult& r : runs[name]) {
      fmt::print("{:.4f} | ", r.nll);
      nll.push_back(r.nll), ppl.push_back(r.perplexity), tps.push_back(r.tokens_per_s);
    }
    fmt::print("{:.4f} | {:.3f} | {:.0f} |\n", summarise(nll).mean, summarise(ppl).mean, summarise(tps).mean);
  }
  fmt::print("\n");
  for (std::size_t k = 0; k < cmps.size(); ++k) {
    const json& j = cmp_j[k];
    const json& st = j["statistics"];
    if (st.is_object() && !st.empty())
      fmt::print("{} vs {}: mean d {:+.4f}, t-test p {:.4f}, sign test p {:.4f}, bootstrap 95% CI [{:+.4f}, {:+.4f}], "
                 "throughput cost {:+.1f}% -> {}{}\n", cmps[k].idea, cmps[k].base, cmps[k].mean,
                 st["paired_t"]["p_two_sided"].is_number() ? st["paired_t"]["p_two_sided"].get<double>() : NAN,
                 st["sign_test"]["p_two_sided"].get<double>(), cmps[k].ci_lo, cmps[k].ci_hi,
                 100 * (j["throughput_cost"].is_number() ? j["throughput_cost"].get<double>() : NAN), cmps[k].verdict,
                 j.contains("agrees_with_framework_direction")
                     ? (j["agrees_with_framework_direction"].get<bool>() ? " (same direction as the framework's)"
                                                                         : " (not the framework's direction)")
                     : "");
    else
      fmt::print("{} vs {}: {}\n", cmps[k].idea, cmps[k].base, cmps[k].verdict);
  }
  fmt::print("time: {:.1f} s; report {}\n", seconds, report_path);
  for (const std::string& p : plots) fmt::print("plot: {}\n", p);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  try {
    bool help = false;
    a = parse_args(argc, argv, help);
    if (help) return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "lm_compare: {}\n(lm_compare --help lists the flags)\n", dea::without_error_prefix(e.what()));
    return 2;
  }
  try {
    return run(a);
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "lm_compare: out of memory; a smaller --batch_size, --max_len or --d_model needs less\n");
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "lm_compare: {}\n", dea::without_error_prefix(e.what()));
    return 1;
  }
}
