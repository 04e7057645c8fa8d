// Tests of the training data a configuration names (train/config.hpp, train/encoder.hpp): D_alpha from local copies
// of bAbI, CLUTRR, ConceptNet and a capitals list (tests/data/dalpha/), the synthetic fallback of a source without
// a file, the data fingerprint that lets `dea eval` rebuild exactly the run's data, the alpha cache and its mock
// fallback, the pairs an oracle must score, the WordPiece tokenizer of a run, the text source's --text_alpha and
// --n_docs, and the refusal of configurations (the reference's among them) whose data cannot be rebuilt.
#include <dea/train.hpp>

#include "../examples/dea/paris_probe.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_dalpha_files {

using namespace dea;
using namespace dea::train;
using namespace dea::train::encoder;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

using Scalar = float;
using Model = nn::TransformerModel<Scalar>;

const std::string kData = std::string(DEA_TEST_DATA_DIR) + "/dalpha";
const std::string kVocab = std::string(DEA_TEST_DATA_DIR) + "/bert/vocab.txt";

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("dea_test_dalpha_files_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::string write(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
  out.close();
  REQUIRE(out.good());
  return path;
}

TrainConfig tiny(const std::string& dir) {
  TrainConfig c;
  c.d_model = 16;
  c.n_heads = 2;
  c.n_layers = 1;
  c.d_ff = 32;
  c.batch_size = 8;
  c.max_len = 48;
  c.n_per_source = 100;
  c.steps = 3;
  c.gamma_steps = 2;
  c.log_every = 1;
  c.eval_every = 3;
  c.eval_batches = 1;
  c.seed = 11;
  c.threads = 1;
  c.out_dir = dir;
  return c;
}

/// A configuration reading every sample file of tests/data/dalpha (from `dir`, a copy, when given).
TrainConfig with_files(TrainConfig c, const std::string& dir = kData) {
  c.dalpha_source = "files";
  c.babi = dir + "/babi";
  c.clutrr = dir + "/clutrr.csv";
  c.conceptnet = dir + "/conceptnet_assertions.csv";
  c.capitals = dir + "/capitals.txt";
  return c;
}

TrainOptions<Scalar> quiet() {
  TrainOptions<Scalar> o;
  o.verbose = false;
  return o;
}

std::size_t count(const std::vector<data::Record>& r, const std::function<bool(const data::Record&)>& f) {
  return static_cast<std::size_t>(std::count_if(r.begin(), r.end(), f));
}

std::vector<data::Record> all_records(const RunData& d) {
  std::vector<data::Record> all = d.recs.train;
  all.insert(all.end(), d.recs.val.begin(), d.recs.val.end());
  all.insert(all.end(), d.recs.test.begin(), d.recs.test.end());
  return all;
}

bool same_records(const std::vector<data::Record>& a, const std::vector<data::Record>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].q_text != b[i].q_text || a[i].k_text != b[i].k_text || a[i].label != b[i].label ||
        a[i].source != b[i].source || !(a[i].alpha == b[i].alpha))
      return false;
  return true;
}

std::vector<std::string> argv_of(std::initializer_list<const char*> a) { return {a.begin(), a.end()}; }

}  // namespace

TEST_CASE("dalpha files: flags, config.json, the reference's names and the resume rule", "[dalpha_files]") {
  const ParsedArgs p = parse_args(argv_of({"--dalpha_source", "files", "--babi", "b", "--clutrr", "c.csv",
                                           "--conceptnet", "a.csv", "--capitals", "cap.txt", "--synthetic_fallback",
                                           "--tokenizer", "wordpiece", "--vocab", "v.txt", "--wiki_alpha", "none",
                                           "--n_docs", "7", "--no_isolation_check", "--oracle", "x.jsonl",
                                           "--oracle_fallback", "mock"}));
  const TrainConfig& c = p.config;
  CHECK(c.dalpha_source == "files");
  CHECK(c.babi == "b");
  CHECK(c.clutrr == "c.csv");
  CHECK(c.conceptnet == "a.csv");
  CHECK(c.capitals == "cap.txt");
  CHECK(c.synthetic_fallback);
  CHECK(c.tokenizer == "wordpiece");
  CHECK(c.vocab == "v.txt");
  CHECK(c.text_alpha == "none");  // --wiki_alpha is the reference's name of --text_alpha
  CHECK(p.explicit_flags.count("text_alpha") == 1);
  CHECK(p.explicit_flags.count("wiki_alpha") == 0);
  CHECK(c.n_docs == 7);
  CHECK(c.no_isolation_check);
  CHECK(c.oracle_fallback == "mock");
  CHECK_THROWS_WITH(parse_args(argv_of({"--wiki_alpha", "always"})), Contains("--wiki_alpha") && Contains("'none'"));
  CHECK_THROWS_WITH(parse_args(argv_of({"--tokenizer", "bert-base-uncased"})), Contains("--tokenizer"));
  CHECK(parse_args(argv_of({"--quick"})).config.n_docs == 200);  // the reference's quick preset
  CHECK(parse_args({}).config.n_docs == 0);                      // a local corpus is read whole

  // config.json keeps every choice, files by absolute path
  const std::string dir = temp_dir("config");
  TrainConfig saved = with_absolute_paths(c);
  saved.data_hash = "0123456789abcdef";
  CHECK(fs::path(saved.babi).is_absolute());
  CHECK(fs::path(saved.vocab).is_absolute());
  write_config(dir + "/config.json", saved);
  CHECK(to_json(read_config(dir + "/config.json").get()) == to_json(saved));
  // the reference's cfg spells text_alpha wiki_alpha; both keys must agree
  CHECK(config_from_json({{"wiki_alpha", "none"}})->text_alpha == "none");
  CHECK_THROWS_WITH(config_from_json({{"wiki_alpha", "none"}, {"text_alpha", "mock"}}), Contains("disagree"));
  CHECK_THROWS_WITH(config_from_json({{"data_hash", "xyz"}}), Contains("data_hash"));

  // a source without its file is an error naming the flag, unless the synthetic generator may stand in
  TrainConfig f;
  f.dalpha_source = "files";
  f.babi = "b";
  CHECK_THROWS_WITH(validate(f), Contains("--clutrr FILE") && Contains("--conceptnet FILE or --capitals FILE") &&
                                     Contains("--synthetic_fallback") && !Contains("--babi DIR"));
  f.synthetic_fallback = true;
  CHECK_NOTHROW(validate(f));
  TrainConfig syn;
  syn.clutrr = "c.csv";
  CHECK_THROWS_WITH(validate(syn), Contains("--clutrr 'c.csv' is given, but --dalpha_source is 'synthetic'"));
  syn = TrainConfig();
  syn.synthetic_fallback = true;
  CHECK_THROWS_WITH(validate(syn), Contains("--synthetic_fallback applies to --dalpha_source files"));
  TrainConfig wp;
  wp.tokenizer = "wordpiece";
  CHECK_THROWS_WITH(validate(wp), Contains("--tokenizer wordpiece needs --vocab FILE"));
  TrainConfig v;
  v.vocab = "v.txt";
  CHECK_THROWS_WITH(validate(v), Contains("--vocab 'v.txt' is given, but --tokenizer is 'simple'"));
  TrainConfig fb;
  fb.oracle_fallback = "mock";
  CHECK_THROWS_WITH(validate(fb), Contains("--oracle_fallback mock: applies to an alpha cache"));
  // --text_alpha and --n_docs on a D_alpha command line would be ignored: refused there (not in a config.json)
  CHECK_THROWS_WITH(check_flag_scope(TrainConfig(), {"text_alpha"}), Contains("--text_alpha applies to --data_source text"));
  CHECK_THROWS_WITH(check_flag_scope(TrainConfig(), {"n_docs"}), Contains("--n_docs applies to --data_source text"));
  TrainConfig text;
  text.data_source = "text";
  text.text = "corpus.txt";
  CHECK_NOTHROW(check_flag_scope(text, {"text_alpha", "n_docs"}));

  // a resumed run keeps its data (files compared by absolute path); the isolation check may be switched off
  TrainConfig again = saved;
  again.clutrr = "other.csv";
  CHECK_THROWS_WITH(resume_config(saved, again, {"clutrr"}), Contains("--clutrr") && Contains("differs"));
  again = c;  // the same files by relative path
  CHECK_NOTHROW(resume_config(saved, again, {"babi", "clutrr", "vocab"}));
  again.no_isolation_check = false;
  CHECK_FALSE(resume_config(saved, again, {"no_isolation_check"}).no_isolation_check);
  again.synthetic_fallback = false;
  CHECK_THROWS_WITH(resume_config(saved, again, {"synthetic_fallback"}), Contains("--synthetic_fallback"));
  again.oracle_fallback = "none";
  CHECK_THROWS_WITH(resume_config(saved, again, {"oracle_fallback"}), Contains("--oracle_fallback"));
  again.text_alpha = "mock";
  CHECK_THROWS_WITH(resume_config(saved, again, {"text_alpha"}), Contains("--text_alpha"));
  CHECK(resume_config(saved, again, {"plot_dir"}).data_hash == saved.data_hash);  // a program's flag: not compared
}

TEST_CASE("dalpha files: the sample files' records, their 1:1 negatives, the 10/1/1 split and the fallbacks",
          "[dalpha_files]") {
  std::ostringstream log;
  const RunData d = build_data(with_files(tiny("unused")), nullptr, &log);
  const std::vector<data::Record> all = all_records(d);
  // positives: bAbI 3 (qa16) + 4 (qa18), CLUTRR 5, ConceptNet 5 capitals + 3 IsA + 3 PartOf; one negative each
  REQUIRE(all.size() == 2 * 23);
  CHECK(d.recs.train.size() == 46 * 10 / 12);
  CHECK(d.recs.val.size() == 46 / 12);
  CHECK(d.recs.test.size() == 46 - 38 - 3);
  auto positives = [&](const char* source) {
    return count(all, [&](const data::Record& r) { return r.source == source && r.label == 1; });
  };
  CHECK(positives("babi") == 7);
  CHECK(positives("clutrr") == 5);
  CHECK(positives("conceptnet") == 11);
  CHECK(count(all, [](const data::Record& r) { return r.label == 0; }) == 23);
  CHECK(count(all, [](const data::Record& r) { return r.relation == "qa18"; }) == 4);
  CHECK(count(all, [](const data::Record& r) { return r.relation == "capital"; }) == 5);
  CHECK(count(all, [](const data::Record& r) { return r.relation == "partof" && r.q_text == "car"; }) == 1);
  CHECK(count(all, [](const data::Record& r) { return r.label == 1 && r.k_text == "Mia is the niece of Victor."; }) == 1);
  // --babi DIR reads the *_train.txt task files only (the test split's story is not there)
  CHECK(count(all, [](const data::Record& r) { return r.q_text.find("Julius is a rhino") != std::string::npos; }) == 0);
  // a negative keeps its query and takes another positive's key of the same source
  for (const data::Record& r : all)
    if (r.label == 0)
      CHECK(count(all, [&](const data::Record& p) {
              return p.label == 1 && p.source == r.source && p.k_text == r.k_text && p.q_text != r.q_text;
            }) >= 1);
  CHECK_THAT(log.str(), Contains("loaded real babi: 7 positives") && Contains("loaded real clutrr: 5 positives"));
  CHECK(d.hash.size() == 16);
  // deterministic: the same files and seed give the same records; another seed another order
  CHECK(same_records(all_records(build_data(with_files(tiny("unused")))), all));
  TrainConfig seed2 = with_files(tiny("unused"));
  seed2.seed = 12;
  CHECK(build_data(seed2).hash != d.hash);

  // a source without a file: its synthetic generator, said in the notices
  TrainConfig part = tiny("unused");
  part.dalpha_source = "files";
  part.babi = kData + "/babi/qa16_basic-induction_train.txt";  // one task file
  part.synthetic_fallback = true;
  std::ostringstream notes;
  const std::vector<data::Record> mixed = all_records(build_data(part, nullptr, &notes));
  CHECK(count(mixed, [](const data::Record& r) { return r.source == "babi"; }) == 2 * 3);
  CHECK(count(mixed, [](const data::Record& r) { return r.source == "clutrr"; }) == 2 * 100);
  CHECK(count(mixed, [](const data::Record& r) { return r.source == "conceptnet"; }) == 2 * 122);
  CHECK_THAT(notes.str(), Contains("clutrr: no --clutrr given; using the synthetic CLUTRR-like generator") &&
                              Contains("conceptnet: no --conceptnet or --capitals given"));
  // ConceptNet from the capitals alone, or from the assertions after the 47 built-in capitals
  TrainConfig caps = part;
  caps.capitals = kData + "/capitals.txt";
  CHECK(count(all_records(build_data(caps)), [](const data::Record& r) { return r.source == "conceptnet"; }) == 2 * 5);
  TrainConfig cn = part;
  cn.conceptnet = kData + "/conceptnet_assertions.csv";
  std::ostringstream cn_notes;
  CHECK(count(all_records(build_data(cn, nullptr, &cn_notes)),
              [](const data::Record& r) { return r.source == "conceptnet" && r.label == 1; }) == 47 + 6);
  CHECK_THAT(cn_notes.str(), Contains("the built-in 47 capitals"));

  // a file that was named and fails is an error naming it, never replaced by synthetic data
  TrainConfig missing = with_files(tiny("unused"));
  missing.clutrr = kData + "/no_such.csv";
  missing.synthetic_fallback = true;
  CHECK_THROWS_WITH(build_data(missing), Contains("no_such.csv"));
  const std::string empty_dir = temp_dir("empty_babi");
  TrainConfig no_tasks = with_files(tiny("unused"));
  no_tasks.babi = empty_dir;
  CHECK_THROWS_WITH(build_data(no_tasks), Contains(empty_dir) && Contains("qa16_*_train.txt"));
}

TEST_CASE("dalpha files: eval rebuilds exactly the run's data from config.json; a changed file is refused",
          "[dalpha_files]") {
  const std::string files = temp_dir("eval_files");
  for (const char* f : {"clutrr.csv", "conceptnet_assertions.csv", "capitals.txt"}) fs::copy(kData + "/" + f, files + "/" + f);
  fs::copy(kData + "/babi", files + "/babi");
  const std::string run = temp_dir("eval_run");
  const TrainConfig c = with_files(tiny(run), files);
  const RunData trained = build_data(c);
  const TrainResult r = run_training(c, quiet());
  CHECK(r.isolation.ok);
  const TrainConfig saved = read_config(config_path(run));
  CHECK(saved.data_hash == trained.hash);
  CHECK(saved.clutrr == files + "/clutrr.csv");

  // what dea eval does: the same records in the same splits, with the same alpha
  const LoadedRun<Scalar> loaded = load_run<Scalar>(run);
  CHECK(loaded.data.hash == trained.hash);
  CHECK(same_records(loaded.data.recs.test, trained.recs.test));
  CHECK(same_records(loaded.data.recs.val, trained.recs.val));
  CHECK(same_records(loaded.data.recs.train, trained.recs.train));
  const EvalResult e = evaluate_checkpoint<Scalar>(run, Split::test);
  CHECK(e.n_examples == trained.recs.test.size());

  // a data file edited after the run: its data would differ, so the run is not evaluated on it
  std::ofstream(files + "/clutrr.csv", std::ios::app)
      << "5,f00,\"[Ada] met her son [Ben].\",\"('Ada', 'Ben')\",son,\"Ada met her son Ben.\",task_1.2\n";
  CHECK_THROWS_WITH(load_run<Scalar>(run), Contains("config.json") && Contains("has changed since the run started"));
  // and so is a file that is gone
  fs::remove(files + "/capitals.txt");
  CHECK_THROWS_WITH(load_run<Scalar>(run), Contains("capitals.txt"));
}

TEST_CASE("oracle cache: the run's pairs, a missing pair named, and the counted mock fallback", "[dalpha_files]") {
  const std::string dir = temp_dir("oracle");
  const TrainConfig base = with_files(tiny("unused"));
  const std::vector<data::Record> records = dalpha_records(base);
  const auto pairs = record_pairs(records);
  // distinct, in the order of their first record
  std::set<std::pair<std::string, std::string>> distinct;
  for (const data::Record& r : records) distinct.emplace(r.q_text, r.k_text);
  CHECK(pairs.size() == distinct.size());
  REQUIRE(!pairs.empty());
  CHECK(pairs.front() == std::make_pair(records.front().q_text, records.front().k_text));
  // the pairs file: one {"q_text", "k_text"} object per line, in that order
  io::write_pairs(dir + "/pairs.jsonl", pairs);
  std::size_t line = 0;
  io::read_jsonl(dir + "/pairs.jsonl", [&](const nlohmann::json& j, std::size_t) {
    CHECK(j.size() == 2);
    CHECK(j.at("q_text") == pairs[line].first);
    CHECK(j.at("k_text") == pairs[line].second);
    ++line;
  });
  CHECK(line == pairs.size());
  CHECK_THROWS_WITH(io::write_pairs(dir + "/bad.jsonl", {{"caf\xff", "x"}}), Contains("pair 1") && Contains("q_text"));

  // a cache for every pair but the last: an error naming the missing pair
  data::AlphaCache cache;
  for (std::size_t i = 0; i + 1 < pairs.size(); ++i)
    cache.add({pairs[i].first, pairs[i].second, 0.01 * static_cast<double>(i % 90), std::nullopt, std::nullopt});
  io::write_alpha_cache(dir + "/cache.jsonl", cache);
  TrainConfig c = base;
  c.oracle = dir + "/cache.jsonl";
  CHECK_THROWS_WITH(build_data(c), Contains("cache.jsonl") && Contains("1 of the " + std::to_string(pairs.size())) &&
                                       Contains(train::encoder::detail::quoted(pairs.back().first)) && Contains("--dump_pairs") &&
                                       Contains("--oracle_fallback mock"));
  // with the fallback: the missing pair's records take the mock oracle's alpha, the others the cache's, counted
  c.oracle_fallback = "mock";
  std::ostringstream log;
  const RunData d = build_data(c, nullptr, &log);
  TrainConfig mock = base;
  const RunData m = build_data(mock);
  const std::vector<data::Record> got = all_records(d), mocked = all_records(m);
  REQUIRE(got.size() == mocked.size());
  std::size_t n_missing = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    REQUIRE(got[i].q_text == mocked[i].q_text);
    if (const data::OracleEntry* e = cache.find(got[i].q_text, got[i].k_text)) {
      CHECK(got[i].alpha == e->alpha);
    } else {
      CHECK(got[i].alpha == mocked[i].alpha);
      ++n_missing;
    }
  }
  CHECK(n_missing >= 1);
  CHECK_THAT(log.str(), Contains(std::to_string(n_missing) + " of " + std::to_string(got.size()) + " records (1 distinct") &&
                            Contains("--oracle_fallback mock"));
  // a complete cache: every alpha is the cache's
  cache.add({pairs.back().first, pairs.back().second, 0.5, std::nullopt, std::nullopt});
  io::write_alpha_cache(dir + "/cache.jsonl", cache);
  c.oracle_fallback = "none";
  for (const data::Record& r : all_records(build_data(c))) CHECK(r.alpha == cache.find(r.q_text, r.k_text)->alpha);
}

TEST_CASE("wordpiece: D_alpha pairs through WordPiece with the reference's pair rule; the model's vocabulary is the "
          "tokenizer's", "[dalpha_files][wordpiece]") {
  const std::string run = temp_dir("wordpiece");
  TrainConfig c = with_files(tiny(run));
  c.tokenizer = "wordpiece";
  c.vocab = kVocab;
  c.max_len = 24;  // short enough that the longer stories are truncated
  const RunData d = build_data(c);
  REQUIRE(d.tok.is_wordpiece());
  CHECK(d.tok.vocab_size() == 30522);
  CHECK(d.tok.pad_id() == 0);
  CHECK(d.tok.cls_id() == 101);
  CHECK(d.tok.mask_id() == 103);
  const text::WordPieceTokenizer wp = text::WordPieceTokenizer::from_file(kVocab);
  // the 8 records with the longest texts (some are truncated at max_len 24)
  std::vector<std::size_t> idx(d.recs.train.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t x, std::size_t y) {
    return d.recs.train[x].q_text.size() > d.recs.train[y].q_text.size();
  });
  idx.resize(8);
  const nn::ModelBatch<Scalar> b = make_batch<Scalar>(d, Split::train, idx, c.max_len, nullptr);
  const Index T = b.input_ids.size(1);
  bool truncated = false;
  for (std::size_t k = 0; k < idx.size(); ++k) {
    const data::Record& r = d.recs.train[idx[k]];
    const text::Encoding e = wp.reference_encode_pair(r.q_text, r.k_text, static_cast<std::size_t>(c.max_len));
    truncated = truncated || e.size() == static_cast<std::size_t>(c.max_len);
    const Index row = static_cast<Index>(k);
    for (Index t = 0; t < T; ++t) {
      const bool real = t < static_cast<Index>(e.size());
      CHECK(b.input_ids[row * T + t] == (real ? e.input_ids[static_cast<std::size_t>(t)] : 0));
      CHECK(b.token_type_ids[row * T + t] == (real ? e.token_type_ids[static_cast<std::size_t>(t)] : 0));
    }
    // the oracle block: A's pieces (queries) x B's pieces (keys)
    for (Index i = 0; i < T; ++i)
      for (Index j = 0; j < T; ++j) {
        const bool block = i >= e.span_a.first && i < e.span_a.second && j >= e.span_b.first && j < e.span_b.second;
        CHECK(std::isnan(b.alpha_oracle[(row * T + i) * T + j]) == !block);
      }
  }
  CHECK(truncated);

  // a run: tokenizer.txt holds the vocabulary, and eval reads the run back with WordPiece
  const TrainResult r = run_training(c, quiet());
  CHECK(r.isolation.ok);
  CHECK(text::Vocab::load(tokenizer_path(run)).tokens() == wp.vocab().tokens());
  dea_cli::ParisProbe probe;
  const EvalResult e = evaluate_checkpoint<Scalar>(run, Split::test, [&](Model& m, const LoadedRun<Scalar>& lr) {
    CHECK(lr.tok.is_wordpiece());
    CHECK(m.config().vocab_size == 30522);
    probe = dea_cli::paris_probe(m, lr.tok);
  });
  CHECK(e.n_examples == d.recs.test.size());
  REQUIRE(probe.ok);
  CHECK(probe.qi == 1);  // [CLS] paris is capital of france [SEP]
  CHECK(probe.ki == 5);

  // WordPiece refuses invalid UTF-8: the record is named before any training
  const std::string bad = temp_dir("wordpiece_bad");
  write(bad + "/clutrr.csv", "story,query,target\n\"[Ana] is [Rui]'s m\xe3" "e.\",\"('Rui', 'Ana')\",mother\n");
  TrainConfig bc = c;
  bc.clutrr = bad + "/clutrr.csv";
  CHECK_THROWS_WITH(build_data(bc), Contains("--tokenizer wordpiece") && Contains("source clutrr") &&
                                        Contains("not valid UTF-8 (byte 0xE3"));
  // a vocabulary without the special tokens the data needs
  write(bad + "/vocab.txt", "[UNK]\n[CLS]\n[SEP]\nparis\n");
  bc = c;
  bc.vocab = bad + "/vocab.txt";
  CHECK_THROWS_WITH(build_data(bc), Contains("vocab.txt") && Contains("[PAD]"));
}

TEST_CASE("text: --text_alpha none trains without an oracle and skips the isolation check; --n_docs; WordPiece chunks",
          "[dalpha_files][text]") {
  const std::string dir = temp_dir("text");
  std::string corpus;
  const char* words[] = {"the", "river", "runs", "past", "an", "old", "mill", "and", "under", "a", "stone", "bridge"};
  for (int doc = 0; doc < 40; ++doc) {
    for (int s = 0; s < 3; ++s) {
      for (int w = 0; w < 8; ++w) corpus += std::string(words[(doc * 7 + s * 3 + w) % 12]) + (w == 7 ? ". " : " ");
    }
    corpus += "\n";
    if (doc % 10 == 9) corpus += "\n";  // a blank line is not a document
  }
  write(dir + "/corpus.txt", corpus);
  TrainConfig c = tiny(dir + "/run_none");
  c.data_source = "text";
  c.text = dir + "/corpus.txt";
  c.text_alpha = "none";
  const RunData none = build_data(c);
  CHECK_FALSE(none.mock_mlm_oracle);
  Rng mrng(1);
  CHECK(make_batch<Scalar>(none, Split::train, {0, 1}, c.max_len, &mrng).alpha_oracle.dim() == 0);
  const TrainResult r = run_training(c, quiet());
  CHECK_THAT(r.isolation_skipped, Contains("--text_alpha none"));
  CHECK(r.last_loss_gate == 0);
  CHECK(std::isfinite(r.last_task_loss));
  // the mock oracle (the default) is on every batch, and the check runs
  c.text_alpha = "mock";
  c.out_dir = dir + "/run_mock";
  const TrainResult rm = run_training(c, quiet());
  CHECK(rm.isolation_skipped.empty());
  CHECK(rm.isolation.ok);
  CHECK(rm.last_loss_gate > 0);
  // the same data either way: the oracle is not part of the sentences
  CHECK(build_data(c).hash == none.hash);

  // --n_docs: the first documents (non-blank lines) only
  CHECK(data::first_documents("a\n\nb\nc\n", 2) == "a\n\nb");
  CHECK(data::first_documents("a\nb", 5) == "a\nb");
  CHECK(data::first_documents("a\nb", 0) == "a\nb");
  TrainConfig few = c;
  few.n_docs = 4;
  const RunData d4 = build_data(few);
  CHECK(d4.size(Split::train) < none.size(Split::train));
  CHECK(d4.hash != none.hash);

  // WordPiece: [CLS] ... [SEP] chunks of the vocabulary's ids, masked with its [MASK]
  TrainConfig wc = c;
  wc.tokenizer = "wordpiece";
  wc.vocab = kVocab;
  const RunData w = build_data(wc);
  REQUIRE(!w.chunks[0].empty());
  for (const auto& ch : w.chunks[0]) {
    CHECK(ch.front() == 101);
    CHECK(ch.back() == 102);
    CHECK(ch.size() <= static_cast<std::size_t>(wc.max_len));
  }
  // between [CLS] and [SEP], the WordPiece ids of the corpus's words
  const text::WordPieceTokenizer wpt = text::WordPieceTokenizer::from_file(kVocab);
  std::set<std::int64_t> allowed;
  for (const char* word : words)
    for (std::int64_t id : wpt.encode(word)) allowed.insert(id);
  allowed.insert(wpt.encode(".").at(0));
  for (const auto& ch : w.chunks[0])
    for (std::size_t t = 1; t + 1 < ch.size(); ++t) CHECK(allowed.count(ch[t]) == 1);
  Rng wr(3);
  const nn::ModelBatch<Scalar> wb = make_batch<Scalar>(w, Split::train, {0, 1, 2, 3}, wc.max_len, &wr);
  bool masked = false;
  for (Index k = 0; k < wb.input_ids.numel(); ++k) masked = masked || wb.input_ids[k] == 103;
  CHECK(masked);
  for (Index k = 0; k < wb.labels.numel(); ++k)
    if (wb.labels[k] != -100) CHECK((wb.labels[k] != 101 && wb.labels[k] != 102));
  // invalid UTF-8 in the corpus: WordPiece names the file and the line
  write(dir + "/bad.txt", corpus + "caf\xc3 au lait is what they drank every morning at the mill by the river.\n");
  wc.text = dir + "/bad.txt";
  CHECK_THROWS_WITH(build_data(wc), Contains("bad.txt:45:") && Contains("not valid UTF-8"));
}

TEST_CASE("a run whose configuration names data this program cannot rebuild is refused, not evaluated on other data",
          "[dalpha_files]") {
  const std::string run = temp_dir("reference");
  TrainConfig c = tiny(run);
  c.steps = 1;
  run_training(c, quiet());
  CHECK_NOTHROW(load_run<Scalar>(run));
  const nlohmann::json good = to_json(read_config(config_path(run)).get());
  auto refused = [&](const char* key, const char* value) {
    nlohmann::json j = good;
    j[key] = value;
    if (std::string(key) != "data_hash") j.erase("data_hash");  // as the reference's cfg: no fingerprint
    write(config_path(run), j.dump(2));
    try {
      load_run<Scalar>(run);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(refused("data_source", "wikipedia"), Contains("config.json") && Contains("Wikipedia stream"));
  CHECK_THAT(refused("data_source", "hf"), Contains("DualExpertBert fine-tuning"));
  CHECK_THAT(refused("dalpha_source", "real"), Contains("--dalpha_source 'real'") && Contains("Hugging Face downloads"));
  CHECK_THAT(refused("tokenizer", "bert-base-uncased"), Contains("--tokenizer 'bert-base-uncased'") &&
                                                            Contains("'simple' and 'wordpiece'"));
  CHECK_THAT(refused("oracle", "deberta"), Contains("--oracle 'deberta'") && Contains("--oracle FILE.jsonl"));
  CHECK_THAT(refused("data_hash", "0000000000000000"), Contains("has changed since the run started"));
  // the reference's cfg records wiki_alpha and n_docs for any data source: harmless for D_alpha
  nlohmann::json ref = good;
  ref.erase("text_alpha");
  ref["wiki_alpha"] = "none";
  ref["n_docs"] = 10000;
  ref["hf_model"] = "bert-base-uncased";  // (read by the fine-tuning of the reference only)
  write(config_path(run), ref.dump(2));
  CHECK_NOTHROW(load_run<Scalar>(run));
}

TEST_CASE("--no_isolation_check skips the check and changes no result", "[dalpha_files]") {
  const std::string a = temp_dir("iso_on"), b = temp_dir("iso_off");
  TrainConfig c = tiny(a);
  const TrainResult ra = run_training(c, quiet());
  CHECK(ra.isolation.ok);
  c.out_dir = b;
  c.no_isolation_check = true;
  const TrainResult rb = run_training(c, quiet());
  CHECK(rb.isolation_skipped == "--no_isolation_check");
  CHECK(rb.last_task_loss == ra.last_task_loss);
  CHECK(rb.last_loss_gate == ra.last_loss_gate);
}

// The rows of docs/hardening.md's bad-input table for the vocabulary, WordPiece text and the training data.
TEST_CASE("bad input B28 an empty vocabulary: a dea::Error naming the file, before any training", "[bad_input]") {
  const std::string dir = temp_dir("b28");
  CHECK_THROWS_WITH(text::Vocab::parse("", "v.txt"), Contains("v.txt: empty vocabulary"));
  CHECK_THROWS_WITH(text::Vocab::parse("\n\n", "v.txt"), Contains("v.txt:1: empty token"));
  TrainConfig c = tiny(dir + "/run");
  c.tokenizer = "wordpiece";
  c.vocab = write(dir + "/empty_vocab.txt", "");
  CHECK_THROWS_WITH(build_data(c), Contains("--vocab '" + c.vocab + "'") && Contains("empty vocabulary"));
  CHECK_THROWS_AS(run_training(c, quiet()), Error);
  CHECK_FALSE(fs::exists(dir + "/run/config.json"));  // nothing written
}

TEST_CASE("bad input B29 a duplicated vocabulary token: a dea::Error naming both lines", "[bad_input]") {
  const std::string dir = temp_dir("b29");
  CHECK_THROWS_WITH(text::Vocab::parse("[UNK]\nparis\nfrance\nparis\n", "v.txt"),
                    Contains("v.txt:4: duplicate token 'paris' (the same token as line 2"));
  TrainConfig c = tiny(dir + "/run");
  c.tokenizer = "wordpiece";
  c.vocab = write(dir + "/dup_vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n##s\nthe\n##s\n");
  CHECK_THROWS_WITH(build_data(c), Contains("dup_vocab.txt:8: duplicate token '##s' (the same token as line 6"));
  // a run directory whose tokenizer.txt repeats a token is refused when it is read back
  const std::string run = temp_dir("b29_run");
  TrainConfig ok = tiny(run);
  ok.steps = 1;
  run_training(ok, quiet());
  std::ofstream(tokenizer_path(run), std::ios::app) << "[PAD]\n";
  CHECK_THROWS_WITH(load_run<Scalar>(run), Contains("tokenizer.txt") && Contains("duplicate token '[PAD]'"));
}

TEST_CASE("bad input B30 invalid UTF-8 text for WordPiece: a dea::Error naming the byte, the record or the line",
          "[bad_input]") {
  const text::WordPieceTokenizer wp = text::WordPieceTokenizer::from_file(kVocab);
  CHECK_THROWS_WITH(wp.tokenize("na\xefve"), Contains("the text is not valid UTF-8 (byte 0xEF at byte offset 2)"));
  CHECK_THROWS_WITH(wp.reference_encode_pair("ok", "\xc0\xaf", 16), Contains("not valid UTF-8"));  // overlong '/'
  const data::RunTokenizer rt(wp);
  CHECK_THROWS_WITH(rt.encode_pair("ok", "\xff", 16), Contains("byte 0xFF"));
  const std::string dir = temp_dir("b30");
  TrainConfig c = with_files(tiny(dir + "/run"));
  c.tokenizer = "wordpiece";
  c.vocab = kVocab;
  c.capitals = write(dir + "/capitals.txt", "Paris\tFrance\nBras\xedlia\tBrazil\n");
  CHECK_THROWS_WITH(build_data(c), Contains("source conceptnet") && Contains("its q_text is not valid UTF-8 (byte 0xED"));
  // the SimpleTokenizer reads the same record (B15: an invalid byte becomes U+FFFD, a token of its own)
  c.tokenizer = "simple";
  c.vocab.clear();
  CHECK_NOTHROW(build_data(c));
}

TEST_CASE("bad input B31 D_alpha data a run names: a missing source, a missing or malformed file, a pair the alpha "
          "cache lacks", "[bad_input]") {
  const std::string dir = temp_dir("b31");
  TrainConfig c = tiny(dir + "/run");
  c.dalpha_source = "files";
  c.babi = kData + "/babi";
  CHECK_THROWS_WITH(validate(c), Contains("no file for --clutrr FILE (CLUTRR), --conceptnet FILE or --capitals FILE"));
  c = with_files(tiny(dir + "/run"));
  c.conceptnet = dir + "/missing.csv";
  CHECK_THROWS_WITH(build_data(c), Contains("missing.csv"));
  c.conceptnet = write(dir + "/short.csv", "/a/x\t/r/IsA\t/c/en/dog\n");
  CHECK_THROWS_WITH(build_data(c), Contains("short.csv:1") && Contains("expected tab-separated"));
  c = with_files(tiny(dir + "/run"));
  c.oracle = write(dir + "/cache.jsonl", "{\"q_text\": \"Paris\", \"k_text\": \"France\", \"alpha\": 0.9}\n");
  CHECK_THROWS_WITH(build_data(c), Contains("cache.jsonl") && Contains("pairs of the run's data are not in the cache"));
  CHECK_FALSE(fs::exists(dir + "/run"));
}

TEST_CASE("bad input B32 a run whose data cannot be rebuilt: the reference's data sources, a changed data file",
          "[bad_input]") {
  const std::string run = temp_dir("b32");
  TrainConfig c = tiny(run);
  c.steps = 1;
  run_training(c, quiet());
  nlohmann::json j = to_json(read_config(config_path(run)).get());
  j.erase("data_hash");
  j["dalpha_source"] = "hf";
  write(config_path(run), j.dump());
  CHECK_THROWS_WITH(load_run<Scalar>(run), Contains("config.json") && Contains("--dalpha_source 'hf'") &&
                                               Contains("cannot be rebuilt"));
  j["dalpha_source"] = "synthetic";
  j["data_hash"] = "ffffffffffffffff";
  write(config_path(run), j.dump());
  CHECK_THROWS_WITH(load_run<Scalar>(run), Contains("is not the run's (data_hash ffffffffffffffff)"));
}

}  // namespace test_dalpha_files
