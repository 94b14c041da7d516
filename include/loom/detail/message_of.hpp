#pragma once
// loom::detail::message_of: the message of an exception caught as a std::exception_ptr (an
// asynchronous save's, a communication thread's), without c10's backtrace.
#include <exception>
#include <string>

#include <c10/util/Exception.h>

namespace loom::detail {

/// The message of any exception, without c10's backtrace.
inline std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace loom::detail
