// embedded_profile_check, part 3: every attention class trains in the embedded profile's configuration (a
// TransformerModel forward / backward with each, and an AdamW step). A translation unit of its own, so that the
// four model instantiations compile in parallel with the rest of the check (profile_check.cpp).
#include <dea/attention/dot_product.hpp>
#include <dea/attention/dual_expert.hpp>
#include <dea/attention/laplacian.hpp>
#include <dea/attention/token_routed.hpp>
#include <dea/nn/transformer.hpp>
#include <dea/optim/adamw.hpp>

#include <cmath>
#include <cstdio>
#include <type_traits>

using namespace dea;

namespace {

// ---- 3. training with every attention class -------------------------------------------------------------------

template <class A>
bool train_step(const char* name) {
  nn::ModelConfig mc;
  mc.vocab_size = 40;
  mc.d_model = 16;
  mc.n_heads = 2;
  mc.n_layers = 1;
  mc.d_ff = 32;
  mc.max_len = 16;
  mc.dropout = 0.1;
  Rng rng(3);
  nn::TransformerModel<float, A> model(mc, rng);
  nn::ModelBatch<float> b;
  b.input_ids = Tensor<std::int64_t>({2, 8});
  for (Index k = 0; k < 16; ++k) b.input_ids[k] = 1 + (3 * k) % 39;
  b.labels = Tensor<std::int64_t>({2});
  b.labels[0] = 0;
  b.labels[1] = 1;
  typename nn::TransformerModel<float, A>::Cache cache;
  model.zero_grad();
  const auto out = model.forward(b, 0.5f, true, &rng, cache);
  model.backward(cache);
  double gsum = 0;
  for (Param<float>* p : model.parameters()) gsum += static_cast<double>(p->grad.cwiseAbs().sum());
  const bool ok = std::isfinite(static_cast<double>(out.loss())) && gsum > 0;
  std::printf("  %s: loss %.6g, sum |grad| %.6g\n", name, static_cast<double>(out.loss()), gsum);
  if constexpr (std::is_same<A, DualExpertAttention<float>>::value) {
    optim::GroupConfig gate = optim::main_group_defaults();
    gate.name = "gate";
    gate.lr = 1e-3;
    optim::AdamW<float> opt(model.parameters(), {optim::main_group_defaults(), gate});
    const float before = model.parameters()[0]->value[0];
    opt.step();
    std::printf("  AdamW step moved tok_emb.weight[0] by %.3g\n",
                static_cast<double>(model.parameters()[0]->value[0] - before));
    return ok && model.parameters()[0]->value[0] != before;
  }
  return ok;
}

}  // namespace

bool train_every_attention_class() {
  return train_step<DualExpertAttention<float>>("DualExpertAttention") &&
         train_step<DotProductAttention<float>>("DotProductAttention") &&
         train_step<TokenRoutedAttention<float>>("TokenRoutedAttention") &&
         train_step<LaplacianAttention<float>>("LaplacianAttention");
}
