// libFuzzer target of loom's safetensors reader (scripts/fuzz.sh): every input is read twice,
// from memory (load_bytes) and mapped from a file (load), and each must load or throw
// loom::Error: any other exception, a crash, a read out of bounds or undefined behaviour
// (ASan, UBSan) is a finding. Seeds: files Python's safetensors wrote
// (tests/fuzz/make_safetensors_seeds.py).
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

#include <unistd.h>

#include <loom/checkpoint/safetensors.hpp>
#include <loom/error.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    (void)loom::safetensors::load_bytes(bytes, "fuzz input");
  } catch (const loom::Error&) {
    // refused with a message: the expected outcome for most inputs
  }
  // One file per fuzzing process, removed when it exits.
  static const struct TempFile {
    std::filesystem::path path = std::filesystem::temp_directory_path() /
                                 ("loom_fuzz_" + std::to_string(::getpid()) + ".safetensors");
    ~TempFile() {
      std::error_code ignored;
      std::filesystem::remove(path, ignored);
    }
  } temp;
  {
    std::ofstream out(temp.path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  try {
    (void)loom::safetensors::load(temp.path);
  } catch (const loom::Error&) {
  }
  return 0;
}
