// dea/text/spm_grapheme.hpp: extended grapheme clusters (Unicode Standard Annex #29), which the fast SentencePiece
// pipeline (text/spm_fast.hpp) normalises as units.
//
// grapheme_breaks(s) gives the code-point offsets at which the clusters of `s` start, plus s.size(). The rules are
// the annex's for Unicode 15.0 (the UCD the tables of text/spm_grapheme_tables.hpp come from): GB3-GB13 with
// Extended_Pictographic emoji sequences (GB11) and regional-indicator pairs (GB12/13). Unicode 15.1's conjunct rule
// GB9c (Indic consonant + virama + consonant) is not applied: such clusters are longer than the 5 bytes below which
// the normaliser treats a cluster as a whole, so it would change nothing there.
// Standard library only.
#pragma once

#include "spm_grapheme_tables.hpp"

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <string_view>
#include <vector>

namespace dea::text::spm {

/// The Grapheme_Cluster_Break property of c.
inline tables::Gcb grapheme_break_property(char32_t c) {
  const auto& t = tables::kGraphemeBreak;
  const auto* it = std::upper_bound(std::begin(t), std::end(t), static_cast<std::uint32_t>(c),
                                    [](std::uint32_t v, const tables::GcbRange& r) { return v < r.first; });
  if (it == std::begin(t)) return tables::Gcb::Other;
  --it;
  return static_cast<std::uint32_t>(c) <= it->last ? it->value : tables::Gcb::Other;
}

/// The Extended_Pictographic property of c.
inline bool is_extended_pictographic(char32_t c) {
  const auto& t = tables::kExtendedPictographic;
  const auto* it = std::upper_bound(std::begin(t), std::end(t), static_cast<std::uint32_t>(c),
                                    [](std::uint32_t v, const tables::PictRange& r) { return v < r.first; });
  return it != std::begin(t) && static_cast<std::uint32_t>(c) <= std::prev(it)->last;
}

/// The offsets (in code points) at which the extended grapheme clusters of `s` start, followed by s.size(); for an
/// empty `s`, just {0}.
inline std::vector<std::size_t> grapheme_breaks(std::u32string_view s) {
  using tables::Gcb;
  std::vector<std::size_t> breaks{0};
  if (s.empty()) return breaks;
  Gcb prev = grapheme_break_property(s[0]);
  // GB11 state: the cluster so far is ExtPict Extend* (pict_then_extend) or ExtPict Extend* ZWJ (pict_zwj)
  bool pict_then_extend = is_extended_pictographic(s[0]), pict_zwj = false;
  std::size_t ri_run = prev == Gcb::RegionalIndicator ? 1 : 0;  // regional indicators just before this position
  for (std::size_t i = 1; i < s.size(); ++i) {
    const Gcb cur = grapheme_break_property(s[i]);
    const bool pict = is_extended_pictographic(s[i]);
    bool join;
    if (prev == Gcb::CR && cur == Gcb::LF) join = true;  // GB3
    else if (prev == Gcb::Control || prev == Gcb::CR || prev == Gcb::LF) join = false;  // GB4
    else if (cur == Gcb::Control || cur == Gcb::CR || cur == Gcb::LF) join = false;  // GB5
    else if (prev == Gcb::L && (cur == Gcb::L || cur == Gcb::V || cur == Gcb::LV || cur == Gcb::LVT))
      join = true;  // GB6
    else if ((prev == Gcb::LV || prev == Gcb::V) && (cur == Gcb::V || cur == Gcb::T)) join = true;  // GB7
    else if ((prev == Gcb::LVT || prev == Gcb::T) && cur == Gcb::T) join = true;  // GB8
    else if (cur == Gcb::Extend || cur == Gcb::ZWJ || cur == Gcb::SpacingMark) join = true;  // GB9, GB9a
    else if (prev == Gcb::Prepend) join = true;  // GB9b
    else if (pict_zwj && pict) join = true;  // GB11
    else if (prev == Gcb::RegionalIndicator && cur == Gcb::RegionalIndicator) join = ri_run % 2 == 1;  // GB12/13
    else join = false;  // GB999
    if (!join) breaks.push_back(i);
    // the GB11 state after s[i]
    if (!join) {
      pict_then_extend = pict;
      pict_zwj = false;
    } else if (pict_then_extend && cur == Gcb::ZWJ) {
      pict_then_extend = false;
      pict_zwj = true;
    } else if (pict_then_extend && cur == Gcb::Extend) {
      // stays
    } else {
      pict_then_extend = pict;  // (GB11 joined: the cluster now ends in an Extended_Pictographic)
      pict_zwj = false;
    }
    ri_run = cur == Gcb::RegionalIndicator ? ri_run + 1 : 0;
    prev = cur;
  }
  breaks.push_back(s.size());
  return breaks;
}

}  // namespace dea::text::spm
