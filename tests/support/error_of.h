// The message of the primus::Error that `f` throws, or "(no error)": for tests of error texts.
#pragma once

#include <functional>
#include <string>

#include "core/error.h"

namespace primus::test {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace primus::test
