#!/usr/bin/env python3
"""Writes include/dea/text/spm_grapheme_tables.hpp from the Unicode Character Database (UCD).

The fast (Hugging Face) path of the SentencePiece tokenizer normalises text one extended grapheme cluster at a time
(Unicode Standard Annex #29), so it needs the Grapheme_Cluster_Break property (auxiliary/GraphemeBreakProperty.txt)
and Extended_Pictographic (emoji/emoji-data.txt). This script reads both from the files Debian's `unicode-data`
package installs in /usr/share/unicode and writes them as sorted range tables; text/spm_grapheme.hpp applies the
segmentation rules over them.

Usage:
  python3 cmake/gen_spm_grapheme_tables.py [--ucd DIR] [--out FILE]      write the header (default: the library's)
  python3 cmake/gen_spm_grapheme_tables.py --check [--ucd DIR] [--out FILE]
      regenerate in memory and compare with FILE: exit 0 when equal, 1 when different, 77 (skipped) when the UCD
      files are missing or are another Unicode version than the one FILE was generated from.
Python 3 standard library only.
"""

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "include", "dea", "text", "spm_grapheme_tables.hpp")
SKIP = 77

# The values of Grapheme_Cluster_Break, in the order of the C++ enum (Other = 0 is every code point not listed).
PROPERTIES = ["Other", "CR", "LF", "Control", "Extend", "ZWJ", "Regional_Indicator", "Prepend", "SpacingMark",
              "L", "V", "T", "LV", "LVT"]
LINE = re.compile(r"^([0-9A-F]{4,6})(?:\.\.([0-9A-F]{4,6}))?\s*;\s*([A-Za-z_]+)")


def read_ranges(path, wanted):
    """(first, last, value) for every line of `path` whose property value is in `wanted`, and the file's version."""
    version = None
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if version is None:
                m = re.search(r"-(\d+\.\d+\.\d+)\.txt", line) or re.search(r"Version\s*:?\s*(\d+\.\d+(?:\.\d+)?)", line)
                if m:
                    version = m.group(1)
            m = LINE.match(line)
            if not m or m.group(3) not in wanted:
                continue
            first = int(m.group(1), 16)
            last = int(m.group(2), 16) if m.group(2) else first
            out.append((first, last, m.group(3)))
    return sorted(out), version


def merge(ranges):
    """Joins adjacent ranges of the same value."""
    out = []
    for first, last, value in ranges:
        if out and out[-1][2] == value and out[-1][1] + 1 == first:
            out[-1] = (out[-1][0], last, value)
        else:
            out.append((first, last, value))
    return out


def render(gcb, pict, version):
    lines = [
        "// dea/text/spm_grapheme_tables.hpp: the Unicode properties of extended grapheme clusters. GENERATED: do not",
        "// edit.",
        "//",
        f"// Written by cmake/gen_spm_grapheme_tables.py from the Unicode Character Database {version} (Debian's",
        "// unicode-data package: auxiliary/GraphemeBreakProperty.txt, emoji/emoji-data.txt). text/spm_grapheme.hpp",
        "// reads the tables. Every table is sorted by code point; code points in no range are Other.",
        "#pragma once",
        "",
        "#include <cstdint>",
        "",
        "namespace dea::text::spm::tables {",
        "",
        "/// The UCD version the tables were generated from.",
        f'inline constexpr char kGraphemeUcdVersion[] = "{version}";',
        "",
        "/// Grapheme_Cluster_Break values.",
        "enum class Gcb : std::uint8_t {",
        "  " + ", ".join(p.replace("_", "") for p in PROPERTIES),
        "};",
        "",
        "/// Code points first..last with Grapheme_Cluster_Break `value`.",
        "struct GcbRange {",
        "  std::uint32_t first, last;",
        "  Gcb value;",
        "};",
        "/// An inclusive range of code points.",
        "struct PictRange {",
        "  std::uint32_t first, last;",
        "};",
        "",
        f"inline constexpr GcbRange kGraphemeBreak[{len(gcb)}] = {{",
    ]
    items = [f"{{0x{a:X}, 0x{b:X}, Gcb::{v.replace('_', '')}}}" for a, b, v in gcb]
    lines += wrap(items)
    lines += ["};", "", f"/// Extended_Pictographic.", f"inline constexpr PictRange kExtendedPictographic[{len(pict)}] = {{"]
    lines += wrap([f"{{0x{a:X}, 0x{b:X}}}" for a, b, _ in pict])
    lines += ["};", "", "}  // namespace dea::text::spm::tables", ""]
    return "\n".join(lines)


def wrap(items, width=118):
    out, cur = [], "   "
    for it in items:
        if len(cur) + len(it) + 2 > width:
            out.append(cur)
            cur = "   "
        cur += " " + it + ","
    if cur.strip():
        out.append(cur)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ucd", default="/usr/share/unicode")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    gbp = os.path.join(args.ucd, "auxiliary", "GraphemeBreakProperty.txt")
    emoji = os.path.join(args.ucd, "emoji", "emoji-data.txt")
    if not (os.path.exists(gbp) and os.path.exists(emoji)):
        if args.check:
            print(f"gen_spm_grapheme_tables: {gbp} or {emoji} missing: check skipped")
            sys.exit(SKIP)
        sys.exit(f"gen_spm_grapheme_tables: {gbp} or {emoji} missing (Debian: apt-get install unicode-data)")
    gcb, version = read_ranges(gbp, set(PROPERTIES[1:]))
    pict, _ = read_ranges(emoji, {"Extended_Pictographic"})
    text = render(merge(gcb), merge(pict), version)
    if args.check:
        try:
            with open(args.out, encoding="utf-8") as f:
                old = f.read()
        except OSError:
            sys.exit(f"gen_spm_grapheme_tables: cannot read {args.out}")
        m = re.search(r'kGraphemeUcdVersion\[\] = "([^"]+)"', old)
        if m and m.group(1) != version:
            print(f"gen_spm_grapheme_tables: {args.out} is from UCD {m.group(1)}, the files here are {version}: skipped")
            sys.exit(SKIP)
        if old != text:
            print(f"gen_spm_grapheme_tables: {args.out} differs from what the UCD gives: run the script to rewrite it")
            sys.exit(1)
        print(f"gen_spm_grapheme_tables: {args.out} is up to date (UCD {version})")
        return
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    main()
