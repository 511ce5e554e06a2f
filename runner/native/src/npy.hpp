// .npy files (numpy's format, versions 1.0-3.0): read into a byte buffer with its dtype and
// shape, write from a pointer. No pickled objects, no Fortran order, little-endian only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace npy {

// A numpy dtype this runner can carry: its descr ("<f4"), its numpy name ("float32"), the
// bytes per element, and numpy's kind letter ('f', 'i', 'u', 'b').
struct DType {
  std::string descr;
  std::string name;
  size_t itemsize = 0;
  char kind = 0;
};

// Thrown for a file that is not a readable .npy of a supported dtype (the message says why).
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Thrown when a file cannot be written (a full disk, no descriptors left): the job's error, not
// the input's.
struct WriteError : Error {
  using Error::Error;
};

struct Array {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint64_t> storage;  // 8-byte aligned bytes; data() is the first element
  size_t nbytes = 0;

  void* data() { return storage.data(); }
  const void* data() const { return storage.data(); }
  size_t size() const;  // number of elements
};

// The dtype for a descr such as "<f4", "|b1", "<i8" ('=' and '|' accepted); throws Error.
DType dtype_from_descr(const std::string& descr);
// The dtype for numpy's name ("float32", "int64", "bool", ...); throws Error.
DType dtype_from_name(const std::string& name);

// Parse a whole .npy file's bytes; throws Error.
Array parse(const std::string& bytes);
// Read the file at path; throws Error (a file that cannot be opened included).
Array load(const std::string& path);

// The header bytes (magic, version 1.0, padded dict) for an array of this dtype and shape.
std::string header(const DType& dtype, const std::vector<int64_t>& shape);
// Write a .npy file; throws Error when it cannot be written.
void save(const std::string& path, const DType& dtype, const std::vector<int64_t>& shape,
          const void* data, size_t nbytes);

// A pack of .npy images in one file (a dump's c<case>.npys): each image (header and data, as
// save writes it) starts at a multiple of `align` bytes, zeros between, so a reader seeks to
// its offset and reads an .npy. One file for a case's hundreds of tensors
// (docs/runner-contract.md).
class Pack {
 public:
  Pack(std::string path, uint64_t align);  // creates (truncates) the file; throws WriteError
  ~Pack();
  Pack(const Pack&) = delete;
  Pack& operator=(const Pack&) = delete;
  // Append one array's image; its offset in the file. Throws Error when it cannot be written.
  uint64_t append(const DType& dtype, const std::vector<int64_t>& shape, const void* data,
                  size_t nbytes);
  // Flush and close; throws Error when the file could not be written out.
  void close();

 private:
  std::string path_;
  uint64_t align_;
  std::FILE* f_ = nullptr;
  uint64_t end_ = 0;
};

}  // namespace npy
