// The NLI oracle with a DeBERTa-v3 cross-encoder: the public golden case (tests/data/deberta/oracle/: a tiny
// v3-shaped DebertaV2ForSequenceClassification with its own spm.model, and the BERT sentence embedder of the BERT
// oracle's case), token ids exact and phi / sim / alpha_raw / alpha to 1e-9 in double and 1e-5 in float; each pair's
// numbers the same bits alone or in a batch, on 1 or 2 threads; the slow tokenizer mode; bf16 products; refusals.
// Built only with the sentencepiece library (the DeBERTa tokenizer needs it).
#include <dea/oracle/nli_oracle.hpp>
#include <dea/core/files.hpp>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace test_oracle_deberta {

using namespace dea;
namespace fs = std::filesystem;

namespace {

const std::string kDir = std::string(DEA_TEST_DATA_DIR) + "/deberta/oracle";
const std::string kNli = kDir + "/nli";
const std::string kSim = std::string(DEA_TEST_DATA_DIR) + "/bert/oracle/oracle_sim";

std::vector<nlohmann::json> expected() {
  std::vector<nlohmann::json> out;
  std::ifstream in(kDir + "/expected.jsonl");
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::vector<bert::TextPair> pairs_of(const std::vector<nlohmann::json>& e) {
  std::vector<bert::TextPair> p;
  for (const auto& j : e) p.push_back({j.at("q_text").get<std::string>(), j.at("k_text").get<std::string>()});
  return p;
}

using Ids = std::vector<std::int64_t>;

double rel_err(double got, double want) { return std::abs(got - want) / std::max(1.0, std::abs(want)); }

template <class S>
void check_golden(double tol) {
  const auto exp = expected();
  REQUIRE(exp.size() == 14);
  const nlohmann::json meta = nlohmann::json::parse(read_file(kDir + "/oracle.json"));
  auto oracle = bert::NliOracle<S>::load(kNli, kSim);
  REQUIRE(oracle.nli_is_deberta());
  CHECK(oracle.entailment_index() == meta.at("entailment_index").get<Index>());
  CHECK(oracle.entailment_label() == "entailment");
  const auto pairs = pairs_of(exp);
  for (std::size_t i = 0; i < exp.size(); ++i) {
    const text::Encoding e = oracle.nli_encoding(pairs[i].premise, pairs[i].hypothesis);
    CHECK(e.input_ids == exp[i].at("nli_input_ids").get<Ids>());
    CHECK(e.token_type_ids == exp[i].at("nli_token_type_ids").get<Ids>());
    CHECK(oracle.sim_encoding(pairs[i].premise).input_ids == exp[i].at("sim_input_ids_q").get<Ids>());
    CHECK(oracle.sim_encoding(pairs[i].hypothesis).input_ids == exp[i].at("sim_input_ids_k").get<Ids>());
  }
  const std::vector<bert::OracleScore> s = oracle.score(pairs);
  double worst[4] = {0, 0, 0, 0};
  for (std::size_t i = 0; i < exp.size(); ++i) {
    const double err[4] = {rel_err(s[i].phi, exp[i].at("phi").get<double>()),
                           rel_err(s[i].sim, exp[i].at("sim").get<double>()),
                           rel_err(s[i].alpha_raw, exp[i].at("alpha_raw").get<double>()),
                           rel_err(s[i].alpha, exp[i].at("alpha").get<double>())};
    for (int k = 0; k < 4; ++k) worst[k] = std::max(worst[k], err[k]);
  }
  std::printf("DeBERTa oracle golden case (%s): worst relative error phi %.3g, sim %.3g, alpha_raw %.3g, alpha %.3g "
              "(tolerance %g)\n", sizeof(S) == 8 ? "double" : "float", worst[0], worst[1], worst[2], worst[3], tol);
  for (double w : worst) CHECK(w <= tol);
}

}  // namespace

TEST_CASE("oracle on DeBERTa: golden case in double, ids exact and numbers to 1e-9", "[oracle][deberta][golden]") {
  check_golden<double>(1e-9);
}

TEST_CASE("oracle on DeBERTa: golden case in float, to 1e-5", "[oracle][deberta][golden]") {
  check_golden<float>(1e-5);
}

TEST_CASE("oracle on DeBERTa: a pair's numbers are the same bits alone or in a batch, on 1 or 2 threads",
          "[oracle][deberta]") {
  const int saved = num_threads();
  const auto pairs = pairs_of(expected());
  auto oracle = bert::NliOracle<float>::load(kNli, kSim);
  set_num_threads(2);
  const auto batch = oracle.score(pairs);
  set_num_threads(1);
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    const bert::OracleScore one = oracle.score(pairs[i].premise, pairs[i].hypothesis);
    CHECK(one.phi == batch[i].phi);
    CHECK(one.sim == batch[i].sim);
    CHECK(one.alpha == batch[i].alpha);
  }
  // and with pairs repeated, so several of one length run in one forward
  std::vector<bert::TextPair> many;
  for (int r = 0; r < 3; ++r) many.insert(many.end(), pairs.begin(), pairs.end());
  const auto rep = oracle.score(many);
  for (std::size_t i = 0; i < many.size(); ++i) CHECK(rep[i].phi == batch[i % pairs.size()].phi);
  set_num_threads(saved);
}

TEST_CASE("oracle on DeBERTa: the slow tokenizer mode gives the slow ids, the same ones where the case says so",
          "[oracle][deberta]") {
  const auto exp = expected();
  bert::OracleOptions opt;
  opt.nli_tokenizer = text::SpmMode::slow;
  auto slow = bert::NliOracle<double>::load(kNli, kSim, opt);
  int same = 0;
  for (const auto& j : exp) {
    const text::Encoding e = slow.nli_encoding(j.at("q_text").get<std::string>(), j.at("k_text").get<std::string>());
    const bool eq = e.input_ids == j.at("nli_input_ids").get<Ids>();
    CHECK(eq == j.at("slow_tokenizer_same_ids").get<bool>());
    same += eq;
  }
  CHECK(same == 12);
}

TEST_CASE("oracle on DeBERTa: bf16 products keep alpha within 0.01 of float", "[oracle][deberta][precision]") {
  const auto pairs = pairs_of(expected());
  bert::OracleOptions opt;
  opt.precision = Precision::bf16;
  auto f32 = bert::NliOracle<float>::load(kNli, kSim);
  auto b16 = bert::NliOracle<float>::load(kNli, kSim, opt);
  const auto a = f32.score(pairs), b = b16.score(pairs);
  double worst = 0;
  bool differ = false;
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    worst = std::max(worst, std::abs(a[i].alpha - b[i].alpha));
    differ = differ || a[i].phi != b[i].phi;
  }
  std::printf("DeBERTa oracle, bf16 against float: max |alpha difference| %.3g\n", worst);
  CHECK(differ);  // the products did run in bf16
  CHECK(worst <= 0.01);
}

TEST_CASE("oracle on DeBERTa: refusals name the directory and the file", "[oracle][deberta][bad_input]") {
  const fs::path tmp = fs::temp_directory_path() / "dea_test_oracle_deberta_no_spm";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer_config.json"})
    fs::copy_file(fs::path(kNli) / f, tmp / f);
  try {
    (void)bert::NliOracle<float>::load(tmp.string(), kSim);
    FAIL("a DeBERTa directory without spm.model was accepted");
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    CHECK(m.find("spm.model") != std::string::npos);
    CHECK(m.find(tmp.string()) != std::string::npos);
  }
  fs::remove_all(tmp);
  // a DeBERTa cross-encoder has no BERT model to hand out, and the other way round
  auto oracle = bert::NliOracle<float>::load(kNli, kSim);
  CHECK_THROWS_WITH(oracle.nli(), Catch::Contains("is a DeBERTa model"));
  // a tokenizer with more tokens than the model's embedding rows is not this model's
  const text::SpmTokenizer tok(kNli, text::SpmMode::fast);
  deberta::DebertaConfig small = deberta::load_deberta_for_sequence_classification<float>(kNli).config();
  small.vocab_size = static_cast<Index>(tok.vocab_size()) - 1;
  CHECK_THROWS_WITH(bert::NliOracle<float>(deberta::DebertaV2ForSequenceClassification<float>(small), tok,
                                           bert::load_bert_model<float>(kSim), bert::load_hf_tokenizer(kSim)),
                    Catch::Contains("not this model's"));
}

}  // namespace test_oracle_deberta
