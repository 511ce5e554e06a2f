// A bare ONNX Runtime loop: the baseline for the native runner's per-iteration times
// (benchmarks/bench_native_runner.py compiles it against the same headers and library).
//   bare_loop MODEL WARMUP ITERS NAME=FILE.npy...   prints the timed iterations (ms) as JSON
#include <onnxruntime_cxx_api.h>

#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "npy.hpp"

static ONNXTensorElementDataType element(const npy::DType& d) {
  if (d.name == "float32") return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  if (d.name == "int64") return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  if (d.name == "int32") return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
  throw std::runtime_error("bare_loop: unsupported dtype " + d.name);
}

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "bare");
  Ort::SessionOptions so;
  so.SetGraphOptimizationLevel(ORT_ENABLE_ALL);
  Ort::Session sess(env, argv[1], so);
  int warmup = std::stoi(argv[2]), iters = std::stoi(argv[3]);
  std::vector<std::string> names;
  std::vector<npy::Array> arrays;
  for (int i = 4; i < argc; ++i) {
    std::string a = argv[i];
    size_t eq = a.find('=');
    names.push_back(a.substr(0, eq));
    arrays.push_back(npy::load(a.substr(eq + 1)));
  }
  auto mem = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  std::vector<Ort::Value> values;
  std::vector<const char*> in_names;
  for (size_t i = 0; i < arrays.size(); ++i) {
    values.push_back(Ort::Value::CreateTensor(mem, arrays[i].data(), arrays[i].nbytes,
                                              arrays[i].shape.data(), arrays[i].shape.size(),
                                              element(arrays[i].dtype)));
    in_names.push_back(names[i].c_str());
  }
  Ort::AllocatorWithDefaultOptions alloc;
  std::vector<std::string> outs;
  for (size_t i = 0; i < sess.GetOutputCount(); ++i)
    outs.push_back(sess.GetOutputNameAllocated(i, alloc).get());
  std::vector<const char*> out_names;
  for (auto& o : outs) out_names.push_back(o.c_str());
  std::cout << "[";
  for (int k = 0; k < warmup + iters; ++k) {
    auto t = std::chrono::steady_clock::now();
    auto r = sess.Run(Ort::RunOptions{nullptr}, in_names.data(), values.data(), values.size(),
                      out_names.data(), out_names.size());
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
    if (k >= warmup) std::cout << (k > warmup ? ", " : "") << ms;
  }
  std::cout << "]\n";
  return 0;
}
