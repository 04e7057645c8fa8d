// Tests of dea/data (and io/jsonl.hpp): tokenizer, pair encoding, synthetic D_alpha, mock oracle, collation,
// file loaders, masked-LM data, oracle tools and the alpha cache; files read by offset (data/byte_file.hpp) and the
// pieces ranks share (dist/pieces.hpp: an evaluation's batches, gathered in piece order).
#include <catch2/catch.hpp>

#include "thread_comm.hpp"
#include <dea/data/byte_file.hpp>
#include <dea/data/collate.hpp>
#include <dea/data/dalpha.hpp>
#include <dea/data/loaders.hpp>
#include <dea/data/mlm.hpp>
#include <dea/oracle/alpha.hpp>
#include <dea/text/simple_tokenizer.hpp>
#include <dea/dist/pieces.hpp>
#include <dea/io/jsonl.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_data {

using namespace dea;
using namespace dea::data;
using Strings = std::vector<std::string>;

namespace {

/// A fresh temporary directory per call, removed by the destructor.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("dea_test_data_" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name, const std::string& content) const {
    const std::string p = (path / name).string();
    std::ofstream(p, std::ios::binary) << content;
    return p;
  }
  std::string name(const std::string& n) const { return (path / n).string(); }
};

std::size_t count_if_records(const std::vector<Record>& r, const std::function<bool(const Record&)>& f) {
  return static_cast<std::size_t>(std::count_if(r.begin(), r.end(), f));
}

}  // namespace

// =============================================================================================================
// Tokenizer
// =============================================================================================================

TEST_CASE("tokenizer splits arithmetic runs, words and punctuation", "[data][tokenizer]") {
  const SimpleTokenizer t;
  REQUIRE(t.tokenize("5+3=8") == Strings{"5+3", "=", "8"});
  REQUIRE(t.tokenize("Paris→France") == Strings{"paris", "→", "france"});
  REQUIRE(t.tokenize("Hello, World!") == Strings{"hello", ",", "world", "!"});
  REQUIRE(t.tokenize("12*4 and 7") == Strings{"12*4", "and", "7"});
  REQUIRE(t.tokenize("3-2-1 / 1/2") == Strings{"3-2-1", "/", "1/2"});
  REQUIRE(t.tokenize("5+") == Strings{"5", "+"});    // no digits after the operator: not a run
  REQUIRE(t.tokenize("5++3") == Strings{"5", "+", "+", "3"});
  REQUIRE(t.tokenize("a5+3") == Strings{"a5", "+", "3"});  // a word run swallows the digit first
  REQUIRE(t.tokenize("5a+3") == Strings{"5a", "+", "3"});
  REQUIRE(t.tokenize("5+3abc") == Strings{"5+3", "abc"});
  REQUIRE(t.tokenize("x_y ... z") == Strings{"x_y", ".", ".", ".", "z"});
  REQUIRE(t.tokenize("  \t\n ").empty());
  REQUIRE(t.tokenize("").empty());
  REQUIRE(t.tokenize("what color is bob?") == Strings{"what", "color", "is", "bob", "?"});
  // Unicode: letters are word characters (and lower-cased), symbols are single tokens, NBSP is a space.
  REQUIRE(t.tokenize("CAFÉ Ölçek") == Strings{"café", "ölçek"});
  REQUIRE(t.tokenize("ΑΒΓ Жук") == Strings{"αβγ", "жук"});
  REQUIRE(t.tokenize("3×4 – x") == Strings{"3", "×", "4", "–", "x"});
  REQUIRE(t.tokenize("a\xC2\xA0" "b") == Strings{"a", "b"});
  // Invalid UTF-8 never throws: each bad byte is one U+FFFD token.
  REQUIRE(t.tokenize("a\xFF" "b") == Strings{"a", "\xEF\xBF\xBD", "b"});
  REQUIRE(t.tokenize("\xE2\x86") == Strings{"\xEF\xBF\xBD", "\xEF\xBF\xBD"});
}

TEST_CASE("vocabulary is ordered by frequency, ties by first appearance", "[data][tokenizer]") {
  // counts: b 2, a 2, c 1; b appears before a.
  SimpleTokenizer t;
  t.build_vocab({"b a b", "c a"});
  REQUIRE(t.vocab() == Strings{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "b", "a", "c"});
  REQUIRE(t.token_to_id("b") == 5);
  REQUIRE(t.token_to_id("zzz") == SimpleTokenizer::unk_id);
  REQUIRE(t.id_to_token(7) == "c");
  REQUIRE(t.id_to_token(99) == "[UNK]");
  SimpleTokenizer capped;
  capped.build_vocab({"b a b", "c a"}, 6);
  REQUIRE(capped.vocab_size() == 6);
  REQUIRE(capped.vocab().back() == "b");
  SimpleTokenizer frequent;
  frequent.build_vocab({"b a b", "c a"}, 30000, 2);
  REQUIRE(frequent.vocab_size() == 7);
  // from_texts adds the mock corpus: the demo words are known.
  const SimpleTokenizer m = SimpleTokenizer::from_texts({"zebra crossing"});
  for (const char* w : {"paris", "france", "car", "wheel", "king", "queen", "5+3", "8", "dog", "dogs", "→", "zebra"})
    REQUIRE(m.contains(w));
  REQUIRE(m.vocab_size() <= 30000);
}

TEST_CASE("pair encoding truncates the longer side, ties from A", "[data][tokenizer]") {
  SimpleTokenizer t;
  t.build_vocab({"a b c d e f g h i"});
  // |A| = 4, |B| = 2, budget 8 - 3 = 5: one token popped from A.
  Encoding e = t.encode_pair("a b c d", "e f", 8);
  REQUIRE(e.tokens == Strings{"[CLS]", "a", "b", "c", "[SEP]", "e", "f", "[SEP]"});
  REQUIRE(e.span_a == std::pair<Index, Index>{1, 4});
  REQUIRE(e.span_b == std::pair<Index, Index>{5, 7});
  REQUIRE(e.token_type_ids == std::vector<std::int64_t>{0, 0, 0, 0, 0, 1, 1, 1});
  REQUIRE(e.attention_mask == std::vector<std::int64_t>(8, 1));
  REQUIRE(e.input_ids[0] == SimpleTokenizer::cls_id);
  REQUIRE(e.input_ids[4] == SimpleTokenizer::sep_id);
  REQUIRE(e.input_ids[7] == SimpleTokenizer::sep_id);
  // Tie 3/3 with budget 4: pop A (2/3), then B (2/2).
  e = t.encode_pair("a b c", "d e f", 7);
  REQUIRE(e.tokens == Strings{"[CLS]", "a", "b", "[SEP]", "d", "e", "[SEP]"});
  REQUIRE(e.span_a == std::pair<Index, Index>{1, 3});
  REQUIRE(e.span_b == std::pair<Index, Index>{4, 6});
  // Both sides: 5/4 -> 4/4 -> 3/4 -> 3/3 -> 2/3 -> 2/2.
  e = t.encode_pair("a b c d e", "f g h i", 7);
  REQUIRE(e.tokens == Strings{"[CLS]", "a", "b", "[SEP]", "f", "g", "[SEP]"});
  // B longer: only B loses tokens.
  e = t.encode_pair("a", "b c d e f", 6);
  REQUIRE(e.tokens == Strings{"[CLS]", "a", "[SEP]", "b", "c", "[SEP]"});
  // No truncation needed.
  e = t.encode_pair("a", "b", 64);
  REQUIRE(e.size() == 5);
  // Empty side: the span is empty.
  e = t.encode_pair("", "b", 64);
  REQUIRE(e.span_a == std::pair<Index, Index>{1, 1});
  REQUIRE(e.span_b == std::pair<Index, Index>{2, 3});
  // Single text: [CLS] A [SEP], budget max_len - 2, no B span, all token types 0.
  e = t.encode("a b c", 4);
  REQUIRE(e.tokens == Strings{"[CLS]", "a", "b", "[SEP]"});
  REQUIRE(e.span_b == std::pair<Index, Index>{0, 0});
  REQUIRE(e.token_type_ids == std::vector<std::int64_t>(4, 0));
  // Unknown words map to [UNK].
  e = t.encode("a zebra", 10);
  REQUIRE(e.input_ids[2] == SimpleTokenizer::unk_id);
  REQUIRE_THROWS_AS(t.encode_pair("a", "b", 2), Error);
  REQUIRE_THROWS_AS(t.encode("a", 1), Error);
}

TEST_CASE("vocabulary save / load round trip and malformed files", "[data][tokenizer]") {
  TempDir dir;
  const SimpleTokenizer t = SimpleTokenizer::from_texts({"Paris→France 5+3=8"});
  const std::string p = dir.name("vocab.txt");
  t.save(p);
  const SimpleTokenizer u = SimpleTokenizer::load(p);
  REQUIRE(u.vocab() == t.vocab());
  REQUIRE(u.encode_pair("paris", "france", 16).input_ids == t.encode_pair("paris", "france", 16).input_ids);
  REQUIRE_THROWS_WITH(SimpleTokenizer::load(dir.name("missing.txt")), Catch::Contains("missing.txt"));
  REQUIRE_THROWS_WITH(SimpleTokenizer::load(dir.file("bad1.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n")),
                      Catch::Contains("bad1.txt"));
  REQUIRE_THROWS_WITH(SimpleTokenizer::load(dir.file("bad2.txt", "[PAD]\n[CLS]\n[UNK]\n[SEP]\n[MASK]\n")),
                      Catch::Contains("bad2.txt:2"));
  REQUIRE_THROWS_WITH(SimpleTokenizer::load(dir.file("bad3.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nx\ny\nx\n")),
                      Catch::Contains("bad3.txt:8") && Catch::Contains("duplicate"));
  REQUIRE_THROWS_WITH(SimpleTokenizer::load(dir.file("bad4.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nx\n\ny\n")),
                      Catch::Contains("bad4.txt:7"));
  // CRLF files load.
  const SimpleTokenizer crlf = SimpleTokenizer::load(dir.file("crlf.txt", "[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\n[MASK]\r\nx\r\n"));
  REQUIRE(crlf.token_to_id("x") == 5);
  REQUIRE_THROWS_AS(SimpleTokenizer::from_vocab({"[PAD]", "[UNK]"}), Error);
}

// =============================================================================================================
// Synthetic D_alpha
// =============================================================================================================

TEST_CASE("synthetic D_alpha has the specified counts and composition", "[data][dalpha]") {
  const std::vector<Record> recs = build_dalpha_synthetic();
  REQUIRE(recs.size() == 8244);
  const Splits s = split_records(recs);
  REQUIRE(s.train.size() == 6870);
  REQUIRE(s.val.size() == 687);
  REQUIRE(s.test.size() == 687);
  REQUIRE(s.train.front().q_text == recs.front().q_text);
  REQUIRE(s.test.back().q_text == recs.back().q_text);

  auto pos = [](const Record& r) { return r.label == 1; };
  REQUIRE(count_if_records(recs, pos) == 4122);
  REQUIRE(count_if_records(recs, [](const Record& r) { return r.label == 0; }) == 4122);
  for (const char* src : {"babi", "clutrr"}) {
    REQUIRE(count_if_records(recs, [&](const Record& r) { return r.source == src && r.label == 1; }) == 2000);
    REQUIRE(count_if_records(recs, [&](const Record& r) { return r.source == src && r.label == 0; }) == 2000);
  }
  const std::map<std::string, std::pair<std::size_t, std::string>> composition{
      {"capital", {47, "strong"}}, {"partof", {25, "strong"}}, {"isa", {20, "strong"}},
      {"analogy", {8, "strong"}},  {"weak", {12, "weak"}},     {"similar", {10, "none"}}};
  std::size_t cn_pos = 0;
  for (const auto& entry : composition) {
    const std::string& rel = entry.first;
    const auto& want = entry.second;
    const std::size_t n = count_if_records(recs, [&](const Record& r) {
      return r.source == "conceptnet" && r.label == 1 && r.relation == rel && r.strength == want.second;
    });
    INFO(rel);
    REQUIRE(n == want.first);
    cn_pos += n;
  }
  REQUIRE(cn_pos == 122);
  REQUIRE(count_if_records(recs, [](const Record& r) { return r.source == "conceptnet" && r.label == 1; }) == 122);
  REQUIRE(count_if_records(recs, [](const Record& r) { return r.source == "conceptnet" && r.label == 0; }) == 122);
  // The Paris pair is in the list.
  REQUIRE(count_if_records(recs, [](const Record& r) {
            return r.label == 1 && r.q_text == "paris" && r.k_text == "france" && r.relation == "capital";
          }) == 1);
  // Negatives: relation random_negative, strength none; the k_text comes from a positive of the same source.
  std::map<std::string, std::set<std::string>> keys;
  for (const auto& r : recs)
    if (r.label == 1) keys[r.source].insert(r.k_text);
  for (const auto& r : recs) {
    if (r.label == 1) continue;
    REQUIRE(r.relation == "random_negative");
    REQUIRE(r.strength == "none");
    REQUIRE(keys[r.source].count(r.k_text) == 1);
  }
  // The data are shuffled: the first 100 records are not all from one source.
  std::set<std::string> first_sources;
  for (std::size_t i = 0; i < 100; ++i) first_sources.insert(recs[i].source);
  REQUIRE(first_sources.size() >= 2);
}

TEST_CASE("split_records uses integer division", "[data][dalpha]") {
  std::vector<Record> r(25);
  const Splits s = split_records(r);  // 25*10/12 = 20, 25/12 = 2, rest 3
  REQUIRE(s.train.size() == 20);
  REQUIRE(s.val.size() == 2);
  REQUIRE(s.test.size() == 3);
  REQUIRE(split_records(std::vector<Record>(11)).val.size() == 0);
}

TEST_CASE("bAbI-like and CLUTRR-like records are internally consistent", "[data][dalpha]") {
  Rng rng(5);
  const std::vector<Record> babi = generate_babi_like(600, rng);
  REQUIRE(babi.size() == 600);
  std::map<std::string, int> kinds;
  for (const auto& r : babi) {
    ++kinds[r.relation];
    REQUIRE(r.label == 1);
    REQUIRE(r.strength == "strong");
    if (r.relation == "arith") {
      const auto plus = r.q_text.find('+');
      const int a = std::stoi(r.q_text.substr(0, plus)), b = std::stoi(r.q_text.substr(plus + 1));
      REQUIRE(a >= 0);
      REQUIRE(a <= 50);
      REQUIRE(b >= 0);
      REQUIRE(b <= 50);
      REQUIRE(r.k_text == std::to_string(a + b));
    } else if (r.relation == "qa18") {
      // "the X is bigger than the Y. the Y is bigger than the Z. is the P bigger than the Q?"
      std::istringstream in(r.q_text);
      std::vector<std::string> w;
      for (std::string s; in >> s;) w.push_back(s);
      REQUIRE(w.size() == 21);
      const std::string x = w[1], z = w[13].substr(0, w[13].size() - 1), p = w[16], q = w[20].substr(0, w[20].size() - 1);
      REQUIRE(w[6].substr(0, w[6].size() - 1) == w[8]);  // Y repeated
      REQUIRE(((p == x && q == z && r.k_text == "yes") || (p == z && q == x && r.k_text == "no")));
    } else {
      REQUIRE(r.relation == "qa16");
      // "A is a AN. A is COL. C is a OTHER. C is OCOL. B is a AN. what color is B?" -> COL
      std::istringstream in(r.q_text);
      std::vector<std::string> w;
      for (std::string s; in >> s;) w.push_back(s);
      REQUIRE(w.size() == 22);
      REQUIRE(w[6] == r.k_text + ".");
      REQUIRE(w[3] == w[17]);  // B has A's animal
      REQUIRE(w[3] != w[10]);  // C has another animal
      REQUIRE(w[6] != w[13]);  // and another colour
      REQUIRE(w[21] == w[14] + "?");
      REQUIRE(std::set<std::string>{w[0], w[7], w[14]}.size() == 3);
    }
  }
  for (const char* k : {"qa16", "qa18", "arith"}) {
    REQUIRE(kinds[k] > 150);  // about 200 each
    REQUIRE(kinds[k] < 250);
  }

  // Kinship facts (worked out independently of the library's table): "B is the r1 of A. C is the r2 of B."
  const std::map<std::string, std::string> kin{
      {"father-father", "grandfather"}, {"father-mother", "grandmother"}, {"mother-father", "grandfather"},
      {"mother-mother", "grandmother"}, {"father-brother", "uncle"},      {"mother-brother", "uncle"},
      {"father-sister", "aunt"},        {"mother-sister", "aunt"},        {"brother-son", "nephew"},
      {"sister-daughter", "niece"},     {"son-son", "grandson"},          {"son-daughter", "granddaughter"}};
  const std::vector<Record> cl = generate_clutrr_like(500, rng);
  std::set<std::string> rels;
  for (const auto& r : cl) {
    rels.insert(r.relation);
    REQUIRE(kin.count(r.relation) == 1);
    std::istringstream in(r.q_text);
    std::vector<std::string> w;
    for (std::string s; in >> s;) w.push_back(s);
    REQUIRE(w.size() == 12);
    const std::string b = w[0], a = w[5].substr(0, w[5].size() - 1), c = w[6];
    REQUIRE(w[11] == b + ".");
    REQUIRE(std::set<std::string>{a, b, c}.size() == 3);
    REQUIRE(r.relation == w[3] + "-" + w[9]);
    REQUIRE(r.k_text == c + " is the " + kin.at(r.relation) + " of " + a + ".");
  }
  REQUIRE(rels.size() == 12);
}

TEST_CASE("negatives keep the query and change the key", "[data][dalpha]") {
  Rng rng(1);
  std::vector<Record> pos{make_record("q1", "k1", 1, "s", "r", "strong"), make_record("q2", "k2", 1, "s", "r", "strong"),
                          make_record("q3", "k3", 1, "s", "r", "weak")};
  for (int rep = 0; rep < 50; ++rep) {
    const auto all = add_negatives(pos, rng);
    REQUIRE(all.size() == 6);
    for (std::size_t i = 0; i < 3; ++i) {
      REQUIRE(all[i].label == 1);
      REQUIRE(all[3 + i].label == 0);
      REQUIRE(all[3 + i].q_text == pos[i].q_text);
      REQUIRE(all[3 + i].k_text != pos[i].k_text);
      REQUIRE(all[3 + i].source == "s");
    }
  }
  // A list whose keys are all equal terminates (the negative keeps the same key).
  std::vector<Record> same{make_record("a", "k", 1, "s", "r", "strong"), make_record("b", "k", 1, "s", "r", "strong")};
  REQUIRE(add_negatives(same, rng).size() == 4);
  REQUIRE(add_negatives({}, rng).empty());
}

TEST_CASE("D_alpha is deterministic per seed and differs across seeds", "[data][dalpha]") {
  DalphaOptions o;
  o.n_per_source = 300;
  o.seed = 7;
  const auto a = build_dalpha_synthetic(o), b = build_dalpha_synthetic(o);
  o.seed = 8;
  const auto c = build_dalpha_synthetic(o);
  REQUIRE(a.size() == 2 * (300 + 300 + 122));
  REQUIRE(a.size() == c.size());
  bool all_same = true, any_diff = false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    all_same = all_same && a[i].q_text == b[i].q_text && a[i].k_text == b[i].k_text && a[i].label == b[i].label;
    any_diff = any_diff || a[i].q_text != c[i].q_text || a[i].k_text != c[i].k_text;
  }
  REQUIRE(all_same);
  REQUIRE(any_diff);
}

TEST_CASE("mock oracle draws alpha in the band of the strength", "[data][oracle]") {
  std::vector<Record> recs = build_dalpha_synthetic();
  attach_mock_oracle(recs, 42);
  std::size_t n_strong = 0, n_weak = 0, n_none = 0;
  for (const auto& r : recs) {
    if (r.strength == "strong") {
      ++n_strong;
      REQUIRE(r.alpha > 0.75);
      REQUIRE(r.alpha < 0.95);
    } else if (r.strength == "weak") {
      ++n_weak;
      REQUIRE(r.alpha > 0.15);
      REQUIRE(r.alpha < 0.30);
    } else {
      ++n_none;
      REQUIRE(r.alpha >= 0.0);
      REQUIRE(r.alpha < 0.05);
    }
  }
  // ~50% none (all negatives + 10 similar), ~50% strong, 12 weak pairs.
  REQUIRE(n_weak == 12);
  REQUIRE(n_none == 4122 + 10);
  REQUIRE(n_strong == 4122 - 22);
  std::vector<Record> again = build_dalpha_synthetic();
  attach_mock_oracle(again, 42);
  REQUIRE(again[17].alpha == recs[17].alpha);
  attach_mock_oracle(again, 43);
  REQUIRE(again[17].alpha != recs[17].alpha);
}

TEST_CASE("mock_alpha has the 45/25/30 density and stays below 0.95", "[data][oracle]") {
  Rng rng(123);
  const Tensor<double> a = mock_alpha<double>({200, 1000}, rng);
  REQUIRE(a.shape == Shape{200, 1000});
  const double n = static_cast<double>(a.numel());
  double low = 0, mid = 0, high = 0, gap = 0, sum = 0, mx = 0;
  for (Index i = 0; i < a.numel(); ++i) {
    const double v = a[i];
    sum += v;
    mx = std::max(mx, v);
    if (v >= 0 && v < 0.05) ++low;
    else if (v >= 0.15 && v < 0.30) ++mid;
    else if (v >= 0.75 && v < 0.95) ++high;
    else ++gap;
  }
  // Binomial sd at n = 2e5 is ~0.0011: 0.006 is > 5 sd.
  REQUIRE(low / n == Approx(0.45).margin(0.006));
  REQUIRE(mid / n == Approx(0.25).margin(0.006));
  REQUIRE(high / n == Approx(0.30).margin(0.006));
  REQUIRE(gap == 0);
  REQUIRE(mx < 0.95);
  // mean = 0.45*0.025 + 0.25*0.225 + 0.30*0.85 = 0.3225
  REQUIRE(sum / n == Approx(0.3225).margin(0.003));
  Rng r1(5), r2(5);
  REQUIRE(mock_alpha<float>({10}, r1).data == mock_alpha<float>({10}, r2).data);
}

TEST_CASE("collation pads right and fills only the q x k oracle block", "[data][collate]") {
  SimpleTokenizer tok;
  tok.build_vocab({"paris france car wheel has a"});
  std::vector<Record> recs{make_record("paris", "france", 1, "conceptnet", "capital", "strong"),
                           make_record("the car has", "a wheel", 0, "conceptnet", "random_negative", "none")};
  recs[0].alpha = 0.9;
  recs[1].alpha = 0.02;
  const PairBatch<double> b = collate_pairs<double>(recs, tok, 64);
  // row 0: [CLS] paris [SEP] france [SEP]        (5 tokens)
  // row 1: [CLS] the car has [SEP] a wheel [SEP] (8 tokens) -> T = 8
  REQUIRE(b.input_ids.shape == Shape{2, 8});
  REQUIRE(b.alpha_oracle.shape == Shape{2, 8, 8});
  REQUIRE(b.labels[0] == 1);
  REQUIRE(b.labels[1] == 0);
  const std::vector<std::int64_t> row0{2, tok.token_to_id("paris"), 3, tok.token_to_id("france"), 3, 0, 0, 0};
  for (Index t = 0; t < 8; ++t) {
    REQUIRE(b.input_ids[t] == row0[static_cast<std::size_t>(t)]);
    REQUIRE(b.attention_mask[t] == (t < 5 ? 1 : 0));
    REQUIRE(b.token_type_ids[t] == (t == 3 || t == 4 ? 1 : 0));
    REQUIRE(b.attention_mask[8 + t] == 1);
  }
  REQUIRE(b.input_ids[8 + 1] == SimpleTokenizer::unk_id);  // "the" is not in this vocabulary
  // Row 0 block: query 1 (paris) x key 3 (france). Row 1 block: queries 1..3 x keys 5..6.
  std::size_t labelled = 0;
  for (Index bb = 0; bb < 2; ++bb)
    for (Index i = 0; i < 8; ++i)
      for (Index j = 0; j < 8; ++j) {
        const double v = b.alpha_oracle[(bb * 8 + i) * 8 + j];
        const bool in_block = bb == 0 ? (i == 1 && j == 3) : (i >= 1 && i <= 3 && j >= 5 && j <= 6);
        if (in_block) {
          ++labelled;
          REQUIRE(v == (bb == 0 ? 0.9 : 0.02));
        } else {
          REQUIRE(std::isnan(v));
        }
      }
  REQUIRE(labelled == 1 + 3 * 2);
  REQUIRE_THROWS_AS(collate_pairs<double>(recs, std::vector<std::size_t>{}, tok, 64), Error);
  REQUIRE_THROWS_AS(collate_pairs<double>(recs, std::vector<std::size_t>{2}, tok, 64), Error);

  const auto batches = make_batches(10, 4, false);
  REQUIRE(batches.size() == 3);
  REQUIRE(batches[2] == std::vector<std::size_t>{8, 9});
  Rng rng(3);
  auto sh = make_batches(10, 4, true, &rng);
  std::vector<std::size_t> all;
  for (const auto& bt : sh) all.insert(all.end(), bt.begin(), bt.end());
  std::sort(all.begin(), all.end());
  REQUIRE(all == std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
}

// =============================================================================================================
// Loaders
// =============================================================================================================

TEST_CASE("bAbI task files: stories, questions and malformed lines", "[data][loaders]") {
  TempDir dir;
  const std::string p = dir.file("qa16_basic-induction_train.txt",
                                 "1 Lily is a swan.\n"
                                 "2 Lily is white.\n"
                                 "3 Bernhard is green.\n"
                                 "4 Greg is a swan.\n"
                                 "5 What color is Greg?\twhite\t4 2\n"
                                 "1 Julius is a lion.\r\n"
                                 "2 What color is Julius?\tyellow\t1\n"
                                 "3 Brian is a frog.\n"
                                 "4 What is Brian? \tfrog\t3\n"
                                 "\n");
  const std::vector<Record> r = load_babi(p);
  REQUIRE(r.size() == 3);
  REQUIRE(r[0].q_text == "Lily is a swan. Lily is white. Bernhard is green. Greg is a swan. What color is Greg?");
  REQUIRE(r[0].k_text == "white");
  REQUIRE(r[0].relation == "qa16");
  REQUIRE(r[0].source == "babi");
  REQUIRE(r[0].strength == "strong");
  REQUIRE(r[0].label == 1);
  REQUIRE(r[1].q_text == "Julius is a lion. What color is Julius?");
  REQUIRE(r[2].q_text == "Julius is a lion. Brian is a frog. What is Brian?");  // earlier questions are not facts
  REQUIRE(r[2].k_text == "frog");
  REQUIRE(load_babi(p, "mytask", 1).size() == 1);
  REQUIRE(load_babi(p, "mytask", 1)[0].relation == "mytask");
  REQUIRE(babi_task_from_filename("/x/en/qa18_size-reasoning_test.txt") == "qa18");
  REQUIRE(babi_task_from_filename("stories.txt") == "babi");

  // Quotas over several files: floor(3*1/2) = 1 from the first, the rest (2) from the second.
  const std::string p2 = dir.file("qa18_x.txt", "1 The box is big.\n2 Is it big?\tyes\t1\n3 Is it small?\tno\t1\n");
  const auto both = load_babi_tasks({p, p2}, 3);
  REQUIRE(both.size() == 3);
  REQUIRE(both[0].relation == "qa16");
  REQUIRE(both[1].relation == "qa18");
  REQUIRE(both[2].k_text == "no");

  REQUIRE_THROWS_WITH(load_babi(dir.name("nope.txt")), Catch::Contains("nope.txt"));
  REQUIRE_THROWS_WITH(load_babi(dir.file("b1.txt", "1 ok.\nLily is a swan.\n")), Catch::Contains("b1.txt:2"));
  REQUIRE_THROWS_WITH(load_babi(dir.file("b2.txt", "1 a.\n2 b.\n4 c.\n")),
                      Catch::Contains("b2.txt:3") && Catch::Contains("does not follow"));
  REQUIRE_THROWS_WITH(load_babi(dir.file("b3.txt", "1 Where?\t\t1\n")), Catch::Contains("b3.txt:1"));
  REQUIRE_THROWS_WITH(load_babi(dir.file("b4.txt", "1 Where?\tthere\tx\n")), Catch::Contains("b4.txt:1"));
  REQUIRE_THROWS_WITH(load_babi(dir.file("b5.txt", "2 starts at two.\n")), Catch::Contains("b5.txt:1"));
  REQUIRE_THROWS_WITH(load_babi(dir.file("b6.txt", "12345678901234 overflow\n")), Catch::Contains("b6.txt:1"));
  REQUIRE_THROWS_AS(load_babi(dir.file("b7.txt", std::string("\x00\xff\xfe\x01 garbage\n\x7f", 15))), Error);
  REQUIRE(load_babi(dir.file("empty.txt", "")).empty());
}

TEST_CASE("CLUTRR CSV: quoted fields, story choice, query parsing, errors", "[data][loaders]") {
  TempDir dir;
  const std::string p = dir.file(
      "clutrr.csv",
      ",id,story,query,target,clean_story\n"
      "0,a1,\"[Anna] took her son [Bob] to the park, and [Bob]'s daughter [Cleo] came too.\",\"('Anna', 'Cleo')\","
      "granddaughter,\"Anna took her son Bob to the park, and Bob's daughter Cleo came too.\"\n"
      "1,a2,\"[Dan] and his sister [Eve] ate.\nThey were \"\"happy\"\".\",\"('Dan', 'Eve')\",sister,\n");
  const std::vector<Record> r = load_clutrr_csv(p);
  REQUIRE(r.size() == 2);
  REQUIRE(r[0].q_text == "Anna took her son Bob to the park, and Bob's daughter Cleo came too.");
  REQUIRE(r[0].k_text == "Cleo is the granddaughter of Anna.");
  REQUIRE(r[0].relation == "granddaughter");
  REQUIRE(r[0].source == "clutrr");
  // clean_story empty: the raw story without the [ ] markers, embedded newline and doubled quotes kept.
  REQUIRE(r[1].q_text == "Dan and his sister Eve ate.\nThey were \"happy\".");
  REQUIRE(r[1].k_text == "Eve is the sister of Dan.");
  REQUIRE(load_clutrr_csv(p, 1).size() == 1);

  const CsvTable t = parse_csv("a,b\r\n1,\"x,y\"\r\n\r\n\"\",2", "mem");
  REQUIRE(t.header == Strings{"a", "b"});
  REQUIRE(t.rows.size() == 2);
  REQUIRE(t.rows[0] == Strings{"1", "x,y"});
  REQUIRE(t.rows[1] == Strings{"", "2"});
  REQUIRE(t.row_line == std::vector<std::size_t>{2, 4});

  const std::string hdr = "story,query,target\n";
  REQUIRE_THROWS_WITH(load_clutrr_csv(dir.file("c1.csv", hdr + "s,\"('A', 'B')\",mother\ns2,x\n")),
                      Catch::Contains("c1.csv:3") && Catch::Contains("fields"));
  REQUIRE_THROWS_WITH(load_clutrr_csv(dir.file("c2.csv", hdr + "s,Anna,mother\n")),
                      Catch::Contains("c2.csv:2") && Catch::Contains("query"));
  REQUIRE_THROWS_WITH(load_clutrr_csv(dir.file("c3.csv", "story,target\ns,mother\n")), Catch::Contains("query"));
  REQUIRE_THROWS_WITH(load_clutrr_csv(dir.file("c4.csv", hdr + "\"unterminated,x,y\n")),
                      Catch::Contains("c4.csv:2") && Catch::Contains("unterminated"));
  REQUIRE_THROWS_WITH(load_clutrr_csv(dir.file("c5.csv", hdr + "s,\"('A', 'B')\",\n")), Catch::Contains("c5.csv:2"));
  REQUIRE_THROWS_WITH(load_clutrr_csv(dir.file("c6.csv", "")), Catch::Contains("c6.csv"));
  REQUIRE_THROWS_AS(load_clutrr_csv(dir.file("c7.csv", hdr + "a\"b,c,d\n")), Error);
  REQUIRE_THROWS_AS(load_clutrr_csv(dir.name("missing.csv")), Error);
}

TEST_CASE("ConceptNet assertions and capitals lists", "[data][loaders]") {
  TempDir dir;
  const std::string p = dir.file("assertions.csv",
                                 "/a/[/r/IsA/,/c/en/dog/,/c/en/animal/]\t/r/IsA\t/c/en/dog\t/c/en/animal\t{\"w\": 1}\n"
                                 "/a/x\t/r/PartOf\t/c/en/wheel/n\t/c/en/car\t{}\n"
                                 "/a/x\t/r/IsA\t/c/fr/chien\t/c/fr/animal\t{}\n"
                                 "/a/x\t/r/RelatedTo\t/c/en/a\t/c/en/b\t{}\n"
                                 "/a/x\t/r/IsA\t/c/en/ice_cream\t/c/en/dessert/n/wn/food\t{}\n");
  const std::vector<Record> r = load_conceptnet_assertions(p);
  REQUIRE(r.size() == 3);
  REQUIRE((r[0].q_text == "dog" && r[0].k_text == "animal" && r[0].relation == "isa"));
  REQUIRE((r[1].q_text == "car" && r[1].k_text == "wheel" && r[1].relation == "partof"));  // whole -> part
  REQUIRE((r[2].q_text == "ice cream" && r[2].k_text == "dessert"));
  REQUIRE(load_conceptnet_assertions(p, 2).size() == 2);
  REQUIRE(load_conceptnet_assertions(p, 0).empty());
  REQUIRE_THROWS_WITH(load_conceptnet_assertions(dir.file("bad.csv", "/a/x\t/r/IsA\t/c/en/a\t/c/en/b\njunk line\n")),
                      Catch::Contains("bad.csv:2"));
  REQUIRE_THROWS_WITH(load_conceptnet_assertions(dir.file("bad2.csv", "/a/x\t/r/IsA\t/c/en/\t/c/en/b\n")),
                      Catch::Contains("bad2.csv:1"));

  const std::string c = dir.file("capitals.txt", "capital,country\nParis,France\n# a comment\n\nberlin\tgermany\n");
  const auto caps = load_capitals(c);
  REQUIRE(caps.size() == 2);
  REQUIRE((caps[0].q_text == "Paris" && caps[0].k_text == "France" && caps[0].relation == "capital"));
  REQUIRE((caps[1].q_text == "berlin" && caps[1].k_text == "germany"));
  REQUIRE_THROWS_WITH(load_capitals(dir.file("cap_bad.txt", "paris,france\nrome italy\n")), Catch::Contains("cap_bad.txt:2"));
  REQUIRE_THROWS_WITH(load_capitals(dir.file("cap_bad2.txt", "paris,\n")), Catch::Contains("cap_bad2.txt:1"));
  REQUIRE_THROWS_AS(load_capitals(dir.file("cap_empty.txt", "# nothing\n")), Error);
}

TEST_CASE("D_alpha from files, errors and fallback to synthetic", "[data][loaders]") {
  TempDir dir;
  DalphaOptions opt;
  opt.n_per_source = 50;
  opt.seed = 3;
  // No files: identical to the synthetic build.
  DalphaFiles none;
  const auto syn = build_dalpha_synthetic(opt);
  const auto same = build_dalpha(none, opt);
  REQUIRE(same.size() == syn.size());
  for (std::size_t i = 0; i < syn.size(); ++i) REQUIRE((same[i].q_text == syn[i].q_text && same[i].k_text == syn[i].k_text));

  DalphaFiles f;
  f.babi = {dir.file("qa16_t.txt", "1 A is a swan.\n2 A is white.\n3 B is a swan.\n4 What color is B?\twhite\t3 2\n"
                                    "1 C is a frog.\n2 C is green.\n3 D is a frog.\n4 What color is D?\tgreen\t3 2\n")};
  f.clutrr_csv = dir.file("c.csv", "story,query,target\n\"[X] is [Y]'s mother.\",\"('Y', 'X')\",mother\n");
  f.conceptnet_csv = dir.file("a.csv", "/a/x\t/r/IsA\t/c/en/dog\t/c/en/animal\t{}\n/a/x\t/r/IsA\t/c/en/cat\t/c/en/pet\t{}\n");
  f.capitals = dir.file("cap.txt", "paris\tfrance\nrome\titaly\n");
  std::ostringstream log;
  f.log = &log;
  const auto real = build_dalpha(f, opt);
  // bAbI 2 + CLUTRR 1 + ConceptNet (2 capitals + 2 IsA) positives, each with a negative.
  REQUIRE(real.size() == 2 * (2 + 1 + 4));
  REQUIRE(count_if_records(real, [](const Record& r) { return r.source == "babi" && r.label == 1; }) == 2);
  REQUIRE(count_if_records(real, [](const Record& r) { return r.relation == "capital"; }) == 2);
  REQUIRE(count_if_records(real, [](const Record& r) { return r.relation == "isa"; }) == 2);
  REQUIRE(count_if_records(real, [](const Record& r) { return r.label == 0; }) == 7);
  REQUIRE(log.str().find("loaded real clutrr: 1") != std::string::npos);

  // A missing file is an error naming it...
  DalphaFiles bad = f;
  bad.clutrr_csv = dir.name("no_such.csv");
  REQUIRE_THROWS_WITH(build_dalpha(bad, opt), Catch::Contains("no_such.csv"));
  // ... or, with the fallback, a notice and the synthetic source.
  std::ostringstream notice;
  bad.log = &notice;
  bad.fallback_to_synthetic = true;
  const auto fb = build_dalpha(bad, opt);
  REQUIRE(notice.str().find("clutrr") != std::string::npos);
  REQUIRE(notice.str().find("no_such.csv") != std::string::npos);
  REQUIRE(notice.str().find("using synthetic") != std::string::npos);
  REQUIRE(count_if_records(fb, [](const Record& r) { return r.source == "clutrr"; }) == 2 * 50);
  // A malformed file falls back too, and an empty one (no records) as well.
  bad.babi = {dir.file("qa16_bad.txt", "garbage\n")};
  bad.conceptnet_csv = dir.file("empty.csv", "");
  std::ostringstream n2;
  bad.log = &n2;
  const auto fb2 = build_dalpha(bad, opt);
  REQUIRE(count_if_records(fb2, [](const Record& r) { return r.source == "babi"; }) == 2 * 50);
  // The empty assertion file still has the 2 capitals of cap.txt, so ConceptNet stays real: 2 + 2 negatives.
  REQUIRE(count_if_records(fb2, [](const Record& r) { return r.source == "conceptnet"; }) == 4);
  REQUIRE(n2.str().find("qa16_bad.txt:1") != std::string::npos);
}

// =============================================================================================================
// Masked-LM data
// =============================================================================================================

TEST_CASE("sentence splitting, 90/5/5 split and chunking", "[data][mlm]") {
  const std::string text =
      "Short line.\n"
      "This is the first sentence here. Tiny one! And here is a third sentence [12] with a citation? yes\n";
  const Strings s = split_sentences(text);
  REQUIRE(s == Strings{"This is the first sentence here.", "And here is a third sentence   with a citation?"});

  Strings many;
  for (int i = 0; i < 100; ++i) many.push_back("sentence number " + std::to_string(i) + " is here");
  const TextSplits a = split_texts(many, 1), b = split_texts(many, 1), c = split_texts(many, 2);
  REQUIRE(a.train.size() == 90);
  REQUIRE(a.val.size() == 5);
  REQUIRE(a.test.size() == 5);
  REQUIRE(a.train == b.train);
  REQUIRE(a.train != c.train);
  Strings back = a.train;
  back.insert(back.end(), a.val.begin(), a.val.end());
  back.insert(back.end(), a.test.begin(), a.test.end());
  std::sort(back.begin(), back.end());
  Strings sorted = many;
  std::sort(sorted.begin(), sorted.end());
  REQUIRE(back == sorted);
  // n = 5: train int(4.5) = 4, val empty -> the first 10 (here 5) shuffled sentences, test 1.
  const TextSplits small = split_texts(Strings(many.begin(), many.begin() + 5), 1);
  REQUIRE(small.train.size() == 4);
  REQUIRE(small.val.size() == 5);
  REQUIRE(small.test.size() == 1);
  REQUIRE_THROWS_AS(split_texts({}, 1), Error);

  SimpleTokenizer tok;
  tok.build_vocab({"a b c d e"});
  const auto chunks = make_mlm_chunks({"a b c", "d e"}, tok, 4);
  const auto id = [&](const char* w) { return tok.token_to_id(w); };
  REQUIRE(chunks.size() == 3);
  REQUIRE(chunks[0] == std::vector<std::int64_t>{2, id("a"), id("b"), 3});
  REQUIRE(chunks[1] == std::vector<std::int64_t>{2, id("c"), id("d"), 3});
  REQUIRE(chunks[2] == std::vector<std::int64_t>{2, id("e"), 3});

  TempDir dir;
  const Strings from_file = read_text_corpus(dir.file("corpus.txt", text));
  REQUIRE(from_file == s);
  REQUIRE_THROWS_AS(read_text_corpus(dir.name("none.txt")), Error);
}

TEST_CASE("MLM masking rates, at least one target per row, labels", "[data][mlm]") {
  const Index vocab = 100;
  Rng gen(9);
  std::vector<std::vector<std::int64_t>> chunks;
  for (int r = 0; r < 1000; ++r) {
    std::vector<std::int64_t> c{SimpleTokenizer::cls_id};
    for (int t = 0; t < 62; ++t) c.push_back(5 + static_cast<std::int64_t>(gen.below(vocab - 5)));
    c.push_back(SimpleTokenizer::sep_id);
    chunks.push_back(c);
  }
  chunks.push_back({SimpleTokenizer::cls_id, 7, SimpleTokenizer::sep_id});  // one candidate only
  std::vector<std::size_t> idx(chunks.size());
  std::iota(idx.begin(), idx.end(), std::size_t(0));
  Rng rng(4);
  const MlmBatch<double> b = collate_mlm<double>(chunks, idx, vocab, rng);
  const Index B = b.input_ids.size(0), T = b.input_ids.size(1);
  REQUIRE(B == 1001);
  REQUIRE(T == 64);
  double cand = 0, sel = 0, masked = 0, randomised = 0, kept = 0;
  for (Index r = 0; r < B; ++r) {
    const auto& c = chunks[static_cast<std::size_t>(r)];
    int row_sel = 0;
    for (Index t = 0; t < T; ++t) {
      const Index k = r * T + t;
      const bool real = t < static_cast<Index>(c.size());
      REQUIRE(b.attention_mask[k] == (real ? 1 : 0));
      REQUIRE(b.token_type_ids[k] == 0);
      const std::int64_t orig = real ? c[static_cast<std::size_t>(t)] : 0;
      const bool special = !real || orig == SimpleTokenizer::cls_id || orig == SimpleTokenizer::sep_id;
      if (special) {
        REQUIRE(b.labels[k] == -100);
        REQUIRE(b.input_ids[k] == orig);
        continue;
      }
      ++cand;
      if (b.labels[k] == -100) {
        REQUIRE(b.input_ids[k] == orig);
        continue;
      }
      ++row_sel;
      ++sel;
      REQUIRE(b.labels[k] == orig);
      if (b.input_ids[k] == SimpleTokenizer::mask_id) ++masked;
      else if (b.input_ids[k] == orig) ++kept;
      else {
        ++randomised;
        REQUIRE(b.input_ids[k] >= 5);
        REQUIRE(b.input_ids[k] < vocab);
      }
    }
    REQUIRE(row_sel >= 1);
  }
  REQUIRE(b.labels[1000 * T + 1] == 7);  // the one-candidate row
  // 62,001 candidates: selection sd ~0.0014; among ~9,300 selected, sd of the 0.8 share ~0.004.
  REQUIRE(sel / cand == Approx(0.15).margin(0.007));
  REQUIRE(masked / sel == Approx(0.80).margin(0.02));
  // A random replacement equals the original with probability 1/95, which then counts as kept.
  REQUIRE(randomised / sel == Approx(0.10 * 94.0 / 95.0).margin(0.015));
  REQUIRE(kept / sel == Approx(0.10 + 0.10 / 95.0).margin(0.015));
  // Mock oracle: NaN on padded rows or columns, in [0, 0.95) elsewhere.
  REQUIRE(b.alpha_oracle.shape == Shape{B, T, T});
  for (Index i = 0; i < T; ++i)
    for (Index j = 0; j < T; ++j) {
      const double v = b.alpha_oracle[(1000 * T + i) * T + j];
      if (i < 3 && j < 3) {
        REQUIRE(v >= 0);
        REQUIRE(v < 0.95);
      } else {
        REQUIRE(std::isnan(v));
      }
    }
  // Deterministic for the generator state; no oracle when not asked.
  Rng r1(4);
  MlmOptions o;
  o.mock_oracle = false;
  const MlmBatch<double> again = collate_mlm<double>(chunks, idx, vocab, r1, o);
  REQUIRE(again.input_ids.data == b.input_ids.data);
  REQUIRE(again.labels.data == b.labels.data);
  REQUIRE(again.alpha_oracle.numel() == 0);
  REQUIRE_THROWS_AS(collate_mlm<double>(chunks, idx, 5, rng), Error);
  REQUIRE_THROWS_AS(collate_mlm<double>(chunks, {chunks.size()}, vocab, rng), Error);
}

// =============================================================================================================
// Oracle tools and JSONL
// =============================================================================================================

TEST_CASE("oracle alpha formula", "[data][oracle]") {
  REQUIRE(oracle_alpha(0.0, 0.0) == Approx(0.5));
  // phi - 0.3 sim = 2 - 0.3 = 1.7
  REQUIRE(oracle_alpha(2.0, 1.0) == Approx(1.0 / (1.0 + std::exp(-1.7))));
  REQUIRE(oracle_alpha(10.0, 0.0) == 0.95);  // clamped
  REQUIRE(oracle_alpha(-800.0, 0.0) >= 0.0);
  REQUIRE(oracle_alpha(-800.0, 0.0) < 1e-300);
  REQUIRE(oracle_alpha(1.0, 1.0, 1.0) == Approx(0.5));
  REQUIRE_THROWS_AS(oracle_alpha(std::nan(""), 0.0), Error);
}

TEST_CASE("alpha cache: lookup, attach, JSONL round trip and bad lines", "[data][oracle][io]") {
  TempDir dir;
  AlphaCache cache;
  cache.add({"paris", "france", 0.9, 3.2, 0.4});
  cache.add({"dog", "dogs", 0.02, std::nullopt, std::nullopt});
  cache.add({"paris", "france", 0.85, std::nullopt, 0.5});  // replaces
  REQUIRE(cache.size() == 2);
  REQUIRE(cache.find("paris", "france")->alpha == 0.85);
  REQUIRE(cache.find("france", "paris") == nullptr);
  REQUIRE_THROWS_AS(cache.add({"a", "b", 0.99, std::nullopt, std::nullopt}), Error);

  std::vector<Record> recs{make_record("paris", "france", 1, "conceptnet", "capital", "strong"),
                           make_record("dog", "dogs", 1, "conceptnet", "similar", "none")};
  REQUIRE(cache.attach(recs) == 2);
  REQUIRE(recs[0].alpha == 0.85);
  REQUIRE(recs[1].alpha == 0.02);
  recs.push_back(make_record("king", "queen", 1, "conceptnet", "analogy", "strong"));
  REQUIRE_THROWS_WITH(cache.attach(recs), Catch::Contains("king") && Catch::Contains("1 record"));
  REQUIRE(cache.attach(recs, false) == 2);
  REQUIRE(std::isnan(recs[2].alpha));

  const std::string p = dir.name("alpha.jsonl");
  io::write_alpha_cache(p, cache);
  const AlphaCache back = io::read_alpha_cache(p);
  REQUIRE(back.size() == 2);
  REQUIRE(back.entries()[0].premise == "paris");
  REQUIRE(back.entries()[0].alpha == 0.85);
  REQUIRE(!back.entries()[0].phi.has_value());
  REQUIRE(back.entries()[0].sim == 0.5);
  REQUIRE(back.entries()[1].hypothesis == "dogs");

  // Blank lines are skipped; the reference's q_text/k_text keys are accepted; null phi = absent.
  const AlphaCache ref = io::read_alpha_cache(dir.file(
      "ref.jsonl", "{\"q_text\": \"car\", \"k_text\": \"wheel\", \"alpha\": 0.8, \"label\": 1}\n\n"
                   "{\"premise\": \"a\", \"hypothesis\": \"b\", \"alpha\": 0, \"phi\": null, \"sim\": 0.1}\n"));
  REQUIRE(ref.size() == 2);
  REQUIRE(ref.find("car", "wheel")->alpha == 0.8);
  REQUIRE(ref.find("a", "b")->sim == 0.1);

  const std::string ok = "{\"premise\": \"a\", \"hypothesis\": \"b\", \"alpha\": 0.5}\n";
  REQUIRE_THROWS_WITH(io::read_alpha_cache(dir.file("b1.jsonl", ok + ok + "{not json\n")),
                      Catch::Contains("b1.jsonl:3") && Catch::Contains("invalid JSON"));
  REQUIRE_THROWS_WITH(io::read_alpha_cache(dir.file("b2.jsonl", ok + "{\"premise\": \"a\", \"hypothesis\": \"b\"}\n")),
                      Catch::Contains("b2.jsonl:2") && Catch::Contains("alpha"));
  REQUIRE_THROWS_WITH(io::read_alpha_cache(dir.file("b3.jsonl", "{\"premise\": \"a\", \"hypothesis\": \"b\", \"alpha\": 1.2}\n")),
                      Catch::Contains("b3.jsonl:1"));
  REQUIRE_THROWS_WITH(io::read_alpha_cache(dir.file("b4.jsonl", "{\"premise\": \"a\", \"hypothesis\": \"b\", \"alpha\": \"0.5\"}\n")),
                      Catch::Contains("b4.jsonl:1") && Catch::Contains("number"));
  REQUIRE_THROWS_WITH(io::read_alpha_cache(dir.file("b5.jsonl", "[1, 2]\n")), Catch::Contains("b5.jsonl:1"));
  REQUIRE_THROWS_WITH(io::read_alpha_cache(dir.file("b6.jsonl", "{\"premise\": 3, \"hypothesis\": \"b\", \"alpha\": 0.1}\n")),
                      Catch::Contains("b6.jsonl:1") && Catch::Contains("premise"));
  REQUIRE_THROWS_AS(io::read_alpha_cache(dir.file("b7.jsonl", std::string("\xff\xfe\x00garbage", 10))), Error);
  REQUIRE_THROWS_AS(io::read_alpha_cache(dir.name("missing.jsonl")), Error);

  // D_alpha records round trip.
  std::vector<Record> small = build_dalpha_synthetic({10, 1});
  attach_mock_oracle(small, 1);
  const std::string rp = dir.name("records.jsonl");
  io::write_records(rp, small);
  const auto rb = io::read_records(rp);
  REQUIRE(rb.size() == small.size());
  for (std::size_t i = 0; i < small.size(); ++i) {
    REQUIRE(rb[i].q_text == small[i].q_text);
    REQUIRE(rb[i].k_text == small[i].k_text);
    REQUIRE(rb[i].label == small[i].label);
    REQUIRE(rb[i].relation == small[i].relation);
    REQUIRE(rb[i].strength == small[i].strength);
    REQUIRE(rb[i].alpha == small[i].alpha);
  }
  REQUIRE_THROWS_WITH(io::read_records(dir.file("r.jsonl", "{\"q_text\": \"a\", \"k_text\": \"b\", \"label\": 2}\n")),
                      Catch::Contains("r.jsonl:1"));
}

TEST_CASE("alpha cache read line by line keeping the run's pairs: the same entries and errors", "[data][oracle][io]") {
  TempDir dir;
  const std::string lines = "{\"premise\": \"paris\", \"hypothesis\": \"france\", \"alpha\": 0.8}\n\n"
                            "{\"q_text\": \"car\", \"k_text\": \"wheel\", \"alpha\": 0.7, \"phi\": 1.5}\r\n"
                            "{\"premise\": \"paris\", \"hypothesis\": \"france\", \"alpha\": 0.9, \"sim\": 0.2}\n"
                            "{\"premise\": \"dog\", \"hypothesis\": \"animal\", \"alpha\": 0.6}";  // no newline
  const std::string p = dir.file("c.jsonl", lines);
  const AlphaCache all = io::read_alpha_cache(p);
  const AlphaCache every = io::read_alpha_cache(p, [](const std::string&, const std::string&) { return true; });
  REQUIRE(every.size() == all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    CHECK(every.entries()[i].premise == all.entries()[i].premise);
    CHECK(every.entries()[i].alpha == all.entries()[i].alpha);
    CHECK(every.entries()[i].phi == all.entries()[i].phi);
    CHECK(every.entries()[i].sim == all.entries()[i].sim);
  }
  const AlphaCache some =
      io::read_alpha_cache(p, [](const std::string& q, const std::string&) { return q == "paris" || q == "dog"; });
  REQUIRE(some.size() == 2);
  CHECK(some.find("paris", "france")->alpha == 0.9);  // the last line of a pair wins, as in the whole read
  CHECK(some.find("dog", "animal")->alpha == 0.6);
  CHECK(some.find("car", "wheel") == nullptr);
  // a bad line is an error whether its pair is kept or not, with the whole read's message
  const auto none = [](const std::string&, const std::string&) { return false; };
  const Strings bad_lines{"{not json\n", "{\"premise\": \"a\", \"hypothesis\": \"b\"}\n",
                          "{\"premise\": \"a\", \"hypothesis\": \"b\", \"alpha\": 1.2}"};
  for (const std::string& bad : bad_lines) {
    const std::string b = dir.file("bad.jsonl", lines + "\n" + bad);
    std::string whole, streamed;
    try {
      io::read_alpha_cache(b);
    } catch (const Error& e) {
      whole = e.what();
    }
    try {
      io::read_alpha_cache(b, none);
    } catch (const Error& e) {
      streamed = e.what();
    }
    CHECK_THAT(whole, Catch::Contains("bad.jsonl:6"));
    CHECK(streamed == whole);
  }
  CHECK_THROWS_WITH(io::read_alpha_cache(dir.name("missing.jsonl"), none), Catch::Contains("cannot open file"));
}

TEST_CASE("readers never crash on random garbage: they succeed or throw dea::Error", "[data][loaders][io]") {
  TempDir dir;
  Rng rng(2024);
  const std::string alphabet = "0123456789 \t\n\r,\"'()[]{}:/\\abcXYZ.+-*=?";
  const SimpleTokenizer tok = SimpleTokenizer::from_texts({});
  // Each file reader either returns or throws dea::Error (another exception type escapes and fails the test), and
  // its message then names the file, so a user learns which file is bad. Outcomes are counted per reader.
  std::map<std::string, std::pair<int, int>> outcomes;  // reader -> (accepted, rejected)
  for (int trial = 0; trial < 300; ++trial) {
    std::string junk;
    const std::size_t len = static_cast<std::size_t>(rng.below(400));
    for (std::size_t i = 0; i < len; ++i)
      junk += (rng.uniform() < 0.7) ? alphabet[static_cast<std::size_t>(rng.below(alphabet.size()))]
                                    : static_cast<char>(rng.below(256));
    const std::string p = dir.file("junk" + std::to_string(trial), junk);
    auto read = [&](const std::string& reader, auto&& f) {
      try {
        f();
        ++outcomes[reader].first;
      } catch (const Error& e) {
        ++outcomes[reader].second;
        INFO(reader << " on junk " << trial << ": " << e.what());
        CHECK(std::string(e.what()).find(p) != std::string::npos);
      }
    };
    read("load_babi", [&] { load_babi(p); });
    read("load_clutrr_csv", [&] { load_clutrr_csv(p); });
    read("load_conceptnet_assertions", [&] { load_conceptnet_assertions(p); });
    read("load_capitals", [&] { load_capitals(p); });
    read("read_alpha_cache", [&] { io::read_alpha_cache(p); });
    read("read_records", [&] { io::read_records(p); });
    read("SimpleTokenizer::load", [&] { SimpleTokenizer::load(p); });

    // Any text splits into sentences, each trimmed and of at least the 4 words asked for by default.
    std::vector<std::string> sentences;
    REQUIRE_NOTHROW(sentences = split_sentences(junk));
    for (const std::string& sent : sentences) REQUIRE(!sent.empty());
    // Any text encodes: [CLS] A [SEP] B [SEP] within max_len, every id in the vocabulary (unknown words are [UNK]).
    Encoding enc;
    REQUIRE_NOTHROW(enc = tok.encode_pair(junk, junk, 32));
    REQUIRE(enc.size() >= 3);
    REQUIRE(enc.size() <= 32);
    REQUIRE(enc.tokens.front() == "[CLS]");
    REQUIRE(enc.tokens.back() == "[SEP]");
    for (const std::int64_t id : enc.input_ids) REQUIRE((id >= 0 && id < tok.vocab_size()));
  }
  // Every reader met the garbage: each one validates its input (it rejected some of it).
  for (const auto& kv : outcomes) {
    INFO(kv.first << ": accepted " << kv.second.first << ", rejected " << kv.second.second);
    CHECK(kv.second.first + kv.second.second == 300);
    CHECK(kv.second.second > 0);
  }
  REQUIRE(outcomes.size() == 7);
}

// ------------------------------------------------------------------------------------------------------------
// Files read by offset
// ------------------------------------------------------------------------------------------------------------

namespace {

std::string error_text(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("ByteFile: reads by offset, fingerprints as the whole file does, refuses bad reads", "[data][byte_file]") {
  TempDir dir;
  std::string content;
  for (int i = 0; i < 1000; ++i) content += static_cast<char>((i * 37 + 11) % 256);  // every byte value, NULs too
  const std::string path = dir.file("corpus.bin", content);
  const ByteFile f(path);
  REQUIRE(f.size() == content.size());
  for (std::size_t at : {std::size_t(0), std::size_t(1), std::size_t(499), std::size_t(990)})
    CHECK(f.read(at, 10) == content.substr(at, 10));
  CHECK(f.read(1000, 0).empty());
  // the fingerprint streamed in blocks of any size is Fingerprint::add of the whole file
  const std::string want = Fingerprint().add("lm-bytes").add(content).hex();
  for (std::size_t block :
       {std::size_t(1), std::size_t(7), std::size_t(999), std::size_t(1000), std::size_t(1) << 20}) {
    Fingerprint fp;
    fp.add("lm-bytes");
    CHECK(f.fingerprint(fp, block).hex() == want);
  }
  const ByteFile empty(dir.file("empty.bin", ""));
  Fingerprint fe;
  CHECK(empty.fingerprint(fe).hex() == Fingerprint().add("").hex());
  // beyond the end, a missing file, a directory
  CHECK_THAT(error_text([&] { f.read(995, 6); }),
             Catch::Contains("corpus.bin") && Catch::Contains("6 bytes at offset 995"));
  CHECK_THAT(error_text([&] { f.read(std::uint64_t(1) << 63, 1); }), Catch::Contains("of a file of 1000 bytes"));
  CHECK_THAT(error_text([&] { ByteFile(dir.name("missing.bin")); }),
             Catch::Contains("cannot open file") && Catch::Contains("missing.bin"));
  CHECK_THAT(error_text([&] { ByteFile(dir.path.string()); }), Catch::Contains("is a directory"));
}

TEST_CASE("ByteFile: a file changed between its fingerprint and a read is an error", "[data][byte_file]") {
  TempDir dir;
  const std::string content(4096, 'a');
  SECTION("truncated") {
    const std::string path = dir.file("c.txt", content);
    const ByteFile f(path);
    Fingerprint fp;
    f.fingerprint(fp);
    std::filesystem::resize_file(path, 1000);
    CHECK_THAT(error_text([&] { f.read(10, 10); }),
               Catch::Contains("c.txt") && Catch::Contains("changed while in use") && Catch::Contains("1000 now"));
    CHECK_THAT(error_text([&] { f.read(2000, 10); }), Catch::Contains("changed while in use"));
  }
  SECTION("appended to") {
    const std::string path = dir.file("c.txt", content);
    const ByteFile f(path);
    std::ofstream(path, std::ios::binary | std::ios::app) << "more";
    CHECK_THAT(error_text([&] { f.read(0, 10); }), Catch::Contains("4096 bytes when opened, 4100 now"));
  }
  SECTION("rewritten in place with the same size") {
    const std::string path = dir.file("c.txt", content);
    const auto before = std::filesystem::last_write_time(path);
    const ByteFile f(path);
    std::ofstream(path, std::ios::binary | std::ios::in | std::ios::out) << "b";  // one byte changed, same size
    std::filesystem::last_write_time(path, before + std::chrono::seconds(1));   // (a coarse clock may not tick)
    CHECK_THAT(error_text([&] { f.read(0, 1); }), Catch::Contains("changed while in use"));
  }
  SECTION("replaced by rename: the open file is read as it was") {
    const std::string path = dir.file("c.txt", content);
    const ByteFile f(path);
    const std::string other = dir.file("new.txt", std::string(10, 'z'));
    std::filesystem::rename(other, path);
    CHECK(f.read(4000, 5) == "aaaaa");
    CHECK(ByteFile(path).read(0, 5) == "zzzzz");
  }
}

TEST_CASE("LineIndex: line k read alone; a last line without newline; CRLF; bad input", "[data][byte_file]") {
  TempDir dir;
  SECTION("lines, with and without a final newline") {
    for (const std::string& end : {std::string("\n"), std::string()}) {
      const std::string path = dir.file("a.jsonl", "{\"a\": 1}\n\n{\"b\": 2}\r\nlast" + end);
      const LineIndex ix(path);
      REQUIRE(ix.size() == 4);
      CHECK(ix.line(0) == "{\"a\": 1}");
      CHECK(ix.line(1).empty());
      CHECK(ix.line(2) == "{\"b\": 2}");
      CHECK(ix.line(3) == "last");
      std::vector<std::string> seen;
      ix.for_each([&](const std::string& l, std::size_t k) {
        CHECK(k == seen.size());
        seen.push_back(l);
      });
      CHECK(seen == Strings{"{\"a\": 1}", "", "{\"b\": 2}", "last"});
      CHECK_THAT(error_text([&] { ix.line(4); }), Catch::Contains("a.jsonl") && Catch::Contains("line 5 of 4"));
    }
  }
  SECTION("an empty file has no line; a newline alone is one empty line") {
    CHECK(LineIndex(dir.file("e.txt", "")).size() == 0);
    const LineIndex one(dir.file("n.txt", "\n"));
    REQUIRE(one.size() == 1);
    CHECK(one.line(0).empty());
  }
  SECTION("a file truncated after it was indexed") {
    const std::string path = dir.file("t.jsonl", "first line\nsecond line\nthird line\n");
    const LineIndex ix(path);
    std::filesystem::resize_file(path, 15);  // in the middle of the second line
    CHECK_THAT(error_text([&] { ix.line(2); }), Catch::Contains("t.jsonl") && Catch::Contains("changed while in use"));
  }
  SECTION("a line longer than the limit") {
    const std::string path = dir.file("l.txt", "short\n" + std::string(100, 'x') + "\nshort\n");
    CHECK_THAT(error_text([&] { LineIndex(path, 50); }),
               Catch::Contains("l.txt:2") && Catch::Contains("longer than 50"));
  }
}

// ------------------------------------------------------------------------------------------------------------
// Pieces shared by ranks
// ------------------------------------------------------------------------------------------------------------

namespace {

/// f(comm) on each of R thread ranks; what each returned (or the message it threw) in rank order.
std::vector<std::string> on_ranks(int R, const std::function<std::string(dist::Comm&)>& f) {
  std::vector<std::string> out(static_cast<std::size_t>(R));
  dea_tests::run_on_thread_ranks(R, [&](dist::Comm& c) {
    std::string& o = out[static_cast<std::size_t>(c.rank())];
    try {
      o = f(c);
    } catch (const dist::RankFailed& e) {
      o = std::string("RankFailed: ") + e.what();
    } catch (const std::exception& e) {
      o = std::string("error: ") + e.what();
    }
  });
  return out;
}

/// Piece k of an evaluation: a loss that does not add up exactly in another order, a count, and k % 3 points.
std::string piece_of(std::size_t k) {
  dist::PieceWriter w;
  w.f64(k == 0 ? 1e16 : 0.7 + 0.1 * static_cast<double>(k)).u64(k * k);  // (1e16: an ulp of 2, so order shows)
  std::vector<double> pts;
  for (std::size_t i = 0; i < k % 3; ++i) pts.push_back(1.0 / static_cast<double>(k + i + 1));
  w.f64s(pts);
  return w.take();
}

/// The pieces folded in piece order: "sum count points..." with every bit of the sum.
std::string fold(const std::vector<std::string>& pieces) {
  double sum = 0;
  std::uint64_t count = 0;
  std::vector<double> pts;
  for (const std::string& p : pieces) {
    dist::PieceReader rd(p);
    sum += rd.f64();
    count += rd.u64();
    const std::vector<double> v = rd.f64s();
    pts.insert(pts.end(), v.begin(), v.end());
    CHECK(rd.done());
  }
  std::uint64_t bits = 0;
  std::memcpy(&bits, &sum, sizeof bits);
  std::string s = std::to_string(bits) + " " + std::to_string(count);
  for (double x : pts) {
    std::memcpy(&bits, &x, sizeof bits);
    s += " " + std::to_string(bits);
  }
  return s;
}

}  // namespace

TEST_CASE("piece_range: contiguous shares of 0..n-1, in rank order, for any rank count", "[dist][pieces]") {
  for (std::size_t n = 0; n <= 13; ++n)
    for (int R = 1; R <= 6; ++R) {
      std::size_t next = 0;
      for (int r = 0; r < R; ++r) {
        const dist::PieceRange p = dist::piece_range(n, r, R);
        CHECK(p.first == next);
        CHECK(p.last >= p.first);
        CHECK(p.last - p.first <= n / static_cast<std::size_t>(R) + 1);
        next = p.last;
      }
      CHECK(next == n);
    }
  CHECK_THROWS_AS(dist::piece_range(4, 2, 2), Error);
}

TEST_CASE("gather_pieces: every rank gets the pieces in piece order, the fold is one process's bits",
          "[dist][pieces]") {
  for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(3), std::size_t(7), std::size_t(16)}) {
    dist::SingleProcessComm one;
    const std::string want = fold(dist::gather_pieces(one, n, piece_of));
    for (int R : {1, 2, 3, 4, 5}) {
      const std::vector<std::string> got =
          on_ranks(R, [&](dist::Comm& c) { return fold(dist::gather_pieces(c, n, piece_of)); });
      for (int r = 0; r < R; ++r) CHECK(got[static_cast<std::size_t>(r)] == want);
    }
  }
  // a different order of the same sums would not give these bits: the check above can fail
  std::vector<std::string> reversed;
  for (std::size_t k = 16; k-- > 0;) reversed.push_back(piece_of(k));
  std::vector<std::string> ordered;
  for (std::size_t k = 0; k < 16; ++k) ordered.push_back(piece_of(k));
  const auto sum_bits = [](const std::string& folded) { return folded.substr(0, folded.find(' ')); };
  CHECK(sum_bits(fold(reversed)) != sum_bits(fold(ordered)));
}

TEST_CASE("gather_pieces: a piece that throws on one rank stops every rank with its message", "[dist][pieces]") {
  const std::vector<std::string> got = on_ranks(3, [](dist::Comm& c) {
    const auto pieces = dist::gather_pieces(c, 9, [](std::size_t k) -> std::string {
      if (k == 4) throw Error("dea: batch 4: the data file changed");  // piece 4 is on rank 1 of 3
      return piece_of(k);
    });
    return fold(pieces);
  });
  for (const std::string& g : got) CHECK(g == "RankFailed: rank 1 of 3: batch 4: the data file changed");
  dist::SingleProcessComm one;
  CHECK_THROWS_WITH(dist::gather_pieces(one, 9, [](std::size_t k) -> std::string {
                      if (k == 4) throw Error("dea: batch 4");
                      return piece_of(k);
                    }),
                    "dea: batch 4");
}

TEST_CASE("allgather_strings and PieceReader: sizes that differ, reads past the end", "[dist][pieces]") {
  const std::vector<std::string> got = on_ranks(4, [](dist::Comm& c) {
    const std::string mine(static_cast<std::size_t>(c.rank()) * 3, static_cast<char>('a' + c.rank()));
    const std::vector<std::string> all = dist::allgather_strings(c, mine);
    std::string s;
    for (const auto& x : all) s += x + "|";
    return s;
  });
  for (const std::string& g : got) CHECK(g == "|bbb|cccccc|ddddddddd|");
  dist::PieceWriter w;
  w.u64(5).f64s({1.0, 2.0});
  const std::string b = w.take();
  dist::PieceReader rd(b);
  CHECK(rd.u64() == 5);
  CHECK(rd.f64s() == std::vector<double>{1.0, 2.0});
  CHECK(rd.done());
  CHECK_THROWS_AS(rd.f64(), Error);
  const std::string cut = b.substr(0, b.size() - 4);
  dist::PieceReader rc(cut);
  rc.u64();
  CHECK_THROWS_AS(rc.f64s(), Error);
}

}  // namespace test_data
