// Errors: one exception type that carries a message meant for the user. Anything a user can
// cause (bad config, bad file, impossible layout) throws primus::Error with a message that names
// the offending field or file; primus-cli prints it and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace primus {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

// PRIMUS_CHECK guards internal invariants (programming errors), with the condition in the text.
#define PRIMUS_CHECK(cond, ...)                                                        \
  do {                                                                                 \
    if (!(cond))                                                                       \
      ::primus::fail("internal check failed: {} ({}:{}) {}", #cond, __FILE__, __LINE__, \
                     ::fmt::format(__VA_ARGS__));                                      \
  } while (0)

}  // namespace primus
