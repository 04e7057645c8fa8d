// dea/dist/grad_buffer.hpp: a model's parameter gradients as one contiguous buffer, in parameter order (the order
// of parameters(), each parameter's elements in its own row-major order), and a hash of parameter values for the
// check that every rank holds the same model.
#pragma once

#include "../core/error.hpp"
#include "../core/param.hpp"
#include "../core/parallel.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace dea::dist {

/// Elements of every gradient of `ps`.
template <class S>
std::size_t grad_size(const ParamList<S>& ps) {
  std::size_t n = 0;
  for (const Param<S>* p : ps) n += static_cast<std::size_t>(p->grad.size());
  return n;
}

/// out[offset(p) + i] = scale * p->grad[i] for every parameter (out holds grad_size(ps) elements). scale 1 copies
/// the bits; a power of two scales exactly (outside the subnormal range).
template <class S>
void flatten_grads(const ParamList<S>& ps, S* out, S scale = S(1)) {
  std::vector<std::size_t> off(ps.size() + 1, 0);
  for (std::size_t i = 0; i < ps.size(); ++i) off[i + 1] = off[i] + static_cast<std::size_t>(ps[i]->grad.size());
  parallel_for(
      static_cast<Index>(ps.size()),
      [&](Index i) {
        const Param<S>& p = *ps[static_cast<std::size_t>(i)];
        S* o = out + off[static_cast<std::size_t>(i)];
        if (scale == S(1)) {
          if (p.grad.size()) std::memcpy(o, p.grad.data(), sizeof(S) * static_cast<std::size_t>(p.grad.size()));
        } else {
          for (Index k = 0; k < p.grad.size(); ++k) o[k] = scale * p.grad[k];
        }
      },
      off.back() >= (std::size_t(1) << 16));
}

/// p->grad = in[offset(p) ..] for every parameter (the inverse of flatten_grads with scale 1).
template <class S>
void unflatten_grads(const ParamList<S>& ps, const S* in) {
  std::size_t off = 0;
  for (Param<S>* p : ps) {
    if (p->grad.size()) std::memcpy(p->grad.data(), in + off, sizeof(S) * static_cast<std::size_t>(p->grad.size()));
    off += static_cast<std::size_t>(p->grad.size());
  }
}

/// A 64-bit hash of bytes (a word-wise multiply-xorshift mix; not cryptographic: it tells two copies apart).
class Hash64 {
public:
  Hash64& add(const void* data, std::size_t bytes) {
    const unsigned char* b = static_cast<const unsigned char*>(data);
    std::size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
      std::uint64_t w;
      std::memcpy(&w, b + i, 8);
      word(w);
    }
    std::uint64_t tail = 0;
    for (std::size_t k = 0; i + k < bytes; ++k) tail |= std::uint64_t(b[i + k]) << (8 * k);
    word(tail ^ (std::uint64_t(bytes) << 56));
    return *this;
  }
  Hash64& add_u64(std::uint64_t v) { return add(&v, sizeof v); }
  std::uint64_t value() const {
    std::uint64_t z = h_ + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

private:
  void word(std::uint64_t w) {
    h_ ^= w * 0x9e3779b97f4a7c15ULL;
    h_ = (h_ << 27 | h_ >> 37) * 0xbf58476d1ce4e5b9ULL + 0x94d049bb133111ebULL;
  }
  std::uint64_t h_ = 0x243f6a8885a308d3ULL;
};

/// The hash of every parameter's name, shape and value bits, in parameter order.
template <class S>
std::uint64_t parameter_hash(const ParamList<S>& ps) {
  Hash64 h;
  for (const Param<S>* p : ps) {
    h.add(p->name.data(), p->name.size());
    for (Index d : p->shape) h.add_u64(static_cast<std::uint64_t>(d));
    h.add(p->value.data(), sizeof(S) * static_cast<std::size_t>(p->value.size()));
  }
  return h.value();
}

}  // namespace dea::dist
