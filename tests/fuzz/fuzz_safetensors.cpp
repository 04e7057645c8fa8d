// Fuzz target: safetensors parsing (dea/io/safetensors.hpp), from memory and from a file.
// Properties of an accepted file: every tensor reads as double or is refused with dea::Error; the set
// serialises, and the serialised image parses back to the same image (names, dtypes, shapes, bytes, metadata).
#include "fuzz_util.hpp"

#include <dea/io/safetensors.hpp>

#include <cstdint>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using dea::io::SafeTensors;
  SafeTensors st;
  try {
    st = SafeTensors::parse(data, size, "fuzz");
  } catch (const dea::Error&) {
    return 0;
  }
  for (const std::string& name : st.names()) {
    try {
      const dea::Tensor<double> t = st.get<double>(name);
      dea_fuzz::fuzz_require(t.numel() == st.numel(name), "get<double> returns numel elements");
    } catch (const dea::Error&) {
    }
    try {
      (void)st.get<std::int32_t>(name);
    } catch (const dea::Error&) {
    }
  }
  const std::vector<std::uint8_t> image = st.serialize();
  const SafeTensors back = SafeTensors::parse(image, "fuzz-roundtrip");
  dea_fuzz::fuzz_require(back.serialize() == image, "serialize -> parse -> serialize is the identity");
  dea_fuzz::fuzz_require(back.names() == st.names() && back.metadata() == st.metadata(), "round trip keeps names");
  // The file path reads what the in-memory parser reads.
  const SafeTensors from_file = SafeTensors::load(dea_fuzz::write_temp("safetensors", data, size));
  dea_fuzz::fuzz_require(from_file.serialize() == image, "load(file) equals parse(bytes)");
  return 0;
}
