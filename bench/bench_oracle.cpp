// bench_oracle: throughput of the NLI oracle (`dea oracle`, oracle/nli_oracle.hpp) in pairs per second, printed as one
// JSON line per measurement.
//
//   bench_oracle [--threads 1,2] [--pairs 16] [--warmup 2] [--tokens 64] [--seed 42] [--double]
//                [--precision fp32|bf16]
//
// Models with random weights (HF init, seed --seed), at the sizes of the oracle line:
//   nli       a BertForSequenceClassification of bert-base's size (12 layers, 768, 12 heads, 3072, vocab 30522,
//             3 labels); every pair is [CLS] q [SEP] k [SEP] of exactly --tokens tokens
//   embedder  all-MiniLM-L6-v2's size (6 layers, 384, 12 heads, 1536) for the full oracle line; q and k are embedded
//             alone ([CLS] t [SEP], about --tokens / 2 tokens each)
// The texts are words of a synthetic vocabulary (one piece each), so tokenization is part of the time but
// negligible. Two measurements per thread count:
//   nli_only     phi of every pair as NliOracle::score computes it (the pairs, all of one length, in one forward on
//                all threads with batch-invariant products): what the PyTorch side (bench/torch_oracle.py) measures
//   full_oracle  NliOracle::score: phi, the two embeddings, sim, alpha
// Each line: mode, threads, pairs, tokens, seconds (median of 3 rounds over --pairs pairs after --warmup pairs),
// pairs/s, the matrix-product GFLOP/s of the NLI forward (2 · params-in-layers · tokens + attention), the same-run
// yardstick (the layer's largest product, [T, 768] x [768, 3072], one per thread on all threads at once) and the
// forward's fraction of it, the bytes of the two models' weights as the oracle holds them (weight_mb: float values, or
// with --precision bf16 the product weights stored once as bf16), the peak and the current RSS (the models are built
// in float with gradient buffers, which the oracle releases, and with bf16 replaces their product weights by bf16
// copies: the peak is the build's, the current RSS what the oracle keeps) and the load average. Progress goes to
// stderr.
#include <dea/oracle/nli_oracle.hpp>
#include <dea/core/parallel.hpp>
#include <dea/ops/linear.hpp>
#include <dea/cli/flags.hpp>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "bench_util.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace dea;

namespace {

double loadavg() {
  std::ifstream f("/proc/loadavg");
  double x = -1;
  f >> x;
  return x;
}

/// The resident set size now, in MiB (/proc/self/statm), -1 when unknown.
double rss_now_mb() {
  std::ifstream f("/proc/self/statm");
  double pages = -1, resident = -1;
  f >> pages >> resident;
  return resident < 0 ? -1 : resident * double(::sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

/// [PAD] [UNK] [CLS] [SEP] [MASK], then "w5" ... "w<n-1>": every word one piece.
text::WordPieceTokenizer synthetic_tokenizer(Index n) {
  std::vector<std::string> t{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  for (Index i = 5; i < n; ++i) t.push_back("w" + std::to_string(i));
  return text::WordPieceTokenizer(text::Vocab::from_tokens(std::move(t), "synthetic"));
}

std::string words(Rng& rng, int n, Index vocab) {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? " w" : "w") + std::to_string(5 + rng.next_u64() % std::uint64_t(vocab - 5));
  return s;
}

/// The yardstick of the same run: GFLOP/s of the layer's largest product (x [T, H] times W^T, W [I, H], as
/// ops::linear_forward computes it), one product per thread on `t` threads at once, as the oracle runs its pairs.
template <class S>
double yardstick(int t, Index T, Index H, Index I, Rng& rng) {
  Mat<S> W(I, H), x(T, H);
  for (Index i = 0; i < W.size(); ++i) W.data()[i] = static_cast<S>(rng.normal() * 0.02);
  for (Index i = 0; i < x.size(); ++i) x.data()[i] = static_cast<S>(rng.normal());
  const int reps = 40;
  auto body = [&] {
    Mat<S> y;
    for (int r = 0; r < reps; ++r) ops::linear_forward<S>(x, W, nullptr, y);
  };
  body();  // warm-up
  const auto t0 = std::chrono::steady_clock::now();
#ifdef _OPENMP
#pragma omp parallel num_threads(t) if (t > 1)
#endif
  body();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 2.0 * double(T) * double(H) * double(I) * reps * t / s * 1e-9;
}

template <class S>
int run(const std::vector<std::int64_t>& threads, int n_pairs, int warmup, int tokens, std::uint64_t seed,
        Precision precision) {
  bert::BertConfig nc;  // transformers' BertConfig defaults: bert-base
  nc.id2label = {"contradiction", "entailment", "neutral"};
  nc.hidden_dropout_prob = nc.attention_probs_dropout_prob = 0;
  bert::BertConfig ec = nc;
  ec.hidden_size = 384;
  ec.num_hidden_layers = 6;
  ec.num_attention_heads = 12;
  ec.intermediate_size = 1536;
  Rng rng(seed);
  fmt::print(stderr, "bench_oracle: building the models (random weights)\n");
  bert::BertForSequenceClassification<S> nli(nc, rng);
  bert::BertModel<S> emb(ec, rng);
  bert::OracleOptions opt;
  opt.precision = precision;  // bf16: the oracle's weight products in bf16 (OracleOptions::precision)
  bert::NliOracle<S> oracle(std::move(nli), synthetic_tokenizer(nc.vocab_size), std::move(emb),
                            synthetic_tokenizer(ec.vocab_size), opt);
  const int na = (tokens - 3) / 2, nb = tokens - 3 - na;  // [CLS] q [SEP] k [SEP] = tokens
  std::vector<bert::TextPair> pairs;
  for (int i = 0; i < warmup + n_pairs; ++i) pairs.push_back({words(rng, na, nc.vocab_size), words(rng, nb, nc.vocab_size)});
  const std::vector<bert::TextPair> warm(pairs.begin(), pairs.begin() + warmup), timed(pairs.begin() + warmup, pairs.end());
  std::vector<text::Encoding> enc;
  for (const auto& p : timed) enc.push_back(oracle.nli_encoding(p.premise, p.hypothesis));
  if (enc[0].size() != std::size_t(tokens)) {
    fmt::print(stderr, "bench_oracle: a pair has {} tokens, not {}\n", enc[0].size(), tokens);
    return 1;
  }
  // matrix-product flops of one NLI forward: per layer 4 H^2 + 2 H I multiply-adds per token, the attention's
  // Q K^T and P V 2 T H per token; the pooler and classifier are negligible
  const double H = double(nc.hidden_size), I = double(nc.intermediate_size), T = double(tokens);
  const double flops = 2.0 * double(nc.num_hidden_layers) * T * (4 * H * H + 2 * H * I + 2 * T * H);
  for (const std::int64_t t : threads) {
    set_num_threads(int(t));
    const double gemm = yardstick<S>(int(t), Index(tokens), nc.hidden_size, nc.intermediate_size, rng);
    for (const char* mode : {"nli_only", "full_oracle"}) {
      const bool full = std::string(mode) == "full_oracle";
      auto once = [&](const std::vector<bert::TextPair>& ps) {
        if (full) {
          (void)oracle.score(ps);
          return;
        }
        // phi alone, as NliOracle::score computes it: the pairs (all of one length) in one forward on all threads,
        // with batch-invariant products and the oracle's product precision (and its weights, bf16 with bf16)
        const ScopedBatchInvariantProducts invariant;
        const ScopedPrecision product_precision(oracle.options().precision);
        const Index n = Index(ps.size());
        bert::BertBatch<S> b;
        b.input_ids = Tensor<std::int64_t>({n, Index(tokens)});
        b.token_type_ids = Tensor<std::int64_t>({n, Index(tokens)});
        for (Index i = 0; i < n; ++i) {
          const text::Encoding x = oracle.nli_encoding(ps[std::size_t(i)].premise, ps[std::size_t(i)].hypothesis);
          std::copy(x.input_ids.begin(), x.input_ids.end(), b.input_ids.ptr() + i * Index(tokens));
          std::copy(x.token_type_ids.begin(), x.token_type_ids.end(), b.token_type_ids.ptr() + i * Index(tokens));
        }
        typename bert::BertForSequenceClassification<S>::Cache c;
        (void)oracle.nli().forward(b, nullptr, false, nullptr, c).logits(0, oracle.entailment_index());
      };
      once(warm);
      std::vector<double> secs;
      const double load0 = loadavg();
      for (int round = 0; round < 3; ++round) {
        const auto t0 = std::chrono::steady_clock::now();
        once(timed);
        secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        fmt::print(stderr, "bench_oracle: {} threads {} round {}: {:.3f} s\n", mode, t, round + 1, secs.back());
      }
      std::sort(secs.begin(), secs.end());
      const double med = secs[1];
      nlohmann::ordered_json j;
      j["bench"] = "oracle";
      j["mode"] = mode;
      j["scalar"] = sizeof(S) == 4 ? "float" : "double";
      j["precision"] = precision_name(precision);
      j["threads"] = t;
      j["pairs"] = n_pairs;
      j["tokens"] = tokens;
      j["nli"] = "12x768x12x3072";
      if (full) j["embedder"] = "6x384x12x1536";
      j["seconds"] = med;
      j["seconds_min"] = secs.front();
      j["seconds_max"] = secs.back();
      j["pairs_per_s"] = double(n_pairs) / med;
      if (!full) {
        j["nli_gflops"] = flops * double(n_pairs) / med * 1e-9;
        j["gemm_gflops"] = gemm;
        j["fraction_of_gemm"] = flops * double(n_pairs) / med * 1e-9 / gemm;
      }
      j["weight_mb"] = double(oracle.weight_bytes()) / (1024.0 * 1024.0);
      j["peak_rss_mb"] = bench_util::peak_rss_mb();
      j["rss_mb"] = rss_now_mb();
      j["load_before"] = load0;
      j["load_after"] = loadavg();
      fmt::print("{}\n", j.dump());
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string threads_text = "1,2";
  int n_pairs = 16, warmup = 2, tokens = 64;
  std::uint64_t seed = 42;
  bool use_double = false;
  std::string precision = "fp32";
  cli::FlagSet fs("bench_oracle [flags]", "Pairs per second of the NLI oracle at bert-base size (random weights).");
  fs.text("threads", threads_text, "LIST", "thread counts, comma-separated");
  fs.integer("pairs", n_pairs, 1, 100000, "pairs per timed round");
  fs.integer("warmup", warmup, 0, 100000, "pairs run before timing");
  fs.integer("tokens", tokens, 5, 512, "tokens of each [CLS] q [SEP] k [SEP]");
  fs.integer("seed", seed, 0, cli::kNoMax, "seed of the random weights and texts");
  fs.toggle("double", use_double, "run in double instead of float");
  fs.choice("precision", precision, {"fp32", "bf16"}, "float only: the oracle's product precision");
  std::vector<std::int64_t> threads;
  try {
    const auto p = fs.parse(argc, argv);
    if (p.help) {
      fmt::print("{}", fs.help());
      return 0;
    }
    threads = cli::parse_int_list("--threads", threads_text, 1, cli::kMaxThreads);
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_oracle: {}\n", dea::without_error_prefix(e.what()));
    return 2;
  }
  const Precision prec = precision == "bf16" ? Precision::bf16 : Precision::fp32;
  if (use_double && prec == Precision::bf16) {
    fmt::print(stderr, "bench_oracle: --precision bf16 applies to float (not --double)\n");
    return 2;
  }
  return use_double ? run<double>(threads, n_pairs, warmup, tokens, seed, prec)
                    : run<float>(threads, n_pairs, warmup, tokens, seed, prec);
}
