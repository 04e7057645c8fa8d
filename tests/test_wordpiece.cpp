// Tests of dea/text: the Unicode tables, BERT's normaliser and pre-tokeniser, the vocabulary reader and WordPiece.
// The golden file tests/data/bert/wordpiece_cases.json was computed by Hugging Face's tokenizers library (Rust,
// 0.23.2) with bert-base-uncased's pipeline; every case must match exactly.
#include <catch2/catch.hpp>
#include <dea/core/files.hpp>
#include <dea/text/wordpiece.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_wordpiece {

using namespace dea;
using namespace dea::text;
using Strings = std::vector<std::string>;
using Ids = std::vector<std::int64_t>;

namespace {

const std::string kBert = std::string(DEA_TEST_DATA_DIR) + "/bert";

const WordPieceTokenizer& bert() {
  static const WordPieceTokenizer t = WordPieceTokenizer::from_file(kBert + "/vocab.txt");
  return t;
}

nlohmann::json golden() { return nlohmann::json::parse(read_file(kBert + "/wordpiece_cases.json")); }

/// The message of the dea::Error that f throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

/// A tokenizer over a small vocabulary given inline.
WordPieceTokenizer small(const Strings& tokens, WordPieceOptions opt = {}) {
  return WordPieceTokenizer(Vocab::from_tokens(tokens, "small"), opt);
}

std::string u8(const std::u32string& s) { return unicode::encode_utf8(s); }

}  // namespace

// =============================================================================================================
// The golden cases of Hugging Face's tokenizers

TEST_CASE("wordpiece: every golden case (normalised text, pieces, ids) matches Hugging Face exactly") {
  const nlohmann::json g = golden();
  REQUIRE(g.at("vocab_size").get<std::size_t>() == bert().vocab().size());
  const auto& cases = g.at("cases");
  REQUIRE(cases.size() == 150);
  std::size_t passed = 0;
  for (const auto& c : cases) {
    const std::string text = c.at("text");
    INFO("text: " << c.at("text").dump());
    CHECK(bert().normalize(text) == c.at("normalized").get<std::string>());
    CHECK(bert().tokenize(text) == c.at("tokens").get<Strings>());
    CHECK(bert().encode(text) == c.at("ids").get<Ids>());
    passed += bert().encode(text) == c.at("ids").get<Ids>() && bert().tokenize(text) == c.at("tokens").get<Strings>();
  }
  CHECK(passed == 150);
}

TEST_CASE("wordpiece: every golden pair [CLS] A [SEP] B [SEP] matches, with token types and attention mask") {
  const nlohmann::json g = golden();
  const auto& pairs = g.at("pairs");
  REQUIRE(pairs.size() == 8);
  for (const auto& p : pairs) {
    INFO("pair: " << p.at("text_a").dump() << " / " << p.at("text_b").dump());
    const Encoding e = bert().encode_pair(p.at("text_a").get<std::string>(), p.at("text_b").get<std::string>());
    CHECK(e.tokens == p.at("tokens").get<Strings>());
    CHECK(e.input_ids == p.at("ids").get<Ids>());
    CHECK(e.token_type_ids == p.at("token_type_ids").get<Ids>());
    CHECK(e.attention_mask == p.at("attention_mask").get<Ids>());
  }
}

TEST_CASE("wordpiece: truncated pairs: longest_first as Hugging Face, and the DEA reference's own rule") {
  const nlohmann::json g = golden();
  const auto& pairs = g.at("truncated_pairs");
  REQUIRE(pairs.size() == 5);
  for (const auto& p : pairs) {
    INFO("pair: " << p.at("text_a").dump() << " / " << p.at("text_b").dump());
    REQUIRE(p.at("strategy") == "longest_first");
    const std::string a = p.at("text_a"), b = p.at("text_b");
    const std::size_t max_length = p.at("max_length");
    const Encoding e = bert().encode_pair(a, b, max_length);
    CHECK(e.tokens == p.at("tokens").get<Strings>());
    CHECK(e.input_ids == p.at("ids").get<Ids>());
    CHECK(e.token_type_ids == p.at("token_type_ids").get<Ids>());
    CHECK(e.size() <= max_length);

    const auto& ref = p.at("reference_encode_pair");
    const Encoding r = bert().reference_encode_pair(a, b, max_length);
    CHECK(r.tokens == ref.at("tokens").get<Strings>());
    CHECK(r.token_type_ids == ref.at("token_type_ids").get<Ids>());
    CHECK(r.span_a.first == ref.at("span_a")[0].get<std::ptrdiff_t>());
    CHECK(r.span_a.second == ref.at("span_a")[1].get<std::ptrdiff_t>());
    CHECK(r.span_b.first == ref.at("span_b")[0].get<std::ptrdiff_t>());
    CHECK(r.span_b.second == ref.at("span_b")[1].get<std::ptrdiff_t>());
  }
}

TEST_CASE("wordpiece: the NLI oracle's inputs with its subset vocabulary (ids renumbered from 0)") {
  const nlohmann::json g = nlohmann::json::parse(read_file(kBert + "/oracle/oracle_cases.json"));
  const WordPieceTokenizer t = WordPieceTokenizer::from_file(kBert + "/oracle/oracle_vocab.txt");
  CHECK(t.unk_id() == 1);
  CHECK(t.cls_id() == 2);
  CHECK(t.sep_id() == 3);
  const std::size_t nli = g.at("nli_max_length"), sim = g.at("sim_max_length");
  REQUIRE(g.at("pairs").size() == 12);
  for (const auto& p : g.at("pairs")) {
    const std::string q = p.at("q_text"), k = p.at("k_text");
    INFO("pair: " << q << " / " << k);
    const Encoding e = t.encode_pair(q, k, nli);
    CHECK(e.input_ids == p.at("nli_input_ids").get<Ids>());
    CHECK(e.token_type_ids == p.at("nli_token_type_ids").get<Ids>());
    CHECK(t.encode_single(q, sim).input_ids == p.at("sim_input_ids_q").get<Ids>());
    CHECK(t.encode_single(k, sim).input_ids == p.at("sim_input_ids_k").get<Ids>());
  }
}

// =============================================================================================================
// The two truncation rules

TEST_CASE("wordpiece: longest_first and the reference's rule differ when the budget is odd and A is longer") {
  using T = WordPieceTokenizer;
  using P = std::pair<std::size_t, std::size_t>;
  // the arguments are (nA, nB, max_length); the budget for A and B is max_length - 3
  // nA = 6, nB = 4, budget 5: longest_first keeps 3 + 2; popping from the longer side (A on ties) keeps 2 + 3
  CHECK(T::longest_first_lengths(6, 4, 8) == P(3, 2));
  CHECK(T::reference_pair_lengths(6, 4, 8) == P(2, 3));
  // A shorter or equal: the two agree (A keeps min(nA, b/2))
  CHECK(T::longest_first_lengths(4, 6, 8) == P(2, 3));
  CHECK(T::reference_pair_lengths(4, 6, 8) == P(2, 3));
  CHECK(T::longest_first_lengths(2, 9, 10) == P(2, 5));
  CHECK(T::longest_first_lengths(9, 1, 7) == P(3, 1));
  CHECK(T::longest_first_lengths(3, 3, 9) == P(3, 3));  // fits: nothing cut
  CHECK(T::longest_first_lengths(5, 5, 3) == P(0, 0));
  CHECK(T::longest_first_lengths(80, 70, 64) == P(31, 30));
  CHECK(T::reference_pair_lengths(80, 70, 64) == P(30, 31));
  CHECK(error_of([] { T::longest_first_lengths(1, 1, 2); }).find("max_length must be >= 3") != std::string::npos);

  // both rules always fill the budget exactly and never grow a side; they agree whenever the budget is even
  // or A is not the longer text
  for (std::size_t na = 0; na <= 16; ++na)
    for (std::size_t nb = 0; nb <= 16; ++nb)
      for (std::size_t ml = 3; ml <= 17; ++ml) {
        const std::size_t b = ml - 3;
        const auto hf = T::longest_first_lengths(na, nb, ml), ref = T::reference_pair_lengths(na, nb, ml);
        for (const auto& [ka, kb] : {hf, ref}) {
          CHECK(ka + kb == std::min(na + nb, b));
          CHECK(ka <= na);
          CHECK(kb <= nb);
        }
        if (b % 2 == 0 || na <= nb) CHECK(hf == ref);
      }

  // on text: 6 and 4 pieces, max_length 8
  const WordPieceTokenizer& t = bert();
  const Encoding hf = t.encode_pair("a b c d e f", "g h i j", 8);
  const Encoding ref = t.reference_encode_pair("a b c d e f", "g h i j", 8);
  CHECK(hf.tokens == Strings{"[CLS]", "a", "b", "c", "[SEP]", "g", "h", "[SEP]"});
  CHECK(ref.tokens == Strings{"[CLS]", "a", "b", "[SEP]", "g", "h", "i", "[SEP]"});
  CHECK(ref.span_a == std::make_pair<std::ptrdiff_t, std::ptrdiff_t>(1, 3));
  CHECK(ref.span_b == std::make_pair<std::ptrdiff_t, std::ptrdiff_t>(4, 7));
  CHECK(ref.token_type_ids == Ids{0, 0, 0, 0, 1, 1, 1, 1});
  // Hugging Face stops tokenizing a text once it holds max_length pieces (a special token counting from the next
  // word on); the counts that decide the split are those (measured on tokenizers 0.23.2)
  CHECK(t.encode_pair("a a a a a", "b b b b", 4).tokens == Strings{"[CLS]", "[SEP]", "b", "[SEP]"});  // 4 and 4
  CHECK(t.encode_pair("a a a a a", "b b b", 4).tokens == Strings{"[CLS]", "a", "[SEP]", "[SEP]"});    // 4 and 3
  const std::string b12 = "b b b b b b b b b b b b";  // counts 6 at max_length 6
  const auto kept = [&](const std::string& a) { return t.encode_pair(a, b12, 6).tokens; };
  CHECK(kept("a a a a a a a") == Strings{"[CLS]", "a", "[SEP]", "b", "b", "[SEP]"});        // 6: a tie, A first
  CHECK(kept("a a a a a unaffable") == Strings{"[CLS]", "a", "a", "[SEP]", "b", "[SEP]"});   // 8: the whole word
  CHECK(kept("a a a a a a unaffable") == Strings{"[CLS]", "a", "[SEP]", "b", "b", "[SEP]"}); // 6: stopped before it
  CHECK(kept("a a a a a [MASK] a a") == Strings{"[CLS]", "a", "a", "[SEP]", "b", "[SEP]"});  // 7: one more word
  CHECK(kept("a a a a a a [MASK]") == Strings{"[CLS]", "a", "[SEP]", "b", "b", "[SEP]"});    // 6: [MASK] not taken
  CHECK(kept("[MASK] [MASK] a a a a a a a") == Strings{"[CLS]", "[MASK]", "[SEP]", "b", "b", "[SEP]"});  // 6
  // a single text keeps its first max_length - 2 pieces
  CHECK(t.encode_single("a b c d e f", 5).tokens == Strings{"[CLS]", "a", "b", "c", "[SEP]"});
  CHECK(t.encode_single("", 2).tokens == Strings{"[CLS]", "[SEP]"});
  CHECK(error_of([&] { t.encode_pair("a", "b", 2); }).find("max_length must be >= 3") != std::string::npos);
  CHECK(error_of([&] { t.encode_single("a", 1); }).find("max_length must be >= 2") != std::string::npos);
}

// =============================================================================================================
// WordPiece rules

TEST_CASE("wordpiece: greedy longest match, ## continuations, and [UNK] for the whole word") {
  const WordPieceTokenizer t = small({"[UNK]", "un", "##aff", "##able", "##a", "a", "##ff"});
  CHECK(t.tokenize("unaffable") == Strings{"un", "##aff", "##able"});  // ##aff is longer than ##a
  // no piece for "x": the pieces found so far are dropped, the whole word is one [UNK]; other words are unaffected
  CHECK(t.tokenize("unaffablex") == Strings{"[UNK]"});
  CHECK(t.tokenize("un unaffablex a") == Strings{"un", "[UNK]", "a"});
  CHECK(t.encode("un unaffablex a") == Ids{1, 0, 5});
  // a word-initial piece never uses the ## form, nor a later piece the bare one
  CHECK(t.tokenize("able") == Strings{"[UNK]"});
  CHECK(t.tokenize("aa") == Strings{"a", "##a"});
}

TEST_CASE("wordpiece: a word of more than 100 code points is one [UNK]; 100 still splits") {
  const WordPieceTokenizer t = small({"[UNK]", "ж", "##ж", "a", "##a"});
  std::string w100, w101;
  for (int i = 0; i < 100; ++i) w100 += "ж";  // 100 code points, 200 bytes: the limit counts code points
  w101 = w100 + "ж";
  const Strings p100 = t.tokenize(w100);
  REQUIRE(p100.size() == 100);
  CHECK(p100.front() == "ж");
  CHECK(p100.back() == "##ж");
  CHECK(t.tokenize(w101) == Strings{"[UNK]"});
  CHECK(t.tokenize(std::string(101, 'a') + " a") == Strings{"[UNK]", "a"});
  WordPieceOptions opt;
  opt.max_input_chars_per_word = 3;
  CHECK(small({"[UNK]", "a", "##a"}, opt).tokenize("aaa aaaa") == Strings{"a", "##a", "##a", "[UNK]"});
}

TEST_CASE("wordpiece: special tokens are cut out of the raw text, case-sensitively, before normalisation") {
  const WordPieceTokenizer& t = bert();
  CHECK(t.tokenize("x[MASK]y") == Strings{"x", "[MASK]", "y"});
  CHECK(t.encode("x[MASK]y") == Ids{1060, 103, 1061});
  CHECK(t.tokenize("[mask]") == Strings{"[", "mask", "]"});
  CHECK(t.tokenize("[SEP][SEP]") == Strings{"[SEP]", "[SEP]"});
  CHECK(t.tokenize("[MASK") == Strings{"[", "mask"});
  // a special token the vocabulary does not hold is ordinary text
  const WordPieceTokenizer s = small({"[UNK]", "[", "]", "mask", "x"});
  CHECK(s.tokenize("x[MASK]") == Strings{"x", "[", "mask", "]"});
  CHECK(s.tokenize("[UNK]") == Strings{"[UNK]"});  // [UNK] is in it: cut out, not [, unk, ]
}

TEST_CASE("wordpiece: empty and whitespace-only text gives no pieces") {
  CHECK(bert().tokenize("").empty());
  CHECK(bert().tokenize(" \t\n\r\u00a0\u3000").empty());
  CHECK(bert().encode_single(" ").tokens == Strings{"[CLS]", "[SEP]"});
  CHECK(bert().encode_pair("", "").tokens == Strings{"[CLS]", "[SEP]", "[SEP]"});
  CHECK(bert().encode_pair("", "").token_type_ids == Ids{0, 0, 1});
}

TEST_CASE("wordpiece: invalid UTF-8 text is a dea::Error naming the byte and its offset") {
  const std::string bad = std::string("caf") + char(0xC3) + "(";  // a lead byte without its continuation
  CHECK(error_of([&] { bert().tokenize(bad); }) ==
        "dea: the text is not valid UTF-8 (byte 0xC3 at byte offset 3)");
  CHECK(error_of([&] { bert().encode(std::string(1, char(0xFF))); }).find("byte 0xFF at byte offset 0") !=
        std::string::npos);
  CHECK(error_of([&] { bert().encode_pair("ok", std::string("\xED\xA0\x80")); }).find("not valid UTF-8") !=
        std::string::npos);  // an encoded surrogate
  CHECK(error_of([&] { bert().normalize(std::string("\xC0\xAF")); }).find("not valid UTF-8") !=
        std::string::npos);  // an overlong '/'
  CHECK(error_of([&] { bert().tokenize("caf\xC3\xA9 \xEF\xBF\xBD"); }).empty());  // é and a real U+FFFD are fine
}

// =============================================================================================================
// The vocabulary file

namespace {
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("dea_test_wordpiece_" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
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
};
}  // namespace

TEST_CASE("vocab: line n is id n; CRLF and trailing whitespace are not part of a token") {
  const Vocab v = Vocab::parse("[PAD]\r\n[UNK]\nhello \t\nworld", "v.txt");
  CHECK(v.size() == 4);
  CHECK(v.find("hello") == 2);
  CHECK(v.find("world") == 3);
  CHECK(v.find("hello ") == -1);
  CHECK(v.token(1) == "[UNK]");
  CHECK(v.max_token_chars() == 5);
  const Vocab& b = bert().vocab();
  CHECK(b.size() == 30522);
  CHECK(b.find("[PAD]") == 0);
  CHECK(b.find("[UNK]") == 100);
  CHECK(b.find("[CLS]") == 101);
  CHECK(b.find("[SEP]") == 102);
  CHECK(b.find("[MASK]") == 103);
  CHECK(b.find("the") == 1996);
  CHECK(b.find("##s") == 2015);
  Vocab copy = b;  // a copy has its own index
  CHECK(copy.find("hello") == 7592);
}

TEST_CASE("vocab: bad files are refused with the file, the line and the reason") {
  TempDir d;
  CHECK(error_of([&] { Vocab::load(d.file("empty.txt", "")); }).find("empty.txt: empty vocabulary") != std::string::npos);
  CHECK(error_of([&] { Vocab::load((d.path / "missing.txt").string()); }).find("cannot open file") != std::string::npos);
  CHECK(error_of([&] { Vocab::load(d.path.string()); }).find("is a directory") != std::string::npos);
  CHECK(error_of([&] { Vocab::load(d.file("dup.txt", "[UNK]\na\nb\nc\na\n")); })
            .find("dup.txt:5: duplicate token 'a' (the same token as line 2") != std::string::npos);
  CHECK(error_of([&] { Vocab::load(d.file("trail.txt", "[UNK]\na\na \n")); })
            .find("trail.txt:3: duplicate token 'a' (the same token as line 2") != std::string::npos);
  CHECK(error_of([&] { Vocab::load(d.file("utf8.txt", "[UNK]\nok\nca\xFF\n")); }) ==
        "dea: " + (d.path / "utf8.txt").string() + ":3: the line is not valid UTF-8 (byte 0xFF at byte offset 2)");
  CHECK(error_of([&] { Vocab::load(d.file("blank.txt", "[UNK]\n\na\n")); }).find("blank.txt:2: empty token") !=
        std::string::npos);
  CHECK(error_of([&] { Vocab::from_tokens({"a", ""}); }).find("vocabulary:2: empty token") != std::string::npos);
  CHECK(error_of([&] { Vocab::from_tokens({}); }).find("empty vocabulary") != std::string::npos);
}

TEST_CASE("vocab: the special tokens are required when they are needed") {
  CHECK(error_of([] { small({"a", "b"}); }) ==
        "dea: small has no token '[UNK]' (needed for the words the vocabulary cannot spell)");
  const WordPieceTokenizer t = small({"[UNK]", "a"});
  CHECK(t.tokenize("a b") == Strings{"a", "[UNK]"});  // tokenizing needs only [UNK]
  CHECK(error_of([&] { t.encode_pair("a", "a"); }).find("has no token '[CLS]'") != std::string::npos);
  CHECK(error_of([&] { t.encode_single("a"); }).find("has no token '[CLS]'") != std::string::npos);
  CHECK(error_of([&] { t.pad_id(); }).find("has no token '[PAD]' (needed for padding)") != std::string::npos);
  const WordPieceTokenizer u = small({"[UNK]", "[CLS]", "a"});
  CHECK(error_of([&] { u.encode_single("a"); }).find("has no token '[SEP]'") != std::string::npos);
}

// =============================================================================================================
// The normaliser, option by option

TEST_CASE("normaliser: clean_text removes controls (VT, FF, NEL, ZWSP, soft hyphen, BOM, private use) first") {
  BertNormalizer n;
  n.handle_chinese_chars = false;
  n.lowercase = false;
  CHECK(n.normalize(std::string("a\x0b" "b\x0c" "c\xc2\x85" "d")) == "abcd");  // VT, FF, U+0085: controls first
  CHECK(n.normalize("a\u200bb\u00adc\ufeffd\u2060e\ue000f") == "abcdef");
  CHECK(n.normalize(std::string("a\0b\xef\xbf\xbd" "c", 7)) == "abc");  // U+0000 and U+FFFD go
  CHECK(n.normalize("a\tb\nc\rd\u00a0e\u2003f\u3000g") == "a b c d e f g");  // whitespace -> space
  n.clean_text = false;
  CHECK(n.normalize("a\u200bb\tc") == "a\u200bb\tc");
  // unassigned in Unicode 8.0 (tokenizers' category data): not a control there, so kept, as Hugging Face keeps it
  BertNormalizer d;
  CHECK(d.normalize("x\u0378y\u08e2z") == "x\u0378y\u08e2z");
}

TEST_CASE("normaliser: CJK ideographs get spaces; kana, Hangul and full-width Latin do not") {
  BertNormalizer n;
  CHECK(n.normalize("東京") == " 東  京 ");
  CHECK(n.normalize("こんにちは") == "こんにちは");
  CHECK(n.normalize("\U00020000") == " \U00020000 ");
  // Hugging Face's tokenizers starts the Extension E block at U+2B920 (not U+2B820)
  CHECK(n.normalize("\U0002B820") == "\U0002B820");
  CHECK(n.normalize("\U0002B920") == " \U0002B920 ");
  n.handle_chinese_chars = false;
  CHECK(n.normalize("東京") == "東京");
}

TEST_CASE("normaliser: accents (NFD, then drop Mn) follow lowercase unless set; lowercase is full, no final sigma") {
  BertNormalizer n;  // bert-base-uncased
  CHECK(n.normalize("Ünïcödé façade") == "unicode facade");
  CHECK(n.normalize("İstanbul") == "istanbul");  // NFD I + U+0307, the mark dropped, then i
  CHECK(n.normalize("ΣΑΣ") == "σασ");             // no final-sigma rule
  CHECK(n.normalize("ǅ Dž") == "ǆ dz");
  CHECK(n.normalize("ﬁ Ｆ") == "ﬁ ｆ");  // no compatibility decomposition
  CHECK(n.normalize("\u20e3x") == "\u20e3x");  // Me is kept

  BertNormalizer cased;
  cased.lowercase = false;  // strip_accents unset: follows lowercase, so accents stay
  CHECK(cased.normalize("Café") == "Café");
  CHECK(!cased.strips_accents());
  cased.strip_accents = true;
  CHECK(cased.normalize("Café") == "Cafe");
  BertNormalizer lower_only;
  lower_only.strip_accents = false;
  CHECK(lower_only.normalize("İ") == "i\u0307");  // the full lower case of U+0130
  CHECK(lower_only.normalize("É") == "é");
}

TEST_CASE("pre-tokeniser: whitespace separates, each punctuation character is a word; symbols are not punctuation") {
  const auto words = [](const std::string& s) {
    Strings out;
    bert_pre_tokenize(unicode::decode_utf8(s), [&](std::u32string_view w) { out.push_back(u8(std::u32string(w))); });
    return out;
  };
  CHECK(words("a,b  c") == Strings{"a", ",", "b", "c"});
  CHECK(words("$5+3=8~|`^") == Strings{"$", "5", "+", "3", "=", "8", "~", "|", "`", "^"});
  CHECK(words("x—y “z”…") == Strings{"x", "—", "y", "“", "z", "”", "…"});
  CHECK(words("€5 ©2 №5 ½") == Strings{"€5", "©2", "№5", "½"});
  CHECK(words("") == Strings{});
  CHECK(words("  ") == Strings{});
}

// =============================================================================================================
// Unicode data

TEST_CASE("unicode: NFD decomposes fully, Hangul arithmetically, and orders marks by combining class") {
  CHECK(unicode::nfd(U"\u01d6") == U"u\u0308\u0304");     // ǖ: two levels of decomposition
  CHECK(unicode::nfd(U"\ud55c") == U"\u1112\u1161\u11ab");  // 한
  CHECK(unicode::nfd(U"\uac00") == U"\u1100\u1161");        // 가: no trailing consonant
  CHECK(unicode::nfd(U"a\u0301\u0316") == U"a\u0316\u0301");  // class 230 after class 220
  CHECK(unicode::nfd(U"a\u0316\u0301") == U"a\u0316\u0301");
  CHECK(unicode::nfd(U"\u1e69") == U"s\u0323\u0307");  // ṩ: dot below (220) before dot above (230)
  CHECK(unicode::nfd(U"\u212b") == U"A\u030a");         // Å (Angstrom sign): a singleton decomposition
  CHECK(unicode::combining_class(0x0301) == 230);
  CHECK(unicode::combining_class(0x0316) == 220);
  CHECK(unicode::combining_class('a') == 0);
}

TEST_CASE("unicode: categories as tokenizers has them (Unicode 8.0), lower case from the UCD") {
  CHECK(unicode::is_control(0x200b));
  CHECK(unicode::is_control(0x180e));
  CHECK(unicode::is_control(0x10fffd));
  CHECK(!unicode::is_control(0x0378));   // unassigned
  CHECK(!unicode::is_control(0x08e2));   // a format character only since Unicode 9.0
  CHECK(unicode::is_punctuation(0x111c9));  // Po in Unicode 8.0 (Mn since 13.0)
  CHECK(unicode::is_punctuation(0x166d));   // Po in Unicode 8.0 (So since 12.0)
  CHECK(!unicode::is_punctuation(0x20ac));  // €: a symbol
  CHECK(unicode::is_punctuation('$'));
  CHECK(unicode::is_nonspacing_mark(0x0301));
  CHECK(unicode::is_nonspacing_mark(0x1734));   // Mn in Unicode 8.0 (Mc since 14.0)
  CHECK(!unicode::is_nonspacing_mark(0x1885));  // Lo in Unicode 8.0
  CHECK(!unicode::is_nonspacing_mark(0x093e));  // Mc
  CHECK(unicode::is_whitespace(0x3000));
  CHECK(!unicode::is_whitespace(0x200b));
  std::u32string l;
  for (const char32_t c : std::u32string(U"AÀĀǅΣЖԱႠＡ𐐀\u0130")) unicode::append_lower(l, c);
  CHECK(l == U"aàāǆσжաⴀａ𐐨i\u0307");
  CHECK(std::string(unicode::tables::kCategoryVersion) == "8.0");
  CHECK(std::string(unicode::tables::kNormalizationVersion) == "9.0");
}

}  // namespace test_wordpiece
