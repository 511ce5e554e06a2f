#include "common.hpp"

#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

namespace vr {

namespace {

Runtime g_runtime;
void* g_handle = nullptr;

const std::map<std::string, std::string> kOptLevels = {
    {"disable", "ORT_DISABLE_ALL"}, {"basic", "ORT_ENABLE_BASIC"},
    {"extended", "ORT_ENABLE_EXTENDED"}, {"layout", "ORT_ENABLE_LAYOUT"},
    {"all", "ORT_ENABLE_ALL"}};

const std::map<std::string, std::string> kProviderPackages = {
    {"CUDAExecutionProvider", "onnxruntime-gpu"},
    {"TensorrtExecutionProvider", "onnxruntime-gpu (with TensorRT)"},
    {"ROCMExecutionProvider", "onnxruntime-rocm"},
    {"OpenVINOExecutionProvider", "onnxruntime-openvino"},
    {"DmlExecutionProvider", "onnxruntime-directml"},
    {"QNNExecutionProvider", "onnxruntime-qnn"},
};

std::string dirname_of(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

bool contains(const std::string& text, const char* what) {
  return text.find(what) != std::string::npos;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string value_string(const json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

}  // namespace

const Runtime& load_runtime(const char* argv0) {
  if (g_runtime.loaded || !g_runtime.error.empty()) return g_runtime;
  std::vector<std::string> candidates;
  std::vector<std::string> dirs;
  std::string self = argv0 ? argv0 : "";
  if (self.find('/') != std::string::npos) dirs.push_back(dirname_of(self));
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) dirs.push_back(dirname_of(std::string(buf, static_cast<size_t>(n))));
  for (const std::string& d : dirs) {
    for (const char* name : {"libonnxruntime.so.1", "libonnxruntime.so"}) {
      candidates.push_back(d + "/../lib/" + name);
      candidates.push_back(d + "/" + name);
    }
  }
  candidates.push_back("libonnxruntime.so.1");  // LD_LIBRARY_PATH, RUNPATH, system paths
  candidates.push_back("libonnxruntime.so");
  std::string errors;
  for (const std::string& c : candidates) {
    if (c.find('/') != std::string::npos && access(c.c_str(), F_OK) != 0) continue;
    g_handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (g_handle) {
      g_runtime.path = c;
      break;
    }
    const char* e = dlerror();
    if (errors.empty() && e) errors = e;
  }
  if (!g_handle) {
    g_runtime.error = "cannot load libonnxruntime (looked beside the runner, in ../lib, and on "
                      "LD_LIBRARY_PATH)" + (errors.empty() ? std::string() : ": " + errors);
    return g_runtime;
  }
  using GetApiBase = const OrtApiBase* (*)();
  auto get_base = reinterpret_cast<GetApiBase>(dlsym(g_handle, "OrtGetApiBase"));
  if (!get_base) {
    g_runtime.error = g_runtime.path + " has no OrtGetApiBase: not an onnxruntime library";
    return g_runtime;
  }
  const OrtApiBase* base = get_base();
  g_runtime.version = base->GetVersionString();
  const OrtApi* api = base->GetApi(ORT_API_VERSION);
  if (!api) {
    g_runtime.error = "onnxruntime " + g_runtime.version + " (" + g_runtime.path +
                      ") does not provide API version " + std::to_string(ORT_API_VERSION) +
                      ", which this runner was built against: use onnxruntime >= 1." +
                      std::to_string(ORT_API_VERSION);
    return g_runtime;
  }
  Ort::InitApi(api);
  g_runtime.loaded = true;
  return g_runtime;
}

std::vector<std::string> available_providers() {
  // Providers built as plug-in libraries are listed by onnxruntime whether or not their .so is
  // there (onnxruntime-node's x64 build lists CUDA and TensorRT): keep them only when it is.
  static const std::map<std::string, std::string> plugins = {
      {"CUDAExecutionProvider", "libonnxruntime_providers_cuda.so"},
      {"TensorrtExecutionProvider", "libonnxruntime_providers_tensorrt.so"},
      {"OpenVINOExecutionProvider", "libonnxruntime_providers_openvino.so"},
      {"ROCMExecutionProvider", "libonnxruntime_providers_rocm.so"},
      {"MIGraphXExecutionProvider", "libonnxruntime_providers_migraphx.so"}};
  std::vector<std::string> out;
  std::string dir = dirname_of(g_runtime.path);
  for (const std::string& p : Ort::GetAvailableProviders()) {
    auto it = plugins.find(p);
    if (it != plugins.end() && access((dir + "/" + it->second).c_str(), F_OK) != 0) continue;
    out.push_back(p);
  }
  return out;
}

Ort::Env& env(int log_severity) {
  static Ort::Env e(static_cast<OrtLoggingLevel>(log_severity), "verify-runner");
  return e;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::string first_line(const std::string& text) {
  std::stringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos) continue;
    size_t e = line.find_last_not_of(" \t\r");
    return line.substr(b, e - b + 1);
  }
  return text;
}

std::string join_path(const std::string& dir, const std::string& rel) {
  if (!rel.empty() && rel[0] == '/') return rel;
  if (dir.empty()) return rel;
  return dir.back() == '/' ? dir + rel : dir + "/" + rel;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  std::stringstream buf;
  buf << in.rdbuf();
  if (in.bad()) throw std::runtime_error("cannot read " + path);
  return buf.str();
}

void write_json_atomic(const std::string& path, const json& data) {
  std::string tmp = path + ".tmp";
  std::string text = data.dump(1, ' ', false, json::error_handler_t::replace);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + tmp + ": " + std::strerror(errno));
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = std::fflush(f) == 0 && ok;
  ok = fsync(fileno(f)) == 0 && ok;
  ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0)
    throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
}

void make_dirs(const std::string& path) {
  std::string sofar;
  std::stringstream in(path);
  std::string part;
  if (!path.empty() && path[0] == '/') sofar = "/";
  while (std::getline(in, part, '/')) {
    if (part.empty()) continue;
    sofar += part + "/";
    if (mkdir(sofar.c_str(), 0777) != 0 && errno != EEXIST)
      throw std::runtime_error("cannot create " + sofar + ": " + std::strerror(errno));
  }
}

int log_severity(const json& job) {
  // onnxruntime's own log goes to stderr; verify shows errors from the result file, so by
  // default only errors are logged ("ort_log_severity" 0-4, as runner.py)
  if (job.contains("ort_log_severity") && job["ort_log_severity"].is_number_integer()) {
    int s = job["ort_log_severity"].get<int>();
    if (s >= 0 && s <= 4) return s;
  }
  return contract::kDefaultOrtLogSeverity;
}

Ort::SessionOptions session_options(const json& job) {
  Ort::SessionOptions so;
  so.SetLogSeverityLevel(log_severity(job));
  std::string level = job.value("opt_level", std::string(contract::kDefaultOptLevel));
  auto it = kOptLevels.find(level);
  if (it == kOptLevels.end()) throw JobError("input", "unknown opt_level '" + level + "'");
  GraphOptimizationLevel levels[] = {ORT_DISABLE_ALL, ORT_ENABLE_BASIC, ORT_ENABLE_EXTENDED,
                                     ORT_ENABLE_LAYOUT, ORT_ENABLE_ALL};
  const char* names[] = {"disable", "basic", "extended", "layout", "all"};
  for (int i = 0; i < 5; ++i)
    if (level == names[i]) so.SetGraphOptimizationLevel(levels[i]);
  if (job.contains("threads") && job["threads"].is_number_integer() && job["threads"] != 0)
    so.SetIntraOpNumThreads(job["threads"].get<int>());
  if (job.contains("inter_op_threads") && job["inter_op_threads"].is_number_integer() &&
      job["inter_op_threads"] != 0)
    so.SetInterOpNumThreads(job["inter_op_threads"].get<int>());
  if (job.contains("optimized_model_path") && job["optimized_model_path"].is_string())
    so.SetOptimizedModelFilePath(job["optimized_model_path"].get<std::string>().c_str());
  if (job.contains("external_data") && job["external_data"].is_string()) {
    // the model (its bytes, a segment, a rewrite) reads its external data from this folder
    so.AddConfigEntry("session.model_external_initializers_file_folder_path",
                      job["external_data"].get<std::string>().c_str());
    if (job.contains("optimized_model_path") && job["optimized_model_path"].is_string()) {
      std::string path = job["optimized_model_path"].get<std::string>();
      std::string data = path.substr(path.find_last_of('/') + 1) + ".data";
      so.AddConfigEntry("session.optimized_model_external_initializers_file_name", data.c_str());
    }
  }
  if (job.value("no_cpu_arena", contract::kDefaultNoCpuArena)) so.DisableCpuMemArena();
  if (job.contains("session_config") && job["session_config"].is_object())
    for (auto& [k, v] : job["session_config"].items())
      so.AddConfigEntry(k.c_str(), value_string(v).c_str());
  if (job.contains("profile") && job["profile"].is_string()) {
    std::string prefix = job["profile"].get<std::string>() + ".raw";
    so.EnableProfiling(prefix.c_str());
  }
  std::vector<std::string> providers = {contract::kCpuProvider};
  if (job.contains("providers") && job["providers"].is_array() && !job["providers"].empty())
    providers = job["providers"].get<std::vector<std::string>>();
  std::vector<std::string> available = available_providers();
  for (const std::string& p : providers) {
    if (std::find(available.begin(), available.end(), p) != available.end()) continue;
    std::string list;
    for (size_t i = 0; i < available.size(); ++i) list += (i ? ", " : "") + available[i];
    auto hint = kProviderPackages.find(p);
    throw JobError("provider", p + " is not available on this device (available: " + list + ")" +
                                   (hint == kProviderPackages.end()
                                        ? std::string()
                                        : "; it comes with the " + hint->second + " package"));
  }
  json options = job.contains("provider_options") && job["provider_options"].is_object()
                     ? job["provider_options"] : json::object();
  for (const std::string& p : providers) {
    if (p == "CPUExecutionProvider") continue;
    std::unordered_map<std::string, std::string> opts;
    if (options.contains(p) && options[p].is_object())
      for (auto& [k, v] : options[p].items()) opts[k] = value_string(v);
    try {
      if (p == "CUDAExecutionProvider") {
        OrtCUDAProviderOptionsV2* cuda = nullptr;
        Ort::ThrowOnError(Ort::GetApi().CreateCUDAProviderOptions(&cuda));
        std::unique_ptr<OrtCUDAProviderOptionsV2, void (*)(OrtCUDAProviderOptionsV2*)> hold(
            cuda, Ort::GetApi().ReleaseCUDAProviderOptions);
        std::vector<const char*> keys, values;
        for (auto& [k, v] : opts) {
          keys.push_back(k.c_str());
          values.push_back(v.c_str());
        }
        Ort::ThrowOnError(
            Ort::GetApi().UpdateCUDAProviderOptions(cuda, keys.data(), values.data(), keys.size()));
        so.AppendExecutionProvider_CUDA_V2(*cuda);
      } else {
        // the full name, as GetAvailableProviders gives it: onnxruntime's short names differ
        // in case from it ("WebGPU", "XNNPACK"), so cutting the suffix made "WebGpu"
        so.AppendExecutionProvider(p, opts);
      }
    } catch (const Ort::Exception& e) {
      // ORT_ENFORCE's "<file>:<line> <function> <condition> was false. <why>": the why
      std::string text = first_line(e.what());
      const std::string enforce = " was false. ";
      size_t at = text.find(enforce);
      if (at != std::string::npos) text = text.substr(at + enforce.size());
      throw JobError("provider", p + ": " + text);
    }
  }
  return so;
}

namespace {
JobError session_error(const Ort::Exception& e) {
  std::string text = e.what();
  if (e.GetOrtErrorCode() == ORT_NOT_IMPLEMENTED || contains(text, "NOT_IMPLEMENTED") ||
      contains(text, "Could not find an implementation") ||
      contains(text, "is not a registered function/op") || contains(text, "No Op registered"))
    return JobError("model", "onnxruntime " + g_runtime.version + " cannot run this model: " +
                                 first_line(text));
  if (contains(text, "CUDA") || contains(lower(text), "provider"))
    return JobError("provider", first_line(text));
  return JobError("model", "onnxruntime could not load the model: " + first_line(text));
}
}  // namespace

Ort::Session make_session(const json& job, const void* data, size_t size) {
  // the environment first: a provider's factory logs through it while it is appended
  Ort::Env& e = env(log_severity(job));
  Ort::SessionOptions so = session_options(job);
  try {
    return Ort::Session(e, data, size, so);
  } catch (const Ort::Exception& e) {
    throw session_error(e);
  }
}

Ort::Session make_session_file(const json& job, const std::string& path) {
  // the environment first: a provider's factory logs through it while it is appended
  Ort::Env& e = env(log_severity(job));
  Ort::SessionOptions so = session_options(job);
  try {
    return Ort::Session(e, path.c_str(), so);
  } catch (const Ort::Exception& e) {
    throw session_error(e);
  }
}

JobError run_error(const Ort::Exception& e) {
  std::string text = e.what();
  if (e.GetOrtErrorCode() == ORT_INVALID_ARGUMENT || contains(text, "INVALID_ARGUMENT") ||
      contains(text, "Invalid rank") || contains(text, "Got invalid dimensions") ||
      contains(text, "Unexpected input data type"))
    return JobError("input", first_line(text));
  return JobError("runtime", first_line(text));
}

npy::DType dtype_of(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return npy::dtype_from_name("float32");
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return npy::dtype_from_name("float64");
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return npy::dtype_from_name("float16");
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return npy::dtype_from_name("int8");
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: return npy::dtype_from_name("int16");
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return npy::dtype_from_name("int32");
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return npy::dtype_from_name("int64");
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return npy::dtype_from_name("uint8");
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: return npy::dtype_from_name("uint16");
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return npy::dtype_from_name("uint32");
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return npy::dtype_from_name("uint64");
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return npy::dtype_from_name("bool");
    default:
      throw npy::Error("onnx element type " + std::to_string(static_cast<int>(t)) +
                       " has no .npy form in this runner");
  }
}

ONNXTensorElementDataType element_of(const npy::DType& d) {
  static const std::map<std::string, ONNXTensorElementDataType> m = {
      {"float32", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT},
      {"float64", ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE},
      {"float16", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16},
      {"int8", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8},
      {"int16", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16},
      {"int32", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32},
      {"int64", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64},
      {"uint8", ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8},
      {"uint16", ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16},
      {"uint32", ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32},
      {"uint64", ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64},
      {"bool", ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL}};
  return m.at(d.name);
}

Ort::Value as_tensor(npy::Array& a) {
  static Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  return Ort::Value::CreateTensor(cpu, a.data(), a.nbytes, a.shape.data(), a.shape.size(),
                                  element_of(a.dtype));
}

std::map<std::string, npy::Array> load_inputs(const json& job_case, const std::string& workdir) {
  std::map<std::string, npy::Array> feeds;
  for (auto& [name, rel] : job_case.at("inputs").items())
    feeds.emplace(name, npy::load(join_path(workdir, rel.get<std::string>())));
  return feeds;
}

void save_value(const std::string& path, const std::string& name, const Ort::Value& v) {
  if (!v.IsTensor())
    throw JobError("runtime", "output " + name + " is not a tensor (a sequence or map); the "
                              "native runner writes tensors only");
  auto info = v.GetTensorTypeAndShapeInfo();
  npy::DType dt;
  try {
    dt = dtype_of(info.GetElementType());
  } catch (const npy::Error& e) {
    throw JobError("runtime", "output " + name + ": " + e.what());
  }
  std::vector<int64_t> shape = info.GetShape();
  size_t count = info.GetElementCount();
  npy::save(path, dt, shape, count ? v.GetTensorRawData() : nullptr, count * dt.itemsize);
}

json describe(const Runtime& rt) {
  json info;
  struct utsname u;
  if (uname(&u) == 0) {
    info["arch"] = u.machine;
    info["os"] = std::string(u.sysname) + " " + u.release;
    info["hostname"] = u.nodename;
    info["cpu"] = cpu_model();
    info["machine_id"] = machine_id();
  } else {
    info["arch"] = nullptr;
    info["os"] = nullptr;
  }
  info["python"] = nullptr;
  info["numpy"] = nullptr;
  info["runner"] = std::string("verify-runner (native C++ ") + kRunnerVersion +
                   ", ONNX Runtime API " + std::to_string(ORT_API_VERSION) + ")";
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  info["cpu_count"] = cpus > 0 ? json(cpus) : json(std::thread::hardware_concurrency());
  if (rt.loaded) {
    info["onnxruntime"] = rt.version;
    try {
      info["providers"] = available_providers();
    } catch (const Ort::Exception& e) {
      info["providers"] = json::array();
      info["onnxruntime_error"] = first_line(e.what());
    }
  } else {
    info["onnxruntime"] = nullptr;
    info["providers"] = json::array();
    info["onnxruntime_error"] = rt.error;
  }
  struct statvfs st;
  if (statvfs(".", &st) == 0)
    info["free_disk_bytes"] = static_cast<long long>(st.f_bavail) * static_cast<long long>(st.f_frsize);
  else
    info["free_disk_bytes"] = nullptr;
  return info;
}

long long peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  return -1;
}

}  // namespace vr
