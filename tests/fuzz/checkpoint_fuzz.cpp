// libFuzzer target of loom's checkpoint reader (scripts/fuzz.sh). An input that starts like a
// zip ("PK\3\4") is read whole, as a torch.save file; any other input is taken as the pickle
// of one (data.pkl), put in a container with eight 256-byte storages "0".."7", so that the
// fuzzer reaches the unpickler past the container's CRC-32 checks. Either is read twice: from
// memory (load_bytes) and mapped from a file (load_value with LoadOptions::map, rt.load's way),
// and each must load or throw loom::Error: any other exception, a crash, a leak of bounds or
// undefined behaviour (ASan, UBSan) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include <unistd.h>

#include <caffe2/serialize/inline_container.h>

#include <loom/checkpoint/io.hpp>
#include <loom/error.hpp>

namespace {

std::string wrap_pickle(const uint8_t* data, std::size_t size) {
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* p, size_t n) {
    out.append(static_cast<const char*>(p), n);
    return n;
  });
  writer.writeRecord("data.pkl", data, size);
  writer.writeRecord("byteorder", "little", 6);
  char storage[256];
  for (int i = 0; i < 256; ++i) storage[i] = static_cast<char>(i * 7 + 1);
  for (int k = 0; k < 8; ++k) {
    writer.writeRecord("data/" + std::to_string(k), storage, sizeof storage);
  }
  writer.writeEndOfFile();
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const bool zip = size >= 4 && std::memcmp(data, "PK\3\4", 4) == 0;
  const std::string bytes =
      zip ? std::string(reinterpret_cast<const char*>(data), size) : wrap_pickle(data, size);
  try {
    (void)loom::checkpoint::load_bytes(bytes);
  } catch (const loom::Error&) {
    // refused with a message: the expected outcome for most inputs
  }
  // One file per fuzzing process, removed when it exits.
  static const struct TempFile {
    std::filesystem::path path = std::filesystem::temp_directory_path() /
                                 ("loom_fuzz_" + std::to_string(::getpid()) + ".pt");
    ~TempFile() {
      std::error_code ignored;
      std::filesystem::remove(path, ignored);
    }
  } temp;
  const auto& file = temp.path;
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  try {
    (void)loom::checkpoint::load_value(file, std::nullopt, {.map = true});
  } catch (const loom::Error&) {
  }
  return 0;
}
