// The reference's own numbers: every public dea_layer golden case reproduced to 1e-9 in double (1e-4 in float),
// and the gate-loss statistics (computed by the reference in float32) to float precision.
#include <catch2/catch.hpp>
#include <dea/interop/dea_case.hpp>

#include <cstdlib>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_golden_layer {

using namespace dea;

namespace {
std::string golden(const std::string& name) { return std::string(DEA_TEST_DATA_DIR) + "/golden/" + name; }
}  // namespace

TEST_CASE("dea_layer golden cases reproduce in double and float", "[golden][dea]") {
  for (const char* name : {"layer_basic.safetensors", "layer_masked_block.safetensors", "layer_inference.safetensors"}) {
    SECTION(name) {
      const io::SafeTensors cs = io::SafeTensors::load(golden(name));
      const io::SafeTensors got = interop::run_dea_layer_case<double>(cs);
      const auto cmp = interop::compare_case(cs, got, 1e-9);
      REQUIRE(cmp.size() >= 15);
      double worst = 0;
      for (const auto& c : cmp) {
        INFO(name << " " << c.name << " rel " << c.rel_error << " max|ref| " << c.max_expected);
        CHECK_FALSE(c.missing);
        CHECK(c.ok);
        worst = std::max(worst, c.rel_error);
      }
      WARN(name << ": worst relative error in double " << worst);

      const io::SafeTensors gotf = interop::run_dea_layer_case<float>(cs);
      for (const auto& c : interop::compare_case(cs, gotf, 1e-4)) {
        INFO(name << " float " << c.name << " rel " << c.rel_error);
        CHECK(c.ok);
      }

      // gate statistics: the reference computed them in float32
      for (const char* key : {"stats.loss_reg", "stats.loss_spot", "stats.loss_decision", "stats.decision_side_acc",
                              "stats.n_decision_pairs"}) {
        const auto it = cs.metadata().find(key);
        if (it == cs.metadata().end()) continue;
        const double expected = std::atof(it->second.c_str());
        const double actual = std::atof(got.metadata().at(key).c_str());
        INFO(key << " expected " << expected << " got " << actual);
        CHECK(std::abs(actual - expected) <= 1e-5 * std::max(1.0, std::abs(expected)));
      }
    }
  }
}

}  // namespace test_golden_layer
