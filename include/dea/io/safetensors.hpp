// dea/io/safetensors.hpp: reading and writing safetensors files, and saving / loading parameters by name.
//
// The container (https://github.com/huggingface/safetensors):
//   [8 bytes]  N, little-endian u64
//   [N bytes]  JSON object: name -> {"dtype": "F64", "shape": [2, 6], "data_offsets": [begin, end]},
//              plus an optional "__metadata__" object mapping strings to strings
//   [rest]     the data part; a tensor's bytes are data[begin, end), row-major, little-endian
// A scalar has shape [] (one element); a tensor with a zero extent has no bytes (begin == end).
//
// Everything read from a file is validated before it is used: every malformed input throws dea::Error whose
// message names the file (or the in-memory source) and the problem. Nothing is allocated from an unchecked
// size: the header is capped at SafeTensors::max_header_bytes, and every tensor must lie inside the file.
// Writes go to a temporary file next to the target, are flushed to disk and renamed over the target, so a
// crash leaves either the old or the new complete file.
//
// Parameters (dea::Param) are stored under their PyTorch state_dict names ("W_q.weight", "layers.0.attn.W_rel"),
// so checkpoints interchange with the reference implementation by name.
//
// This header needs nlohmann_json; the core headers do not.
#pragma once

#include "../core/atomic_file.hpp"
#include "../core/bf16.hpp"
#include "../core/error.hpp"
#include "../core/param.hpp"
#include "../core/tensor.hpp"
#include "dtype.hpp"
#include "json_limits.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <ostream>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>


// Tensor bytes are copied to and from memory as they are, so the machine must be little-endian like the format.
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "dea/io/safetensors.hpp supports little-endian machines only"
#endif
#endif

namespace dea::io {

namespace detail {

/// Checks a shape for storage: rank and extents within the sane limits, and numel * element size in 64 bits.
/// Returns the byte count. `what` names the tensor in the message.
inline std::uint64_t checked_nbytes(const Shape& shape, DType d, const std::string& source, const std::string& what);

/// One validated header entry (offsets relative to the data part).
struct HeaderEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::uint64_t begin = 0, end = 0;
};

struct ParsedHeader {
  std::vector<HeaderEntry> entries;
  std::map<std::string, std::string> metadata;
};

/// Reads N from the 8-byte prefix and checks it against the size of what follows and the sane maximum.
inline std::uint64_t read_header_length(const std::uint8_t* prefix, std::uint64_t total_size,
                                        const std::string& source);

/// Parses and validates the JSON header; `data_size` is the size of the data part.
inline ParsedHeader parse_header(const char* text, std::size_t n, std::uint64_t data_size, const std::string& source);

/// Throws unless `s` is valid UTF-8 (every name and metadata string must be, to be written as JSON).
inline void check_utf8(const std::string& s, const std::string& source, const char* what) {
  try {
    (void)nlohmann::json(s).dump();
  } catch (const nlohmann::json::exception&) {
    st_fail(source, what, " is not valid UTF-8");
  }
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------------------------
// SafeTensors: a set of named tensors plus string metadata, held in memory
// ---------------------------------------------------------------------------------------------------------------

/// A safetensors file in memory: named tensors (each a dtype, a shape and its raw little-endian bytes) and the
/// "__metadata__" string map. Loading copies the tensors out of the file; `get` converts them to a Tensor<T>,
/// `put` adds or replaces one; `save` writes the whole set atomically.
///
/// Conversions (get<T> from a stored dtype, put<T> to a chosen dtype) are numeric and never silently lossy
/// beyond float rounding: F32 <-> F64 convert freely (a finite double beyond float range is an error);
/// integers convert to integers within range and to floats when exactly representable; BOOL/U8/I32/I64 convert
/// among each other within range (bool accepts 0 and 1); floating data is never read or stored as an integer.
/// F16 and BF16 (Hugging Face checkpoints) read exactly as float or double (every value is a binary32 value:
/// BF16 = bits << 16, F16 with its subnormals, infinities and NaN); a value is stored as F16 / BF16 only when it
/// is exactly representable there (put never rounds; put_bf16_rounded rounds to bf16 on purpose).
class SafeTensors {
public:
  /// Largest header accepted (bytes); a larger N means a corrupt or foreign file.
  static constexpr std::uint64_t max_header_bytes = 100'000'000;
  /// Largest rank and largest single extent accepted in a shape.
  static constexpr std::size_t max_rank = 64;
  static constexpr std::uint64_t max_extent = std::uint64_t(1) << 40;

  /// An empty set; `source_name` appears in error messages.
  explicit SafeTensors(std::string source_name = "<memory>") : source_(std::move(source_name)) {}

  /// Reads and validates the file at `path`. Throws dea::Error naming the path on any problem.
  static SafeTensors load(const std::string& path);

  /// Parses and validates `size` bytes at `data` (a whole file image). `source_name` appears in messages.
  static SafeTensors parse(const std::uint8_t* data, std::size_t size, const std::string& source_name = "<memory>");
  static SafeTensors parse(const std::vector<std::uint8_t>& bytes, const std::string& source_name = "<memory>") {
    return parse(bytes.data(), bytes.size(), source_name);
  }

  /// The file path or source name given at load / parse time.
  const std::string& source() const { return source_; }

  std::size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  /// Tensor names, sorted (byte-wise).
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    out.reserve(entries_.size());
    for (const auto& kv : entries_) out.push_back(kv.first);
    return out;
  }

  /// Stored dtype / shape / element count / byte count of tensor `name`; throws when absent.
  DType dtype(const std::string& name) const { return entry(name).dtype; }
  const Shape& shape(const std::string& name) const { return entry(name).shape; }
  Index numel(const std::string& name) const { return shape_numel(entry(name).shape); }
  std::size_t nbytes(const std::string& name) const { return entry(name).bytes.size(); }

  /// The "__metadata__" map (empty when the file has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Sets one metadata entry (replacing any previous value).
  void set_metadata(const std::string& key, const std::string& value) {
    detail::check_utf8(key, source_, "metadata key");
    detail::check_utf8(value, source_, "metadata value");
    metadata_[key] = value;
  }
  /// Replaces the whole metadata map.
  void set_metadata(const std::map<std::string, std::string>& md) {
    for (const auto& [k, v] : md) {
      detail::check_utf8(k, source_, "metadata key");
      detail::check_utf8(v, source_, "metadata value");
    }
    metadata_ = md;
  }

  /// Tensor `name` converted to element type T (see the class comment for the allowed conversions).
  /// Result shape = stored shape. Throws when absent, when the dtype cannot be read as T (floating as integer),
  /// or when an element does not fit T (message gives the element index and value).
  template <class T>
  Tensor<T> get(const std::string& name) const {
    static_assert(detail::is_element_type_v<T>,
                  "safetensors element type must be float, double, int32_t, int64_t, uint8_t or bool");
    const Entry& e = entry(name);
    Tensor<T> out(e.shape);
    read_into(name, e, out.ptr(), out.numel());
    return out;
  }

  /// Copies tensor `name` into `dst` (n elements, row-major), converting to T; `n` must equal its numel.
  template <class T>
  void get_into(const std::string& name, T* dst, Index n) const {
    static_assert(detail::is_element_type_v<T>,
                  "safetensors element type must be float, double, int32_t, int64_t, uint8_t or bool");
    const Entry& e = entry(name);
    const Index numel = shape_numel(e.shape);
    if (n != numel)
      detail::st_fail(source_, "tensor '", name, "' of shape ", shape_str(e.shape), " has ", numel,
                      " elements, the destination ", n);
    read_into(name, e, dst, n);
  }

  /// Adds or replaces tensor `name`: shape `shape`, elements `data[0, numel)` (row-major), stored as `as`.
  /// Throws for an empty or reserved name, an out-of-limit shape, floating data stored as an integer dtype, or
  /// an element that does not fit `as`; on a throw the set is unchanged.
  template <class T>
  void put(const std::string& name, const Shape& shape, const T* data, DType as) {
    static_assert(detail::is_element_type_v<T>,
                  "safetensors element type must be float, double, int32_t, int64_t, uint8_t or bool");
    if (name.empty()) detail::st_fail(source_, "a tensor name must not be empty");
    if (name == "__metadata__") detail::st_fail(source_, "'__metadata__' is reserved and cannot name a tensor");
    detail::check_utf8(name, source_, ::dea::detail::concat("tensor name '", name, "'").c_str());
    const std::uint64_t nb = detail::checked_nbytes(shape, as, source_, "tensor '" + name + "'");
    const Index n = shape_numel(shape);
    if (std::is_floating_point_v<T> && !dtype_is_floating(as))
      detail::st_fail(source_, "tensor '", name, "': ", detail::type_name<T>(), " data cannot be stored as ", as,
                      " (it would drop the fraction); store it as F32 or F64");
    if (n > 0 && data == nullptr) detail::st_fail(source_, "tensor '", name, "': null data pointer");
    Entry e;
    e.dtype = as;
    e.shape = shape;
    e.bytes.resize(static_cast<std::size_t>(nb));
    detail::visit_dtype(as, [&](auto tag) {
      using C = decltype(tag);
      const std::size_t w = sizeof(C);
      for (Index i = 0; i < n; ++i) {
        C c{};
        bool ok;
        if constexpr (detail::is_half_v<C>)
          ok = detail::to_half_exact(data[i], c);
        else
          ok = detail::convert_value<C>(data[i], c);
        if (!ok)
          detail::st_fail(source_, "tensor '", name, "': element ", i, " (value ", detail::value_str(data[i]),
                          ") cannot be stored as ", as, " without changing it");
        detail::store_element<C>(e.bytes.data() + static_cast<std::size_t>(i) * w, c);
      }
    });
    entries_[name] = std::move(e);
  }

  /// Adds or replaces tensor `name` stored as BF16 with rounding (the one write that rounds, asked for by name):
  /// each element is converted to float (a double beyond float range is an error, as for F32) and rounded to bf16 to
  /// nearest, ties to even (core/bf16.hpp, to_bf16: NaN stays NaN, infinities stay). Reading it back (get<float>)
  /// gives the rounded values exactly.
  template <class T>
  void put_bf16_rounded(const std::string& name, const Shape& shape, const T* data) {
    static_assert(std::is_floating_point_v<T>, "put_bf16_rounded: float or double data");
    const Index n = shape_numel(shape);
    if (n > 0 && data == nullptr) detail::st_fail(source_, "tensor '", name, "': null data pointer");
    std::vector<float> r(static_cast<std::size_t>(std::max<Index>(n, 0)));
    for (Index i = 0; i < n; ++i) {
      float f{};
      if (!detail::convert_value<float>(data[i], f))
        detail::st_fail(source_, "tensor '", name, "': element ", i, " (value ", detail::value_str(data[i]),
                        ") is beyond the range of float");
      r[static_cast<std::size_t>(i)] = round_bf16(f);
    }
    put(name, shape, r.data(), DType::BF16);
  }

  /// Adds or replaces tensor `name` from a Tensor, stored as `as`.
  template <class T>
  void put(const std::string& name, const Tensor<T>& t, DType as) {
    const Index n = shape_numel(t.shape);
    if (t.numel() != n)
      detail::st_fail(source_, "tensor '", name, "': shape ", shape_str(t.shape), " needs ", n,
                      " elements, the Tensor holds ", t.numel());
    put(name, t.shape, t.ptr(), as);
  }

  /// Adds or replaces tensor `name` from a Tensor, stored as default_dtype<T>() (double -> F64, ...).
  template <class T>
  void put(const std::string& name, const Tensor<T>& t) {
    put(name, t, default_dtype<T>());
  }

  /// Removes tensor `name`; false when there was none.
  bool erase(const std::string& name) { return entries_.erase(name) != 0; }

  /// The complete file image: 8-byte N, the header (metadata first, then tensors in name order, padded with
  /// spaces to a multiple of 8 bytes so the data part stays aligned), the tensors packed in name order.
  std::vector<std::uint8_t> serialize() const {
    const std::string header = build_header();
    std::uint64_t total = 8 + header.size();
    for (const auto& kv : entries_) total += kv.second.bytes.size();
    std::vector<std::uint8_t> out;
    out.reserve(static_cast<std::size_t>(total));
    write_parts(header, [&](const std::uint8_t* p, std::size_t n) { out.insert(out.end(), p, p + n); });
    return out;
  }

  /// Writes the file atomically: a temporary file in the target's directory is written, flushed to disk
  /// (fsync) and renamed over `path`. On failure the temporary is removed and `path` is untouched.
  void save(const std::string& path) const;

private:
  struct Entry {
    DType dtype = DType::F32;
    Shape shape;
    std::vector<std::uint8_t> bytes;  // numel * dtype_size bytes, little-endian
  };

  const Entry& entry(const std::string& name) const {
    const auto it = entries_.find(name);
    if (it == entries_.end())
      detail::st_fail(source_, "no tensor named '", name, "' (", entries_.size(), " tensors present)");
    return it->second;
  }

  template <class T>
  void read_into(const std::string& name, const Entry& e, T* dst, Index n) const {
    if (dtype_is_floating(e.dtype) && !std::is_floating_point_v<T>)
      detail::st_fail(source_, "tensor '", name, "' has dtype ", e.dtype, "; reading it as ", detail::type_name<T>(),
                      " would drop the fraction (read it as float or double)");
    detail::visit_dtype(e.dtype, [&](auto tag) {
      using C = decltype(tag);
      const std::size_t w = sizeof(C);
      for (Index i = 0; i < n; ++i) {
        const C c = detail::load_element<C>(e.bytes.data() + static_cast<std::size_t>(i) * w);
        bool ok;
        if constexpr (detail::is_half_v<C>)  // floating only (refused as an integer above): exact in float and double
          ok = detail::convert_value<T>(detail::half_value(c), dst[i]);
        else
          ok = detail::convert_value<T>(c, dst[i]);
        if (!ok)
          detail::st_fail(source_, "tensor '", name, "' (", e.dtype, "): element ", i, " (value ",
                          detail::value_str(c), ") cannot be represented as ", detail::type_name<T>());
      }
    });
  }

  std::string build_header() const {
    nlohmann::ordered_json root = nlohmann::ordered_json::object();
    if (!metadata_.empty()) {
      nlohmann::ordered_json md = nlohmann::ordered_json::object();
      for (const auto& [k, v] : metadata_) md[k] = v;
      root["__metadata__"] = std::move(md);
    }
    std::uint64_t offset = 0;
    for (const auto& [name, e] : entries_) {
      nlohmann::ordered_json shape = nlohmann::ordered_json::array();
      for (Index d : e.shape) shape.push_back(static_cast<std::uint64_t>(d));
      nlohmann::ordered_json item = nlohmann::ordered_json::object();
      item["dtype"] = dtype_name(e.dtype);
      item["shape"] = std::move(shape);
      item["data_offsets"] = nlohmann::ordered_json::array({offset, offset + e.bytes.size()});
      offset += e.bytes.size();
      root[name] = std::move(item);
    }
    std::string h;
    try {
      h = root.dump();
    } catch (const nlohmann::json::exception& ex) {  // names are checked on insertion; kept as a safety net
      detail::st_fail(source_, "cannot write the header: ", ex.what());
    }
    h.append((8 - h.size() % 8) % 8, ' ');
    if (h.size() > max_header_bytes)
      detail::st_fail(source_, "the header would be ", h.size(), " bytes, more than the maximum ", max_header_bytes);
    return h;
  }

  /// Emits the file in pieces: sink(const std::uint8_t*, std::size_t).
  template <class Sink>
  void write_parts(const std::string& header, Sink&& sink) const {
    std::uint8_t prefix[8];
    const std::uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) prefix[i] = static_cast<std::uint8_t>(n >> (8 * i));
    sink(prefix, 8);
    sink(reinterpret_cast<const std::uint8_t*>(header.data()), header.size());
    for (const auto& kv : entries_)
      if (!kv.second.bytes.empty()) sink(kv.second.bytes.data(), kv.second.bytes.size());
  }

  std::string source_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// ---------------------------------------------------------------------------------------------------------------
// Header validation
// ---------------------------------------------------------------------------------------------------------------

namespace detail {

inline std::uint64_t checked_nbytes(const Shape& shape, DType d, const std::string& source, const std::string& what) {
  if (shape.size() > SafeTensors::max_rank)
    st_fail(source, what, " has rank ", shape.size(), ", more than the maximum ", SafeTensors::max_rank);
  std::uint64_t n = 1;
  for (Index x : shape) {
    if (x < 0) st_fail(source, what, " has a negative extent in shape ", shape_str(shape));
    if (static_cast<std::uint64_t>(x) > SafeTensors::max_extent)
      st_fail(source, what, " has an absurd extent ", x, " in shape ", shape_str(shape), " (maximum ",
              SafeTensors::max_extent, ")");
    if (!checked_mul(n, static_cast<std::uint64_t>(x), n))
      st_fail(source, what, ": shape ", shape_str(shape), " has too many elements (overflow)");
  }
  std::uint64_t bytes = 0;
  if (!checked_mul(n, dtype_size(d), bytes) ||
      n > static_cast<std::uint64_t>(std::numeric_limits<Index>::max()))
    st_fail(source, what, ": shape ", shape_str(shape), " with dtype ", d, " is too large (overflow)");
  return bytes;
}

inline std::uint64_t read_header_length(const std::uint8_t* prefix, std::uint64_t total_size,
                                        const std::string& source) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];
  if (n > SafeTensors::max_header_bytes)
    st_fail(source, "header length N = ", n, " bytes exceeds the sane maximum of ", SafeTensors::max_header_bytes,
            " bytes (corrupt file or not a safetensors file)");
  if (n > total_size - 8)
    st_fail(source, "header length N = ", n, " bytes but only ", total_size - 8,
            " bytes follow the 8-byte prefix (truncated file)");
  return n;
}

/// A non-negative JSON integer, or a message naming `what` and what was found instead.
inline std::uint64_t json_uint(const nlohmann::json& j, const std::string& source, const std::string& what) {
  if (j.is_number_unsigned()) return j.get<std::uint64_t>();
  if (j.is_number_integer()) st_fail(source, what, " is negative (", j.dump(), ")");
  if (j.is_number_float()) st_fail(source, what, " is not an integer (", j.dump(), ")");
  st_fail(source, what, " must be a non-negative integer, found ", j.type_name());
}

inline ParsedHeader parse_header(const char* text, std::size_t n, std::uint64_t data_size, const std::string& source) {
  if (json_nesting_depth(std::string_view(text, n)) > kMaxJsonDepth)
    st_fail(source, "header nests JSON deeper than ", kMaxJsonDepth, " levels (corrupt or hostile file)");
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(text, text + n);
  } catch (const nlohmann::json::exception& ex) {
    st_fail(source, "header is not valid JSON: ", ex.what());
  }
  if (!root.is_object()) st_fail(source, "header is not a JSON object (found ", root.type_name(), ")");

  ParsedHeader out;
  out.entries.reserve(root.size());
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) st_fail(source, "\"__metadata__\" must be an object of strings, found ", v.type_name());
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          st_fail(source, "metadata value for key '", m.key(), "' must be a string, found ", m.value().type_name());
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string what = "tensor '" + name + "'";
    if (name.empty()) st_fail(source, "a tensor has an empty name");
    if (!v.is_object()) st_fail(source, what, ": entry must be a JSON object, found ", v.type_name());
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!v.contains(field)) st_fail(source, what, ": entry has no \"", field, "\" field");

    HeaderEntry e;
    e.name = name;
    const nlohmann::json& jd = v["dtype"];
    if (!jd.is_string()) st_fail(source, what, ": \"dtype\" must be a string, found ", jd.type_name());
    const std::string ds = jd.get<std::string>();
    if (!parse_dtype(ds, e.dtype))
      st_fail(source, what, ": unsupported dtype \"", ds, "\" (supported: ", supported_dtype_names(), ")");

    const nlohmann::json& js = v["shape"];
    if (!js.is_array()) st_fail(source, what, ": \"shape\" must be an array, found ", js.type_name());
    if (js.size() > SafeTensors::max_rank)
      st_fail(source, what, " has rank ", js.size(), ", more than the maximum ", SafeTensors::max_rank);
    for (std::size_t k = 0; k < js.size(); ++k) {
      const std::uint64_t x = json_uint(js[k], source, ::dea::detail::concat(what, ": shape extent ", k));
      if (x > SafeTensors::max_extent)
        st_fail(source, what, " has an absurd extent ", x, " at axis ", k, " (maximum ", SafeTensors::max_extent, ")");
      e.shape.push_back(static_cast<Index>(x));
    }

    const nlohmann::json& jo = v["data_offsets"];
    if (!jo.is_array() || jo.size() != 2)
      st_fail(source, what, ": \"data_offsets\" must be an array [begin, end], found ",
              jo.is_array() ? ::dea::detail::concat("an array of ", jo.size()) : std::string(jo.type_name()));
    e.begin = json_uint(jo[0], source, what + ": data_offsets begin");
    e.end = json_uint(jo[1], source, what + ": data_offsets end");
    if (e.begin > e.end)
      st_fail(source, what, ": data_offsets [", e.begin, ", ", e.end, "] has begin > end");
    if (e.end > data_size)
      st_fail(source, what, ": data_offsets [", e.begin, ", ", e.end, "] lie outside the data part of ", data_size,
              " bytes (truncated file or corrupt header)");

    const std::uint64_t need = checked_nbytes(e.shape, e.dtype, source, what);
    if (e.end - e.begin != need)
      st_fail(source, what, ": data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin, " bytes, but dtype ",
              e.dtype, " with shape ", shape_str(e.shape), " needs ", need, " bytes");
    out.entries.push_back(std::move(e));
  }

  // Overlap: sort non-empty ranges by begin; each must start at or after the end of the one before.
  // Holes between tensors and unused trailing bytes are allowed.
  std::vector<const HeaderEntry*> order;
  for (const auto& e : out.entries)
    if (e.end > e.begin) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const HeaderEntry* a, const HeaderEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->name < b->name;
  });
  for (std::size_t i = 1; i < order.size(); ++i)
    if (order[i]->begin < order[i - 1]->end)
      st_fail(source, "tensors '", order[i - 1]->name, "' [", order[i - 1]->begin, ", ", order[i - 1]->end, ") and '",
              order[i]->name, "' [", order[i]->begin, ", ", order[i]->end, ") overlap in the data part");
  return out;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------------------------
// SafeTensors: load / parse / save
// ---------------------------------------------------------------------------------------------------------------

inline SafeTensors SafeTensors::parse(const std::uint8_t* data, std::size_t size, const std::string& source_name) {
  if (data == nullptr && size > 0) detail::st_fail(source_name, "null data pointer");
  if (size < 8)
    detail::st_fail(source_name, "only ", size,
                    " bytes, shorter than the 8-byte header-length prefix (truncated or not a safetensors file)");
  const std::uint64_t n = detail::read_header_length(data, size, source_name);
  const std::uint64_t data_size = size - 8 - n;
  detail::ParsedHeader h =
      detail::parse_header(reinterpret_cast<const char*>(data + 8), static_cast<std::size_t>(n), data_size, source_name);
  SafeTensors st(source_name);
  st.metadata_ = std::move(h.metadata);
  const std::uint8_t* base = data + 8 + n;
  for (auto& he : h.entries) {
    Entry e;
    e.dtype = he.dtype;
    e.shape = std::move(he.shape);
    e.bytes.assign(base + he.begin, base + he.end);
    st.entries_[he.name] = std::move(e);
  }
  return st;
}

inline SafeTensors SafeTensors::load(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) detail::st_fail(path, "is a directory, not a file");
  std::ifstream f(path, std::ios::binary);
  if (!f) detail::st_fail(path, "cannot open for reading: ", std::strerror(errno));
  f.seekg(0, std::ios::end);
  const std::streamoff end = f.tellg();
  if (!f || end < 0) detail::st_fail(path, "cannot determine the file size");
  const std::uint64_t size = static_cast<std::uint64_t>(end);
  if (size < 8)
    detail::st_fail(path, "file is only ", size,
                    " bytes, shorter than the 8-byte header-length prefix (truncated or not a safetensors file)");
  f.seekg(0, std::ios::beg);

  auto read_exact = [&](std::uint64_t offset, void* dst, std::uint64_t n, const char* what) {
    f.seekg(static_cast<std::streamoff>(offset), std::ios::beg);
    f.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    if (!f || static_cast<std::uint64_t>(f.gcount()) != n)
      detail::st_fail(path, "could not read ", what, " (", n, " bytes at offset ", offset,
                      "); the file may have been truncated while reading");
  };

  std::uint8_t prefix[8];
  read_exact(0, prefix, 8, "the header-length prefix");
  const std::uint64_t n = detail::read_header_length(prefix, size, path);
  std::string header(static_cast<std::size_t>(n), '\0');
  if (n > 0) read_exact(8, header.data(), n, "the header");
  const std::uint64_t data_start = 8 + n;
  detail::ParsedHeader h = detail::parse_header(header.data(), header.size(), size - data_start, path);
  header = std::string();

  SafeTensors st(path);
  st.metadata_ = std::move(h.metadata);
  for (auto& he : h.entries) {
    Entry e;
    e.dtype = he.dtype;
    e.shape = std::move(he.shape);
    e.bytes.resize(static_cast<std::size_t>(he.end - he.begin));  // validated to lie inside the file
    if (!e.bytes.empty())
      read_exact(data_start + he.begin, e.bytes.data(), e.bytes.size(),
                 ::dea::detail::concat("tensor '", he.name, "'").c_str());
    st.entries_[he.name] = std::move(e);
  }
  return st;
}

inline void SafeTensors::save(const std::string& path) const {
  const std::string header = build_header();  // fails before any file is touched
  if (path.empty()) detail::st_fail(source_, "cannot save to an empty path");
  write_file_atomic_with(
      path,
      [&](auto&& write) { write_parts(header, [&](const std::uint8_t* p, std::size_t n) { write(p, n); }); },
      ::dea::detail::concat("safetensors '", path, "': "));
}

// ---------------------------------------------------------------------------------------------------------------
// Parameters by name
// ---------------------------------------------------------------------------------------------------------------

/// Stores every parameter's value as tensor `prefix + p->name` with shape p->shape, dtype `as`.
/// Throws on two parameters with the same name.
template <class S>
void put_parameters(SafeTensors& st, const ParamList<S>& params, DType as = default_dtype<S>(),
                    const std::string& prefix = "") {
  std::map<std::string, int> seen;
  for (const Param<S>* p : params) {
    check(p != nullptr, "put_parameters: null parameter in the list");
    if (seen[p->name]++) ::dea::detail::raise("put_parameters: two parameters are named '" + p->name + "'");
    check(p->value.size() == shape_numel(p->shape), "parameter '", p->name, "': shape ", shape_str(p->shape),
          " needs ", shape_numel(p->shape), " values, it holds ", p->value.size());
    st.put(prefix + p->name, p->shape, p->value.data(), as);
  }
}

/// Stores every parameter's gradient as tensor `prefix + p->name` (default prefix "grad.", as in the golden files).
template <class S>
void put_gradients(SafeTensors& st, const ParamList<S>& params, DType as = default_dtype<S>(),
                   const std::string& prefix = "grad.") {
  for (const Param<S>* p : params) {
    check(p != nullptr, "put_gradients: null parameter in the list");
    check(p->grad.size() == shape_numel(p->shape), "parameter '", p->name, "': shape ", shape_str(p->shape),
          " needs ", shape_numel(p->shape), " gradient values, it holds ", p->grad.size());
    st.put(prefix + p->name, p->shape, p->grad.data(), as);
  }
}

/// Saves the parameters' values (atomically, see SafeTensors::save) under their names, with `metadata`.
/// Default dtype: F32 for float parameters, F64 for double.
template <class S>
void save_parameters(const ParamList<S>& params, const std::string& path,
                     const std::map<std::string, std::string>& metadata = {}, DType as = default_dtype<S>()) {
  SafeTensors st(path);
  st.set_metadata(metadata);
  put_parameters(st, params, as);
  st.save(path);
}

/// Copies tensor `name` of `st` into p.value. The stored shape must equal p.shape exactly; the message names
/// the parameter, the expected and the stored shape. Any numeric dtype that converts to S is accepted.
template <class S>
void load_param(Param<S>& p, const SafeTensors& st, const std::string& name) {
  if (!st.has(name))
    detail::st_fail(st.source(), "no tensor '", name, "' for parameter '", p.name, "' (expected shape ",
                    shape_str(p.shape), ")");
  if (st.shape(name) != p.shape)
    detail::st_fail(st.source(), "parameter '", p.name, "': expected shape ", shape_str(p.shape), ", the file has ",
                    shape_str(st.shape(name)), (name == p.name ? "" : " (tensor '" + name + "')"));
  Vec<S> v(shape_numel(p.shape));
  st.get_into(name, v.data(), v.size());
  p.value = std::move(v);
}

/// load_param under the parameter's own name.
template <class S>
void load_param(Param<S>& p, const SafeTensors& st) {
  load_param(p, st, p.name);
}

/// Loads every parameter by name, all or nothing (nothing is modified when any check fails):
///  - each parameter must be present with exactly its shape, else dea::Error naming it (missing ones all listed);
///  - with `strict`, every file tensor must match a parameter, except names that start with one of
///    `ignore_prefixes` (e.g. {"in.", "out.", "grad."} for golden files); unmatched names are listed.
template <class S>
void load_parameters(const ParamList<S>& params, const SafeTensors& st, bool strict = true,
                     const std::vector<std::string>& ignore_prefixes = {}) {
  const std::string& src = st.source();
  std::map<std::string, int> wanted;
  std::vector<std::string> missing;
  for (const Param<S>* p : params) {
    check(p != nullptr, "load_parameters: null parameter in the list");
    if (wanted[p->name]++) ::dea::detail::raise("load_parameters: two parameters are named '" + p->name + "'");
    if (!st.has(p->name)) {
      missing.push_back(p->name);
      continue;
    }
    if (st.shape(p->name) != p->shape)
      detail::st_fail(src, "parameter '", p->name, "': expected shape ", shape_str(p->shape), ", the file has ",
                      shape_str(st.shape(p->name)));
  }
  auto list = [](const std::vector<std::string>& names) {
    std::string s;
    const std::size_t shown = std::min<std::size_t>(names.size(), 20);
    for (std::size_t i = 0; i < shown; ++i) s += (i ? ", '" : "'") + names[i] + "'";
    if (names.size() > shown) s += ::dea::detail::concat(" and ", names.size() - shown, " more");
    return s;
  };
  if (!missing.empty())
    detail::st_fail(src, missing.size(), " parameter(s) missing from the file: ", list(missing));
  if (strict) {
    std::vector<std::string> unexpected;
    for (const std::string& name : st.names()) {
      if (wanted.count(name)) continue;
      bool ignored = false;
      for (const std::string& pre : ignore_prefixes)
        if (name.compare(0, pre.size(), pre) == 0) ignored = true;
      if (!ignored) unexpected.push_back(name);
    }
    if (!unexpected.empty())
      detail::st_fail(src, unexpected.size(), " tensor(s) in the file match no parameter (strict load): ",
                      list(unexpected));
  }
  // Convert everything first, then commit, so a conversion error leaves every parameter untouched.
  std::vector<Vec<S>> staged(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    staged[i].resize(shape_numel(params[i]->shape));
    st.get_into(params[i]->name, staged[i].data(), staged[i].size());
  }
  for (std::size_t i = 0; i < params.size(); ++i) params[i]->value = std::move(staged[i]);
}

/// load_parameters from the file at `path`.
template <class S>
void load_parameters(const ParamList<S>& params, const std::string& path, bool strict = true,
                     const std::vector<std::string>& ignore_prefixes = {}) {
  load_parameters(params, SafeTensors::load(path), strict, ignore_prefixes);
}

}  // namespace dea::io
