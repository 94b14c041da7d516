// The program the pages' compiled C++ blocks are linked into (tests/docs/extract_blocks.py):
// it lists them, one line each, for the docs.blocks test to compare with the pages. No block
// runs. Without torch's headers, so that this file costs nothing to compile.
#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

namespace loom_doc {

namespace {
std::vector<std::tuple<std::string, int, std::string>>& blocks() {
  static std::vector<std::tuple<std::string, int, std::string>> all;
  return all;
}
}  // namespace

/// Declared in harness.hpp; each block's namespace calls it while the program starts.
bool register_block(const char* page, int line, const char* digest) {
  blocks().emplace_back(page, line, digest);
  return true;
}

}  // namespace loom_doc

int main() {
  auto& all = loom_doc::blocks();
  std::sort(all.begin(), all.end());
  for (const auto& [page, line, digest] : all) {
    std::printf("block %s:%d %s\n", page.c_str(), line, digest.c_str());
  }
  std::printf("%zu blocks compiled\n", all.size());
  return 0;
}
