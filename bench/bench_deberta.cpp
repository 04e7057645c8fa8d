// bench_deberta: throughput of the DeBERTa-v3 NLI cross-encoder's forward (deberta/seq_cls.hpp, sequence_logits) in
// pairs per second, printed as one JSON line per thread count.
//
//   bench_deberta [--threads 1,2] [--pairs 16] [--warmup 2] [--tokens 64] [--seed 42] [--layers 12] [--pack 1]
//
// A DebertaV2ForSequenceClassification of DeBERTa-v3-base's size with random weights (N(0, 0.02), LayerNorms 1 / 0):
// 12 layers of 768, 12 heads, 3072, vocabulary 128,100, 256 position buckets over 512, shared keys, c2p and p2c, a
// LayerNorm on the relative table, no absolute positions, no token types, 3 labels. Every pair is [CLS] q [SEP] k
// [SEP] of exactly --tokens tokens of random ids; the --pairs pairs of a round run as one batch of one length
// (sequence_logits: batch-invariant products, all threads), as an oracle runs them. Each line: threads, pairs,
// tokens, seconds (median of 3 rounds after a warm-up round of --warmup pairs), pairs/s, the CPU seconds of a round
// (median; every thread's, so what the work costs on a shared machine), the GFLOP of the forward's
// matrix products per pair (the projections, the feed-forward, Q K^T, P V, the c2p and p2c products over the window
// of the relative table, the position projections, the pooler and classifier), their GFLOP/s, the FP32 FMA peak of
// the machine on as many threads (bench/peak.hpp) and the fraction of it, the parameter memory, the peak RSS and the
// load average. With --pack 1 (the default, as the oracle runs it) the projection weights are packed once for the
// products and their float values freed (pack_weights(true)); with --pack 0 every product packs its weight again
// (the same logits, bit for bit: "check"). "weights_mb" is what the model holds then, "packed_mb" its packed part.
// Progress goes to stderr.
#include <dea/cli/flags.hpp>
#include <dea/core/parallel.hpp>
#include <dea/core/rng.hpp>
#include <dea/deberta/seq_cls.hpp>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "bench_util.hpp"
#include "peak.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <time.h>

using namespace dea;

namespace {

/// CPU seconds of the process so far (every thread): on a shared machine the work's cost, where wall time also
/// counts the waits for the cores.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

/// DeBERTa-v3-base's configuration (its hub config.json), 3 labels, `layers` layers.
deberta::DebertaConfig v3_base(Index layers) {
  deberta::DebertaConfig c;
  c.vocab_size = 128100;
  c.hidden_size = 768;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 12;
  c.intermediate_size = 3072;
  c.max_position_embeddings = 512;
  c.relative_attention = true;
  c.position_buckets = 256;
  c.max_relative_positions = -1;
  c.c2p = c.p2c = true;
  c.share_att_key = true;
  c.norm_rel_ebd = true;
  c.position_biased_input = false;
  c.type_vocab_size = 0;
  c.id2label = {"entailment", "neutral", "contradiction"};
  return c;
}

/// Matrix-product FLOP of one forward of `pairs` sequences of T tokens (see the file comment).
double forward_flops(const deberta::DebertaConfig& c, Index T, Index pairs) {
  const double H = double(c.hidden_size), I = double(c.intermediate_size), L = double(c.num_hidden_layers);
  const std::vector<std::int64_t> b = deberta::relative_buckets(c, T);
  const std::vector<Index> rows = deberta::relative_rows(b, c.att_span());
  const double W = double(*std::max_element(rows.begin(), rows.end()) - *std::min_element(rows.begin(), rows.end()) + 1);
  const double n = double(pairs) * double(T);
  const double per_layer = 2 * n * (4 * H * H + 2 * H * I)    // Q, K, V, output; intermediate, output dense
                           + 2 * n * double(T) * H * 2         // Q K^T and P V over all heads
                           + 2 * n * W * H * 2                 // c2p (Q PK^T) and p2c (K PQ^T) over the window
                           + 2 * W * H * H * 2;                // PK and PQ, once per forward
  return L * per_layer + 2 * double(pairs) * (H * H + H * double(c.num_labels()));
}

}  // namespace

int main(int argc, char** argv) {
  std::string threads_text = "1,2";
  int n_pairs = 16, warmup = 2, tokens = 64, layers = 12, pack = 1;
  std::uint64_t seed = 42;
  cli::FlagSet fs("bench_deberta [flags]",
                  "Pairs per second of a DeBERTa-v3-base-sized NLI cross-encoder (random weights), forward only.");
  fs.text("threads", threads_text, "LIST", "thread counts, comma-separated");
  fs.integer("pairs", n_pairs, 1, 100000, "pairs per timed round (one batch)");
  fs.integer("warmup", warmup, 1, 100000, "pairs of the warm-up round");
  fs.integer("tokens", tokens, 5, 512, "tokens of each [CLS] q [SEP] k [SEP]");
  fs.integer("layers", layers, 1, 48, "encoder layers (12: v3-base)");
  fs.integer("pack", pack, 0, 1, "1: projection weights packed once (float values freed); 0: packed by every product");
  fs.integer("seed", seed, 0, cli::kNoMax, "seed of the random weights and ids");
  std::vector<std::int64_t> threads;
  try {
    const auto p = fs.parse(argc, argv);
    if (p.help) {
      fmt::print("{}", fs.help());
      return 0;
    }
    threads = cli::parse_int_list("--threads", threads_text, 1, cli::kMaxThreads);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_deberta: {}\n", dea::without_error_prefix(e.what()));
    return 2;
  }

  const deberta::DebertaConfig cfg = v3_base(layers);
  fmt::print(stderr, "bench_deberta: building the model (random weights)\n");
  deberta::DebertaV2ForSequenceClassification<float> model(cfg);
  Rng rng(seed);
  double n_params = 0;
  for (Param<float>* p : model.parameters()) {
    n_params += double(p->numel());
    const bool ln = p->name.find("LayerNorm") != std::string::npos;
    if (ln) continue;  // LayerNorms stay 1 / 0
    for (Index k = 0; k < p->numel(); ++k) p->value[k] = static_cast<float>(rng.normal() * 0.02);
  }
  if (pack) model.pack_weights(true);
  auto make_pairs = [&](int n) {
    std::vector<std::vector<std::int64_t>> ids(static_cast<std::size_t>(n));
    const int na = (tokens - 3) / 2;
    for (auto& s : ids) {
      s.push_back(1);  // [CLS]
      for (int t = 1; t < tokens - 1; ++t)
        s.push_back(t == na + 1 ? 2 : 4 + std::int64_t(rng.next_u64() % std::uint64_t(cfg.vocab_size - 4)));
      s.push_back(2);  // [SEP]
    }
    return ids;
  };
  const auto warm = make_pairs(warmup), timed = make_pairs(n_pairs);
  const double flops = forward_flops(cfg, tokens, n_pairs);

  for (const std::int64_t t : threads) {
    set_num_threads(int(t));
    const bench_peak::Peak peak = bench_peak::measure_peak(bench_peak::Kind::fp32, int(t));
    (void)deberta::sequence_logits(model, warm);
    std::vector<double> secs, cpu;
    const double load0 = bench_util::load1();
    float sink = 0;
    for (int round = 0; round < 3; ++round) {
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = cpu_seconds();
      const Mat<float> logits = deberta::sequence_logits(model, timed);
      cpu.push_back(cpu_seconds() - c0);
      secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      sink += logits(0, 0);
      fmt::print(stderr, "bench_deberta: {} threads round {}: {:.3f} s\n", t, round + 1, secs.back());
    }
    std::sort(secs.begin(), secs.end());
    std::sort(cpu.begin(), cpu.end());
    const double med = secs[1];
    nlohmann::ordered_json j;
    j["bench"] = "deberta";
    j["impl"] = "dea";
    j["scalar"] = "float";
    j["threads"] = t;
    j["pairs"] = n_pairs;
    j["tokens"] = tokens;
    j["model"] = fmt::format("{}x768x12x3072, vocab 128100, buckets 256/512", layers);
    j["seconds"] = med;
    j["seconds_min"] = secs.front();
    j["seconds_max"] = secs.back();
    j["pairs_per_s"] = double(n_pairs) / med;
    j["cpu_seconds"] = cpu[1];
    j["cpu_seconds_per_pair"] = cpu[1] / double(n_pairs);
    j["gflop_per_pair"] = flops / double(n_pairs) * 1e-9;
    j["gflops"] = flops / med * 1e-9;
    j["fp32_peak_gflops"] = peak.gflops;
    j["peak_isa"] = peak.isa;
    j["fraction_of_peak"] = peak.available ? flops / med * 1e-9 / peak.gflops : 0.0;
    j["params_mb"] = n_params * 4 / (1024.0 * 1024.0);
    j["packed_weights"] = pack != 0;
    j["weights_mb"] = double(model.weight_bytes()) / (1024.0 * 1024.0);
    j["packed_mb"] = double(model.packed_bytes()) / (1024.0 * 1024.0);
    j["peak_rss_mb"] = bench_util::peak_rss_mb();
    j["load_before"] = load0;
    j["load_after"] = bench_util::load1();
    j["check"] = sink;  // keeps the logits alive
    fmt::print("{}\n", j.dump());
    std::fflush(stdout);
  }
  return 0;
}
