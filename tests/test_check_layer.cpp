// Tests of testing::check_layer: it passes the library's layers (Linear, LayerNorm, FeedForward,
// DualExpertAttention) with every parameter and input, and it fails a toy layer whose backward is wrong in each of
// the ways the contract forbids: a wrong parameter gradient, a wrong input gradient, and gradients that are
// overwritten instead of added to.
#include <catch2/catch.hpp>
#include <dea/attention/dual_expert.hpp>
#include <dea/nn/feed_forward.hpp>
#include <dea/nn/layer_norm.hpp>
#include <dea/nn/linear.hpp>
#include <dea/testing/check_layer.hpp>

#include <cmath>
#include <limits>
#include <string>

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_check_layer {

using namespace dea;
using testing::check_layer;
using testing::CheckLayerReport;
using testing::InputGrads;

namespace {

/// A toy layer y = tanh(x W^T + b), with a backward that can be broken on purpose.
struct Toy {
  enum class Fault { none, weight_grad, input_grad, overwrite };
  Param<double> W{"W", "main", {3, 4}}, b{"b", "main", {3}};
  Fault fault = Fault::none;
  Mat<double> x, y;  // the forward's input and output, kept for the backward

  explicit Toy(Fault f = Fault::none) : fault(f) {
    Rng rng(5);
    init::uniform(W.value, rng, -0.8, 0.8);
    init::uniform(b.value, rng, -0.3, 0.3);
  }
  ParamList<double> parameters() { return {&W, &b}; }
  Mat<double> forward(const Mat<double>& in) {
    x = in;
    y = ((x * W.mat().transpose()).rowwise() + b.value.transpose()).array().tanh().matrix();
    return y;
  }
  Mat<double> backward(const Mat<double>& dy) {
    Mat<double> da = dy.cwiseProduct((1.0 - y.array().square()).matrix());  // y = tanh(a) -> da = dy (1 - y^2)
    if (fault == Fault::overwrite) {
      W.grad_mat() = da.transpose() * x;  // forgets what was already there
    } else {
      Mat<double> dW = da.transpose() * x;                          // a = x W^T + b -> dW = da^T x
      if (fault == Fault::weight_grad) dW(1, 2) *= 1.001;           // one element off by 0.1 %
      W.grad_mat() += dW;
    }
    b.grad += da.colwise().sum().transpose();                       // db = sum over rows of da
    Mat<double> dx = da * W.mat();                                  // dx = da W
    if (fault == Fault::input_grad) dx(0, 0) += 1e-3 * dx.cwiseAbs().maxCoeff();
    return dx;
  }
};

std::string names(const CheckLayerReport& rep) {
  std::string s;
  for (const auto& t : rep.gradients.tensors) s += t.name + " ";
  return s;
}

}  // namespace

TEST_CASE("check_layer passes a correct layer and reports every parameter and the input", "[check_layer]") {
  Toy toy;
  const CheckLayerReport rep = check_layer(toy, 5, 4);
  INFO(rep.str());
  REQUIRE(rep.ok);
  REQUIRE(rep.accumulates);
  REQUIRE(rep.accumulation_error < 1e-12);
  REQUIRE(names(rep) == "W b x ");
  REQUIRE(rep.worst_rel_error < 1e-6);
  REQUIRE(rep.worst_rel_error == rep.gradients.worst_rel_error);
  REQUIRE(rep.str().rfind("check_layer: ok", 0) == 0);
}

TEST_CASE("check_layer fails a wrong parameter gradient and names it", "[check_layer]") {
  Toy toy(Toy::Fault::weight_grad);
  const CheckLayerReport rep = check_layer(toy, 5, 4);
  INFO(rep.str());
  REQUIRE_FALSE(rep.ok);
  REQUIRE(rep.accumulates);  // the broken gradient is still added, so only the values are wrong
  REQUIRE(rep.worst_tensor == "W");
  REQUIRE(rep.worst_index == 1 * 4 + 2);  // element (1, 2) of the row-major [3, 4] weight
  // a 0.1 % error in one element of the largest-gradient scale is far above the tolerance
  REQUIRE(rep.worst_rel_error > 1e-5);
  REQUIRE(rep.str().rfind("check_layer: FAILED", 0) == 0);
}

TEST_CASE("check_layer fails a wrong input gradient and names it", "[check_layer]") {
  Toy toy(Toy::Fault::input_grad);
  const CheckLayerReport rep = check_layer(toy, 5, 4);
  INFO(rep.str());
  REQUIRE_FALSE(rep.ok);
  REQUIRE(rep.worst_tensor == "x");
  REQUIRE(rep.worst_index == 0);
}

TEST_CASE("check_layer fails a backward that overwrites the gradients instead of adding to them", "[check_layer]") {
  Toy toy(Toy::Fault::overwrite);
  const CheckLayerReport rep = check_layer(toy, 5, 4);
  INFO(rep.str());
  REQUIRE_FALSE(rep.ok);
  REQUIRE_FALSE(rep.accumulates);
  REQUIRE(rep.accumulation_worst == "W");
  REQUIRE(rep.worst_tensor == "accumulation of W");
  // from zeroed gradients the values are right: only the accumulation check can see this fault
  REQUIRE(rep.gradients.ok);
}

TEST_CASE("check_layer rejects a backward that returns the wrong input gradients", "[check_layer]") {
  Toy toy;
  Mat<double> x = testing::random_projection(5, 4, 3);
  auto forward = [&] { return toy.forward(x); };
  REQUIRE_THROWS_AS(
      check_layer(toy.parameters(), {{"x", &x}}, forward, [&](const Mat<double>&) { return InputGrads{}; }), Error);
  REQUIRE_THROWS_AS(check_layer(toy.parameters(), {{"x", &x}}, forward,
                                [&](const Mat<double>& dy) { return InputGrads{toy.backward(dy).transpose()}; }),
                    Error);
}

TEST_CASE("check_layer passes the library's Linear, LayerNorm and FeedForward", "[check_layer]") {
  Rng rng(21);
  const Index N = 6, D = 5;
  Mat<double> x = testing::random_projection(N, D, 8);

  SECTION("Linear") {
    nn::Linear<double> lin(D, 3, rng);
    const CheckLayerReport rep = check_layer(
        lin.parameters(), {{"x", &x}}, [&] { Mat<double> y; lin.forward(x, y); return y; },
        [&](const Mat<double>& dy) { Mat<double> dx; lin.backward(dy, x, &dx); return InputGrads{dx}; });
    INFO(rep.str());
    REQUIRE(rep.ok);
    REQUIRE(names(rep) == "weight bias x ");
  }
  SECTION("LayerNorm") {
    nn::LayerNorm<double> ln(D);
    init::uniform(ln.weight.value, rng, 0.5, 1.5);  // away from the identity affine map, so both are tested
    init::uniform(ln.bias.value, rng, -0.5, 0.5);
    nn::LayerNorm<double>::Cache c;
    const CheckLayerReport rep = check_layer(
        ln.parameters(), {{"x", &x}}, [&] { Mat<double> y; ln.forward(x, y, c); return y; },
        [&](const Mat<double>& dy) { Mat<double> dx; ln.backward(dy, x, c, dx); return InputGrads{dx}; });
    INFO(rep.str());
    REQUIRE(rep.ok);
    REQUIRE(names(rep) == "weight bias x ");
  }
  SECTION("FeedForward") {
    nn::FeedForward<double> ff(D, 7, 0.0, rng);
    nn::FeedForward<double>::Cache c;
    const CheckLayerReport rep = check_layer(
        ff.parameters(), {{"u", &x}}, [&] { return ff.forward(x, false, nullptr, c); },
        [&](const Mat<double>& dy) { return InputGrads{ff.backward(dy, x, c)}; });
    INFO(rep.str());
    REQUIRE(rep.ok);
    REQUIRE(names(rep) == "0.weight 0.bias 3.weight 3.bias u ");
  }
}

TEST_CASE("check_layer passes DualExpertAttention's task path with every parameter and input", "[check_layer][dea]") {
  const Index B = 2, T = 4, D = 8, H = 2;
  Rng rng(31);
  DualExpertAttention<double> attn(D, H, rng);
  for (Param<double>* p : attn.parameters())  // non-zero biases, so that every path carries signal
    if (p->name.find("bias") != std::string::npos) init::uniform(p->value, rng, -0.3, 0.3);
  Mat<double> x = testing::random_projection(B * T, D, 9);
  Tensor<std::uint8_t> mask({B, T}, 1);
  mask[1 * T + 3] = 0;
  Tensor<double> oracle({B, T, T}, std::numeric_limits<double>::quiet_NaN());
  oracle[(0 * T + 1) * T + 2] = 0.8;
  oracle[(1 * T + 0) * T + 1] = 0.2;

  // The task path reads α̂ as a constant: hold it at its unperturbed value.
  AttnInputs<double> in(B, T);
  in.set_key_mask(mask).set_oracle(oracle).set_gamma_mix(0.5);
  DualExpertAttention<double>::Cache c;
  attn.forward(x, in, c);
  Tensor<double> frozen({B, H, T, T});
  for (Index k = 0; k < frozen.numel(); ++k) frozen[k] = c.alpha_hat[static_cast<std::size_t>(k)];
  in.set_frozen_alpha_hat(frozen);

  const CheckLayerReport rep = check_layer(
      attn.parameters(), {{"x", &x}}, [&] { return attn.forward(x, in, c); },
      [&](const Mat<double>& dy) { return InputGrads{attn.backward(dy, c)}; });
  INFO(rep.str());
  REQUIRE(rep.ok);
  REQUIRE(rep.gradients.tensors.size() == attn.parameters().size() + 1);
}

}  // namespace test_check_layer
