// dea export-c: writes the tensors of a safetensors file as a C++ header, for programs that compile their weights
// in (no file system at run time): each tensor becomes an aligned constexpr array named after its reference name,
// listed in a table with its name, type and shape, and a model checkpoint also gets its InferenceConfig and a
// loader that binds the arrays to a dea::nn::InferenceModel without copying (Eigen Maps over the arrays).
//
//   dea export-c CHECKPOINT.safetensors OUT.hpp [--namespace NAME] [--type float|double|bf16] [--all]
//                [--max_len N (1..2^20)] [--task cls|mlm] [--n_heads N (1..65536)]
//
// Default: the parameters of a model checkpoint (the AdamW state "optim.*", "train.*" and the tied
// "mlm_head.weight" are left out), as float. The model's sizes come from the tensor shapes; max_len and the task
// from the run's config.json beside the checkpoint (written by dea train), unless given. --all writes every
// tensor of any safetensors file (e.g. a golden case) and its metadata; floating tensors as --type, integers as
// int64_t / int32_t, U8 and BOOL as uint8_t. Values are written as hexadecimal floating literals, so the arrays
// hold exactly the stored values (after the conversion to --type). The header is written atomically; its
// contents have internal linkage, so include it in one translation unit.
// --type bf16 (a model checkpoint, not --all): the weights of the bf16 matrix products (W_v, W_o, ff.0 and ff.3 of
// every layer, cls_head.0 and cls_head.3; W_q and W_k stay float: nn/inference.hpp) as dea::bf16 arrays, each value
// rounded to nearest even (2 bytes a weight), written as their bits; every other tensor as float. Its loader binds them as bf16, so InferenceModel runs
// every product in bf16 (nn/inference.hpp).
// Identifiers: --namespace must be a C++ identifier that is not a keyword, not reserved (starting with '_' and an
// upper-case letter, or holding "__"), not std or dea, and not linux, unix or i386 (GCC's macros in its GNU modes).
// Each tensor's array is named after its reference name, every character other than a letter, digit or '_'
// replaced by '_' ("layers.0.attn.W_rel" -> layers_0_attn_W_rel); then a name that could not compile, or would
// clash with the header's own names, gets changed: "t_" before a leading digit; 't' before a leading '_' and
// upper-case letter or second '_' (__LINE__ -> t__LINE__); "t_" before a macro-style name of upper-case letters,
// digits and '_' (NULL -> t_NULL, INT64_MAX -> t_INT64_MAX); '_' after a keyword (int -> int_), after a name of the
// header's (TensorInfo, tensors, n_tensors, find, metadata, n_metadata, config, bind), after std, dea, linux, unix,
// i386 and after the namespace's name. A name that an earlier tensor already has gets "_2", "_3", ... (so "a.b"
// and "a_b" become a_b and a_b_2): every array has its own identifier. The table `tensors` and find(name) give
// each tensor under its reference name, which these rules leave as it is.
// --safetensors writes OUT as a safetensors file instead of a header: the parameters of any checkpoint (the encoder's
// or the decoder LM's; the AdamW state and "train.*" left out) or, with --all, every tensor and the metadata, the
// floating tensors as --type: float (F32), double (F64) or bf16 (BF16, each value rounded to nearest even: half the
// bytes of F32; the loaders read F32, F16 and BF16 alike). A bf16 checkpoint is for inference and for sharing: the
// values are the rounded ones.
// Exit status: 0 written, 1 bad file or inconsistent model, 2 bad command line.
#include <dea/core/files.hpp>
#include "commands.hpp"

#include <dea/train/config.hpp>
#include <dea/cli/flags.hpp>
#include <dea/train/run_dir.hpp>
#include <dea/io/safetensors.hpp>
#include <dea/nn/inference.hpp>

#include <fmt/core.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

using namespace dea;

// Named, not anonymous: the program's files are compiled as one translation unit (examples/CMakeLists.txt).
namespace export_c_cmd {

[[noreturn]] void usage(const std::string& why) {
  fmt::print(stderr, "{}(dea export-c --help lists the flags)\n", dea::cli::message("dea export-c", why));
  std::exit(2);
}

bool is_identifier(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

/// C++ keywords and alternative tokens (C++20's included, so that a header stays valid in newer modes), and the
/// lower-case macros GCC predefines in its GNU modes.
bool is_keyword(const std::string& s) {
  static const std::set<std::string> words = {
      "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch",
      "char", "char8_t", "char16_t", "char32_t", "class", "compl", "concept", "const", "consteval", "constexpr",
      "constinit", "const_cast", "continue", "co_await", "co_return", "co_yield", "decltype", "default", "delete",
      "do", "double", "dynamic_cast", "else", "enum", "explicit", "export", "extern", "false", "float", "for",
      "friend", "goto", "if", "inline", "int", "long", "mutable", "namespace", "new", "noexcept", "not", "not_eq",
      "nullptr", "operator", "or", "or_eq", "private", "protected", "public", "register", "reinterpret_cast",
      "requires", "return", "short", "signed", "sizeof", "static", "static_assert", "static_cast", "struct",
      "switch", "template", "this", "thread_local", "throw", "true", "try", "typedef", "typeid", "typename",
      "union", "unsigned", "using", "virtual", "void", "volatile", "wchar_t", "while", "xor", "xor_eq",
      "linux", "unix", "i386"};
  return words.count(s) > 0;
}

/// Reserved for the implementation: starting with '_' and an upper-case letter, or holding "__" (__LINE__).
bool is_reserved(const std::string& s) {
  return (s.size() >= 2 && s[0] == '_' && std::isupper(static_cast<unsigned char>(s[1]))) ||
         s.find("__") != std::string::npos;
}

/// Upper-case letters, digits and '_' only, two characters or more: the names of macros (<cstdint>'s INT64_MAX,
/// NULL, Eigen's EIGEN_...), which the preprocessor would replace.
bool is_macro_style(const std::string& s) {
  bool upper = false;
  for (char c : s) {
    if (std::islower(static_cast<unsigned char>(c))) return false;
    upper = upper || std::isupper(static_cast<unsigned char>(c));
  }
  return upper && s.size() >= 2;
}

/// `id` (a C identifier) made safe for an array of the header (the rules in the file comment).
std::string safe_identifier(std::string id, const std::string& ns) {
  static const std::set<std::string> header = {"TensorInfo", "tensors", "n_tensors", "find", "metadata",
                                               "n_metadata", "config",  "bind",      "std",  "dea"};
  if (id.empty() || std::isdigit(static_cast<unsigned char>(id[0]))) id = "t_" + id;
  if (id[0] == '_' && id.size() >= 2 && (id[1] == '_' || std::isupper(static_cast<unsigned char>(id[1]))))
    id = "t" + id;  // "__LINE__" -> "t__LINE__", "_W" -> "t_W"
  if (is_macro_style(id)) id = "t_" + id;  // "NULL" -> "t_NULL": appending '_' would still be upper case
  if (is_keyword(id) || header.count(id) || id == ns) id += '_';  // "int" -> "int_", "tensors" -> "tensors_"
  return id;
}

/// The array's identifier for a tensor name: every character other than a letter, digit or '_' becomes '_', then
/// safe_identifier; distinct from every name in `used` (a repeat gets "_2", "_3", ...).
std::string identifier(const std::string& name, const std::string& ns, std::set<std::string>& used) {
  std::string id;
  for (char c : name) id += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  id = safe_identifier(id, ns);
  std::string out = id;
  for (int k = 2; used.count(out); ++k)
    out = safe_identifier(id + (id.back() == '_' ? "" : "_") + std::to_string(k), ns);
  used.insert(out);
  return out;
}

/// A C++ string literal (printable ASCII as is, everything else as an octal escape).
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 32 && c < 127) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\%03o", c);
      out += buf;
    }
  }
  return out + "\"";
}

/// An exact literal of type `ctype` ("float" or "double") for v (already rounded to that type).
std::string literal(double v, bool as_float) {
  const char* t = as_float ? "float" : "double";
  if (std::isnan(v)) return fmt::format("std::numeric_limits<{}>::quiet_NaN()", t);
  if (std::isinf(v)) return fmt::format("{}std::numeric_limits<{}>::infinity()", v < 0 ? "-" : "", t);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return std::string(buf) + (as_float ? "f" : "");
}

struct ModelInfo {
  nn::InferenceConfig cfg;
  std::string source_note;  // where max_len and task came from
};

/// The model's sizes from the tensor shapes (and max_len / task from the flags or config.json).
ModelInfo infer_model(const io::SafeTensors& st, const std::string& ckpt, Index max_len_flag,
                      const std::string& task_flag, Index n_heads_flag) {
  ModelInfo mi;
  nn::InferenceConfig& c = mi.cfg;
  const Shape& te = st.shape("tok_emb.weight");
  check(te.size() == 2, ckpt, ": tok_emb.weight: expected shape [V, D], got ", shape_str(te));
  c.vocab_size = te[0];
  c.d_model = te[1];
  std::set<Index> layer_ids;
  for (const std::string& n : st.names())
    if (n.rfind("layers.", 0) == 0) {
      // "layers.<i>.<rest>" with i a decimal layer index (at most 6 digits: no model has a million layers)
      const std::size_t dot = n.find('.', 7);
      const std::string idx = dot == std::string::npos ? std::string() : n.substr(7, dot - 7);
      const bool digits = !idx.empty() && idx.size() <= 6 &&
                          idx.find_first_not_of("0123456789") == std::string::npos;
      check(digits, ckpt, ": tensor '", n, "': expected a layer tensor name 'layers.<index>.<name>' with a decimal "
            "index of at most 6 digits, got '", idx, "'");
      layer_ids.insert(static_cast<Index>(std::stol(idx)));
    }
  c.n_layers = static_cast<Index>(layer_ids.size());
  check(layer_ids.empty() || *layer_ids.rbegin() == c.n_layers - 1, ckpt, ": the layer indices are not 0..",
        c.n_layers - 1);
  if (c.n_layers > 0) {
    const Shape& wr = st.shape("layers.0.attn.W_rel");
    check(wr.size() == 3, ckpt, ": layers.0.attn.W_rel: expected shape [H, Dh, Dh], got ", shape_str(wr));
    c.n_heads = wr[0];
    check(n_heads_flag == 0 || n_heads_flag == c.n_heads, "--n_heads ", n_heads_flag, " differs from the checkpoint's ",
          c.n_heads);
    const Shape& ff = st.shape("layers.0.ff.0.weight");
    check(ff.size() == 2, ckpt, ": layers.0.ff.0.weight: expected shape [d_ff, D], got ", shape_str(ff));
    c.d_ff = ff[0];
  } else {
    c.n_heads = n_heads_flag > 0 ? n_heads_flag : 1;
    c.d_ff = 1;
  }
  c.n_classes = 2;
  if (st.has("cls_head.3.weight")) {
    const Shape& ch = st.shape("cls_head.3.weight");
    check(ch.size() == 2, ckpt, ": cls_head.3.weight: expected shape [C, D], got ", shape_str(ch));
    c.n_classes = ch[0];
  }

  const std::string cfg_path = train::config_path(std::filesystem::path(ckpt).parent_path().string());
  const bool have_cfg = std::filesystem::exists(cfg_path);
  train::TrainConfig tc;
  if (have_cfg) tc = train::read_config(cfg_path);
  if (max_len_flag > 0) {
    c.max_len = max_len_flag;
    mi.source_note = "max_len from --max_len";
  } else {
    check(have_cfg, ckpt, ": no config.json beside the checkpoint: give --max_len");
    c.max_len = tc.max_len;
    mi.source_note = "max_len from " + cfg_path;
  }
  const nn::Task cfg_task = tc.data_source == "text" ? nn::Task::mlm : nn::Task::cls;
  if (!task_flag.empty()) {
    c.task = nn::parse_task(task_flag);
    check(!have_cfg || c.task == cfg_task, "--task ", task_flag, " differs from the run's task in ", cfg_path, " (",
          cfg_task == nn::Task::mlm ? "mlm" : "cls", ")");
  } else {
    check(have_cfg, ckpt, ": no config.json beside the checkpoint: give --task (cls or mlm)");
    c.task = cfg_task;
  }
  c.validate();
  return mi;
}

/// --safetensors: the checkpoint's parameters (or every tensor with --all) into a safetensors file, the floating
/// tensors as F32, F64 or BF16 (rounded). Returns the exit status.
int write_safetensors(const std::string& in_path, const std::string& out_path, const std::string& type, bool all) {
  try {
    const io::SafeTensors st = io::SafeTensors::load(in_path);
    io::SafeTensors out;
    if (all) out.set_metadata(st.metadata());
    std::size_t count = 0, bytes = 0, in_bytes = 0;
    for (const std::string& n : st.names()) {
      const bool floating = io::dtype_is_floating(st.dtype(n));
      const bool state = n.rfind("optim.", 0) == 0 || n.rfind("train.", 0) == 0;
      if (!all && (state || !floating)) continue;
      in_bytes += static_cast<std::size_t>(st.nbytes(n));
      if (!floating) {
        out.put(n, st.get<std::int64_t>(n), st.dtype(n));
      } else if (type == "bf16") {
        const Tensor<double> t = st.get<double>(n);
        out.put_bf16_rounded(n, t.shape, t.ptr());
      } else {
        out.put(n, st.get<double>(n), type == "double" ? io::DType::F64 : io::DType::F32);
      }
      bytes += static_cast<std::size_t>(out.nbytes(n));
      ++count;
    }
    check(count > 0, in_path, ": no tensor to export");
    const std::filesystem::path parent = std::filesystem::path(out_path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    out.save(out_path);
    fmt::print("dea export-c: wrote {}: {} tensors, {} bytes of data as {} ({} bytes in the input)\n", out_path, count,
               bytes, type == "bf16" ? "BF16" : type == "double" ? "F64" : "F32", in_bytes);
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}", dea::cli::message("dea export-c", e));
    return 1;
  }
  return 0;
}

}  // namespace export_c_cmd

int dea_export_c(int argc, char** argv) {
  using namespace export_c_cmd;
  std::string in_path, out_path, ns = "dea_weights", type = "float", task;
  bool all = false, as_safetensors = false;
  Index max_len = 0, n_heads = 0;
  cli::FlagSet fs("dea export-c CHECKPOINT.safetensors OUT.hpp [flags]",
                  "Writes the tensors of a safetensors file as a C++ header (constexpr arrays; a model checkpoint\n"
                  "also gets its InferenceConfig and a loader for nn::InferenceModel).");
  fs.exit_status("0 written, 1 a bad file or an inconsistent model, 2 bad command line");
  fs.positional("CHECKPOINT.safetensors OUT.hpp", "the file to export and the header to write", 2);
  fs.text("namespace", ns, "NAME", "the header's namespace (a C++ identifier, not a keyword, not reserved)");
  fs.choice("type", type, {"float", "double", "bf16"},
            "element type of the floating arrays (bf16: the product weights of a model header, or every tensor with "
            "--safetensors; values rounded to nearest even)");
  fs.toggle("safetensors", as_safetensors, "write OUT as a safetensors file (F32, F64 or BF16 by --type), not a header");
  fs.toggle("all", all, "every tensor of any safetensors file, and its metadata (default: a model's parameters)");
  fs.integer("max_len", max_len, 1, 1 << 20, "the model's max_len (default: from config.json beside the checkpoint)");
  fs.custom("task", "cls|mlm", "from config.json", "cls or mlm", "the model's task",
            [&task](const std::string&, const std::string& v) { task = v; });
  fs.integer("n_heads", n_heads, 1, 1 << 16, "the model's head count (default: from the checkpoint when it can tell)");
  try {
    const auto p = fs.parse(std::vector<std::string>(argv + 1, argv + argc));
    if (p.help) {
      fmt::print("{}", fs.help());
      return 0;
    }
    if (p.positional.size() > 0) in_path = p.positional[0];
    if (p.positional.size() > 1) out_path = p.positional[1];
  } catch (const std::exception& e) {
    usage(e.what());
  }
  if (in_path.empty() || out_path.empty()) usage("expected CHECKPOINT.safetensors and OUT.hpp");
  {  // writing the header over its own input would destroy the checkpoint
    std::error_code ec;
    if (std::filesystem::equivalent(in_path, out_path, ec))
      usage("OUT.hpp '" + out_path + "' is the input file itself");
  }
  if (!is_identifier(ns) || is_keyword(ns) || is_reserved(ns) || ns == "std" || ns == "dea")
    usage("--namespace expects a C++ identifier that is not a keyword, not reserved ('_' and an upper-case letter, "
          "or \"__\"), not std or dea, got '" + ns + "'");
  if (type != "float" && type != "double" && type != "bf16")
    usage("--type expects float, double or bf16, got '" + type + "'");
  if (type == "bf16" && all && !as_safetensors)
    usage("--type bf16 writes a model checkpoint's product weights as bf16 in a header (not with --all; --safetensors "
          "writes every tensor as BF16)");
  if (!task.empty() && task != "cls" && task != "mlm") usage("--task expects cls or mlm, got '" + task + "'");
  const bool as_float = type == "float" || type == "bf16";  // bf16: the tensors other than product weights as float
  const bool as_bf16 = type == "bf16";

  if (as_safetensors) return write_safetensors(in_path, out_path, type, all);

  try {
    const io::SafeTensors st = io::SafeTensors::load(in_path);
    const bool is_model = st.has("tok_emb.weight");
    check(all || is_model, in_path, ": no 'tok_emb.weight': not a model checkpoint (use --all to export any file)");
    std::vector<std::string> names;
    for (const std::string& n : st.names()) {
      const bool skip = n.rfind("optim.", 0) == 0 || n.rfind("train.", 0) == 0 || n == "mlm_head.weight" ||
                        n == "pe" || (n.size() > 3 && n.compare(n.size() - 3, 3, ".pe") == 0);
      if (all || (!skip && io::dtype_is_floating(st.dtype(n)))) names.push_back(n);
    }

    ModelInfo mi;
    if (is_model) {
      mi = infer_model(st, in_path, max_len, task, n_heads);
      // the header must bind: check with the library's own binder before writing anything
      nn::InferenceModel<float> probe(mi.cfg);
      std::map<std::string, std::vector<float>> keep;
      for (const std::string& n : names) {
        if (!io::dtype_is_floating(st.dtype(n))) continue;
        const Tensor<float> t = st.get<float>(n);
        std::vector<float>& v = keep[n];
        v.assign(t.ptr(), t.ptr() + t.numel());
        probe.bind(n.c_str(), v.data(), t.numel());
      }
      probe.check_bound();
    }

    std::string out;
    out += fmt::format("// Generated by dea export-c from {} -- do not edit.\n", std::filesystem::path(in_path).filename().string());
    Index total = 0;
    for (const std::string& n : names) total += st.numel(n);
    out += fmt::format("// {} tensors, {} values.\n#pragma once\n\n#include <cstdint>\n#include <limits>\n", names.size(),
                       total);
    if (is_model) out += "\n#include <dea/nn/inference.hpp>\n";
    // everything has internal linkage (an unnamed namespace): include the header in one translation unit
    out += fmt::format("\nnamespace {} {{\nnamespace {{\n\n", ns);
    out += "/// One exported tensor: its reference name, its values and its shape.\n"
           "struct TensorInfo {\n"
           "  const char* name;\n"
           "  const void* data;\n"
           "  char type;  ///< 'f' float, 'd' double, 'h' dea::bf16, 'q' int64_t, 'i' int32_t, 'b' uint8_t\n"
           "  int rank;\n"
           "  long long shape[8];\n"
           "  long long numel;\n"
           "};\n\n";

    std::set<std::string> used;
    std::string table;
    int bf16_arrays = 0;
    for (const std::string& n : names) {
      const Shape& shp = st.shape(n);
      check(shp.size() <= 8, in_path, ": ", n, ": rank ", shp.size(), " is more than the header's 8");
      const std::string id = identifier(n, ns, used);
      const io::DType dt = st.dtype(n);
      const Index numel = st.numel(n);
      const Index len = numel > 0 ? numel : 1;  // a zero-length C array is not allowed
      std::string ctype;
      char code;
      std::vector<std::string> vals;
      vals.reserve(static_cast<std::size_t>(numel));
      if (io::dtype_is_floating(dt) && as_bf16 && nn::InferenceModel<float>::is_product_weight(n.c_str())) {
        ctype = "dea::bf16";  // the bits of each value rounded to bf16 (round to nearest even)
        code = 'h';
        const Tensor<float> t = st.get<float>(n);
        for (Index k = 0; k < numel; ++k) vals.push_back(fmt::format("{{0x{:04x}}}", to_bf16(t[k]).bits));
        ++bf16_arrays;
      } else if (io::dtype_is_floating(dt)) {
        ctype = as_float ? "float" : "double";
        code = as_float ? 'f' : 'd';
        if (as_float) {
          const Tensor<float> t = st.get<float>(n);
          for (Index k = 0; k < numel; ++k) vals.push_back(literal(static_cast<double>(t[k]), true));
        } else {
          const Tensor<double> t = st.get<double>(n);
          for (Index k = 0; k < numel; ++k) vals.push_back(literal(t[k], false));
        }
      } else if (dt == io::DType::I64 || dt == io::DType::I32) {
        ctype = dt == io::DType::I64 ? "std::int64_t" : "std::int32_t";
        code = dt == io::DType::I64 ? 'q' : 'i';
        const Tensor<std::int64_t> t = st.get<std::int64_t>(n);
        for (Index k = 0; k < numel; ++k)
          vals.push_back(t[k] == std::numeric_limits<std::int64_t>::min() ? "(-9223372036854775807LL - 1)"
                                                                          : std::to_string(t[k]) + (dt == io::DType::I64 ? "LL" : ""));
      } else {
        ctype = "std::uint8_t";
        code = 'b';
        const Tensor<std::uint8_t> t = st.get<std::uint8_t>(n);
        for (Index k = 0; k < numel; ++k) vals.push_back(std::to_string(static_cast<int>(t[k])));
      }
      if (numel == 0) vals.push_back(code == 'h' ? "{0}" : "0");
      out += fmt::format("/// {} {}\nalignas(64) constexpr {} {}[{}] = {{", quoted(n), shape_str(shp), ctype, id, len);
      for (std::size_t k = 0; k < vals.size(); ++k) out += (k % 8 == 0 ? "\n    " : " ") + vals[k] + ",";
      out += "\n};\n\n";
      std::string dims;
      for (std::size_t d = 0; d < shp.size(); ++d) dims += (d ? ", " : "") + std::to_string(shp[d]);
      table += fmt::format("    {{{}, {}, '{}', {}, {{{}}}, {}}},\n", quoted(n), id, code, shp.size(), dims, numel);
    }
    out += "/// Every tensor of the header, in the file's order.\n";
    out += "constexpr TensorInfo tensors[] = {\n" + table + "};\n";
    out += fmt::format("constexpr int n_tensors = {};\n\n", names.size());
    out += "/// The tensor called `name`, or nullptr.\n"
           "[[maybe_unused]] const TensorInfo* find(const char* name) {\n"
           "  for (const TensorInfo& t : tensors) {\n"
           "    const char* a = t.name;\n"
           "    const char* b = name;\n"
           "    while (*a && *a == *b) ++a, ++b;\n"
           "    if (*a == *b) return &t;\n"
           "  }\n"
           "  return nullptr;\n"
           "}\n";
    if (all) {
      out += "\n/// The file's metadata (key, value).\nconstexpr const char* metadata[][2] = {\n";
      for (const auto& kv : st.metadata()) out += fmt::format("    {{{}, {}}},\n", quoted(kv.first), quoted(kv.second));
      if (st.metadata().empty()) out += "    {\"\", \"\"},\n";
      out += fmt::format("}};\nconstexpr int n_metadata = {};\n", st.metadata().size());
    }
    if (is_model) {
      const nn::InferenceConfig& c = mi.cfg;
      out += fmt::format(
          "\n/// The model these parameters belong to ({}).\n"
          "constexpr dea::nn::InferenceConfig config{{/*vocab_size*/ {}, /*d_model*/ {}, /*n_heads*/ {}, "
          "/*n_layers*/ {}, /*d_ff*/ {},\n                                                  /*max_len*/ {}, "
          "/*n_classes*/ {}, dea::nn::Task::{}}};\n",
          mi.source_note, c.vocab_size, c.d_model, c.n_heads, c.n_layers, c.d_ff, c.max_len, c.n_classes,
          nn::to_string(c.task));
      if (as_bf16)
        out += "\n/// Binds every tensor to `model` (an InferenceModel<float, ...> of `config`) by name, without copying: the\n"
               "/// product weights as bf16, the others as float; then checks that the model has every tensor its forward\n"
               "/// needs. Give the model its workspace after this (reserve, or workspace_size(..., /*bf16*/ true)).\n"
               "template <class Model>\n"
               "void bind(Model& model) {\n"
               "  for (const TensorInfo& t : tensors) {\n"
               "    if (t.type == 'f') model.bind(t.name, static_cast<const float*>(t.data), static_cast<dea::Index>(t.numel));\n"
               "    if (t.type == 'h') model.bind(t.name, static_cast<const dea::bf16*>(t.data), static_cast<dea::Index>(t.numel));\n"
               "  }\n"
               "  model.check_bound();\n"
               "}\n";
      else
        out += fmt::format(
            "\n/// Binds every {} tensor to `model` (an InferenceModel<{}, ...> of `config`) by name, without copying,\n"
            "/// then checks that the model has every tensor its forward needs.\n"
            "template <class Model>\n"
            "void bind(Model& model) {{\n"
            "  for (const TensorInfo& t : tensors)\n"
            "    if (t.type == '{}') model.bind(t.name, static_cast<const {}*>(t.data), static_cast<dea::Index>(t.numel));\n"
            "  model.check_bound();\n"
            "}}\n",
            type, type, as_float ? 'f' : 'd', type);
    }
    out += fmt::format("\n}}  // namespace\n}}  // namespace {}\n", ns);
    const std::filesystem::path parent = std::filesystem::path(out_path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    dea::write_file_atomic(out_path, out);
    std::string what = fmt::format("{} tensors, {} values", names.size(), total);
    if (as_bf16) what += fmt::format(", {} product weights as bf16", bf16_arrays);
    if (is_model)
      what += fmt::format(" (model V={} D={} H={} L={} d_ff={} max_len={} C={} {})", mi.cfg.vocab_size, mi.cfg.d_model,
                          mi.cfg.n_heads, mi.cfg.n_layers, mi.cfg.d_ff, mi.cfg.max_len, mi.cfg.n_classes,
                          nn::to_string(mi.cfg.task));
    fmt::print("dea export-c: wrote {}: {}\n", out_path, what);
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}", dea::cli::message("dea export-c", e));
    return 1;
  }
  return 0;
}
