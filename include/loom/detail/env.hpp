#pragma once
// Reading the environment variables a launcher such as torchrun sets, strictly: a typo must be
// an error, never a silent default.
#include <charconv>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include <loom/error.hpp>

namespace loom::detail {

/// `text` as a whole number in [0, max]; nullopt when text is null (the variable is unset).
/// Anything else (empty, signs, spaces, trailing characters, out of range) throws loom::Error
/// naming `who`, the variable and what it holds.
inline std::optional<int> parse_env_index(const char* text, std::string_view who,
                                          std::string_view variable, int max) {
  if (text == nullptr) return std::nullopt;
  std::string_view s(text);
  int value = -1;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || value < 0 || value > max) {
    throw Error(std::string(who) + ": " + std::string(variable) + " is \"" + std::string(s) +
                "\", not a whole number from 0 to " + std::to_string(max));
  }
  return value;
}

}  // namespace loom::detail
