// dea interop: runs a reference case file through the library, writes what it computed, and compares.
//
//   dea interop CASE.safetensors [--out RESULT.safetensors] [--compare] [--float] [--pe TABLE.safetensors]
//               [--hf_model DIR] [--threads N]
//
// The case's metadata `kind` selects what runs (tests/data/golden/README.md):
//   dea_layer     one DualExpertAttention: forward on the training graph with dropout 0, backward of
//                 sum(out.output * in.grad_output) + loss_gate;
//   dea_model     a TransformerModel: objective task_loss + loss_gate; --pe gives the positional table the
//                 reference used (tensor "pe" [max_len, d_model]), which the case files do not store;
//   tr_mha_layer  one TokenRoutedAttention (tolerance 2e-6 x max(1, max|ref|), route indices exact);
//   tr_moe_mlp    one TR-MoE MLP (docs/lm.md, golden cases; 2e-6 x max(1, max|ref|), 1e-4 in float; routes exact);
//   lm_model      the decoder-only LM with its causal loss (docs/lm.md; the same tolerances, every
//                 parameter gradient, the TR-MoE route tables exact);
//   bert_model, bert_seq_cls, sentence_embedding
//                 a Hugging Face BertModel / BertForSequenceClassification / mean-pooled sentence embedding
//                 (tests/data/bert/README.md; float tolerances 1e-4 for out.*, 1e-3 for grad.*);
//   dea_bert      the reference's DualExpertBert: objective task_loss + loss_gate; out.logits, out.task_loss,
//                 out.loss_gate, out.loss_gate_layer.*, out.alpha_hat.*, out.last_hidden_state and every grad.*,
//                 with the BERT tolerances; a layer whose count of decision pairs differs from the case's metadata
//                 is named (a borderline pair can flip with round-off);
//   deberta_model, deberta_seq_cls, bucket_table
//                 a Hugging Face DebertaV2Model / DebertaV2ForSequenceClassification (out.last_hidden_state,
//                 out.hidden_states.*, out.relative_pos, out.logits) and the log-bucket table of relative positions
//                 (tests/data/deberta/README.md; float tolerance 1e-4; integer tensors exact).
// --hf_model DIR loads the BertModel of a Hugging Face model directory (config.json + model.safetensors) and runs
// it on the case's in.input_ids / in.attention_mask / in.token_type_ids, whatever the case's kind: it writes
// out.last_hidden_state and out.pooler_output, and --compare checks those two against the case's. A DeBERTa
// directory (model_type "deberta-v2") gives out.last_hidden_state, and out.logits when it holds a classifier.
// --out writes every computed `out.*` and `grad.*` tensor (F64; route indices I64), for every kind, so a program
// that is not ours can check the results. --compare prints, per expected tensor, max |got - expected| /
// max(max |expected|, 1e-12) and exits 1 when any exceeds 1e-9 (1e-4 with --float; BERT grad.* 1e-3 with --float);
// integer tensors must match exactly. Without --out, --compare is the default. Exit 2 on bad arguments or a bad
// file (a model directory that does not load included).
// examples/dea/import_reference_checkpoint.py turns a checkpoint of the reference into a run directory.
#include "commands.hpp"

#include <dea/cli/flags.hpp>
#include <dea/core/parallel.hpp>
#include <dea/interop/bert_case.hpp>
#include <dea/interop/dea_bert_case.hpp>
#include <dea/interop/dea_case.hpp>
#include <dea/interop/deberta_case.hpp>
#include <dea/interop/lm_case.hpp>
#include <dea/interop/model_case.hpp>
#include <dea/interop/tr_mha_case.hpp>
#include <dea/interop/tr_moe_case.hpp>

#include <fmt/core.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <new>
#include <string>
#include <vector>

using namespace dea;

// Named, not anonymous: the program's files are compiled as one translation unit (examples/CMakeLists.txt).
namespace interop_cmd {
[[noreturn]] void usage(const std::string& why) {
  fmt::print(stderr, "{}(dea interop --help lists the flags)\n", dea::cli::message("dea interop", why));
  std::exit(2);
}
}  // namespace interop_cmd

int dea_interop(int argc, char** argv) {
  using namespace interop_cmd;
  std::string case_path, out_path, pe_path, hf_model;
  bool compare = false, use_float = false;
  int threads = 0;
  cli::FlagSet fs("dea interop CASE.safetensors [flags]",
                  "Runs a golden case (tests/data/golden/README.md) through the library; writes what it computed\n"
                  "(--out) and compares it with the case's numbers (--compare, the default without --out).");
  fs.exit_status("0 agreement (or written), 1 above tolerance, 2 bad command line or a bad file");
  fs.positional("CASE.safetensors", "a case file of kind dea_layer, dea_model, tr_mha_layer, tr_moe_mlp, lm_model, bert_model, bert_seq_cls, "
                "sentence_embedding, dea_bert, deberta_model, deberta_seq_cls or bucket_table (any case with in.input_ids under --hf_model)");
  fs.text("out", out_path, "RESULT.safetensors", "write every computed out.* and grad.* tensor here");
  fs.toggle("compare", compare, "compare with the case's tensors (tolerance 1e-9, 1e-4 with --float, 1e-3 for BERT "
            "gradients in float; exit 1 on a miss)");
  fs.toggle("float", use_float, "run in float instead of double");
  fs.text("pe", pe_path, "TABLE.safetensors", "dea_model cases: the reference's positional table (tensor 'pe')");
  fs.text("hf_model", hf_model, "DIR", "run the BertModel (or DeBERTa model) of this Hugging Face model directory on "
          "the case's in.* tensors (writes out.last_hidden_state, and out.pooler_output or out.logits)");
  fs.integer("threads", threads, 0, cli::kMaxThreads, "OpenMP threads (0 = the library default)");
  try {
    const auto p = fs.parse(std::vector<std::string>(argv + 1, argv + argc));
    if (p.help) {
      fmt::print("{}", fs.help());
      return 0;
    }
    if (!p.positional.empty()) case_path = p.positional[0];
  } catch (const std::exception& e) {
    usage(e.what());
  }
  if (threads > 0) set_num_threads(threads);
  if (case_path.empty()) usage("no case file given");
  {  // --out over the case itself would replace the reference's numbers with ours
    std::error_code ec;
    if (!out_path.empty() && std::filesystem::equivalent(case_path, out_path, ec))
      usage("--out '" + out_path + "' is the case file itself");
  }
  if (!compare && out_path.empty()) compare = true;  // nothing else to do: compare by default

  try {
    const io::SafeTensors cs = io::SafeTensors::load(case_path);
    const auto it = cs.metadata().find("kind");
    const std::string kind = it == cs.metadata().end() ? "" : it->second;
    if (!pe_path.empty() && kind != "dea_model") usage("--pe applies only to dea_model cases (this is '" + kind + "')");
    const bool deberta_dir = !hf_model.empty() && deberta::is_deberta_dir(hf_model);
    if (deberta_dir || (hf_model.empty() && interop::is_deberta_kind(kind))) {
      io::SafeTensors got;
      if (deberta_dir) {
        deberta::LoadReport rep;
        got = use_float ? interop::run_deberta_hf_case<float>(hf_model, cs, &rep)
                        : interop::run_deberta_hf_case<double>(hf_model, cs, &rep);
        fmt::print("loaded {}\n", rep.str());
      } else {
        got = use_float ? interop::run_deberta_case<float>(cs) : interop::run_deberta_case<double>(cs);
      }
      if (!out_path.empty()) {
        got.save(out_path);
        fmt::print("wrote {} tensors to {}\n", got.size(), out_path);
      }
      if (!compare) return 0;
      const auto cmp = interop::compare_deberta_case(cs, got, use_float, deberta_dir);
      check(!cmp.empty(), case_path, ": the case holds no expected out.* tensor that this run computes: nothing to "
            "compare against");
      bool ok = true;
      double worst = 0;
      for (const auto& c : cmp) {
        if (c.missing) fmt::print("  MISSING {}\n", c.name);
        else
          fmt::print("  {} {:<40} {} {:.3e}   max|ref| {:.3e}\n", c.ok ? "ok  " : "FAIL", c.name,
                     c.integer ? "max|diff|" : "rel", c.rel_error, c.max_expected);
        ok = ok && !c.missing && c.ok;
        if (!c.integer) worst = std::max(worst, c.rel_error);
      }
      fmt::print("{}: {} tensors, worst relative error {:.3e} (tolerance {}, integers exact, {}): {}\n", case_path,
                 cmp.size(), worst, use_float ? "1e-4" : "1e-9", use_float ? "float" : "double", ok ? "PASS" : "FAIL");
      return ok ? 0 : 1;
    }
    const bool dea_bert = hf_model.empty() && kind == "dea_bert";
    if (!hf_model.empty() || interop::is_bert_kind(kind) || dea_bert) {
      io::SafeTensors got;
      bert::HfLoadReport rep;
      if (!hf_model.empty()) {
        got = use_float ? interop::run_hf_model_case<float>(hf_model, cs, &rep)
                        : interop::run_hf_model_case<double>(hf_model, cs, &rep);
        fmt::print("loaded {}\n", rep.str());
      } else if (dea_bert) {
        got = use_float ? interop::run_dea_bert_case<float>(cs) : interop::run_dea_bert_case<double>(cs);
      } else {
        got = use_float ? interop::run_bert_case<float>(cs) : interop::run_bert_case<double>(cs);
      }
      if (!out_path.empty()) {
        got.save(out_path);
        fmt::print("wrote {} tensors to {}\n", got.size(), out_path);
      }
      if (!compare) return 0;
      const auto cmp = interop::compare_bert_case(cs, got, use_float, !hf_model.empty());
      check(!cmp.empty(), case_path, ": the case holds no expected out.* tensor that this run computes: nothing to "
            "compare against");
      bool ok = true;
      double worst = 0;
      for (const auto& c : cmp) {
        if (c.missing) fmt::print("  MISSING {}\n", c.name);
        else
          fmt::print("  {} {:<52} rel {:.3e}   max|ref| {:.3e}{}\n", c.ok ? "ok  " : "FAIL", c.name, c.rel_error,
                     c.max_expected, c.on_case_scale ? "   (zero in exact arithmetic: relative to the largest gradient)" : "");
        ok = ok && c.ok;
        worst = std::max(worst, c.rel_error);
      }
      if (dea_bert)
        for (const std::string& d : interop::dea_bert_decision_pair_differences(cs, got))
          fmt::print("  note: {} (a pair on the border of the beta window flipped with round-off)\n", d);
      fmt::print("{}: {} tensors, worst relative error {:.3e} (tolerance {}, {}): {}\n", case_path, cmp.size(), worst,
                 use_float ? "1e-4 out.*, 1e-3 grad.*" : "1e-9", use_float ? "float" : "double", ok ? "PASS" : "FAIL");
      return ok ? 0 : 1;
    }
    // the kinds whose runner returns its own comparison: write --out, print the report, exit by its verdict
    auto finish = [&](const auto& r, const std::string& relative) {
      if (!out_path.empty()) {
        r.computed.save(out_path);
        fmt::print("wrote {} tensors to {}\n", r.computed.size(), out_path);
      }
      if (!compare) return 0;
      fmt::print("{}", r.str());
      fmt::print("{}: worst error / tolerance {:.3e}{} ({}): {}\n", case_path, r.worst_ratio, relative,
                 use_float ? "float" : "double", r.ok ? "PASS" : "FAIL");
      return r.ok ? 0 : 1;
    };
    auto relative = [](double e) { return fmt::format(", worst relative error {:.3e}", e); };
    if (kind == "tr_mha_layer")
      return finish(use_float ? interop::run_tr_mha_case<float>(case_path) : interop::run_tr_mha_case<double>(case_path),
                    "");
    if (kind == "tr_moe_mlp") {  // one TR-MoE MLP: 2e-6 x max(1, max|ref|), 1e-4 in float; routes exact
      const auto r = use_float ? interop::run_tr_moe_case<float>(case_path) : interop::run_tr_moe_case<double>(case_path);
      return finish(r, relative(r.worst_relative));
    }
    if (kind == "lm_model") {  // the decoder LM with its loss (tolerance 2e-6, float 1e-4)
      const auto r = use_float ? interop::run_lm_case<float>(case_path) : interop::run_lm_case<double>(case_path);
      return finish(r, relative(r.worst_rel_error));
    }
    io::SafeTensors got;
    if (kind == "dea_layer") {
      got = use_float ? interop::run_dea_layer_case<float>(cs) : interop::run_dea_layer_case<double>(cs);
    } else if (kind == "dea_model") {
      Mat<double> pe;
      if (!pe_path.empty()) {
        const Tensor<double> t = io::SafeTensors::load(pe_path).get<double>("pe");
        check(t.dim() == 2, pe_path, ": tensor 'pe' must be [max_len, d_model], got ", shape_str(t.shape));
        pe = t.matrix(t.size(1));
      }
      const Mat<double>* pp = pe_path.empty() ? nullptr : &pe;
      got = use_float ? interop::run_dea_model_case<float>(cs, pp) : interop::run_dea_model_case<double>(cs, pp);
    } else {
      usage(fmt::format("{}: unsupported case kind '{}' (supported: dea_layer, dea_model, tr_mha_layer, tr_moe_mlp, lm_model, bert_model, "
                        "bert_seq_cls, sentence_embedding, dea_bert, deberta_model, deberta_seq_cls, bucket_table; "
                        "any case with in.input_ids under --hf_model)",
                        case_path, kind));
    }
    if (!out_path.empty()) {
      got.save(out_path);
      fmt::print("wrote {} tensors to {}\n", got.size(), out_path);
    }
    if (!compare) return 0;
    const char* main_out = kind == "dea_layer" ? "out.output" : "out.logits";
    check(cs.has(main_out), case_path, ": the case holds no expected '", main_out, "': nothing to compare against");
    const double tol = use_float ? 1e-4 : 1e-9;
    const auto cmp = interop::compare_case(cs, got, tol);
    bool ok = true;
    double worst = 0;
    for (const auto& c : cmp) {
      if (c.missing) fmt::print("  MISSING {}\n", c.name);
      else
        fmt::print("  {} {:<28} {} {:.3e}   max|ref| {:.3e}\n", c.ok ? "ok  " : "FAIL", c.name,
                   c.integer ? "max|diff|" : "rel", c.rel_error, c.max_expected);
      ok = ok && c.ok;
      worst = std::max(worst, c.rel_error);
    }
    fmt::print("{}: {} tensors, worst relative error {:.3e} (tolerance {:.0e}, {}): {}\n", case_path, cmp.size(), worst,
               tol, use_float ? "float" : "double", ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "dea interop: {}: out of memory running the case (are its sizes right?)\n", case_path);
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}", dea::cli::message("dea interop", e));
    return 2;
  }
}
