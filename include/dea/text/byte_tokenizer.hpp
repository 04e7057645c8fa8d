// dea/text/byte_tokenizer.hpp: the byte-level tokenizer of the decoder language model (train/lm.hpp): every byte
// of the text is one token, its id the byte's value 0..255. Any input encodes (UTF-8, invalid UTF-8, binary data,
// NUL bytes) and decode(encode(s)) == s byte for byte. There are no special ids: the vocabulary is exactly the 256
// byte values (vocab_size() == 256), so every id a model over it produces decodes.
#pragma once

#include "../core/error.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dea::data {

class ByteTokenizer {
public:
  /// The number of ids: 256 (ids 0..255, one per byte value).
  static constexpr std::int64_t kVocabSize = 256;
  static constexpr std::int64_t vocab_size() { return kVocabSize; }

  /// The ids of the bytes of `text`, one per byte (the unsigned byte value).
  static std::vector<std::int64_t> encode(std::string_view text) {
    std::vector<std::int64_t> ids(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }

  /// The bytes of `ids`; an id outside [0, 256) is a dea::Error naming its position and value.
  static std::string decode(const std::vector<std::int64_t>& ids) {
    std::string out(ids.size(), '\0');
    for (std::size_t i = 0; i < ids.size(); ++i) {
      check(ids[i] >= 0 && ids[i] < kVocabSize, "ByteTokenizer::decode: ids[", i, "]: expected an id in [0, 256), got ",
            ids[i]);
      out[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
    }
    return out;
  }
};

}  // namespace dea::data
