// Tests of dea/io/safetensors.hpp: the golden files, round trips of every dtype, conversions, validation of
// malformed input (each rule with a hand-made buffer), parameters by name, and atomic saving.
//
// Expected values for the golden files were read with Python's struct/json modules, independently of this reader.
#include <catch2/catch.hpp>
#include <dea/io/safetensors.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

// (the file in a namespace of its own: a test program compiles several test files as one translation unit)
namespace test_safetensors {

using namespace dea;
using namespace dea::io;
namespace fs = std::filesystem;
using Catch::Contains;

namespace {

const std::string kGolden = std::string(DEA_TEST_DATA_DIR) + "/golden";

// A file image: 8-byte little-endian N (the header's length unless `n_override` is given), the header, then
// `data` bytes.
std::vector<std::uint8_t> make_file(const std::string& header, const std::vector<std::uint8_t>& data = {},
                                    std::uint64_t n_override = ~std::uint64_t(0)) {
  const std::uint64_t n = n_override == ~std::uint64_t(0) ? header.size() : n_override;
  std::vector<std::uint8_t> out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<std::uint8_t> zeros(std::size_t n) { return std::vector<std::uint8_t>(n, 0); }

std::vector<std::uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<std::uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::vector<std::uint8_t>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// Parses `buf` and expects a dea::Error whose message names the source and contains `needle`.
void expect_bad(const std::vector<std::uint8_t>& buf, const std::string& needle) {
  const std::string src = "bad_case.safetensors";
  INFO("expecting an error containing: " << needle);
  try {
    (void)SafeTensors::parse(buf.data(), buf.size(), src);
    FAIL("no error was thrown");
  } catch (const dea::Error& e) {
    const std::string m = e.what();
    INFO("message: " << m);
    CHECK(m.find(src) != std::string::npos);
    CHECK(m.find(needle) != std::string::npos);
  }
}

// A fresh directory under the system temp dir, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
#if defined(__unix__) || defined(__APPLE__)
    const long pid = static_cast<long>(::getpid());
#else
    const long pid = 0;
#endif
    path = fs::temp_directory_path() / ("dea_test_safetensors_" + std::to_string(pid) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::vector<std::string> listing() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
};

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Compares two sets completely: names, dtypes, shapes, metadata and the bytes of every tensor (via serialize).
void require_same(const SafeTensors& a, const SafeTensors& b) {
  REQUIRE(a.names() == b.names());
  REQUIRE(a.metadata() == b.metadata());
  for (const auto& n : a.names()) {
    REQUIRE(a.dtype(n) == b.dtype(n));
    REQUIRE(a.shape(n) == b.shape(n));
    REQUIRE(a.nbytes(n) == b.nbytes(n));
  }
  REQUIRE(a.serialize() == b.serialize());
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Golden files
// ---------------------------------------------------------------------------------------------------------------

TEST_CASE("golden files: every file loads, every tensor reads, counts and dtypes match", "[io][safetensors]") {
  struct Expect {
    const char* file;
    std::size_t tensors, metadata, f64, i64, boolean;
    const char* kind;
  };
  const Expect cases[] = {
      {"layer_basic.safetensors", 34, 10, 33, 1, 0, "dea_layer"},
      {"layer_inference.safetensors", 31, 5, 31, 0, 0, "dea_layer"},
      {"layer_masked_block.safetensors", 34, 10, 33, 0, 1, "dea_layer"},
      {"model_cls.safetensors", 102, 13, 98, 3, 1, "dea_model"},
      {"tr_mha/v1_basic.safetensors", 38, 72, 36, 2, 0, "tr_mha_layer"},
      {"tr_mha/v2_init_neutral.safetensors", 35, 70, 33, 2, 0, "tr_mha_layer"},
      {"tr_mha/v2_qv_basic.safetensors", 34, 69, 32, 2, 0, "tr_mha_layer"},
      {"tr_mha/v2_v_only.safetensors", 34, 69, 32, 2, 0, "tr_mha_layer"},
  };
  // Every golden file on disk is in the table (a new file must be added here).
  std::size_t on_disk = 0;
  for (const char* sub : {"", "/tr_mha"})
    for (const auto& e : fs::directory_iterator(kGolden + sub))
      if (e.path().extension() == ".safetensors") ++on_disk;
  REQUIRE(on_disk == std::size(cases));

  for (const Expect& c : cases) {
    const std::string path = kGolden + "/" + c.file;
    INFO(path);
    const SafeTensors st = SafeTensors::load(path);
    REQUIRE(st.source() == path);
    REQUIRE(st.size() == c.tensors);
    REQUIRE(st.metadata().size() == c.metadata);
    REQUIRE(st.metadata().at("kind") == c.kind);
    std::size_t f64 = 0, i64 = 0, b = 0;
    const auto names = st.names();
    REQUIRE(std::is_sorted(names.begin(), names.end()));
    for (const auto& n : names) {
      INFO(n);
      switch (st.dtype(n)) {
        case DType::F64: {
          ++f64;
          const Tensor<double> t = st.get<double>(n);
          REQUIRE(t.shape == st.shape(n));
          REQUIRE(t.numel() * 8 == static_cast<Index>(st.nbytes(n)));
          break;
        }
        case DType::I64: {
          ++i64;
          const Tensor<std::int64_t> t = st.get<std::int64_t>(n);
          REQUIRE(t.numel() * 8 == static_cast<Index>(st.nbytes(n)));
          break;
        }
        case DType::BOOL: {
          ++b;
          const Tensor<std::uint8_t> t = st.get<std::uint8_t>(n);
          for (Index i = 0; i < t.numel(); ++i) REQUIRE((t[i] == 0 || t[i] == 1));
          break;
        }
        default:
          FAIL("unexpected dtype " << dtype_name(st.dtype(n)));
      }
    }
    REQUIRE(f64 == c.f64);
    REQUIRE(i64 == c.i64);
    REQUIRE(b == c.boolean);

    // parse() of the same bytes gives the same set; writing it and reading it back changes nothing.
    const auto bytes = read_bytes(path);
    const SafeTensors again = SafeTensors::parse(bytes.data(), bytes.size(), path);
    require_same(st, again);
    const auto out = st.serialize();
    require_same(st, SafeTensors::parse(out, "reserialized"));
  }
}

TEST_CASE("golden layer_basic: names, shapes, dtypes, values and metadata", "[io][safetensors]") {
  const SafeTensors st = SafeTensors::load(kGolden + "/layer_basic.safetensors");
  REQUIRE(st.has("W_rel"));
  REQUIRE(st.dtype("W_rel") == DType::F64);
  REQUIRE(st.shape("W_rel") == Shape{4, 8, 8});
  REQUIRE(st.dtype("in.target_idx") == DType::I64);
  REQUIRE(st.shape("in.target_idx") == Shape{2, 6});
  REQUIRE(st.shape("W_gate") == Shape{4, 18});
  REQUIRE(st.shape("W_q.weight") == Shape{32, 32});
  REQUIRE(st.shape("W_q.bias") == Shape{32});
  REQUIRE(st.shape("out.attn") == Shape{2, 4, 6, 6});
  REQUIRE(st.shape("out.loss_gate").empty());  // a scalar
  REQUIRE(st.numel("out.loss_gate") == 1);
  REQUIRE_FALSE(st.has("in.key_mask"));

  REQUIRE(st.metadata().at("kind") == "dea_layer");
  REQUIRE(st.metadata().at("d_model") == "32");
  REQUIRE(st.metadata().at("n_heads") == "4");
  REQUIRE(st.metadata().at("gamma_mix") == "0.5");
  REQUIRE(st.metadata().at("stats.n_decision_pairs") == "82");

  const auto tgt = st.get<std::int64_t>("in.target_idx");
  const std::int64_t expect_tgt[] = {1, 4, -1, 5, -1, 0, 5, 5, -1, 5, 2, -1};
  REQUIRE(tgt.numel() == 12);
  for (int i = 0; i < 12; ++i) REQUIRE(tgt[i] == expect_tgt[i]);

  const auto w = st.get<double>("W_rel");
  REQUIRE(w.numel() == 256);
  REQUIRE(w[0] == 0.5945471542357665);
  REQUIRE(w[1] == 0.1568840805151666);
  REQUIRE(w[2] == 0.18917971882717197);
  REQUIRE(w[255] == -0.5220369459619674);
  REQUIRE(st.get<double>("out.loss_gate")[0] == 1.1419474438962278);

  // The oracle carries NaN for "no label"; NaN survives reading.
  const auto a = st.get<double>("in.alpha_oracle");
  REQUIRE(a[0] == 0.5118216247002567);
  REQUIRE(std::isnan(a[3]));
  REQUIRE(std::isnan(a[9]));
  REQUIRE(a[10] == 0.7535131086748066);

  // F64 read as float: rounded to nearest.
  REQUIRE(st.get<float>("W_rel")[0] == static_cast<float>(0.5945471542357665));
  // I64 read as int32 and as double (small values are exact).
  REQUIRE(st.get<std::int32_t>("in.target_idx")[2] == -1);
  REQUIRE(st.get<double>("in.target_idx")[3] == 5.0);
}

TEST_CASE("golden layer_masked_block, model_cls, tr_mha: masks, ids, scalars", "[io][safetensors]") {
  {
    const SafeTensors st = SafeTensors::load(kGolden + "/layer_masked_block.safetensors");
    REQUIRE(st.dtype("in.key_mask") == DType::BOOL);
    REQUIRE(st.shape("in.key_mask") == Shape{2, 9});
    REQUIRE(st.shape("W_rel") == Shape{4, 16, 16});
    REQUIRE(st.metadata().at("d_model") == "64");
    REQUIRE(st.metadata().at("gamma_mix") == "0.25");
    const auto m = st.get<std::uint8_t>("in.key_mask");
    const auto mb = st.get<bool>("in.key_mask");
    for (int i = 0; i < 18; ++i) {
      REQUIRE(m[i] == (i < 15 ? 1 : 0));
      REQUIRE(mb[i] == (i < 15));
    }
  }
  {
    const SafeTensors st = SafeTensors::load(kGolden + "/layer_inference.safetensors");
    REQUIRE_FALSE(st.has("in.alpha_oracle"));
    REQUIRE(st.shape("in.x") == Shape{1, 7, 64});
    REQUIRE(st.metadata().at("n_heads") == "8");
  }
  {
    const SafeTensors st = SafeTensors::load(kGolden + "/model_cls.safetensors");
    REQUIRE(st.metadata().at("task") == "cls");
    REQUIRE(st.metadata().at("tied") == "mlm_head.weight=tok_emb.weight");
    REQUIRE(st.shape("tok_emb.weight") == Shape{50, 32});
    REQUIRE(st.shape("layers.1.ff.0.weight") == Shape{64, 32});
    const auto labels = st.get<std::int64_t>("in.labels");
    REQUIRE(labels.shape == Shape{3});
    REQUIRE(labels[0] == 0);
    REQUIRE(labels[1] == 1);
    REQUIRE(labels[2] == 0);
    const auto ids = st.get<std::int64_t>("in.input_ids");
    const std::int64_t expect_ids[] = {2, 44, 41, 26, 41, 3, 38, 28, 10, 3};
    for (int i = 0; i < 10; ++i) REQUIRE(ids[i] == expect_ids[i]);
    const auto mask = st.get<std::uint8_t>("in.attention_mask");
    const int expect_mask[30] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0};
    for (int i = 0; i < 30; ++i) REQUIRE(mask[i] == expect_mask[i]);
  }
  {
    const SafeTensors st = SafeTensors::load(kGolden + "/tr_mha/v1_basic.safetensors");
    REQUIRE(st.metadata().at("case") == "v1_basic");
    REQUIRE(st.metadata().at("hidden_size") == "32");
    REQUIRE(st.shape("adapter_output_gate").empty());
    REQUIRE(st.get<double>("adapter_output_gate")[0] == 0.5);
    REQUIRE(st.shape("q_adapter_down") == Shape{4, 32, 4});
    const auto r = st.get<std::int64_t>("out.route_idx");
    REQUIRE(r.shape == Shape{2, 6, 2});
    const std::int64_t expect_r[] = {0, 2, 3, 2, 1, 2};
    for (int i = 0; i < 6; ++i) REQUIRE(r[i] == expect_r[i]);
    // An I64 tensor is not silently read as a mask-like bool when it holds 2 or 3.
    REQUIRE_THROWS_WITH(st.get<bool>("out.route_idx"), Contains("cannot be represented as bool"));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Writing and round trips
// ---------------------------------------------------------------------------------------------------------------

TEST_CASE("the written byte layout follows the format", "[io][safetensors]") {
  SafeTensors st;
  Tensor<float> a(Shape{2});
  a[0] = 1.0f;   // IEEE binary32 0x3F800000
  a[1] = -2.0f;  // 0xC0000000
  st.put("a", a);
  Tensor<std::int64_t> b(Shape{});
  b[0] = -2;  // 0xFFFFFFFFFFFFFFFE
  st.put("b", b);
  st.set_metadata("k", "v");
  const auto bytes = st.serialize();

  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<std::size_t>(i)];
  REQUIRE(n % 8 == 0);  // padded so the data part is aligned
  REQUIRE(bytes.size() == 8 + n + 8 + 8);
  const auto header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  REQUIRE(header["__metadata__"] == nlohmann::json({{"k", "v"}}));
  REQUIRE(header["a"]["dtype"] == "F32");
  REQUIRE(header["a"]["shape"] == nlohmann::json::array({2}));
  REQUIRE(header["a"]["data_offsets"] == nlohmann::json::array({0, 8}));
  REQUIRE(header["b"]["dtype"] == "I64");
  REQUIRE(header["b"]["shape"] == nlohmann::json::array());
  REQUIRE(header["b"]["data_offsets"] == nlohmann::json::array({8, 16}));
  const std::vector<std::uint8_t> data(bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n), bytes.end());
  const std::vector<std::uint8_t> expect = {0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0xC0,
                                            0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
  REQUIRE(data == expect);
}

TEST_CASE("round trip of every dtype, scalars, empty tensors and metadata", "[io][safetensors]") {
  SafeTensors st("roundtrip");
  Tensor<float> f(Shape{2, 3});
  const float fv[] = {0.0f, -0.0f, 1.5f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min(),
                      std::numeric_limits<float>::quiet_NaN()};
  for (int i = 0; i < 6; ++i) f[i] = fv[i];
  Tensor<double> d(Shape{3});
  d[0] = 1.0 / 3.0;
  d[1] = -1e300;
  d[2] = std::numeric_limits<double>::quiet_NaN();
  Tensor<std::int32_t> i32(Shape{2});
  i32[0] = std::numeric_limits<std::int32_t>::min();
  i32[1] = std::numeric_limits<std::int32_t>::max();
  Tensor<std::int64_t> i64(Shape{1, 2});
  i64[0] = std::numeric_limits<std::int64_t>::min();
  i64[1] = std::numeric_limits<std::int64_t>::max();
  Tensor<std::uint8_t> u8(Shape{3});
  u8[0] = 0;
  u8[1] = 7;
  u8[2] = 255;
  Tensor<bool> bl(Shape{2, 2});
  bl[0] = true;
  bl[1] = false;
  bl[2] = false;
  bl[3] = true;
  Tensor<double> scalar(Shape{});
  scalar[0] = 42.25;
  Tensor<float> empty1(Shape{0});
  Tensor<double> empty2(Shape{2, 0, 3});
  Tensor<bool> empty3(Shape{0, 5});

  st.put("f32", f);
  st.put("f64", d);
  st.put("i32", i32);
  st.put("i64", i64);
  st.put("u8", u8);
  st.put("bool", bl);
  st.put("scalar", scalar);
  st.put("empty.f32", empty1);
  st.put("empty.f64", empty2);
  st.put("empty.bool", empty3);
  st.set_metadata("kind", "test");
  st.set_metadata("unicode", "\xce\xb1 = 0.5");  // "α = 0.5"
  st.set_metadata("empty", "");

  const auto bytes = st.serialize();
  const SafeTensors back = SafeTensors::parse(bytes, "reparsed");
  require_same(st, back);
  REQUIRE(back.serialize() == bytes);  // saved bytes re-parse identically
  REQUIRE(back.metadata().at("unicode") == "\xce\xb1 = 0.5");
  REQUIRE(back.metadata().at("empty").empty());

  REQUIRE(back.dtype("f32") == DType::F32);
  REQUIRE(back.dtype("f64") == DType::F64);
  REQUIRE(back.dtype("i32") == DType::I32);
  REQUIRE(back.dtype("i64") == DType::I64);
  REQUIRE(back.dtype("u8") == DType::U8);
  REQUIRE(back.dtype("bool") == DType::BOOL);
  REQUIRE(back.nbytes("bool") == 4);
  REQUIRE(back.nbytes("i32") == 8);

  const auto f2 = back.get<float>("f32");
  REQUIRE(f2.shape == Shape{2, 3});
  for (int i = 0; i < 5; ++i) REQUIRE(std::memcmp(&f2[i], &fv[i], 4) == 0);  // bit-exact, incl. -0 and denormal
  REQUIRE(std::isnan(f2[5]));
  const auto d2 = back.get<double>("f64");
  REQUIRE(same_bits(d2[0], 1.0 / 3.0));
  REQUIRE(d2[1] == -1e300);
  REQUIRE(std::isnan(d2[2]));
  REQUIRE(back.get<std::int32_t>("i32")[0] == std::numeric_limits<std::int32_t>::min());
  REQUIRE(back.get<std::int32_t>("i32")[1] == std::numeric_limits<std::int32_t>::max());
  REQUIRE(back.get<std::int64_t>("i64")[0] == std::numeric_limits<std::int64_t>::min());
  REQUIRE(back.get<std::int64_t>("i64")[1] == std::numeric_limits<std::int64_t>::max());
  REQUIRE(back.get<std::int64_t>("i64").shape == Shape{1, 2});
  REQUIRE(back.get<std::uint8_t>("u8")[2] == 255);
  const auto b2 = back.get<bool>("bool");
  REQUIRE((b2[0] && !b2[1] && !b2[2] && b2[3]));
  const auto s2 = back.get<double>("scalar");
  REQUIRE(s2.shape.empty());
  REQUIRE(s2.numel() == 1);
  REQUIRE(s2[0] == 42.25);
  REQUIRE(back.get<float>("empty.f32").shape == Shape{0});
  REQUIRE(back.get<double>("empty.f64").shape == Shape{2, 0, 3});
  REQUIRE(back.get<double>("empty.f64").numel() == 0);
  REQUIRE(back.get<bool>("empty.bool").shape == Shape{0, 5});

  // An empty set is a valid file too.
  const SafeTensors none;
  const auto nb = none.serialize();
  const SafeTensors none2 = SafeTensors::parse(nb, "empty");
  REQUIRE(none2.empty());
  REQUIRE(none2.metadata().empty());

  // put replaces; erase removes.
  SafeTensors w;
  w.put("x", scalar);
  Tensor<std::int32_t> x2(Shape{2}, 5);
  w.put("x", x2);
  REQUIRE(w.dtype("x") == DType::I32);
  REQUIRE(w.shape("x") == Shape{2});
  REQUIRE(w.erase("x"));
  REQUIRE_FALSE(w.erase("x"));
  REQUIRE_FALSE(w.has("x"));
}

TEST_CASE("put stores in the requested dtype and refuses lossy conversions", "[io][safetensors]") {
  SafeTensors st("conv");
  Tensor<double> d(Shape{3});
  d[0] = 0.1;
  d[1] = -2.5;
  d[2] = 3.0;
  st.put("as_f32", d, DType::F32);
  REQUIRE(st.dtype("as_f32") == DType::F32);
  REQUIRE(st.nbytes("as_f32") == 12);
  REQUIRE(st.get<float>("as_f32")[0] == 0.1f);
  REQUIRE(st.get<double>("as_f32")[0] == static_cast<double>(0.1f));

  // floating data as an integer dtype: refused, whatever the values.
  REQUIRE_THROWS_WITH(st.put("bad", d, DType::I64), Contains("cannot be stored as I64"));
  REQUIRE_THROWS_WITH(st.put("bad", d, DType::BOOL), Contains("cannot be stored as BOOL"));
  REQUIRE_FALSE(st.has("bad"));
  // out of range for the target dtype
  Tensor<std::int64_t> i(Shape{2});
  i[0] = 1;
  i[1] = -1;
  REQUIRE_THROWS_WITH(st.put("bad", i, DType::U8), Contains("element 1 (value -1)"));
  i[1] = std::int64_t(1) << 40;
  REQUIRE_THROWS_WITH(st.put("bad", i, DType::I32), Contains("cannot be stored as I32"));
  i[1] = 2;
  REQUIRE_THROWS_WITH(st.put("bad", i, DType::BOOL), Contains("cannot be stored as BOOL"));
  i[1] = 0;
  st.put("ok_bool", i, DType::BOOL);
  REQUIRE(st.get<std::uint8_t>("ok_bool")[0] == 1);
  st.put("ok_f64", i, DType::F64);
  REQUIRE(st.get<double>("ok_f64")[0] == 1.0);
  // double beyond float range
  d[1] = 1e300;
  REQUIRE_THROWS_WITH(st.put("bad", d, DType::F32), Contains("element 1"));
  REQUIRE_FALSE(st.has("bad"));

  // bad names and inconsistent tensors
  REQUIRE_THROWS_WITH(st.put("", d), Contains("must not be empty"));
  REQUIRE_THROWS_WITH(st.put("__metadata__", d), Contains("reserved"));
  REQUIRE_THROWS_WITH(st.put("bad\xff", d), Contains("not valid UTF-8"));
  REQUIRE_THROWS_WITH(st.set_metadata("k", "bad\xc3"), Contains("not valid UTF-8"));
  Tensor<double> broken(Shape{2, 2});
  broken.shape = {3, 3};
  REQUIRE_THROWS_WITH(st.put("broken", broken), Contains("[3, 3]"));
  REQUIRE_THROWS_AS(st.put("neg", Shape{-1}, d.ptr(), DType::F64), dea::Error);
}

TEST_CASE("get converts numerically and refuses nonsense", "[io][safetensors]") {
  SafeTensors st("conv_src");
  Tensor<double> d(Shape{2}, 1.0);
  d[1] = 1e300;
  st.put("f64", d);
  Tensor<float> f(Shape{2}, 0.5f);
  st.put("f32", f);
  Tensor<std::int64_t> big(Shape{3});
  big[0] = 3;
  big[1] = -4;
  big[2] = (std::int64_t(1) << 60) + 1;
  st.put("i64", big);
  Tensor<std::uint8_t> u(Shape{3});
  u[0] = 0;
  u[1] = 1;
  u[2] = 2;
  st.put("u8", u);
  Tensor<bool> b(Shape{2});
  b[0] = true;
  b[1] = false;
  st.put("bool", b);
  Tensor<std::int32_t> i32(Shape{2});
  i32[0] = -7;
  i32[1] = 300;
  st.put("i32", i32);

  // floating -> integer: always an error that names the tensor, the dtype and the requested type
  REQUIRE_THROWS_WITH(st.get<std::int64_t>("f32"), Contains("'f32' has dtype F32") && Contains("int64"));
  REQUIRE_THROWS_WITH(st.get<std::int32_t>("f64"), Contains("F64") && Contains("conv_src"));
  REQUIRE_THROWS_AS(st.get<std::uint8_t>("f64"), dea::Error);
  REQUIRE_THROWS_AS(st.get<bool>("f32"), dea::Error);
  // F64 -> float: finite values beyond float's range are reported
  REQUIRE_THROWS_WITH(st.get<float>("f64"), Contains("element 1"));
  REQUIRE(st.get<double>("f32")[0] == 0.5);
  // integer widths and ranges
  REQUIRE(st.get<std::int64_t>("i32")[1] == 300);
  REQUIRE_THROWS_WITH(st.get<std::uint8_t>("i32"), Contains("element 0 (value -7)"));
  REQUIRE_THROWS_WITH(st.get<std::int32_t>("i64"), Contains("element 2"));
  REQUIRE(st.get<double>("i32")[0] == -7.0);
  REQUIRE_THROWS_WITH(st.get<double>("i64"), Contains("element 2"));  // 2^60 + 1 is not a double
  REQUIRE_THROWS_WITH(st.get<float>("i64"), Contains("element 2"));
  // BOOL and U8
  REQUIRE(st.get<std::uint8_t>("bool")[0] == 1);
  REQUIRE(st.get<std::int64_t>("bool")[1] == 0);
  REQUIRE(st.get<double>("bool")[0] == 1.0);
  REQUIRE_THROWS_WITH(st.get<bool>("u8"), Contains("element 2 (value 2)"));
  REQUIRE(st.get<std::int32_t>("u8")[2] == 2);
  // missing names
  REQUIRE_THROWS_WITH(st.get<double>("nope"), Contains("no tensor named 'nope'") && Contains("conv_src"));
  REQUIRE_THROWS_AS(st.shape("nope"), dea::Error);
  REQUIRE_THROWS_AS(st.dtype("nope"), dea::Error);
  // get_into checks the destination size
  double buf[3];
  REQUIRE_THROWS_WITH(st.get_into("f64", buf, 3), Contains("has 2 elements"));
  st.get_into("f64", buf, 2);
  REQUIRE(buf[0] == 1.0);
}

TEST_CASE("a BOOL byte other than 0/1 reads as true", "[io][safetensors]") {
  const auto buf = make_file(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", {0, 1, 7});
  const SafeTensors st = SafeTensors::parse(buf, "bools");
  const auto m = st.get<std::uint8_t>("m");
  REQUIRE(m[0] == 0);
  REQUIRE(m[1] == 1);
  REQUIRE(m[2] == 1);
  // and it is written back as 1
  const SafeTensors back = SafeTensors::parse(st.serialize(), "bools2");
  REQUIRE(back.get<std::int32_t>("m")[2] == 1);
}

// ---------------------------------------------------------------------------------------------------------------
// Validation of malformed input
// ---------------------------------------------------------------------------------------------------------------

TEST_CASE("validation: size prefix and header length", "[io][safetensors][validation]") {
  expect_bad({}, "shorter than the 8-byte");
  expect_bad({1, 0, 0, 0, 0, 0, 0}, "shorter than the 8-byte");
  // N larger than what follows
  expect_bad(make_file("{}", {}, 200), "truncated");
  expect_bad(make_file("{}", {}, 3), "only 2 bytes follow");
  // N absurd: no allocation is attempted
  expect_bad(make_file("{}", {}, ~std::uint64_t(0) - 1), "sane maximum");
  expect_bad(make_file("{}", {}, std::uint64_t(1) << 40), "sane maximum");
  expect_bad(make_file("{}", {}, SafeTensors::max_header_bytes + 1), "sane maximum");
  // N = 0: an empty header is not JSON
  expect_bad(make_file(""), "not valid JSON");
  // The file boundary: N = exactly what follows is fine.
  REQUIRE_NOTHROW(SafeTensors::parse(make_file("{}"), "ok"));
  REQUIRE_THROWS_AS(SafeTensors::parse(nullptr, 16, "null"), dea::Error);
}

TEST_CASE("validation: header JSON", "[io][safetensors][validation]") {
  expect_bad(make_file("{\"a\": "), "not valid JSON");
  expect_bad(make_file("not json"), "not valid JSON");
  expect_bad(make_file("{} trailing"), "not valid JSON");
  expect_bad(make_file("{\"a\xff\": 1}"), "not valid JSON");  // invalid UTF-8
  expect_bad(make_file("[1, 2]"), "not a JSON object");
  expect_bad(make_file("\"str\""), "not a JSON object");
  expect_bad(make_file("null"), "not a JSON object");
  // deep nesting is refused before parsing (io/json_limits.hpp: more than 64 levels)
  expect_bad(make_file(std::string(20000, '[')), "deeper than 64 levels");
  expect_bad(make_file(std::string(20000, '[') + std::string(20000, ']')), "deeper than 64 levels");
  expect_bad(make_file(std::string(64, '[') + std::string(64, ']')), "not a JSON object");  // 64 levels parse
  // trailing spaces (the usual padding) are fine
  REQUIRE(SafeTensors::parse(make_file("{}      "), "pad").empty());
}

TEST_CASE("validation: entry fields and types", "[io][safetensors][validation]") {
  const auto d8 = zeros(8);
  expect_bad(make_file(R"({"a": 5})", d8), "'a': entry must be a JSON object");
  expect_bad(make_file(R"({"a": {"shape":[1],"data_offsets":[0,8]}})", d8), "no \"dtype\" field");
  expect_bad(make_file(R"({"a": {"dtype":"F64","data_offsets":[0,8]}})", d8), "no \"shape\" field");
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":[1]}})", d8), "no \"data_offsets\" field");
  expect_bad(make_file(R"({"a": {"dtype":64,"shape":[1],"data_offsets":[0,8]}})", d8), "\"dtype\" must be a string");
  expect_bad(make_file(R"({"a": {"dtype":"F8_E5M2","shape":[8],"data_offsets":[0,8]}})", d8), "unsupported dtype \"F8_E5M2\"");
  expect_bad(make_file(R"({"a": {"dtype":"f64","shape":[1],"data_offsets":[0,8]}})", d8), "unsupported dtype");
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":1,"data_offsets":[0,8]}})", d8), "\"shape\" must be an array");
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":[-1],"data_offsets":[0,8]}})", d8), "negative");
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":[1.5],"data_offsets":[0,8]}})", d8), "not an integer");
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":[1.0],"data_offsets":[0,8]}})", d8), "not an integer");
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":["1"],"data_offsets":[0,8]}})", d8),
             "must be a non-negative integer");
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":[1e30],"data_offsets":[0,8]}})", d8), "not an integer");
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":[99999999999999999999999],"data_offsets":[0,8]}})", d8),
             "not an integer");
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":[1125899906842624],"data_offsets":[0,8]}})", d8),
             "absurd extent");  // 2^50
  expect_bad(make_file(R"({"a": {"dtype":"U8","shape":[1099511627776,1099511627776],"data_offsets":[0,8]}})", d8),
             "overflow");  // 2^40 * 2^40
  std::string deep = "[";
  for (int i = 0; i < 65; ++i) deep += (i ? ",1" : "1");
  deep += "]";
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":)" + deep + R"(,"data_offsets":[0,8]}})", d8), "rank 65");
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":[1],"data_offsets":8}})", d8), "\"data_offsets\" must be");
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":[1],"data_offsets":[0,8,16]}})", d8), "an array of 3");
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":[1],"data_offsets":[-8,0]}})", d8), "begin is negative");
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":[1],"data_offsets":[0,"8"]}})", d8), "data_offsets end");
  expect_bad(make_file(R"({"": {"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", d8), "empty name");
  // unknown extra fields are tolerated
  REQUIRE_NOTHROW(SafeTensors::parse(
      make_file(R"({"a": {"dtype":"F64","shape":[1],"data_offsets":[0,8],"extra":true}})", d8), "extra"));
}

TEST_CASE("validation: offsets, sizes, overlaps, holes", "[io][safetensors][validation]") {
  const auto d16 = zeros(16);
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":[1],"data_offsets":[8,0]}})", d16), "begin > end");
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":[3],"data_offsets":[0,24]}})", d16),
             "outside the data part of 16 bytes");
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":[1],"data_offsets":[16,24]}})", d16), "outside the data part");
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":[1],"data_offsets":[0,18446744073709551615]}})", d16),
             "outside the data part");
  // byte length != numel * dtype size
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":[2],"data_offsets":[0,8]}})", d16), "needs 16 bytes");
  expect_bad(make_file(R"({"a": {"dtype":"F32","shape":[],"data_offsets":[0,8]}})", d16), "needs 4 bytes");
  expect_bad(make_file(R"({"a": {"dtype":"I32","shape":[0],"data_offsets":[0,4]}})", d16), "needs 0 bytes");
  // overlap
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":[1],"data_offsets":[0,8]},
                           "b": {"dtype":"U8","shape":[2],"data_offsets":[7,9]}})",
                       d16),
             "overlap");
  expect_bad(make_file(R"({"a": {"dtype":"F64","shape":[1],"data_offsets":[4,12]},
                           "b": {"dtype":"F64","shape":[1],"data_offsets":[4,12]}})",
                       d16),
             "overlap");
  // touching ranges and empty tensors anywhere are fine; holes and unused trailing bytes are allowed
  std::vector<std::uint8_t> data(32, 0);
  const double v0 = 1.25, v1 = -3.5;
  std::memcpy(data.data() + 0, &v0, 8);
  std::memcpy(data.data() + 16, &v1, 8);
  const auto ok = make_file(R"({"a": {"dtype":"F64","shape":[1],"data_offsets":[0,8]},
                                "b": {"dtype":"F64","shape":[1],"data_offsets":[16,24]},
                                "e": {"dtype":"F64","shape":[0,4],"data_offsets":[4,4]},
                                "t": {"dtype":"U8","shape":[8],"data_offsets":[8,16]}})",
                            data);
  const SafeTensors st = SafeTensors::parse(ok, "holes");
  REQUIRE(st.get<double>("a")[0] == 1.25);
  REQUIRE(st.get<double>("b")[0] == -3.5);
  REQUIRE(st.get<double>("e").shape == Shape{0, 4});
  REQUIRE(st.nbytes("t") == 8);
}

TEST_CASE("validation: metadata", "[io][safetensors][validation]") {
  expect_bad(make_file(R"({"__metadata__": {"k": 1}})"), "metadata value for key 'k' must be a string");
  expect_bad(make_file(R"({"__metadata__": {"k": null}})"), "must be a string");
  expect_bad(make_file(R"({"__metadata__": ["k"]})"), "\"__metadata__\" must be an object");
  expect_bad(make_file(R"({"__metadata__": "k"})"), "\"__metadata__\" must be an object");
  const SafeTensors st = SafeTensors::parse(make_file(R"({"__metadata__": {"a": "1", "b": ""}})"), "md");
  REQUIRE(st.metadata().size() == 2);
  REQUIRE(st.metadata().at("a") == "1");
  REQUIRE(st.empty());
}

TEST_CASE("validation: every truncation and many corruptions of a valid file throw dea::Error only",
          "[io][safetensors][validation]") {
  SafeTensors st("src");
  Tensor<double> a(Shape{3, 2}, 0.25);
  Tensor<std::int64_t> b(Shape{4}, -3);
  Tensor<bool> c(Shape{5}, true);
  st.put("a", a);
  st.put("b", b);
  st.put("c", c);
  st.set_metadata("kind", "x");
  const auto good = st.serialize();
  // Every proper prefix is invalid (the tensors fill the data part completely).
  for (std::size_t len = 0; len < good.size(); ++len) {
    INFO("prefix length " << len);
    const std::vector<std::uint8_t> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len));
    REQUIRE_THROWS_AS(SafeTensors::parse(cut, "cut"), dea::Error);
  }
  // Flipping any one header byte gives either a valid file or dea::Error, never a crash or another exception.
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | good[static_cast<std::size_t>(i)];
  int errors = 0;
  for (std::size_t pos = 0; pos < 8 + n; ++pos)
    for (std::uint8_t x : {std::uint8_t(0x01), std::uint8_t(0x10), std::uint8_t(0x80), std::uint8_t(0xFF)}) {
      auto bad = good;
      bad[pos] ^= x;
      try {
        (void)SafeTensors::parse(bad, "flip");
      } catch (const dea::Error&) {
        ++errors;
      }
    }
  REQUIRE(errors > 0);
}

TEST_CASE("load: missing, directory and truncated files name the path", "[io][safetensors][validation]") {
  TempDir dir;
  const std::string missing = dir.file("nope.safetensors");
  REQUIRE_THROWS_WITH(SafeTensors::load(missing), Contains(missing) && Contains("cannot open"));
  REQUIRE_THROWS_WITH(SafeTensors::load(dir.path.string()), Contains("directory"));

  const auto golden = read_bytes(kGolden + "/layer_basic.safetensors");
  const std::string cut = dir.file("cut.safetensors");
  write_bytes(cut, std::vector<std::uint8_t>(golden.begin(), golden.begin() + 5));
  REQUIRE_THROWS_WITH(SafeTensors::load(cut), Contains(cut) && Contains("shorter than the 8-byte"));
  write_bytes(cut, std::vector<std::uint8_t>(golden.begin(), golden.begin() + 1000));
  REQUIRE_THROWS_WITH(SafeTensors::load(cut), Contains(cut) && Contains("truncated"));
  write_bytes(cut, std::vector<std::uint8_t>(golden.begin(), golden.end() - 1));
  REQUIRE_THROWS_WITH(SafeTensors::load(cut), Contains(cut) && Contains("outside the data part"));
  write_bytes(cut, golden);
  REQUIRE(SafeTensors::load(cut).size() == 34);
}

// ---------------------------------------------------------------------------------------------------------------
// Parameters by name
// ---------------------------------------------------------------------------------------------------------------

namespace {

struct TinyModel {
  Param<double> wq{"W_q.weight", "main", {3, 4}};
  Param<double> wrel{"W_rel", "main", {2, 2, 2}};
  Param<double> c{"c_gate", "gate", {2}};
  Param<double> s{"scale", "main", {}};
  ParamList<double> params() { return {&wq, &wrel, &c, &s}; }
  void fill(double base) {
    int k = 0;
    for (Param<double>* p : params())
      for (Index i = 0; i < p->numel(); ++i) p->value[i] = base + 0.1 * (k++);
  }
};

}  // namespace

TEST_CASE("parameters: save and load by name", "[io][safetensors][params]") {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  TinyModel m;
  m.fill(1.0);
  save_parameters(m.params(), path, {{"kind", "tiny"}, {"d_model", "4"}});

  const SafeTensors st = SafeTensors::load(path);
  REQUIRE(st.names() == std::vector<std::string>{"W_q.weight", "W_rel", "c_gate", "scale"});
  REQUIRE(st.dtype("W_q.weight") == DType::F64);  // double parameters default to F64
  REQUIRE(st.shape("W_rel") == Shape{2, 2, 2});
  REQUIRE(st.shape("scale").empty());
  REQUIRE(st.metadata().at("kind") == "tiny");

  TinyModel r;
  load_parameters(r.params(), st);
  for (std::size_t i = 0; i < 4; ++i) REQUIRE(r.params()[i]->value == m.params()[i]->value);
  REQUIRE(r.wq.value[5] == 1.5);

  // from a path, too
  TinyModel r2;
  load_parameters(r2.params(), path);
  REQUIRE(r2.wrel.value == m.wrel.value);

  // float parameters are stored as F32 by default and read back from an F64 file as well
  Param<float> pf{"W_rel", "main", {2, 2, 2}};
  for (Index i = 0; i < 8; ++i) pf.value[i] = 0.5f * static_cast<float>(i);
  const std::string fpath = dir.file("f32.safetensors");
  save_parameters(ParamList<float>{&pf}, fpath);
  REQUIRE(SafeTensors::load(fpath).dtype("W_rel") == DType::F32);
  Param<float> pf2{"W_rel", "main", {2, 2, 2}};
  load_param(pf2, st);
  REQUIRE(pf2.value[1] == static_cast<float>(m.wrel.value[1]));
  // an explicit dtype
  save_parameters(m.params(), fpath, {}, DType::F32);
  REQUIRE(SafeTensors::load(fpath).dtype("c_gate") == DType::F32);

  // put_parameters / put_gradients with prefixes, load_param under another name
  SafeTensors both;
  m.wrel.grad.setConstant(-2.0);
  put_parameters(both, m.params());
  put_gradients(both, m.params());
  REQUIRE(both.has("grad.W_rel"));
  Param<double> g{"W_rel", "main", {2, 2, 2}};
  load_param(g, both, "grad.W_rel");
  REQUIRE(g.value[7] == -2.0);
}

TEST_CASE("parameters: shape mismatch, missing, unexpected names; all or nothing", "[io][safetensors][params]") {
  TinyModel m;
  m.fill(1.0);
  SafeTensors st("ckpt_src");
  put_parameters(st, m.params());

  // shape mismatch names the parameter, the expected and the stored shape; nothing is modified
  struct Wrong {
    Param<double> wq{"W_q.weight", "main", {4, 3}};
    Param<double> c{"c_gate", "gate", {2}};
  } w;
  w.c.value.setConstant(9.0);
  REQUIRE_THROWS_WITH(load_parameters(ParamList<double>{&w.c, &w.wq}, st, false),
                      Contains("W_q.weight") && Contains("expected shape [4, 3]") && Contains("[3, 4]") &&
                          Contains("ckpt_src"));
  REQUIRE(w.c.value[0] == 9.0);  // c_gate precedes W_q.weight in the list but was not loaded
  REQUIRE_THROWS_WITH(load_param(w.wq, st), Contains("expected shape [4, 3]"));

  // missing parameters are all listed
  Param<double> extra1{"layers.0.attn.W_rel", "main", {2}}, extra2{"ln_f.bias", "main", {2}};
  TinyModel r;
  ParamList<double> plus = r.params();
  plus.push_back(&extra1);
  plus.push_back(&extra2);
  REQUIRE_THROWS_WITH(load_parameters(plus, st),
                      Contains("2 parameter(s) missing") && Contains("'layers.0.attn.W_rel'") && Contains("'ln_f.bias'"));
  REQUIRE(r.wq.value.isZero());
  REQUIRE_THROWS_WITH(load_param(extra2, st), Contains("no tensor 'ln_f.bias'"));

  // strict: a file tensor that matches no parameter is an error unless its prefix is ignored
  Tensor<double> x(Shape{2}, 1.0);
  st.put("in.x", x);
  st.put("grad.W_rel", x);
  REQUIRE_THROWS_WITH(load_parameters(r.params(), st), Contains("match no parameter") && Contains("'in.x'") &&
                                                           Contains("'grad.W_rel'"));
  REQUIRE(r.wq.value.isZero());
  REQUIRE_THROWS_WITH(load_parameters(r.params(), st, true, {"in."}), Contains("'grad.W_rel'"));
  load_parameters(r.params(), st, true, {"in.", "grad."});
  REQUIRE(r.wq.value == m.wq.value);
  TinyModel r2;
  load_parameters(r2.params(), st, false);  // non-strict ignores everything extra
  REQUIRE(r2.c.value == m.c.value);

  // a conversion error (value out of float range) also leaves every parameter untouched
  SafeTensors huge("huge_src");
  put_parameters(huge, m.params());
  Tensor<double> big(Shape{2}, 1e300);
  huge.put("c_gate", big);
  Param<float> fa{"W_rel", "main", {2, 2, 2}}, fc{"c_gate", "gate", {2}};
  fa.value.setConstant(7.0f);
  REQUIRE_THROWS_WITH(load_parameters(ParamList<float>{&fa, &fc}, huge, false), Contains("c_gate"));
  REQUIRE(fa.value[0] == 7.0f);

  // duplicate parameter names
  Param<double> dup{"c_gate", "gate", {2}};
  ParamList<double> dups = m.params();
  dups.push_back(&dup);
  REQUIRE_THROWS_WITH(load_parameters(dups, st, false), Contains("two parameters are named 'c_gate'"));
  SafeTensors sink;
  REQUIRE_THROWS_WITH(put_parameters(sink, dups), Contains("two parameters are named 'c_gate'"));
}

TEST_CASE("parameters: the golden layer's parameters load by their state_dict names", "[io][safetensors][params]") {
  const SafeTensors st = SafeTensors::load(kGolden + "/layer_basic.safetensors");
  std::vector<Param<double>> ps;
  for (const char* lin : {"W_q", "W_k", "W_v", "W_o"}) {
    ps.emplace_back(std::string(lin) + ".weight", "main", Shape{32, 32});
    ps.emplace_back(std::string(lin) + ".bias", "main", Shape{32});
  }
  ps.emplace_back("W_rel", "main", Shape{4, 8, 8});
  ps.emplace_back("W_gate", "gate", Shape{4, 18});
  ps.emplace_back("c_gate", "gate", Shape{4});
  ParamList<double> list;
  for (auto& p : ps) list.push_back(&p);
  REQUIRE_THROWS_WITH(load_parameters(list, st), Contains("match no parameter"));
  load_parameters(list, st, true, {"in.", "out.", "grad."});
  REQUIRE(ps[8].name == "W_rel");
  REQUIRE(ps[8].value[0] == 0.5945471542357665);
  REQUIRE(ps[8].value[255] == -0.5220369459619674);
}

// ---------------------------------------------------------------------------------------------------------------
// Atomic saving
// ---------------------------------------------------------------------------------------------------------------

TEST_CASE("save writes atomically and leaves no temporary behind", "[io][safetensors][save]") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  SafeTensors a("a"), b("b");
  a.put("x", Tensor<double>(Shape{4}, 1.0));
  a.set_metadata("version", "old");
  b.put("x", Tensor<double>(Shape{1000}, 2.0));
  b.put("y", Tensor<std::int64_t>(Shape{3}, 5));
  b.set_metadata("version", "new");

  a.save(path);
  REQUIRE(read_bytes(path) == a.serialize());
  REQUIRE(dir.listing() == std::vector<std::string>{"model.safetensors"});
  b.save(path);  // over an existing file
  REQUIRE(read_bytes(path) == b.serialize());
  REQUIRE(SafeTensors::load(path).metadata().at("version") == "new");
  REQUIRE(dir.listing() == std::vector<std::string>{"model.safetensors"});

  // A failing save (the target is a directory, so the rename fails) removes its temporary and keeps the old
  // content of everything else.
  fs::create_directory(dir.path / "taken");
  REQUIRE_THROWS_WITH(a.save(dir.file("taken")), Contains("rename"));
  REQUIRE(dir.listing() == std::vector<std::string>{"model.safetensors", "taken"});
  REQUIRE(fs::is_directory(dir.path / "taken"));
  // A directory that does not exist
  REQUIRE_THROWS_WITH(a.save(dir.file("no/such/dir.safetensors")), Contains("cannot create the temporary file"));
  REQUIRE_THROWS_AS(a.save(""), dea::Error);
  REQUIRE(read_bytes(path) == b.serialize());
}

TEST_CASE("save: a concurrent reader always sees the old or the new complete file", "[io][safetensors][save]") {
  TempDir dir;
  const std::string path = dir.file("live.safetensors");
  SafeTensors a("a"), b("b");
  a.put("w", Tensor<double>(Shape{64, 64}, 1.0));
  a.set_metadata("v", "a");
  b.put("w", Tensor<double>(Shape{128, 64}, 2.0));
  b.put("z", Tensor<float>(Shape{10}, 3.0f));
  b.set_metadata("v", "b");
  a.save(path);
  const auto bytes_a = a.serialize(), bytes_b = b.serialize();

  std::atomic<bool> done{false};
  std::atomic<int> bad{0}, reads{0};
  std::thread reader([&] {
    while (!done.load()) {
      try {
        const SafeTensors st = SafeTensors::load(path);
        const auto s = st.serialize();
        if (s != bytes_a && s != bytes_b) ++bad;
      } catch (...) {
        ++bad;
      }
      ++reads;
    }
  });
  for (int i = 0; i < 20; ++i) (i % 2 ? a : b).save(path);
  while (reads.load() < 5) std::this_thread::yield();
  done = true;
  reader.join();
  REQUIRE(bad.load() == 0);
  REQUIRE(dir.listing() == std::vector<std::string>{"live.safetensors"});
}

TEST_CASE("put_bf16_rounded: BF16 to nearest even, NaN and infinities kept; put refuses a value BF16 cannot hold",
          "[io][safetensors][bf16]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float x[] = {1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8), -2.5f, nan, -inf, 0.1f};
  io::SafeTensors st;
  st.put_bf16_rounded("x", Shape{2, 3}, x);
  CHECK(st.dtype("x") == io::DType::BF16);
  CHECK(st.nbytes("x") == 12);
  const io::SafeTensors back = io::SafeTensors::parse(st.serialize(), "memory");
  const Tensor<float> t = back.get<float>("x");
  CHECK(t[0] == 1.0f);                              // a tie: to the even neighbour
  CHECK(t[1] == 1.0f + std::ldexp(1.0f, -6));       // above the half: up
  CHECK(t[2] == -2.5f);                             // exact: unchanged
  CHECK(std::isnan(t[3]));
  CHECK(t[4] == -inf);
  CHECK(t[5] == 0.10009765625f);                    // 0x3DCD
  const double big[] = {1e39};
  CHECK_THROWS_WITH(st.put_bf16_rounded("big", Shape{1}, big), Catch::Contains("beyond the range of float"));
  CHECK_THROWS_WITH(st.put("y", Shape{1}, &x[5], io::DType::BF16), Catch::Contains("cannot be stored as BF16"));
}

}  // namespace test_safetensors
