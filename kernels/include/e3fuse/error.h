// e3fuse/error.h: the one exception type the core throws, and the log callback.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

namespace e3fuse {

// Every failure in the core is reported as an Error whose message names the
// offending input. Front ends translate it (Python exception, LAMMPS error->all).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class LogLevel { debug = 0, info = 1, warning = 2 };
using LogCallback = std::function<void(LogLevel, const std::string&)>;

// One process-wide callback; each front end wires it to its own log. Without a
// callback, warnings go to stderr and the rest is dropped.
void set_log_callback(LogCallback callback);
void log(LogLevel level, const std::string& message);

}  // namespace e3fuse
