// train_loop: a training loop written with the library's pieces, top to bottom: the synthetic D_alpha pairs with
// their mock oracle, a tokenizer, a small Dual-Expert encoder, AdamW with the main and gate parameter groups, and
// for each step: collate a batch, forward, backward, clip, optimiser step. It prints the losses falling and, at
// the end, "loss fell: yes" or "loss fell: NO" (exit status 1). `dea train` does the same with checkpoints,
// evaluation, logs and plots (dea/train/encoder.hpp); this is the loop without them.
//
//   train_loop [steps (default 80)]
#include <dea/data/collate.hpp>
#include <dea/data/dalpha.hpp>
#include <dea/text/simple_tokenizer.hpp>
#include <dea/nn/transformer.hpp>
#include <dea/optim/adamw.hpp>
#include <dea/optim/schedule.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace dea;
using S = float;

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 80;
  if (steps < 10 || steps > 100000) {
    std::fprintf(stderr, "usage: train_loop [steps in 10..100000]\n");
    return 2;
  }
  // data: D_alpha pairs (question, key sentence, label), each with the mock oracle alpha over its token pairs
  data::DalphaOptions dopt;
  dopt.n_per_source = 100;
  std::vector<data::Record> records = data::build_dalpha_synthetic(dopt);
  data::attach_mock_oracle(records, 42);
  const data::Splits splits = data::split_records(records);
  std::vector<std::string> texts;
  for (const auto& r : splits.train) {
    texts.push_back(r.q_text);
    texts.push_back(r.k_text);
  }
  const data::SimpleTokenizer tok = data::SimpleTokenizer::from_texts(texts);

  // model: a small 2-layer Dual-Expert encoder with a 2-class head
  nn::ModelConfig mc;
  mc.vocab_size = tok.vocab_size();
  mc.d_model = 32;
  mc.n_heads = 2;
  mc.n_layers = 2;
  mc.d_ff = 64;
  mc.max_len = 40;
  mc.dropout = 0.0;
  mc.n_classes = 2;
  mc.pad_id = data::SimpleTokenizer::pad_id;
  Rng rng(42);
  nn::TransformerModel<S> model(mc, rng);

  // optimiser: AdamW, the gate parameters (W_gate, c_gate) in their own group with their own learning rate
  optim::GroupConfig main_group = optim::main_group_defaults(), gate_group = optim::gate_group_defaults();
  main_group.lr = 3e-3;
  optim::AdamW<S> opt = optim::build_optimizer(model.parameters(), main_group, gate_group);

  nn::TransformerModel<S>::Cache cache;
  std::vector<std::vector<std::size_t>> batches;
  double first = 0, last = 0;
  for (int step = 1; step <= steps; ++step) {
    if (batches.empty()) batches = data::make_batches(splits.train.size(), 16, true, &rng);  // a new epoch
    const std::vector<std::size_t> idx = batches.back();
    batches.pop_back();
    const data::PairBatch<S> p = data::collate_pairs<S>(splits.train, idx, tok, mc.max_len);
    nn::ModelBatch<S> b;
    b.input_ids = p.input_ids;
    b.token_type_ids = p.token_type_ids;
    b.attention_mask = p.attention_mask;
    b.labels = p.labels;
    b.alpha_oracle = p.alpha_oracle;

    // gamma_mix falls from 1 (the oracle steers the attention) to 0 (the gate alone) over the first 60% of steps
    const S gamma = optim::gamma_mix<S>(step - 1, steps * 6 / 10);
    const nn::ModelOutput<S> out = model.forward(b, gamma, /*training=*/true, &rng, cache);
    opt.zero_grad();
    model.backward(cache);       // d(task_loss + loss_gate); the gate loss reaches only W_gate and c_gate
    opt.clip_grad_norms();       // per group, at max_grad_norm
    opt.step();

    const double loss = static_cast<double>(out.task_loss);
    if (step <= 10) first += loss / 10;         // mean of the first ten steps
    if (step > steps - 10) last += loss / 10;   // and of the last ten
    if (step % 20 == 0 || step == 1)
      std::printf("step %4d  gamma %.2f  task_loss %.4f  loss_gate %.4f\n", step, static_cast<double>(gamma), loss,
                  static_cast<double>(out.loss_gate));
  }
  const bool fell = last < first;
  std::printf("mean task_loss: first 10 steps %.4f, last 10 steps %.4f; loss fell: %s\n", first, last,
              fell ? "yes" : "NO");
  return fell ? 0 : 1;
}
