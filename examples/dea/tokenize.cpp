// dea tokenize: BERT's WordPiece tokenizer (include/dea/text/wordpiece.hpp) or the SentencePiece tokenizer of a
// DeBERTa-v2/v3 model (include/dea/text/spm_tokenizer.hpp) over lines of JSON, so that its output can be diffed
// against another implementation (Hugging Face's tokenizers gives the same ids).
//
//   dea tokenize --vocab vocab.txt [--tokens] [--normalized] [--pair [--max_length N] [--truncation RULE]]
//                [--no_lowercase] [--strip_accents auto|on|off] [--no_clean_text] [--no_chinese_chars] [--out FILE]
//   dea tokenize --spm MODEL_OR_DIR [--spm_mode fast|slow] [--tokens] [--normalized] [--pair [--max_length N]]
//                [--out FILE]
//
// --spm takes a DeBERTa model directory (spm.model and its tokenizer files) or a bare spm.model; --spm_mode fast
// (the default) is what transformers' AutoTokenizer computes, slow the sentencepiece library's own encoding
// (DebertaV2Tokenizer). --normalized is the fast pipeline's normalised text. A program built without the sentencepiece
// library refuses --spm with a message saying how to get it.
// Input (standard input): one JSON value per line, a string ("Hello, world!"), or with --pair a two-element array
// of strings (["premise", "hypothesis"]). Output: one line per input line, in order:
//   default       the ids without special tokens: [7592,1010,2088,999]
//   --tokens      the pieces instead: ["hello",",","world","!"]
//   --normalized  the normaliser's output for the whole line, as a JSON string: "hello, world!"
//   --pair        {"ids":[101,...,102,...,102],"token_type_ids":[0,...,0,1,...,1]} for [CLS] A [SEP] B [SEP]
//                 ("tokens" instead of "ids" with --tokens); --max_length truncates by Hugging Face's longest_first,
//                 or with --truncation reference by the DEA reference's own rule (then "span_a" and "span_b" too).
// A line that is not such JSON, or a text that is not valid UTF-8, stops the program with a message naming the line
// (exit 2). What is written then: on standard output, every line before the bad one, each complete, and nothing
// after; with --out FILE, nothing (the file is written atomically once every line has been read).
// Exit status: 0 done, 1 the output could not be written, 2 a bad command line, vocabulary or input line.
#include "commands.hpp"

#include <dea/core/files.hpp>
#include <dea/io/json_limits.hpp>
#include <dea/text/spm_tokenizer.hpp>
#include <dea/text/wordpiece.hpp>
#include <dea/cli/flags.hpp>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <vector>

using namespace dea;

namespace {

[[noreturn]] void usage(const std::string& why) {
  fmt::print(stderr, "{}(dea tokenize --help lists the flags)\n", dea::cli::message("dea tokenize", why));
  std::exit(2);
}

/// The longest input line accepted (a text of 16 MiB is far beyond any model's context).
constexpr std::size_t kMaxLineBytes = std::size_t(1) << 24;

/// Reads the next line of `in` (without its '\n' and a '\r' before it); false at the end of the input.
bool next_line(std::FILE* in, std::string& line, std::size_t number) {
  line.clear();
  int c = 0;
  bool any = false;
  while ((c = std::fgetc(in)) != EOF) {
    any = true;
    if (c == '\n') break;
    line += static_cast<char>(c);
    check(line.size() <= kMaxLineBytes, "stdin:", number, ": longer than ", kMaxLineBytes, " bytes");
  }
  check(!std::ferror(in), "stdin:", number, ": read error");
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return any;
}

std::string ids_json(const std::vector<std::int64_t>& ids) {
  std::string s = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

std::string dump(const nlohmann::ordered_json& j) { return j.dump(-1, ' ', false); }

}  // namespace

int dea_tokenize(int argc, char** argv) {
  std::string vocab_path, spm_path, spm_mode = "fast", out_path, truncation = "longest_first", strip = "auto";
  bool tokens = false, normalized = false, pair = false, no_lowercase = false, no_clean = false, no_chinese = false;
  std::size_t max_length = 0;
  cli::FlagSet fs("dea tokenize --vocab vocab.txt [flags] < LINES\n"
                  "       dea tokenize --spm MODEL_OR_DIR [--spm_mode fast|slow] [flags] < LINES",
                  "BERT's WordPiece tokenizer (bert-base-uncased's pipeline, as Hugging Face's tokenizers computes it)\n"
                  "or, with --spm, the SentencePiece tokenizer of a DeBERTa-v2/v3 model (fast: as AutoTokenizer;\n"
                  "slow: the sentencepiece library's own encoding, with byte fallback)\n"
                  "over standard input: one JSON string per line (with --pair a two-element array [A, B]); writes one\n"
                  "JSON line per input line: the ids, the pieces (--tokens), the normalised text (--normalized) or,\n"
                  "with --pair, {\"ids\": [...], \"token_type_ids\": [...]} for [CLS] A [SEP] B [SEP].\n"
                  "A bad input line stops the program with exit status 2, naming the line: the lines before it are\n"
                  "on standard output, each complete; with --out nothing is written.");
  fs.exit_status("0 done, 1 the output could not be written, 2 bad command line, vocabulary or input line");
  fs.custom("vocab", "FILE", "", "", "WordPiece: the vocabulary, one token per line, line n = id n - 1",
            [&vocab_path](const std::string& flag, const std::string& v) {
              if (v.empty()) cli::bad_value(flag, v, "a file path");
              vocab_path = v;
            });
  fs.custom("spm", "MODEL_OR_DIR", "", "",
            "SentencePiece: a DeBERTa-v2/v3 model directory (spm.model, tokenizer_config.json, ...) or a spm.model",
            [&spm_path](const std::string& flag, const std::string& v) {
              if (v.empty()) cli::bad_value(flag, v, "a directory or file path");
              spm_path = v;
            });
  fs.choice("spm_mode", spm_mode, {"fast", "slow"},
            "with --spm: fast = as AutoTokenizer (Hugging Face's tokenizers), slow = the sentencepiece library");
  fs.toggle("tokens", tokens, "write the pieces (JSON strings) instead of the ids");
  fs.toggle("normalized", normalized, "write the normaliser's output (one JSON string) instead of the ids");
  fs.toggle("pair", pair, "input lines are [A, B]; write [CLS] A [SEP] B [SEP] with token_type_ids");
  fs.custom("max_length", "N", "none", "[3, 1048576]",
            "with --pair: truncate to at most N tokens, the special tokens included",
            [&max_length](const std::string& flag, const std::string& v) {
              max_length = static_cast<std::size_t>(cli::parse_int(flag, v, 3, std::int64_t(1) << 20));
            });
  fs.choice("truncation", truncation, {"longest_first", "reference"},
            "with --max_length: Hugging Face's longest_first, or the DEA reference's rule (adds span_a, span_b)");
  fs.toggle("no_lowercase", no_lowercase, "do not lower-case (a cased model; accents are then kept unless --strip_accents on)");
  fs.choice("strip_accents", strip, {"auto", "on", "off"}, "NFD and drop non-spacing marks (auto: when lower-casing)");
  fs.toggle("no_clean_text", no_clean, "keep control characters and other whitespace as they are");
  fs.toggle("no_chinese_chars", no_chinese, "do not put spaces around CJK ideographs");
  fs.text("out", out_path, "FILE", "write the lines to FILE (atomically, once all input was read) instead of stdout");
  try {
    const auto p = fs.parse(std::vector<std::string>(argv + 1, argv + argc));
    if (p.help) {
      fmt::print("{}", fs.help());
      return 0;
    }
    if (vocab_path.empty() && spm_path.empty()) usage("--vocab FILE is required (or --spm MODEL_OR_DIR)");
    if (!vocab_path.empty() && !spm_path.empty()) usage("--vocab and --spm cannot be combined (one tokenizer)");
    if (p.flags.count("spm_mode") && spm_path.empty()) usage("--spm_mode applies to --spm only");
    if (!spm_path.empty()) {
      for (const char* f : {"truncation", "no_lowercase", "strip_accents", "no_clean_text", "no_chinese_chars"})
        if (p.flags.count(f))
          usage(fmt::format("--{} applies to --vocab (WordPiece) only; a SentencePiece model brings its own settings", f));
      if (normalized && spm_mode == "slow") usage("--normalized applies to --spm_mode fast only");
    }
    if (p.flags.count("max_length") && !pair) usage("--max_length applies to --pair only");
    if (p.flags.count("truncation") && !p.flags.count("max_length")) usage("--truncation needs --max_length");
    if (normalized && (pair || tokens)) usage("--normalized cannot be combined with --pair or --tokens");
  } catch (const std::exception& e) {
    usage(e.what());
  }

  text::WordPieceOptions opt;
  opt.normalizer.lowercase = !no_lowercase;
  if (strip != "auto") opt.normalizer.strip_accents = strip == "on";
  opt.normalizer.clean_text = !no_clean;
  opt.normalizer.handle_chinese_chars = !no_chinese;
  std::vector<std::string> out_lines;
  try {
    std::optional<text::WordPieceTokenizer> wp;
    std::optional<text::SpmTokenizer> spm;
    if (spm_path.empty()) {
      wp.emplace(text::WordPieceTokenizer::from_file(vocab_path, opt));
      if (pair) {  // asked now, so that a vocabulary without them fails before any input is read
        (void)wp->cls_id();
        (void)wp->sep_id();
      }
    } else {
      spm.emplace(spm_path, text::parse_spm_mode(spm_mode));
    }
    std::string line;
    for (std::size_t number = 1; next_line(stdin, line, number); ++number) {
      const std::string where = fmt::format("stdin:{}", number);
      check(io::detail::json_nesting_depth(line) <= io::kMaxJsonDepth, where, ": JSON nested deeper than ",
            io::kMaxJsonDepth, " levels");
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        detail::raise(where + ": invalid JSON (" + e.what() + ")");
      }
      std::string result;
      if (!pair) {
        check(j.is_string(), where, ": expected a JSON string (the text), got ", j.type_name(),
              j.is_array() ? " (a pair? add --pair)" : "");
      } else {
        check(j.is_array() && j.size() == 2 && j[0].is_string() && j[1].is_string(), where,
              ": expected a two-element array of strings [A, B], got ",
              j.is_array() ? fmt::format("an array of {} elements", j.size()) : std::string(j.type_name()));
      }
      try {  // (the JSON parser has checked the UTF-8 already; any other refusal names the line too)
        if (!pair) {
          const std::string t = j.get<std::string>();
          if (spm) {
            if (normalized) result = dump(spm->normalize_fast(t));
            else if (tokens) result = dump(spm->tokenize(t));
            else result = ids_json(spm->ids(t));
          } else {
            if (normalized) result = dump(wp->normalize(t));
            else if (tokens) result = dump(wp->tokenize(t));
            else result = ids_json(wp->encode(t));
          }
        } else {
          const std::string a = j[0].get<std::string>(), b = j[1].get<std::string>();
          const text::Encoding e = spm                         ? spm->encode_pair(a, b, max_length)
                                   : max_length == 0           ? wp->encode_pair(a, b)
                                   : truncation == "reference" ? wp->reference_encode_pair(a, b, max_length)
                                                               : wp->encode_pair(a, b, max_length);
          nlohmann::ordered_json o;
          if (tokens) o["tokens"] = e.tokens;
          else o["ids"] = e.input_ids;
          o["token_type_ids"] = e.token_type_ids;
          if (truncation == "reference" && max_length > 0) {
            o["span_a"] = {e.span_a.first, e.span_a.second};
            o["span_b"] = {e.span_b.first, e.span_b.second};
          }
          result = dump(o);
        }
      } catch (const Error& e) {
        detail::raise(where + ": " + without_error_prefix(e.what()));
      }
      result += '\n';
      if (out_path.empty()) {
        if (std::fwrite(result.data(), 1, result.size(), stdout) != result.size()) {
          fmt::print(stderr, "dea tokenize: cannot write to standard output\n");
          return 1;
        }
      } else {
        out_lines.push_back(std::move(result));
      }
    }
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "{}", dea::cli::message("dea tokenize", e));
    return 2;
  }
  if (!out_path.empty()) {
    try {
      std::string all;
      for (const std::string& l : out_lines) all += l;
      write_file_atomic(out_path, all);
    } catch (const std::exception& e) {
      fmt::print(stderr, "{}", dea::cli::message("dea tokenize", e));
      return 1;
    }
  }
  if (std::fflush(stdout) != 0) {
    fmt::print(stderr, "dea tokenize: cannot write to standard output\n");
    return 1;
  }
  return 0;
}
