// dea_interop: runs a reference case file through the library, writes what it computed, and compares.
//
//   dea_interop CASE.safetensors [--out RESULT.safetensors] [--compare] [--float] [--pe TABLE.safetensors]
//               [--threads N]
//
// The case's metadata `kind` selects what runs (tests/data/golden/README.md):
//   dea_layer     one DualExpertAttention: forward on the training graph with dropout 0, backward of
//                 sum(out.output * in.grad_output) + loss_gate;
//   dea_model     a TransformerModel: objective task_loss + loss_gate; --pe gives the positional table the
//                 reference used (tensor "pe" [max_len, d_model]), which the case files do not store;
//   tr_mha_layer  one TokenRoutedAttention (tolerance 2e-6 x max(1, max|ref|), route indices exact; the
//                 runner compares and prints, --out is not available for this kind).
// --out writes every computed `out.*` and `grad.*` tensor (F64). --compare prints, per expected tensor,
// max |got - expected| / max(max |expected|, 1e-12) and exits 1 when any exceeds 1e-9 (1e-4 with --float);
// integer tensors must match exactly. Exit 2 on bad arguments or a bad file.
#include <dea/io/cli.hpp>
#include <dea/io/dea_case.hpp>
#include <dea/io/model_case.hpp>
#include <dea/io/tr_mha_case.hpp>

#include <fmt/core.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <new>
#include <string>

using namespace dea;

namespace {
[[noreturn]] void usage(const std::string& why) {
  fmt::print(stderr,
             "dea_interop: {}\nusage: dea_interop CASE.safetensors [--out RESULT.safetensors] [--compare] [--float] "
             "[--pe TABLE.safetensors] [--threads N]\n",
             why);
  std::exit(2);
}
}  // namespace

int main(int argc, char** argv) {
  std::string case_path, out_path, pe_path;
  bool compare = false, use_float = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--compare") compare = true;
    else if (a == "--float") use_float = true;
    else if (a == "--out") {
      if (++i >= argc || argv[i][0] == '\0') usage("--out needs a file name");
      out_path = argv[i];
    } else if (a == "--pe") {
      if (++i >= argc) usage("--pe needs a file name");
      pe_path = argv[i];
    } else if (a == "--threads") {
      if (++i >= argc) usage("--threads needs a number");
      try {
        set_num_threads(static_cast<int>(cli::parse_int("--threads", argv[i], 1, cli::kMaxThreads)));
      } catch (const Error& e) {
        usage(e.what());
      }
    } else if (a == "-h" || a == "--help") usage("runs a golden case (tests/data/golden/README.md) through dea");
    else if (!a.empty() && a[0] == '-') usage("unknown flag " + a);
    else if (case_path.empty()) case_path = a;
    else usage("more than one case file given");
  }
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
    if (kind == "tr_mha_layer") {
      if (!out_path.empty()) usage("--out is not available for tr_mha_layer cases");
      const auto r = use_float ? io::run_tr_mha_case<float>(case_path) : io::run_tr_mha_case<double>(case_path);
      fmt::print("{}", r.str());
      fmt::print("{}: worst error / tolerance {:.3e} ({}): {}\n", case_path, r.worst_ratio, use_float ? "float" : "double",
                 r.ok ? "PASS" : "FAIL");
      return r.ok ? 0 : 1;
    }
    io::SafeTensors got;
    if (kind == "dea_layer") {
      got = use_float ? io::run_dea_layer_case<float>(cs) : io::run_dea_layer_case<double>(cs);
    } else if (kind == "dea_model") {
      Mat<double> pe;
      if (!pe_path.empty()) {
        const Tensor<double> t = io::SafeTensors::load(pe_path).get<double>("pe");
        check(t.dim() == 2, pe_path, ": tensor 'pe' must be [max_len, d_model], got ", shape_str(t.shape));
        pe = t.matrix(t.size(1));
      }
      const Mat<double>* pp = pe_path.empty() ? nullptr : &pe;
      got = use_float ? io::run_dea_model_case<float>(cs, pp) : io::run_dea_model_case<double>(cs, pp);
    } else {
      usage(fmt::format("{}: unsupported case kind '{}' (supported: dea_layer, dea_model, tr_mha_layer)", case_path, kind));
    }
    if (!out_path.empty()) {
      got.save(out_path);
      fmt::print("wrote {} tensors to {}\n", got.size(), out_path);
    }
    if (!compare) return 0;
    const char* main_out = kind == "dea_layer" ? "out.output" : "out.logits";
    check(cs.has(main_out), case_path, ": the case holds no expected '", main_out, "': nothing to compare against");
    const double tol = use_float ? 1e-4 : 1e-9;
    const auto cmp = io::compare_case(cs, got, tol);
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
    fmt::print(stderr, "dea_interop: {}: out of memory running the case (are its sizes right?)\n", case_path);
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dea_interop: {}\n", e.what());
    return 2;
  }
}
