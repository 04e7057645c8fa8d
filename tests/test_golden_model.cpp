// The reference's own numbers for the whole model: the public dea_model case (model_cls), every out.* and grad.*
// tensor, in double and in float.
//
// One input of the reference is not in the file: its positional table, which PositionalEncoding builds in float32
// with PyTorch's CPU exp / sin / cos (vectorised, not correctly rounded in every cell). Our table
// (nn::SinusoidalPositionalEncoding, Precision::float32) uses the C library's float functions, so a few cells
// differ by one float32 ulp (~6e-8), which moves the outputs by up to ~1e-7 relative. The test therefore
//   1. runs the case with our own table and requires <= 2e-7 (the size of that effect), and
//   2. runs it with the table the reference's formula gives in PyTorch 1.13 (tests/data/reference/model_cls_pe,
//      written by make_model_cls_pe.py there) and requires 1e-9 for every tensor.
#include <catch2/catch.hpp>
#include <dea/interop/model_case.hpp>

#include <algorithm>
#include <cmath>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_golden_model {

using namespace dea;

namespace {

std::string golden(const std::string& name) { return std::string(DEA_TEST_DATA_DIR) + "/golden/" + name; }

struct Worst {
  double rel = 0;
  std::string name;
  bool all_ok = true;
};

Worst compare(const io::SafeTensors& cs, const io::SafeTensors& got, double tol, const char* what) {
  Worst w;
  const auto cmp = interop::compare_case(cs, got, tol);
  REQUIRE(cmp.size() == 3 + 47);  // out.logits, out.task_loss, out.loss_gate + one grad per parameter (47)
  for (const auto& c : cmp) {
    INFO(what << ": " << c.name << " rel " << c.rel_error << " max|ref| " << c.max_expected);
    CHECK_FALSE(c.missing);
    CHECK(c.ok);
    w.all_ok = w.all_ok && c.ok;
    if (c.rel_error > w.rel) {
      w.rel = c.rel_error;
      w.name = c.name;
    }
  }
  return w;
}

}  // namespace

TEST_CASE("dea_model golden case reproduces (double and float)", "[golden][model]") {
  const io::SafeTensors cs = io::SafeTensors::load(golden("model_cls.safetensors"));
  const nn::ModelConfig cfg = interop::model_case_config(cs);
  REQUIRE(cfg.task == nn::Task::cls);
  const Index D = cfg.d_model;

  // 1. our own float32 table
  const io::SafeTensors own = interop::run_dea_model_case<double>(cs);
  const Worst w_own = compare(cs, own, 2e-7, "own table");
  WARN("model_cls, our positional table: worst relative error in double " << w_own.rel << " (" << w_own.name << ")");
  // the objective reaches every parameter but the unused MLM bias, whose reference gradient is zero
  for (const auto& c : interop::compare_case(cs, own, 1.0))
    if (c.name.rfind("grad.", 0) == 0 && c.name != "grad.mlm_head.bias") CHECK(c.max_expected > 0);

  // 2. the reference's own table
  const Tensor<double> pe = io::SafeTensors::load(std::string(DEA_TEST_DATA_DIR) + "/reference/model_cls_pe.safetensors").get<double>("pe");
  REQUIRE(pe.shape == Shape{cfg.max_len, D});
  const Mat<double> ref_table = pe.matrix(D);
  const Mat<double> own_table = nn::SinusoidalPositionalEncoding<double>(cfg.max_len, D).table();
  REQUIRE((ref_table - own_table).cwiseAbs().maxCoeff() < 1e-6);  // the same table up to float32 rounding
  const io::SafeTensors with_ref = interop::run_dea_model_case<double>(cs, &ref_table);
  const Worst w_ref = compare(cs, with_ref, 1e-9, "reference table");
  WARN("model_cls, the reference's positional table: worst relative error in double " << w_ref.rel << " ("
                                                                                       << w_ref.name << ")");

  // float, with our own table
  const io::SafeTensors gotf = interop::run_dea_model_case<float>(cs);
  const Worst w_f = compare(cs, gotf, 1e-4, "float");
  WARN("model_cls: worst relative error in float " << w_f.rel << " (" << w_f.name << ")");
}

TEST_CASE("dea_model case runner rejects a wrong kind and a tampered tied head", "[golden][model]") {
  io::SafeTensors cs = io::SafeTensors::load(golden("model_cls.safetensors"));
  io::SafeTensors layer = io::SafeTensors::load(golden("layer_basic.safetensors"));
  REQUIRE_THROWS_AS(interop::run_dea_model_case<double>(layer), Error);
  Tensor<double> emb = cs.get<double>("tok_emb.weight");
  emb[3] += 1.0;
  cs.put("mlm_head.weight", emb, io::DType::F64);
  REQUIRE_THROWS_AS(interop::run_dea_model_case<double>(cs), Error);
  cs.put("mlm_head.weight", cs.get<double>("tok_emb.weight"), io::DType::F64);
  REQUIRE_NOTHROW(interop::run_dea_model_case<double>(cs));
  // a parameter of the wrong shape is refused by the strict load
  io::SafeTensors bad = io::SafeTensors::load(golden("model_cls.safetensors"));
  bad.put("ln_f.bias", Tensor<double>({31}, 0.0), io::DType::F64);
  REQUIRE_THROWS_AS(interop::run_dea_model_case<double>(bad), Error);
}

TEST_CASE("case runners check the metadata sizes against the stored tensors and refuse non-finite parameters",
          "[golden][model]") {
  // sizes that disagree with the file's tensors are an Error before the model allocates anything from them
  for (const char* key : {"vocab_size", "d_model", "d_ff", "n_heads", "n_classes", "n_layers", "max_len"}) {
    io::SafeTensors cs = io::SafeTensors::load(golden("model_cls.safetensors"));
    cs.set_metadata(key, "1000000000000");
    CHECK_THROWS_WITH(interop::run_dea_model_case<double>(cs), Catch::Contains(std::string("'") + key + "'"));
  }
  io::SafeTensors two = io::SafeTensors::load(golden("model_cls.safetensors"));
  two.set_metadata("n_layers", "1");  // the file stores two layers
  CHECK_THROWS_WITH(interop::run_dea_model_case<double>(two), Catch::Contains("n_layers") && Catch::Contains("disagrees"));
  // a NaN parameter is a bad file, named with its index (otherwise every output would be NaN: a "mismatch")
  io::SafeTensors layer = io::SafeTensors::load(golden("layer_basic.safetensors"));
  Tensor<double> wg = layer.get<double>("W_gate");
  wg[5] = std::nan("");
  layer.put("W_gate", wg, io::DType::F64);
  CHECK_THROWS_WITH(interop::run_dea_layer_case<double>(layer), Catch::Contains("'W_gate'") && Catch::Contains("index 5"));
  io::SafeTensors model = io::SafeTensors::load(golden("model_cls.safetensors"));
  Tensor<double> lnb = model.get<double>("ln_f.bias");
  lnb[0] = INFINITY;
  model.put("ln_f.bias", lnb, io::DType::F64);
  CHECK_THROWS_WITH(interop::run_dea_model_case<double>(model), Catch::Contains("'ln_f.bias'") && Catch::Contains("non-finite"));
}

}  // namespace test_golden_model
