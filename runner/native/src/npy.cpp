#include "npy.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace npy {
namespace {

const char kMagic[] = "\x93NUMPY";

struct Known {
  const char* code;  // descr without the byte-order character
  const char* name;
  size_t itemsize;
  char kind;
};

const Known kKnown[] = {
    {"f4", "float32", 4, 'f'}, {"f8", "float64", 8, 'f'}, {"f2", "float16", 2, 'f'},
    {"i1", "int8", 1, 'i'},    {"i2", "int16", 2, 'i'},   {"i4", "int32", 4, 'i'},
    {"i8", "int64", 8, 'i'},   {"u1", "uint8", 1, 'u'},   {"u2", "uint16", 2, 'u'},
    {"u4", "uint32", 4, 'u'},  {"u8", "uint64", 8, 'u'},  {"b1", "bool", 1, 'b'},
};

DType make(const Known& k) {
  DType d;
  d.descr = std::string(k.itemsize == 1 ? "|" : "<") + k.code;
  d.name = k.name;
  d.itemsize = k.itemsize;
  d.kind = k.kind;
  return d;
}

// The value after `'key':` in a header dict, as raw text up to the next top-level comma.
std::string field(const std::string& dict, const std::string& key) {
  size_t at = std::string::npos;
  for (const char* q : {"'", "\""}) {
    at = dict.find(std::string(q) + key + q);
    if (at != std::string::npos) {
      at += key.size() + 2;
      break;
    }
  }
  if (at == std::string::npos) throw Error("no '" + key + "' in the .npy header");
  at = dict.find(':', at);
  if (at == std::string::npos) throw Error("bad .npy header near '" + key + "'");
  ++at;
  while (at < dict.size() && dict[at] == ' ') ++at;
  size_t end = at;
  int depth = 0;
  while (end < dict.size()) {
    char c = dict[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if ((c == ',' && depth == 0) || (c == '}' && depth == 0)) break;
    ++end;
  }
  std::string value = dict.substr(at, end - at);
  while (!value.empty() && value.back() == ' ') value.pop_back();
  return value;
}

std::string unquote(const std::string& s) {
  if (s.size() >= 2 && (s[0] == '\'' || s[0] == '"') && s.back() == s[0])
    return s.substr(1, s.size() - 2);
  throw Error("bad .npy header: expected a string, got " + s);
}

}  // namespace

size_t Array::size() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

DType dtype_from_descr(const std::string& descr) {
  if (descr.size() >= 2 && (descr[0] == '<' || descr[0] == '|' || descr[0] == '=')) {
    std::string code = descr.substr(1);
    for (const Known& k : kKnown)
      if (code == k.code) return make(k);
  }
  if (!descr.empty() && descr[0] == '>')
    throw Error("big-endian arrays (dtype '" + descr + "') are not supported; save them "
                "little-endian (numpy: a.astype(a.dtype.newbyteorder('<')))");
  throw Error("unsupported dtype '" + descr + "' (supported: float16/32/64, int8-64, "
              "uint8-64, bool)");
}

DType dtype_from_name(const std::string& name) {
  for (const Known& k : kKnown)
    if (name == k.name) return make(k);
  throw Error("unsupported element type " + name);
}

Array parse(const std::string& bytes) {
  if (bytes.size() < 10 || bytes.compare(0, 6, kMagic, 6) != 0)
    throw Error("not a .npy file (no \\x93NUMPY magic)");
  unsigned major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0, start = 0;
  auto byte = [&](size_t i) { return static_cast<size_t>(static_cast<unsigned char>(bytes[i])); };
  if (major == 1) {
    header_len = byte(8) | (byte(9) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw Error("truncated .npy header");
    header_len = byte(8) | (byte(9) << 8) | (byte(10) << 16) | (byte(11) << 24);
    start = 12;
  } else {
    throw Error(".npy format version " + std::to_string(major) + " is not supported (1-3)");
  }
  if (start + header_len > bytes.size()) throw Error("truncated .npy header");
  std::string dict = bytes.substr(start, header_len);
  Array a;
  a.dtype = dtype_from_descr(unquote(field(dict, "descr")));
  std::string fortran = field(dict, "fortran_order");
  if (fortran == "True") throw Error("Fortran-ordered arrays are not supported (save C order)");
  if (fortran != "False") throw Error("bad .npy header: fortran_order is " + fortran);
  std::string shape = field(dict, "shape");
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')')
    throw Error("bad .npy header: shape is " + shape);
  std::stringstream dims(shape.substr(1, shape.size() - 2));
  std::string item;
  while (std::getline(dims, item, ',')) {
    size_t b = item.find_first_not_of(' ');
    if (b == std::string::npos) continue;
    char* end = nullptr;
    long long v = std::strtoll(item.c_str() + b, &end, 10);
    if (v < 0 || (*end != '\0' && *end != ' ' && *end != 'L'))
      throw Error("bad .npy header: shape is " + shape);
    a.shape.push_back(v);
  }
  a.nbytes = a.size() * a.dtype.itemsize;
  size_t data_at = start + header_len;
  if (bytes.size() - data_at < a.nbytes)
    throw Error("truncated .npy data: " + std::to_string(bytes.size() - data_at) + " of " +
                std::to_string(a.nbytes) + " bytes");
  a.storage.resize((a.nbytes + 7) / 8 + 1);
  if (a.nbytes) std::memcpy(a.storage.data(), bytes.data() + data_at, a.nbytes);
  return a;
}

Array load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open " + path + ": " + std::strerror(errno));
  std::stringstream buf;
  buf << in.rdbuf();
  try {
    return parse(buf.str());
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

std::string header(const DType& dtype, const std::vector<int64_t>& shape) {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) dims += ",";
  std::string dict = "{'descr': '" + dtype.descr + "', 'fortran_order': False, 'shape': (" +
                     dims + "), }";
  size_t total = 10 + dict.size() + 1;  // magic, version, length, dict, newline
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  std::string out(kMagic, 6);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>((dict.size() >> 8) & 0xff);
  return out + dict;
}

void save(const std::string& path, const DType& dtype, const std::vector<int64_t>& shape,
          const void* data, size_t nbytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw WriteError("cannot write " + path + ": " + std::strerror(errno));
  std::string head = header(dtype, shape);
  bool ok = std::fwrite(head.data(), 1, head.size(), f) == head.size();
  if (ok && nbytes) ok = std::fwrite(data, 1, nbytes, f) == nbytes;
  int err = errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) throw WriteError("cannot write " + path + ": " + std::strerror(err));
}

Pack::Pack(std::string path, uint64_t align) : path_(std::move(path)), align_(align) {
  f_ = std::fopen(path_.c_str(), "wb");
  if (!f_) throw WriteError("cannot write " + path_ + ": " + std::strerror(errno));
}

Pack::~Pack() {
  if (f_) std::fclose(f_);
}

uint64_t Pack::append(const DType& dtype, const std::vector<int64_t>& shape, const void* data,
                      size_t nbytes) {
  if (!f_) throw WriteError("cannot write " + path_ + ": closed");
  uint64_t offset = (end_ + align_ - 1) / align_ * align_;
  std::string head = header(dtype, shape);
  std::string pad(offset - end_, '\0');
  bool ok = pad.empty() || std::fwrite(pad.data(), 1, pad.size(), f_) == pad.size();
  if (ok) ok = std::fwrite(head.data(), 1, head.size(), f_) == head.size();
  if (ok && nbytes) ok = std::fwrite(data, 1, nbytes, f_) == nbytes;
  if (!ok) throw WriteError("cannot write " + path_ + ": " + std::strerror(errno));
  end_ = offset + head.size() + nbytes;
  return offset;
}

void Pack::close() {
  if (!f_) return;
  std::FILE* f = f_;
  f_ = nullptr;
  if (std::fclose(f) != 0) throw WriteError("cannot write " + path_ + ": " + std::strerror(errno));
}

}  // namespace npy
