// `dea export-c` (examples/dea/export_c.cpp), run as a user runs it: a checkpoint of a TransformerModel goes in, and
// the header that comes out holds every parameter under its reference name, with its shape and exactly its
// values (read back from the hexadecimal literals), the model's sizes, and nothing of the optimiser state.
// Compiling and running such headers is what the embedded programs do (examples/embedded_inference).
#include <catch2/catch.hpp>
#include <dea/core/files.hpp>
#include <dea/io/safetensors.hpp>
#include <dea/lm/model.hpp>
#include <dea/nn/inference.hpp>
#include <dea/nn/transformer.hpp>

#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_export {

using namespace dea;

namespace {

/// Runs `dea export-c` with `args`; returns its exit status. Its messages go to `err_file` (default: discarded).
int run_export(const std::string& args, const std::string& err_file = "/dev/null") {
  const std::string cmd = std::string(DEA_EXPORT_C_EXE) + " " + args + " >/dev/null 2>" + err_file;
  const int r = std::system(cmd.c_str());
  return WIFEXITED(r) ? WEXITSTATUS(r) : -1;
}

/// The values of the array that follows the comment line `/// "name" [shape]` in a generated header.
std::vector<std::string> array_tokens(const std::string& text, const std::string& name, const std::string& shape) {
  const std::string marker = "/// \"" + name + "\" " + shape + "\n";
  const std::size_t at = text.find(marker);
  if (at == std::string::npos) return {};
  const std::size_t open = text.find('{', at), close = text.find("};", at);
  std::vector<std::string> out;
  std::string tok;
  for (std::size_t k = open + 1; k < close; ++k) {
    const char c = text[k];
    if (c == ',' || c == ' ' || c == '\n') {
      if (!tok.empty()) out.push_back(tok);
      tok.clear();
    } else {
      tok += c;
    }
  }
  if (!tok.empty()) out.push_back(tok);
  return out;
}

std::filesystem::path fresh_dir(const char* name) {
  const std::filesystem::path d = std::filesystem::current_path() / name;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace

TEST_CASE("dea_export_c writes every parameter exactly, under its name, with the model's sizes", "[export]") {
  nn::ModelConfig mc;
  mc.vocab_size = 23;
  mc.d_model = 8;
  mc.n_heads = 2;
  mc.n_layers = 2;
  mc.d_ff = 12;
  mc.max_len = 10;
  mc.n_classes = 3;
  Rng rng(1);
  nn::TransformerModel<float> model(mc, rng);
  // values of every magnitude, negative zero, a subnormal: the literals must carry them all exactly
  model.parameters()[0]->value[0] = -0.0f;
  model.parameters()[0]->value[1] = 1e-40f;
  model.parameters()[0]->value[2] = 3.4e38f;
  const std::filesystem::path dir = fresh_dir("export_test_model");
  io::SafeTensors st;
  io::put_parameters(st, model.parameters(), io::DType::F32);
  Tensor<float> moment({2}, 0.5f);
  st.put("optim.exp_avg.tok_emb.weight", moment, io::DType::F32);
  st.save((dir / "checkpoint.safetensors").string());

  const std::string out = (dir / "weights.hpp").string();
  // no config.json beside this checkpoint: the task must be given too (it used to be guessed as cls)
  CHECK(run_export((dir / "checkpoint.safetensors").string() + " " + out + " --max_len 10") == 1);
  CHECK_FALSE(std::filesystem::exists(out));
  REQUIRE(run_export((dir / "checkpoint.safetensors").string() + " " + out +
                     " --max_len 10 --task cls --namespace my_weights") == 0);
  const std::string text = dea::read_file(out);
  CHECK(text.find("namespace my_weights {") != std::string::npos);
  CHECK(text.find("optim.") == std::string::npos);
  CHECK(text.find("constexpr dea::nn::InferenceConfig config{/*vocab_size*/ 23, /*d_model*/ 8, /*n_heads*/ 2, "
                  "/*n_layers*/ 2, /*d_ff*/ 12,") != std::string::npos);
  CHECK(text.find("/*max_len*/ 10, /*n_classes*/ 3, dea::nn::Task::cls}") != std::string::npos);
  Index arrays = 0;
  for (const Param<float>* p : model.parameters()) {
    INFO(p->name);
    const std::vector<std::string> toks = array_tokens(text, p->name, shape_str(p->shape));
    REQUIRE(static_cast<Index>(toks.size()) == p->numel());
    for (Index k = 0; k < p->numel(); ++k) {
      const std::string& t = toks[static_cast<std::size_t>(k)];
      REQUIRE(t.back() == 'f');
      const float v = std::strtof(t.c_str(), nullptr);
      CHECK(std::memcmp(&v, &p->value[k], sizeof v) == 0);  // the same bits (-0 included)
    }
    CHECK(text.find("{\"" + p->name + "\", ") != std::string::npos);  // listed in the table by its name
    ++arrays;
  }
  CHECK(arrays == static_cast<Index>(model.parameters().size()));

  // without --max_len and without a config.json beside the checkpoint the sequence length is unknown
  CHECK(run_export((dir / "checkpoint.safetensors").string() + " " + (dir / "other.hpp").string()) == 1);
  CHECK_FALSE(std::filesystem::exists(dir / "other.hpp"));
  // the output must not be the input: the checkpoint would be replaced by its own header
  const std::string before = dea::read_file((dir / "checkpoint.safetensors").string());
  CHECK(run_export((dir / "checkpoint.safetensors").string() + " " + (dir / "checkpoint.safetensors").string() +
                   " --max_len 10 --task cls") == 2);
  CHECK(dea::read_file((dir / "checkpoint.safetensors").string()) == before);
}

TEST_CASE("dea_export_c --safetensors --type bf16 writes a checkpoint's parameters as BF16, rounded to nearest even, "
          "and the loaders read it back", "[export][bf16]") {
  lm::DecoderConfig c;
  c.hidden_size = 16;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 24;
  c.vocab_size = 19;
  c.attention_type = "gqa";
  c.mlp_type = "dense_deterministic";
  lm::DecoderLM<float> model(c, 3);
  // a tie that rounds to even (1 + 2^-8 -> 1), one that rounds up (1 + 3 * 2^-8 -> 1 + 2^-6), a NaN
  model.parameters()[0]->value[0] = 1.0f + std::ldexp(1.0f, -8);
  model.parameters()[0]->value[1] = 1.0f + 3 * std::ldexp(1.0f, -8);
  model.parameters()[0]->value[2] = std::numeric_limits<float>::quiet_NaN();
  const std::filesystem::path dir = fresh_dir("export_test_bf16");
  io::SafeTensors st;
  io::put_parameters(st, model.parameters(), io::DType::F32);
  st.put("optim.exp_avg.embed_tokens.weight", Tensor<float>({2}, 0.5f), io::DType::F32);
  st.put("train.step", Tensor<std::int64_t>({1}, 7), io::DType::I64);
  st.save((dir / "checkpoint.safetensors").string());

  const std::string out = (dir / "weights_bf16.safetensors").string();
  CHECK(run_export((dir / "checkpoint.safetensors").string() + " " + (dir / "x.hpp").string() + " --type bf16 --all") ==
        2);  // (a header takes bf16 for a model's product weights only)
  REQUIRE(run_export((dir / "checkpoint.safetensors").string() + " " + out + " --safetensors --type bf16") == 0);
  const io::SafeTensors back = io::SafeTensors::load(out);
  CHECK_FALSE(back.has("optim.exp_avg.embed_tokens.weight"));
  CHECK_FALSE(back.has("train.step"));
  std::size_t f32_bytes = 0, bf16_bytes = 0;
  for (Param<float>* p : model.parameters()) {
    INFO(p->name);
    REQUIRE(back.has(p->name));
    CHECK(back.dtype(p->name) == io::DType::BF16);
    f32_bytes += st.nbytes(p->name);
    bf16_bytes += back.nbytes(p->name);
    const Tensor<float> t = back.get<float>(p->name);
    REQUIRE(t.shape == p->shape);
    for (Index i = 0; i < p->numel(); ++i) {
      const float want = round_bf16(p->value[i]);
      if (std::isnan(want))
        CHECK(std::isnan(t[i]));
      else
        CHECK(t[i] == want);
    }
  }
  CHECK(bf16_bytes * 2 == f32_bytes);
  const Tensor<float> e = back.get<float>("embed_tokens.weight");
  CHECK(e[0] == 1.0f);
  CHECK(e[1] == 1.0f + std::ldexp(1.0f, -6));

  // the model's loader reads the BF16 file (as it reads F32 and F16): the rounded values, exactly
  lm::DecoderLM<float> loaded(c, 99);
  io::load_parameters(loaded.parameters(), back);
  for (std::size_t k = 0; k < model.parameters().size(); ++k) {
    const Param<float>& a = *model.parameters()[k];
    const Param<float>& b = *loaded.parameters()[k];
    for (Index i = 3; i < a.numel(); ++i) CHECK(b.value[i] == round_bf16(a.value[i]));
  }
  // float again: F32, the rounded values unchanged
  const std::string again = (dir / "again.safetensors").string();
  REQUIRE(run_export(out + " " + again + " --safetensors --type float") == 0);
  const io::SafeTensors f = io::SafeTensors::load(again);
  CHECK(f.dtype("norm.weight") == io::DType::F32);
  CHECK(f.get<float>("embed_tokens.weight")[1] == 1.0f + std::ldexp(1.0f, -6));
}

TEST_CASE("dea_export_c --type bf16 writes a model header's product weights as bf16 bits, the rest as float",
          "[export][bf16]") {
  nn::ModelConfig mc;
  mc.vocab_size = 23;
  mc.d_model = 8;
  mc.n_heads = 2;
  mc.n_layers = 2;
  mc.d_ff = 12;
  mc.max_len = 10;
  mc.n_classes = 3;
  Rng rng(2);
  nn::TransformerModel<float> model(mc, rng);
  const std::filesystem::path dir = fresh_dir("export_test_header_bf16");
  io::SafeTensors st;
  io::put_parameters(st, model.parameters(), io::DType::F32);
  st.save((dir / "checkpoint.safetensors").string());
  const std::string out = (dir / "weights.hpp").string();
  REQUIRE(run_export((dir / "checkpoint.safetensors").string() + " " + out + " --max_len 10 --task cls --type bf16") ==
          0);
  const std::string text = dea::read_file(out);
  CHECK(text.find("model.bind(t.name, static_cast<const dea::bf16*>(t.data)") != std::string::npos);
  Index products = 0, others = 0;
  for (const Param<float>* p : model.parameters()) {
    INFO(p->name);
    const std::vector<std::string> toks = array_tokens(text, p->name, shape_str(p->shape));
    REQUIRE(static_cast<Index>(toks.size()) == p->numel());
    const bool product = nn::InferenceModel<float>::is_product_weight(p->name.c_str());
    CHECK(text.find("constexpr " + std::string(product ? "dea::bf16 " : "float ")) != std::string::npos);
    for (Index k = 0; k < p->numel(); ++k) {
      const std::string& t = toks[static_cast<std::size_t>(k)];
      if (product) {  // {0xhhhh}: the bits of the value rounded to nearest even
        REQUIRE(t.size() == 8);
        CHECK(std::strtoul(t.substr(1, 6).c_str(), nullptr, 16) == to_bf16(p->value[k]).bits);
      } else {
        REQUIRE(t.back() == 'f');
        const float v = std::strtof(t.c_str(), nullptr);
        CHECK(std::memcmp(&v, &p->value[k], sizeof v) == 0);
      }
    }
    (product ? products : others) += 1;
  }
  CHECK(products == 2 * 4 + 2);  // per layer W_v, W_o, ff.0, ff.3 (W_q and W_k stay float); the cls head's two
  CHECK(others > 0);
}

TEST_CASE("dea_export_c --all writes any file's tensors and metadata; bad input is refused", "[export]") {
  const std::filesystem::path dir = fresh_dir("export_test_all");
  const std::string golden = std::string(DEA_TEST_DATA_DIR) + "/golden/layer_basic.safetensors";
  const std::string out = (dir / "case.hpp").string();
  REQUIRE(run_export(golden + " " + out + " --all --type double --namespace golden_basic") == 0);
  const std::string text = dea::read_file(out);
  const io::SafeTensors cs = io::SafeTensors::load(golden);
  for (const std::string& name : cs.names()) {
    INFO(name);
    const std::vector<std::string> toks = array_tokens(text, name, shape_str(cs.shape(name)));
    CHECK(static_cast<Index>(toks.size()) == std::max<Index>(1, cs.numel(name)));
  }
  // doubles exactly; the integer targets as integers
  const Tensor<double> x = cs.get<double>("in.x");
  const std::vector<std::string> xt = array_tokens(text, "in.x", shape_str(cs.shape("in.x")));
  REQUIRE(static_cast<Index>(xt.size()) == x.numel());
  for (Index k = 0; k < x.numel(); ++k) CHECK(std::strtod(xt[static_cast<std::size_t>(k)].c_str(), nullptr) == x[k]);
  CHECK(text.find("constexpr std::int64_t in_target_idx[12]") != std::string::npos);
  CHECK(text.find("{\"gamma_mix\", \"0.5\"}") != std::string::npos);
  CHECK(text.find("InferenceConfig") == std::string::npos);  // not a model

  // a file that is not a model checkpoint needs --all; a file that is not safetensors; bad flags
  CHECK(run_export(golden + " " + (dir / "x.hpp").string()) == 1);
  CHECK(run_export(std::string(DEA_TEST_DATA_DIR) + "/../CMakeLists.txt " + (dir / "y.hpp").string() + " --all") == 1);
  CHECK(run_export(golden + " " + (dir / "z.hpp").string() + " --all --type half") == 2);
  CHECK(run_export(golden + " " + (dir / "z.hpp").string() + " --all --namespace 1abc") == 2);
  CHECK(run_export(golden) == 2);
  CHECK_FALSE(std::filesystem::exists(dir / "x.hpp"));
}

TEST_CASE("dea_export_c gives every array an identifier that compiles; bad names and namespaces are refused",
          "[export]") {
  const std::filesystem::path dir = fresh_dir("export_test_names");
  // names that, copied as they were, would clash with the header's own declarations (tensors, find, n_tensors,
  // TensorInfo, ...), with keywords (int), with the namespaces it uses (std, dea) or its own, with macros (NULL,
  // INT64_MAX, __LINE__, GCC's linux), or with each other once '.' becomes '_' (a.b, a_b). (ctest entry
  // dea_export_c_names_compile compiles the header.)
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"tensors", "tensors_"},   {"find", "find_"},         {"n_tensors", "n_tensors_"}, {"TensorInfo", "TensorInfo_"},
      {"int", "int_"},           {"int_", "int_2"},         {"metadata", "metadata_"},   {"n_metadata", "n_metadata_"},
      {"config", "config_"},     {"bind", "bind_"},         {"std", "std_"},             {"dea", "dea_"},
      {"names_ns", "names_ns_"}, {"NULL", "t_NULL"},        {"INT64_MAX", "t_INT64_MAX"}, {"__LINE__", "t__LINE__"},
      {"linux", "linux_"},       {"a.b", "a_b"},            {"a_b", "a_b_2"},            {"9lives", "t_9lives"},
      {"W_q.weight", "W_q_weight"}};
  io::SafeTensors st;
  Tensor<float> v({2}, 0.25f);
  for (const auto& [name, id] : expected) st.put(name, v, io::DType::F32);
  st.save((dir / "names.safetensors").string());
  const std::string out = (dir / "names.hpp").string();
  REQUIRE(run_export((dir / "names.safetensors").string() + " " + out + " --all --namespace names_ns") == 0);
  const std::string text = dea::read_file(out);
  for (const auto& [name, id] : expected) {
    INFO(name << " -> " << id);
    // the array under its identifier, listed in the table by its reference name
    CHECK(text.find("\n/// \"" + name + "\" [2]\nalignas(64) constexpr float " + id + "[2] = {") != std::string::npos);
    CHECK(text.find("{\"" + name + "\", " + id + ", 'f',") != std::string::npos);
  }
  // the header's own declarations are still there, once each
  CHECK(text.find("constexpr TensorInfo tensors[] = {") != std::string::npos);
  CHECK(text.find("constexpr int n_tensors = 21;") != std::string::npos);

  // the namespace must be an identifier that is not a keyword, reserved, std or dea
  for (const char* ns : {"int", "std", "dea", "_Weights", "a__b", "linux"}) {
    INFO(ns);
    CHECK(run_export((dir / "names.safetensors").string() + " " + (dir / "ns.hpp").string() + " --all --namespace " +
                     ns) == 2);
  }
  CHECK_FALSE(std::filesystem::exists(dir / "ns.hpp"));

  // a model checkpoint whose layer tensor has no decimal index: a bad file (1), the message names file and tensor
  io::SafeTensors bad;
  bad.put("tok_emb.weight", Tensor<float>({4, 2}, 0.5f), io::DType::F32);
  bad.put("layers.abc.x", v, io::DType::F32);
  const std::string bad_path = (dir / "bad_layer.safetensors").string();
  bad.save(bad_path);
  const std::string err = (dir / "bad_layer.err").string();
  CHECK(run_export(bad_path + " " + (dir / "bad.hpp").string() + " --max_len 4", err) == 1);
  const std::string msg = dea::read_file(err);
  CHECK(msg.find("bad_layer.safetensors") != std::string::npos);
  CHECK(msg.find("'layers.abc.x'") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir / "bad.hpp"));
}

}  // namespace test_export
