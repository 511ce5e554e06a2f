// Shared pieces of the native runner: the job error, onnxruntime loading, session creation,
// tensors to and from .npy, and small file helpers.
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "contract.hpp"
#include "npy.hpp"

namespace vr {

using json = nlohmann::ordered_json;  // keeps key order: outputs in the model's order

constexpr const char* kContract = contract::kContract;
constexpr int kContractVersion = contract::kContractVersion;
constexpr const char* kRunnerVersion = "0.1.0";

// An error the runner can attribute: kind is model, input, provider or runtime.
struct JobError : std::runtime_error {
  std::string kind;
  JobError(std::string k, const std::string& message)
      : std::runtime_error(message), kind(std::move(k)) {}
};

// onnxruntime, loaded at run time (dlopen) so --describe answers even without it.
struct Runtime {
  bool loaded = false;
  std::string version;  // the library's own version string
  std::string error;    // why it is not loaded
  std::string path;     // which file was loaded
};
// Load libonnxruntime beside the executable (../lib, then its own folder), else by name on
// the loader's path (LD_LIBRARY_PATH); initialise the C++ API. argv0 locates the executable.
const Runtime& load_runtime(const char* argv0);
// The process's onnxruntime environment; its log level is fixed by the first call.
Ort::Env& env(int log_severity = 3);
// The providers whose code is present (plug-in providers need their .so beside the library).
std::vector<std::string> available_providers();

double ms_since(std::chrono::steady_clock::time_point t0);
std::string first_line(const std::string& text);
std::string join_path(const std::string& dir, const std::string& rel);
std::string read_file(const std::string& path);
void write_json_atomic(const std::string& path, const json& data);
void make_dirs(const std::string& path);

// A session for `job` (its opt_level, threads, providers, session_config, profile,
// optimized_model_path (absolute), no_cpu_arena) on model bytes or a model file.
Ort::SessionOptions session_options(const json& job);
Ort::Session make_session(const json& job, const void* data, size_t size);
Ort::Session make_session_file(const json& job, const std::string& path);
// An onnxruntime failure while running, as a JobError (input or runtime).
JobError run_error(const Ort::Exception& e);

// Tensors and .npy.
npy::DType dtype_of(ONNXTensorElementDataType t);
ONNXTensorElementDataType element_of(const npy::DType& d);
Ort::Value as_tensor(npy::Array& a);  // views a's bytes: keep a alive
std::map<std::string, npy::Array> load_inputs(const json& job_case, const std::string& workdir);
// Write one output value (a CPU tensor) to path; throws JobError for other kinds of value.
void save_value(const std::string& path, const std::string& name, const Ort::Value& v);

json describe(const Runtime& rt);
// device.cpp: the CPU's model name (or ""), a hash of the OS's machine id (or ""), the hash
// itself (for tests), --probe's answers, and the control probe (fixed single-threaded work).
std::string cpu_model();
std::string machine_id();
std::string machine_id_hash(const std::string& raw_id);
json probe_providers(const std::vector<std::string>& providers);
uint64_t control_probe();
long long peak_rss_bytes();

}  // namespace vr
