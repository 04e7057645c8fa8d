// dea/train/encoder_data.hpp: the data of an encoder run (the Dual-Expert encoder and DualExpertBert): D_alpha
// records, synthetic or from local files, with their mock or cached oracle alpha, or masked-LM chunks of a text
// corpus; the run's tokenizer (the SimpleTokenizer or WordPiece); the fingerprint that ties a run directory to its
// data; the batches of a split and the epoch-wise training order. train/encoder.hpp trains on it.
//
// Rebuilding a run's data: build_data() gives the same records (or sentences) for the same configuration and files,
// and RunData::hash fingerprints them; a configuration that records data_hash is refused when its files now give
// other data, so eval and --resume never use other data. The order: epoch e = (step-1) / n_batches is a permutation
// of the training split drawn from Rng(stream_seed(seed, kOrderStream, e)) (train/seeds.hpp).
#pragma once

#include "../core/error.hpp"
#include "../core/files.hpp"
#include "../core/rng.hpp"
#include "../core/tensor.hpp"
#include "../data/collate.hpp"
#include "../data/dalpha.hpp"
#include "../data/loaders.hpp"
#include "../data/mlm.hpp"
#include "../io/jsonl.hpp"
#include "../nn/transformer.hpp"
#include "../text/run_tokenizer.hpp"
#include "../text/simple_tokenizer.hpp"
#include "config.hpp"
#include "run_dir.hpp"
#include "seeds.hpp"

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace dea::train::encoder {

using ::dea::train::detail::with_context;

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
  data::RunTokenizer tok;
  data::Splits recs;                                        // dalpha
  std::vector<std::vector<std::int64_t>> chunks[3];         // text: train, val, test
  bool mock_mlm_oracle = true;                              // text: --text_alpha mock
  /// The fingerprint of the data (TrainConfig::data_hash): of the D_alpha records with their alpha, or of the
  /// sentences of the three text splits.
  std::string hash;

  std::size_t size(Split s) const {
    const int k = static_cast<int>(s);
    if (task == nn::Task::mlm) return chunks[k].size();
    return (s == Split::train ? recs.train : s == Split::val ? recs.val : recs.test).size();
  }
};

namespace detail {

/// The start of `s`, at most `n` bytes, cut at a UTF-8 character boundary (for messages).
inline std::string excerpt(const std::string& s, std::size_t n = 60) {
  if (s.size() <= n) return s;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n) + "...";
}

/// A JSON string of `s` for messages (invalid UTF-8 replaced).
inline std::string quoted(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

/// WordPiece refuses invalid UTF-8: each record's texts are checked before training, so that a bad record is named
/// here and not met in a batch.
inline void check_records_utf8(const std::vector<data::Record>& all) {
  for (std::size_t i = 0; i < all.size(); ++i)
    for (const auto* f : {&all[i].q_text, &all[i].k_text}) {
      const std::size_t bad = utf8::first_invalid(*f);
      if (bad == std::string::npos) continue;
      ::dea::detail::raise(::dea::detail::concat(
          "--tokenizer wordpiece: a D_alpha record (source ", all[i].source, ", relation ", all[i].relation,
          ", q_text starting ", quoted(excerpt(all[i].q_text.substr(0, f == &all[i].q_text ? bad : std::string::npos))),
          "): ", text::unicode::invalid_utf8_message(*f, bad, f == &all[i].q_text ? "its q_text" : "its k_text")));
    }
}

/// A file's text for WordPiece: invalid UTF-8 is a dea::Error naming the file and the line.
inline void check_text_utf8(std::string_view text, const std::string& name) {
  const std::size_t bad = utf8::first_invalid(text);
  if (bad == std::string_view::npos) return;
  std::size_t line = 1, start = 0;
  for (std::size_t k = 0; k < bad; ++k)
    if (text[k] == '\n') {
      ++line;
      start = k + 1;
    }
  ::dea::detail::raise(::dea::detail::concat(
      name, ":", line, ": --tokenizer wordpiece: ",
      text::unicode::invalid_utf8_message(text.substr(start), bad - start, "the line")));
}

}  // namespace detail

/// The tokenizer of a fresh run: WordPiece over --vocab, or the SimpleTokenizer built from the training texts.
inline data::RunTokenizer fresh_tokenizer(const TrainConfig& c, const std::vector<std::string>& train_texts) {
  if (c.tokenizer == "wordpiece")
    return with_context("--vocab '" + c.vocab + "': ", [&] {
      return data::RunTokenizer(text::WordPieceTokenizer(text::Vocab::load(c.vocab)));
    });
  return data::SimpleTokenizer::from_texts(train_texts);
}

/// The tokenizer saved in the run directory `dir` (tokenizer.txt; vocab.txt for a dea_bert run), of the kind its
/// configuration names.
inline data::RunTokenizer load_run_tokenizer(const std::string& dir, const TrainConfig& c) {
  return data::RunTokenizer::load(c.model == "dea_bert" ? vocab_path(dir) : tokenizer_path(dir), c.tokenizer);
}

/// The D_alpha records of a configuration, without their oracle alpha: the synthetic build, or (dalpha_source
/// files) the given files with 1:1 negatives, each source without a file synthetic (validate() allowed that only
/// with synthetic_fallback). Notices (what was loaded, which source is synthetic) go to `log` when given.
inline std::vector<data::Record> dalpha_records(const ValidConfig& vc, std::ostream* log = nullptr) {
  const TrainConfig& c = vc;
  data::DalphaOptions opt;
  opt.n_per_source = static_cast<std::size_t>(c.n_per_source);
  opt.seed = c.seed;
  if (c.dalpha_source == "synthetic") return data::build_dalpha_synthetic(opt);
  data::DalphaFiles f;
  f.log = log;
  f.fallback_to_synthetic = false;  // a file that was named and fails is an error, never replaced
  if (!c.babi.empty()) f.babi = with_context("--babi: ", [&] { return data::babi_task_files(c.babi); });
  f.clutrr_csv = c.clutrr;
  f.conceptnet_csv = c.conceptnet;
  f.capitals = c.capitals;
  if (log) {
    auto synthetic = [&](const char* name, const char* flags, const char* generator) {
      *log << "[data] " << name << ": no " << flags << " given; using the synthetic " << generator
           << " generator (--synthetic_fallback)\n";
    };
    if (c.babi.empty()) synthetic("babi", "--babi", "bAbI-like");
    if (c.clutrr.empty()) synthetic("clutrr", "--clutrr", "CLUTRR-like");
    if (c.conceptnet.empty() && c.capitals.empty()) synthetic("conceptnet", "--conceptnet or --capitals", "ConceptNet-like");
    if (!c.conceptnet.empty() && c.capitals.empty())
      *log << "[data] conceptnet: the built-in " << data::knowledge::capitals.size()
           << " capitals (no --capitals given), then the IsA / PartOf pairs of --conceptnet\n";
  }
  return data::build_dalpha(f, opt);
}

/// The distinct (q_text, k_text) pairs of `records`, in the order of their first record: what an oracle must score
/// for the run's data.
inline std::vector<std::pair<std::string, std::string>> record_pairs(const std::vector<data::Record>& records) {
  std::vector<std::pair<std::string, std::string>> out;
  std::set<std::pair<std::string, std::string>> seen;
  for (const data::Record& r : records) {
    std::pair<std::string, std::string> p(r.q_text, r.k_text);
    if (seen.insert(p).second) out.push_back(std::move(p));
  }
  return out;
}

/// Sets every record's oracle alpha: the mock oracle, or the alpha cache of --oracle. A pair the cache lacks is a
/// dea::Error naming it (and how many are missing), or with oracle_fallback "mock" takes the mock oracle's alpha
/// (the value an --oracle mock run gives that record), counted on `log`.
inline void attach_oracle(std::vector<data::Record>& all, const TrainConfig& c, std::ostream* log = nullptr) {
  if (c.oracle == "mock") return data::attach_mock_oracle(all, c.seed);
  with_context("--oracle '" + c.oracle + "': ", [&] {
    // the cache read line by line, holding only the entries of the run's pairs (a cache may score far more)
    std::set<std::pair<std::string, std::string>> wanted;
    for (const data::Record& r : all) wanted.emplace(r.q_text, r.k_text);
    const data::AlphaCache cache = io::read_alpha_cache(c.oracle, [&](const std::string& q, const std::string& k) {
      return wanted.count(std::make_pair(q, k)) > 0;
    });
    if (c.oracle_fallback == "mock") data::attach_mock_oracle(all, c.seed);
    const std::size_t missing = all.size() - cache.attach(all, false);
    if (missing == 0) return;
    std::set<std::pair<std::string, std::string>> missing_pairs;
    const data::Record* first = nullptr;
    for (const data::Record& r : all)
      if (!cache.find(r.q_text, r.k_text)) {
        missing_pairs.emplace(r.q_text, r.k_text);
        if (!first) first = &r;
      }
    check(c.oracle_fallback == "mock", missing_pairs.size(), " of the ", record_pairs(all).size(),
          " (q_text, k_text) pairs of the run's data are not in the cache, e.g. q_text ", detail::quoted(first->q_text),
          " k_text ", detail::quoted(first->k_text), " (write the run's pairs with --dump_pairs FILE and compute ",
          "their alpha with dea oracle, or pass --oracle_fallback mock)");
    if (log)
      *log << "[oracle] " << missing << " of " << all.size() << " records (" << missing_pairs.size()
           << " distinct pairs) are not in the cache " << c.oracle
           << ": they take the mock oracle's alpha (--oracle_fallback mock)\n";
  });
}

/// Builds the data of a configuration (D_alpha, with its mock or cached oracle, or the text corpus's MLM chunks).
/// With `tok` (a saved tokenizer) it is used instead of building one. Notices go to `log` when given. A
/// configuration that records data_hash must give that data (else a dea::Error: a file it names has changed).
inline RunData build_data(const ValidConfig& vc, const data::RunTokenizer* tok = nullptr, std::ostream* log = nullptr) {
  const TrainConfig& c = vc;
  RunData d;
  d.source = c.data_source;
  data::Fingerprint fp;
  fp.add(c.data_source);
  if (c.data_source == "dalpha") {
    std::vector<data::Record> all = dalpha_records(vc, log);
    attach_oracle(all, c, log);
    if (c.tokenizer == "wordpiece") detail::check_records_utf8(all);
    data::add_records(fp, all);
    d.recs = data::split_records(all);
    d.task = nn::Task::cls;
    if (tok) {
      d.tok = *tok;
    } else {
      std::vector<std::string> texts;
      if (c.tokenizer == "simple") {
        texts.reserve(2 * d.recs.train.size());
        for (const auto& r : d.recs.train) {
          texts.push_back(r.q_text);
          texts.push_back(r.k_text);
        }
      }
      d.tok = fresh_tokenizer(c, texts);
    }
  } else {
    data::TextSplits ts = with_context("--text '" + c.text + "': ", [&] {
      const std::string raw = read_file(c.text);
      if (c.tokenizer == "wordpiece") detail::check_text_utf8(raw, c.text);
      return data::split_texts(data::split_sentences(data::first_documents(raw, static_cast<std::size_t>(c.n_docs))),
                               c.seed);
    });
    for (const auto* part : {&ts.train, &ts.val, &ts.test}) {
      fp.add_u64(part->size());
      for (const std::string& t : *part) fp.add(t);
    }
    d.task = nn::Task::mlm;
    d.tok = tok ? *tok : fresh_tokenizer(c, ts.train);
    d.chunks[0] = data::make_mlm_chunks(ts.train, d.tok, c.max_len);
    d.chunks[1] = data::make_mlm_chunks(ts.val, d.tok, c.max_len);
    d.chunks[2] = data::make_mlm_chunks(ts.test, d.tok, c.max_len);
    d.mock_mlm_oracle = c.text_alpha == "mock";
  }
  check(d.size(Split::train) > 0, "the training split is empty (raise --n_per_source)");
  d.hash = fp.hex();
  check(c.data_hash.empty() || c.data_hash == d.hash, "the data rebuilt from the configuration (fingerprint ", d.hash,
        ") is not the run's (data_hash ", c.data_hash, "): a file it names (--babi, --clutrr, --conceptnet, "
        "--capitals, --oracle or --text) has changed since the run started, or the configuration was edited");
  return d;
}

/// The data a run of `vc` trains on: with resume, tokenized by the run directory's tokenizer.txt (and the
/// checkpoint must exist); otherwise with a fresh tokenizer. Notices go to `log` when given.
inline RunData build_run_data(const ValidConfig& vc, std::ostream* log = nullptr) {
  if (!vc->resume) return build_data(vc, nullptr, log);
  check(std::filesystem::exists(checkpoint_path(vc->out_dir)), "--resume: no checkpoint at ",
        checkpoint_path(vc->out_dir));
  const data::RunTokenizer tok = load_run_tokenizer(vc->out_dir, vc);
  return build_data(vc, &tok, log);
}

/// Collates records / chunks `idx` of a split into a model batch; `mask_rng` draws the MLM masking (text).
template <class Scalar>
nn::ModelBatch<Scalar> make_batch(const RunData& d, Split s, const std::vector<std::size_t>& idx, Index max_len,
                        Rng* mask_rng) {
  nn::ModelBatch<Scalar> b;
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
    data::MlmOptions o = data::mlm_options(d.tok);
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

}  // namespace dea::train::encoder
