// Unit tests of the native runner's pieces that need no onnxruntime: .npy read/write, the
// budget, tensor stats and the machine id hash.
//
//   verify-runner-tests              run the tests; prints "N passed, N failed"; exit 1 on a failure
//   verify-runner-tests write DIR    also write .npy files into DIR for numpy to check
//   verify-runner-tests read FILE    print FILE's dtype, shape and values as JSON (for numpy's files)
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "dump.hpp"
#include "npy.hpp"

namespace {

int passed = 0, failed = 0;

void check(bool ok, const std::string& what) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    std::cerr << "FAILED: " << what << "\n";
  }
}

template <typename F>
void throws(F f, const std::string& needle, const std::string& what) {
  try {
    f();
    check(false, what + " (no exception)");
  } catch (const std::exception& e) {
    bool has = std::string(e.what()).find(needle) != std::string::npos;
    check(has, what + " (message: " + e.what() + ")");
  }
}

void test_npy_roundtrip() {
  float values[6] = {1.5f, -2.0f, 0.0f, 3.25f, 1e-8f, -7.0f};
  npy::DType f32 = npy::dtype_from_name("float32");
  std::string head = npy::header(f32, {2, 3});
  check(head.size() % 64 == 0, "header is padded to 64 bytes");
  check(head.back() == '\n', "header ends with a newline");
  std::string file = head + std::string(reinterpret_cast<char*>(values), sizeof values);
  npy::Array a = npy::parse(file);
  check(a.dtype.name == "float32" && a.shape == std::vector<int64_t>({2, 3}), "dtype and shape");
  check(a.nbytes == 24 && static_cast<const float*>(a.data())[3] == 3.25f, "values");
  npy::Array s = npy::parse(npy::header(npy::dtype_from_name("int64"), {}) + std::string(8, '\0'));
  check(s.shape.empty() && s.size() == 1, "a scalar has shape ()");
  npy::Array one = npy::parse(npy::header(npy::dtype_from_name("bool"), {3}) + std::string(3, '\1'));
  check(one.shape == std::vector<int64_t>({3}) && one.dtype.descr == "|b1", "1-d bool");
  npy::Array empty = npy::parse(npy::header(f32, {0, 4}));
  check(empty.size() == 0 && empty.nbytes == 0, "an empty array");
}

void test_npy_refusals() {
  npy::DType f32 = npy::dtype_from_name("float32");
  throws([] { npy::parse("hello"); }, "magic", "not npy");
  throws([&] { npy::parse(npy::header(f32, {4})); }, "truncated .npy data", "short data");
  throws([] { npy::parse(std::string("\x93NUMPY\x01\x00\x30\x00", 10) +
                         "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }    \n"); },
         "big-endian", "big-endian");
  throws([] { npy::parse(std::string("\x93NUMPY\x01\x00\x30\x00", 10) +
                         "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }     \n"); },
         "unsupported dtype", "objects (pickles)");
  throws([] { npy::parse(std::string("\x93NUMPY\x01\x00\x30\x00", 10) +
                         "{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }     \n"); },
         "Fortran", "Fortran order");
  throws([] { npy::parse(std::string("\x93NUMPY\x09\x00\x30\x00", 10)); }, "version 9",
         "unknown version");
  throws([] { npy::load("/nonexistent/x.npy"); }, "cannot open", "missing file");
}

void test_budget() {
  const int64_t mib = 1 << 20;
  check(vr::default_budget(1, 0) == 16 * mib, "at least 16 MiB");
  check(vr::default_budget(100 * mib, 0) == 150 * mib, "1.5x the model");
  check(vr::default_budget(100 * mib, 1024 * mib) == 64 * mib, "at most 1/16 of memory");
}

void test_stats() {
  float v[6] = {1.0f, 2.0f, NAN, INFINITY, 3.0f, -INFINITY};
  vr::json s = vr::tensor_stats(npy::dtype_from_name("float32"), {2, 3}, v, 4);
  check(s["nan"] == 1 && s["inf"] == 2, "NaN and Inf counted");
  check(s["min"] == 1.0 && s["max"] == 3.0 && s["mean"] == 2.0, "min, max, mean of finite values");
  check(std::fabs(s["std"].get<double>() - std::sqrt(2.0 / 3.0)) < 1e-15, "population std");
  check(s["first"].size() == 4 && s["first"][0] == 1.0, "first values");
  check(s["dtype"] == "float32" && s["shape"] == vr::json({2, 3}) && s["size"] == 6, "header");
  int64_t i[3] = {-5, 7, 1};
  vr::json si = vr::tensor_stats(npy::dtype_from_name("int64"), {3}, i);
  check(si["min"].is_number_integer() && si["min"] == -5 && si["max"] == 7, "integer min/max");
  uint8_t b[3] = {0, 1, 1};
  vr::json sb = vr::tensor_stats(npy::dtype_from_name("bool"), {3}, b);
  check(sb["min"] == false && sb["max"] == true && sb["first"][1] == true, "bool as JSON booleans");
  uint16_t h[2] = {0x3c00, 0xc000};  // 1.0, -2.0 in float16
  vr::json sh = vr::tensor_stats(npy::dtype_from_name("float16"), {2}, h);
  check(sh["min"] == -2.0 && sh["max"] == 1.0, "float16 decoded");
  float nan_only[2] = {NAN, NAN};
  vr::json sn = vr::tensor_stats(npy::dtype_from_name("float32"), {2}, nan_only);
  check(sn["min"].is_null() && sn["mean"].is_null() && sn["nan"] == 2, "all NaN: no stats");
  // Two blocks (2^20 elements each): the merged mean and std equal a direct computation.
  std::vector<float> big((1 << 20) + 1000);
  for (size_t k = 0; k < big.size(); ++k) big[k] = static_cast<float>(k % 97) * 0.5f;
  vr::json sbig = vr::tensor_stats(npy::dtype_from_name("float32"),
                                   {static_cast<int64_t>(big.size())}, big.data());
  double sum = 0, sq = 0;
  for (float x : big) sum += x;
  double mean = sum / big.size();
  for (float x : big) sq += (x - mean) * (x - mean);
  check(std::fabs(sbig["mean"].get<double>() - mean) < 1e-9, "merged mean across blocks");
  check(std::fabs(sbig["std"].get<double>() - std::sqrt(sq / big.size())) < 1e-9,
        "merged std across blocks");
}

void test_machine_id_hash() {
  // The values Python's hashlib gives (runner.py's _machine_id): one block, then two.
  check(vr::machine_id_hash("abc") == "ffd6e75b87b5e90d", "sha256 prefix, one block");
  check(vr::machine_id_hash(std::string(100, 'x')) == "e245298a6213920e", "sha256 prefix, two blocks");
}

int write_files(const std::string& dir) {
  float f[6] = {1.5f, -2.0f, 0.0f, 3.25f, 1e-8f, -7.0f};
  npy::save(dir + "/f32.npy", npy::dtype_from_name("float32"), {2, 3}, f, sizeof f);
  int64_t s = -42;
  npy::save(dir + "/scalar_i64.npy", npy::dtype_from_name("int64"), {}, &s, 8);
  uint8_t b[3] = {1, 0, 1};
  npy::save(dir + "/bool.npy", npy::dtype_from_name("bool"), {3}, b, 3);
  uint16_t h[2] = {0x3c00, 0xc000};
  npy::save(dir + "/f16.npy", npy::dtype_from_name("float16"), {1, 2}, h, 4);
  npy::save(dir + "/empty.npy", npy::dtype_from_name("float32"), {0, 5}, nullptr, 0);
  // the same arrays as one pack (a dump's c<case>.npys), their offsets in pack.json
  npy::Pack pack(dir + "/pack.npys", contract::kPackAlign);
  vr::json offsets = vr::json::array();
  offsets.push_back(pack.append(npy::dtype_from_name("float32"), {2, 3}, f, sizeof f));
  offsets.push_back(pack.append(npy::dtype_from_name("int64"), {}, &s, 8));
  offsets.push_back(pack.append(npy::dtype_from_name("bool"), {3}, b, 3));
  offsets.push_back(pack.append(npy::dtype_from_name("float16"), {1, 2}, h, 4));
  offsets.push_back(pack.append(npy::dtype_from_name("float32"), {0, 5}, nullptr, 0));
  pack.close();
  std::ofstream(dir + "/pack.json") << offsets.dump();
  return 0;
}

int read_file(const std::string& path) {
  npy::Array a = npy::load(path);
  vr::json s = vr::tensor_stats(a.dtype, a.shape, a.data(), 1 << 30);
  std::cout << vr::json({{"dtype", a.dtype.name}, {"shape", a.shape}, {"values", s["first"]}})
            << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 3 && std::string(argv[1]) == "read") return read_file(argv[2]);
    if (argc == 3 && std::string(argv[1]) == "write") write_files(argv[2]);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  test_npy_roundtrip();
  test_npy_refusals();
  test_budget();
  test_stats();
  test_machine_id_hash();
  std::cout << passed << " passed, " << failed << " failed\n";
  return failed ? 1 : 0;
}
