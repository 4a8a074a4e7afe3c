#include "error.hpp"

#include <utility>

namespace ballast {

namespace {
thread_local std::string t_last_error;
}

int fail(int status, std::string message) {
  t_last_error = std::move(message);
  return status;
}

const char* last_error() { return t_last_error.c_str(); }

void clear_error() { t_last_error.clear(); }

}  // namespace ballast
