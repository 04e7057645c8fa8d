// dea visualize: the reference's visualize.py on this library (docs/training.md). Writes the pictures researchers look
// at, as SVG files, into an output folder (default attention_analysis/):
//
//   heatmap_E0tilde_<slug>.svg, heatmap_E1tilde_<slug>.svg, heatmap_S_tilde_<slug>.svg
//       one panel per head: the real-token L x L block of E0~, E1~ and S~ = (1 - alpha_hat) E0~ + alpha_hat E1~,
//       with the (query, key) cell outlined in red;
//   photo_finish_<slug>.svg
//       for the chosen head and the query row, the lines S*_t(a') and S*_p(a') for a' in [0, 1] (201 points): the
//       target t = the key word and the distractor p whose photo-finish point beta (in [0, 1]) lies closest to the
//       oracle alpha (or, when no key crosses, the strongest rival under S*(alpha), marked "no crossing"); beta as a
//       dot and a dotted line, the oracle alpha, alpha_hat, and the "never" region alpha > 0.95;
//   alpha_histogram.svg        the reference mock density (200k samples) against alpha_hat over all real x real
//                              cells and heads, each pair's head-mean alpha_hat marked;
//   spotlight_w_vs_db.svg      w(d_b) with the real (d_b, w) of the valid pairs; lambda_d L_decision against
//                              alpha_hat for (alpha, beta) = (0.9, 0.6), (0.2, 0.5), (0.62, 0.6);
//   alpha_hat_vs_oracle.svg    oracle alpha against the head-mean alpha_hat per pair, a dot per head;
//   summary.json               per pair: text, pair, oracle alpha, alpha_hat mean and per head, distractor, beta
//                              (and the tokens, query / key positions, layer and head used).
//
// Without --ckpt: the SimpleTokenizer over the mock corpus, a fresh 2-layer model (D = 512, H = 8, cls) in eval mode
// and a gate-only warm-up of 300 steps (Adam, lr 1e-2, on every W_gate / c_gate; gamma = 0, the gate loss alone;
// nothing else changes). With --ckpt (a train output directory, or its checkpoint.safetensors) the trained model,
// warmed up only when --warmup_steps is given.
//
//   dea visualize [--ckpt DIR] [--out_dir attention_analysis] [--layer -1] [--head 0] [--warmup_steps N]
//                 [--pairs FILE] [--seed 42] [--threads 1]
//
// --pairs FILE: one pair per line, "sentence<TAB>query word<TAB>key word<TAB>oracle alpha" ('|' may separate the
// fields instead of tabs); blank lines and lines starting with '#' are skipped. Default: the reference's five
// demo pairs. <slug> is the sentence in lower case, every run of characters other than [a-z0-9] replaced by '_'
// (the reference's file names); a slug longer than 60 bytes is cut to at most 51 and ends in '_' and 8 hex digits
// of a hash of the whole slug (whole sentences made names too long for the file system); a second sentence with
// the same slug gets "_2", a third "_3", ...; summary.json records each pair's slug.
// Values: --warmup_steps 0..10^7, --threads 1..4096, --seed 0..2^63-1, --layer and --head -10^6..10^6 (a negative
// --layer counts from the last layer, --head is taken modulo the head count); "--flag=value" also works.
// Exit status: 0 done, 1 error, 2 bad command line.
#include "commands.hpp"

#include <dea/train/encoder.hpp>
#include <dea/cli/flags.hpp>
#include <dea/plot/figures.hpp>
#include <dea/plot/svg.hpp>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iterator>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

using namespace dea;
namespace fs = std::filesystem;

// Named, not anonymous: the program's files are compiled as one translation unit (examples/CMakeLists.txt).
namespace visualize_cmd {

using Scalar = float;  // the program runs in float
using Model = nn::TransformerModel<Scalar>;
using Batch = nn::ModelBatch<Scalar>;

struct Pair {
  std::string text, q, k;
  double alpha = 0;
};

/// The reference's demo set: (sentence, query word, key word, illustrative oracle alpha).
std::vector<Pair> demo_pairs() {
  return {{"Paris is capital of France", "paris", "france", 0.90},
          {"car→wheel", "car", "wheel", 0.90},
          {"king→queen", "king", "queen", 0.90},
          {"5+3=8", "5+3", "8", 0.90},
          {"dog→dogs", "dog", "dogs", 0.02}};
}

struct Args {
  std::string ckpt, out_dir = "attention_analysis", pairs;
  std::int64_t layer = -1, head = 0;
  std::optional<std::int64_t> warmup_steps;
  std::uint64_t seed = 42;
  int threads = 1;
};

/// The flags (see the file comment); `a` receives the values.
cli::FlagSet flag_set(Args& a) {
  cli::FlagSet fs("dea visualize [flags]",
                  "Writes the reference's attention pictures (SVG) and summary.json into --out_dir, for the\n"
                  "reference's five demo pairs or the pairs of --pairs FILE.");
  fs.exit_status("0 done, 1 error, 2 bad command line");
  fs.text("ckpt", a.ckpt, "DIR", "a dea train run directory (or its checkpoint.safetensors); none: a fresh model",
          cli::Empty::allowed);
  fs.text("out_dir", a.out_dir, "DIR", "where the files go", cli::Empty::refused, "a directory");
  fs.text("pairs", a.pairs, "FILE", "one pair a line: sentence, query word, key word, oracle alpha (tab or '|')",
          cli::Empty::allowed);
  fs.integer("layer", a.layer, -1000000, 1000000, "the layer shown (negative: from the last)");
  fs.integer("head", a.head, -1000000, 1000000, "the head of the photo-finish plot (taken modulo the head count)");
  fs.custom("warmup_steps", "N", "300 without --ckpt, 0 with it", "[0, 10000000]",
            "gate-only warm-up steps (Adam, lr 1e-2) before the pictures",
            [&a](const std::string& flag, const std::string& v) { a.warmup_steps = cli::parse_int(flag, v, 0, 10000000); });
  fs.integer("seed", a.seed, 0, cli::kNoMax, "seed of the fresh model and the mock density samples");
  fs.integer("threads", a.threads, 1, cli::kMaxThreads, "OpenMP threads");
  return fs;
}

/// Reads --pairs FILE (format in the file comment).
std::vector<Pair> read_pairs(const std::string& path) {
  std::vector<Pair> out;
  const std::vector<std::string> lines = dea::read_lines(path);
  for (std::size_t n = 0; n < lines.size(); ++n) {
    const std::string_view line = dea::trim(lines[n]);
    if (line.empty() || line[0] == '#') continue;
    const char sep = line.find('\t') != std::string_view::npos ? '\t' : '|';
    std::vector<std::string> f;
    std::size_t s = 0;
    while (true) {
      const std::size_t e = line.find(sep, s);
      f.emplace_back(dea::trim(line.substr(s, e == std::string_view::npos ? std::string_view::npos : e - s)));
      if (e == std::string_view::npos) break;
      s = e + 1;
    }
    check(f.size() == 4, path, ":", n + 1, ": expected 'sentence<TAB>query word<TAB>key word<TAB>oracle alpha', got ",
          f.size(), " field(s)");
    for (int k = 0; k < 3; ++k) check(!f[static_cast<std::size_t>(k)].empty(), path, ":", n + 1, ": field ", k + 1, " is empty");
    char* end = nullptr;
    const double a = std::strtod(f[3].c_str(), &end);
    check(end && !*end && std::isfinite(a) && a >= 0 && a <= 1, path, ":", n + 1,
          ": oracle alpha must be a number in [0, 1], got '", f[3], "'");
    out.push_back({f[0], f[1], f[2], a});
  }
  check(!out.empty(), path, ": no pairs in the file");
  return out;
}

/// The reference's slug: lower-case, every run of characters other than [a-z0-9] becomes '_', trimmed of '_'.
std::string slug(const std::string& s) {
  std::string out;
  bool sep = false;
  for (unsigned char c : s) {
    const char l = static_cast<char>(std::tolower(c));
    if ((l >= 'a' && l <= 'z') || (l >= '0' && l <= '9')) {
      if (sep && !out.empty()) out += '_';
      out += l;
      sep = false;
    } else {
      sep = true;
    }
  }
  return out;
}

/// The longest slug a file name gets: the names add at most "heatmap_E0tilde_" and ".svg", and a whole sentence
/// as a name went past the file system's 255-byte limit ("File name too long").
constexpr std::size_t kMaxSlug = 60;

/// The slug as a file-name stem: unchanged up to kMaxSlug bytes; a longer one keeps its start (cut at a UTF-8
/// character boundary, without a trailing '_') and ends in '_' and 8 hex digits of a hash (FNV-1a) of the whole
/// slug, so long sentences that share their start still get different names.
std::string file_stem(const std::string& full) {
  if (full.size() <= kMaxSlug) return full;
  std::uint32_t h = 2166136261u;
  for (unsigned char c : full) {
    h ^= c;
    h *= 16777619u;
  }
  const std::string tag = fmt::format("_{:08x}", h);
  std::size_t n = kMaxSlug - tag.size();
  while (n > 0 && (static_cast<unsigned char>(full[n]) & 0xC0) == 0x80) --n;  // not inside a UTF-8 character
  std::string out = full.substr(0, n);
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out + tag;
}

struct Meta {
  Pair pair;
  std::vector<std::string> tokens;
  std::vector<std::int64_t> ids;
  Index L = 0, qi = 0, ki = 0;
  std::string slug;
};

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& t : v) s += (s.empty() ? "" : " ") + t;
  return s;
}

/// Encodes each sentence as one segment (max_len 32); the query span is searched from position 1 and the key span
/// after it; qi = the query span's last token, ki = the key span's first. The oracle is set at (qi, ki) only and
/// target_idx[qi] = ki. Right-padded to the longest sentence.
Batch build_batch(const data::RunTokenizer& tok, const std::vector<Pair>& pairs, Index max_len,
                            std::vector<Meta>& meta) {
  std::set<std::string> used;
  for (std::size_t n = 0; n < pairs.size(); ++n) {
    const Pair& p = pairs[n];
    const data::Encoding e = tok.encode(p.text, 32);
    const std::vector<std::string> qt = tok.tokenize(p.q), kt = tok.tokenize(p.k);
    const Index qs = data::find_span(e.tokens, qt, 1);
    check(qs >= 0, "pair '", p.text, "': query word '", p.q, "' (tokens: ", join(qt), ") not found in the sentence's tokens [",
          join(e.tokens), "]");
    const Index ks = data::find_span(e.tokens, kt, qs + static_cast<Index>(qt.size()));
    check(ks >= 0, "pair '", p.text, "': key word '", p.k, "' (tokens: ", join(kt),
          ") not found after the query word in the sentence's tokens [", join(e.tokens), "]");
    Meta m;
    m.pair = p;
    m.tokens = e.tokens;
    m.ids = e.input_ids;
    m.L = e.size();
    m.qi = qs + static_cast<Index>(qt.size()) - 1;
    m.ki = ks;
    m.slug = file_stem(slug(p.text));
    if (m.slug.empty()) m.slug = "pair" + std::to_string(n + 1);
    // two sentences with one slug keep both sets of files: the second gets "_2", the next "_3", ... (skipping a
    // name another pair already has)
    const std::string base = m.slug;
    for (int k = 2; !used.insert(m.slug).second; ++k) m.slug = base + "_" + std::to_string(k);
    meta.push_back(std::move(m));
  }
  Index T = 0;
  for (const Meta& m : meta) T = std::max(T, m.L);
  check(T <= max_len, "the longest sentence has ", T, " tokens, more than the model's max_len ", max_len);
  const Index N = static_cast<Index>(meta.size());
  Batch b;
  b.input_ids = Tensor<std::int64_t>({N, T}, tok.pad_id());
  b.attention_mask = Tensor<std::uint8_t>({N, T}, 0);
  b.token_type_ids = Tensor<std::int64_t>({N, T}, 0);
  b.alpha_oracle = Tensor<Scalar>({N, T, T}, std::numeric_limits<Scalar>::quiet_NaN());
  b.target_idx = Tensor<std::int64_t>({N, T}, -1);
  for (Index i = 0; i < N; ++i) {
    const Meta& m = meta[static_cast<std::size_t>(i)];
    for (Index t = 0; t < m.L; ++t) {
      b.input_ids[i * T + t] = m.ids[static_cast<std::size_t>(t)];
      b.attention_mask[i * T + t] = 1;
    }
    b.alpha_oracle[(i * T + m.qi) * T + m.ki] = static_cast<Scalar>(m.pair.alpha);
    b.target_idx[i * T + m.qi] = m.ki;
  }
  return b;
}

/// Adam on every W_gate / c_gate, gamma = 0, backward of the gate loss alone, eval mode; prints L_v2.8 at steps
/// 0, 100, 200, ... and the last.
void warmup_gate(Model& model, const Batch& batch, long steps, double lr) {
  ParamList<Scalar> gate;
  for (Param<Scalar>* p : model.parameters())
    if (p->group == "gate") gate.push_back(p);
  check(!gate.empty(), "the model has no gate parameters");
  auto adam = optim::make_adam(gate, lr);
  Model::Cache cache;
  fmt::print("warming up the gate only ({} steps, W_gate/c_gate on L_v2.8)\n", steps);
  for (long s = 0; s < steps; ++s) {
    const auto out = model.forward(batch, Scalar(0), false, nullptr, cache);
    zero_grad(gate);
    model.backward_gate(cache);
    adam.step();
    if (s % 100 == 0 || s == steps - 1)
      fmt::print("  gate warm-up step {:4d}  L_v2.8={:.4f}\n", s, static_cast<double>(out.loss_gate));
  }
}

// ------------------------------------------------------------------------------------------------------------
// Plots
// ------------------------------------------------------------------------------------------------------------

using AttnCache = Model::Layer::AttentionType::Cache;

/// Value of a [B, H, T, T] cache buffer.
double at(const AlignedVec<Scalar>& v, const AttnCache& c, Index H, Index b, Index h, Index i, Index j) {
  return static_cast<double>(v[static_cast<std::size_t>(c.cell(b, h, i, j, H))]);
}

struct PhotoFinish {
  Index distractor = -1;
  std::optional<double> beta;
};

const char* kNeverColour = svg::palette::red;

/// heatmap_<name>_<slug>.svg: one panel per head (up to 4 columns).
void heatmaps(const AttnCache& c, Index H, Index b, const Meta& m, const std::string& out_dir, int& written) {
  enum Which { e0_tilde, e1_tilde, s_tilde };
  struct Kind {
    Which which;
    const char* file;
    const char* label;
    svg::Colormap cmap;
  };
  const Kind kinds[3] = {{e0_tilde, "E0tilde", "Ẽ0", svg::Colormap::blues},
                         {e1_tilde, "E1tilde", "Ẽ1", svg::Colormap::greens},
                         {s_tilde, "S_tilde", "S̃", svg::Colormap::magma}};
  const Index L = m.L;
  const int ncol = static_cast<int>(std::min<Index>(4, H)), nrow = static_cast<int>((H + ncol - 1) / ncol);
  double lw = 0;
  for (const auto& t : m.tokens) lw = std::max(lw, svg::text_width(t, 9));
  const double side = std::clamp(24.0 * static_cast<double>(L), 140.0, 420.0);
  const double pw = 4 + lw + 5 + side + 8 + 11 + 5 + 34 + 6, ph = 22 + side + 5 + lw + 8;
  const double W = ncol * pw + 20, Htot = 40 + nrow * ph + 8;
  for (const Kind& k : kinds) {
    svg::Figure fig(W, Htot,
                    fmt::format("{}  [H,Q,K]  '{}'  (red = {}→{})", k.label, m.pair.text, m.pair.q, m.pair.k));
    const auto boxes = svg::Figure::grid({10, 40, W - 20, nrow * ph}, nrow, ncol);
    for (Index h = 0; h < H; ++h) {
      svg::Heatmap& hm = fig.heatmap(boxes[static_cast<std::size_t>(h)]);
      std::vector<double> v(static_cast<std::size_t>(L * L));
      for (Index i = 0; i < L; ++i)
        for (Index j = 0; j < L; ++j) {
          const double e0 = at(c.e0n, c, H, b, h, i, j), e1 = at(c.e1n, c, H, b, h, i, j);
          const double ah = at(c.alpha_hat, c, H, b, h, i, j);
          // S~ = (1 - alpha_hat) E0~ + alpha_hat E1~ (what the scores are at gamma = 0)
          v[static_cast<std::size_t>(i * L + j)] = k.which == e0_tilde ? e0 : (k.which == e1_tilde ? e1 : (1 - ah) * e0 + ah * e1);
        }
      hm.set_data(static_cast<int>(L), static_cast<int>(L), std::move(v));
      hm.row_labels = hm.col_labels = m.tokens;
      hm.cmap = k.cmap;
      hm.title = fmt::format("head {}", h);
      hm.outline_row = static_cast<int>(m.qi);
      hm.outline_col = static_cast<int>(m.ki);
      hm.id = fmt::format("head{}", h);
      hm.cls = "head";
    }
    fig.save((fs::path(out_dir) / fmt::format("heatmap_{}_{}.svg", k.file, m.slug)).string());
    ++written;
  }
}

/// photo_finish_<slug>.svg for head h; returns the distractor and its beta.
PhotoFinish photo_finish(const AttnCache& c, Index H, Index b, Index h, const Meta& m, const std::string& out_dir,
                         int& written) {
  const Index L = m.L, t = m.ki, qi = m.qi;
  std::vector<double> e0(static_cast<std::size_t>(L)), e1(static_cast<std::size_t>(L));
  for (Index j = 0; j < L; ++j) {
    e0[static_cast<std::size_t>(j)] = at(c.e0n, c, H, b, h, qi, j);
    e1[static_cast<std::size_t>(j)] = at(c.e1n, c, H, b, h, qi, j);
  }
  const double a = m.pair.alpha, ah = at(c.alpha_hat, c, H, b, h, qi, t);
  const auto st = static_cast<std::size_t>(t);
  // the distractor: the key whose crossing beta in [0, 1] lies closest to the oracle alpha (first on ties)
  PhotoFinish pf;
  for (Index p = 0; p < L; ++p) {
    if (p == t) continue;
    const auto sp = static_cast<std::size_t>(p);
    const double den = (e1[st] - e0[st]) - (e1[sp] - e0[sp]);
    if (std::abs(den) < DeaConstants::beta_eps) continue;
    const double beta = (e0[sp] - e0[st]) / (den + DeaConstants::beta_eps * (den > 0 ? 1.0 : -1.0));
    if (beta >= 0 && beta <= 1 && (!pf.beta || std::abs(beta - a) < std::abs(*pf.beta - a))) {
      pf.distractor = p;
      pf.beta = beta;
    }
  }
  if (!pf.beta) {  // no crossing: the strongest rival under S*(alpha), target excluded
    double best = -std::numeric_limits<double>::infinity();
    for (Index p = 0; p < L; ++p) {
      const auto sp = static_cast<std::size_t>(p);
      const double s = (1 - a) * e0[sp] + a * e1[sp];
      if (p != t && (pf.distractor < 0 || s > best)) {
        best = s;
        pf.distractor = p;
      }
    }
  }
  const auto sd = static_cast<std::size_t>(pf.distractor);
  std::vector<double> x(201), yt(201), yp(201);
  for (int k = 0; k <= 200; ++k) {
    const double al = k / 200.0;
    x[static_cast<std::size_t>(k)] = al;
    yt[static_cast<std::size_t>(k)] = (1 - al) * e0[st] + al * e1[st];
    yp[static_cast<std::size_t>(k)] = (1 - al) * e0[sd] + al * e1[sd];
  }
  svg::Figure fig(760, 460);
  svg::Axes& ax = fig.axes({0, 4, 760, 456});
  ax.vspan(0.95, 1.0, kNeverColour, 0.10, "never (α > 0.95)").set_class("never-region");
  ax.line(x, yt, svg::palette::blue, 2.2, {}, fmt::format("S*_t  target '{}'", m.tokens[st])).set_class("target-line");
  ax.line(x, yp, svg::palette::orange, 2.2, "7 4", fmt::format("S*_p  distractor '{}'", m.tokens[sd]))
      .set_class("distractor-line");
  if (pf.beta) {
    const double yb = (1 - *pf.beta) * e0[st] + *pf.beta * e1[st];
    ax.vline(*pf.beta, svg::palette::black, 1, "2 3").set_class("beta-line");
    ax.marker(*pf.beta, yb, svg::palette::black, 5.5).set_class("beta-marker");
    svg::TextStyle ts;
    ts.size = 11;
    ts.cls = "beta-label";
    ts.halo = true;
    ax.text(*pf.beta, yb, fmt::format("β={:.3f}\nphoto-finish", *pf.beta), ts, 9, -22);
  } else {
    svg::TextStyle ts;
    ts.size = 11;
    ts.cls = "no-crossing";
    ts.halo = true;
    ax.text_axes(0.02, 0.95, "no crossing in [0,1]: one horse always wins", ts);
  }
  ax.vline(a, svg::palette::green, 2, {}, fmt::format("oracle α={:.2f}", a)).set_class("oracle-line");
  ax.vline(ah, "#d95f02", 2, "8 3 2 3", fmt::format("α̂={:.3f}", ah)).set_class("alpha-hat-line");
  ax.set_xlim(0, 1);
  ax.xlabel = "α′ (mixing knob)";
  ax.ylabel = "score S*(α′)";
  ax.title = fmt::format("'{}'  query '{}', head {}", m.pair.text, m.tokens[static_cast<std::size_t>(qi)], h);
  ax.legend();
  fig.save((fs::path(out_dir) / fmt::format("photo_finish_{}.svg", m.slug)).string());
  ++written;
  return pf;
}

std::vector<double> pair_means(const AttnCache& c, Index H, const std::vector<Meta>& meta) {
  std::vector<double> out;
  for (std::size_t i = 0; i < meta.size(); ++i) {
    double s = 0;
    for (Index h = 0; h < H; ++h) s += at(c.alpha_hat, c, H, static_cast<Index>(i), h, meta[i].qi, meta[i].ki);
    out.push_back(s / static_cast<double>(H));
  }
  return out;
}

void alpha_histogram(const AttnCache& c, Index H, const Batch& batch, const std::vector<Meta>& meta,
                     std::uint64_t seed, const std::string& out_dir, int& written) {
  const Index B = c.B, T = c.Tq;
  std::vector<double> ah;
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h)
      for (Index i = 0; i < T; ++i)
        for (Index j = 0; j < T; ++j)
          if (batch.attention_mask[b * T + i] && batch.attention_mask[b * T + j]) ah.push_back(at(c.alpha_hat, c, H, b, h, i, j));
  Rng rng(seed);
  const Tensor<double> ref = data::mock_alpha<double>({200000}, rng);
  svg::Figure fig(1240, 450, "α density: the reference's graded oracle against the gate's α̂");
  const auto boxes = svg::Figure::grid({0, 30, 1240, 420}, 1, 2, 10);
  svg::Axes& l = fig.axes(boxes[0]);
  plots::alpha_bands(l);
  const std::vector<double> refv(ref.ptr(), ref.ptr() + ref.numel());
  l.hist(refv, 50, 0.0, 1.0, true, svg::palette::green, "graded oracle density (200k samples)", true, 0.7)
      .set_class("oracle-density");
  l.set_xlim(0, 1);
  l.title = "oracle α density (paper: 45% / 25% / 30%)";
  l.xlabel = "α";
  l.ylabel = "density";
  l.legend(svg::Loc::upper_center);
  svg::Axes& r = fig.axes(boxes[1]);
  plots::alpha_bands(r);
  r.hist(ah, 50, 0.0, 1.0, true, svg::palette::orange, fmt::format("α̂, all token pairs, all heads (n={})", ah.size()),
         true, 0.75)
      .set_class("alpha-hat-hist");
  r.set_xlim(0, 1);
  const double ytop = r.ylim().second;
  const std::vector<double> means = pair_means(c, H, meta);
  // a vertical line per pair, labelled near the top; labels of lines closer than a label's height are stacked
  std::vector<std::size_t> order(meta.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return means[a] < means[b]; });
  double prev_px = -1e9, drop = 0, prev_len = 0;
  for (std::size_t i : order) {
    const std::string label = fmt::format("{}→{}", meta[i].pair.q, meta[i].pair.k);
    svg::TextStyle ts;
    ts.size = 9;
    ts.rotate = -90;
    ts.anchor = "end";
    ts.cls = "pair-label";
    ts.halo = true;
    const double px = r.px(means[i]);
    drop = px - prev_px < 12 ? drop + prev_len + 8 : 0;
    prev_px = px;
    prev_len = svg::text_width(label, ts.size);
    r.vline(means[i], svg::palette::black, 1).set_class("pair-line");
    r.text(means[i], ytop * 0.98, label, ts, 11, drop);
  }
  r.title = "α̂ on the demo sentences (labelled pairs marked)";
  r.xlabel = "α";
  r.legend(svg::Loc::upper_center);
  fig.save((fs::path(out_dir) / "alpha_histogram.svg").string());
  ++written;
}

double softplus(double z) { return z > 0 ? z + std::log1p(std::exp(-z)) : std::log1p(std::exp(z)); }

void spotlight(const AttnCache& c, const std::string& out_dir, int& written) {
  using C = DeaConstants;
  svg::Figure fig(1240, 450, "The gate loss around the photo-finish point β");
  const auto boxes = svg::Figure::grid({0, 30, 1240, 420}, 1, 2, 10);
  svg::Axes& l = fig.axes(boxes[0]);
  std::vector<double> d(300), w(300);
  for (int k = 0; k < 300; ++k) {
    d[static_cast<std::size_t>(k)] = 0.01 + (1.0 - 0.01) * k / 299.0;
    w[static_cast<std::size_t>(k)] = 1 + C::lambda_s * std::exp(-d[static_cast<std::size_t>(k)] / C::tau_s);
  }
  l.hline(1, svg::palette::gray, 0.8, "2 3");
  l.line(d, w, svg::palette::blue, 2, {}, "w = 1 + λ_s·exp(−d_b/τ_s)   (λ_s = 2, τ_s = 0.1)").set_class("w-curve");
  std::vector<double> db, ww;
  for (std::size_t k = 0; k < c.d_b.size(); ++k)
    if (std::isfinite(c.d_b[k])) {
      db.push_back(static_cast<double>(c.d_b[k]));
      ww.push_back(static_cast<double>(c.w[k]));
    }
  l.scatter(db, ww, svg::palette::red, 3, fmt::format("demo (t,p) pairs, n={}", db.size()), 0.6).set_class("pair-points");
  l.xlabel = "d_b = √((α − sg[β])² + 10⁻⁴)";
  l.ylabel = "spotlight w";
  l.title = "spotlight near the cliff";
  l.legend();
  svg::Axes& r = fig.axes(boxes[1]);
  const double ex[3][2] = {{0.9, 0.6}, {0.2, 0.5}, {0.62, 0.6}};
  const char* col[3] = {svg::palette::green, svg::palette::blue, svg::palette::purple};
  std::vector<double> ahat(300);
  for (int k = 0; k < 300; ++k) ahat[static_cast<std::size_t>(k)] = 0.95 * k / 299.0;
  for (int e = 0; e < 3; ++e) {
    const double a = ex[e][0], beta = ex[e][1];
    const double s = std::tanh((a - beta) / C::s_beta_temp);
    std::vector<double> y(300);
    for (int k = 0; k < 300; ++k)
      y[static_cast<std::size_t>(k)] = C::lambda_d * softplus(-s * (ahat[static_cast<std::size_t>(k)] - beta) / C::tau_d);
    r.line(ahat, y, col[e], 2, {}, fmt::format("α={:g}, β={:g}  (s_β={:+.2f})", a, beta, s)).set_class("decision-curve");
    r.vline(beta, col[e], 1, "2 3").set_class("beta-line");
  }
  r.xlabel = "α̂";
  r.ylabel = "λ_d·L_decision (signed s_β, softplus)";
  r.title = "decision loss: α̂ must sit on α's side of β";
  r.legend();
  fig.save((fs::path(out_dir) / "spotlight_w_vs_db.svg").string());
  ++written;
}

void alpha_bars(const AttnCache& c, Index H, const std::vector<Meta>& meta, const std::string& out_dir, int& written) {
  const std::size_t n = meta.size();
  svg::Figure fig(std::max(640.0, 150.0 * static_cast<double>(n) + 120), 440);
  svg::Axes& ax = fig.axes({0, 4, fig.width(), 436});
  std::vector<double> xo, xa, orc, mean, dx, dy;
  std::vector<std::string> labels;
  const std::vector<double> means = pair_means(c, H, meta);
  for (std::size_t i = 0; i < n; ++i) {
    xo.push_back(static_cast<double>(i) - 0.18);
    xa.push_back(static_cast<double>(i) + 0.18);
    orc.push_back(meta[i].pair.alpha);
    mean.push_back(means[i]);
    for (Index h = 0; h < H; ++h) {
      dx.push_back(static_cast<double>(i) + 0.18);
      dy.push_back(at(c.alpha_hat, c, H, static_cast<Index>(i), h, meta[i].qi, meta[i].ki));
    }
    labels.push_back(fmt::format("{}→{}", meta[i].pair.q, meta[i].pair.k));
  }
  ax.bars(xo, orc, 0.36, svg::palette::green, "oracle α").set_class("oracle-bars");
  ax.bars(xa, mean, 0.36, svg::palette::orange, "α̂ (mean over heads)").set_class("alpha-hat-bars");
  ax.scatter(dx, dy, svg::palette::black, 2.5, "α̂ of one head").set_class("head-dots");
  ax.hline(0.95, svg::palette::red, 1, "4 3").set_class("cap-line");
  std::vector<double> pos;
  for (std::size_t i = 0; i < n; ++i) pos.push_back(static_cast<double>(i));
  ax.set_xticks(pos, labels, n > 6 ? -30 : 0);
  ax.set_xlim(-0.6, static_cast<double>(n) - 0.4);
  ax.set_ylim(0, 1);
  ax.ylabel = "α";
  ax.title = "α̂ vs oracle α (dots = individual heads)";
  ax.legend();
  fig.save((fs::path(out_dir) / "alpha_hat_vs_oracle.svg").string());
  ++written;
}

double round4(double v) { return std::round(v * 1e4) / 1e4; }

}  // namespace visualize_cmd

int dea_visualize(int argc, char** argv) {
  using namespace visualize_cmd;
  Args args;
  std::vector<Pair> pairs;
  try {
    const cli::FlagSet fs = flag_set(args);
    const auto p = fs.parse(std::vector<std::string>(argv + 1, argv + argc));
    if (p.help) {
      fmt::print("{}", fs.help());
      return 0;
    }
    pairs = args.pairs.empty() ? demo_pairs() : read_pairs(args.pairs);
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}(dea visualize --help lists the flags)\n", dea::cli::message("dea visualize", e));
    return 2;
  }
  try {
    const auto t0 = std::chrono::steady_clock::now();
    // one thread by default: the batch is a few dozen tokens, and a second thread only waits at each barrier
    set_num_threads(args.threads);
    std::optional<data::RunTokenizer> tok;
    std::optional<Model> model;
    long warm = 0;
    if (!args.ckpt.empty()) {
      std::string dir = args.ckpt;
      if (fs::is_regular_file(dir)) dir = fs::path(dir).parent_path().string();
      if (dir.empty()) dir = ".";
      const train::TrainConfig cfg = train::read_config(train::config_path(dir));
      check(cfg.model == "encoder", train::config_path(dir), ": a --model ", cfg.model,
            " run; dea visualize draws the encoder's runs only (dea eval evaluates this one)");
      tok = train::encoder::load_run_tokenizer(dir, cfg);
      Rng rng(cfg.seed);
      model.emplace(train::encoder::model_config(cfg, tok->vocab_size(),
                                                 cfg.data_source == "text" ? nn::Task::mlm : nn::Task::cls,
                                                 tok->pad_id()),
                    rng);
      const std::int64_t step = train::load_checkpoint(dir, *model, nullptr);
      fmt::print("model: {} (step {}), D={} H={} layers={}\n", train::checkpoint_path(dir), step, cfg.d_model,
                 cfg.n_heads, cfg.n_layers);
      warm = args.warmup_steps.value_or(0);
    } else {
      tok = data::SimpleTokenizer::from_texts({});
      nn::ModelConfig mc;
      mc.vocab_size = tok->vocab_size();
      mc.d_model = 512;
      mc.n_heads = 8;
      mc.n_layers = 2;
      mc.task = nn::Task::cls;
      Rng rng(args.seed);
      model.emplace(mc, rng);
      fmt::print("model: fresh, D=512 H=8 layers=2 (cls), vocabulary {} (mock corpus)\n", tok->vocab_size());
      warm = args.warmup_steps.value_or(300);
    }
    const Index n_layers = model->n_layers();
    check(n_layers > 0, "the model has no layers");
    const Index layer = args.layer < 0 ? n_layers + args.layer : args.layer;
    check(layer >= 0 && layer < n_layers, "--layer ", args.layer, ": the model has ", n_layers, " layers");
    const Index H = model->config().n_heads;
    const Index head = ((args.head % H) + H) % H;  // Python's modulo, as the reference

    std::vector<Meta> meta;
    const Batch batch = build_batch(*tok, pairs, model->config().max_len, meta);
    if (warm > 0) warmup_gate(*model, batch, warm, 1e-2);

    Model::Cache cache;
    model->forward(batch, Scalar(0), false, nullptr, cache);
    const AttnCache& c = cache.layers[static_cast<std::size_t>(layer)].attn;
    if (!c.has_oracle)  // a layer outside --supervise_layers of the checkpoint's run: no gate loss, no (d_b, w)
      fmt::print("note: layer {} is not supervised; the spotlight plot has no (d_b, w) points\n", layer);

    fs::create_directories(args.out_dir);
    int written = 0;
    nlohmann::ordered_json summary = nlohmann::ordered_json::array();
    fmt::print("layer {}, photo-finish head {}\n", layer, head);
    for (std::size_t i = 0; i < meta.size(); ++i) {
      const Meta& m = meta[i];
      const Index b = static_cast<Index>(i);
      heatmaps(c, H, b, m, args.out_dir, written);
      const PhotoFinish pf = photo_finish(c, H, b, head, m, args.out_dir, written);
      std::vector<double> per_head;
      double mean = 0;
      for (Index h = 0; h < H; ++h) {
        per_head.push_back(round4(at(c.alpha_hat, c, H, b, h, m.qi, m.ki)));
        mean += at(c.alpha_hat, c, H, b, h, m.qi, m.ki) / static_cast<double>(H);
      }
      nlohmann::ordered_json j;
      j["text"] = m.pair.text;
      j["pair"] = m.pair.q + "→" + m.pair.k;
      j["oracle_alpha"] = m.pair.alpha;
      j["alpha_hat_mean"] = round4(mean);
      j["alpha_hat_per_head"] = per_head;
      j["distractor"] = m.tokens[static_cast<std::size_t>(pf.distractor)];
      j["beta"] = pf.beta ? nlohmann::ordered_json(*pf.beta) : nlohmann::ordered_json(nullptr);
      j["tokens"] = m.tokens;
      j["query_index"] = m.qi;
      j["key_index"] = m.ki;
      j["distractor_index"] = pf.distractor;
      j["head"] = head;
      j["layer"] = layer;
      j["slug"] = m.slug;
      summary.push_back(j);
      fmt::print("{:<28} {}→{:<7} oracle α={:.2f}  α̂={:.3f}  β(head {}, vs '{}')={}\n", m.pair.text, m.pair.q, m.pair.k,
                 m.pair.alpha, mean, head, m.tokens[static_cast<std::size_t>(pf.distractor)],
                 pf.beta ? fmt::format("{:.4f}", *pf.beta) : std::string("None"));
    }
    alpha_histogram(c, H, batch, meta, args.seed, args.out_dir, written);
    spotlight(c, args.out_dir, written);
    alpha_bars(c, H, meta, args.out_dir, written);
    dea::write_file_atomic((fs::path(args.out_dir) / "summary.json").string(), summary.dump(2) + "\n");
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("wrote {} SVGs and summary.json to {}/ in {:.2f} s\n", written, args.out_dir, secs);
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}", dea::cli::message("dea visualize", e));
    return 1;
  }
  return 0;
}
