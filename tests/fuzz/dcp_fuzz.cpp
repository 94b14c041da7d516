// libFuzzer target of loom's DCP `.metadata` reader (scripts/fuzz.sh): every input is parsed
// (its restricted unpickler, then the checks of the metadata) and must give a Metadata or throw
// loom::Error: any other exception, a crash, a read out of bounds, undefined behaviour (ASan,
// UBSan) or a hang is a finding. Seeds: `.metadata` files Python's torch.distributed.checkpoint
// wrote (tests/fuzz/make_dcp_seeds.py).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <loom/checkpoint/dcp.hpp>
#include <loom/error.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  try {
    (void)loom::checkpoint::dcp::parse_metadata(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz input");
  } catch (const loom::Error&) {
    // refused with a message: the expected outcome for most inputs
  }
  return 0;
}
