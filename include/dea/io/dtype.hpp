// dea/io/dtype.hpp: the element types of safetensors files and their conversions: the dtype names and sizes, the
// F16 and BF16 bit patterns and their exact float values, little-endian element loads and stores, and the value
// conversions between element types that refuse to change a value. io/safetensors.hpp builds the container on them.
#pragma once

#include "../core/error.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <type_traits>

namespace dea::io {
static_assert(std::numeric_limits<float>::is_iec559 && sizeof(float) == 4, "F32 needs IEEE-754 binary32 float");
static_assert(std::numeric_limits<double>::is_iec559 && sizeof(double) == 8, "F64 needs IEEE-754 binary64 double");
static_assert(sizeof(bool) == 1, "BOOL is stored as one byte");

// ---------------------------------------------------------------------------------------------------------------
// Element types
// ---------------------------------------------------------------------------------------------------------------

/// The element types this library reads and writes (safetensors names in the comments).
enum class DType : std::uint8_t {
  F32,   ///< "F32"  float
  F64,   ///< "F64"  double
  I32,   ///< "I32"  std::int32_t
  I64,   ///< "I64"  std::int64_t
  U8,    ///< "U8"   std::uint8_t
  BOOL,  ///< "BOOL" one byte, 0 = false, anything else = true (written as 0 / 1)
  F16,   ///< "F16"  IEEE-754 binary16 (half); read as float exactly, written only when the value is exact
  BF16,  ///< "BF16" bfloat16, the upper 16 bits of a binary32; read exactly (bits << 16), written only when exact
};

/// The safetensors spelling: "F32", "F64", "I32", "I64", "U8", "BOOL".
inline const char* dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
  }
  return "?";
}

inline std::ostream& operator<<(std::ostream& os, DType d) { return os << dtype_name(d); }

/// Bytes per element.
inline std::size_t dtype_size(DType d) {
  switch (d) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
    case DType::BOOL: return 1;
    case DType::F16: return 2;
    case DType::BF16: return 2;
  }
  return 0;
}

inline bool dtype_is_floating(DType d) {
  return d == DType::F32 || d == DType::F64 || d == DType::F16 || d == DType::BF16;
}

/// The dtype names parse_dtype accepts, for messages.
inline const char* supported_dtype_names() { return "F64, F32, F16, BF16, I64, I32, U8, BOOL"; }

/// Parses an exact safetensors dtype name; false for names this library does not support (F8_E4M3, I16, ...).
inline bool parse_dtype(const std::string& s, DType& out) {
  static const std::pair<const char*, DType> table[] = {{"F32", DType::F32}, {"F64", DType::F64},
                                                        {"I32", DType::I32}, {"I64", DType::I64},
                                                        {"U8", DType::U8},   {"BOOL", DType::BOOL},
                                                        {"F16", DType::F16}, {"BF16", DType::BF16}};
  for (const auto& [name, d] : table)
    if (s == name) {
      out = d;
      return true;
    }
  return false;
}

namespace detail {

template <class T>
inline constexpr bool is_element_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> ||
    std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint8_t> || std::is_same_v<T, bool>;

template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "float";
  else if constexpr (std::is_same_v<T, double>) return "double";
  else if constexpr (std::is_same_v<T, std::int32_t>) return "int32";
  else if constexpr (std::is_same_v<T, std::int64_t>) return "int64";
  else if constexpr (std::is_same_v<T, std::uint8_t>) return "uint8";
  else return "bool";
}

}  // namespace detail

/// The dtype a C++ element type is stored as by default: float -> F32, double -> F64, std::int32_t -> I32,
/// std::int64_t -> I64, std::uint8_t -> U8, bool -> BOOL.
template <class T>
constexpr DType default_dtype() {
  static_assert(detail::is_element_type_v<T>,
                "safetensors element type must be float, double, int32_t, int64_t, uint8_t or bool");
  if constexpr (std::is_same_v<T, float>) return DType::F32;
  else if constexpr (std::is_same_v<T, double>) return DType::F64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return DType::I32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return DType::I64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return DType::U8;
  else return DType::BOOL;
}

namespace detail {

/// Throws dea::Error "dea: safetensors '<source>': <message>".
template <class... Args>
[[noreturn]] void st_fail(const std::string& source, const Args&... args) {
  ::dea::detail::raise(::dea::detail::concat("safetensors '", source, "': ", args...));
}

/// a * b, or false when the product does not fit in 64 bits.
inline bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) return false;
  out = a * b;
  return true;
}

/// One stored F16 element: its 16 bits.
struct Half {
  std::uint16_t bits = 0;
};
/// One stored BF16 element: its 16 bits (the upper half of a binary32).
struct BFloat16 {
  std::uint16_t bits = 0;
};
template <class C>
inline constexpr bool is_half_v = std::is_same_v<C, Half> || std::is_same_v<C, BFloat16>;

/// The float an F16 bit pattern stands for, exactly (every binary16 value is a binary32 value): normal numbers
/// re-biased (exponent e - 15 + 127), subnormals m * 2^-24, +-0, +-inf, and NaN with its payload in the top bits.
inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (man != 0) {  // subnormal: man * 2^-24, a normal float
      const float v = std::ldexp(static_cast<float>(man), -24);
      return sign ? -v : v;
    }
    bits = sign;                                    // +-0
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);        // +-inf (man = 0) or NaN
  } else {
    bits = sign | ((exp + 112u) << 23) | (man << 13);  // normal: exponent bias 15 -> 127
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// The float a BF16 bit pattern stands for, exactly: the bits shifted into the upper half of a binary32.
inline float bfloat16_to_float(std::uint16_t h) {
  const std::uint32_t bits = std::uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// The F16 bits of f when f is exactly a binary16 value (NaN maps to a quiet NaN of the same sign); false otherwise.
inline bool float_to_half_exact(float f, std::uint16_t& out) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  const std::uint16_t sign = static_cast<std::uint16_t>((b >> 16) & 0x8000u);
  const std::uint32_t exp = (b >> 23) & 0xffu, man = b & 0x7fffffu;
  if (exp == 0xff) {  // inf or NaN
    out = static_cast<std::uint16_t>(sign | 0x7c00u | (man == 0 ? 0u : 0x200u | (man >> 13)));
    return true;
  }
  if (exp == 0) {  // +-0 (a float subnormal is far below the smallest half subnormal, 2^-24)
    out = sign;
    return man == 0;
  }
  const int e = static_cast<int>(exp) - 127;  // f = 1.man * 2^e
  if (e > 15) return false;
  if (e >= -14) {  // a half normal: the low 13 bits of the mantissa must be 0
    if (man & 0x1fffu) return false;
    out = static_cast<std::uint16_t>(sign | (std::uint32_t(e + 15) << 10) | (man >> 13));
    return true;
  }
  if (e < -24) return false;
  const std::uint32_t full = man | 0x800000u;  // f = full * 2^(e - 23) = (full >> s) * 2^-24
  const int s = -e - 1;                        // 14 .. 23
  if (full & ((1u << s) - 1u)) return false;
  out = static_cast<std::uint16_t>(sign | (full >> s));
  return true;
}

/// The BF16 bits of f when f is exactly a bfloat16 value (the low 16 bits of its binary32 are 0); false otherwise.
inline bool float_to_bfloat16_exact(float f, std::uint16_t& out) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  if (b & 0xffffu) return false;
  out = static_cast<std::uint16_t>(b >> 16);
  return true;
}

/// The float value of a stored half element.
inline float half_value(Half h) { return half_to_float(h.bits); }
inline float half_value(BFloat16 h) { return bfloat16_to_float(h.bits); }

/// Stores v as a half element when it is exactly representable (integers and bool too); false otherwise.
template <class H, class Src>
bool to_half_exact(Src v, H& out) {
  const double d = static_cast<double>(v);
  if constexpr (!std::is_floating_point_v<Src>) {
    if (static_cast<Src>(d) != v) return false;  // a 64-bit integer beyond 2^53
  }
  const float f = static_cast<float>(d);
  if (!(static_cast<double>(f) == d) && !std::isnan(d)) return false;
  if constexpr (std::is_same_v<H, Half>)
    return float_to_half_exact(f, out.bits);
  else
    return float_to_bfloat16_exact(f, out.bits);
}

/// Calls f(C{}) with C the C++ type that holds one element of `d` (bool for BOOL; Half / BFloat16, the raw bits, for
/// F16 / BF16).
template <class F>
decltype(auto) visit_dtype(DType d, F&& f) {
  switch (d) {
    case DType::F32: return f(float{});
    case DType::F64: return f(double{});
    case DType::I32: return f(std::int32_t{});
    case DType::I64: return f(std::int64_t{});
    case DType::U8: return f(std::uint8_t{});
    case DType::BOOL: return f(bool{});
    case DType::F16: return f(Half{});
    case DType::BF16: return f(BFloat16{});
  }
  ::dea::detail::raise("safetensors: invalid DType value");
}

/// Reads one little-endian element (BOOL: any non-zero byte is true).
template <class C>
C load_element(const std::uint8_t* p) {
  if constexpr (std::is_same_v<C, bool>) {
    return *p != 0;
  } else {
    C v;
    std::memcpy(&v, p, sizeof(C));
    return v;
  }
}

/// Writes one little-endian element (BOOL as 0 / 1).
template <class C>
void store_element(std::uint8_t* p, C v) {
  if constexpr (std::is_same_v<C, bool>) {
    *p = v ? 1 : 0;
  } else {
    std::memcpy(p, &v, sizeof(C));
  }
}

/// Converts one value between element types; false when the value would change (the caller reports it).
///  - floating -> floating: rounds to nearest (double -> float); a finite value beyond float's range fails;
///  - integer/bool -> floating: only integers of magnitude <= 2^digits (exactly representable) convert;
///  - integer/bool -> integer: must lie in the destination's range (bool: 0 or 1);
///  - floating -> integer/bool: never (refused per dtype before any element is looked at).
template <class Dst, class Src>
bool convert_value(Src v, Dst& out) {
  if constexpr (std::is_floating_point_v<Src> && !std::is_floating_point_v<Dst>) {
    (void)v;
    (void)out;
    return false;
  } else if constexpr (std::is_floating_point_v<Dst>) {
    if constexpr (std::is_floating_point_v<Src>) {
      if constexpr (sizeof(Src) > sizeof(Dst)) {
        if (std::isfinite(v) && std::abs(v) > static_cast<Src>(std::numeric_limits<Dst>::max())) return false;
      }
      out = static_cast<Dst>(v);
      return true;
    } else {
      const std::int64_t w = static_cast<std::int64_t>(v);
      const std::int64_t limit = std::int64_t(1) << std::numeric_limits<Dst>::digits;
      if (w > limit || w < -limit) return false;
      out = static_cast<Dst>(w);
      return true;
    }
  } else if constexpr (std::is_same_v<Dst, bool>) {
    const std::int64_t w = static_cast<std::int64_t>(v);
    if (w != 0 && w != 1) return false;
    out = (w == 1);
    return true;
  } else {
    const std::int64_t w = static_cast<std::int64_t>(v);  // every integer Src (<= 64-bit signed, u8) fits
    if (w < static_cast<std::int64_t>(std::numeric_limits<Dst>::min()) ||
        w > static_cast<std::int64_t>(std::numeric_limits<Dst>::max()))
      return false;
    out = static_cast<Dst>(w);
    return true;
  }
}

template <class T>
std::string value_str(T v) {
  if constexpr (is_half_v<T>) return ::dea::detail::concat(half_value(v));
  else if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
  else if constexpr (std::is_floating_point_v<T>) return ::dea::detail::concat(v);
  else return std::to_string(static_cast<long long>(v));
}
}  // namespace detail
}  // namespace dea::io
