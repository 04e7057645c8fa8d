// Tests of the SentencePiece tokenizer (dea/text/spm_tokenizer.hpp): every case of tests/data/deberta/spm/
// spm_cases.json in both modes, exactly (fast: Hugging Face's tokenizers on the pipeline transformers converts from
// the model; slow: the sentencepiece library as transformers' DebertaV2Tokenizer drives it), the truncation rules,
// model directories, the grapheme clusters of the fast normaliser and the refusals of bad models and bad text.
#include <catch2/catch.hpp>
#include <dea/core/files.hpp>
#include <dea/text/spm_tokenizer.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace test_spm {

using namespace dea;
using namespace dea::text;
using Strings = std::vector<std::string>;
using Ids = std::vector<std::int64_t>;

namespace {

const std::string kSpm = std::string(DEA_TEST_DATA_DIR) + "/deberta/spm";

const nlohmann::json& golden() {
  static const nlohmann::json g = nlohmann::json::parse(read_file(kSpm + "/spm_cases.json"));
  return g;
}

/// The tokenizer of golden model `file` in `mode` (loaded once).
const SpmTokenizer& model(const std::string& file, SpmMode mode) {
  static std::map<std::pair<std::string, int>, SpmTokenizer> cache;
  const auto key = std::make_pair(file, static_cast<int>(mode));
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, SpmTokenizer(kSpm + "/" + file, mode)).first;
  return it->second;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

/// A fresh empty directory under the system's temporary directory.
std::filesystem::path temp_dir(const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / ("dea_test_spm_" + name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

/// A DeBERTa directory as the hub holds one: spm_nfkc.model as spm.model beside the oracle model's tokenizer files.
std::filesystem::path deberta_dir(const std::string& name) {
  const auto d = temp_dir(name);
  std::filesystem::copy_file(kSpm + "/spm_nfkc.model", d / "spm.model");
  for (const char* f : {"tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"})
    std::filesystem::copy_file(kSpm + "/dir/" + f, d / f);
  return d;
}

void write(const std::filesystem::path& p, const std::string& content) {
  std::ofstream out(p, std::ios::binary);
  out << content;
}

Strings strings_of(const nlohmann::json& j) { return j.get<Strings>(); }

}  // namespace

// =============================================================================================================
// The golden cases

TEST_CASE("spm: every golden text, pair and truncated pair matches in both modes exactly") {
  std::map<std::string, int> counted;  // mode -> cases checked
  for (const auto& m : golden().at("models")) {
    const std::string file = m.at("model_file").get<std::string>();
    for (const SpmMode mode : {SpmMode::fast, SpmMode::slow}) {
      const SpmTokenizer& tok = model(file, mode);
      const std::string name = to_string(mode);
      INFO("model " << file << ", mode " << name);
      CHECK(tok.num_pieces() == m.at("num_pieces").get<std::size_t>());
      CHECK(tok.mask_id() == m.at("mask_id").get<std::int64_t>());
      CHECK(tok.vocab_size() == m.at("num_pieces").get<std::size_t>() + 1);
      const auto& sp = m.at("special_ids");
      CHECK(tok.pad_id() == sp.at("[PAD]").get<std::int64_t>());
      CHECK(tok.cls_id() == sp.at("[CLS]").get<std::int64_t>());
      CHECK(tok.sep_id() == sp.at("[SEP]").get<std::int64_t>());
      CHECK(tok.unk_id() == sp.at("[UNK]").get<std::int64_t>());
      for (const auto& c : m.at("cases")) {
        const std::string text = c.at("text").get<std::string>();
        INFO("text " << c.at("text").dump());
        const auto& want = c.at(name);
        CHECK(tok.ids(text) == want.at("ids").get<Ids>());
        CHECK(tok.tokenize(text) == strings_of(want.at(mode == SpmMode::fast ? "tokens" : "pieces")));
        if (mode == SpmMode::fast) CHECK(tok.normalize_fast(text) == want.at("normalized").get<std::string>());
        ++counted[name + " texts"];
      }
      for (const char* set : {"pairs", "truncated_pairs"}) {
        for (const auto& c : m.at(set)) {
          const std::string a = c.at("text_a").get<std::string>(), b = c.at("text_b").get<std::string>();
          const std::size_t max_length = c.contains("max_length") ? c.at("max_length").get<std::size_t>() : 0;
          INFO(set << ": " << c.at("text_a").dump() << " / " << c.at("text_b").dump() << ", max_length "
                   << max_length);
          const Encoding e = tok.encode_pair(a, b, max_length);
          const auto& want = c.at(name);
          CHECK(e.input_ids == want.at("ids").get<Ids>());
          CHECK(e.tokens == strings_of(want.at("tokens")));
          CHECK(e.token_type_ids == want.at("token_type_ids").get<Ids>());
          CHECK(e.attention_mask == Ids(e.input_ids.size(), 1));
          if (c.contains("untruncated_lengths_fast") && mode == SpmMode::fast) {
            const auto n = c.at("untruncated_lengths_fast").get<std::vector<std::size_t>>();
            CHECK(tok.ids(a).size() == n.at(0));
            CHECK(tok.ids(b).size() == n.at(1));
          }
          ++counted[name + " " + set];
        }
      }
    }
  }
  for (const auto& [what, n] : counted) std::printf("spm golden cases: %-22s %d\n", what.c_str(), n);
  // 103 + 23 texts, 8 + 3 pairs, 10 + 3 truncated pairs per mode
  CHECK(counted["fast texts"] == 126);
  CHECK(counted["slow texts"] == 126);
  CHECK(counted["fast pairs"] == 11);
  CHECK(counted["slow pairs"] == 11);
  CHECK(counted["fast truncated_pairs"] == 13);
  CHECK(counted["slow truncated_pairs"] == 13);
}

TEST_CASE("spm: the slow/fast classification of the golden texts is what the two modes give") {
  for (const auto& m : golden().at("models")) {
    const std::string file = m.at("model_file").get<std::string>();
    const SpmTokenizer& fast = model(file, SpmMode::fast);
    const SpmTokenizer& slow = model(file, SpmMode::slow);
    std::map<std::string, int> counts;
    for (const auto& c : m.at("cases")) {
      const std::string text = c.at("text").get<std::string>();
      const Ids f = fast.ids(text), s = slow.ids(text);
      // slow with every run of byte pieces replaced by one [UNK]
      Ids folded;
      const Strings pieces = slow.tokenize(text);
      for (std::size_t i = 0; i < s.size(); ++i) {
        const bool byte = pieces[i].size() == 6 && pieces[i].compare(0, 3, "<0x") == 0;
        if (!byte) folded.push_back(s[i]);
        else if (i == 0 || !(pieces[i - 1].size() == 6 && pieces[i - 1].compare(0, 3, "<0x") == 0))
          folded.push_back(fast.unk_id());
      }
      const std::string kind = f == s ? "same" : f == folded ? "byte_fallback_vs_unk" : "other";
      CHECK(kind == c.at("slow_vs_fast").get<std::string>());
      ++counts[kind];
    }
    for (const auto& [kind, n] : m.at("slow_vs_fast_counts").items()) {
      INFO(file << ": " << kind);
      CHECK(counts[kind] == n.get<int>());
    }
  }
}

TEST_CASE("spm: the golden oracle's NLI pairs, fast at max_length 256 as the oracle encodes them") {
  // the oracle's directory: spm_nfkc.model with the tokenizer files of tests/data/deberta/spm/dir
  const auto d = deberta_dir("oracle");
  const SpmTokenizer fast(d.string(), SpmMode::fast), slow(d.string(), SpmMode::slow);
  std::ifstream in(std::string(DEA_TEST_DATA_DIR) + "/deberta/oracle/expected.jsonl");
  std::string line;
  int pairs = 0, longer = 0, slow_same = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string q = j.at("q_text").get<std::string>(), k = j.at("k_text").get<std::string>();
    INFO(q << " / " << k);
    const Encoding e = fast.encode_pair(q, k, 256);
    CHECK(e.input_ids == j.at("nli_input_ids").get<Ids>());
    CHECK(e.token_type_ids == j.at("nli_token_type_ids").get<Ids>());
    // slow gives the same ids exactly where the oracle's cases say so
    const bool same = slow.encode_pair(q, k, 256).input_ids == e.input_ids;
    CHECK(same == j.at("slow_tokenizer_same_ids").get<bool>());
    slow_same += same;
    longer += fast.ids(q).size() + fast.ids(k).size() + 3 > 256;
    ++pairs;
  }
  std::printf("spm oracle pairs: %d (%d truncated to 256), slow the same on %d\n", pairs, longer, slow_same);
  CHECK(pairs == 14);
  CHECK(longer == 3);
  std::filesystem::remove_all(d);
}

// =============================================================================================================
// Truncation, encodings, directories

TEST_CASE("spm: longest-first pair lengths of both modes") {
  // nothing to cut
  CHECK(spm_pair_lengths(3, 4, 7, SpmMode::fast) == std::make_pair<std::size_t, std::size_t>(3, 4));
  CHECK(spm_pair_lengths(3, 4, 7, SpmMode::slow) == std::make_pair<std::size_t, std::size_t>(3, 4));
  // only the longer is cut
  CHECK(spm_pair_lengths(40, 2, 7, SpmMode::fast) == std::make_pair<std::size_t, std::size_t>(5, 2));
  CHECK(spm_pair_lengths(40, 2, 7, SpmMode::slow) == std::make_pair<std::size_t, std::size_t>(5, 2));
  CHECK(spm_pair_lengths(2, 40, 7, SpmMode::fast) == std::make_pair<std::size_t, std::size_t>(2, 5));
  CHECK(spm_pair_lengths(2, 40, 7, SpmMode::slow) == std::make_pair<std::size_t, std::size_t>(2, 5));
  // both cut, even budget: the same in both modes
  CHECK(spm_pair_lengths(40, 12, 8, SpmMode::fast) == std::make_pair<std::size_t, std::size_t>(4, 4));
  CHECK(spm_pair_lengths(40, 12, 8, SpmMode::slow) == std::make_pair<std::size_t, std::size_t>(4, 4));
  // both cut, odd budget: slow gives the extra token to A, fast to the longer text (B on a tie)
  CHECK(spm_pair_lengths(12, 40, 5, SpmMode::fast) == std::make_pair<std::size_t, std::size_t>(2, 3));
  CHECK(spm_pair_lengths(12, 40, 5, SpmMode::slow) == std::make_pair<std::size_t, std::size_t>(3, 2));
  CHECK(spm_pair_lengths(40, 12, 5, SpmMode::fast) == std::make_pair<std::size_t, std::size_t>(3, 2));
  CHECK(spm_pair_lengths(40, 12, 5, SpmMode::slow) == std::make_pair<std::size_t, std::size_t>(3, 2));
  CHECK(spm_pair_lengths(9, 9, 5, SpmMode::fast) == std::make_pair<std::size_t, std::size_t>(2, 3));
  CHECK(spm_pair_lengths(9, 9, 5, SpmMode::slow) == std::make_pair<std::size_t, std::size_t>(3, 2));
  // the slow rule is the one-token-at-a-time loop for every small case
  for (std::size_t n1 = 0; n1 < 12; ++n1)
    for (std::size_t n2 = 0; n2 < 12; ++n2)
      for (std::size_t b = 0; b < 24; ++b) {
        std::size_t a = n1, c = n2;
        while (a + c > b) (a > c ? a : c) -= 1;
        INFO(n1 << " " << n2 << " " << b);
        CHECK(spm_pair_lengths(n1, n2, b, SpmMode::slow) == std::make_pair(a, c));
        const auto f = spm_pair_lengths(n1, n2, b, SpmMode::fast);
        CHECK(f.first + f.second == std::min(n1 + n2, b));
        CHECK((f.first <= n1 && f.second <= n2));
      }
}

TEST_CASE("spm: single encodings, max_length and the refusal of too small a max_length") {
  const SpmTokenizer& tok = model("spm_nfkc.model", SpmMode::fast);
  const Ids body = tok.ids("Hello, world!");
  REQUIRE(body.size() == 8);
  const Encoding e = tok.encode("Hello, world!");
  Ids want{tok.cls_id()};
  want.insert(want.end(), body.begin(), body.end());
  want.push_back(tok.sep_id());
  CHECK(e.input_ids == want);
  CHECK(e.token_type_ids == Ids(want.size(), 0));
  CHECK(e.attention_mask == Ids(want.size(), 1));
  const Encoding t = tok.encode("Hello, world!", 5);
  CHECK(t.input_ids == Ids{tok.cls_id(), body[0], body[1], body[2], tok.sep_id()});
  CHECK(tok.encode("", 2).input_ids == Ids{tok.cls_id(), tok.sep_id()});
  CHECK_THAT(error_of([&] { (void)tok.encode("a", 1); }), Catch::Contains("max_length must be >= 2"));
  CHECK_THAT(error_of([&] { (void)tok.encode_pair("a", "b", 2); }), Catch::Contains("max_length must be >= 3"));
}

TEST_CASE("spm: special tokens in the text are split out in both modes; [MASK] has the added id") {
  for (const SpmMode mode : {SpmMode::fast, SpmMode::slow}) {
    const SpmTokenizer& tok = model("spm_nfkc.model", mode);
    const Ids ids = tok.ids("a[MASK]b [SEP] [CLS][PAD][UNK]");
    const Ids a = tok.ids("a"), b = tok.ids("b");
    Ids want = a;
    want.push_back(520);
    want.insert(want.end(), b.begin(), b.end());
    want.insert(want.end(), {2, 1, 0, 3});
    CHECK(ids == want);
    CHECK(tok.tokenize("[MASK]") == Strings{"[MASK]"});
    CHECK(tok.id_to_token(520) == "[MASK]");
    // not special: other case, full-width (normalised afterwards)
    CHECK(tok.ids("[mask]") != Ids{520});
  }
}

TEST_CASE("spm: a DeBERTa directory reads its tokenizer files") {
  const auto d = deberta_dir("dir");
  for (const SpmMode mode : {SpmMode::fast, SpmMode::slow}) {
    const SpmTokenizer tok(d.string(), mode);
    CHECK(tok.mask_id() == 520);
    CHECK(tok.vocab_size() == 521);
    CHECK(tok.ids("x [MASK]") == model("spm_nfkc.model", mode).ids("x [MASK]"));
  }
  // an added_tokens.json that moves [MASK]
  write(d / "added_tokens.json", "{\"[MASK]\": 600}");
  write(d / "tokenizer_config.json", "{\"do_lower_case\": false, \"tokenizer_class\": \"DebertaV2Tokenizer\"}");
  const SpmTokenizer moved(d.string());
  CHECK(moved.mask_id() == 600);
  CHECK(moved.vocab_size() == 601);
  CHECK(moved.ids("[MASK]") == Ids{600});
  std::filesystem::remove_all(d);
}

TEST_CASE("spm: bad directories, models and settings are refused by name") {
  const auto d = temp_dir("bad");
  CHECK_THAT(error_of([&] { SpmTokenizer t(d.string()); }), Catch::Contains("has no spm.model"));
  CHECK_THAT(error_of([&] { SpmTokenizer t((d / "nothing.model").string()); }), Catch::Contains("does not exist"));
  const std::string good = read_file(kSpm + "/spm_nfkc.model");
  // corrupt and truncated protobuf, an empty file, a text file
  write(d / "spm.model", good.substr(0, good.size() / 2));
  CHECK_THAT(error_of([&] { SpmTokenizer t(d.string()); }), Catch::Contains("truncated protobuf"));
  write(d / "spm.model", "");
  CHECK_THAT(error_of([&] { SpmTokenizer t(d.string()); }), Catch::Contains("empty file"));
  write(d / "spm.model", "this is not a model\n");
  CHECK_THAT(error_of([&] { SpmTokenizer t(d.string()); }), Catch::Contains("spm.model '"));
  // a model without a [CLS] piece: the first piece (field 1) renamed
  {
    std::string bad = good;
    const std::size_t at = bad.find("[CLS]");
    REQUIRE(at != std::string::npos);
    bad[at + 1] = 'X';
    write(d / "spm.model", bad);
    CHECK_THAT(error_of([&] { SpmTokenizer t(d.string()); }), Catch::Contains("no piece '[CLS]'"));
  }
  // pieces the library's trie cannot hold (it would terminate the program): empty, or with a NUL byte
  for (const std::string& piece : {std::string(), std::string("a\0b", 3)}) {
    std::string bytes = good;
    const std::string entry = std::string("\x0a") + static_cast<char>(piece.size() + 2) + "\x0a" +
                              static_cast<char>(piece.size()) + piece;
    bytes.insert(0, entry);
    CHECK_THAT(error_of([&] { (void)SpmTokenizer::from_bytes(bytes, SpmMode::slow, "m"); }),
               Catch::Contains(piece.empty() ? "m: piece 0 is empty" : "m: piece 0 holds a NUL byte"));
  }
  // settings not covered
  write(d / "spm.model", good);
  write(d / "tokenizer_config.json", "{\"do_lower_case\": true}");
  CHECK_THAT(error_of([&] { SpmTokenizer t(d.string()); }), Catch::Contains("do_lower_case is true"));
  write(d / "tokenizer_config.json", "{\"split_by_punct\": true}");
  CHECK_THAT(error_of([&] { SpmTokenizer t(d.string()); }), Catch::Contains("split_by_punct is true"));
  write(d / "tokenizer_config.json", "{\"tokenizer_class\": \"XLMRobertaTokenizer\"}");
  CHECK_THAT(error_of([&] { SpmTokenizer t(d.string()); }), Catch::Contains("tokenizer_class \"XLMRobertaTokenizer\""));
  write(d / "tokenizer_config.json", "{}");
  write(d / "added_tokens.json", "{\"[MASK]\": \"x\"}");
  CHECK_THAT(error_of([&] { SpmTokenizer t(d.string()); }), Catch::Contains("expected an integer id"));
  std::filesystem::remove_all(d);
  CHECK_THAT(error_of([] { (void)parse_spm_mode("medium"); }), Catch::Contains("expected 'fast' or 'slow'"));
}

TEST_CASE("spm: invalid UTF-8 is refused with its offset in both modes") {
  for (const SpmMode mode : {SpmMode::fast, SpmMode::slow}) {
    const SpmTokenizer& tok = model("spm_nfkc.model", mode);
    CHECK_THAT(error_of([&] { (void)tok.ids("caf\xff"); }),
               Catch::Contains("not valid UTF-8 (byte 0xFF at byte offset 3)"));
    CHECK_THAT(error_of([&] { (void)tok.encode_pair("ok", "\xc3"); }), Catch::Contains("not valid UTF-8"));
  }
}

// =============================================================================================================
// The pieces of the fast pipeline

TEST_CASE("spm: the model file's normaliser fields and the character map") {
  const std::string bytes = read_file(kSpm + "/spm_nfkc.model");
  const spm::SpmModelInfo info = spm::read_spm_model_info(bytes, "spm_nfkc.model");
  CHECK(info.num_pieces == 520);
  CHECK(info.model_type == 1);
  CHECK(info.normalizer_name == "nmt_nfkc");
  CHECK(info.precompiled_charsmap.size() == 237561);
  CHECK(info.add_dummy_prefix);
  const spm::Charsmap map(info.precompiled_charsmap, "spm_nfkc.model");
  REQUIRE(!map.empty());
  // full-width letters map to ASCII; NFKC of a ligature; "e" + combining acute composes (a two-code-point key)
  CHECK(map.shortest("\xEF\xBD\x86x")->second == "f");     // U+FF46
  CHECK(map.shortest("\xEF\xAC\x81")->second == "fi");     // U+FB01
  CHECK(map.longest("e\xCC\x81")->second == "\xC3\xA9");   // e U+0301 -> é
  CHECK(!map.shortest("e"));
  CHECK(!map.shortest("abc"));
  const spm::SpmModelInfo identity = spm::read_spm_model_info(read_file(kSpm + "/spm_identity.model"), "identity");
  CHECK(identity.normalizer_name == "identity");
  CHECK(identity.precompiled_charsmap.empty());
  CHECK(spm::Charsmap(identity.precompiled_charsmap, "identity").empty());
  // a map whose trie size does not fit
  CHECK_THAT(error_of([] { spm::Charsmap m(std::string("\xff\xff\x00\x00xxxx", 8), "m"); }),
             Catch::Contains("does not fit"));
  // a trie whose search would leave it (the library searches without bounds checks), a value outside the blob
  CHECK_THAT(error_of([] { spm::Charsmap m(std::string("\x04\x00\x00\x00\x00\x00\x00\x00", 8), "m"); }),
             Catch::Contains("trie reaches unit 255 of 1"));
  CHECK_THAT(error_of([] { spm::Charsmap m(std::string("\x04\x00\x00\x00\x00\x00\x00\x00" "a", 9), "m"); }),
             Catch::Contains("do not end in a NUL byte"));
}

TEST_CASE("spm: metaspace words") {
  CHECK(spm::metaspace_words("", true).empty());
  CHECK(spm::metaspace_words("Hello world", true) == Strings{"\xE2\x96\x81Hello", "\xE2\x96\x81world"});
  CHECK(spm::metaspace_words("a ", true) == Strings{"\xE2\x96\x81" "a", "\xE2\x96\x81"});
  CHECK(spm::metaspace_words(" ", true) == Strings{"\xE2\x96\x81"});
  CHECK(spm::metaspace_words("a b", false) == Strings{"a", "\xE2\x96\x81" "b"});
}

TEST_CASE("spm: grapheme clusters follow the Unicode test file (GraphemeBreakTest.txt, when installed)") {
  const std::string path = "/usr/share/unicode/auxiliary/GraphemeBreakTest.txt";
  if (!std::filesystem::exists(path)) {
    WARN("skipped: " << path << " not installed (Debian: unicode-data)");
    return;
  }
  std::ifstream in(path);
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    const std::string body = line.substr(0, line.find('#'));
    if (body.find_first_not_of(" \t") == std::string::npos) continue;
    std::istringstream ss(body);
    std::string tok;
    std::u32string text;
    std::vector<std::size_t> want;
    while (ss >> tok) {
      if (tok == "\xC3\xB7") want.push_back(text.size());  // ÷ a break
      else if (tok != "\xC3\x97") text += static_cast<char32_t>(std::stoul(tok, nullptr, 16));  // × none
    }
    INFO(line);
    CHECK(spm::grapheme_breaks(text) == want);
    ++cases;
  }
  CHECK(cases > 500);  // (602 in Unicode 15.0)
}

}  // namespace test_spm
