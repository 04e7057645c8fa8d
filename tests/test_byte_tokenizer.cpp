// The byte tokenizer of the decoder language model (text/byte_tokenizer.hpp): one id per byte, any input.
#include <dea/text/byte_tokenizer.hpp>

#include <catch2/catch.hpp>

#include <string>
#include <vector>

namespace test_byte_tokenizer {

using dea::data::ByteTokenizer;

TEST_CASE("byte tokenizer: ids are the byte values", "[byte_tokenizer]") {
  REQUIRE(ByteTokenizer::vocab_size() == 256);
  // 'A' = 0x41, NUL, 0xFF, the two bytes of U+00E9 in UTF-8 (0xC3 0xA9)
  const std::string s("A\0\xff\xc3\xa9", 5);
  const std::vector<std::int64_t> ids = ByteTokenizer::encode(s);
  REQUIRE(ids == std::vector<std::int64_t>{65, 0, 255, 195, 169});
  REQUIRE(ByteTokenizer::encode("").empty());
}

TEST_CASE("byte tokenizer: decode(encode(s)) == s for every byte value and invalid UTF-8", "[byte_tokenizer]") {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  REQUIRE(ByteTokenizer::decode(ByteTokenizer::encode(all)) == all);
  // invalid UTF-8: a lone continuation byte, a truncated sequence, an overlong encoding, a surrogate, NULs
  const std::string bad("\x80 x \xe2\x82 \xc0\xaf \xed\xa0\x80\0\0end", 18);
  REQUIRE(ByteTokenizer::decode(ByteTokenizer::encode(bad)) == bad);
  REQUIRE(ByteTokenizer::decode(ByteTokenizer::encode(bad)).size() == 18);
}

TEST_CASE("byte tokenizer: decode refuses ids outside [0, 256)", "[byte_tokenizer]") {
  REQUIRE_THROWS_WITH(ByteTokenizer::decode({65, 256}), Catch::Contains("ids[1]") && Catch::Contains("got 256"));
  REQUIRE_THROWS_WITH(ByteTokenizer::decode({-1}), Catch::Contains("ids[0]") && Catch::Contains("got -1"));
  REQUIRE(ByteTokenizer::decode({104, 105}) == "hi");
}

}  // namespace test_byte_tokenizer
