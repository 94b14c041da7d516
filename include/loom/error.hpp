#pragma once
#include <stdexcept>
#include <string>

namespace loom {

/// The exception loom throws for bad input or misuse; its message starts with "loom".
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace loom
