// bench_lm: speed and memory of the decoder-only language model (lm::DecoderLM): the training step and greedy
// generation with the KV cache, one JSON line per measurement.
//
//   bench_lm [--config dense,trmoe] [--threads 1,2] [--steps 10] [--warmup 2] [--vocab 256] [--seed 42]
//            [--hidden 384] [--heads 8] [--layers 4] [--seq 256] [--batch 8] [--ffn 1792] [--routed 256]
//            [--experts 4] [--top_k 2] [--adapter_rank 4] [--gen_prompt 16] [--gen_new 240] [--gen_reps 3]
//            [--yardstick_rounds 5] [--dump-batches FILE] [--dump-weights DIR] [--dump-only]
//            [--breakdown [--breakdown_reps 5]] [--precision fp32|bf16]
//
// Configurations (all: D = --hidden, H = --heads, L = --layers, tied embeddings, RMSNorm pre-norm blocks, qk-norm,
// RoPE, vocabulary --vocab; the defaults are the token-routed seed's example shape scaled to 4 layers):
//   dense      attention mha,       mlp dense_deterministic (SwiGLU of width W = --ffn)
//   trmoe      attention tr_mha_v2 (E 4, rank --adapter_rank, top-2, targets qv), mlp tr_hash_engine: E = --experts
//              experts of width I / E (I = --routed), top_k = --top_k, modulo_cyclic routes, a shared expert of width
//              W - I; stored FFN width and FFN parameters (3 D W per layer) equal dense's
//   mha_trmoe  attention mha with trmoe's MLP (the MLP's cost alone)
//   v2_dense   attention tr_mha_v2 with dense's MLP (the adapters' cost alone)
// The defaults (W 1792 = shared 1536 + routed 256) are the example's widths with a real MoE (E 4, top 2).
//
// --precision bf16 runs everything measured (the yardstick, the steps, generation, the breakdown's parts) under
// dea::ScopedPrecision(Precision::bf16): the float products read bf16 copies of their operands and accumulate in
// float, everything else stays float (the weights and AdamW's state included). Every line has "precision", and
// the training line the peak of its precision on its thread count (bench/peak.hpp: FP32 fused multiply-adds or
// bf16 dot products) with peak_fraction = achieved_gflops / peak_gflops.
//
// One training step is what `dea train --model lm` runs (train::lm_run::run_training): zero_grad, forward, the
// causal LM loss (pre-shifted labels, the last position dropped), backward, per-group clipping (1.0) and the AdamW
// step (lr 3e-4, weight decay 0.01; every parameter in the main group). The model is drawn from Rng(seed) as
// train::lm_run::build_model does. The batch of step s is B windows of T + 1 ids drawn uniformly in [0, V) by
// Rng(train::stream_seed(seed, train::kOrderStream, s)) (row by row): ids = w[:-1], labels = w[1:].
//
// A "lm_train_step" line per (configuration, threads): the median s/step over --steps steps after --warmup steps
// (min, max), tokens/s (B T / median), CPU s/step (all threads), the phase medians (forward = forward + loss,
// backward = zero_grad + backward, optim = clipping + AdamW step), the losses of the first and the last step,
// the FLOP estimate of a step's matrix products (gflop_per_step: 3 x the forward products, the attention scores and
// P V counted over the full T x T square as computed; elementwise work not counted) and the GFLOP/s it achieves,
// against the GEMM yardstick measured in the same process at the same thread count: the library's packed product
// (ops::linear_forward_into, ops::gemm_into, ops::gemm_tn_add) on the dense MLP's shape [B T, D] x [D, W] (forward,
// input gradient, weight gradient; best of 3 calls each, median of --yardstick_rounds rounds, before the steps and
// after generation), yardstick_fraction = achieved / yardstick. Then peak RSS (getrusage; run one configuration
// per process for a clean figure, as bench/compare_lm.py does), the peak after building the model and optimiser
// and after each phase of step 1, and the 1-minute load average before and after.
//
// A "lm_generate" line per (configuration, threads), unless --gen_new 0: greedy decoding (arg-max, lowest id on a
// tie) of batch 1 with the KV cache (DecoderLM::forward_step, as examples/dea/generate.cpp does) from the trained
// model: the prompt is the first --gen_prompt ids of row 0 of step 1's batch, run at once (prefill), then
// --gen_new - 1 single-token steps. Medians over --gen_reps runs of the total, prefill and decode times;
// tokens_per_s = gen_new / total, decode_tokens_per_s = (gen_new - 1) / decode; the generated ids; the resident
// size (VmRSS) after generating; the bytes of the weights as held. Under --precision bf16 the model stores its
// weights as bf16 first (DecoderLM::store_bf16_weights: packed once, float copies freed, bf16 KV cache), as
// `dea generate --precision bf16` does.
//
// --dump-batches FILE writes the ids of steps 1..warmup+steps as JSON lines (a header {"batch", "seq", "vocab",
// "seed", "steps"}, then {"step", "ids", "labels"} per step, row-major [B, T]); --dump-weights DIR writes
// DIR/<config>.safetensors per configuration: the initial parameters under their state_dict names (F32), each
// TR-MoE layer's route table "layers.{l}.mlp.engine.route_table" [k, V] (I64) and metadata "bench_lm" (the
// configuration as JSON). bench/torch_lm.py trains on exactly these ids from exactly these weights. --dump-only
// writes the files and measures nothing.
//
// --breakdown measures instead the step's parts alone at its shapes, one "lm_breakdown" line per (configuration,
// threads): the layer's attention forward and backward (CausalSelfAttention or TokenRoutedAttention, whose four
// projections are also timed as bare packed products: the rest is the attention core, qk-norm, RoPE and routing),
// the MLP forward and backward (DenseSwiGLU or TrMoeMlp; for dense also its element-wise SwiGLU alone), one
// RMSNorm of [B T, D],
// the tied head, the loss, clipping + AdamW and zero_grad on the whole model; the median of --breakdown_reps calls
// after one warm-up call each, in ms (and GFLOP/s where there are products), and their sum over a step
// (modelled_step_ms; residual adds and the embedding lookup are left out). Progress goes to stderr.
// Exit status: 0 done, 1 failure, 2 bad command line.
#include <dea/core/allocator.hpp>
#include <dea/core/atomic_file.hpp>
#include <dea/core/init.hpp>
#include <dea/core/parallel.hpp>
#include <dea/core/rng.hpp>
#include <dea/io/safetensors.hpp>
#include <dea/lm/model.hpp>
#include <dea/ops/rms_norm.hpp>
#include <dea/ops/swiglu.hpp>
#include <dea/ops/gemm.hpp>
#include <dea/ops/linear.hpp>
#include <dea/optim/adamw.hpp>
#include <dea/cli/flags.hpp>
#include <dea/train/seeds.hpp>

#include <fmt/core.h>

#include "bench_util.hpp"
#include "peak.hpp"
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <time.h>

using namespace dea;
using bench_util::load1;
using bench_util::peak_rss_mb;

namespace {

using S = float;
using Model = lm::DecoderLM<S>;
using Clock = std::chrono::steady_clock;

constexpr const char* kUsage =
    "usage: bench_lm [--config dense,trmoe,mha_trmoe,v2_dense] [--threads 1,2] [--steps 10] [--warmup 2]\n"
    "                [--vocab 256] [--seed 42] [--hidden 384] [--heads 8] [--layers 4] [--seq 256] [--batch 8]\n"
    "                [--ffn 1792] [--routed 256] [--experts 4] [--top_k 2] [--adapter_rank 4]\n"
    "                [--gen_prompt 16] [--gen_new 240] [--gen_reps 3] [--yardstick_rounds 5]\n"
    "                [--dump-batches FILE] [--dump-weights DIR] [--dump-only] [--breakdown [--breakdown_reps 5]]\n"
    "                [--precision fp32|bf16]\n"
    "Training step (forward + loss + backward + clip + AdamW) and KV-cached greedy generation of lm::DecoderLM,\n"
    "one JSON line per measurement (see the comment at the top of bench/bench_lm.cpp). Defaults: configurations\n"
    "dense,trmoe; the sizes above.\n";

const std::vector<std::string> kConfigNames = {"dense", "trmoe", "mha_trmoe", "v2_dense"};

struct Options {
  std::vector<std::string> configs = {"dense", "trmoe"};
  std::vector<int> threads = {1, 2};
  int steps = 10, warmup = 2;
  Index vocab = 256, hidden = 384, heads = 8, layers = 4, seq = 256, batch = 8, ffn = 1792, routed = 256;
  Index experts = 4, top_k = 2, adapter_rank = 4;
  Index gen_prompt = 16, gen_new = 240;
  int gen_reps = 3, yardstick_rounds = 5;
  std::uint64_t seed = 42;
  std::string dump_batches, dump_weights;
  bool dump_only = false;
  bool breakdown = false;
  int breakdown_reps = 5;
  Precision precision = Precision::fp32;
};

double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

/// CPU time of the whole process (all threads) in seconds.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

/// Current resident size (VmRSS) in MiB, -1 when /proc/self/status is not readable.
double rss_now_mb() {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    if (key == "VmRSS:") {
      double kb = -1;
      f >> kb;
      return kb / 1024.0;
    }
    std::string rest;
    std::getline(f, rest);
  }
  return -1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double round_to(double x, double unit) { return std::round(x / unit) * unit; }

bool is_routed_attention(const std::string& c) { return c == "trmoe" || c == "v2_dense"; }
bool is_moe(const std::string& c) { return c == "trmoe" || c == "mha_trmoe"; }

/// The DecoderConfig of a configuration (see the file comment).
lm::DecoderConfig decoder_config(const std::string& name, const Options& o) {
  lm::DecoderConfig m;
  m.hidden_size = o.hidden;
  m.num_hidden_layers = o.layers;
  m.num_attention_heads = o.heads;
  m.vocab_size = o.vocab;
  m.tie_word_embeddings = true;
  m.attention_type = is_routed_attention(name) ? "tr_mha_v2" : "mha";
  m.tr_mha_num_experts = 4;
  m.tr_mha_adapter_rank = o.adapter_rank;
  m.tr_mha_top_k = 2;
  m.tr_mha_targets = "qv";
  if (is_moe(name)) {
    m.mlp_type = "tr_hash_engine";
    m.intermediate_size = o.routed;             // I: the total routed width
    m.num_experts = o.experts;
    m.top_k = o.top_k;
    m.shared_expert = true;
    m.shared_intermediate_size = o.ffn - o.routed;  // W_s = W - I
    m.routing_strategy = "modulo_cyclic";
  } else {
    m.mlp_type = "dense_deterministic";
    m.intermediate_size = o.ffn;
  }
  return m;
}

/// FLOP of the forward pass's matrix products (see the file comment); a step is 3 times this.
double forward_product_flops(const lm::DecoderConfig& m, Index B, Index T) {
  const double N = double(B) * double(T), D = double(m.hidden_size), V = double(m.vocab_size);
  double layer = 2.0 * N * D * (4.0 * D);       // K, Q, V, O projections (H_kv = H)
  layer += 4.0 * double(B) * double(T) * double(T) * D;  // Q K^T and P V over every head, the full T x T square
  if (m.attention() == lm::AttentionType::tr_mha_v2) {
    const double E = double(m.tr_mha_num_experts), r = double(m.tr_mha_adapter_rank), P = 2.0 * N;
    const double targets = double(m.tr_mha_targets.size());
    layer += 2.0 * N * D * E + 2.0 * N * D;     // context router, verifier gate
    layer += 2.0 * P * D * r + 2.0 * P * r * targets * D;  // the two selected adapters of each token
  }
  if (m.mlp() == lm::MlpType::dense) {
    layer += 6.0 * N * D * double(m.intermediate_size);
  } else {
    const double w = double(m.intermediate_size) / double(m.num_experts);
    layer += 6.0 * N * D * double(m.shared_intermediate_size);  // shared SwiGLU on every token
    layer += 6.0 * N * double(m.top_k) * D * w;                  // k routed experts of width w per token
  }
  return double(m.num_hidden_layers) * layer + 2.0 * N * D * V;  // + the tied head
}

/// The ids and pre-shifted labels [B, T] of step `step` (see the file comment).
struct Batch {
  Tensor<std::int64_t> ids, labels;
};
Batch make_batch(const Options& o, std::int64_t step) {
  Rng rng(train::stream_seed(o.seed, train::kOrderStream, static_cast<std::uint64_t>(step)));
  Batch b{Tensor<std::int64_t>({o.batch, o.seq}), Tensor<std::int64_t>({o.batch, o.seq})};
  std::vector<std::int64_t> w(static_cast<std::size_t>(o.seq + 1));
  for (Index r = 0; r < o.batch; ++r) {
    for (auto& x : w) x = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(o.vocab)));
    for (Index t = 0; t < o.seq; ++t) {
      b.ids[r * o.seq + t] = w[static_cast<std::size_t>(t)];
      b.labels[r * o.seq + t] = w[static_cast<std::size_t>(t + 1)];
    }
  }
  return b;
}

/// The configuration as JSON (the lines' fields and the weights file's metadata).
nlohmann::json config_json(const std::string& name, const lm::DecoderConfig& m, const Options& o) {
  nlohmann::json j;
  j["config"] = name;
  j["attention"] = m.attention_type;
  j["mlp"] = to_string(m.mlp());
  j["hidden"] = m.hidden_size;
  j["heads"] = m.num_attention_heads;
  j["layers"] = m.num_hidden_layers;
  j["seq"] = o.seq;
  j["batch"] = o.batch;
  j["vocab"] = m.vocab_size;
  j["ffn"] = o.ffn;
  if (m.mlp() == lm::MlpType::tr_hash_engine) {
    j["routed"] = m.intermediate_size;
    j["shared"] = m.shared_intermediate_size;
    j["experts"] = m.num_experts;
    j["top_k"] = m.top_k;
    j["routing_strategy"] = m.routing_strategy;
  }
  if (m.attention() == lm::AttentionType::tr_mha_v2) {
    j["tr_mha_num_experts"] = m.tr_mha_num_experts;
    j["tr_mha_adapter_rank"] = m.tr_mha_adapter_rank;
    j["tr_mha_top_k"] = m.tr_mha_top_k;
    j["tr_mha_targets"] = m.tr_mha_targets;
    j["tr_mha_adapter_gate_init"] = m.tr_mha_adapter_gate_init;
    j["tr_mha_id_primary_logit"] = m.tr_mha_id_primary_logit;
    j["tr_mha_id_secondary_logit"] = m.tr_mha_id_secondary_logit;
    j["tr_mha_verifier_temperature"] = m.tr_mha_verifier_temperature;
  }
  j["rope_theta"] = m.rope_theta;
  j["norm_eps"] = m.norm_eps;
  j["lr"] = 3e-4;
  j["weight_decay"] = 0.01;
  j["grad_clip"] = 1.0;
  return j;
}

std::size_t count_params(Model& model) {
  std::size_t n = 0;
  for (auto* p : model.parameters()) n += static_cast<std::size_t>(p->numel());
  return n;
}

/// The optimiser of train::lm_run::make_optimizer with the run defaults (lr 3e-4, wd 0.01, clip 1.0).
optim::AdamW<S> make_optimizer(Model& model) {
  return optim::build_optimizer(model.parameters(), optim::main_group_defaults(), optim::gate_group_defaults());
}

/// The GEMM yardstick (see the file comment): GFLOP/s of the three products of [M, K] x [K, N] with the library's
/// packed product, median over `rounds` rounds of the best of three calls each.
struct Yardstick {
  double forward = 0, input_grad = 0, weight_grad = 0, all = 0;  // GFLOP/s; all = 3 products' FLOP / their time
};
Yardstick measure_yardstick(Index M, Index N, Index K, int rounds) {
  Rng rng(7);
  Mat<S> x(M, K), W(N, K), dy(M, N), y(M, N), dx(M, K);
  Mat<S> dW = Mat<S>::Zero(N, K);
  init::normal(x, rng, 0, 1);
  init::normal(W, rng, 0, 1);
  init::normal(dy, rng, 0, 1);
  MatMap<S> dWm(dW.data(), N, K);
  auto best = [](auto&& f) {
    double b = std::numeric_limits<double>::infinity();
    for (int i = 0; i < 3; ++i) {
      const auto t0 = Clock::now();
      f();
      b = std::min(b, secs(t0, Clock::now()));
    }
    return b;
  };
  const double gflop = 2.0 * double(M) * double(N) * double(K) / 1e9;
  std::vector<double> f, ig, wg, all;
  for (int r = 0; r < rounds; ++r) {
    const double tf = best([&] { ops::linear_forward_into<S>(x, W, static_cast<const S*>(nullptr), y); });
    const double ti = best([&] { ops::gemm_into(dy, W, dx); });
    const double tw = best([&] { ops::gemm_tn_add<S>(dy, x, dWm); });
    f.push_back(gflop / tf);
    ig.push_back(gflop / ti);
    wg.push_back(gflop / tw);
    all.push_back(3 * gflop / (tf + ti + tw));
  }
  return {median(f), median(ig), median(wg), median(all)};
}

nlohmann::json yardstick_json(const Yardstick& y) {
  return {{"forward", round_to(y.forward, 0.1)}, {"input_grad", round_to(y.input_grad, 0.1)},
          {"weight_grad", round_to(y.weight_grad, 0.1)}, {"all", round_to(y.all, 0.1)}};
}

/// Greedy arg-max of a logits row (the lowest id on a tie), as examples/dea/generate.cpp.
template <class Row>
std::int64_t argmax(const Row& logits) {
  Index best = 0;
  for (Index v = 1; v < logits.size(); ++v)
    if (logits(v) > logits(best)) best = v;
  return best;
}

void dump_weights(const std::string& dir, const std::string& name, Model& model, const nlohmann::json& cfg) {
  io::SafeTensors st;
  for (auto* p : model.parameters()) st.put(p->name, p->shape, p->value.data(), io::DType::F32);
  for (Index l = 0; l < model.num_layers(); ++l)
    if (const auto* moe = model.tr_moe(l)) {
      const std::vector<std::int64_t> buf = moe->route_table_buffer();
      st.put(fmt::format("layers.{}.mlp.engine.route_table", l), Shape{moe->top_k(), moe->vocab_size()}, buf.data(),
             io::DType::I64);
    }
  nlohmann::json md = cfg;
  md["params"] = count_params(model);
  st.set_metadata("bench_lm", md.dump());
  const std::string path = (std::filesystem::path(dir) / (name + ".safetensors")).string();
  st.save(path);
  fmt::print(stderr, "[{}] weights written to {}\n", name, path);
}

void run_config(const std::string& name, const Options& opt) {
  const lm::DecoderConfig mcfg = decoder_config(name, opt);
  const nlohmann::json cfg = config_json(name, mcfg, opt);
  const int total = opt.warmup + opt.steps;
  if (!opt.dump_weights.empty()) {
    Rng init_rng(opt.seed);
    Model model(mcfg, init_rng);
    dump_weights(opt.dump_weights, name, model, cfg);
  }
  if (opt.dump_only) return;
  const Index tokens = opt.batch * opt.seq;
  const double gflop_step = 3.0 * forward_product_flops(mcfg, opt.batch, opt.seq) / 1e9;

  for (int th : opt.threads) {
    set_num_threads(th);
    const double load_before = load1();
    const bench_peak::Peak peak = bench_peak::measure_peak(
        opt.precision == Precision::bf16 ? bench_peak::Kind::bf16 : bench_peak::Kind::fp32, th);
    const ScopedPrecision precision(opt.precision);  // the float products of everything below
    fmt::print(stderr, "[{} threads={}] GEMM yardstick {}x{}x{} ...\n", name, th, tokens, opt.ffn, opt.hidden);
    const Yardstick y0 = measure_yardstick(tokens, opt.ffn, opt.hidden, opt.yardstick_rounds);
    Rng init_rng(opt.seed);
    auto model_ptr = std::make_unique<Model>(mcfg, init_rng);
    Model& model = *model_ptr;
    optim::AdamW<S> adamw = make_optimizer(model);
    const std::size_t n_params = count_params(model);
    Model::Cache cache;
    nlohmann::json rss_first = {{"init", std::round(peak_rss_mb())}};
    std::vector<double> t_cpu, t_total, t_fwd, t_bwd, t_opt;
    double first_loss = NAN, last_loss = NAN;
    for (int s = 1; s <= total; ++s) {
      const Batch b = make_batch(opt, s);
      const double c0 = cpu_seconds();
      const auto a = Clock::now();
      const Mat<S> logits = model.forward(b.ids, cache);
      const auto r = Model::loss(logits, b.labels, {}, true);
      const auto ft = Clock::now();
      if (s == 1) rss_first["forward"] = std::round(peak_rss_mb());
      adamw.zero_grad();
      model.backward(r.dlogits, cache);
      const auto bw = Clock::now();
      if (s == 1) rss_first["backward"] = std::round(peak_rss_mb());
      const optim::GradNorms norms = adamw.clip_grad_norms();
      check(norms.all_finite(), "bench_lm: non-finite gradient norm at step ", s);
      adamw.step();
      const auto e = Clock::now();
      const double c1 = cpu_seconds();
      const double loss = static_cast<double>(r.loss);
      check(std::isfinite(loss), "bench_lm: non-finite loss at step ", s);
      if (s == 1) {
        rss_first["optim"] = std::round(peak_rss_mb());
        first_loss = loss;
      }
      last_loss = loss;
      fmt::print(stderr, "[{} threads={}] step {}/{}{}: {:.3f} s (loss {:.5f})\n", name, th, s, total,
                 s <= opt.warmup ? " (warm-up)" : "", secs(a, e), loss);
      if (s <= opt.warmup) continue;
      t_total.push_back(secs(a, e));
      t_cpu.push_back(c1 - c0);
      t_fwd.push_back(secs(a, ft));
      t_bwd.push_back(secs(ft, bw));
      t_opt.push_back(secs(bw, e));
    }

    // generation from the trained model
    nlohmann::json gen;
    if (opt.gen_new > 0) {
      // bf16: the weights stored as bf16, packed once, and a bf16 KV cache, as `dea generate --precision bf16` runs
      // (the training model's float weights are freed: nothing after this trains)
      if (opt.precision == Precision::bf16) model.store_bf16_weights();
      const Batch b1 = make_batch(opt, 1);
      Tensor<std::int64_t> prompt({1, opt.gen_prompt});
      std::copy(b1.ids.ptr(), b1.ids.ptr() + opt.gen_prompt, prompt.ptr());
      std::vector<double> g_total, g_prefill, g_decode;
      std::vector<std::int64_t> out;
      for (int rep = 0; rep < opt.gen_reps; ++rep) {
        out.clear();
        Model::DecodeState state;
        const auto a = Clock::now();
        Mat<S> lg = model.forward_step(prompt, state);
        out.push_back(argmax(lg.row(lg.rows() - 1)));
        const auto p = Clock::now();
        Tensor<std::int64_t> one({1, 1});
        for (Index i = 1; i < opt.gen_new; ++i) {
          one[0] = out.back();
          lg = model.forward_step(one, state);
          out.push_back(argmax(lg.row(0)));
        }
        const auto e = Clock::now();
        g_total.push_back(secs(a, e));
        g_prefill.push_back(secs(a, p));
        g_decode.push_back(secs(p, e));
        fmt::print(stderr, "[{} threads={}] generate {}/{}: {} + {} tokens in {:.3f} s\n", name, th, rep + 1,
                   opt.gen_reps, opt.gen_prompt, opt.gen_new, secs(a, e));
      }
      gen["bench"] = "lm_generate";
      gen["impl"] = "dea";
      gen["precision"] = precision_name(opt.precision);
      gen["weight_bytes"] = model.weight_bytes();
      gen["config"] = name;
      gen["threads"] = th;
      gen["params"] = n_params;
      gen["prompt_len"] = opt.gen_prompt;
      gen["new_tokens"] = opt.gen_new;
      gen["reps"] = opt.gen_reps;
      gen["s_total"] = median(g_total);
      gen["s_prefill"] = median(g_prefill);
      gen["s_decode"] = median(g_decode);
      gen["tokens_per_s"] = double(opt.gen_new) / median(g_total);
      gen["decode_tokens_per_s"] = opt.gen_new > 1 ? double(opt.gen_new - 1) / median(g_decode) : 0.0;
      gen["ids"] = out;
      gen["rss_mb"] = std::round(rss_now_mb());
      gen["peak_rss_mb"] = std::round(peak_rss_mb());
    }

    fmt::print(stderr, "[{} threads={}] GEMM yardstick again ...\n", name, th);
    const Yardstick y1 = measure_yardstick(tokens, opt.ffn, opt.hidden, opt.yardstick_rounds);
    const double med = median(t_total);
    const double achieved = gflop_step / med;
    const double yard = std::max(y0.all, y1.all);
    nlohmann::json j = cfg;
    j["bench"] = "lm_train_step";
    j["impl"] = "dea";
    j["precision"] = precision_name(opt.precision);
    j["params"] = n_params;
    j["threads"] = th;
    j["steps"] = opt.steps;
    j["warmup"] = opt.warmup;
    j["s_per_step"] = med;
    j["s_min"] = *std::min_element(t_total.begin(), t_total.end());
    j["s_max"] = *std::max_element(t_total.begin(), t_total.end());
    j["tokens_per_s"] = double(tokens) / med;
    j["cpu_s_per_step"] = median(t_cpu);
    j["phase_s"] = {{"forward", median(t_fwd)}, {"backward", median(t_bwd)}, {"optim", median(t_opt)}};
    j["first_loss"] = first_loss;
    j["last_loss"] = last_loss;
    j["gflop_per_step"] = round_to(gflop_step, 0.01);
    j["achieved_gflops"] = round_to(achieved, 0.1);
    j["yardstick_shape"] = fmt::format("{}x{}x{}", tokens, opt.ffn, opt.hidden);
    j["yardstick_gflops_before"] = yardstick_json(y0);
    j["yardstick_gflops_after"] = yardstick_json(y1);
    j["yardstick_fraction"] = round_to(achieved / yard, 0.001);
    j["peak_gflops"] = round_to(peak.gflops, 0.1);
    j["peak_fraction"] = peak.gflops > 0 ? round_to(achieved / peak.gflops, 0.001) : 0.0;
    j["peak_rss_mb"] = std::round(peak_rss_mb());
    j["peak_rss_step1_mb"] = rss_first;
    j["load1_before"] = load_before;
    j["load1_after"] = load1();
    fmt::print("{}\n", j.dump());
    if (!gen.is_null()) {
      gen["load1_after"] = load1();
      fmt::print("{}\n", gen.dump());
    }
    std::fflush(stdout);
  }
}


// ---- --breakdown: the step's parts timed alone at the model's shapes ----------------------------------------------

/// Median wall time in ms of `reps` calls of f after one warm-up call.
template <class F>
double time_ms(int reps, F&& f) {
  f();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto a = Clock::now();
    f();
    t.push_back(1e3 * secs(a, Clock::now()));
  }
  return median(t);
}


void run_breakdown(const std::string& name, const Options& opt) {
  const lm::DecoderConfig mcfg = decoder_config(name, opt);
  const Index B = opt.batch, T = opt.seq, N = B * T, D = opt.hidden, V = opt.vocab, L = opt.layers;
  const int reps = opt.breakdown_reps;
  const S eps = static_cast<S>(mcfg.norm_eps);
  for (int th : opt.threads) {
    set_num_threads(th);
    const double load_before = load1();
    const ScopedPrecision precision(opt.precision);
    Rng rng(opt.seed);
    Mat<S> x(N, D), dy(N, D);
    init::normal(x, rng, 0, 1);
    init::normal(dy, rng, 0, 1e-3);
    const Batch batch = make_batch(opt, 1);
    nlohmann::json parts;
    auto put = [&](const std::string& key, double ms, double gflop = 0) {
      nlohmann::json e = {{"ms", round_to(ms, 0.01)}};
      if (gflop > 0) e["gflops"] = round_to(gflop / ms / 1e6, 0.1);  // FLOP / (ms 1e-3) / 1e9
      parts[key] = e;
      fmt::print(stderr, "[{} threads={} breakdown] {}: {:.2f} ms\n", name, th, key, ms);
    };
    double attn_f = 0, attn_b = 0, mlp_f = 0, mlp_b = 0;
    const double sr = 0.02 / std::sqrt(2.0 * double(L));

    // attention: the module, then its four projections alone (forward; input + weight gradients)
    if (mcfg.attention() == lm::AttentionType::mha) {
      lm::CausalAttentionOptions o;
      o.d_model = D;
      o.n_heads = opt.heads;
      o.n_kv_heads = opt.heads;
      lm::CausalSelfAttention<S> attn(o);
      for (auto* p : attn.parameters()) init::normal(p->value, rng, 0, 0.02);
      lm::CausalSelfAttention<S>::Cache c;
      attn_f = time_ms(reps, [&] { attn.forward(x, B, c); });
      attn_b = time_ms(reps, [&] { attn.backward(dy, c); });
    } else {
      TokenRoutedAttention<S> attn(D, opt.heads, rng, mcfg.token_routed_options(0));
      for (auto* p : attn.parameters())
        if (p->name == "qv_adapter_up") init::normal(p->value, rng, 0, 0.02);  // as after training has begun
      TokenRoutedAttention<S>::Cache c;
      const AttnInputs<S> in(B, T);
      attn_f = time_ms(reps, [&] { attn.forward(x, batch.ids, in, c); });
      attn_b = time_ms(reps, [&] { attn.backward(dy, c); });
    }
    const double core_flop = 4.0 * double(B) * double(T) * double(T) * double(D);
    put("attention_forward", attn_f, 2.0 * N * D * 4.0 * D + core_flop);
    put("attention_backward", attn_b, 2.0 * (2.0 * N * D * 4.0 * D + core_flop));
    {
      Mat<S> W(D, D), y(N, D), dx(N, D), dW = Mat<S>::Zero(D, D);
      init::normal(W, rng, 0, 0.02);
      MatMap<S> dWm(dW.data(), D, D);
      const double pf = time_ms(reps, [&] {
        for (int k = 0; k < 4; ++k) ops::linear_forward_into<S>(x, W, static_cast<const S*>(nullptr), y);
      });
      const double pb = time_ms(reps, [&] {
        for (int k = 0; k < 4; ++k) {
          ops::gemm_tn_add<S>(dy, x, dWm);
          ops::gemm_into(dy, W, dx);
        }
      });
      put("attention_projections_forward", pf, 2.0 * N * D * 4.0 * D);
      put("attention_projections_backward", pb, 2.0 * 2.0 * N * D * 4.0 * D);
      put("attention_rest_forward", attn_f - pf, core_flop);
      put("attention_rest_backward", attn_b - pb, 2.0 * core_flop);
    }

    // MLP
    if (mcfg.mlp() == lm::MlpType::dense) {
      const Index W = opt.ffn;
      lm::DenseSwiGLU<S> mlp(D, W);
      for (auto* p : mlp.parameters()) init::normal(p->value, rng, 0, 0.02);
      lm::DenseSwiGLU<S>::Cache c;
      mlp_f = time_ms(reps, [&] { mlp.forward(x, nullptr, c); });
      mlp_b = time_ms(reps, [&] { mlp.backward(dy, c); });
      put("mlp_forward", mlp_f, 6.0 * N * D * W);
      put("mlp_backward", mlp_b, 12.0 * N * D * W);
      Mat<S> g(N, W), u(N, W), h(N, W), dh(N, W), dg(N, W), du(N, W);
      init::normal(g, rng, 0, 1);
      init::normal(u, rng, 0, 1);
      init::normal(dh, rng, 0, 1);
      put("swiglu_forward_elementwise", time_ms(reps, [&] { ops::swiglu_forward(g, u, h); }));
      put("swiglu_backward_elementwise", time_ms(reps, [&] { ops::swiglu_backward(dh, g, u, dg, du); }));
    } else {
      lm::TrMoeOptions o;
      o.num_experts = mcfg.num_experts;
      o.top_k = mcfg.top_k;
      o.intermediate_size = mcfg.intermediate_size;
      o.shared_expert = true;
      o.shared_intermediate_size = mcfg.shared_intermediate_size;
      o.routing_strategy = mcfg.routing_strategy;
      o.vocab_size = V;
      lm::TrMoeMlp<S> mlp(D, o, rng, 0.02, sr);
      lm::TrMoeMlp<S>::Cache c;
      mlp_f = time_ms(reps, [&] { mlp.forward(x, batch.ids.ptr(), c); });
      mlp_b = time_ms(reps, [&] { mlp.backward(dy, c); });
      const double w = double(mcfg.intermediate_size) / double(mcfg.num_experts);
      const double f = 6.0 * N * D * double(mcfg.shared_intermediate_size) + 6.0 * N * double(mcfg.top_k) * D * w;
      put("mlp_forward", mlp_f, f);
      put("mlp_backward", mlp_b, 2.0 * f);
    }

    // RMSNorm of [N, D] (two per layer and the final one)
    Mat<S> y(N, D), hat(N, D), dx(N, D);
    Vec<S> rstd(N), gain = Vec<S>::Ones(D), dgain = Vec<S>::Zero(D);
    const double rf = time_ms(reps, [&] { ops::rms_norm_forward<S>(x, gain.data(), eps, y, hat, rstd.data()); });
    const double rb = time_ms(reps, [&] {
      ops::rms_norm_backward<S>(dy, hat, rstd.data(), gain.data(), dgain.data(), dx);
    });
    put("rms_norm_forward", rf);
    put("rms_norm_backward", rb);

    // tied head and loss
    Mat<S> E(V, D), dE = Mat<S>::Zero(V, D), logits, dhf;
    init::normal(E, rng, 0, 0.02);
    const double hf_ms = time_ms(reps, [&] { ops::linear_forward<S>(x, E, nullptr, logits); });
    lm::CausalLmLossResult<S> lr;
    const double loss_ms = time_ms(reps, [&] { lr = Model::loss(logits, batch.labels, {}, true); });
    MatMap<S> dEm(dE.data(), V, D);
    const double hb_ms = time_ms(reps, [&] { ops::linear_backward<S>(lr.dlogits, x, E, dEm, nullptr, &dhf); });
    put("head_forward", hf_ms, 2.0 * N * D * V);
    put("loss", loss_ms);
    put("head_backward", hb_ms, 4.0 * N * D * V);

    // the optimiser on the whole model's parameters
    double optim_ms = 0;
    {
      Rng init_rng(opt.seed);
      Model model(mcfg, init_rng);
      optim::AdamW<S> adamw = make_optimizer(model);
      for (auto* p : model.parameters()) init::normal(p->grad, rng, 0, 1e-4);
      optim_ms = time_ms(reps, [&] {
        adamw.clip_grad_norms();
        adamw.step();
      });
      put("optim", optim_ms);
      optim_ms += time_ms(reps, [&] { adamw.zero_grad(); });
      put("zero_grad", optim_ms - parts["optim"]["ms"].get<double>());
    }
    const double modelled = double(L) * (attn_f + attn_b + mlp_f + mlp_b + 2 * (rf + rb)) + rf + rb + hf_ms + loss_ms +
                            hb_ms + optim_ms;
    const Yardstick yard = measure_yardstick(N, opt.ffn, D, opt.yardstick_rounds);
    nlohmann::json j = config_json(name, mcfg, opt);
    j["bench"] = "lm_breakdown";
    j["impl"] = "dea";
    j["precision"] = precision_name(opt.precision);
    j["threads"] = th;
    j["reps"] = reps;
    j["parts"] = parts;
    j["modelled_step_ms"] = round_to(modelled, 0.1);
    j["per_step_ms"] = {{"attention", round_to(double(L) * (attn_f + attn_b), 0.1)},
                        {"mlp", round_to(double(L) * (mlp_f + mlp_b), 0.1)},
                        {"rms_norm", round_to(double(2 * L + 1) * (rf + rb), 0.1)},
                        {"head_and_loss", round_to(hf_ms + loss_ms + hb_ms, 0.1)},
                        {"optim", round_to(optim_ms, 0.1)}};
    j["yardstick_gflops"] = yardstick_json(yard);
    j["load1_before"] = load_before;
    j["load1_after"] = load1();
    fmt::print("{}\n", j.dump());
    std::fflush(stdout);
  }
}

void write_batches(const Options& o) {
  const int total = o.warmup + o.steps;
  std::string text;
  nlohmann::json h = {{"batch", o.batch}, {"seq", o.seq}, {"vocab", o.vocab}, {"seed", o.seed}, {"steps", total}};
  text += h.dump() + '\n';
  for (int s = 1; s <= total; ++s) {
    const Batch b = make_batch(o, s);
    nlohmann::json j;
    j["step"] = s;
    j["ids"] = std::vector<std::int64_t>(b.ids.ptr(), b.ids.ptr() + b.ids.numel());
    j["labels"] = std::vector<std::int64_t>(b.labels.ptr(), b.labels.ptr() + b.labels.numel());
    text += j.dump() + '\n';
  }
  write_file_atomic_with(o.dump_batches, [&](auto&& write) { write(text.data(), text.size()); }, "--dump-batches: ");
  fmt::print(stderr, "batches of steps 1..{} written to {}\n", total, o.dump_batches);
}

/// Checks the sizes together (the single flags are range-checked while parsing); dea::Error naming the flag.
void validate(const Options& o) {
  check(o.hidden % o.heads == 0, "--hidden (", o.hidden, ") must be divisible by --heads (", o.heads, ")");
  check((o.hidden / o.heads) % 2 == 0, "--hidden / --heads must be even (rotate-half RoPE), got ", o.hidden / o.heads);
  const bool moe = std::any_of(o.configs.begin(), o.configs.end(), is_moe);
  if (moe) {
    check(o.routed < o.ffn, "--routed (", o.routed, ") must be smaller than --ffn (", o.ffn,
          "): the shared expert has width --ffn - --routed");
    check(o.routed % o.experts == 0, "--routed (", o.routed, ") must be divisible by --experts (", o.experts, ")");
    check(o.top_k <= o.experts, "--top_k (", o.top_k, ") must not exceed --experts (", o.experts, ")");
  }
  check(o.gen_new == 0 || o.gen_prompt <= o.seq, "--gen_prompt (", o.gen_prompt, ") must not exceed --seq (", o.seq,
        "): the prompt is taken from a training row");
  for (const auto& c : o.configs) decoder_config(c, o).validate();
}

}  // namespace

int main(int argc, char** argv) {
  dea::retain_freed_memory();  // reuse freed activations instead of faulting pages in every step
  Options opt;
  try {
    cli::Args args(argc, argv);
    while (args.next()) {
      if (args.is("-h") || args.is("--help")) {
        fmt::print("{}", kUsage);
        return 0;
      }
      if (args.is("--config")) {
        const std::string v = args.value();
        opt.configs = cli::split(v, ',');
        if (opt.configs.empty()) cli::bad_value("--config", v, "a comma-separated list of dense, trmoe, mha_trmoe, v2_dense");
        for (const auto& c : opt.configs)
          if (std::find(kConfigNames.begin(), kConfigNames.end(), c) == kConfigNames.end())
            cli::bad_value("--config", v, "a comma-separated list of dense, trmoe, mha_trmoe, v2_dense");
      } else if (args.is("--threads")) {
        opt.threads.clear();
        for (const std::int64_t t : cli::parse_int_list("--threads", args.value(), 1, cli::kMaxThreads))
          opt.threads.push_back(static_cast<int>(t));
      } else if (args.is("--steps")) {
        opt.steps = static_cast<int>(args.int_value(1, 1000000));
      } else if (args.is("--warmup")) {
        opt.warmup = static_cast<int>(args.int_value(0, 1000000));
      } else if (args.is("--vocab")) {
        opt.vocab = args.int_value(2, 1 << 22);
      } else if (args.is("--hidden")) {
        opt.hidden = args.int_value(2, 65536);
      } else if (args.is("--heads")) {
        opt.heads = args.int_value(1, 4096);
      } else if (args.is("--layers")) {
        opt.layers = args.int_value(1, 1024);
      } else if (args.is("--seq")) {
        opt.seq = args.int_value(2, 1 << 16);
      } else if (args.is("--batch")) {
        opt.batch = args.int_value(1, 1 << 16);
      } else if (args.is("--ffn")) {
        opt.ffn = args.int_value(1, 1 << 20);
      } else if (args.is("--routed")) {
        opt.routed = args.int_value(1, 1 << 20);
      } else if (args.is("--experts")) {
        const std::int64_t e = args.int_value(1, 16);
        if (e != 1 && e != 2 && e != 4 && e != 8 && e != 16) cli::bad_value("--experts", std::to_string(e), "1, 2, 4, 8 or 16");
        opt.experts = e;
      } else if (args.is("--top_k")) {
        const std::int64_t k = args.int_value(1, 4);
        if (k == 3) cli::bad_value("--top_k", "3", "1, 2 or 4");
        opt.top_k = k;
      } else if (args.is("--adapter_rank")) {
        opt.adapter_rank = args.int_value(1, 4096);
      } else if (args.is("--gen_prompt")) {
        opt.gen_prompt = args.int_value(1, 1 << 16);
      } else if (args.is("--gen_new")) {  // 0: no generation
        opt.gen_new = args.int_value(0, 1 << 20);
      } else if (args.is("--gen_reps")) {
        opt.gen_reps = static_cast<int>(args.int_value(1, 1000));
      } else if (args.is("--yardstick_rounds")) {
        opt.yardstick_rounds = static_cast<int>(args.int_value(1, 1000));
      } else if (args.is("--seed")) {
        opt.seed = static_cast<std::uint64_t>(args.int_value(0, std::numeric_limits<std::int64_t>::max()));
      } else if (args.is("--dump-batches")) {
        opt.dump_batches = args.value();
        if (opt.dump_batches.empty()) cli::bad_value("--dump-batches", opt.dump_batches, "a file path");
      } else if (args.is("--dump-weights")) {
        opt.dump_weights = args.value();
        if (opt.dump_weights.empty()) cli::bad_value("--dump-weights", opt.dump_weights, "a directory");
      } else if (args.is("--dump-only")) {
        opt.dump_only = true;
      } else if (args.is("--breakdown")) {
        opt.breakdown = true;
      } else if (args.is("--precision")) {
        const std::string v = args.value();
        if (v != "fp32" && v != "bf16") cli::bad_value("--precision", v, "fp32 or bf16");
        opt.precision = v == "bf16" ? Precision::bf16 : Precision::fp32;
      } else if (args.is("--breakdown_reps")) {
        opt.breakdown_reps = static_cast<int>(args.int_value(1, 1000));
      } else {
        args.unknown();
      }
    }
    if (opt.dump_only && opt.dump_batches.empty() && opt.dump_weights.empty())
      ::dea::detail::raise("--dump-only needs --dump-batches FILE or --dump-weights DIR");
    if (!opt.dump_weights.empty())
      check(std::filesystem::is_directory(opt.dump_weights), "--dump-weights '", opt.dump_weights,
            "': not a directory");
    validate(opt);
  } catch (const dea::Error& e) {
    fmt::print(stderr, "bench_lm: {}\n{}", dea::without_error_prefix(e.what()), kUsage);
    return 2;
  }
  try {
    if (!opt.dump_batches.empty()) write_batches(opt);
    for (const auto& name : opt.configs) {
      if (opt.breakdown && !opt.dump_only)
        run_breakdown(name, opt);
      else
        run_config(name, opt);
    }
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "bench_lm: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_lm: error: {}\n", dea::without_error_prefix(e.what()));
    return 1;
  }
  return 0;
}
