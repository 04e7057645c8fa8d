#!/usr/bin/env python3
"""Writes include/dea/text/unicode_tables.hpp from the Unicode Character Database (UCD).

The WordPiece tokenizer (include/dea/text/) needs a few Unicode properties: the general categories Cc, Cf, Co
(text cleaning), P* (punctuation splitting) and Mn (accent stripping), the White_Space property, the canonical
decompositions and combining classes (NFD) and the full lower-case mapping. This script reads them from the UCD
files that Debian's `unicode-data` package installs in /usr/share/unicode (UnicodeData.txt, PropList.txt,
SpecialCasing.txt, DerivedAge.txt) and writes them as compact range tables, so the library needs no Unicode
library at run time.

The tables describe the characters as Hugging Face's tokenizers library (0.23.2, Rust) sees them, because the
tokenizer must give exactly its pieces:
  - its general-category tables (crate unicode_categories 0.1.1) are Unicode 8.0: a character assigned after 8.0
    is in none of Cc/Cf/Co/P*/Mn there, so the tables here hold only characters assigned by 8.0 (DerivedAge.txt),
    with their Unicode 8.0 categories (the few characters whose category changed since are listed below);
  - its NFD (crate unicode-normalization-alignments 0.1.12) is Unicode 9.0: decompositions and combining classes
    of characters assigned after 9.0 are left out (both are stable for a character once assigned);
  - White_Space and the lower-case mapping come from Rust's standard library, whose Unicode is newer than any UCD
    Debian ships: they are taken from the UCD as it is (characters newer than the UCD are not lower-cased).

Usage:
  python3 cmake/gen_unicode_tables.py [--ucd DIR] [--out FILE]      write the header (default: the library's)
  python3 cmake/gen_unicode_tables.py --check [--ucd DIR] [--out FILE]
      regenerate in memory and compare with FILE: exit 0 when equal, 1 when different, 77 (skipped) when the UCD
      files are missing or are another Unicode version than the one FILE was generated from.
Python 3 standard library only.
"""

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "include", "dea", "text", "unicode_tables.hpp")
SKIP = 77  # CTest's SKIP_RETURN_CODE for the check

# The Unicode versions of the tables tokenizers 0.23.2 uses (see the docstring).
CATEGORY_VERSION = (8, 0)
NORMALIZATION_VERSION = (9, 0)

# General categories of Unicode 8.0 that differ from the UCD's current ones, for characters assigned by 8.0. (The
# UCD keeps only the current category; these are the changes between 8.0 and 15.0 that move a character into or
# out of Cc/Cf/Co/P*/Mn. The script stops when a listed character no longer differs from the UCD.)
CATEGORY_IN_8_0 = {
    0x166D: "Po",   # CANADIAN SYLLABICS CHI SIGN: So since Unicode 12.0
    0x1734: "Mn",   # HANUNOO SIGN PAMUDPOD: Mc since 14.0
    0x1885: "Lo",   # MONGOLIAN LETTER ALI GALI BALUDA: Mn since 9.0
    0x1886: "Lo",   # MONGOLIAN LETTER ALI GALI THREE BALUDA: Mn since 9.0
    0xA9BD: "Mc",   # JAVANESE CONSONANT SIGN KERET: Mn since 12.0
    0x111C9: "Po",  # SHARADA SANDHI MARK: Mn since 13.0
}

HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3  # decomposed arithmetically (Unicode 3.12), not from the tables


def fail(msg):
    sys.exit("gen_unicode_tables: " + msg)


def read(ucd, name):
    path = os.path.join(ucd, name)
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        fail("cannot read %s: %s" % (path, e))


def ucd_version(ucd):
    m = re.search(r"DerivedAge-(\d+\.\d+\.\d+)\.txt", read(ucd, "DerivedAge.txt"))
    if not m:
        fail("no version line in DerivedAge.txt")
    return m.group(1)


def data_lines(text):
    """(fields...) of each non-comment line of a UCD file (fields stripped)."""
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            yield [f.strip() for f in line.split(";")]


def code_range(field):
    a, _, b = field.partition("..")
    return int(a, 16), int(b or a, 16)


def parse_unicode_data(ucd):
    """category, canonical combining class, one-level canonical decomposition, simple lower case: dicts by code
    point. The <..., First> / <..., Last> pairs stand for the whole range."""
    cat, ccc, dec, lower = {}, {}, {}, {}
    first = None
    for f in data_lines(read(ucd, "UnicodeData.txt")):
        cp = int(f[0], 16)
        if f[1].endswith(", First>"):
            first = cp
            continue
        cps = range(first, cp + 1) if f[1].endswith(", Last>") else (cp,)
        first = None
        for c in cps:
            cat[c] = f[2]
            if int(f[3]):
                ccc[c] = int(f[3])
        if f[5] and not f[5].startswith("<"):  # <tag> = a compatibility decomposition: not NFD
            dec[cp] = [int(x, 16) for x in f[5].split()]
        if f[13]:
            lower[cp] = [int(f[13], 16)]
    return cat, ccc, dec, lower


def parse_age(ucd):
    age = {}
    for f in data_lines(read(ucd, "DerivedAge.txt")):
        a, b = code_range(f[0])
        v = tuple(int(x) for x in f[1].split("."))
        for c in range(a, b + 1):
            age[c] = v
    return age


def parse_white_space(ucd):
    ws = set()
    for f in data_lines(read(ucd, "PropList.txt")):
        if f[1] == "White_Space":
            a, b = code_range(f[0])
            ws.update(range(a, b + 1))
    return ws


def parse_special_lower(ucd):
    """The unconditional full lower-case mappings of SpecialCasing.txt (no condition field)."""
    out = {}
    for f in data_lines(read(ucd, "SpecialCasing.txt")):
        if len(f) > 4 and f[4]:
            continue  # language- or context-dependent (final sigma, Lithuanian, Turkish): not Rust's to_lowercase
        out[int(f[0], 16)] = [int(x, 16) for x in f[1].split()]
    return out


def ranges(cps):
    """Sorted code points -> [(first, last)] of consecutive runs."""
    out = []
    for c in sorted(cps):
        if out and out[-1][1] + 1 == c:
            out[-1][1] = c
        else:
            out.append([c, c])
    return [tuple(r) for r in out]


def build(ucd):
    version = ucd_version(ucd)
    cat, ccc, dec, simple_lower = parse_unicode_data(ucd)
    age = parse_age(ucd)
    white = parse_white_space(ucd)
    special_lower = parse_special_lower(ucd)

    def assigned_by(c, v):
        return c in age and age[c][:2] <= v

    for c, old in CATEGORY_IN_8_0.items():
        if not assigned_by(c, CATEGORY_VERSION) or cat.get(c) == old:
            fail("U+%04X: the Unicode 8.0 category override %s is stale for UCD %s" % (c, old, version))
    cat8 = {c: CATEGORY_IN_8_0.get(c, k) for c, k in cat.items() if assigned_by(c, CATEGORY_VERSION)}

    control = [c for c, k in cat8.items() if k in ("Cc", "Cf", "Co")]
    punct = [c for c, k in cat8.items() if k.startswith("P")]
    mn = [c for c, k in cat8.items() if k == "Mn"]

    ccc9 = {c: k for c, k in ccc.items() if assigned_by(c, NORMALIZATION_VERSION)}
    dec9 = {c: d for c, d in dec.items() if assigned_by(c, NORMALIZATION_VERSION)}
    for c, d in dec9.items():
        if not 1 <= len(d) <= 2 or any(not assigned_by(x, NORMALIZATION_VERSION) for x in d):
            fail("U+%04X: unexpected canonical decomposition %r" % (c, d))
        if HANGUL_FIRST <= c <= HANGUL_LAST:
            fail("U+%04X: a Hangul syllable with a listed decomposition" % c)

    ccc_runs = []  # (first, last, class) over consecutive code points of one class
    for c in sorted(ccc9):
        if ccc_runs and ccc_runs[-1][1] + 1 == c and ccc_runs[-1][2] == ccc9[c]:
            ccc_runs[-1][1] = c
        else:
            ccc_runs.append([c, c, ccc9[c]])

    lower = dict(simple_lower)
    lower.update(special_lower)
    lower = {c: m for c, m in lower.items() if m != [c]}
    single = {c: m[0] for c, m in lower.items() if len(m) == 1}
    multi = {c: m for c, m in lower.items() if len(m) > 1}
    if any(len(m) > 3 for m in multi.values()):
        fail("a lower-case mapping longer than 3 code points")
    # runs of (first, last, delta, stride): every stride-th code point from first to last maps to itself + delta
    lower_runs = []
    for c in sorted(single):
        d = single[c] - c
        if lower_runs:
            r = lower_runs[-1]
            step = c - r[1]
            if r[2] == d and ((r[0] == r[1] and step in (1, 2)) or step == r[3]):
                r[3] = step
                r[1] = c
                continue
        lower_runs.append([c, c, d, 1])

    return {
        "version": version,
        "control": ranges(control),
        "white_space": ranges(white),
        "punctuation": ranges(punct),
        "nonspacing_mark": ranges(mn),
        "ccc": ccc_runs,
        "decomposition": sorted(dec9.items()),
        "lower": lower_runs,
        "lower_multi": sorted(multi.items()),
    }


def emit(t):
    out = []
    w = out.append
    w("// dea/text/unicode_tables.hpp: Unicode property tables for the WordPiece tokenizer. GENERATED: do not edit.")
    w("//")
    w("// Written by cmake/gen_unicode_tables.py from the Unicode Character Database %s (Debian's unicode-data" % t["version"])
    w("// package: UnicodeData.txt, PropList.txt, SpecialCasing.txt, DerivedAge.txt). The categories are those of the")
    w("// characters assigned by Unicode %d.%d and the decompositions those of Unicode %d.%d, as Hugging Face's tokenizers"
      % (CATEGORY_VERSION + NORMALIZATION_VERSION))
    w("// library has them (see the script); text/unicode.hpp reads the tables. Every table is sorted by code point.")
    w("#pragma once")
    w("")
    w("#include <cstdint>")
    w("")
    w("namespace dea::text::unicode::tables {")
    w("")
    w("/// The UCD version the tables were generated from.")
    w('inline constexpr char kUcdVersion[] = "%s";' % t["version"])
    w("/// The Unicode versions of the category and the normalisation data (those of tokenizers 0.23.2).")
    w('inline constexpr char kCategoryVersion[] = "%d.%d";' % CATEGORY_VERSION)
    w('inline constexpr char kNormalizationVersion[] = "%d.%d";' % NORMALIZATION_VERSION)
    w("")
    w("/// An inclusive range of code points.")
    w("struct Range {")
    w("  std::uint32_t first, last;")
    w("};")
    w("/// Code points first..last, each of canonical combining class `ccc`.")
    w("struct CombiningClassRange {")
    w("  std::uint32_t first, last;")
    w("  std::uint8_t ccc;")
    w("};")
    w("/// The canonical decomposition of `cp` as UnicodeData.txt gives it: `first`, then `second` (0: none). It is")
    w("/// applied again to its parts for the full decomposition.")
    w("struct Decomposition {")
    w("  std::uint32_t cp, first, second;")
    w("};")
    w("/// Every `stride`-th code point from `first` to `last` lower-cases to itself + `delta`; the others between them")
    w("/// are unchanged.")
    w("struct LowerRange {")
    w("  std::uint32_t first, last;")
    w("  std::int32_t delta;")
    w("  std::uint8_t stride;")
    w("};")
    w("/// A lower-case mapping to more than one code point (SpecialCasing.txt); unused entries of `to` are 0.")
    w("struct LowerMulti {")
    w("  std::uint32_t cp, to[3];")
    w("};")
    w("")

    def table(name, doc, typ, rows, per_line):
        w("/// %s (%d entries)" % (doc, len(rows)))
        w("inline constexpr %s %s[] = {" % (typ, name))
        for i in range(0, len(rows), per_line):
            w("    " + " ".join(rows[i:i + per_line]))
        w("};")
        w("")

    rng = lambda r: "{0x%X, 0x%X}," % r
    table("kControl", "General category Cc, Cf or Co (Unicode %d.%d)." % CATEGORY_VERSION, "Range",
          [rng(r) for r in t["control"]], 6)
    table("kWhiteSpace", "The White_Space property.", "Range", [rng(r) for r in t["white_space"]], 6)
    table("kPunctuation", "General category Pc, Pd, Ps, Pe, Pi, Pf or Po (Unicode %d.%d)." % CATEGORY_VERSION,
          "Range", [rng(r) for r in t["punctuation"]], 6)
    table("kNonspacingMark", "General category Mn (Unicode %d.%d)." % CATEGORY_VERSION, "Range",
          [rng(r) for r in t["nonspacing_mark"]], 6)
    table("kCombiningClass", "Canonical combining classes other than 0 (Unicode %d.%d)." % NORMALIZATION_VERSION,
          "CombiningClassRange", ["{0x%X, 0x%X, %d}," % tuple(r) for r in t["ccc"]], 5)
    table("kDecomposition",
          "Canonical decompositions (Unicode %d.%d), Hangul syllables excepted." % NORMALIZATION_VERSION,
          "Decomposition", ["{0x%X, 0x%X, 0x%X}," % (c, d[0], d[1] if len(d) > 1 else 0)
                            for c, d in t["decomposition"]], 6)
    table("kLower", "Single-code-point lower-case mappings (UnicodeData.txt field 13, SpecialCasing.txt).",
          "LowerRange", ["{0x%X, 0x%X, %d, %d}," % tuple(r) for r in t["lower"]], 5)
    table("kLowerMulti", "Unconditional lower-case mappings to several code points (SpecialCasing.txt).",
          "LowerMulti", ["{0x%X, {%s}}," % (c, ", ".join("0x%X" % x for x in (m + [0, 0])[:3]))
                         for c, m in t["lower_multi"]], 2)
    w("}  // namespace dea::text::unicode::tables")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description="Writes the Unicode tables of the WordPiece tokenizer from the UCD.")
    ap.add_argument("--ucd", default="/usr/share/unicode", help="the UCD directory (default /usr/share/unicode)")
    ap.add_argument("--out", default=DEFAULT_OUT, help="the header to write or check")
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    a = ap.parse_args()

    needed = ("UnicodeData.txt", "PropList.txt", "SpecialCasing.txt", "DerivedAge.txt")
    missing = [n for n in needed if not os.path.isfile(os.path.join(a.ucd, n))]
    if missing:
        msg = "no %s in %s (Debian: apt-get install unicode-data)" % (", ".join(missing), a.ucd)
        if a.check:
            print("gen_unicode_tables: skipped: " + msg)
            return SKIP
        fail(msg)
    text = emit(build(a.ucd))
    if not a.check:
        tmp = a.out + ".tmp"
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, a.out)
        print("gen_unicode_tables: wrote %s (%d bytes)" % (a.out, len(text)))
        return 0
    try:
        with open(a.out, encoding="utf-8") as f:
            current = f.read()
    except OSError as e:
        fail("cannot read %s: %s" % (a.out, e))
    m = re.search(r'kUcdVersion\[\] = "([^"]+)"', current)
    have = m.group(1) if m else "?"
    version = ucd_version(a.ucd)
    if have != version:
        print("gen_unicode_tables: skipped: %s was generated from UCD %s, %s holds UCD %s (regenerate and review "
              "the differences to move to it)" % (a.out, have, a.ucd, version))
        return SKIP
    if current != text:
        print("gen_unicode_tables: %s differs from what UCD %s gives: run python3 cmake/gen_unicode_tables.py"
              % (a.out, version))
        return 1
    print("gen_unicode_tables: %s is up to date (UCD %s)" % (a.out, version))
    return 0


if __name__ == "__main__":
    sys.exit(main())
